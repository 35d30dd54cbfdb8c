#include "text/unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "core/check.h"

namespace tern {
namespace {

enum class Seq { valid, invalid, truncated };

// Reads one UTF-8 sequence at p[0..n). Sets len to the bytes it covers: the whole character when valid, the
// maximal subpart (>= 1 byte) when ill-formed, everything left when the input ends inside a valid prefix.
Seq utf8_next(const unsigned char* p, size_t n, size_t& len, uint32_t& cp) {
  unsigned char b = p[0];
  if (b < 0x80) { len = 1; cp = b; return Seq::valid; }
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) { need = 1; cp = b & 0x1F; }
  else if (b == 0xE0) { need = 2; lo = 0xA0; cp = b & 0x0F; }
  else if (b >= 0xE1 && b <= 0xEC) { need = 2; cp = b & 0x0F; }
  else if (b == 0xED) { need = 2; hi = 0x9F; cp = b & 0x0F; }
  else if (b >= 0xEE && b <= 0xEF) { need = 2; cp = b & 0x0F; }
  else if (b == 0xF0) { need = 3; lo = 0x90; cp = b & 0x07; }
  else if (b >= 0xF1 && b <= 0xF3) { need = 3; cp = b & 0x07; }
  else if (b == 0xF4) { need = 3; hi = 0x8F; cp = b & 0x07; }
  else { len = 1; return Seq::invalid; }
  size_t i = 1;
  for (int k = 0; k < need; ++k, ++i) {
    if (i >= n) { len = i; return Seq::truncated; }
    unsigned char c = p[i];
    unsigned char l = k == 0 ? lo : 0x80, h = k == 0 ? hi : 0xBF;
    if (c < l || c > h) { len = i; return Seq::invalid; }
    cp = (cp << 6) | (c & 0x3F);
  }
  len = i;
  return Seq::valid;
}

}  // namespace

bool utf8_is_valid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0, len;
  uint32_t cp;
  while (i < n) {
    if (p[i] < 0x80) { ++i; continue; }
    if (utf8_next(p + i, n - i, len, cp) != Seq::valid) return false;
    i += len;
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  if (utf8_is_valid(s)) return std::string(s);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0, len;
  uint32_t cp;
  std::string out;
  out.reserve(n + 8);
  while (i < n) {
    Seq r = utf8_next(p + i, n - i, len, cp);
    if (r == Seq::valid) out.append(s.data() + i, len);
    else out += "\xEF\xBF\xBD";
    i += len;
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view s) {
  // Only the last (up to) 3 bytes can start an incomplete character.
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  size_t start = n > 3 ? n - 3 : 0;
  for (size_t i = start; i < n; ++i) {
    if (p[i] < 0xC2 || p[i] > 0xF4) continue;  // not a lead byte
    size_t len;
    uint32_t cp;
    if (utf8_next(p + i, n - i, len, cp) == Seq::truncated) return i;
  }
  return n;
}

std::string utf8_nfc(std::string_view s) {
  bool ascii = true;
  for (unsigned char c : s) {
    if (c >= 0xCC) { ascii = false; break; }  // every code point below U+0300 is already NFC
  }
  if (ascii) return std::string(s);
  utf8proc_uint8_t* out = nullptr;
  auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()), &out,
                        utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  TERN_CHECK(n >= 0, "NFC normalisation failed: ", utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> hold(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), size_t(n));
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  cp_to_byte.fill(-1);
  uint32_t extra = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    uint32_t cp = printable ? b : 256 + extra++;
    byte_to_cp[b] = cp;
    cp_to_byte[cp] = int16_t(b);
  }
}

bool ByteLevelAlphabet::decode(std::string_view token, std::string& bytes) const {
  const auto* p = reinterpret_cast<const unsigned char*>(token.data());
  size_t n = token.size(), i = 0, len;
  uint32_t cp;
  while (i < n) {
    if (utf8_next(p + i, n - i, len, cp) != Seq::valid) return false;
    if (cp >= cp_to_byte.size() || cp_to_byte[cp] < 0) return false;
    bytes += char(cp_to_byte[cp]);
    i += len;
  }
  return true;
}

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

}  // namespace tern
