// The Hopper warpgroup product (qmatmul_wgmma.cuh) against its CPU twin: x as the kernel sees it, σ·fp16(x/σ) with
// the token's power-of-two σ on the host (one term) or split into bf16 hi + lo (two terms, matmul_prepare_x), then the
// fp32 CPU product cpu::matmul(W, x'). The weights' integers and the 16-bit products are exact, so only fp32
// summation differs: the bounds
// of matmul_test.cpp (1e-5 of the token's rms in rms, 6e-5 in the worst element) hold, and a wrong nibble, k slot,
// group, scale or token is ~1e-2 of the rms. Outputs start poisoned (NaN), so unwritten elements fail. Skipped where
// the kernel does not run (not a Hopper GPU).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "core/bf16.h"
#include "cuda/kernels/moe/moe.cuh"
#include "cuda/kernels/qmatmul/qmatmul_wgmma.cuh"
#include "matmul_test_util.h"

namespace tern::cuda::test {
namespace {

#define TERN_REQUIRE_WGMMA()                                                          \
  TERN_REQUIRE_GPU();                                                                 \
  if (!matmul_wgmma_available()) GTEST_SKIP() << "the warpgroup kernel needs a Hopper GPU"

constexpr WgmmaX kXs[] = {WgmmaX::f16, WgmmaX::split, WgmmaX::split_f16};
const char* x_name(WgmmaX x) { return x == WgmmaX::f16 ? "f16" : x == WgmmaX::split ? "split" : "split_f16"; }

// v rounded to fp16 (nearest, ties to even; 11 significant bits, subnormal below 2^-14), for |v| < 65520.
float round_f16(float v) {
  if (v == 0.0f) return v;
  int e = 0;
  std::frexp(v, &e);  // |v| in [2^(e-1), 2^e)
  const float quantum = e >= -13 ? std::ldexp(1.0f, e - 11) : std::ldexp(1.0f, -24);
  return std::nearbyint(v / quantum) * quantum;
}
// The power-of-two scale of a row (matmul_prepare_x_f16): 2^(E − 15) for max|x| < 2^E.
float row_sigma(const float* x, int64_t cols) {
  float m = 0.0f;
  for (int64_t c = 0; c < cols; ++c) m = std::max(m, std::fabs(x[c]));
  int e = 0;
  std::frexp(m, &e);
  return std::ldexp(1.0f, e - 15);
}

// x [rows, cols] as the kernel multiplies it: σ·fp16(x/σ) per row; hi + lo with hi = bf16(x), lo = bf16(x − hi);
// or (split_f16) σ·(hi + lo) with hi = fp16(x/σ), lo = fp16(x/σ − hi).
std::vector<float> as_seen(const std::vector<float>& x, WgmmaX xk, int64_t cols) {
  std::vector<float> r(x.size());
  for (size_t row = 0; row * size_t(cols) < x.size(); ++row) {
    const float* xr = x.data() + row * size_t(cols);
    const float sigma = row_sigma(xr, cols);
    for (int64_t c = 0; c < cols; ++c) {
      const float v = xr[c], hi = round_bf16(v), y = v / sigma, yh = round_f16(y);
      float& out = r[row * size_t(cols) + size_t(c)];
      switch (xk) {
        case WgmmaX::f16: out = yh * sigma; break;
        case WgmmaX::split_f16: out = (yh + round_f16(y - yh)) * sigma; break;  // exact in fp32
        default: out = hi + round_bf16(v - hi); break;
      }
    }
  }
  return r;
}

// x prepared on the device for the kernel (rows of `ld` floats, `cols` used).
struct PreparedInput {
  std::unique_ptr<DeviceBuf<unsigned char>> buf;
  void set(MatmulArgs& a, WgmmaX xk, int64_t cols) const {
    if (xk == WgmmaX::f16) {
      a.x_f16 = buf->p;
      a.x_f16_cols = cols;
    } else {
      a.x_prep = buf->p;
      a.x_prep_cols = cols;
      a.x_prep_f16 = xk == WgmmaX::split_f16;
    }
  }
};
PreparedInput prepared(const float* dx, int64_t ld, int64_t rows, int64_t cols, WgmmaX xk) {
  PreparedInput p;
  const int64_t bytes = xk == WgmmaX::f16         ? matmul_f16_bytes(rows, cols)
                        : xk == WgmmaX::split_f16 ? matmul_f16x2_bytes(rows, cols)
                                                  : matmul_prepared_bytes(rows, cols);
  p.buf = std::make_unique<DeviceBuf<unsigned char>>(size_t(bytes));
  if (xk == WgmmaX::f16) {
    matmul_prepare_x_f16(dx, ld, rows, cols, p.buf->p, nullptr);
  } else if (xk == WgmmaX::split_f16) {
    matmul_prepare_x_f16x2(dx, ld, rows, cols, p.buf->p, nullptr);
  } else {
    matmul_prepare_x(dx, ld, rows, cols, p.buf->p, nullptr);
  }
  return p;
}

void run_product(const MatmulArgs& a, WgmmaX xk, const DMat* up = nullptr) {
  if (up) {
    matmul_wgmma_swiglu(a, *up, nullptr, xk);
  } else {
    matmul_wgmma(a, nullptr, xk);
  }
}

constexpr double kTwinRms = 1e-5, kTwinWorst = 6e-5;
constexpr double kSwigluRms = 1e-4, kSwigluWorst = 1e-3;

// The fp16 forms as the kernel reads them: one term (matmul_prepare_x_f16: fp16(x/σ)) and the pair
// (matmul_prepare_x_f16x2: hi = fp16(x/σ), lo = fp16(x/σ − hi), per group 128 bytes of each), value for value; the
// groups' sums of what the MMAs see; σ, the power of two of the row's max|x|.
TEST(CudaMatmulWgmma, PreparedF16MatchesTheTwin) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMatmulWgmma.Prepare"));
  for (int64_t cols : {int64_t(512), int64_t(2048), int64_t(4096)}) {
    const int64_t T = 37, ld = cols + 8, G = cols / 64;
    auto x = activations(rng, T, ld, true);
    for (int64_t c = 0; c < ld; ++c) x[size_t(ld + c)] = 0.0f;  // an all-zero row
    x[size_t(2 * ld + 5)] = 3e4f;                                // a row with an outlier
    DeviceBuf<float> dx(x);
    for (const bool pair : {false, true}) {
      const int64_t rb = pair ? matmul_f16x2_row_bytes(cols) : matmul_f16_row_bytes(cols);
      const int64_t sums_at = cols * (pair ? 4 : 2);
      DeviceBuf<unsigned char> out(size_t(T * rb));
      if (pair) {
        matmul_prepare_x_f16x2(dx.p, ld, T, cols, out.p, nullptr);
      } else {
        matmul_prepare_x_f16(dx.p, ld, T, cols, out.p, nullptr);
      }
      const auto got = out.host();
      int64_t bad_values = 0, bad_sigma = 0;
      double worst_sum = 0;
      std::vector<double> seen(static_cast<size_t>(cols));  // x/σ as the MMAs see it
      for (int64_t n = 0; n < T; ++n) {
        const unsigned char* row = got.data() + n * rb;
        const float sigma = row_sigma(x.data() + n * ld, cols);
        float got_sigma;
        std::memcpy(&got_sigma, row + sums_at + G * 4, 4);
        if (got_sigma != sigma) ++bad_sigma;
        for (int64_t c = 0; c < cols / 8; ++c) {
          for (int e = 0; e < 8; ++e) {  // element e of chunk c: column 8c + (0,4,1,5,2,6,3,7)[e]
            const int64_t col = 8 * c + (e % 2) * 4 + e / 2;
            const float y = x[size_t(n * ld + col)] / sigma, hi = round_f16(y), lo = round_f16(y - hi);
            const float want[2] = {hi, lo};
            for (int h = 0; h < (pair ? 2 : 1); ++h) {
              uint16_t b;
              std::memcpy(&b, row + (pair ? (c / 8) * 256 + h * 128 + (c % 8) * 16 : c * 16) + e * 2, 2);
              if (f16_to_float(b) != want[h]) ++bad_values;
            }
            seen[size_t(col)] = pair ? double(hi) + double(lo) : double(hi);
          }
        }
        for (int64_t g = 0; g < G; ++g) {
          double want = 0, mag = 0;
          for (int k = 0; k < 64; ++k) {
            want += seen[size_t(g * 64 + k)];
            mag += std::fabs(seen[size_t(g * 64 + k)]);
          }
          float sum;
          std::memcpy(&sum, row + sums_at + g * 4, 4);
          worst_sum = std::max(worst_sum, std::fabs(double(sum) - want) / (mag + 1e-30));
        }
      }
      const std::string form = std::string(pair ? "fp16 hi + lo" : "fp16") + ", cols " + std::to_string(cols);
      EXPECT_EQ(bad_sigma, 0) << form << ": row scales";
      EXPECT_EQ(bad_values, 0) << form << ": values that differ from round-to-nearest-even of x/σ (and of its rest)";
      EXPECT_LE(worst_sum, 1e-6) << form << ": group sums (relative to Σ|x/σ|)";
    }
  }
}

// What fp16 hi + lo is for: the product on x as fp16 hi + lo of x/σ (matmul_prepare_x_f16x2, WgmmaX::split_f16; its
// layout: PreparedF16MatchesTheTwin) against the fp64 product of x itself, on the weights' dequantised values (the CPU
// product of unit vectors). Its 22 bits of x must leave only the kernel's own fp32 summation error: the bf16 hi + lo
// product's error against the fp64 product of hi + lo, measured alongside (Hopper's accumulation is not
// round-to-nearest), instead of that product's 16 bits of x. And against the fp64 product of σ·(hi + lo), the x it
// sees, within the twin's bound.
TEST(CudaMatmulWgmma, PairTakesXToFp32) {
  TERN_REQUIRE_WGMMA();
  std::mt19937_64 rng(fresh_seed("CudaMatmulWgmma.Pair"));
  const int64_t rows = 512, cols = 2048, T = 65, ld = cols + 8;
  auto h = random_matrix(rng, WeightFormat::affine4, 1, rows, cols);
  DeviceMatrix dm(*h);
  auto x = activations(rng, T, ld, true);
  for (int64_t c = 0; c < ld; ++c) x[size_t(ld + c)] = 0.0f;  // an all-zero row
  DeviceBuf<float> dx(x);
  // Per token: bf16 hi + lo, and σ·(fp16 hi + lo of x/σ), each exact in fp32.
  std::vector<float> split_x(size_t(T * cols)), pair_x(size_t(T * cols));
  for (int64_t n = 0; n < T; ++n) {
    const float sigma = row_sigma(x.data() + n * ld, cols);
    for (int64_t c = 0; c < cols; ++c) {
      const float v = x[size_t(n * ld + c)], hi = round_bf16(v);
      split_x[size_t(n * cols + c)] = hi + round_bf16(v - hi);
      const float y = v / sigma, fhi = round_f16(y);
      pair_x[size_t(n * cols + c)] = (fhi + round_f16(y - fhi)) * sigma;
    }
  }
  // y_split = W·(bf16 hi + lo); y_pair = W·σ(fp16 hi + lo).
  const PreparedInput split = prepared(dx.p, ld, T, cols, WgmmaX::split);
  DeviceBuf<float> dy(std::vector<float>(size_t(T * rows), NAN)), d2(std::vector<float>(size_t(T * rows), NAN));
  MatmulArgs a = dense_args(dm.d, dx.p, dy.p, T);
  a.ldx = ld;
  split.set(a, WgmmaX::split, cols);
  run_product(a, WgmmaX::split);
  const auto y_split = dy.host();
  DeviceBuf<unsigned char> xp2(size_t(matmul_f16x2_bytes(T, cols)));
  matmul_prepare_x_f16x2(dx.p, ld, T, cols, xp2.p, nullptr);
  MatmulArgs a2 = dense_args(dm.d, dx.p, d2.p, T);
  a2.ldx = ld;
  a2.x_prep = xp2.p;
  a2.x_prep_cols = cols;
  a2.x_prep_f16 = true;
  matmul_wgmma(a2, nullptr, WgmmaX::split_f16);
  const auto y_pair = d2.host();
  // W [rows, cols] dequantised, as wt [cols, rows]: W·e_c for every column c (one nonzero term: exact).
  std::vector<float> eye(size_t(cols * cols), 0.0f);
  for (int64_t c = 0; c < cols; ++c) eye[size_t(c * cols + c)] = 1.0f;
  const auto wt = cpu_product(h->m, eye, cols);
  // fp64 W·v for v [T, cols] with row stride ldv, as [T, rows].
  const auto fp64_product = [&](const float* v, int64_t ldv) {
    std::vector<double> y(size_t(T * rows), 0.0);
    for (int64_t n = 0; n < T; ++n)
      for (int64_t c = 0; c < cols; ++c) {
        const double vc = v[n * ldv + c];
        for (int64_t q = 0; q < rows; ++q) y[size_t(n * rows + q)] += double(wt[size_t(c * rows + q)]) * vc;
      }
    return y;
  };
  const auto want_x = fp64_product(x.data(), ld), want_split = fp64_product(split_x.data(), cols);
  const auto want_pair = fp64_product(pair_x.data(), cols);
  // Per token: rms(got − want) / rms(scale); the worst token.
  using Doubles = std::vector<double>;
  const auto worst = [&](const std::vector<float>& g, const Doubles& want, const Doubles& scale) {
    double w = 0;
    for (int64_t n = 0; n < T; ++n) {
      double pp = 0, ee = 0;
      for (int64_t q = 0; q < rows; ++q) {
        const size_t i = size_t(n * rows + q);
        pp += scale[i] * scale[i];
        ee += (g[i] - want[i]) * (g[i] - want[i]);
      }
      if (pp == 0) {  // the zero row: exactly zero
        EXPECT_EQ(ee, 0.0) << "token " << n;
        continue;
      }
      w = std::max(w, std::isnan(ee) ? 1e30 : std::sqrt(ee / pp));
    }
    return w;
  };
  const double floor = worst(y_split, want_split, want_x), split_err = worst(y_split, want_x, want_x);
  const double pair_err = worst(y_pair, want_x, want_x), pair_twin = worst(y_pair, want_pair, want_pair);
  std::printf("[fp16 hi + lo] worst token's rms error / rms of W·x: bf16 hi + lo %.3g (its own summation %.3g), "
              "fp16 hi + lo %.3g (against its own x %.3g)\n", split_err, floor, pair_err, pair_twin);
  EXPECT_LE(pair_twin, kTwinRms) << "fp16 hi + lo against the fp64 product of σ·(hi + lo)";
  EXPECT_LE(pair_err, 1.25 * floor + 1e-7) << "fp16 hi + lo against the fp64 product of x: more than the kernel's "
                                              "own summation error";
  EXPECT_LE(pair_err, 2e-6) << "fp16 hi + lo against the fp64 product of x";
  EXPECT_LT(pair_err, split_err) << "fp16 hi + lo no closer to W·x than bf16 hi + lo";
}

struct DenseCase {
  int64_t rows, cols;
  const char* name;
};

TEST(CudaMatmulWgmma, DenseMatchesTwinAtModelShapes) {
  TERN_REQUIRE_WGMMA();
  std::mt19937_64 rng(fresh_seed("CudaMatmulWgmma.Dense"));
  const DenseCase cases[] = {{12352, 2048, "GDN in_proj qkv+z+b+a"},
                             {2048, 4096, "out_proj / o_proj"},
                             {2048, 512, "shared expert down"},
                             {200, 512, "200 rows (partial row tiles)"},
                             {32, 2048, "in_proj b (32 rows)"}};
  {  // 256 columns (the demo model's width): not taken (the scales are copied in pieces of 8 groups)
    auto h = random_matrix(rng, WeightFormat::affine4, 1, 64, 256);
    DeviceMatrix dm(*h);
    EXPECT_FALSE(matmul_wgmma_takes(dm.d));
  }
  for (const DenseCase& c : cases) {
    auto h = random_matrix(rng, WeightFormat::affine4, 1, c.rows, c.cols);
    DeviceMatrix dm(*h);
    ASSERT_TRUE(matmul_wgmma_takes(dm.d)) << c.name;
    for (int64_t T : {int64_t(2), int64_t(63), int64_t(64), int64_t(65), int64_t(300)}) {
      const auto x = activations(rng, T, c.cols, T % 2 == 1);
      DeviceBuf<float> dx(x);
      for (WgmmaX xk : kXs) {
        const auto twin = cpu_product(h->m, as_seen(x, xk, c.cols), T);
        const PreparedInput px = prepared(dx.p, c.cols, T, c.cols, xk);
        DeviceBuf<float> dy(std::vector<float>(size_t(T * c.rows), NAN));
        MatmulArgs a = dense_args(dm.d, dx.p, dy.p, T);
        px.set(a, xk, c.cols);
        run_product(a, xk);
        const auto got = dy.host();
        const std::string what = std::string(c.name) + " T=" + std::to_string(T) + " " + x_name(xk);
        expect_product(got, twin, twin, c.rows, what + " vs twin", kTwinRms, kTwinWorst);
        if (xk != WgmmaX::split) {  // matmul() with x_f16 set (or wgmma and x_prep_f16) runs this kernel
          DeviceBuf<float> dy2(std::vector<float>(size_t(T * c.rows), NAN));
          a.y = dy2.p;
          matmul(a, nullptr, xk == WgmmaX::f16 ? MatmulTile::automatic : MatmulTile::wgmma);
          expect_close(dy2.host(), got, 0.0f, 0.0f, what + " through matmul()");
        }
        if (xk == WgmmaX::split_f16) {  // the mma.sync kernel reads bf16 hi + lo only: it refuses the fp16 pair
          EXPECT_THROW(matmul(a, nullptr, MatmulTile::tc128x64), Error) << what;
        }
      }
    }
  }
}

// x rows gathered from a wider buffer (row stride > cols, offset start), y a slice of a wider buffer, accumulate.
TEST(CudaMatmulWgmma, StridedGatheredAccumulating) {
  TERN_REQUIRE_WGMMA();
  std::mt19937_64 rng(fresh_seed("CudaMatmulWgmma.Strided"));
  const int64_t rows = 2048, cols = 4096, T = 300, Tx = 517, ldx = cols + 96, x_off = 12, ldy = rows + 40;
  auto h = random_matrix(rng, WeightFormat::affine4, 1, rows, cols);
  DeviceMatrix dm(*h);
  const auto xbuf = activations(rng, Tx, ldx, true);
  std::vector<int> gather(static_cast<size_t>(T));
  for (auto& gi : gather) gi = int(rng() % uint64_t(Tx));  // repeats allowed
  std::vector<float> xall(size_t(Tx * cols));
  for (int64_t n = 0; n < Tx; ++n) std::copy_n(xbuf.begin() + n * ldx + x_off, cols, xall.begin() + n * cols);
  const auto base = random_floats(rng, size_t(T * ldy));
  DeviceBuf<float> dx(xbuf);
  DeviceBuf<int> dg(gather);
  for (WgmmaX xk : kXs) {
    const auto seen = as_seen(xall, xk, cols);
    std::vector<float> xg(size_t(T * cols));
    for (int64_t n = 0; n < T; ++n) std::copy_n(seen.begin() + gather[size_t(n)] * cols, cols, xg.begin() + n * cols);
    const auto ref = cpu_product(h->m, xg, T);
    const PreparedInput px = prepared(dx.p + x_off, ldx, Tx, cols, xk);
    DeviceBuf<float> dy(base);
    MatmulArgs a;
    a.w = dm.d;
    a.x = dx.p + x_off;
    a.ldx = ldx;
    px.set(a, xk, cols);
    a.y = dy.p;
    a.ldy = ldy;
    a.tokens = T;
    a.gather = dg.p;
    a.accumulate = true;
    run_product(a, xk);
    std::vector<float> got_prod, want;
    ASSERT_NO_FATAL_FAILURE(unstride_accumulated(dy.host(), base, ref, T, rows, ldy, got_prod, want));
    expect_product(got_prod, want, ref, rows, std::string("strided gathered accumulate ") + x_name(xk), kTwinRms,
                   kTwinWorst);
  }
}

// silu(x·Gᵀ) ⊙ (x·Uᵀ) in one pass (the shared expert's gate and up), with partial row tiles and accumulate.
TEST(CudaMatmulWgmma, SwigluMatchesTwin) {
  TERN_REQUIRE_WGMMA();
  std::mt19937_64 rng(fresh_seed("CudaMatmulWgmma.Swiglu"));
  const DenseCase cases[] = {{512, 2048, "shared expert gate+up"}, {200, 512, "200 rows (partial row tiles)"}};
  for (const DenseCase& c : cases) {
    auto hg = random_matrix(rng, WeightFormat::affine4, 1, c.rows, c.cols);
    auto hu = random_matrix(rng, WeightFormat::affine4, 1, c.rows, c.cols);
    DeviceMatrix dg(*hg), du(*hu);
    for (int64_t T : {int64_t(2), int64_t(65), int64_t(300)}) {
      const auto x = activations(rng, T, c.cols, T % 2 == 1);
      DeviceBuf<float> dx(x);
      const bool accumulate = T == 65;
      const auto base = random_floats(rng, size_t(T * c.rows));
      for (WgmmaX xk : kXs) {
        const auto seen = as_seen(x, xk, c.cols);
        const auto ref = swiglu_of(cpu_product(hg->m, seen, T), cpu_product(hu->m, seen, T));
        std::vector<float> want(ref);
        if (accumulate)
          for (size_t i = 0; i < want.size(); ++i) want[i] += base[i];
        const PreparedInput px = prepared(dx.p, c.cols, T, c.cols, xk);
        DeviceBuf<float> dy(accumulate ? base : std::vector<float>(size_t(T * c.rows), NAN));
        MatmulArgs a = dense_args(dg.d, dx.p, dy.p, T);
        px.set(a, xk, c.cols);
        a.accumulate = accumulate;
        run_product(a, xk, &du.d);
        expect_product(dy.host(), want, ref, c.rows,
                       std::string(c.name) + " swiglu T=" + std::to_string(T) + " " + x_name(xk), kSwigluRms,
                       kSwigluWorst);
      }
    }
  }
}

// A grouped product's arguments over the tile map g of tiles of at most `tile` tokens: w, x (its rows gathered by
// token through g when gather, else by sorted position, ldx) prepared as px, y [T·k, ldy].
MatmulArgs grouped_args(const MoeGroups& g, int64_t T, int E, int k, int tile, const DMat& w, const float* x,
                        int64_t ldx, bool gather, const PreparedInput& px, WgmmaX xk, float* y, int64_t ldy) {
  MatmulArgs a;
  set_tiles(a, g, moe_max_tiles(T, E, k), tile);
  a.w = w;
  a.x = x;
  a.ldx = ldx;
  px.set(a, xk, ldx);
  if (gather) a.gather = g.sorted_token;
  a.y = y;
  a.ldy = ldy;
  return a;
}

// The grouped products follow the tile map moe_group builds on the device: gate-like (512 × 2048, rows gathered
// from the tokens), down-like (2048 × 512, rows by sorted position) and the fused gate+up SwiGLU, for evenly spread
// and skewed routing (one expert on every token; one expert with a single token).
TEST(CudaMatmulWgmma, GroupedExpertsFollowTheDeviceTileMap) {
  TERN_REQUIRE_WGMMA();
  std::mt19937_64 rng(fresh_seed("CudaMatmulWgmma.Grouped"));
  const int E = 256, k = 8;
  const int64_t D = 2048, F = 512;
  auto gate = random_matrix(rng, WeightFormat::affine4, E, F, D);
  auto down = random_matrix(rng, WeightFormat::affine4, E, D, F);
  auto up = random_matrix(rng, WeightFormat::affine4, E, F, D);
  DeviceMatrix dgate(*gate), ddown(*down), dup(*up);
  for (int run = 0; run < 3; ++run) {
    const int64_t T = run == 0 ? 63 : 300;
    const bool skewed = run == 2;
    const std::vector<int> ids = routing_ids(rng, T, E, k, skewed);
    const auto x = activations(rng, T, D, true), xd = activations(rng, T * k, F, false);
    DeviceBuf<int> dids(ids);
    DeviceBuf<int> scratch(size_t(moe_group_ints(T, E, k)));
    const MoeGroups g = moe_groups_view(scratch.p, T, E, k);
    moe_group(dids.p, T, E, k, kMatmulTileTokens, g, nullptr);
    DeviceBuf<float> dx(x), dxd(xd);
    std::vector<int> pos_of(size_t(T * k));
    TERN_CUDA(cudaMemcpy(pos_of.data(), g.pos_of, pos_of.size() * 4, cudaMemcpyDeviceToHost));
    for (WgmmaX xk : kXs) {
      const auto sx = as_seen(x, xk, D), sxd = as_seen(xd, xk, F);
      const GroupedReferences refs =
          grouped_references(gate->m, up->m, down->m, ids, pos_of, sx, sxd, T, E, k, D, F);
      const std::vector<float>&ref_gate = refs.gate, &ref_swiglu = refs.swiglu, &ref_down = refs.down;
      const PreparedInput px = prepared(dx.p, D, T, D, xk), pxd = prepared(dxd.p, F, T * k, F, xk);
      const std::string label = std::string(skewed ? "skewed " : "") + "T=" + std::to_string(T) + " " + x_name(xk);
      DeviceBuf<float> yg(std::vector<float>(size_t(T * k * F), NAN)), yd(std::vector<float>(size_t(T * k * D), NAN)),
          ys(std::vector<float>(size_t(T * k * F), NAN));
      MatmulArgs a = grouped_args(g, T, E, k, kMatmulTileTokens, dgate.d, dx.p, D, true, px, xk, yg.p, F);
      run_product(a, xk);
      a.y = ys.p;
      run_product(a, xk, &dup.d);
      run_product(grouped_args(g, T, E, k, kMatmulTileTokens, ddown.d, dxd.p, F, false, pxd, xk, yd.p, D), xk);
      expect_product(yg.host(), ref_gate, ref_gate, F, "grouped gate " + label, kTwinRms, kTwinWorst);
      expect_product(ys.host(), ref_swiglu, ref_swiglu, F, "grouped swiglu " + label, kSwigluRms, kSwigluWorst);
      expect_product(yd.host(), ref_down, ref_down, D, "grouped down " + label, kTwinRms, kTwinWorst);
    }
  }
}

// Grouped products on tiles of at most `tile` tokens (moe_group's tile, MatmulArgs::tile_tokens): the warpgroup
// kernel runs blocks of N = 16, 32 or 64 tokens (the narrowest that holds a tile). A few tokens per expert (T = 40,
// k = 4 of E = 64: 2.5 on average) and many (T = 300: 19, an expert over several tiles at N = 16 and 32; skewed: expert
// 0 on all 300 tokens). The x of the down product comes by pair (token t, slot j at t·k + j) and each width's own
// moe_group places it (sorted positions depend on atomics), so outputs are compared by pair through that map's pos_of.
struct NarrowCase {
  int64_t T;
  bool skewed;
};
constexpr NarrowCase kNarrowCases[] = {{40, false}, {300, false}, {300, true}};
constexpr int kNarrowE = 64, kNarrowK = 4;
constexpr int64_t kNarrowD = 2048, kNarrowF = 512;

struct NarrowModel {
  std::unique_ptr<HostMatrix> gate, up, down;
  std::unique_ptr<DeviceMatrix> dgate, dup, ddown;
  explicit NarrowModel(std::mt19937_64& rng)
      : gate(random_matrix(rng, WeightFormat::affine4, kNarrowE, kNarrowF, kNarrowD)),
        up(random_matrix(rng, WeightFormat::affine4, kNarrowE, kNarrowF, kNarrowD)),
        down(random_matrix(rng, WeightFormat::affine4, kNarrowE, kNarrowD, kNarrowF)),
        dgate(std::make_unique<DeviceMatrix>(*gate)),
        dup(std::make_unique<DeviceMatrix>(*up)),
        ddown(std::make_unique<DeviceMatrix>(*down)) {}
};

// The grouped gate [T·k, F], gate+up SwiGLU [T·k, F] and down [T·k, D] outputs, rows by pair.
struct PairOutputs {
  std::vector<float> gate, swiglu, down;
};

// Runs the three grouped products over a tile map of tiles of at most `tile` tokens, built on the device from ids.
// x [T, D] (token rows), xd_pair [T·k, F] by pair. tc: the split-x mma.sync kernel of matmul() (x_prep, 64-token
// blocks) instead of the warpgroup kernel (then xk must be split).
PairOutputs run_grouped(const NarrowModel& m, const std::vector<int>& ids, const std::vector<float>& x,
                        const std::vector<float>& xd_pair, int64_t T, int tile, WgmmaX xk, bool tc = false) {
  const int E = kNarrowE, k = kNarrowK;
  const int64_t D = kNarrowD, F = kNarrowF, n = T * k;
  DeviceBuf<int> dids(ids);
  DeviceBuf<int> scratch(size_t(moe_group_ints(T, E, k)));
  const MoeGroups g = moe_groups_view(scratch.p, T, E, k);
  moe_group(dids.p, T, E, k, tile, g, nullptr);
  std::vector<int> pos_of(static_cast<size_t>(n));
  TERN_CUDA(cudaMemcpy(pos_of.data(), g.pos_of, pos_of.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<float> xd_sorted(xd_pair.size());
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(xd_pair.begin() + i * F, F, xd_sorted.begin() + int64_t(pos_of[size_t(i)]) * F);
  DeviceBuf<float> dx(x), dxd(xd_sorted);
  const PreparedInput px = prepared(dx.p, D, T, D, xk), pxd = prepared(dxd.p, F, n, F, xk);
  DeviceBuf<float> yg(size_t(n * F)), ys(size_t(n * F)), yd(size_t(n * D));  // poisoned (NaN)
  auto product = [&](const MatmulArgs& a, const DMat* up) {
    if (!tc) {
      run_product(a, xk, up);
    } else if (up) {
      matmul_swiglu(a, *up, nullptr, MatmulTile::automatic);
    } else {
      matmul(a, nullptr, MatmulTile::automatic);
    }
  };
  MatmulArgs a = grouped_args(g, T, E, k, tile, m.dgate->d, dx.p, D, true, px, xk, yg.p, F);
  product(a, nullptr);
  a.y = ys.p;
  product(a, &m.dup->d);
  product(grouped_args(g, T, E, k, tile, m.ddown->d, dxd.p, F, false, pxd, xk, yd.p, D), nullptr);
  auto by_pair = [&](const std::vector<float>& sorted, int64_t cols) {
    std::vector<float> r(sorted.size());
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(sorted.begin() + int64_t(pos_of[size_t(i)]) * cols, cols, r.begin() + i * cols);
    return r;
  };
  return {by_pair(yg.host(), F), by_pair(ys.host(), F), by_pair(yd.host(), D)};
}

std::string narrow_label(const NarrowCase& c, int tile, WgmmaX xk) {
  return std::string(c.skewed ? "skewed " : "") + "T=" + std::to_string(c.T) + " tile=" + std::to_string(tile) + " " +
         x_name(xk);
}

// At N = 16 and 32: against the CPU twin, at the bounds of the 64-token grouped test above.
TEST(CudaMatmulWgmma, GroupedNarrowTilesMatchTheTwin) {
  TERN_REQUIRE_WGMMA();
  std::mt19937_64 rng(fresh_seed("CudaMatmulWgmma.GroupedNarrow"));
  const NarrowModel m(rng);
  const int E = kNarrowE, k = kNarrowK;
  const int64_t D = kNarrowD, F = kNarrowF;
  for (const NarrowCase& c : kNarrowCases) {
    const int64_t T = c.T;
    const std::vector<int> ids = routing_ids(rng, T, E, k, c.skewed);
    const auto x = activations(rng, T, D, true), xd = activations(rng, T * k, F, false);
    std::vector<int> identity(static_cast<size_t>(T * k));
    std::iota(identity.begin(), identity.end(), 0);
    for (WgmmaX xk : kXs) {
      // The references by pair: grouped_references with the identity for pos_of.
      const GroupedReferences refs = grouped_references(m.gate->m, m.up->m, m.down->m, ids, identity,
                                                        as_seen(x, xk, D), as_seen(xd, xk, F), T, E, k, D, F);
      for (int tile : {16, 32}) {
        const PairOutputs got = run_grouped(m, ids, x, xd, T, tile, xk);
        const std::string label = narrow_label(c, tile, xk);
        expect_product(got.gate, refs.gate, refs.gate, F, "grouped gate " + label, kTwinRms, kTwinWorst);
        expect_product(got.swiglu, refs.swiglu, refs.swiglu, F, "grouped swiglu " + label, kSwigluRms, kSwigluWorst);
        expect_product(got.down, refs.down, refs.down, D, "grouped down " + label, kTwinRms, kTwinWorst);
      }
    }
  }
}

// Elements whose bits differ (NaN against NaN included).
int64_t bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return int64_t(std::max(a.size(), b.size()));
  int64_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], 4) != 0 || std::isnan(a[i]);
  return d;
}
void expect_same_bits(const PairOutputs& got, const PairOutputs& want, const std::string& label) {
  EXPECT_EQ(bit_differences(got.gate, want.gate), 0) << "grouped gate " << label;
  EXPECT_EQ(bit_differences(got.swiglu, want.swiglu), 0) << "grouped swiglu " << label;
  EXPECT_EQ(bit_differences(got.down, want.down), 0) << "grouped down " << label;
}

