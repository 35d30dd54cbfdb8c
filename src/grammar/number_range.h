// Number ranges as grammars of JSON number text (internal to src/grammar): integers between two bounds, and decimals
// between two real bounds (JSON Schema's minimum / maximum / exclusive*), digit by digit.
#pragma once

#include <cstdint>
#include <limits>

#include "grammar/grammar_impl.h"

namespace tern::grammar {

constexpr int64_t kMaxIntegerMagnitude = 999'999'999'999'999'999;  // 18 digits: always fits an int64
constexpr int kMaxFractionDigits = 15;                               // digits after '.' in a generated number

// One byte from lo to hi ('0'..'9' ranges).
ExprPtr digit_range(char lo, char hi);

// Canonical decimals (no leading zeros) of lo..hi, 0 <= lo <= hi <= kMaxIntegerMagnitude.
ExprPtr unsigned_range(int64_t lo, int64_t hi);

// Canonical integers lo..hi (a '-' before negatives; none: lo > hi), |lo|, |hi| <= kMaxIntegerMagnitude.
ExprPtr integer_range(int64_t lo, int64_t hi);

// JSON numbers x with lo <= x <= hi (strict at an open bound; a bound of ±infinity is none), written as an integer
// or as I.F with 1 to kMaxFractionDigits fraction digits (no exponent, no "-0"). The bounds are read as the shortest
// decimals that give back their doubles (0.1 as 0.1), so a bound written in the schema is itself generated when
// closed. Values past kMaxIntegerMagnitude are not generated.
ExprPtr decimal_range(double lo, bool lo_open, double hi, bool hi_open);

}  // namespace tern::grammar
