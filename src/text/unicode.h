// UTF-8 helpers for the tokenizer: lossy validation, NFC, and the GPT-2 byte-level alphabet.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace tern {

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool utf8_is_valid(std::string_view s);

// Replaces every ill-formed sequence with U+FFFD, one per maximal subpart (the Unicode recommended practice,
// which is what Python's errors="replace" and Rust's String::from_utf8_lossy do). Valid input is returned as is.
std::string utf8_lossy(std::string_view s);

// Length of the longest prefix of `s` that ends on a code-point boundary, given that the bytes after it could
// still complete a character: a trailing incomplete but so-far valid sequence is excluded, everything else is
// included (ill-formed bytes count as complete, they will become U+FFFD).
size_t utf8_complete_prefix(std::string_view s);

// Unicode NFC of valid UTF-8 (utf8proc). ASCII-only text is returned without work.
std::string utf8_nfc(std::string_view s);

// Appends code point `cp` as UTF-8.
void utf8_append(std::string& out, uint32_t cp);

// GPT-2 byte-level alphabet: byte b <-> code point byte_to_cp[b] (printable Latin-1 maps to itself, the rest to
// U+0100..U+0143).
struct ByteLevelAlphabet {
  std::array<uint32_t, 256> byte_to_cp{};
  // Code point (< 0x144) -> byte, or -1 when the code point is not in the alphabet.
  std::array<int16_t, 0x144> cp_to_byte{};
  ByteLevelAlphabet();
  // Decodes a byte-level token string; false when a character is outside the alphabet (or input is not UTF-8).
  bool decode(std::string_view token, std::string& bytes) const;
};
const ByteLevelAlphabet& byte_level_alphabet();

}  // namespace tern
