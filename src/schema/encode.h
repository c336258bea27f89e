// Encoding a request into token ids and spans, exactly as spec/model.md section 3 says:
// each piece is tokenized on its own and the id lists are concatenated.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "schema/request.h"
#include "tokenizer/tokenizer.h"

namespace clefrt {

// Span is the public header's.

// The image processor settings that decide how many tokens an image becomes
// (`preprocessor_config.json`; defaults are Qwen3.5's).
struct VisionGeometry {
  uint32_t patch_size = 16, merge_size = 2, temporal_patch_size = 2;
  uint64_t min_pixels = 65536, max_pixels = 16777216;
  static VisionGeometry from_file(const std::string& path);  // throws load_error
  // From a model folder's preprocessor_config.json (or processor_config.json); the defaults
  // when it has neither.
  static VisionGeometry from_model_dir(const std::string& dir);
  // Qwen-VL "smart resize": both sides multiples of patch*merge, pixel count within bounds.
  void resize(uint32_t width, uint32_t height, uint32_t& out_w, uint32_t& out_h) const;
};

struct EncodeOptions {
  size_t max_length = 16384;
  // Plain (default): user text never turns into special tokens. Parse: what the reference
  // does (special-token text inside user content becomes the special token).
  AddedTokens user_text = AddedTokens::Plain;
  VisionGeometry vision;
};

// EncodedQuestion, EncodedImage and Encoded are the public header's.

class Encoder {
 public:
  Encoder(const Tokenizer& tok, EncodeOptions opts);
  // Throws context_exceeded (413, "maximum context length") when the schema alone does not fit.
  Encoded encode(const Request& req) const;
  const EncodeOptions& options() const { return opts_; }

 private:
  const Tokenizer& tok_;
  EncodeOptions opts_;
  // Constant pieces, tokenized once.
  std::vector<int32_t> prefix_, schema_head_, allowed_, end_field_, newline_, suffix_;
  std::vector<std::vector<int32_t>> option_labels_;  // "OPTION {j}: " for j = 1..255
  int32_t vision_start_ = -1, vision_end_ = -1, image_pad_ = -1;
};

extern const char* const kSystemPrompt;

// `{"input_ids":[...],"questions":[...],"usage":{"input_tokens":N}}` (the `clefrt encode` output)
std::string encoded_to_json(const Encoded& e);

}  // namespace clefrt
