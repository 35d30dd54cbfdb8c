// Number ranges as grammars of JSON number text: see number_range.h.
#include "grammar/number_range.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

namespace tern::grammar {

ExprPtr digit_range(char lo, char hi) { return expr_byte_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)); }

namespace {

// Every digit string s of a.size() digits with a <= s <= b (a, b of equal length).
ExprPtr digits_between(const std::string& a, const std::string& b) {
  if (a.empty()) return expr_empty();
  std::string ra = a.substr(1), rb = b.substr(1);
  if (a[0] == b[0]) return expr_seq({digit_range(a[0], a[0]), digits_between(ra, rb)});
  std::string zeros(ra.size(), '0'), nines(ra.size(), '9');
  auto any_digits = expr_repeat(digit_range('0', '9'), static_cast<int>(ra.size()), static_cast<int>(ra.size()));
  if (ra == zeros && rb == nines) return expr_seq({digit_range(a[0], b[0]), any_digits});
  std::vector<ExprPtr> alts;
  alts.push_back(expr_seq({digit_range(a[0], a[0]), digits_between(ra, nines)}));
  if (b[0] - a[0] > 1) alts.push_back(expr_seq({digit_range(static_cast<char>(a[0] + 1), static_cast<char>(b[0] - 1)), any_digits}));
  alts.push_back(expr_seq({digit_range(b[0], b[0]), digits_between(zeros, rb)}));
  return expr_alt(std::move(alts));
}

// A magnitude (x >= 0, finite) as the shortest fixed-notation decimal that reads back as x: its integer digits
// (no leading zeros) and fraction digits (no trailing zeros).
struct Decimal {
  std::string whole, frac;
};
Decimal to_decimal(double x) {
  char buf[512];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::fixed);
  const std::string s(buf, r.ptr);
  const size_t dot = s.find('.');
  Decimal d{dot == std::string::npos ? s : s.substr(0, dot), dot == std::string::npos ? "" : s.substr(dot + 1)};
  while (!d.frac.empty() && d.frac.back() == '0') d.frac.pop_back();
  while (d.whole.size() > 1 && d.whole.front() == '0') d.whole.erase(0, 1);
  return d;
}

bool all_zeros(std::string_view s) { return std::all_of(s.begin(), s.end(), [](char c) { return c == '0'; }); }

// Digit strings s of at most `budget` digits (the empty one only when allow_empty) with 0.L <= 0.s <= 0.H, strict
// where l_open / h_open; h_inf: no upper bound (0.s < 1 always). Missing digits of L, H, s count as zeros. Digit by
// digit: below the bounds' common first digit the rest is free; on a bound's digit the rest is bounded by that
// bound's rest. Null when no string qualifies (so that no branch leads to a dead end: a digit is offered only when
// some way to finish follows it).
ExprPtr fraction_range(std::string_view L, bool l_open, std::string_view H, bool h_open, bool h_inf, int budget,
                       bool allow_empty) {
  const bool l_zero = all_zeros(L), h_zero = !h_inf && all_zeros(H);
  if (!allow_empty && budget == 0) return nullptr;
  if (l_zero && !l_open && h_inf)  // no bound left: any digits (one chain below, never two: the size stays linear)
    return expr_repeat(digit_range('0', '9'), allow_empty ? 0 : 1, budget);
  std::vector<ExprPtr> alts;
  if (allow_empty && l_zero && !l_open && !(h_zero && h_open)) alts.push_back(expr_empty());  // the rest is 0
  auto then = [&](char d, ExprPtr rest) {
    if (rest) alts.push_back(expr_seq({digit_range(d, d), std::move(rest)}));
  };
  if (budget > 0) {
    const char l0 = L.empty() ? '0' : L[0], h0 = h_inf ? '9' : H.empty() ? '0' : H[0];
    const std::string_view lr = L.empty() ? L : L.substr(1), hr = H.empty() ? H : H.substr(1);
    if (l0 < h0) {
      if (h0 - l0 > 1)
        alts.push_back(expr_seq({digit_range(static_cast<char>(l0 + 1), static_cast<char>(h0 - 1)),
                                 expr_repeat(digit_range('0', '9'), 0, budget - 1)}));
      then(l0, fraction_range(lr, l_open, "", false, true, budget - 1, true));
      then(h0, fraction_range("", false, hr, h_open, h_inf, budget - 1, true));
    } else if (l0 == h0) {
      then(l0, fraction_range(lr, l_open, hr, h_open, h_inf, budget - 1, true));
    }
  }
  if (alts.empty()) return nullptr;
  return alts.size() == 1 ? alts[0] : expr_alt(std::move(alts));
}

