// The bounded inflation of a coded request body: cpp-httplib 0.11 inflates a gzip/deflate/br body with no limit on
// the result (its size cap counts the bytes received), so the connection layer's worker (before httplib parses the
// request) counts what the body inflates to, up to the cap, and answers 413 beyond it. Internal to src/server.
#pragma once

#include <cstddef>
#include <string_view>

namespace tern::server {

enum class InflateCheck { fits, too_large, malformed };
// Whether `data`, coded with `coding` ("gzip", "deflate" or "br", see content_coding), inflates to at most `cap`
// bytes. Inflates at most cap + 1 bytes (a body that inflates to gigabytes costs no more than one that fits).
InflateCheck check_inflated_size(std::string_view coding, std::string_view data, size_t cap);

}  // namespace tern::server
