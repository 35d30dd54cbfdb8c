// qmv (decode matrix-vector products, src/cuda/kernels/qmv/qmv.cuh) against its CPU twin: cpu::rms_norm (optional)
// followed by cpu::matmul on the same weights, for every weight format, T in {1, 3, 8}, with and without the norm
// prologue and the accumulate mode, rows that are not a multiple of the tile, and a stacked matrix read at expert
// index > 0. The 4-bit tensor-core path is also held to a twin (in double) that splits the activations into
// fp16 hi + lo exactly as the kernel stages them. The one-token integer path (qmv_dp4a) is held to twins that quantise
// the activations as it does, and its batched form (qmv_dp4a_batched) to the one-token results, bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/ops_matmul.h"
#include "cpu/ops_norm.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/kernels/qmv/qmv.cuh"
#include "cuda/kernels/qmv/qmv_dp4a.cuh"
#include "cuda/kernels/qmv/qmv_dp4a_mma.cuh"
#include "core/bf16.h"
#include "../cuda_test_util.h"

namespace tern::cuda::test {
namespace {

// Round to the nearest fp16 value (ties to even), as __float2half_rn does; no overflow in the tests' range.
float fp16_round(float v) {
  if (v == 0.0f || !std::isfinite(v)) return v;
  int e = 0;
  std::frexp(v, &e);  // |v| ∈ [2^(e-1), 2^e)
  const int q = std::max(e - 1 - 10, -24);
  return std::ldexp(std::nearbyint(std::ldexp(v, -q)), q);
}

// hi + lo of v: hi = fp16(v), lo = fp16(v − hi) (v − hi and hi + lo exact in fp32), as the kernel stages them.
float fp16_split(float v) {
  const float hi = fp16_round(v);
  return hi + fp16_round(v - hi);
}

// The activations the 4-bit tensor-core path multiplies with (qmv_tile.cuh): per (token, group of 64 columns) a power
// of two σ with max|x|·σ ∈ [128, 256), x·σ split into fp16 hi + lo, the odd columns of each 8-column word divided by
// 16 before splitting. x [T, cols] in place (cols % 64 == 0).
void round_like_tensor_path(std::vector<float>& x, int T, int64_t cols) {
  for (int t = 0; t < T; ++t)
    for (int64_t g0 = 0; g0 < cols; g0 += 64) {
      float* xg = x.data() + int64_t(t) * cols + g0;
      float m = 0.0f;
      for (int c = 0; c < 64; ++c) m = std::max(m, std::fabs(xg[c]));
      int e = 0;
      std::frexp(m, &e);
      const int sh = m > 0.0f ? std::clamp(7 - (e - 1), -100, 100) : 0;
      for (int c = 0; c < 64; ++c) {
        const float v = std::ldexp(xg[c], sh);
        const float b = c % 2 ? fp16_split(v * 0.0625f) * 16.0f : fp16_split(v);
        xg[c] = std::ldexp(b, -sh);
      }
    }
}

// Every element within tol[i] + rtol·|ref| (NaN fails). Prints the worst element.
void expect_close_each(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<float>& tol,
                       float rtol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t bad = 0, worst = 0;
  double worst_excess = -1e300;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double t = tol[i] + rtol * std::fabs(ref[i]);
    const double err = std::fabs(double(got[i]) - double(ref[i]));
    const double excess = std::isnan(err) ? 1e30 : err - t;
    if (!(err <= t)) ++bad;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << ref.size() << " elements outside tolerance; worst at "
                     << worst << ": got " << got[worst] << ", want " << ref[worst] << ", tol " << tol[worst];
}

struct QmvCase {
  WeightFormat f;
  int64_t experts, rows, cols, expert;
};

std::string describe(const QmvCase& c, int T, bool norm, bool acc, int64_t ldx) {
  return std::string(weight_format_name(c.f)) + " [" + std::to_string(c.experts) + "][" + std::to_string(c.rows) +
         ", " + std::to_string(c.cols) + "] expert " + std::to_string(c.expert) + " T=" + std::to_string(T) +
         (norm ? " norm" : "") + (acc ? " accumulate" : "") + " ldx=" + std::to_string(ldx);
}

// Error scales that do not cancel (a single row's value can be ~0 by cancellation): per token t,
//   mag[t] = rms over rows r of sqrt(Σ_c (W[r, c]·x[t, c])²), the size of a row's dot product before cancellation;
// the loose check (against the fp32 reference) allows 1e-5·mag[t] for the tensor-core path (hi + lo activations:
// x' within ~2^-22 of x relative, products exact, fp32 sums; the CPU reference's own fp32 sums ~1e-6·mag),
// 2e-5·sqrt(cols)·mag[t] for the fp32 SIMT paths. The tight check (against a double-precision twin with the same
// hi + lo activations) allows, per element,
//   2^-15 · sqrt(Σ_g (s[r, g]² + (b[r, g] + 8·s[r, g])²) · Σ_{c in g} a[t, c]²) + 4e-6·mag[t]
// (s, b the group scale and bias, a the activations as multiplied): per group the tensor cores sum the exact
// products (q − 8)·a in fp32 with truncation (8 MMAs, partial sums ≤ ~8·|a|), a few ulps of ~2^-20 of s·|a|, the
// fp32 Σa of the bias term likewise; the fold's fp32 accumulation over the groups adds ~1e-6 of the partial sums
// (~mag). Both scales stay far below the effect of a wrong index, nibble, missing group or a wrong scale/bias fold
// (≥ s·|x_c| per element, ~2^-8 of mag).
std::vector<float> row_magnitudes(const Matrix& w, const std::vector<float>& x, int T) {
  std::vector<double> acc(static_cast<size_t>(T), 0.0);
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    matrix_row_to_f32(w, r, row.data());
    for (int t = 0; t < T; ++t) {
      const float* xt = x.data() + int64_t(t) * w.cols;
      double s = 0;
      for (int64_t cc = 0; cc < w.cols; ++cc) {
        const double v = double(row[size_t(cc)]) * xt[cc];
        s += v * v;
      }
      acc[size_t(t)] += s;
    }
  }
  std::vector<float> mag(static_cast<size_t>(T));
  for (int t = 0; t < T; ++t) mag[size_t(t)] = float(std::sqrt(acc[size_t(t)] / double(std::max<int64_t>(1, w.rows))));
  return mag;
}

// y[t, r] = Σ_c W[r, c]·a[t, c] in double (W dequantised to fp32 as the CPU matmul does).
std::vector<float> matmul_double(const Matrix& w, const std::vector<float>& a, int T) {
  std::vector<float> y(size_t(T * w.rows)), row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    matrix_row_to_f32(w, r, row.data());
    for (int t = 0; t < T; ++t) {
      const float* at = a.data() + int64_t(t) * w.cols;
      double s = 0;
      for (int64_t cc = 0; cc < w.cols; ++cc) s += double(row[size_t(cc)]) * at[cc];
      y[size_t(t * w.rows + r)] = float(s);
    }
  }
  return y;
}

