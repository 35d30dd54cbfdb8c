// The integer tensor-core product (qmatmul_int8.cuh) against its CPU twin: x quantised on the host exactly as
// matmul_quantize_x does (per token and group of 64: m = max|x|, v = rint(x·(32639/m)) in fp32, v = 0 when
// m < 2^-100, σ = m/32639 to 22 significant bits, x' = σ·v), then the fp32 CPU product cpu::matmul(W, x'). The
// kernel's integer sums are exact, so only fp32 summation differs: the bounds of matmul_test.cpp (1e-5 of the
// token's rms in rms, 6e-5 in the worst element) hold, and a wrong nibble, group, scale or token is ~1e-2 of the
// rms. Against the unquantised product the error is the quantisation's (≤ m/65278 per element): a looser sanity
// bound. The quantised bytes themselves are compared exactly, and every block shape must give the same bits. Outputs
// start poisoned (NaN), so unwritten elements fail.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "cpu/ops_matmul.h"
#include "cuda/kernels/moe/moe.cuh"
#include "cuda/kernels/qmatmul/qmatmul_int8.cuh"
#include "matmul_test_util.h"

namespace tern::cuda::test {
namespace {

constexpr Int8Tile kTiles[] = {Int8Tile::automatic, Int8Tile::b64x64, Int8Tile::b128x64, Int8Tile::b128x128};
// Block shapes whose shared memory this device lacks (sm_86/89/120, TERN_GPU_PATH=portable) are not run.
bool tile_fits(Int8Tile tile, const DMat& w) {
  return matmul_int8_tile_fits(tile, w.cols, w.format == WeightFormat::affine8 ? 8 : 4);
}
const char* tile_name(Int8Tile t) {
  switch (t) {
    case Int8Tile::automatic: return "auto";
    case Int8Tile::b64x64: return "64x64";
    case Int8Tile::b128x64: return "128x64";
    case Int8Tile::b128x128: return "128x128";
  }
  return "?";
}

// The host twin of matmul_quantize_x for rows of x [T, cols]: x' = σ·v (returned), and the bytes of the layout.
struct Quantised {
  std::vector<float> xq;              // [T, cols] σ·v
  std::vector<float> rest;            // [T, cols] x − σ·v in fp32 (one fma, as the kernel's residual)
  std::vector<unsigned char> bytes;   // [T, matmul_q16_row_bytes(cols)]
};
uint32_t pack4(int a, int b, int c, int d) {
  return (uint32_t(a) & 0xffu) | ((uint32_t(b) & 0xffu) << 8) | ((uint32_t(c) & 0xffu) << 16) | (uint32_t(d) << 24);
}
Quantised quantise(const std::vector<float>& x, int64_t T, int64_t cols) {
  Quantised r;
  r.xq.resize(x.size());
  r.rest.resize(x.size());
  const int64_t rb = matmul_q16_row_bytes(cols), G = cols / 64;
  r.bytes.assign(size_t(T * rb), 0);
  for (int64_t n = 0; n < T; ++n) {
    unsigned char* row = r.bytes.data() + n * rb;
    for (int64_t g = 0; g < G; ++g) {
      const float* xs = x.data() + n * cols + g * 64;
      float m = 0.0f;
      for (int k = 0; k < 64; ++k) m = std::max(m, std::fabs(xs[k]));
      const float inv = m >= 0x1p-100f ? 32639.0f / m : 0.0f;  // dp4a::quant_factor
      uint32_t sig_bits;
      const float sig0 = m / 32639.0f;
      std::memcpy(&sig_bits, &sig0, 4);
      sig_bits &= ~3u;  // 22 significant bits, as the kernel stores σ
      float sig;
      std::memcpy(&sig, &sig_bits, 4);
      int v[64], sum = 0;
      for (int k = 0; k < 64; ++k) {
        v[k] = std::clamp(int(std::nearbyint(xs[k] * inv)), -32639, 32639);
        sum += v[k];
        r.xq[size_t(n * cols + g * 64 + k)] = float(double(v[k]) * double(sig));
        r.rest[size_t(n * cols + g * 64 + k)] = std::fma(-sig, float(v[k]), xs[k]);
      }
      for (int w = 0; w < 8; ++w) {
        int hi[8], lo[8];
        for (int e = 0; e < 8; ++e) {
          hi[e] = (v[8 * w + e] + 128) >> 8;
          lo[e] = v[8 * w + e] - hi[e] * 256;
        }
        const uint32_t words[4] = {pack4(hi[0], hi[2], hi[4], hi[6]), pack4(hi[1], hi[3], hi[5], hi[7]),
                                   pack4(lo[0], lo[2], lo[4], lo[6]), pack4(lo[1], lo[3], lo[5], lo[7])};
        std::memcpy(row + g * 128 + w * 16, words, 16);
      }
      const float beta = sig * float(sum);
      std::memcpy(row + G * 128 + g * 4, &sig, 4);  // σ of every group, then σ·Σv of every group
      std::memcpy(row + G * 128 + G * 4 + g * 4, &beta, 4);
    }
  }
  return r;
}

constexpr double kTwinRms = 1e-5, kTwinWorst = 6e-5;   // fp32 summation only
constexpr double kSwigluRms = 1e-4, kSwigluWorst = 1e-3;  // silu amplifies the products' fp32 errors (as in matmul_test)

// Per token, sqrt(Σ_k (w_rk·x_k)²) averaged over the rows: the size of a product's terms, for matrices of few rows.
std::vector<double> term_magnitudes(const Matrix& w, const std::vector<float>& x, int64_t T) {
  std::vector<double> mag(static_cast<size_t>(T), 0.0);
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    matrix_row_to_f32(w, r, row.data());
    for (int64_t n = 0; n < T; ++n) {
      double s = 0;
      for (int64_t k = 0; k < w.cols; ++k) {
        const double v = double(row[size_t(k)]) * x[size_t(n * w.cols + k)];
        s += v * v;
      }
      mag[size_t(n)] += s / double(w.rows);
    }
  }
  for (double& m : mag) m = std::sqrt(m);
  return mag;
}
constexpr double kQuantRms = 3e-4, kQuantWorst = 3e-3;  // the 16-bit quantisation (outlier columns widen a group)

std::unique_ptr<DeviceBuf<unsigned char>> quantised_x(const float* dx, int64_t ld, int64_t rows, int64_t cols,
                                                       void* residual = nullptr) {
  auto b = std::make_unique<DeviceBuf<unsigned char>>(size_t(matmul_q16_bytes(rows, cols)));
  matmul_quantize_x(dx, ld, rows, cols, b->p, nullptr, residual);
  return b;
}

// The index of the first byte where two buffers differ (their size when none does).
size_t first_difference(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

TEST(CudaMatmulInt8, QuantisedBytesMatchTheTwin) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMatmulInt8.Quantise"));
  for (int64_t cols : {int64_t(512), int64_t(2048), int64_t(4096)}) {
    const int64_t T = 37, ld = cols + 8;
    auto x = activations(rng, T, ld, true);
    for (int64_t c = 0; c < 64; ++c) x[size_t(ld + c)] = 0.0f;  // an all-zero group: σ = 0
    std::vector<float> xc(size_t(T * cols));
    for (int64_t n = 0; n < T; ++n) std::copy_n(x.begin() + n * ld, cols, xc.begin() + n * cols);
    const Quantised want = quantise(xc, T, cols);
    DeviceBuf<float> dx(x);
    DeviceBuf<unsigned char> rest(size_t(matmul_q16_bytes(T, cols)));
    const auto got = quantised_x(dx.p, ld, T, cols, rest.p)->host();
    ASSERT_EQ(got.size(), want.bytes.size());
    size_t diff = first_difference(got, want.bytes);
    EXPECT_EQ(diff, got.size()) << "cols " << cols << ": first differing byte " << diff << " (row "
                                << diff / size_t(matmul_q16_row_bytes(cols)) << ")";
    // The residual, quantised again: the twin of x − σ·v through the same quantisation, byte for byte.
    const Quantised want_rest = quantise(want.rest, T, cols);
    const auto got_rest = rest.host();
    diff = first_difference(got_rest, want_rest.bytes);
    EXPECT_EQ(diff, got_rest.size()) << "cols " << cols << ": residual's first differing byte " << diff;
    // Together the two terms are x to ~m/4·10⁹ per element (m the group's max |x|): the residual's own rounding
    // (x − σ·v is exact to 2^-24 of the residual, far below this).
    for (int64_t n = 0; n < T; ++n)
      for (int64_t g = 0; g < cols / 64; ++g) {
        float m = 0.0f;
        for (int64_t c = g * 64; c < g * 64 + 64; ++c) m = std::max(m, std::fabs(xc[size_t(n * cols + c)]));
        for (int64_t c = g * 64; c < g * 64 + 64; ++c) {
          const size_t i = size_t(n * cols + c);
          ASSERT_LE(std::fabs(double(want_rest.xq[i]) - double(want.rest[i])), 1e-9 * m + 1e-30)
              << "row " << n << " column " << c;
        }
      }
  }
}

struct DenseCase {
  WeightFormat f;
  int64_t rows, cols;
  const char* name;
};

TEST(CudaMatmulInt8, DenseMatchesTwinAtModelShapes) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMatmulInt8.Dense"));
  const DenseCase cases[] = {
      {WeightFormat::affine4, 12352, 2048, "GDN in_proj qkv+z+b+a"},
      {WeightFormat::affine4, 2048, 4096, "out_proj / o_proj"},
      {WeightFormat::affine4, 2048, 512, "shared expert down"},
      {WeightFormat::affine4, 200, 512, "200 rows (partial row tiles)"},
      {WeightFormat::affine8, 256, 2048, "8-bit router"},
      {WeightFormat::affine8, 1, 2048, "8-bit shared-expert gate"},
  };
  for (const DenseCase& c : cases) {
    auto h = random_matrix(rng, c.f, 1, c.rows, c.cols);
    DeviceMatrix dm(*h);
    ASSERT_TRUE(matmul_int8_takes(dm.d)) << c.name;
    for (int64_t T : {int64_t(2), int64_t(63), int64_t(64), int64_t(65), int64_t(300)}) {
      const bool ranged = T % 2 == 1;
      const auto x = activations(rng, T, c.cols, ranged);
      const Quantised q = quantise(x, T, c.cols);
      const auto twin = cpu_product(h->m, q.xq, T);
      const std::vector<double> mag = c.rows < 64 ? term_magnitudes(h->m, q.xq, T) : std::vector<double>{};
      DeviceBuf<float> dx(x);
      const auto dxq = quantised_x(dx.p, c.cols, T, c.cols);
      const std::string base = std::string(c.name) + " T=" + std::to_string(T);
      std::vector<float> first;
      for (Int8Tile tile : kTiles) {
        if (!tile_fits(tile, dm.d)) continue;
        DeviceBuf<float> dy(size_t(T * c.rows));
        MatmulArgs a = dense_args(dm.d, dx.p, dy.p, T);
        a.x_q16 = dxq->p;
        a.x_q16_cols = c.cols;
        matmul_int8(a, nullptr, tile);
        const auto got = dy.host();
        const std::string what = base + " " + tile_name(tile);
        expect_product(got, twin, twin, c.rows, what + " vs twin", kTwinRms, kTwinWorst, mag);
        if (first.empty()) {
          first = got;
          if (T == 65 || T == 300) {
            const auto exact = cpu_product(h->m, x, T);
            expect_product(got, exact, exact, c.rows, what + " vs unquantised", kQuantRms, kQuantWorst, mag);
          }
          DeviceBuf<float> dy2(size_t(T * c.rows));
          a.y = dy2.p;
          matmul(a, nullptr);  // matmul() with x_q16 set runs this kernel
          expect_close(dy2.host(), got, 0.0f, 0.0f, what + " through matmul()");
        } else {  // every shape sums in the same order
          expect_close(got, first, 0.0f, 0.0f, what + " vs auto");
        }
      }
    }
  }
}

