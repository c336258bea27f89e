#include "engine/engine.h"

#include <omp.h>

#include <filesystem>

#include "common/error.h"
#include "io/safetensors.h"

namespace clefrt {

namespace fs = std::filesystem;

std::unique_ptr<Engine> Engine::load(const std::string& dir, EngineOptions opts) {
  if (opts.threads > 0) omp_set_num_threads(opts.threads);
  auto e = std::unique_ptr<Engine>(new Engine());
  e->cfg_ = model::load_config(dir);
  if (e->cfg_.quantization)
    throw load_error((fs::path(dir) / "config.json").string(),
                     "quantized checkpoints (quantization_config) are not supported yet; use a bf16 folder");
  e->tok_ = std::make_unique<Tokenizer>(Tokenizer::load((fs::path(dir) / "tokenizer.json").string()));
  if (int64_t(e->tok_->vocab_size()) > e->cfg_.text.vocab)
    throw load_error((fs::path(dir) / "tokenizer.json").string(),
                     "tokenizer has ids up to " + std::to_string(e->tok_->vocab_size() - 1) + " but the model's vocab_size is " +
                         std::to_string(e->cfg_.text.vocab));
  opts.encode.vision = VisionGeometry::from_model_dir(dir);
  e->encoder_ = std::make_unique<Encoder>(*e->tok_, opts.encode);
  io::TensorStore backbone = io::TensorStore::open_folder(dir);
  e->text_ = model::load_text_weights(backbone, e->cfg_.text);
  io::TensorStore head;
  fs::path hp = fs::path(dir) / "joint_head.safetensors";
  if (!fs::exists(hp)) throw load_error(hp.string(), "missing: a Clef folder holds the joint head here");
  head.add_file(hp.string());
  e->head_ = model::load_head_weights(head, e->cfg_.head);
  return e;
}

std::vector<std::vector<std::vector<double>>> Engine::probs(const std::vector<const Encoded*>& batch, model::GdnForm form) const {
  std::vector<int32_t> ids;
  std::vector<int64_t> offsets = {0};
  for (const Encoded* e : batch) {
    if (!e->images.empty())
      throw Error(Status::Unprocessable, "unsupported", "images are not supported yet: the vision tower is not implemented", "images");
    ids.insert(ids.end(), e->input_ids.begin(), e->input_ids.end());
    offsets.push_back(int64_t(ids.size()));
  }
  std::vector<float> hidden = model::backbone_forward(text_, cfg_.text, ids, offsets, form);
  std::vector<std::vector<std::vector<double>>> out;
  for (size_t k = 0; k < batch.size(); ++k)
    out.push_back(model::joint_head(head_, cfg_.head, text_.lm_head, hidden.data() + offsets[k] * cfg_.text.hidden, *batch[k]));
  return out;
}

}  // namespace clefrt