// Tight tolerance [T, rows] of the tensor path for activations a [T, cols] (as multiplied, x units), without the
// mag term.
std::vector<float> tight_tolerance(const Matrix& w, const std::vector<float>& a, int T) {
  const int64_t gpr = w.cols / 64;
  std::vector<double> q(size_t(T * gpr), 0.0);  // Σ a² per (token, group)
  for (int t = 0; t < T; ++t)
    for (int64_t cc = 0; cc < w.cols; ++cc) q[size_t(t * gpr + cc / 64)] += double(a[size_t(t * w.cols + cc)]) * a[size_t(t * w.cols + cc)];
  std::vector<float> tol(size_t(T * w.rows));
  for (int t = 0; t < T; ++t)
    for (int64_t r = 0; r < w.rows; ++r) {
      double s2 = 0;
      for (int64_t g = 0; g < gpr; ++g) {
        const double sg = bf16_to_float(w.scales[r * gpr + g]), bg = bf16_to_float(w.biases[r * gpr + g]) + 8.0 * sg;
        s2 += (sg * sg + bg * bg) * q[size_t(t * gpr + g)];
      }
      tol[size_t(t * w.rows + r)] = float(std::ldexp(std::sqrt(s2), -15)) + 1e-7f;
    }
  return tol;
}

void run_case(std::mt19937_64& rng, const QmvCase& c) {
  auto h = random_matrix(rng, c.f, c.experts, c.rows, c.cols);
  DeviceMatrix dm(*h);
  const Matrix we = c.experts > 1 ? h->m.expert(c.expert) : h->m;
  const auto norm_w = random_floats(rng, size_t(c.cols), 0.5f, 1.5f);
  DeviceBuf<float> dnorm(norm_w);
  for (int T : {1, 3, 8}) {
    // T = 3 reads x and writes y through strides (x's stride not a multiple of 4 floats: the unaligned path).
    const int64_t ldx = T == 3 ? c.cols + 1 : c.cols, ldy = T == 3 ? c.rows + 5 : c.rows;
    // Token 1 has an outlier; token 7 one beyond the fp16 range (the per-group scale must handle it).
    auto x = random_floats(rng, size_t(T * ldx), -2.0f, 2.0f);
    for (int t = 0; t < T; ++t)
      if (t == 1 || t == 7) x[size_t(t * ldx + int64_t(rng() % uint64_t(c.cols)))] = t == 7 ? -1.0e5f : 300.0f;
    std::vector<float> xn(size_t(T * c.cols)), xp(size_t(T * c.cols));
    for (int t = 0; t < T; ++t)
      std::copy_n(x.begin() + t * ldx, c.cols, xp.begin() + int64_t(t) * c.cols);
    cpu::rms_norm(xp.data(), norm_w.data(), T, c.cols, 1e-6f, xn.data());
    std::vector<float> ref_plain(size_t(T * c.rows)), ref_norm(size_t(T * c.rows));
    cpu::matmul(we, xp.data(), T, ref_plain.data());
    cpu::matmul(we, xn.data(), T, ref_norm.data());
    const std::vector<float> mag_plain = row_magnitudes(we, xp, T), mag_norm = row_magnitudes(we, xn, T);
    // Twins (double) with the tensor path's hi + lo activations (4-bit, cols % 256 == 0): only the GPU's fp32 sums
    // differ.
    // With the norm the kernel stages x·norm_w and multiplies the output by the token's rsqrt(mean(x²) + eps).
    const bool tensor_path = c.f == WeightFormat::affine4 && c.cols % 256 == 0;
    std::vector<float> tight_plain, tight_norm, tol_plain, tol_norm;
    if (tensor_path) {
      std::vector<float> rp(xp), rw(xp), inv(static_cast<size_t>(T));
      for (int t = 0; t < T; ++t) {
        double ss = 0;
        for (int64_t cc = 0; cc < c.cols; ++cc) {
          const double v = xp[size_t(t * c.cols + cc)];
          ss += v * v;
          rw[size_t(t * c.cols + cc)] = xp[size_t(t * c.cols + cc)] * norm_w[size_t(cc)];
        }
        inv[size_t(t)] = float(1.0 / std::sqrt(ss / double(c.cols) + 1e-6));
      }
      round_like_tensor_path(rp, T, c.cols);
      round_like_tensor_path(rw, T, c.cols);
      tight_plain = matmul_double(we, rp, T);
      tight_norm = matmul_double(we, rw, T);
      std::vector<float> an(rw);  // as multiplied: rounded x·norm_w times the factor
      for (int t = 0; t < T; ++t) {
        for (int64_t r = 0; r < c.rows; ++r) tight_norm[size_t(t * c.rows + r)] *= inv[size_t(t)];
        for (int64_t cc = 0; cc < c.cols; ++cc) an[size_t(t * c.cols + cc)] *= inv[size_t(t)];
      }
      tol_plain = tight_tolerance(we, rp, T);
      tol_norm = tight_tolerance(we, an, T);
    }
    DeviceBuf<float> dx(x);
    for (int mode = 0; mode < 4; ++mode) {
      const bool norm = mode & 1, acc = mode & 2;
      const std::vector<float>& ref = norm ? ref_norm : ref_plain;
      const std::vector<float>& mag = norm ? mag_norm : mag_plain;
      // y starts poisoned (NaN) outside the [T, rows] block, random inside when accumulating
      std::vector<float> base(size_t(T * ldy), std::nanf(""));
      std::vector<float> want(size_t(T * ldy), std::nanf(""));
      for (int t = 0; t < T; ++t)
        for (int64_t r = 0; r < c.rows; ++r) {
          const float b = acc ? float(int64_t(rng() % 2001) - 1000) * 1e-3f : std::nanf("");
          base[size_t(t * ldy + r)] = b;
          want[size_t(t * ldy + r)] = (acc ? b : 0.0f) + ref[size_t(t * c.rows + r)];
        }
      DeviceBuf<float> dy(base);
      QmvArgs a;
      a.w = dm.d;
      a.expert = c.expert;
      a.x = dx.p;
      a.ldx = ldx;
      a.T = T;
      a.norm_w = norm ? dnorm.p : nullptr;
      a.eps = 1e-6f;
      a.y = dy.p;
      a.ldy = ldy;
      a.accumulate = acc;
      qmv(a, nullptr);
      auto got = dy.host();
      for (int t = 0; t < T; ++t)
        for (int64_t r = c.rows; r < ldy; ++r)
          ASSERT_TRUE(std::isnan(got[size_t(t * ldy + r)])) << "qmv wrote past the rows: " << describe(c, T, norm, acc, ldx);
      for (int t = 0; t < T; ++t) {
        const std::vector<float> g2(got.begin() + t * ldy, got.begin() + t * ldy + c.rows);
        const std::vector<float> w2(want.begin() + t * ldy, want.begin() + t * ldy + c.rows);
        const float m = mag[size_t(t)];
        const float tol = tensor_path ? 1e-5f * m : 2e-5f * std::sqrt(float(c.cols)) * m;
        expect_close(g2, w2, tol + 1e-6f, 1e-5f, describe(c, T, norm, acc, ldx) + " token " + std::to_string(t));
        if (tensor_path) {  // tight: against the double twin with the same hi + lo activations
          const std::vector<float>& tight = norm ? tight_norm : tight_plain;
          const std::vector<float>& tt = norm ? tol_norm : tol_plain;
          std::vector<float> w3(size_t(c.rows)), t3(tt.begin() + t * c.rows, tt.begin() + (t + 1) * c.rows);
          for (int64_t r = 0; r < c.rows; ++r) {
            w3[size_t(r)] = (acc ? base[size_t(t * ldy + r)] : 0.0f) + tight[size_t(t * c.rows + r)];
            t3[size_t(r)] += 4e-6f * m;
          }
          expect_close_each(g2, w3, t3, 1e-6f,
                            describe(c, T, norm, acc, ldx) + " token " + std::to_string(t) + " (hi + lo twin)");
        }
      }
    }
  }
}

