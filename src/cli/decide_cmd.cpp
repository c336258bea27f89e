// `clefrt decide`: answer requests with a model folder; System One responses on stdout.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "common/error.h"
#include "engine/engine_core.h"
#include "schema/answers.h"
#include "schema/request.h"

namespace clefrt::cli {

void add_gpu_weight_options(CLI::App& c, std::string& quant, bool& offload) {
  c.add_option("--quant", quant,
               "cuda: auto (what the folder holds) | bf16 | fp8 (W8A8, e4m3, per-channel weights, per-token activations) |\n"
               "nvfp4 (W4A4; needs a W4A4 folder) | nvfp4-w4a16; bf16/fp8/nvfp4 weights are converted on the GPU at load")
      ->check(CLI::IsMember({"auto", "bf16", "fp8", "nvfp4", "nvfp4-w4a16"}));
  c.add_flag("--offload-embeddings", offload, "cuda, lean GPU memory: embed_tokens / lm_head in pinned host memory, the MLP in 1,024-token blocks, the GDN in 16-chunk passes (same answers, a little slower on long inputs)");
}

void add_check_weights_option(CLI::App& c, bool& check) {
  c.add_flag("!--no-check-weights", check,
             "skip the load-time test of every weight for NaN / infinity (a folder with any is refused, naming the tensor; the test\n"
             "reads each weight once more); without it such weights give a request a 500 naming the layer");
}

Runner add_decide(CLI::App& app) {
  struct Opts {
    std::string model, device = "auto", confidence = "reference";
    int threads = 0;
    size_t max_length = 16384;
    bool offload = false;
    std::string quant = "auto";
    bool check_weights = true;
    bool batch_invariant = true, precise = false, parse_special = false, require_instructions = false, jsonl = false;
    std::vector<std::string> inputs;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("decide",
                                   "Answer requests with a model folder: prints one System One response per request.\n"
                                   "An invalid request prints the protocol's error JSON and the exit status is 1.");
  c->add_option("--model", o->model, "a Clef release folder (bf16/f16/f32 safetensors)")->required()->check(CLI::ExistingDirectory);
  c->add_option("--device", o->device, "auto (cuda when this build has it and a GPU is present, else cpu) | cuda | cpu")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  c->add_flag("!--no-batch-invariant", o->batch_invariant, "cuda: let cuBLASLt choose GEMM algorithms per batch size");
  add_gpu_weight_options(*c, o->quant, o->offload);
  c->add_option("--threads", o->threads, "CPU threads (default: all cores)");
  c->add_option("--max-length", o->max_length, "context length in tokens; the state is cut to fit (default 16384)");
  c->add_flag("--precise", o->precise, "print probabilities, score and confidence unrounded");
  c->add_option("--confidence", o->confidence, "reference (max p, default) | purity | jev")
      ->check(CLI::IsMember({"reference", "purity", "jev"}));
  c->add_flag("--parse-special", o->parse_special, "parse special-token text in user content, as the reference does");
  c->add_flag("--require-instructions", o->require_instructions, "refuse missing/empty instructions (422)");
  c->add_flag("--jsonl", o->jsonl, "read stdin ('-') as JSON lines");
  add_check_weights_option(*c, o->check_weights);
  c->add_option("requests", o->inputs, "request files (.json, or .jsonl for one per line); '-' reads stdin")->required();
  return [o]() -> int {
    CoreOptions eo;
    eo.quant = parse_quant_mode(o->quant);
    eo.offload_embeddings = o->offload;
    eo.device = o->device == "cuda" || (o->device == "auto" && cuda_available()) ? Device::Cuda : Device::Cpu;
    eo.batch_invariant = o->batch_invariant;
    eo.check_weights = o->check_weights;
    eo.threads = o->threads;
    eo.encode.max_length = o->max_length;
    eo.encode.user_text = o->parse_special ? AddedTokens::Parse : AddedTokens::Plain;
    auto engine = EngineCore::load(o->model, eo);
    AnswerOptions ao;
    ao.precise = o->precise;
    ao.confidence = parse_confidence(o->confidence);
    RequestLimits lim;
    lim.require_instructions = o->require_instructions;
    return print_each_record(o->inputs, o->jsonl, "decide", [&](const std::string& body) {
      Request req = parse_request(body, lim);
      Encoded enc = engine->encoder().encode(req);
      auto probs = engine->probs({&enc});
      return response_json(req.model.empty() ? "clef" : req.model, req, probs[0], enc.input_ids.size(), ao);
    });
  };
}

}  // namespace clefrt::cli