// The same bits at every width: an output element's sum runs over k in the same order whatever N (per group of 64
// k the same 4 or 8 k16 MMAs in the same order into a fresh accumulator, folded with the row's scale by the same fmaf,
// then the bias term's MMAs over the groups and the token's σ in the same order); the token's place in its tile (its
// n8 tile, lane and tile) does not enter the arithmetic. Tiles of 24 and 48 tokens run on blocks of 32 and 64. The
// split-x mma.sync kernel of matmul() (64-token blocks, which read each tile's count) takes the narrow tiles too,
// with the same bits as on 64-token tiles.
TEST(CudaMatmulWgmma, GroupedOutputsAreTheSameBitsAtEveryWidth) {
  TERN_REQUIRE_WGMMA();
  std::mt19937_64 rng(fresh_seed("CudaMatmulWgmma.GroupedWidths"));
  const NarrowModel m(rng);
  for (const NarrowCase& c : kNarrowCases) {
    const int64_t T = c.T;
    const std::vector<int> ids = routing_ids(rng, T, kNarrowE, kNarrowK, c.skewed);
    const auto x = activations(rng, T, kNarrowD, true), xd = activations(rng, T * kNarrowK, kNarrowF, false);
    for (WgmmaX xk : kXs) {
      const PairOutputs wide = run_grouped(m, ids, x, xd, T, 64, xk);
      for (int tile : {16, 24, 32, 48})
        expect_same_bits(run_grouped(m, ids, x, xd, T, tile, xk), wide, narrow_label(c, tile, xk) + " vs tile=64");
    }
    const PairOutputs tc_wide = run_grouped(m, ids, x, xd, T, 64, WgmmaX::split, /*tc=*/true);
    for (int tile : {16, 32})
      expect_same_bits(run_grouped(m, ids, x, xd, T, tile, WgmmaX::split, /*tc=*/true), tc_wide,
                       "split-x mma.sync kernel " + narrow_label(c, tile, WgmmaX::split) + " vs tile=64");
  }
}