TEST(CudaQmv, MatchesCpuMatmulEveryFormat) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaQmv"));
  const QmvCase cases[] = {
      // tensor-core path: two tiles per warp (rows >= 4096), rows not a multiple of 16 or 32
      {WeightFormat::affine4, 1, 4099, 2048, 0},
      // one tile per warp, cols 4096 (out_proj / o_proj), 512 (down), tiny row counts
      {WeightFormat::affine4, 1, 2048, 4096, 0},
      {WeightFormat::affine4, 1, 32, 512, 0},
      {WeightFormat::affine4, 1, 1, 2048, 0},
      // stacked experts, expert index > 0
      {WeightFormat::affine4, 4, 512, 2048, 3},
      // generic path: 4-bit with cols not a multiple of 256, and the other formats
      {WeightFormat::affine4, 1, 100, 192, 0},
      {WeightFormat::affine8, 1, 257, 2048, 0},
      {WeightFormat::affine8, 3, 64, 512, 2},
      {WeightFormat::bf16, 1, 4100, 512, 0},
      {WeightFormat::bf16, 2, 33, 2048, 1},
      {WeightFormat::f32, 1, 96, 4096, 0},
      {WeightFormat::f32, 1, 1, 512, 0},
  };
  const int v0 = qmv_variant();
  for (int v : {1, 0, 2}) {  // every step variant of the tensor-core path
    qmv_set_variant(v);
    for (const QmvCase& c : cases) {
      SCOPED_TRACE(std::string(weight_format_name(c.f)) + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols) +
                   " variant " + std::to_string(v));
      run_case(rng, c);
      if (HasFatalFailure()) break;
    }
    if (HasFatalFailure()) break;
  }
  qmv_set_variant(v0);
}

// Variant 2 (cp.async shared-memory pipeline) runs variant 1's steps in the same order: bit-identical outputs, with
// the norm and the accumulate mode, rows that are not a multiple of 16 (zero-filled rows of a tile), a stacked matrix
// read at expert index > 0, and strided x / y.
TEST(CudaQmv, Variant2MatchesVariant1Bitwise) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaQmv.Variant2"));
  const QmvCase cases[] = {
      {WeightFormat::affine4, 1, 12352, 2048, 0}, {WeightFormat::affine4, 1, 2048, 4096, 0},
      {WeightFormat::affine4, 1, 100, 2048, 0},   {WeightFormat::affine4, 1, 1, 2048, 0},
      {WeightFormat::affine4, 4, 520, 2048, 3},   {WeightFormat::affine4, 1, 1000, 256, 0},
  };
  const int v0 = qmv_variant();
  for (const QmvCase& c : cases) {
    auto h = random_matrix(rng, c.f, c.experts, c.rows, c.cols);
    DeviceMatrix dm(*h);
    const auto nw = random_floats(rng, size_t(c.cols), 0.5f, 1.5f);
    DeviceBuf<float> dnw(nw);
    for (int T : {1, 3, 8}) {
      const int64_t ldx = T == 3 ? c.cols + 4 : c.cols, ldy = T == 3 ? c.rows + 5 : c.rows;
      const auto x = random_floats(rng, size_t(T * ldx), -2.0f, 2.0f);
      const auto y0 = random_floats(rng, size_t(T * ldy), -1.0f, 1.0f);
      DeviceBuf<float> dx(x);
      for (int mode = 0; mode < 4; ++mode) {
        std::vector<float> out[2];
        for (int i = 0; i < 2; ++i) {
          qmv_set_variant(i == 0 ? 1 : 2);
          DeviceBuf<float> dy(y0);
          QmvArgs a;
          a.w = dm.d;
          a.expert = c.expert;
          a.x = dx.p;
          a.ldx = ldx;
          a.T = T;
          a.norm_w = (mode & 1) ? dnw.p : nullptr;
          a.y = dy.p;
          a.ldy = ldy;
          a.accumulate = (mode & 2) != 0;
          qmv(a, nullptr);
          out[i] = dy.host();
        }
        size_t diff = 0;
        for (size_t k = 0; k < out[0].size(); ++k)
          if (std::memcmp(&out[0][k], &out[1][k], sizeof(float)) != 0) ++diff;
        EXPECT_EQ(diff, 0u) << c.rows << "x" << c.cols << " expert " << c.expert << " T " << T << " mode " << mode;
      }
    }
  }
  qmv_set_variant(v0);
}

// The two shapes of the hot path at full size (fused GDN in_proj, LM-head-like width), T = 1.
TEST(CudaQmv, ModelShapesMatchCpu) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaQmv.ModelShapes"));
  const int v0 = qmv_variant();
  for (int64_t rows : {int64_t(12352), int64_t(9216)}) {
    qmv_set_variant(rows == 9216 ? 0 : 1);
    const int64_t cols = 2048;
    auto h = random_matrix(rng, WeightFormat::affine4, 1, rows, cols);
    DeviceMatrix dm(*h);
    const auto x = random_floats(rng, size_t(cols), -3.0f, 3.0f), nw = random_floats(rng, size_t(cols), 0.5f, 1.5f);
    std::vector<float> xn(x.size()), ref(static_cast<size_t>(rows));
    cpu::rms_norm(x.data(), nw.data(), 1, cols, 1e-6f, xn.data());
    cpu::matmul(h->m, xn.data(), 1, ref.data());
    DeviceBuf<float> dx(x), dnw(nw), dy(static_cast<size_t>(rows));
    QmvArgs a;
    a.w = dm.d;
    a.x = dx.p;
    a.ldx = cols;
    a.norm_w = dnw.p;
    a.y = dy.p;
    a.ldy = rows;
    qmv(a, nullptr);
    expect_close(dy.host(), ref, 2e-5f * rms_of(ref), 1e-5f, "qmv 4-bit " + std::to_string(rows) + "x2048 norm");
  }
  qmv_set_variant(v0);
}


