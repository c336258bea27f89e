#include "schema/request.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "schema/images.h"

namespace clefrt {

const char* const kNoulTrueDescription = "The proposition is true or the answer is yes.";
const char* const kNoulFalseDescription = "The proposition is false or the answer is no.";

const char* type_name(QuestionType t) {
  switch (t) {
    case QuestionType::Noul: return "noul";
    case QuestionType::Choice: return "choice";
    case QuestionType::Score: return "score";
  }
  return "?";
}

namespace {

using json::Value;
using Kind = json::Value::Kind;

// `base.key`, or `base["key"]` when the key would be ambiguous in dotted form.
std::string child(const std::string& base, std::string_view key) {
  bool plain = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
  if (plain) return base.empty() ? std::string(key) : base + "." + std::string(key);
  std::string q;
  json::write_string(q, key);
  return base + "[" + q + "]";
}
std::string child(const std::string& base, size_t index) { return base + "[" + std::to_string(index) + "]"; }

std::string shown(std::string_view s, size_t max = 60) {
  std::string out;
  json::write_string(out, s.size() > max ? s.substr(0, max) : s);
  if (s.size() > max) out += "...";
  return out;
}

}  // namespace

void reject_unknown_fields(const Value& obj, const std::string& path, std::initializer_list<const char*> allowed) {
  for (const auto& member : obj.obj) {
    const std::string& k = member.first;
    bool ok = std::any_of(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; });
    if (!ok) {
      std::string list;
      for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
      throw unprocessable(child(path, k), "unknown field " + shown(k) + " (allowed: " + list + ")");
    }
  }
}

namespace {

void reject_unknown(const Value& obj, const std::string& path, std::initializer_list<const char*> allowed) {
  reject_unknown_fields(obj, path, allowed);
}

// OpenAI / Anthropic-style content parts holding an image ({"type":"image_url","image_url":...},
// {"type":"input_image",...}, {"type":"image","source":...}) anywhere in the state: rendered as
// JSON they would reach the model as base64 text, never as an image.
void reject_image_parts(const Value& v, const std::string& path) {
  if (v.is_array()) {
    for (size_t k = 0; k < v.arr.size(); ++k) reject_image_parts(v.arr[k], child(path, k));
    return;
  }
  if (!v.is_object()) return;
  const Value* t = v.find("type");
  if (t && t->is_string() &&
      ((t->s == "image_url" && v.find("image_url")) || t->s == "input_image" || (t->s == "image" && v.find("source"))))
    throw unprocessable(path, "an image content part (\"type\": " + shown(t->s) +
                                  ") inside the state is not read as an image (the model would see its data as text): send images in "
                                  "the top-level \"images\" field");
  for (const auto& [k, child_v] : v.obj) reject_image_parts(child_v, child(path, k));
}

bool valid_id(std::string_view id, size_t max_len) {
  if (id.empty() || id.size() > max_len) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
  });
}

bool empty_instruction(const Value* v) { return !v || v->is_null() || (v->is_string() && v->s.empty()); }

void parse_criteria(Question& q, const Value* crit, const std::string& path, const RequestLimits& lim) {
  switch (q.type) {
    case QuestionType::Noul: {
      Option t{"true", Value::string(kNoulTrueDescription)}, f{"false", Value::string(kNoulFalseDescription)};
      if (crit && !crit->is_null()) {
        if (!crit->is_object())
          throw bad_request(path, std::string("noul criteria must be an object {\"true\": ..., \"false\": ...}, not ") + json::kind_name(crit->kind));
        reject_unknown(*crit, path, {"true", "false"});
        // A given entry overrides the default; null removes the description.
        if (const Value* v = crit->find("true")) t.description = *v;
        if (const Value* v = crit->find("false")) f.description = *v;
      }
      q.options = {t, f};
      break;
    }
    case QuestionType::Choice: {
      if (!crit || crit->is_null())
        throw bad_request(path, "a choice question needs criteria: an object of label -> description");
      if (!crit->is_object())
        throw bad_request(path, std::string("choice criteria must be an object of label -> description, not ") + json::kind_name(crit->kind));
      size_t n = crit->obj.size();
      // The wording carries the Decision Index kit's capacity markers ("a choice needs at least
      // two options", "options per choice"), by which it counts such a request as unsupported
      // by this engine rather than failed (and does not retry it).
      if (n < lim.min_choices)
        throw unprocessable(path, "a choice needs at least two options, got " + std::to_string(n));
      if (n > lim.max_choices)
        throw unprocessable(path, "at most " + std::to_string(lim.max_choices) + " options per choice, got " + std::to_string(n));
      // The prompt lists labels sorted by code point; answers come back in the caller's order.
      std::vector<size_t> order(n);
      for (size_t k = 0; k < n; ++k) order[k] = k;
      std::sort(order.begin(), order.end(),
                [&](size_t a, size_t b) { return json::codepoint_less(crit->obj[a].first, crit->obj[b].first); });
      q.caller_order.assign(n, 0);
      for (size_t enc = 0; enc < n; ++enc) {
        const auto& [label, desc] = crit->obj[order[enc]];
        q.options.push_back({label, desc});
        q.caller_order[order[enc]] = enc;
      }
      break;
    }
    case QuestionType::Score: {
      if (!crit || crit->is_null())
        throw bad_request(path, "a score question needs criteria: an array of level descriptions, lowest first");
      if (!crit->is_array())
        throw bad_request(path, std::string("score criteria must be an array of level descriptions, not ") + json::kind_name(crit->kind));
      size_t n = crit->arr.size();
      if (n < lim.min_levels || n > lim.max_levels)
        throw unprocessable(path, "a score takes " + std::to_string(lim.min_levels) + " to " + std::to_string(lim.max_levels) +
                                      " levels, got " + std::to_string(n));  // the kit's marker, as above
      for (size_t k = 0; k < n; ++k) q.options.push_back({std::to_string(k), crit->arr[k]});
      q.levels = crit->arr;
      break;
    }
  }
  for (auto& o : q.options) o.has_description = !o.description.is_null();
}

