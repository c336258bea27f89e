// `clefrt quantize`: a bf16 Clef folder -> NVFP4 (W4A16 / W4A4) or FP8 compressed-tensors folder.
#include <memory>

#include "cli/commands.h"

namespace clefrt::cli {

Runner add_quantize(CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* c = app.add_subcommand("quantize",
                                   "Write a compressed-tensors copy of a bf16 Clef folder (spec/quant.md): NVFP4 weights\n"
                                   "(nvfp4-w4a16; nvfp4 = W4A4 with activation scales calibrated over --calib records run\n"
                                   "through this engine) or FP8 (per-channel weights, dynamic per-token activations).\n"
                                   "Embeddings, lm_head, vision, GDN in_proj_a/b and conv1d, norms and the joint head stay bf16.\n"
                                   "The result runs on the CPU and GPU engines (--quant auto).");
  c->add_option("--model", o->model_dir, "the bf16 folder")->required()->check(CLI::ExistingDirectory);
  c->add_option("--out", o->out_dir, "the new folder (must not exist or be empty)")->required();
  c->add_option("--scheme", o->scheme, "nvfp4 | nvfp4-w4a16 | fp8")->required()->check(CLI::IsMember({"nvfp4", "nvfp4-w4a16", "fp8"}));
  c->add_option("--calib", o->calib_file, "calibration requests, one System One body per line (needed for nvfp4); records over the model's context are skipped and counted, an invalid one stops the run (file:line)");
  c->add_option("--calib-records", o->calib_records, "records to use (default 256)")->check(positive());
  c->add_option("--threads", o->threads, "CPU threads for calibration (default: all cores)")->check(non_negative());
  return [o]() -> int {
    quantize(*o);
    return 0;
  };
}

}  // namespace clefrt::cli