// The activations the one-token integer path multiplies with (dp4a_tile.cuh): per group of 64 columns m = max|x̂|,
// v = rint(x̂·(Q/m)) in fp32, x' = v·σ with σ = m/Q (Q = 8355711 or 32639); a group with m < 2^-100
// (dp4a::kMinGroupMax) has v = 0 in every column. step[g] = σ of group g.
std::vector<float> quantise_like_dp4a(const std::vector<float>& xh, float qmax, std::vector<float>& step) {
  std::vector<float> xq(xh.size());
  step.assign(xh.size() / 64, 0.0f);
  for (size_t g = 0; g < step.size(); ++g) {
    float m = 0.0f;
    for (int k = 0; k < 64; ++k) m = std::max(m, std::fabs(xh[g * 64 + size_t(k)]));
    const float inv = m >= 0x1p-100f ? qmax / m : 0.0f, sig = m / qmax;
    step[g] = sig;
    for (int k = 0; k < 64; ++k) {
      const float q = std::nearbyint(xh[g * 64 + size_t(k)] * inv);
      xq[g * 64 + size_t(k)] = float(double(q) * double(sig));
    }
  }
  return xq;
}

// What the integer path should give for one token x in `mode` (bit 0: the norm, bit 1: accumulate onto y0 [rows]):
// the twin with the quantised activations and the unquantised product, each with its per-row tolerance (see
// OneTokenIntegerPathMatchesTwin for the bounds).
struct Dp4aWant {
  std::vector<float> twin, tol_twin, exact, tol_exact;
};
Dp4aWant dp4a_want(const QmvCase& c, const HostMatrix& h, const std::vector<float>& nw, const std::vector<float>& x,
                   bool wide, int mode, const std::vector<float>& y0) {
  const bool norm = mode & 1, acc = mode & 2;
  const float qmax = wide ? 8355711.0f : 32639.0f;
  const Matrix we = c.experts > 1 ? h.m.expert(c.expert) : h.m;
  // x̂ as the kernel forms it, the factor, the quantised activations.
  std::vector<float> xh(x);
  double ssd = 0;
  for (int64_t k = 0; k < c.cols; ++k) {
    ssd += double(x[size_t(k)]) * x[size_t(k)];
    if (norm) xh[size_t(k)] = x[size_t(k)] * nw[size_t(k)];
  }
  const double rinv = norm ? 1.0 / std::sqrt(ssd / double(c.cols) + 1e-6) : 1.0;
  std::vector<float> step;
  const std::vector<float> xq = quantise_like_dp4a(xh, qmax, step);
  const std::vector<float> twin = matmul_double(we, xq, 1), exact = matmul_double(we, xh, 1);
  const std::vector<float> mag = row_magnitudes(we, xh, 1);
  std::vector<float> qtol(static_cast<size_t>(c.rows)), row(static_cast<size_t>(c.cols));
  for (int64_t r = 0; r < c.rows; ++r) {
    matrix_row_to_f32(we, r, row.data());
    double e2 = 0;
    for (int64_t k = 0; k < c.cols; ++k) {
      const double d = double(row[size_t(k)]) * step[size_t(k / 64)] / 2.0;
      e2 += d * d / 3.0;
    }
    qtol[size_t(r)] = float(6.0 * std::sqrt(e2) * rinv);
  }
  Dp4aWant want;
  want.twin.resize(size_t(c.rows));
  want.exact.resize(size_t(c.rows));
  want.tol_twin.resize(size_t(c.rows));
  want.tol_exact.resize(size_t(c.rows));
  const float m = float(mag[0] * rinv);
  for (int64_t r = 0; r < c.rows; ++r) {
    const float base = acc ? y0[size_t(r)] : 0.0f;
    want.twin[size_t(r)] = base + float(double(twin[size_t(r)]) * rinv);
    want.exact[size_t(r)] = base + float(double(exact[size_t(r)]) * rinv);
    want.tol_twin[size_t(r)] = 2e-6f * m + 1e-6f;
    want.tol_exact[size_t(r)] = qtol[size_t(r)] + 1e-5f * m + 1e-6f;
  }
  return want;
}

void expect_dp4a(const std::vector<float>& got, const Dp4aWant& want, const std::string& what) {
  expect_close_each(got, want.twin, want.tol_twin, 1e-6f, what + " (quantised twin)");
  expect_close_each(got, want.exact, want.tol_exact, 1e-6f, what + " (unquantised)");
}

// One token x through qmv on the integer path (variant 3, set by the caller) in every mode (bit 0: the norm, bit 1:
// accumulate), each held to dp4a_want. Returns each mode's output and the y it accumulated onto.
struct Dp4aOutputs {
  std::vector<float> y0[4], got[4];
};
Dp4aOutputs check_dp4a_token(std::mt19937_64& rng, const QmvCase& c, const HostMatrix& h, const DeviceMatrix& dm,
                             const std::vector<float>& nw, const std::vector<float>& x, bool wide,
                             const std::string& label) {
  Dp4aOutputs out;
  DeviceBuf<float> dx(x), dnw(nw);
  for (int mode = 0; mode < 4; ++mode) {
    const bool norm = mode & 1, acc = mode & 2;
    QmvArgs a;
    a.w = dm.d;
    a.expert = c.expert;
    a.x = dx.p;
    a.ldx = c.cols;
    a.norm_w = norm ? dnw.p : nullptr;
    a.y = nullptr;
    a.ldy = c.rows;
    a.accumulate = acc;
    const auto y0 = random_floats(rng, size_t(c.rows), -1.0f, 1.0f);
    DeviceBuf<float> dy(y0);
    a.y = dy.p;
    EXPECT_TRUE(qmv_dp4a_supported(a)) << c.rows << "x" << c.cols;
    if (!qmv_dp4a_supported(a)) return out;
    qmv(a, nullptr);
    const auto got = dy.host();
    {  // the same product asking L2 for other ranges (the decode plan's prefetch): the same bits
      DeviceBuf<float> dy2(y0);
      QmvArgs b = a;
      b.y = dy2.p;
      b.l2_ahead.add(static_cast<const char*>(dm.d.data) + 5, int64_t(c.rows) * dm.d.row_words * 4 - 5);
      b.l2_ahead.add(dx.p, c.cols * 4);
      qmv(b, nullptr);
      const auto got2 = dy2.host();
      EXPECT_EQ(got2.size(), got.size());
      if (got2.size() == got.size()) {
        EXPECT_EQ(std::memcmp(got2.data(), got.data(), got.size() * 4), 0) << "L2 prefetch changed the product";
      }
    }
    const std::string what = std::string(wide ? "dp4a 24-bit " : "dp4a 16-bit ") + label + std::to_string(c.rows) +
                             "x" + std::to_string(c.cols) + " expert " + std::to_string(c.expert) + " mode " +
                             std::to_string(mode);
    expect_dp4a(got, dp4a_want(c, h, nw, x, wide, mode, y0), what);
    out.y0[mode] = y0;
    out.got[mode] = got;
  }
  return out;
}