// x rows gathered from a wider buffer (row stride > cols, offset start), y a slice of a wider buffer, accumulate.
TEST(CudaMatmulInt8, StridedGatheredAccumulating) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMatmulInt8.Strided"));
  const int64_t rows = 2048, cols = 4096, T = 300, Tx = 517, ldx = cols + 96, x_off = 12, ldy = rows + 40;
  auto h = random_matrix(rng, WeightFormat::affine4, 1, rows, cols);
  DeviceMatrix dm(*h);
  const auto xbuf = activations(rng, Tx, ldx, true);
  std::vector<int> gather(static_cast<size_t>(T));
  for (auto& gi : gather) gi = int(rng() % uint64_t(Tx));  // repeats allowed
  std::vector<float> xall(size_t(Tx * cols));
  for (int64_t n = 0; n < Tx; ++n) std::copy_n(xbuf.begin() + n * ldx + x_off, cols, xall.begin() + n * cols);
  const Quantised q = quantise(xall, Tx, cols);
  std::vector<float> xg(size_t(T * cols));
  for (int64_t n = 0; n < T; ++n)
    std::copy_n(q.xq.begin() + gather[size_t(n)] * cols, cols, xg.begin() + n * cols);
  const auto ref = cpu_product(h->m, xg, T);
  const auto base = random_floats(rng, size_t(T * ldy));
  DeviceBuf<float> dx(xbuf);
  DeviceBuf<int> dg(gather);
  const auto dxq = quantised_x(dx.p + x_off, ldx, Tx, cols);
  for (Int8Tile tile : kTiles) {
    if (!tile_fits(tile, dm.d)) continue;
    DeviceBuf<float> dy(base);
    MatmulArgs a;
    a.w = dm.d;
    a.x = dx.p + x_off;
    a.ldx = ldx;
    a.x_q16 = dxq->p;
    a.x_q16_cols = cols;
    a.y = dy.p;
    a.ldy = ldy;
    a.tokens = T;
    a.gather = dg.p;
    a.accumulate = true;
    matmul_int8(a, nullptr, tile);
    const auto got = dy.host();
    std::vector<float> got_prod, want;
    ASSERT_NO_FATAL_FAILURE(unstride_accumulated(got, base, ref, T, rows, ldy, got_prod, want));
    expect_product(got_prod, want, ref, rows, std::string("strided gathered accumulate ") + tile_name(tile), kTwinRms,
                   kTwinWorst);
  }
}

