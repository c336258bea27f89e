#include "common/error.h"

#include "common/json.h"

namespace clefrt {

static std::string compose(const std::string& message, const std::string& where) {
  return where.empty() ? message : where + ": " + message;
}

Error::Error(Status status, std::string type, std::string message, std::string where)
    : std::runtime_error(compose(message, where)),
      status_(status),
      type_(std::move(type)),
      message_(std::move(message)),
      where_(std::move(where)) {}

std::string Error::to_json() const {
  std::string out = "{\"error\":{\"type\":";
  json::write_string(out, type_);
  out += ",\"message\":";
  json::write_string(out, what());
  if (!where_.empty()) {
    out += ",\"details\":{\"path\":";
    json::write_string(out, where_);
    out += "}";
  }
  out += "}}";
  return out;
}

Error bad_request(const std::string& path, const std::string& message) {
  return Error(Status::BadRequest, "invalid_request", message, path);
}
Error unprocessable(const std::string& path, const std::string& message) {
  return Error(Status::Unprocessable, "validation_error", message, path);
}
Error too_large(const std::string& path, const std::string& message) {
  return Error(Status::PayloadTooLarge, "request_too_large", message, path);
}
Error context_exceeded(const std::string& message) {
  return Error(Status::PayloadTooLarge, "context_length_exceeded", message);
}
Error load_error(const std::string& where, const std::string& message) {
  return Error(Status::Internal, "load_error", message, where);
}

}  // namespace clefrt
