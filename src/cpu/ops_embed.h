// Embedding lookup: one row of the (possibly quantised) embedding matrix per token, dequantised to fp32.
#pragma once

#include <cstdint>
#include <span>

#include "model/weights.h"

namespace tern::cpu {

// out[T, D] = embed[ids[t], :]. embed is a plain [V, D] matrix of any format. Throws tern::Error naming the token
// when an id is outside [0, V).
void embed_lookup(const Matrix& embed, std::span<const int32_t> ids, float* out);

}  // namespace tern::cpu