// The one-token integer path (qmv_dp4a.cuh, variant 3), with 24-bit and 16-bit activations, against a double twin
// that quantises the activations exactly as the kernel does (quantise_like_dp4a), so only the
// kernel's fp32 sums differ (tolerance 2e-6 of the row magnitude; a wrong nibble, group or scale is ~1e-2 of it), and
// against the fp32 CPU matmul on the unquantised activations (its quantisation error, ≤ m/2Q per element, bounded
// per row by 6·sqrt(Σ_c W²·(m_g/65278)²/3), plus 1e-5 of the magnitude). Shapes of the model (the fused GDN
// in_proj, o_proj with 4096 columns, a LM-head-like slice), an odd row count, an expert > 0, every mode.
TEST(CudaQmv, OneTokenIntegerPathMatchesTwin) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaQmv.Dp4a"));
  const QmvCase cases[] = {
      {WeightFormat::affine4, 1, 12352, 2048, 0}, {WeightFormat::affine4, 1, 2048, 4096, 0},
      {WeightFormat::affine4, 1, 1001, 1024, 0},  {WeightFormat::affine4, 3, 517, 2048, 2},
  };
  const int v0 = qmv_variant();
  const bool wide0 = qmv_dp4a_wide();
  qmv_set_variant(3);
  for (const bool wide : {true, false})
  for (const QmvCase& c : cases) {
    qmv_dp4a_set_wide(wide);
    auto h = random_matrix(rng, c.f, c.experts, c.rows, c.cols);
    DeviceMatrix dm(*h);
    const auto nw = random_floats(rng, size_t(c.cols), 0.5f, 1.5f);
    auto x = random_floats(rng, size_t(c.cols), -2.0f, 2.0f);
    x[size_t(rng() % uint64_t(c.cols))] = 300.0f;  // an outlier: its group's step grows, the others' do not
    check_dp4a_token(rng, c, *h, dm, nw, x, wide, "");
  }
  qmv_set_variant(v0);
  qmv_dp4a_set_wide(wide0);
}

// Groups whose largest |x̂| is below 2^-100 (dp4a::kMinGroupMax) quantise to zeros with a finite σ, for both
// activation widths: all zeros, denormals, ±1e-35 (where Q/m overflows fp32 and v·(Q/m) would be ±inf), values just
// under the bound, next to normal groups and to a group of ~1e-20 (small, above the bound: quantised as usual). With
// the norm, the norm weights carry x̂ no higher than 1.5·max|x|. Held to the twins as above (which quantise such
// groups to zeros too), every output finite; and a token made of such groups only adds exactly 0 in every mode (y
// unchanged when accumulating).
TEST(CudaQmv, OneTokenIntegerPathQuantisesTinyGroupsToZeros) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaQmv.Dp4aTinyGroups"));
  const QmvCase c{WeightFormat::affine4, 1, 1001, 2048, 0};
  const int64_t groups = c.cols / 64;
  // Group g of x as one of five kinds: 0 all zeros; 1 denormals (±(k+1)·2^-140, below 2^-126); 2 ±1e-35·u with a
  // zero; 3 ±1e-35·u with one value at 2^-101 (the largest, still under the bound); 4 ±1e-20·u (above the bound).
  auto fill_group = [&](std::vector<float>& x, int64_t g, int kind) {
    std::uniform_real_distribution<float> u(0.5f, 1.0f);
    for (int k = 0; k < 64; ++k) {
      const float sign = k % 2 ? -1.0f : 1.0f;
      float v = 0.0f;
      if (kind == 1) v = sign * std::ldexp(float(k + 1), -140);
      if (kind == 2) v = k == 5 ? 0.0f : sign * 1e-35f * u(rng);
      if (kind == 3) v = k == 9 ? -0x1p-101f : sign * 1e-35f * u(rng);
      if (kind == 4) v = sign * 1e-20f * u(rng);
      x[size_t(g * 64 + k)] = v;
    }
  };
  const int v0 = qmv_variant();
  const bool wide0 = qmv_dp4a_wide();
  qmv_set_variant(3);
  auto h = random_matrix(rng, c.f, c.experts, c.rows, c.cols);
  DeviceMatrix dm(*h);
  const auto nw = random_floats(rng, size_t(c.cols), 0.5f, 1.5f);
  for (const bool wide : {true, false}) {
    qmv_dp4a_set_wide(wide);
    {  // tiny groups among normal ones
      auto x = random_floats(rng, size_t(c.cols), -2.0f, 2.0f);
      const int64_t at[] = {1, 4, 9, 10, 17, groups - 1};
      const int kinds[] = {0, 1, 2, 3, 4, 1};
      for (int i = 0; i < 6; ++i) fill_group(x, at[i], kinds[i]);
      const Dp4aOutputs o = check_dp4a_token(rng, c, *h, dm, nw, x, wide, "tiny groups among normal ones ");
      for (int mode = 0; mode < 4; ++mode) {
        size_t bad = 0;
        for (float y : o.got[mode]) bad += std::isfinite(y) ? 0 : 1;
        EXPECT_EQ(bad, 0u) << "mode " << mode << ": non-finite outputs";
      }
    }
    {  // only tiny groups (kinds 0-3): every v is 0, the product is exactly 0
      std::vector<float> x(size_t(c.cols));
      for (int64_t g = 0; g < groups; ++g) fill_group(x, g, int(g % 4));
      const Dp4aOutputs o = check_dp4a_token(rng, c, *h, dm, nw, x, wide, "only tiny groups ");
      for (int mode = 0; mode < 4; ++mode) {
        ASSERT_EQ(o.got[mode].size(), size_t(c.rows)) << "mode " << mode;
        size_t bad = 0, first = 0;
        for (size_t r = 0; r < size_t(c.rows); ++r) {
          const float want = (mode & 2) ? o.y0[mode][r] : 0.0f;
          if (!(o.got[mode][r] == want) && bad++ == 0) first = r;
        }
        EXPECT_EQ(bad, 0u) << (wide ? "24-bit" : "16-bit") << " mode " << mode << ": " << bad
                           << " rows not exactly " << ((mode & 2) ? "y" : "0") << "; first at " << first << ": got "
                           << o.got[mode][first];
      }
    }
  }
  qmv_set_variant(v0);
  qmv_dp4a_set_wide(wide0);
}

// x [B, ldx] for the batched tests: token t uniform in [-2, 2], except token 1 (×1000: another magnitude), token 2
// (×1e-3) and, for B ≥ 4, the last token (all zeros); the gaps past each row's cols NaN (they must not be read).
std::vector<float> batch_inputs(std::mt19937_64& rng, int B, int64_t cols, int64_t ldx) {
  std::vector<float> x = random_floats(rng, size_t(B * ldx), -2.0f, 2.0f);
  for (int t = 0; t < B; ++t) {
    const float f = t == 1 ? 1000.0f : t == 2 ? 1e-3f : (B >= 4 && t == B - 1) ? 0.0f : 1.0f;
    for (int64_t k = 0; k < ldx; ++k) x[size_t(t * ldx + k)] = k < cols ? x[size_t(t * ldx + k)] * f : std::nanf("");
  }
  return x;
}