ImageInput parse_image(const Value& v, const std::string& path, const RequestLimits& lim) {
  std::string_view mime, b64;
  if (v.is_string()) {
    std::string_view s = v.s;
    auto starts = [&](const char* p) {
      size_t n = std::strlen(p);
      if (s.size() < n) return false;
      for (size_t k = 0; k < n; ++k)
        if (std::tolower(static_cast<unsigned char>(s[k])) != p[k]) return false;
      return true;
    };
    if (starts("http://") || starts("https://") || starts("ftp://") || starts("file:"))
      throw unprocessable(path, "remote image URLs are refused (the server never fetches): send a data: URL or {\"content_type\", \"base64\"}");
    if (!starts("data:")) throw unprocessable(path, "an image must be a data: URL or {\"content_type\": ..., \"base64\": ...}");
    size_t comma = s.find(',');
    if (comma == std::string_view::npos) throw unprocessable(path, "data: URL has no ',' before its data");
    std::string_view meta = s.substr(5, comma - 5);
    size_t semi = meta.find(';');
    if (semi == std::string_view::npos || meta.substr(semi + 1) != "base64")
      throw unprocessable(path, "data: URL must be base64 encoded (data:image/png;base64,...)");
    mime = meta.substr(0, semi);
    b64 = s.substr(comma + 1);
  } else if (v.is_object()) {
    reject_unknown(v, path, {"content_type", "base64"});
    const Value* ct = v.find("content_type");
    const Value* data = v.find("base64");
    if (!ct || !ct->is_string()) throw bad_request(child(path, "content_type"), "content_type must be a string such as \"image/png\"");
    if (!data || !data->is_string()) throw bad_request(child(path, "base64"), "base64 must be a string");
    mime = ct->s;
    b64 = data->s;
  } else {
    throw bad_request(path, std::string("an image must be a data: URL string or an object, not ") + json::kind_name(v.kind));
  }
  ImageInput img;
  if (mime == "image/png") img.format = ImageFormat::Png;
  else if (mime == "image/jpeg" || mime == "image/jpg") img.format = ImageFormat::Jpeg;
  else if (mime == "image/webp") img.format = ImageFormat::Webp;
  else throw unprocessable(path, "unsupported image type " + shown(mime) + " (PNG, JPEG or WebP)");

  // Base64 is 4 chars per 3 bytes: refuse oversized data before decoding it.
  if (b64.size() / 4 * 3 > lim.max_image_bytes + 3)
    throw unprocessable(path, "image is larger than " + std::to_string(lim.max_image_bytes >> 20) + " MiB");
  auto bytes = base64_decode(b64, lim.max_image_bytes);
  if (!bytes) throw unprocessable(path, "image data is not valid base64 or is larger than " + std::to_string(lim.max_image_bytes >> 20) + " MiB");
  auto sniffed = sniff_image(*bytes);
  if (!sniffed) throw unprocessable(path, "image does not decode: not a PNG, JPEG or WebP file");
  if (*sniffed != img.format)
    throw unprocessable(path, std::string("image declared as ") + image_mime(img.format) + " but its bytes are " + image_mime(*sniffed));
  if (!image_size(img.format, *bytes, img.width, img.height))
    throw unprocessable(path, std::string("image does not decode: corrupt or truncated ") + image_mime(img.format) + " header");
  if (img.width == 0 || img.height == 0) throw unprocessable(path, "image has zero width or height");
  uint64_t px = uint64_t(img.width) * img.height;
  if (px > lim.max_image_pixels)
    throw unprocessable(path, "image has " + std::to_string(img.width) + "x" + std::to_string(img.height) +
                                  " pixels, over the limit of " + std::to_string(lim.max_image_pixels));
  img.bytes = std::move(*bytes);
  return img;
}

}  // namespace

