// Encoding a request into token ids and spans, exactly as spec/model.md section 3 says:
// each piece is tokenized on its own and the id lists are concatenated.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "schema/request.h"
#include "tokenizer/tokenizer.h"

namespace clefrt {

struct Span {
  int32_t begin = 0, end = 0;  // half-open token range over the whole sequence
};

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

struct EncodedQuestion {
  std::string id;
  QuestionType type = QuestionType::Noul;
  Span question_span;
  std::vector<Span> option_spans;      // encoded option order
  std::vector<std::string> option_ids;  // encoded option order
};

struct EncodedImage {
  uint32_t grid_t = 1, grid_h = 0, grid_w = 0;  // patches (before the 2x2 merge)
  uint32_t width = 0, height = 0;               // resized pixels
  Span pad_span;                                 // the <|image_pad|> tokens
};

struct Encoded {
  std::vector<int32_t> input_ids;
  std::vector<EncodedQuestion> questions;
  std::vector<EncodedImage> images;
  Span state_span;
  size_t state_tokens_dropped = 0;  // tokens cut from the end of the state by max_length
};

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
