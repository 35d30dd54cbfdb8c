// Base64 (RFC 4648, the standard alphabet; the URL-safe '-' and '_' accepted too) to bytes, for images that
// requests carry inline.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tern {

// The bytes `text` encodes; whitespace (line breaks of wrapped base64) is skipped and the final '=' padding may be
// left out. nullopt when it is not base64: another character, padding inside, or a length no encoding has (a last
// group of one character). `error` (optional) then says why, with the offset.
std::optional<std::string> base64_decode(std::string_view text, std::string* error = nullptr);

}  // namespace tern
