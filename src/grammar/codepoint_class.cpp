// Code point classes and their UTF-8 encodings as byte-level Exprs.
#include <algorithm>

#include "grammar/grammar_impl.h"

namespace tern::grammar {

namespace {
constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;

int utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void encode(uint32_t cp, int n, uint8_t* out) {
  if (n == 1) {
    out[0] = static_cast<uint8_t>(cp);
    return;
  }
  static const uint8_t kLead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
  for (int i = n - 1; i > 0; --i) {
    out[i] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    cp >>= 6;
  }
  out[0] = static_cast<uint8_t>(kLead[n] | cp);
}

// [lo, hi] with one encoded length n: split until every byte position of the encodings varies independently
// (the standard construction, as in Rust's regex-syntax Utf8Sequences), then one byte-range sequence per piece.
void split_range(uint32_t lo, uint32_t hi, int n, std::vector<ExprPtr>& out) {
  for (int i = 1; i < n; ++i) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_range(lo, lo | m, n, out);
        split_range((lo | m) + 1, hi, n, out);
        return;
      }
      if ((hi & m) != m) {
        split_range(lo, (hi & ~m) - 1, n, out);
        split_range(hi & ~m, hi, n, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  encode(lo, n, a);
  encode(hi, n, b);
  std::vector<ExprPtr> seq;
  for (int i = 0; i < n; ++i) seq.push_back(expr_byte_range(a[i], b[i]));
  out.push_back(expr_seq(std::move(seq)));
}
}  // namespace

CodepointClass cp_normalize(CodepointClass c) {
  CodepointClass pieces;
  for (auto r : c) {
    if (r.lo > r.hi) continue;
    r.hi = std::min(r.hi, kMaxCodepoint);
    if (r.lo > r.hi) continue;
    if (r.lo < kSurrogateLo && r.hi > kSurrogateHi) {
      pieces.push_back({r.lo, kSurrogateLo - 1});
      pieces.push_back({kSurrogateHi + 1, r.hi});
    } else if (r.lo >= kSurrogateLo && r.hi <= kSurrogateHi) {
      continue;
    } else if (r.lo >= kSurrogateLo && r.lo <= kSurrogateHi) {
      pieces.push_back({kSurrogateHi + 1, r.hi});
    } else if (r.hi >= kSurrogateLo && r.hi <= kSurrogateHi) {
      pieces.push_back({r.lo, kSurrogateLo - 1});
    } else {
      pieces.push_back(r);
    }
  }
  std::sort(pieces.begin(), pieces.end(), [](auto x, auto y) { return x.lo < y.lo; });
  CodepointClass out;
  for (auto r : pieces) {
    if (!out.empty() && r.lo <= out.back().hi + 1)
      out.back().hi = std::max(out.back().hi, r.hi);
    else
      out.push_back(r);
  }
  return out;
}

CodepointClass cp_all() { return cp_normalize({{0, kMaxCodepoint}}); }

CodepointClass cp_complement(const CodepointClass& c0) {
  CodepointClass c = cp_normalize(c0), out;
  uint32_t next = 0;
  for (auto r : c) {
    if (r.lo > next) out.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxCodepoint) out.push_back({next, kMaxCodepoint});
  return cp_normalize(out);
}

CodepointClass cp_union(const CodepointClass& a, const CodepointClass& b) {
  CodepointClass all = a;
  all.insert(all.end(), b.begin(), b.end());
  return cp_normalize(all);
}

CodepointClass cp_intersect(const CodepointClass& a, const CodepointClass& b) {
  return cp_complement(cp_union(cp_complement(a), cp_complement(b)));
}

CodepointClass cp_subtract(const CodepointClass& a, const CodepointClass& b) { return cp_intersect(a, cp_complement(b)); }

bool cp_contains(const CodepointClass& c, uint32_t cp) {
  for (auto r : c)
    if (cp >= r.lo && cp <= r.hi) return true;
  return false;
}

ExprPtr expr_utf8_class(const CodepointClass& c0) {
  CodepointClass c = cp_normalize(c0);
  std::vector<ExprPtr> alts;
  ByteSet ascii;
  static const uint32_t kBounds[4][2] = {{0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xFFFF}, {0x10000, 0x10FFFF}};
  for (auto r : c) {
    for (int n = 1; n <= 4; ++n) {
      uint32_t lo = std::max(r.lo, kBounds[n - 1][0]), hi = std::min(r.hi, kBounds[n - 1][1]);
      if (lo > hi) continue;
      if (n == 1) {
        for (uint32_t b = lo; b <= hi; ++b) ascii.set(b);
      } else {
        split_range(lo, hi, n, alts);
      }
    }
  }
  if (ascii.any()) alts.insert(alts.begin(), expr_bytes(ascii));
  return expr_alt(std::move(alts));
}

void append_utf8(std::string& out, uint32_t cp) {
  int n = utf8_length(cp);
  uint8_t b[4];
  encode(cp, n, b);
  out.append(reinterpret_cast<const char*>(b), static_cast<size_t>(n));
}

}  // namespace tern::grammar
