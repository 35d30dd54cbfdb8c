// What the connection layer checks of a request's body framing and coding before a worker decodes it: cpp-httplib
// 0.11 inflates a gzip/deflate/br body with no limit on the result (its size cap counts the bytes received), so the
// poller counts what the body inflates to, up to the cap, and answers 413 beyond it. Internal to src/server.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace tern::server {

// The data of a complete chunked body (framing, chunk extensions and trailer removed). The body must be one that
// ChunkedScanner found complete and well formed; anything after its end is ignored.
std::string dechunk(std::string_view body);

// A request's Content-Encoding header value: "" for "identity" (or an empty value), the lower-case name for one that
// cpp-httplib decodes ("gzip", "deflate", "br"; case-insensitive, spaces trimmed), nullopt for anything else,
// including lists of codings (the caller answers 415).
std::optional<std::string> content_coding(std::string_view header_value);

enum class InflateCheck { fits, too_large, malformed };
// Whether `data`, coded with `coding` ("gzip", "deflate" or "br"), inflates to at most `cap` bytes. Inflates at
// most cap + 1 bytes (a body that inflates to gigabytes costs no more than one that fits).
InflateCheck check_inflated_size(std::string_view coding, std::string_view data, size_t cap);

}  // namespace tern::server
