// fp8 e4m3fn <-> float on the host, as cuda_fp8.h's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) and
// __nv_cvt_fp8_to_halfraw do them on the device (the hardware cvt on sm_89+, the same rounding in software before):
// round to nearest even, magnitudes past 448 (±inf included) saturate to ±448, NaN becomes the canonical NaN code
// 0x7f whatever its sign (the software path canonicalises the float first). e4m3fn: 1 sign, 4 exponent (bias 7), 3
// mantissa bits; no infinities; the codes 0x7f and 0xff are NaN; subnormals are m·2^-9. Also the fp8 KV cache's row
// quantisation (its CPU twin).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tern {

using fp8_bits = uint8_t;  // raw e4m3fn storage

inline constexpr float kFp8E4m3Max = 448.0f;

inline float fp8_e4m3_to_float(fp8_bits b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  if (e == 15 && m == 7) return std::nanf("");
  if (e == 0) return sign * std::ldexp(float(m), -9);  // subnormal (or zero)
  return sign * std::ldexp(float(8 + m), e - 10);      // (1 + m/8)·2^(e-7)
}

inline fp8_bits float_to_fp8_e4m3(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return 0x7f;
  const fp8_bits sign = fp8_bits((u >> 24) & 0x80);
  const float a = std::fabs(x);
  if (a >= kFp8E4m3Max) return fp8_bits(sign | 0x7e);
  if (a < std::ldexp(1.0f, -6)) {  // subnormal: a multiple of 2^-9; 8·2^-9 carries into the smallest normal
    const int n = int(std::nearbyint(a * 512.0f));  // exact scaling; nearbyint rounds to even (default mode)
    return fp8_bits(sign | n);
  }
  int k = 0;
  const float f = std::frexp(a, &k);                  // a = f·2^k, f in [0.5, 1)
  const int n = int(std::nearbyint(f * 16.0f));       // the significand in eighths, 8..16 (16 carries)
  const int code = ((k - 1 + 7) << 3) + (n - 8);
  return fp8_bits(sign | (code > 0x7e ? 0x7e : code));
}

// The fp8 KV cache's scale of a row whose largest magnitude is amax (NaN ignored, as fmaxf does; ±inf counted as
// FLT_MAX): amax / 448 in fp32. 0 for a row of zeros.
inline float fp8_row_scale(float amax) {
  const float finite = amax > 3.40282347e38f ? 3.40282347e38f : amax;
  return finite / kFp8E4m3Max;
}

// A row value's code under its row's scale: e4m3(x / scale), x itself (±0 or NaN) when the scale is 0.
inline fp8_bits fp8_row_encode(float x, float scale) { return float_to_fp8_e4m3(scale > 0.0f ? x / scale : x); }

}  // namespace tern
