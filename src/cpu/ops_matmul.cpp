#include "cpu/ops_matmul.h"

#include <algorithm>
#include <vector>

#include "core/bf16.h"
#include "core/check.h"
#include "core/thread_pool.h"

namespace tern::cpu {
namespace {

// Eight fp32 lanes. GCC/Clang vector extension: the lane arithmetic is the same whatever instructions implement it
// (two SSE registers on the portable baseline, one AVX register in the avx2 clone), so results are identical.
typedef float v8f __attribute__((vector_size(32)));
typedef float v8f_unaligned __attribute__((vector_size(32), aligned(4), may_alias));

constexpr int64_t kRowTile = 4;     // rows per micro-kernel
constexpr int64_t kTokenTile = 2;   // tokens per micro-kernel
constexpr int64_t kRowChunk = 16;   // rows dequantised together and reused across all tokens


inline float hsum(const v8f& a) {
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

// out[r][t] = dot(w[r], x[t]) over `cols`: one v8f accumulator per (r, t), then a fixed horizontal sum, then the
// scalar tail. The same per-element order for every tile shape.
template <int R, int TT>
#if defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
void dot_tile(const float* const* w, const float* const* x, int64_t cols, float* out /*[R][TT]*/) {
  const float* wp[R];
  const float* xp[TT];
  for (int r = 0; r < R; ++r) wp[r] = w[r];
  for (int t = 0; t < TT; ++t) xp[t] = x[t];
  v8f acc[R * TT] = {};
  const int64_t c8 = cols / 8 * 8;
  for (int64_t c = 0; c < c8; c += 8) {
    v8f xv[TT];
#pragma GCC unroll 4
    for (int t = 0; t < TT; ++t) xv[t] = *reinterpret_cast<const v8f_unaligned*>(xp[t] + c);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const v8f wv = *reinterpret_cast<const v8f_unaligned*>(wp[r] + c);
#pragma GCC unroll 4
      for (int t = 0; t < TT; ++t) acc[r * TT + t] += wv * xv[t];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TT; ++t) {
      float s = hsum(acc[r * TT + t]);
      for (int64_t c = c8; c < cols; ++c) s += wp[r][c] * xp[t][c];
      out[r * TT + t] = s;
    }
}

typedef uint32_t v8u __attribute__((vector_size(32)));

// Dequantises row r of a plain matrix into out[cols], one group at a time: w = scale · q + bias in fp32 (a multiply
// then an add, exactly as matrix_row_to_f32), eight values per step.
#if defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
void dequant_row(const Matrix& m, int64_t r, float* out) {
  switch (m.format) {
    case WeightFormat::f32: {
      const float* p = static_cast<const float*>(m.data) + r * m.cols;
      std::copy(p, p + m.cols, out);
      return;
    }
    case WeightFormat::bf16: {
      const uint16_t* p = static_cast<const uint16_t*>(m.data) + r * m.cols;
      for (int64_t c = 0; c < m.cols; ++c) out[c] = bf16_to_float(p[c]);
      return;
    }
    case WeightFormat::affine4:
    case WeightFormat::affine8: {
      const bool four = m.format == WeightFormat::affine4;
      const uint32_t* w = static_cast<const uint32_t*>(m.data) + r * m.row_words();
      const int64_t gpr = m.groups_per_row();
      const uint16_t* s = m.scales + r * gpr;
      const uint16_t* b = m.biases + r * gpr;
      // Eight values per step: one 4-bit word, or two 8-bit words.
      const v8u shift = four ? v8u{0, 4, 8, 12, 16, 20, 24, 28} : v8u{0, 8, 16, 24, 0, 8, 16, 24};
      const uint32_t mask = four ? 0xfu : 0xffu;
      const int64_t words_per_step = four ? 1 : 2;
      const int64_t steps = m.group_size / 8;
      for (int64_t g = 0; g < gpr; ++g) {
        const float sc = bf16_to_float(s[g]), bi = bf16_to_float(b[g]);
        const v8f scv = {sc, sc, sc, sc, sc, sc, sc, sc}, biv = {bi, bi, bi, bi, bi, bi, bi, bi};
        const uint32_t* wg = w + g * steps * words_per_step;
        float* o = out + g * m.group_size;
        for (int64_t i = 0; i < steps; ++i) {
          v8u q;
          if (four) {
            const uint32_t x = wg[i];
            q = v8u{x, x, x, x, x, x, x, x};
          } else {
            const uint32_t x0 = wg[2 * i], x1 = wg[2 * i + 1];
            q = v8u{x0, x0, x0, x0, x1, x1, x1, x1};
          }
          q = (q >> shift) & mask;
          const v8f f = __builtin_convertvector(q, v8f);
          *reinterpret_cast<v8f_unaligned*>(o + 8 * i) = scv * f + biv;
        }
      }
      return;
    }
  }
}

void check_matrix(const Matrix& w, const char* what) {
  TERN_CHECK(!w.empty(), what, ": the weight matrix is empty (not loaded)");
  TERN_CHECK(w.experts == 1, what, ": needs a plain matrix, got one with ", w.experts,
             " experts; take Matrix::expert(e) first");
  TERN_CHECK(w.rows > 0 && w.cols > 0, what, ": bad matrix shape [", w.rows, ", ", w.cols, "]");
  if (w.quantized()) {
    TERN_CHECK(w.group_size > 0 && w.group_size % 8 == 0 && w.cols % w.group_size == 0, what,
               ": affine matrix with ", w.cols, " columns and group size ", w.group_size);
    TERN_CHECK(w.scales && w.biases, what, ": affine matrix without scales/biases");
  }
}

// Rows [r0, r1) of y for all n tokens.
void matmul_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const Matrix& w = *a.w;
  const int64_t cols = w.cols;
  thread_local std::vector<float> buf;
  const float* rows[kRowChunk];
  if (w.format == WeightFormat::f32) {
    for (int64_t r = r0; r < r1; ++r) rows[r - r0] = static_cast<const float*>(w.data) + r * cols;
  } else {
    if (buf.size() < size_t(kRowChunk * cols)) buf.resize(size_t(kRowChunk * cols));
    for (int64_t r = r0; r < r1; ++r) {
      dequant_row(w, r, buf.data() + (r - r0) * cols);
      rows[r - r0] = buf.data() + (r - r0) * cols;
    }
  }
  const int64_t nr = r1 - r0;
  float out[kRowTile * kTokenTile];
  int64_t t = 0;
  for (; t + kTokenTile <= a.n; t += kTokenTile) {
    const float* xs[kTokenTile] = {a.x + t * a.ldx, a.x + (t + 1) * a.ldx};
    int64_t r = 0;
    for (; r + kRowTile <= nr; r += kRowTile) {
      dot_tile<kRowTile, kTokenTile>(rows + r, xs, cols, out);
      for (int i = 0; i < kRowTile; ++i)
        for (int j = 0; j < kTokenTile; ++j) a.y[(t + j) * a.ldy + r0 + r + i] = out[i * kTokenTile + j];
    }
    for (; r < nr; ++r) {
      dot_tile<1, kTokenTile>(rows + r, xs, cols, out);
      for (int j = 0; j < kTokenTile; ++j) a.y[(t + j) * a.ldy + r0 + r] = out[j];
    }
  }
  for (; t < a.n; ++t) {
    const float* xs[1] = {a.x + t * a.ldx};
    int64_t r = 0;
    for (; r + kRowTile <= nr; r += kRowTile) {
      dot_tile<kRowTile, 1>(rows + r, xs, cols, out);
      for (int i = 0; i < kRowTile; ++i) a.y[t * a.ldy + r0 + r + i] = out[i];
    }
    for (; r < nr; ++r) {
      dot_tile<1, 1>(rows + r, xs, cols, out);
      a.y[t * a.ldy + r0 + r] = out[0];
    }
  }
}

}  // namespace

void matmul_strided(const MatmulArgs& a) {
  TERN_CHECK(a.w != nullptr, "matmul: no matrix");
  check_matrix(*a.w, "matmul");
  TERN_CHECK(a.n >= 0 && a.ldx >= a.w->cols && a.ldy >= a.w->rows, "matmul: strides ldx=", a.ldx, " ldy=", a.ldy,
             " too small for a [", a.w->rows, ", ", a.w->cols, "] matrix");
  if (a.n == 0) return;
  TERN_CHECK(a.x && a.y, "matmul: null input or output");
  const int64_t rows = a.w->rows;
  ThreadPool& pool = thread_pool_global();
  // Chunks of kRowChunk rows; enough chunks to balance the threads. The split does not change any result.
  const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk;
  pool.parallel_for(chunks, std::max<int64_t>(1, chunks / (8 * pool.size())), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) matmul_rows(a, c * kRowChunk, std::min(rows, (c + 1) * kRowChunk));
  });
}

void matmul(const Matrix& w, const float* x, int64_t n, float* y) {
  matmul_strided({.w = &w, .x = x, .ldx = w.cols, .y = y, .ldy = w.rows, .n = n});
}

float matrix_row_dot(const Matrix& w, int64_t r, const float* x) {
  check_matrix(w, "matrix_row_dot");
  TERN_CHECK(r >= 0 && r < w.rows, "matrix_row_dot: row ", r, " out of range [0, ", w.rows, ")");
  std::vector<float> row(static_cast<size_t>(w.cols));
  dequant_row(w, r, row.data());
  const float* rows[1] = {row.data()};
  const float* xs[1] = {x};
  float out;
  dot_tile<1, 1>(rows, xs, w.cols, &out);
  return out;
}

}  // namespace tern::cpu
