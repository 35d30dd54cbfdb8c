// Allowed-token bitmasks (constrained decoding): bit (id % 32) of words[id / 32] set <=> id may be sampled.
// apply_token_mask is the host twin of the CUDA kernel in src/cuda/kernels/token_mask/token_mask.cu; both set every
// disallowed logit to -inf, so the sampler (and the log-probabilities it reports) never sees a masked id.
#pragma once

#include <cstdint>
#include <span>

namespace tern {

inline bool token_mask_allows(std::span<const uint32_t> mask, int64_t id) {
  return id >= 0 && size_t(id / 32) < mask.size() && ((mask[size_t(id / 32)] >> (id % 32)) & 1u) != 0;
}

// logits[i] = -inf for every i whose bit is clear, including ids past the mask's last word.
void apply_token_mask(std::span<float> logits, std::span<const uint32_t> mask);

// Number of ids in [0, n) the mask allows.
int64_t token_mask_count(std::span<const uint32_t> mask, int64_t n);

}  // namespace tern
