// Errors with context. An Error carries the HTTP status the protocol assigns to it, a short
// machine-readable type, a message for people, and where it happened (a JSON path such as
// `questions.team.criteria`, or a file/tensor name).
#pragma once
#include <stdexcept>
#include <string>

namespace clefrt {

enum class Status : int {
  BadRequest = 400,          // malformed JSON or wrong shape
  Unauthorized = 401,
  PayloadTooLarge = 413,     // body over the limit, or a prompt that cannot fit the context
  Unprocessable = 422,       // valid JSON that breaks a limit or rule
  TooManyRequests = 429,
  Internal = 500,
  Unavailable = 503,
};

class Error : public std::runtime_error {
 public:
  Error(Status status, std::string type, std::string message, std::string where = {});
  Status status() const { return status_; }
  int http_status() const { return static_cast<int>(status_); }
  const std::string& type() const { return type_; }
  const std::string& where() const { return where_; }
  const std::string& message() const { return message_; }
  // `{"error":{"type":...,"message":...,"details":{"path":...}}}` (details only with a path)
  std::string to_json() const;

 private:
  Status status_;
  std::string type_, message_, where_;
};

// Shorthands for the common kinds; `path` is the JSON path of the offending field.
Error bad_request(const std::string& path, const std::string& message);     // 400 invalid_request
Error unprocessable(const std::string& path, const std::string& message);   // 422 validation_error
Error too_large(const std::string& path, const std::string& message);       // 413 request_too_large
Error context_exceeded(const std::string& message);                          // 413 context_length_exceeded

// Errors that are not the caller's fault and not tied to a request (bad files, bad config).
Error load_error(const std::string& where, const std::string& message);

}  // namespace clefrt
