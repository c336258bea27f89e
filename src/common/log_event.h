// The JSON event lines clefrt writes on stderr (load stages, device choices, the server's
// listening / ready / stopping / request lines): every one starts with the same "ts", UTC to the
// millisecond, so a log collector orders and parses them alike.
#pragma once
#include <string>

namespace clefrt {

// "2026-12-05T01:01:20.325Z"
std::string log_timestamp();

// Writes {"ts":"...",FIELDS}\n to stderr in one call; fields: the object's other members as JSON
// text, e.g. "\"event\":\"listening\",\"port\":8080".
void log_event(const std::string& fields);

}  // namespace clefrt