Request parse_request(std::string_view body, const RequestLimits& lim) {
  if (body.size() > lim.max_body_bytes)
    throw too_large("", "request body is " + std::to_string(body.size()) + " bytes, over the limit of " +
                            std::to_string(lim.max_body_bytes));
  json::ParseOptions po;
  po.max_depth = lim.max_json_depth;
  return parse_request(json::parse(body, po), lim);
}

Request parse_request(const Value& root, const RequestLimits& lim) {
  if (!root.is_object()) throw bad_request("", std::string("request must be a JSON object, not ") + json::kind_name(root.kind));
  reject_unknown(root, "", {"model", "state", "questions", "images"});
  Request r;
  if (const Value* m = root.find("model"); m && !m->is_null()) {
    if (!m->is_string()) throw bad_request("model", "model must be a string");
    r.model = m->s;
  }
  const Value* state = root.find("state");
  if (!state) throw bad_request("state", "missing required field \"state\"");
  if (!state->is_string() && !state->is_object() && !state->is_array())
    throw bad_request("state", std::string("state must be a string, object or array, not ") + json::kind_name(state->kind));
  reject_image_parts(*state, "state");
  r.state = *state;

  const Value* qs = root.find("questions");
  if (!qs) throw bad_request("questions", "missing required field \"questions\"");
  if (!qs->is_object())
    throw bad_request("questions", std::string("questions must be an object of id -> question, not ") + json::kind_name(qs->kind) +
                                       (qs->is_array() ? " (the array form is the OpenAI decisions shape)" : ""));
  if (qs->obj.empty() || qs->obj.size() > lim.max_questions)
    throw unprocessable("questions", "a request needs 1 to " + std::to_string(lim.max_questions) + " questions, got " +
                                         std::to_string(qs->obj.size()));
  for (const auto& [id, qv] : qs->obj) {
    std::string path = child("questions", id);
    if (!valid_id(id, lim.max_id_length))
      throw unprocessable(path, "question id " + shown(id) + " must match [A-Za-z0-9_.-]{1," + std::to_string(lim.max_id_length) + "}");
    if (!qv.is_object()) throw bad_request(path, std::string("a question must be an object, not ") + json::kind_name(qv.kind));
    reject_unknown(qv, path, {"type", "instructions", "criteria"});
    Question q;
    q.id = id;
    const Value* t = qv.find("type");
    if (!t) throw bad_request(child(path, "type"), "missing required field \"type\" (noul, choice or score)");
    if (!t->is_string()) throw bad_request(child(path, "type"), "type must be a string (noul, choice or score)");
    if (t->s == "noul") q.type = QuestionType::Noul;
    else if (t->s == "choice") q.type = QuestionType::Choice;
    else if (t->s == "score") q.type = QuestionType::Score;
    else throw unprocessable(child(path, "type"), "unknown question type " + shown(t->s) + " (noul, choice or score)");
    const Value* ins = qv.find("instructions");
    if (empty_instruction(ins)) {
      if (lim.require_instructions)
        throw unprocessable(child(path, "instructions"), "instructions are required and must not be empty");
      q.instructions = Value::string(id);  // the reference's fallback
    } else {
      q.instructions = *ins;
    }
    parse_criteria(q, qv.find("criteria"), child(path, "criteria"), lim);
    r.questions.push_back(std::move(q));
  }

  if (const Value* im = root.find("images"); im && !im->is_null()) {
    if (!im->is_array()) throw bad_request("images", std::string("images must be an array, not ") + json::kind_name(im->kind));
    if (im->arr.size() > lim.max_images)
      throw unprocessable("images", "at most " + std::to_string(lim.max_images) + " images, got " + std::to_string(im->arr.size()));
    size_t total = 0;
    for (size_t k = 0; k < im->arr.size(); ++k) {
      r.images.push_back(parse_image(im->arr[k], child("images", k), lim));
      total += r.images.back().bytes.size();
      if (total > lim.max_images_total_bytes)
        throw unprocessable("images", "images total more than " + std::to_string(lim.max_images_total_bytes >> 20) + " MiB");
    }
  }
  return r;
}

}  // namespace clefrt
