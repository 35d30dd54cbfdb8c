// A request's body as the connection layer (connections.h) receives it, before cpp-httplib parses the request:
// where a chunked body ends, which Content-Encoding it has, and what a coded body inflates to. cpp-httplib 0.11
// inflates a gzip/deflate/br body with no limit on the result (its size cap counts the bytes received), so the
// connection layer's worker counts what the body inflates to, up to the cap, and answers 413 beyond it. Internal
// to src/server.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace tern::server {

// Finds the end of a chunked body as it arrives.
class ChunkedScanner {
 public:
  // Scans the body received so far (call again with more; it resumes where it stopped). False: malformed.
  bool scan(std::string_view body);
  bool done() const { return done_; }
  size_t end() const { return end_; }            // bytes of the chunked body including its trailer (when done)
  size_t decoded() const { return decoded_ + pending_; }  // payload bytes received or announced so far
 private:
  size_t pending_ = 0;       // the size of a chunk not yet complete
  size_t at_ = 0;            // where the next chunk-size line starts
  size_t decoded_ = 0;
  bool in_trailer_ = false;
  bool done_ = false;
  size_t end_ = 0;
};

// The data of a complete chunked body (framing, chunk extensions and trailer removed): a body that ChunkedScanner
// found complete and well formed; anything after its end is ignored.
std::string dechunk(std::string_view body);

// A request's Content-Encoding header value: "" for "identity" (or an empty value), the lower-case name for one that
// cpp-httplib decodes ("gzip", "deflate", "br"; case-insensitive, spaces trimmed), nullopt for anything else,
// including lists of codings (the caller answers 415).
std::optional<std::string> content_coding(std::string_view header_value);

enum class InflateCheck { fits, too_large, malformed };
// Whether `data`, coded with `coding` ("gzip", "deflate" or "br", see content_coding), inflates to at most `cap`
// bytes. Inflates at most cap + 1 bytes (a body that inflates to gigabytes costs no more than one that fits).
InflateCheck check_inflated_size(std::string_view coding, std::string_view data, size_t cap);

}  // namespace tern::server
