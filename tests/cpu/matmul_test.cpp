// Matrix products in every weight format against a plain double-precision formula on the dequantised rows.
#include <gtest/gtest.h>

#include <cmath>

#include "cpu/ops_embed.h"
#include "cpu/ops_matmul.h"
#include "core/check.h"
#include "cpu_test_util.h"

namespace tern {
namespace {

void check_format(WeightFormat f, int64_t rows, int64_t cols, int64_t n, int64_t experts = 1) {
  test::Rng rng(test::fresh_seed(weight_format_name(f)));
  test::HeapStorage st;
  const Matrix stacked = test::random_matrix(rng, st, f, rows, cols, 0.1f, experts);
  const std::vector<float> x = rng.normals(static_cast<size_t>(n * cols));
  for (int64_t e = 0; e < experts; ++e) {
    const Matrix w = experts > 1 ? stacked.expert(e) : stacked;
    std::vector<float> y(static_cast<size_t>(n * rows)), row(static_cast<size_t>(cols));
    cpu::matmul(w, x.data(), n, y.data());
    // Tolerance: fp32 accumulation of `cols` products of O(1) terms: 1e-5 relative to the row's Σ|w·x|.
    for (int64_t r = 0; r < rows; ++r) {
      matrix_row_to_f32(w, r, row.data());
      for (int64_t t = 0; t < n; ++t) {
        double ref = 0.0, mag = 0.0;
        for (int64_t c = 0; c < cols; ++c) {
          ref += double(row[size_t(c)]) * x[size_t(t * cols + c)];
          mag += std::fabs(double(row[size_t(c)]) * x[size_t(t * cols + c)]);
        }
        ASSERT_NEAR(y[size_t(t * rows + r)], ref, 1e-5 * mag + 1e-7)
            << weight_format_name(f) << " expert " << e << " row " << r << " token " << t;
      }
    }
    // The value of a token's row does not depend on how many tokens share the call (prefill == decode).
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> y1(static_cast<size_t>(rows));
      cpu::matmul(w, x.data() + t * cols, 1, y1.data());
      for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(y1[size_t(r)], y[size_t(t * rows + r)]) << "row " << r;
      ASSERT_EQ(cpu::matrix_row_dot(w, rows - 1, x.data() + t * cols), y[size_t(t * rows + rows - 1)]);
    }
  }
}

TEST(CpuMatmul, F32) { check_format(WeightFormat::f32, 37, 200, 5); }
TEST(CpuMatmul, Bf16) { check_format(WeightFormat::bf16, 33, 136, 4); }
TEST(CpuMatmul, Affine4) { check_format(WeightFormat::affine4, 45, 256, 7); }
TEST(CpuMatmul, Affine8) { check_format(WeightFormat::affine8, 19, 128, 3); }
TEST(CpuMatmul, StackedExperts) { check_format(WeightFormat::affine4, 24, 128, 3, 3); }

TEST(CpuMatmul, Strided) {
  test::Rng rng(test::fresh_seed("strided"));
  test::HeapStorage st;
  const Matrix w = test::random_matrix(rng, st, WeightFormat::f32, 10, 16);
  const std::vector<float> x = rng.normals(3 * 20);
  std::vector<float> y(3 * 12, 7.0f), ref(3 * 10);
  std::vector<float> xc(3 * 16);
  for (int t = 0; t < 3; ++t)
    for (int c = 0; c < 16; ++c) xc[size_t(t * 16 + c)] = x[size_t(t * 20 + c)];
  cpu::matmul(w, xc.data(), 3, ref.data());
  cpu::matmul_strided({.w = &w, .x = x.data(), .ldx = 20, .y = y.data(), .ldy = 12, .n = 3});
  for (int t = 0; t < 3; ++t) {
    for (int r = 0; r < 10; ++r) EXPECT_EQ(y[size_t(t * 12 + r)], ref[size_t(t * 10 + r)]);
    EXPECT_EQ(y[size_t(t * 12 + 10)], 7.0f);  // untouched padding
  }
}

TEST(CpuMatmul, RejectsBadInput) {
  test::Rng rng(1);
  test::HeapStorage st;
  const Matrix stacked = test::random_matrix(rng, st, WeightFormat::f32, 4, 8, 0.1f, 2);
  std::vector<float> x(8), y(4);
  EXPECT_THROW(cpu::matmul(stacked, x.data(), 1, y.data()), Error);
  EXPECT_THROW(cpu::matmul(Matrix{}, x.data(), 1, y.data()), Error);
}

TEST(CpuEmbed, RowsAndBadIds) {
  test::Rng rng(test::fresh_seed("embed"));
  test::HeapStorage st;
  const Matrix e = test::random_matrix(rng, st, WeightFormat::affine4, 50, 128);
  const std::vector<int32_t> ids = {3, 49, 0, 3};
  std::vector<float> out(4 * 128), row(128);
  cpu::embed_lookup(e, ids, out.data());
  for (size_t t = 0; t < ids.size(); ++t) {
    matrix_row_to_f32(e, ids[t], row.data());
    for (int c = 0; c < 128; ++c) ASSERT_EQ(out[t * 128 + size_t(c)], row[size_t(c)]);
  }
  const std::vector<int32_t> bad = {1, 50};
  EXPECT_THROW(cpu::embed_lookup(e, bad, out.data()), Error);
  const std::vector<int32_t> neg = {-1};
  EXPECT_THROW(cpu::embed_lookup(e, neg, out.data()), Error);
}

}  // namespace
}  // namespace tern
