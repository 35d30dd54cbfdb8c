#include "model/quantize.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/bf16.h"
#include "core/check.h"

namespace tern {

void quantize_affine(const float* w, int64_t rows, int64_t cols, int bits, int group_size, uint32_t* packed,
                     uint16_t* scales, uint16_t* biases) {
  TERN_CHECK(bits == 4 || bits == 8, "quantize_affine: bits must be 4 or 8, got ", bits);
  TERN_CHECK(group_size == 32 || group_size == 64 || group_size == 128,
             "quantize_affine: group_size must be 32, 64 or 128, got ", group_size);
  TERN_CHECK(rows >= 0 && cols > 0 && cols % group_size == 0, "quantize_affine: cols (", cols,
             ") must be a positive multiple of group_size (", group_size, ")");
  const float n_bins = float((1 << bits) - 1);
  const float eps = 1e-7f;
  const int per_word = 32 / bits;
  const int64_t groups = cols / group_size;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    uint32_t* out = packed + r * (cols / per_word);
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = row + g * group_size;
      float lo = std::numeric_limits<float>::infinity(), hi = -lo;
      for (int j = 0; j < group_size; ++j) {
        hi = std::max(hi, x[j]);
        lo = std::min(lo, x[j]);
      }
      const bool lo_edge = std::abs(lo) > std::abs(hi);
      float scale = std::max((hi - lo) / n_bins, eps);
      scale = lo_edge ? scale : -scale;
      const float edge = lo_edge ? lo : hi;
      const float q0 = std::rint(edge / scale);
      float bias = 0.0f;
      if (q0 != 0.0f) {
        scale = edge / q0;
        bias = edge;
      }
      for (int j = 0; j < group_size; j += per_word) {
        uint32_t word = 0;
        for (int k = 0; k < per_word; ++k) {
          float q = std::rint((x[j + k] - bias) / scale);
          q = q >= 0.0f ? std::min(q, n_bins) : 0.0f;  // NaN -> 0
          word |= uint32_t(q) << (k * bits);
        }
        out[(g * group_size + j) / per_word] = word;
      }
      scales[r * groups + g] = float_to_bf16(scale);
      biases[r * groups + g] = float_to_bf16(bias);
    }
  }
}

}  // namespace tern
