// A System One request (spec/protocol.md): parsed, validated, and reduced to what encoding
// needs. Every error names the field by JSON path and carries the protocol's HTTP status.
#pragma once
#include <clefrt/clefrt.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "common/json.h"

namespace clefrt {

// QuestionType and type_name are the public header's.

struct Option {
  std::string label;        // caller's label: "true"/"false", a choice label, or "0".."n-1"
  json::Value description;  // null = no description rendered
  bool has_description = true;
};

struct Question {
  std::string id;
  QuestionType type = QuestionType::Noul;
  json::Value instructions;        // what the prompt renders (the id when missing/null/"")
  std::vector<Option> options;     // encoded order: noul true,false; choice sorted; score by level
  std::vector<size_t> caller_order;  // choice: encoded index of each label in the caller's order
  std::vector<json::Value> levels;   // score: the given level entries (for `legend`)
};

enum class ImageFormat : uint8_t { Png, Jpeg, Webp };

struct ImageInput {
  ImageFormat format = ImageFormat::Png;
  std::string bytes;  // decoded base64
  uint32_t width = 0, height = 0;
};

struct Request {
  std::string model;  // empty when absent
  json::Value state;
  std::vector<Question> questions;
  std::vector<ImageInput> images;
};

struct RequestLimits {
  size_t max_body_bytes = 13u << 20;
  size_t max_questions = 64;
  size_t max_id_length = 100;
  size_t min_choices = 2, max_choices = 255;
  size_t min_levels = 2, max_levels = 10;
  size_t max_images = 4;
  size_t max_image_bytes = 4u << 20;
  size_t max_images_total_bytes = 8u << 20;
  uint64_t max_image_pixels = 16'000'000;
  size_t max_json_depth = 128;
  // Hosted Clef refuses a missing/empty instruction (422); the reference falls back to the id.
  bool require_instructions = false;
};

// Parses and validates a request body. Throws clefrt::Error (400/413/422) naming the field.
Request parse_request(std::string_view body, const RequestLimits& limits = {});
Request parse_request(const json::Value& root, const RequestLimits& limits = {});

// Throws a 422 naming `path.key` for the first key of obj not in `allowed` (listing them).
void reject_unknown_fields(const json::Value& obj, const std::string& path, std::initializer_list<const char*> allowed);

// The default option descriptions of a noul question.
extern const char* const kNoulTrueDescription;
extern const char* const kNoulFalseDescription;

}  // namespace clefrt
