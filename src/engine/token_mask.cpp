#include "engine/token_mask.h"

#include <algorithm>
#include <bit>
#include <limits>

namespace tern {

void apply_token_mask(std::span<float> logits, std::span<const uint32_t> mask) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t n = logits.size();
  const size_t covered = std::min(n, mask.size() * 32);
  for (size_t w = 0; w * 32 < covered; ++w) {
    const uint32_t bits = mask[w];
    if (bits == 0xffffffffu) continue;
    const size_t end = std::min(covered, w * 32 + 32);
    for (size_t i = w * 32; i < end; ++i)
      if (!((bits >> (i % 32)) & 1u)) logits[i] = kNegInf;
  }
  std::fill(logits.begin() + ptrdiff_t(covered), logits.end(), kNegInf);
}

int64_t token_mask_count(std::span<const uint32_t> mask, int64_t n) {
  int64_t count = 0;
  for (int64_t w = 0; w < int64_t(mask.size()) && w * 32 < n; ++w) {
    uint32_t bits = mask[size_t(w)];
    if (n - w * 32 < 32) bits &= (1u << (n - w * 32)) - 1u;
    count += std::popcount(bits);
  }
  return count;
}

}  // namespace tern
