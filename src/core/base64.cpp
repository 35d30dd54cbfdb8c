#include "core/base64.h"

#include <array>
#include <cstdint>

namespace tern {

namespace {

// The 6-bit value of each character; -1 for characters outside the alphabet, -2 for whitespace.
constexpr std::array<int8_t, 256> decode_table() {
  std::array<int8_t, 256> t{};
  for (auto& v : t) v = -1;
  for (int i = 0; i < 26; ++i) {
    t[size_t('A' + i)] = int8_t(i);
    t[size_t('a' + i)] = int8_t(26 + i);
  }
  for (int i = 0; i < 10; ++i) t[size_t('0' + i)] = int8_t(52 + i);
  t[size_t('+')] = t[size_t('-')] = 62;
  t[size_t('/')] = t[size_t('_')] = 63;
  for (char c : {' ', '\t', '\r', '\n'}) t[size_t(uint8_t(c))] = -2;
  return t;
}
constexpr std::array<int8_t, 256> kDecode = decode_table();

std::optional<std::string> fail(std::string* error, std::string why) {
  if (error) *error = std::move(why);
  return std::nullopt;
}

}  // namespace

std::optional<std::string> base64_decode(std::string_view text, std::string* error) {
  std::string out;
  out.reserve(text.size() / 4 * 3 + 3);
  uint32_t group = 0;  // the bits of the current group of 4 characters
  int n = 0;           // characters in it
  size_t padding = 0;  // '=' seen (only at the end)
  for (size_t i = 0; i < text.size(); ++i) {
    const uint8_t c = uint8_t(text[i]);
    if (c == '=') {
      ++padding;
      continue;
    }
    const int8_t v = kDecode[c];
    if (v == -2) continue;
    if (v < 0) return fail(error, "a character that is not base64 at offset " + std::to_string(i));
    if (padding > 0) return fail(error, "base64 padding '=' before the end (offset " + std::to_string(i) + ")");
    group = (group << 6) | uint32_t(v);
    if (++n == 4) {
      out.push_back(char(group >> 16));
      out.push_back(char(group >> 8));
      out.push_back(char(group));
      group = 0;
      n = 0;
    }
  }
  if (n == 1) return fail(error, "base64 of a length no encoding has (one character left over)");
  if (padding > 2 || (padding > 0 && (n + padding) % 4 != 0))
    return fail(error, "base64 padding that does not complete its last group");
  if (n == 2) out.push_back(char(group >> 4));
  if (n == 3) {
    out.push_back(char(group >> 10));
    out.push_back(char(group >> 2));
  }
  return out;
}

}  // namespace tern