// The batched tests' product over expert c.expert of dm: x [B, ldx] rows, y rows ldy apart (y itself the caller's),
// mode bit 0 the norm (norm_w), bit 1 accumulate.
QmvArgs batched_args(const DeviceMatrix& dm, const QmvCase& c, const float* x, int64_t ldx, int64_t ldy, int mode,
                     const float* norm_w) {
  QmvArgs a;
  a.w = dm.d;
  a.expert = c.expert;
  a.x = x;
  a.ldx = ldx;
  a.norm_w = (mode & 1) ? norm_w : nullptr;
  a.ldy = ldy;
  a.accumulate = (mode & 2) != 0;
  return a;
}

// y [B, ldy] for the batched tests: random in [-1, 1] inside the rows when accumulating, NaN elsewhere (unwritten rows
// and writes past the rows show).
std::vector<float> batch_outputs(std::mt19937_64& rng, int B, int64_t rows, int64_t ldy, bool accumulate) {
  std::vector<float> y(size_t(B * ldy), std::nanf(""));
  if (accumulate)
    for (int t = 0; t < B; ++t) {
      const auto r = random_floats(rng, size_t(rows), -1.0f, 1.0f);
      std::copy(r.begin(), r.end(), y.begin() + t * ldy);
    }
  return y;
}

// qmv_dp4a_batched (one token of each of B sequences in one launch) against qmv_dp4a per token: every output row bit
// for bit, at the model's shapes (the fused GDN in_proj 12352 x 2048, o_proj 2048 x 4096, a 16384-row slice of the
// LM head, 1024 columns with an odd row count, a stacked matrix at expert 2), B in {1, 2, 5, 8, 9, 16, 32}, every mode
// (bit 0: the norm, bit 1: accumulate), the tensor-core form (qmv_dp4a_mma) with its activations quantised in every
// block (no scratch), once per product into scratch (QmvArgs::xq), and with scratch given but TERN_QMV_PREQUANT's
// switch off (the scratch must stay untouched), and on the first shape also the dp4a form with both activation
// widths; tokens of very different magnitudes and an all-zero one (batch_inputs). B = 5 and 9 read x and write y
// through strides past the rows (x's gaps NaN: never read; y's gaps NaN: never written). The scratch starts as 0xff
// bytes (NaN, -1) and has 256 bytes past what qmv_dp4a_mma_scratch_bytes asks for: the pre-quantising kernel must
// write each token tile's tables and nothing past them. The batched call also asks L2 for ranges (l2_ahead), which
// must change nothing.
TEST(CudaQmv, BatchedIntegerPathMatchesOneTokenBitwise) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaQmv.Dp4aBatched"));
  const QmvCase cases[] = {
      {WeightFormat::affine4, 1, 12352, 2048, 0}, {WeightFormat::affine4, 1, 2048, 4096, 0},
      {WeightFormat::affine4, 1, 16384, 2048, 0}, {WeightFormat::affine4, 1, 1001, 1024, 0},
      {WeightFormat::affine4, 3, 517, 2048, 2},
  };
  const bool wide0 = qmv_dp4a_wide(), mma0 = qmv_dp4a_batched_mma(), prequant0 = qmv_dp4a_prequant();
  constexpr size_t kScratchSlack = 256;
  for (const QmvCase& c : cases) {
    auto h = random_matrix(rng, c.f, c.experts, c.rows, c.cols);
    DeviceMatrix dm(*h);
    const auto nw = random_floats(rng, size_t(c.cols), 0.5f, 1.5f);
    DeviceBuf<float> dnw(nw);
    // kernel 0: 24-bit activations on the tensor cores (qmv_dp4a_mma), quantised per block, 1: 24-bit on dp4a,
    // 2: 16-bit on dp4a, 3: kernel 0 quantised once into scratch, 4: kernel 0 given scratch with the switch off
    for (const int kernel : {0, 3, 4, 1, 2}) {
      const bool mma = kernel == 0 || kernel >= 3, wide = kernel != 2, scratch = kernel >= 3;
      if (!mma && &c != &cases[0]) continue;
      qmv_dp4a_set_wide(wide);
      qmv_dp4a_set_batched_mma(mma);
      qmv_dp4a_set_prequant(kernel != 4);
      for (int B : {1, 2, 5, 8, 9, 16, 32}) {
        const bool strided = B == 5 || B == 9;
        const int64_t ldx = strided ? c.cols + 4 : c.cols, ldy = strided ? c.rows + 3 : c.rows;
        DeviceBuf<float> dx(batch_inputs(rng, B, c.cols, ldx));
        for (int mode = 0; mode < 4; ++mode) {
          const bool acc = mode & 2;
          const std::vector<float> y0 = batch_outputs(rng, B, c.rows, ldy, acc);
          DeviceBuf<float> dy_batched(y0), dy_alone(y0);
          QmvArgs a = batched_args(dm, c, dx.p, ldx, ldy, mode, dnw.p);
          for (int t = 0; t < B; ++t) {
            QmvArgs one = a;
            one.x = dx.p + t * ldx;
            one.y = dy_alone.p + t * ldy;
            ASSERT_TRUE(qmv_dp4a_supported(one));
            qmv_dp4a(one, nullptr);
          }
          QmvArgs batched = a;
          batched.y = dy_batched.p;
          batched.l2_ahead.add(dm.d.data, c.experts * c.rows * dm.d.row_words * 4);
          batched.l2_ahead.add(dx.p, B * ldx * 4);
          const size_t xq_need = qmv_dp4a_mma_scratch_bytes(B, c.cols);
          DeviceBuf<uint8_t> xq(xq_need + kScratchSlack);  // 0xff bytes
          if (scratch) {
            batched.xq = xq.p;
            batched.xq_bytes = xq_need;
          }
          qmv_dp4a_batched(batched, B, nullptr);
          TERN_CUDA(cudaGetLastError());
          const auto got = dy_batched.host(), want = dy_alone.host();
          const bool on_mma = mma && B >= 2 && qmv_dp4a_mma_fits(c.cols);
          if (on_mma) {
            EXPECT_TRUE(qmv_dp4a_mma_supported(batched, B)) << c.rows << "x" << c.cols;
          }
          const std::string what = std::string(kernel == 0   ? "24-bit mma "
                                               : kernel == 3 ? "24-bit mma, scratch "
                                               : kernel == 4 ? "24-bit mma, scratch switched off "
                                               : wide        ? "24-bit "
                                                             : "16-bit ") +
                                   std::to_string(c.rows) + "x" +
                                   std::to_string(c.cols) + " expert " + std::to_string(c.expert) + " B=" +
                                   std::to_string(B) + " mode " + std::to_string(mode);
          if (scratch) {
            // Kernel 3 on the tensor cores: every token tile's tables written (not all 0xff), nothing past them;
            // otherwise (B = 1, the switch off, or the shape not on the tensor cores) the scratch untouched.
            const std::vector<uint8_t> xh = xq.host();
            const size_t tiles = size_t(B + 7) / 8, per_tile = xq_need / tiles;
            ASSERT_EQ(per_tile * tiles, xq_need) << what;
            for (size_t tile = 0; tile < tiles; ++tile) {
              const bool untouched = std::all_of(xh.begin() + tile * per_tile, xh.begin() + (tile + 1) * per_tile,
                                                 [](uint8_t v) { return v == 0xff; });
              EXPECT_EQ(untouched, !(kernel == 3 && on_mma)) << what << ": scratch of token tile " << tile;
            }
            EXPECT_TRUE(std::all_of(xh.begin() + xq_need, xh.end(), [](uint8_t v) { return v == 0xff; }))
                << what << ": writes past the scratch's " << xq_need << " bytes";
          }
          for (int t = 0; t < B; ++t) {
            size_t diff = 0, first = 0, unwritten = 0, gap_writes = 0;
            for (int64_t r = 0; r < ldy; ++r) {
              const size_t i = size_t(t * ldy + r);
              if (r >= c.rows) {
                gap_writes += std::isnan(got[i]) ? 0 : 1;
                continue;
              }
              unwritten += std::isfinite(want[i]) ? 0 : 1;  // one token alone writes every row, finite
              if (std::memcmp(&got[i], &want[i], 4) != 0 && diff++ == 0) first = size_t(r);
            }
            EXPECT_EQ(unwritten, 0u) << what << " token " << t << ": rows not finite when run alone";
            EXPECT_EQ(gap_writes, 0u) << what << " token " << t << ": writes past the rows";
            EXPECT_EQ(diff, 0u) << what << " token " << t << ": " << diff << " rows differ from the token alone; first "
                                << first << ": " << got[size_t(t * ldy) + first] << " vs "
                                << want[size_t(t * ldy) + first];
          }
          if (HasFailure()) break;
        }
        if (HasFailure()) break;
      }
    }
  }
  qmv_dp4a_set_wide(wide0);
  qmv_dp4a_set_batched_mma(mma0);
  qmv_dp4a_set_prequant(prequant0);
}

