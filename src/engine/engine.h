// The engine: a loaded Clef folder (tokenizer, config, weights) that answers requests.
// CPU only for now; the CUDA backend slots in behind the same calls.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/forward.h"
#include "model/weights.h"
#include "schema/encode.h"
#include "tokenizer/tokenizer.h"

namespace clefrt {

struct EngineOptions {
  EncodeOptions encode;
  int threads = 0;  // 0 = all cores
};

class Engine {
 public:
  // Loads and validates everything; throws load_error naming the file/tensor at fault.
  static std::unique_ptr<Engine> load(const std::string& dir, EngineOptions opts = {});

  const model::ModelConfig& config() const { return cfg_; }
  const Encoder& encoder() const { return *encoder_; }
  const Tokenizer& tokenizer() const { return *tok_; }

  // Per-question probabilities (encoded option order) for several encoded requests, run as one
  // packed forward: each request keeps its own attention and GDN state.
  std::vector<std::vector<std::vector<double>>> probs(const std::vector<const Encoded*>& batch,
                                                      model::GdnForm form = model::GdnForm::Chunked) const;

 private:
  model::ModelConfig cfg_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<Encoder> encoder_;
  model::TextWeights text_;
  model::HeadWeights head_;
};

}  // namespace clefrt