// silu(x·Gᵀ) ⊙ (x·Uᵀ) in one pass (the shared expert's gate and up), with partial row tiles and accumulate.
TEST(CudaMatmulInt8, SwigluMatchesTwin) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMatmulInt8.Swiglu"));
  const DenseCase cases[] = {{WeightFormat::affine4, 512, 2048, "shared expert gate+up"},
                             {WeightFormat::affine4, 200, 512, "200 rows (partial row tiles)"}};
  for (const DenseCase& c : cases) {
    auto hg = random_matrix(rng, c.f, 1, c.rows, c.cols);
    auto hu = random_matrix(rng, c.f, 1, c.rows, c.cols);
    DeviceMatrix dg(*hg), du(*hu);
    for (int64_t T : {int64_t(2), int64_t(65), int64_t(300)}) {
      const auto x = activations(rng, T, c.cols, T % 2 == 1);
      const Quantised q = quantise(x, T, c.cols);
      const auto ref = swiglu_of(cpu_product(hg->m, q.xq, T), cpu_product(hu->m, q.xq, T));
      const bool accumulate = T == 65;
      const auto base = random_floats(rng, size_t(T * c.rows));
      std::vector<float> want(ref);
      if (accumulate)
        for (size_t i = 0; i < want.size(); ++i) want[i] += base[i];
      DeviceBuf<float> dx(x);
      const auto dxq = quantised_x(dx.p, c.cols, T, c.cols);
      for (Int8Tile tile : kTiles) {
        if (!tile_fits(tile, dg.d)) continue;
        DeviceBuf<float> dy(size_t(T * c.rows));
        if (accumulate) TERN_CUDA(cudaMemcpy(dy.p, base.data(), base.size() * 4, cudaMemcpyHostToDevice));
        MatmulArgs a = dense_args(dg.d, dx.p, dy.p, T);
        a.x_q16 = dxq->p;
        a.x_q16_cols = c.cols;
        a.accumulate = accumulate;
        matmul_int8_swiglu(a, du.d, nullptr, tile);
        expect_product(dy.host(), want, ref, c.rows,
                       std::string(c.name) + " swiglu T=" + std::to_string(T) + " " + tile_name(tile), kSwigluRms,
                       kSwigluWorst);
      }
    }
  }
}