// The tensor-core form's split (qmv_dp4a_mma_set_split, on by default, TERN_QMV_MMA_SPLIT=0 off: each 16-row tile of a
// 4096-column product by a cluster of 2 blocks, 16 positions of every slice each) against the same product with the
// split off and against qmv_dp4a per token, bit for bit: o_proj's 2048 x 4096 and 517 rows (a partial last row tile)
// of a stacked matrix at expert 2, B in {2, 3, 8, 9, 16, 32} (3 and 9 through strides past the rows; 3 and 9 leave a
// token tile part empty), every mode (bit 0: the norm, bit 1: accumulate), activations quantised into scratch. The
// split form must run (one launch per product, qmv_dp4a_mma_split_launches) wherever the tensor-core form takes the
// product, and never without scratch or with the switch off; a device that cannot run it skips the test.
TEST(CudaQmv, BatchedTensorCoreSplitMatchesBitwise) {
  TERN_REQUIRE_GPU();
  if (!qmv_dp4a_mma_split_available()) GTEST_SKIP() << "the split form needs an sm_90 binary and room for its clusters";
  std::mt19937_64 rng(fresh_seed("CudaQmv.Dp4aBatchedSplit"));
  const QmvCase cases[] = {
      {WeightFormat::affine4, 1, 2048, 4096, 0},
      {WeightFormat::affine4, 3, 517, 4096, 2},
  };
  const bool mma0 = qmv_dp4a_batched_mma(), prequant0 = qmv_dp4a_prequant(), split0 = qmv_dp4a_mma_split();
  const bool wide0 = qmv_dp4a_wide();
  qmv_dp4a_set_batched_mma(true);
  qmv_dp4a_set_prequant(true);
  qmv_dp4a_set_wide(true);  // the tensor-core form takes 24-bit activations only
  const uint64_t split_launches0 = qmv_dp4a_mma_split_launches();
  for (const QmvCase& c : cases) {
    auto h = random_matrix(rng, c.f, c.experts, c.rows, c.cols);
    DeviceMatrix dm(*h);
    const auto nw = random_floats(rng, size_t(c.cols), 0.5f, 1.5f);
    DeviceBuf<float> dnw(nw);
    for (int B : {2, 3, 8, 9, 16, 32}) {
      const bool strided = B == 3 || B == 9;
      const int64_t ldx = strided ? c.cols + 4 : c.cols, ldy = strided ? c.rows + 3 : c.rows;
      DeviceBuf<float> dx(batch_inputs(rng, B, c.cols, ldx));
      const size_t xq_need = qmv_dp4a_mma_scratch_bytes(B, c.cols);
      DeviceBuf<uint8_t> xq(xq_need);
      for (int mode = 0; mode < 4; ++mode) {
        const bool acc = mode & 2;
        const std::vector<float> y0 = batch_outputs(rng, B, c.rows, ldy, acc);
        DeviceBuf<float> dy_split(y0), dy_full(y0), dy_alone(y0), dy_noscratch(y0);
        QmvArgs a = batched_args(dm, c, dx.p, ldx, ldy, mode, dnw.p);
        a.xq = xq.p;
        a.xq_bytes = xq_need;
        for (int t = 0; t < B; ++t) {
          QmvArgs one = a;
          one.x = dx.p + t * ldx;
          one.y = dy_alone.p + t * ldy;
          one.xq = nullptr;
          one.xq_bytes = 0;
          ASSERT_TRUE(qmv_dp4a_supported(one));
          qmv_dp4a(one, nullptr);
        }
        const bool on_mma = qmv_dp4a_mma_supported(a, B);
        const bool want_split = on_mma;
        const std::string what = std::to_string(c.rows) + "x" + std::to_string(c.cols) + " expert " +
                                 std::to_string(c.expert) + " B=" + std::to_string(B) + " mode " +
                                 std::to_string(mode);
        QmvArgs full = a;
        full.y = dy_full.p;
        qmv_dp4a_mma_set_split(false);
        uint64_t n0 = qmv_dp4a_mma_split_launches();
        qmv_dp4a_batched(full, B, nullptr);
        TERN_CUDA(cudaGetLastError());
        EXPECT_EQ(qmv_dp4a_mma_split_launches(), n0) << what << ": the split form ran with its switch off";
        qmv_dp4a_mma_set_split(true);
        QmvArgs noscratch = a;
        noscratch.y = dy_noscratch.p;
        noscratch.xq = nullptr;
        noscratch.xq_bytes = 0;
        n0 = qmv_dp4a_mma_split_launches();
        qmv_dp4a_batched(noscratch, B, nullptr);
        TERN_CUDA(cudaGetLastError());
        EXPECT_EQ(qmv_dp4a_mma_split_launches(), n0) << what << ": the split form ran without scratch";
        QmvArgs split = a;
        split.y = dy_split.p;
        n0 = qmv_dp4a_mma_split_launches();
        qmv_dp4a_batched(split, B, nullptr);
        TERN_CUDA(cudaGetLastError());
        EXPECT_EQ(qmv_dp4a_mma_split_launches() - n0, want_split ? 1u : 0u)
            << what << ": sm_90 features " << sm90_features() << ", tensor-core form " << on_mma;
        qmv_dp4a_mma_set_split(split0);
        const auto got = dy_split.host(), ref = dy_full.host(), ref_ns = dy_noscratch.host(), want = dy_alone.host();
        ASSERT_EQ(got.size(), ref.size());
        for (int t = 0; t < B; ++t) {
          size_t diff_full = 0, diff_alone = 0, diff_ns = 0, first = 0, gap_writes = 0;
          for (int64_t r = 0; r < ldy; ++r) {
            const size_t i = size_t(t * ldy + r);
            if (r >= c.rows) {
              gap_writes += std::isnan(got[i]) ? 0 : 1;
              continue;
            }
            if (std::memcmp(&got[i], &ref[i], 4) != 0 && diff_full++ == 0) first = size_t(r);
            diff_ns += std::memcmp(&got[i], &ref_ns[i], 4) != 0 ? 1 : 0;
            diff_alone += std::memcmp(&got[i], &want[i], 4) != 0 ? 1 : 0;
          }
          EXPECT_EQ(gap_writes, 0u) << what << " token " << t << ": writes past the rows";
          EXPECT_EQ(diff_full, 0u) << what << " token " << t << ": " << diff_full
                                   << " rows differ from the split off; first " << first << ": "
                                   << got[size_t(t * ldy) + first] << " vs " << ref[size_t(t * ldy) + first];
          EXPECT_EQ(diff_ns, 0u) << what << " token " << t << ": rows differ from the form without scratch";
          EXPECT_EQ(diff_alone, 0u) << what << " token " << t << ": rows differ from the token alone";
        }
        if (HasFailure()) break;
      }
      if (HasFailure()) break;
    }
  }
  EXPECT_GT(qmv_dp4a_mma_split_launches(), split_launches0) << "the split form never ran";
  qmv_dp4a_set_batched_mma(mma0);
  qmv_dp4a_set_prequant(prequant0);
  qmv_dp4a_set_wide(wide0);
  qmv_dp4a_mma_set_split(split0);
}