// Magnitudes m (written without a sign) with a <= m <= b, strict where open; b_inf: no upper bound. Null when none.
ExprPtr magnitude_range(double a, bool a_open, double b, bool b_open, bool b_inf) {
  const Decimal da = to_decimal(a);
  if (da.whole.size() > 18) return nullptr;
  const int64_t ia = std::stoll(da.whole);
  Decimal db;
  int64_t ib = kMaxIntegerMagnitude;
  bool capped = b_inf;  // no upper bound below kMaxIntegerMagnitude
  if (!b_inf) {
    db = to_decimal(b);
    if (db.whole.size() > 18) capped = true;
    else ib = std::stoll(db.whole);
  }
  if (ia > ib) return nullptr;
  std::vector<ExprPtr> alts;
  // integers
  const int64_t klo = ia + ((!da.frac.empty() || a_open) ? 1 : 0);
  const int64_t khi = capped ? kMaxIntegerMagnitude : ib - ((db.frac.empty() && b_open) ? 1 : 0);
  if (klo <= khi) alts.push_back(unsigned_range(klo, khi));
  // decimals k.F
  auto decimals = [&](const std::string& whole, ExprPtr frac) {
    if (frac) alts.push_back(expr_seq({expr_literal(whole), expr_literal("."), std::move(frac)}));
  };
  if (ia < ib || capped) {
    decimals(da.whole, fraction_range(da.frac, a_open, "", false, true, kMaxFractionDigits, false));
    const int64_t mlo = ia + 1, mhi = capped ? kMaxIntegerMagnitude : ib - 1;
    if (mlo <= mhi)
      alts.push_back(expr_seq({unsigned_range(mlo, mhi), expr_literal("."),
                               expr_repeat(digit_range('0', '9'), 1, kMaxFractionDigits)}));
    if (!capped) decimals(db.whole, fraction_range("", false, db.frac, b_open, false, kMaxFractionDigits, false));
  } else {
    decimals(da.whole, fraction_range(da.frac, a_open, db.frac, b_open, false, kMaxFractionDigits, false));
  }
  if (alts.empty()) return nullptr;
  return expr_alt(std::move(alts));
}

}  // namespace

ExprPtr unsigned_range(int64_t lo, int64_t hi) {
  std::vector<ExprPtr> alts;
  int64_t low_of_len = 0, high_of_len = 9;
  for (int len = 1; len <= 18; ++len) {
    int64_t a = std::max(lo, low_of_len), c = std::min(hi, high_of_len);
    if (a <= c) alts.push_back(digits_between(std::to_string(a), std::to_string(c)));
    low_of_len = high_of_len + 1;
    if (len < 18) high_of_len = high_of_len * 10 + 9;
  }
  return expr_alt(std::move(alts));
}

ExprPtr integer_range(int64_t lo, int64_t hi) {
  if (lo > hi) return expr_nothing();
  std::vector<ExprPtr> alts;
  if (hi >= 0) alts.push_back(unsigned_range(std::max<int64_t>(lo, 0), hi));
  if (lo < 0) alts.push_back(expr_seq({expr_literal("-"), unsigned_range(hi < 0 ? -hi : 1, -lo)}));
  return expr_alt(std::move(alts));
}

ExprPtr decimal_range(double lo, bool lo_open, double hi, bool hi_open) {
  const double kInf = std::numeric_limits<double>::infinity();
  std::vector<ExprPtr> alts;
  if (lo > hi || (lo == hi && (lo_open || hi_open))) return expr_nothing();
  // x >= 0: magnitudes in [max(lo, 0), hi]
  if (hi > 0 || (hi == 0 && !hi_open)) {
    const bool from_zero = lo <= 0;
    if (ExprPtr m = magnitude_range(from_zero ? 0.0 : lo, from_zero ? (lo == 0 && lo_open) : lo_open, hi, hi_open,
                                    hi == kInf))
      alts.push_back(std::move(m));
  }
  // x < 0: x = -m with m in [max(-hi, 0), -lo] and m > 0 (no "-0")
  if (lo < 0) {
    const bool to_zero = hi >= 0;
    if (ExprPtr m = magnitude_range(to_zero ? 0.0 : -hi, to_zero ? true : hi_open, -lo, lo_open, lo == -kInf))
      alts.push_back(expr_seq({expr_literal("-"), std::move(m)}));
  }
  return expr_alt(std::move(alts));  // none: matches nothing (the schema compiler reports it)
}

}  // namespace tern::grammar