// The grouped products follow the tile map moe_group builds on the device: gate-like (512 × 2048, rows gathered
// from the tokens), down-like (2048 × 512, rows by sorted position) and the fused gate+up SwiGLU, for evenly spread
// and skewed routing (one expert on every token; one expert with a single token).
TEST(CudaMatmulInt8, GroupedExpertsFollowTheDeviceTileMap) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMatmulInt8.Grouped"));
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
    const Quantised qx = quantise(x, T, D), qxd = quantise(xd, T * k, F);
    DeviceBuf<int> dids(ids);
    DeviceBuf<int> scratch(size_t(moe_group_ints(T, E, k)));
    const MoeGroups g = moe_groups_view(scratch.p, T, E, k);
    moe_group(dids.p, T, E, k, kMatmulTileTokens, g, nullptr);
    DeviceBuf<float> dx(x), dxd(xd);
    const auto dxq = quantised_x(dx.p, D, T, D), dxdq = quantised_x(dxd.p, F, T * k, F);
    std::vector<int> pos_of(size_t(T * k));
    TERN_CUDA(cudaMemcpy(pos_of.data(), g.pos_of, pos_of.size() * 4, cudaMemcpyDeviceToHost));

    const GroupedReferences refs =
        grouped_references(gate->m, up->m, down->m, ids, pos_of, qx.xq, qxd.xq, T, E, k, D, F);
    const std::vector<float>&ref_gate = refs.gate, &ref_swiglu = refs.swiglu, &ref_down = refs.down;
    for (Int8Tile tile : kTiles) {
      if (tile == Int8Tile::b128x128) continue;  // dense only (runs as 64x64 here)
      if (!matmul_int8_tile_fits(tile, D, 4) || !matmul_int8_tile_fits(tile, F, 4)) continue;
      const std::string label = std::string(skewed ? "skewed " : "") + "T=" + std::to_string(T) + " " + tile_name(tile);
      DeviceBuf<float> yg(size_t(T * k * F)), yd(size_t(T * k * D)), ys(size_t(T * k * F));
      MatmulArgs a;
      set_tiles(a, g, moe_max_tiles(T, E, k));
      a.w = dgate.d;
      a.x = dx.p;
      a.ldx = D;
      a.x_q16 = dxq->p;
      a.x_q16_cols = D;
      a.gather = g.sorted_token;
      a.y = yg.p;
      a.ldy = F;
      matmul_int8(a, nullptr, tile);
      a.y = ys.p;
      matmul_int8_swiglu(a, dup.d, nullptr, tile);
      a.w = ddown.d;
      a.x = dxd.p;
      a.ldx = F;
      a.x_q16 = dxdq->p;
      a.x_q16_cols = F;
      a.gather = nullptr;
      a.y = yd.p;
      a.ldy = D;
      matmul_int8(a, nullptr, tile);
      expect_product(yg.host(), ref_gate, ref_gate, F, "grouped gate " + label, kTwinRms, kTwinWorst);
      expect_product(ys.host(), ref_swiglu, ref_swiglu, F, "grouped swiglu " + label, kSwigluRms, kSwigluWorst);
      expect_product(yd.host(), ref_down, ref_down, D, "grouped down " + label, kTwinRms, kTwinWorst);
    }
  }
}

}  // namespace
}  // namespace tern::cuda::test