// The tensor-core form refuses scratch (QmvArgs::xq) that is too small or not 16-byte aligned (a check that stays on
// in release builds), and takes the exact size qmv_dp4a_mma_scratch_bytes gives: ⌈B/8⌉ tiles, linear in the columns.
TEST(CudaQmv, BatchedTensorCorePathChecksItsScratch) {
  TERN_REQUIRE_GPU();
  EXPECT_EQ(qmv_dp4a_mma_scratch_bytes(8, 1024), qmv_dp4a_mma_scratch_bytes(2, 1024));
  EXPECT_EQ(qmv_dp4a_mma_scratch_bytes(9, 1024), 2 * qmv_dp4a_mma_scratch_bytes(8, 1024));
  EXPECT_EQ(qmv_dp4a_mma_scratch_bytes(32, 2048), 4 * qmv_dp4a_mma_scratch_bytes(8, 2048));
  EXPECT_EQ(qmv_dp4a_mma_scratch_bytes(8, 3072), 0u);
  std::mt19937_64 rng(fresh_seed("CudaQmv.Dp4aBatchedScratch"));
  const QmvCase c{WeightFormat::affine4, 1, 1001, 1024, 0};
  auto h = random_matrix(rng, c.f, c.experts, c.rows, c.cols);
  DeviceMatrix dm(*h);
  const int B = 9;
  DeviceBuf<float> dx(batch_inputs(rng, B, c.cols, c.cols)), dy(size_t(B * c.rows));
  const size_t need = qmv_dp4a_mma_scratch_bytes(B, c.cols);
  DeviceBuf<uint8_t> xq(need + 16);
  QmvArgs a;
  a.w = dm.d;
  a.x = dx.p;
  a.ldx = c.cols;
  a.y = dy.p;
  a.ldy = c.rows;
  if (!qmv_dp4a_mma_supported(a, B)) GTEST_SKIP() << "the tensor-core form does not take 1024 columns here";
  a.xq = xq.p;
  a.xq_bytes = need - 16;
  EXPECT_THROW(qmv_dp4a_mma_batched(a, B, nullptr), Error);
  a.xq = xq.p + 8;
  a.xq_bytes = need;
  EXPECT_THROW(qmv_dp4a_mma_batched(a, B, nullptr), Error);
  a.xq = xq.p + 16;
  EXPECT_NO_THROW(qmv_dp4a_mma_batched(a, B, nullptr));
  TERN_CUDA(cudaDeviceSynchronize());
}

// qmv_dp4a_batched against the CPU twins of OneTokenIntegerPathMatchesTwin (dp4a_want, its tolerances) token by
// token: B = 5 tokens of different magnitudes and an all-zero one, strided x and y, every mode, at the GDN in_proj,
// o_proj and 1024-column shapes, with the default activation width.
TEST(CudaQmv, BatchedIntegerPathMatchesTwin) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaQmv.Dp4aBatchedTwin"));
  const QmvCase cases[] = {
      {WeightFormat::affine4, 1, 12352, 2048, 0},
      {WeightFormat::affine4, 1, 2048, 4096, 0},
      {WeightFormat::affine4, 1, 1001, 1024, 0},
  };
  const bool wide = qmv_dp4a_wide();
  const int B = 5;
  for (const QmvCase& c : cases) {
    auto h = random_matrix(rng, c.f, c.experts, c.rows, c.cols);
    DeviceMatrix dm(*h);
    const auto nw = random_floats(rng, size_t(c.cols), 0.5f, 1.5f);
    DeviceBuf<float> dnw(nw);
    const int64_t ldx = c.cols + 4, ldy = c.rows + 3;
    const std::vector<float> x = batch_inputs(rng, B, c.cols, ldx);
    DeviceBuf<float> dx(x);
    for (int mode = 0; mode < 4; ++mode) {
      const bool acc = mode & 2;
      // dp4a_want's y0 is read only when accumulating; unwritten rows stay NaN and fail
      const std::vector<float> y0 = batch_outputs(rng, B, c.rows, ldy, acc);
      DeviceBuf<float> dy(y0);
      QmvArgs a;
      a.w = dm.d;
      a.expert = c.expert;
      a.x = dx.p;
      a.ldx = ldx;
      a.norm_w = (mode & 1) ? dnw.p : nullptr;
      a.y = dy.p;
      a.ldy = ldy;
      a.accumulate = acc;
      qmv_dp4a_batched(a, B, nullptr);
      const auto got = dy.host();
      for (int t = 0; t < B; ++t) {
        const std::vector<float> xt(x.begin() + t * ldx, x.begin() + t * ldx + c.cols);
        const std::vector<float> y0t(y0.begin() + t * ldy, y0.begin() + t * ldy + c.rows);
        const std::vector<float> gt(got.begin() + t * ldy, got.begin() + t * ldy + c.rows);
        expect_dp4a(gt, dp4a_want(c, *h, nw, xt, wide, mode, y0t),
                    "batched dp4a " + std::to_string(c.rows) + "x" + std::to_string(c.cols) + " mode " +
                        std::to_string(mode) + " token " + std::to_string(t) + " of " + std::to_string(B));
      }
    }
  }
}

}  // namespace
}  // namespace tern::cuda::test
