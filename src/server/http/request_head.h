// A request's head as the connection layer's poller reads it (connections.h), before cpp-httplib parses the
// request: enough to apply the deadlines, the size caps and the early checks, and to find where the body ends.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tern::server {

// A request's line and headers as the poller parsed them (header names lower-cased).
struct RequestHead {
  std::string method;
  std::string target;   // as sent
  std::string version;  // e.g. "HTTP/1.1"
  std::string path;     // target without the query
  std::vector<std::pair<std::string, std::string>> headers;
  const std::string* header(std::string_view lower_name) const;  // first one, or null
};

// Parses "METHOD TARGET VERSION\r\n(name: value\r\n)*" (the head without its final empty line). False when
// malformed.
bool parse_request_head(std::string_view head, RequestHead& out);

}  // namespace tern::server
