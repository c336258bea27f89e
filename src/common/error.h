// Errors with context: clefrt::Error and Status are the public header's (an Error carries the
// HTTP status the protocol assigns to it, a short machine-readable type, a message for people,
// and where it happened); here the shorthands the library builds them with.
#pragma once
#include <clefrt/clefrt.h>

#include <string>

namespace clefrt {

// Shorthands for the common kinds; `path` is the JSON path of the offending field.
Error bad_request(const std::string& path, const std::string& message);     // 400 invalid_request
Error unprocessable(const std::string& path, const std::string& message);   // 422 validation_error
Error too_large(const std::string& path, const std::string& message);       // 413 request_too_large
Error context_exceeded(const std::string& message);                          // 413 context_length_exceeded

// Errors that are not the caller's fault and not tied to a request (bad files, bad config).
Error load_error(const std::string& where, const std::string& message);

}  // namespace clefrt