// The 64-token blocks' main loops (WgmmaBlock: plain, and deferred: the next step's barrier, copies and A fragments
// during a step's last MMAs) run the same sums in the same order: the same bits, dense (partial row blocks among
// them), SwiGLU accumulating, and grouped, for every form of x.
struct BlockForm {
  WgmmaBlock prev = matmul_wgmma_block();
  explicit BlockForm(WgmmaBlock b) { matmul_wgmma_set_block(b); }
  ~BlockForm() { matmul_wgmma_set_block(prev); }
};

TEST(CudaMatmulWgmma, DeferredLoopIsTheSameBits) {
  TERN_REQUIRE_WGMMA();
  std::mt19937_64 rng(fresh_seed("CudaMatmulWgmma.Deferred"));
  const DenseCase cases[] = {{12352, 2048, "GDN in_proj"}, {2048, 4096, "out_proj"}, {200, 512, "200 rows"},
                             {512, 2048, "shared gate+up (SwiGLU, accumulating)"}};
  for (const DenseCase& c : cases) {
    const bool swiglu = c.rows == 512;
    auto h = random_matrix(rng, WeightFormat::affine4, 1, c.rows, c.cols);
    auto hu = random_matrix(rng, WeightFormat::affine4, 1, c.rows, c.cols);
    DeviceMatrix dm(*h), du(*hu);
    for (int64_t T : {int64_t(65), int64_t(300)}) {
      const auto x = activations(rng, T, c.cols, true);
      const auto base = random_floats(rng, size_t(T * c.rows));
      DeviceBuf<float> dx(x);
      for (WgmmaX xk : kXs) {
        const PreparedInput px = prepared(dx.p, c.cols, T, c.cols, xk);
        auto run_form = [&](WgmmaBlock b) {
          const BlockForm form(b);
          DeviceBuf<float> dy(swiglu ? base : std::vector<float>(size_t(T * c.rows), NAN));
          MatmulArgs a = dense_args(dm.d, dx.p, dy.p, T);
          px.set(a, xk, c.cols);
          a.accumulate = swiglu;
          run_product(a, xk, swiglu ? &du.d : nullptr);
          return dy.host();
        };
        EXPECT_EQ(bit_differences(run_form(WgmmaBlock::deferred), run_form(WgmmaBlock::plain)), 0)
            << c.name << " T=" << T << " " << x_name(xk) << ": deferred vs plain";
      }
    }
  }
  const NarrowModel m(rng);
  for (const NarrowCase& c : kNarrowCases) {
    const std::vector<int> ids = routing_ids(rng, c.T, kNarrowE, kNarrowK, c.skewed);
    const auto x = activations(rng, c.T, kNarrowD, true), xd = activations(rng, c.T * kNarrowK, kNarrowF, false);
    for (WgmmaX xk : kXs) {
      PairOutputs plain;
      {
        const BlockForm form(WgmmaBlock::plain);
        plain = run_grouped(m, ids, x, xd, c.T, 64, xk);
      }
      const BlockForm form(WgmmaBlock::deferred);
      expect_same_bits(run_grouped(m, ids, x, xd, c.T, 64, xk), plain, narrow_label(c, 64, xk) + " deferred vs plain");
    }
  }
}

}  // namespace
}  // namespace tern::cuda::test
