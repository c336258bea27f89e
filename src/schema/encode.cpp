#include "schema/encode.h"

#include <cmath>
#include <filesystem>

#include "common/error.h"
#include "common/file.h"
#include "common/json.h"

namespace clefrt {

const char* const kSystemPrompt =
    "Read the complete state and schema. Decide every field jointly. Each answer must be exactly one of that "
    "field's allowed options.";

namespace {
const size_t kMaxOptionLabels = 255;

void append(std::vector<int32_t>& out, const std::vector<int32_t>& ids) { out.insert(out.end(), ids.begin(), ids.end()); }

// Python's round() on a float: ties to even.
double py_round_half_even(double x) { return std::nearbyint(x); }
}  // namespace

VisionGeometry VisionGeometry::from_file(const std::string& path) {
  json::Value v;
  std::string text = read_file(path);
  try {
    v = json::parse(text);
  } catch (const Error& e) {
    throw load_error(path, std::string("not valid JSON: ") + e.what());
  }
  VisionGeometry g;
  auto num = [&](const json::Value* x, const char* name) -> uint64_t {
    if (!x) return 0;
    if (x->kind != json::Value::Kind::Int || x->i <= 0) throw load_error(path, std::string(name) + " must be a positive integer");
    return uint64_t(x->i);
  };
  if (uint64_t p = num(v.find("patch_size"), "patch_size")) g.patch_size = uint32_t(p);
  if (uint64_t p = num(v.find("merge_size"), "merge_size")) g.merge_size = uint32_t(p);
  if (uint64_t p = num(v.find("temporal_patch_size"), "temporal_patch_size")) g.temporal_patch_size = uint32_t(p);
  if (const json::Value* size = v.find("size"); size && size->is_object()) {
    if (uint64_t p = num(size->find("shortest_edge"), "size.shortest_edge")) g.min_pixels = p;
    if (uint64_t p = num(size->find("longest_edge"), "size.longest_edge")) g.max_pixels = p;
  }
  if (uint64_t p = num(v.find("min_pixels"), "min_pixels")) g.min_pixels = p;
  if (uint64_t p = num(v.find("max_pixels"), "max_pixels")) g.max_pixels = p;
  return g;
}

VisionGeometry VisionGeometry::from_model_dir(const std::string& dir) {
  for (const char* name : {"preprocessor_config.json", "processor_config.json"}) {
    std::filesystem::path p = std::filesystem::path(dir) / name;
    if (std::filesystem::exists(p)) return from_file(p.string());
  }
  return {};
}

void VisionGeometry::resize(uint32_t width, uint32_t height, uint32_t& out_w, uint32_t& out_h) const {
  const double factor = double(patch_size) * merge_size;
  const double h = height, w = width;
  if (std::max(h, w) / std::min(h, w) > 200)
    throw unprocessable("images", "image aspect ratio is over 200:1 (" + std::to_string(width) + "x" + std::to_string(height) + ")");
  double hb = py_round_half_even(h / factor) * factor;
  double wb = py_round_half_even(w / factor) * factor;
  if (hb * wb > double(max_pixels)) {
    double beta = std::sqrt(h * w / double(max_pixels));
    hb = std::max(factor, std::floor(h / beta / factor) * factor);
    wb = std::max(factor, std::floor(w / beta / factor) * factor);
  } else if (hb * wb < double(min_pixels)) {
    double beta = std::sqrt(double(min_pixels) / (h * w));
    hb = std::ceil(h * beta / factor) * factor;
    wb = std::ceil(w * beta / factor) * factor;
  }
  out_w = uint32_t(wb);
  out_h = uint32_t(hb);
}

Encoder::Encoder(const Tokenizer& tok, EncodeOptions opts) : tok_(tok), opts_(std::move(opts)) {
  // Constant pieces hold special tokens, so they are always parsed with added tokens.
  auto enc = [&](const std::string& s) { return tok_.encode(s, AddedTokens::Parse); };
  prefix_ = enc(std::string("<|im_start|>system\n") + kSystemPrompt + "<|im_end|>\n<|im_start|>user\nSTATE:\n");
  schema_head_ = enc("\n\nSCHEMA FIELDS:\n");
  allowed_ = enc("\nALLOWED OPTIONS:\n");
  end_field_ = enc("END FIELD\n");
  newline_ = enc("\n");
  suffix_ = enc("\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:");
  option_labels_.resize(kMaxOptionLabels + 1);
  for (size_t j = 1; j <= kMaxOptionLabels; ++j) option_labels_[j] = enc("OPTION " + std::to_string(j) + ": ");
  // Checked here so a tokenizer without them fails at load, not on the first request.
  tok_.require_token("<|im_start|>");
  tok_.require_token("<|im_end|>");
  if (auto id = tok_.token_id("<|vision_start|>")) vision_start_ = *id;
  if (auto id = tok_.token_id("<|vision_end|>")) vision_end_ = *id;
  if (auto id = tok_.token_id("<|image_pad|>")) image_pad_ = *id;
}

Encoded Encoder::encode(const Request& req) const {
  const AddedTokens user = opts_.user_text;
  Encoded e;

  // Media: image pads are expanded to each image's token count.
  std::vector<int32_t> media;
  for (size_t k = 0; k < req.images.size(); ++k) {
    if (vision_start_ < 0 || vision_end_ < 0 || image_pad_ < 0)
      throw unprocessable("images", "this model's tokenizer has no image tokens; it cannot take images");
    const auto& img = req.images[k];
    EncodedImage ei;
    opts_.vision.resize(img.width, img.height, ei.width, ei.height);
    ei.grid_t = 1;  // a still image is two identical frames = one temporal patch
    ei.grid_h = ei.height / opts_.vision.patch_size;
    ei.grid_w = ei.width / opts_.vision.patch_size;
    uint32_t tokens = ei.grid_t * ei.grid_h * ei.grid_w / (opts_.vision.merge_size * opts_.vision.merge_size);
    media.push_back(vision_start_);
    ei.pad_span.begin = int32_t(prefix_.size() + media.size());
    media.insert(media.end(), tokens, image_pad_);
    ei.pad_span.end = int32_t(prefix_.size() + media.size());
    media.push_back(vision_end_);
    e.images.push_back(ei);
  }
  if (!media.empty()) append(media, newline_);

  // The schema, tokenized with offsets relative to its own start; shifted once the state's
  // length (after truncation) is known.
  std::vector<int32_t> schema = schema_head_;
  std::string text;
  for (size_t qi = 0; qi < req.questions.size(); ++qi) {
    const Question& q = req.questions[qi];
    EncodedQuestion eq;
    eq.id = q.id;
    eq.type = q.type;
    tok_.encode("\nFIELD " + std::to_string(qi + 1) + "\nID: " + q.id + "\nTYPE: " + type_name(q.type) + "\nINSTRUCTION: ",
                user, schema);
    text.clear();
    json::render(text, q.instructions);
    eq.question_span.begin = int32_t(schema.size());
    tok_.encode(text, user, schema);
    eq.question_span.end = int32_t(schema.size());
    append(schema, allowed_);
    for (size_t j = 0; j < q.options.size(); ++j) {
      const Option& o = q.options[j];
      if (j + 1 < option_labels_.size()) append(schema, option_labels_[j + 1]);
      else tok_.encode("OPTION " + std::to_string(j + 1) + ": ", AddedTokens::Parse, schema);
      json::Value opt = json::Value::object();
      if (o.has_description) opt.add("description", o.description);
      opt.add("option_id", json::Value::string(o.label));
      text.clear();
      json::render(text, opt);
      Span sp;
      sp.begin = int32_t(schema.size());
      tok_.encode(text, user, schema);
      sp.end = int32_t(schema.size());
      eq.option_spans.push_back(sp);
      eq.option_ids.push_back(o.label);
      append(schema, newline_);
    }
    append(schema, end_field_);
    e.questions.push_back(std::move(eq));
  }

  const size_t fixed = prefix_.size() + media.size() + schema.size() + suffix_.size();
  if (fixed > opts_.max_length)
    throw context_exceeded("the prompt without its state needs " + std::to_string(fixed) +
                           " tokens, over the maximum context length of " + std::to_string(opts_.max_length) + " tokens");

  std::vector<int32_t> state;
  text.clear();
  json::render(text, req.state);
  tok_.encode(text, user, state);
  const size_t room = opts_.max_length - fixed;
  if (state.size() > room) {
    e.state_tokens_dropped = state.size() - room;
    state.resize(room);
  }

  e.input_ids.reserve(fixed + state.size());
  append(e.input_ids, prefix_);
  append(e.input_ids, media);
  e.state_span = {int32_t(e.input_ids.size()), int32_t(e.input_ids.size() + state.size())};
  append(e.input_ids, state);
  const int32_t base = int32_t(e.input_ids.size());
  append(e.input_ids, schema);
  append(e.input_ids, suffix_);
  for (auto& q : e.questions) {
    q.question_span.begin += base;
    q.question_span.end += base;
    for (auto& s : q.option_spans) {
      s.begin += base;
      s.end += base;
    }
  }
  return e;
}

std::string encoded_to_json(const Encoded& e) {
  std::string out = "{\"input_ids\":[";
  for (size_t k = 0; k < e.input_ids.size(); ++k) {
    if (k) out.push_back(',');
    out += std::to_string(e.input_ids[k]);
  }
  out += "],\"questions\":[";
  auto span = [&](const Span& s) { out += "[" + std::to_string(s.begin) + "," + std::to_string(s.end) + "]"; };
  for (size_t qi = 0; qi < e.questions.size(); ++qi) {
    const auto& q = e.questions[qi];
    if (qi) out.push_back(',');
    out += "{\"id\":";
    json::write_string(out, q.id);
    out += ",\"type\":\"";
    out += type_name(q.type);
    out += "\",\"question_span\":";
    span(q.question_span);
    out += ",\"option_spans\":[";
    for (size_t j = 0; j < q.option_spans.size(); ++j) {
      if (j) out.push_back(',');
      span(q.option_spans[j]);
    }
    out += "],\"option_ids\":[";
    for (size_t j = 0; j < q.option_ids.size(); ++j) {
      if (j) out.push_back(',');
      json::write_string(out, q.option_ids[j]);
    }
    out += "]}";
  }
  out += "]";
  if (!e.images.empty()) {
    out += ",\"images\":[";
    for (size_t k = 0; k < e.images.size(); ++k) {
      const auto& im = e.images[k];
      if (k) out.push_back(',');
      out += "{\"grid_thw\":[" + std::to_string(im.grid_t) + "," + std::to_string(im.grid_h) + "," + std::to_string(im.grid_w) +
             "],\"resized\":[" + std::to_string(im.width) + "," + std::to_string(im.height) + "],\"pad_span\":";
      span(im.pad_span);
      out += "}";
    }
    out += "]";
  }
  out += ",\"state_span\":";
  span(e.state_span);
  out += ",\"state_tokens_dropped\":" + std::to_string(e.state_tokens_dropped);
  out += ",\"usage\":{\"input_tokens\":" + std::to_string(e.input_ids.size()) + "}}";
  return out;
}

}  // namespace clefrt
