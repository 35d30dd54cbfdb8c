// Matrix products against the internal weight formats (f32, bf16, MLX affine 4/8-bit): y = x · Wᵀ.
//
// Affine weights are dequantised one group (group_size values along the input axis) at a time inside the product;
// a whole matrix is never expanded. Accumulation is fp32. Work is split over output rows with the process-wide
// thread pool; every output element is computed by one thread in one fixed order, so results do not depend on the
// thread count, and the value of y[t, r] does not depend on n (prefill and decode agree bit for bit).
#pragma once

#include <cstdint>

#include "model/weights.h"

namespace tern::cpu {

// y[n, w.rows] = x[n, w.cols] · Wᵀ, for a plain matrix (w.experts == 1; take Matrix::expert(e) first).
// x and y must not overlap. Throws tern::Error on a stacked or empty matrix.
void matmul(const Matrix& w, const float* x, int64_t n, float* y);

// Strided form: x rows are ldx floats apart, y rows ldy floats apart (ldx >= w.cols, ldy >= w.rows), so a product
// can read from or write into a slice of a wider buffer.
struct MatmulArgs {
  const Matrix* w = nullptr;  // plain [rows, cols]
  const float* x = nullptr;   // [n, ldx]
  int64_t ldx = 0;
  float* y = nullptr;         // [n, ldy]
  int64_t ldy = 0;
  int64_t n = 0;
};
void matmul_strided(const MatmulArgs& args);

// Dot product of row r of w (dequantised) with x[w.cols]; the scalar oracle for tests and the one-row case.
float matrix_row_dot(const Matrix& w, int64_t r, const float* x);

}  // namespace tern::cpu
