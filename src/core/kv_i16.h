// The i16 KV cache's row quantisation on the host (--kv-dtype i16; src/cuda/kernels/attention/attention.cuh has the
// format), the CPU twin of attention_tiles.cuh's i16_row_scale and quantize8_i16: a row (one token's K or V of one KV
// head) is int16 values and an fp32 scale, scale = max|x| / 32767 (±inf counted as FLT_MAX, NaN when the row holds a
// NaN, 0 for a row of zeros), value = rint(x / scale) (nearest even) clamped to ±32767, 0 when the scale is 0 or NaN.
// It reads back as value · scale (fp32), at most a 65534th of the row's largest magnitude from x.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

namespace tern {

// The scale of a row whose largest magnitude (NaN ignored) is amax; has_nan: whether the row holds a NaN.
inline float kv_i16_row_scale(float amax, bool has_nan) {
  if (has_nan) return std::nanf("");
  const float finite = amax > FLT_MAX ? FLT_MAX : amax;
  return finite / 32767.0f;
}

// A row value's code under its row's scale.
inline int16_t kv_i16_encode(float x, float scale) {
  if (!(scale > 0.0f)) return 0;
  const float r = std::fmin(std::fmax(x / scale, -32767.0f), 32767.0f);
  return int16_t(std::nearbyint(r));  // nearest even (the default rounding mode)
}

// The value a code stands for: code · scale in fp32.
inline float kv_i16_decode(int16_t code, float scale) { return float(code) * scale; }

}  // namespace tern
