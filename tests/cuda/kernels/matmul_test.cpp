// The tiled product (cuda::matmul) against its CPU twin at the model's real shapes, in dense and grouped (MoE)
// mode, for every block shape. 4-bit products run on the tensor cores with exact weights (q − 8, scale and bias
// applied in fp32) and x split into two bf16 terms (16 significant bits), so they must match cpu::matmul in fp32:
// ~3e-6 of the rms per element expected; the bounds (1e-5 of the token's rms in rms, 6e-5 in the worst element)
// catch a single misplaced or dropped term (~1.5e-2 of the rms) 250-fold. Every shape and both x sources (fp32, and
// prepared by matmul_prepare_x) sum in the same order: results must agree to the bit (dense) or to 1e-6 of the rms
// (across shapes). The legacy bf16-operand kernel (MatmulTile::tc_bf16) is checked at its own, loose accuracy.
// Outputs start poisoned (NaN), so unwritten elements fail.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>
#include <numeric>

#include "cpu/ops_matmul.h"
#include "cuda/kernels/moe/moe.cuh"
#include "cuda/kernels/qmatmul/qmatmul.cuh"
#include "matmul_test_util.h"

namespace tern::cuda::test {
namespace {

// The legacy bf16-operand kernel: ~2.5e-3 of the rms per element.
constexpr double kLegacyRms = 5e-3, kLegacyWorst = 3e-2;
// SwiGLU multiplies two products' errors into a heavier tail.
constexpr double kSwigluRms = 1e-4, kSwigluWorst = 2e-3;  // silu amplifies the split-x error on tokens scaled by 2^±8 (measured 2.9e-5 / 4.3e-4)

const char* tile_name(MatmulTile t) {
  switch (t) {
    case MatmulTile::automatic: return "auto";
    case MatmulTile::simt: return "simt";
    case MatmulTile::tc128x64: return "tc128x64";
    case MatmulTile::tc256x64: return "tc256x64";
    case MatmulTile::tc128x128: return "tc128x128";
    case MatmulTile::tc256x64w: return "tc256x64w";
    case MatmulTile::tc_bf16: return "tc_bf16";
    case MatmulTile::wgmma: return "wgmma";
  }
  return "?";
}

constexpr MatmulTile kTensorCoreTiles[] = {MatmulTile::automatic, MatmulTile::tc128x64, MatmulTile::tc256x64,
                                           MatmulTile::tc128x128, MatmulTile::tc256x64w};

// x [rows, cols] (row stride ld) prepared on the device by matmul_prepare_x (same row numbers).
std::unique_ptr<DeviceBuf<unsigned char>> prepared_x(const float* dx, int64_t ld, int64_t rows, int64_t cols) {
  auto b = std::make_unique<DeviceBuf<unsigned char>>(size_t(matmul_prepared_bytes(rows, cols)));
  matmul_prepare_x(dx, ld, rows, cols, b->p, nullptr);
  return b;
}
constexpr int64_t kTokenCounts[] = {2, 63, 64, 65, 300, 1000};

// ---- dense --------------------------------------------------------------------------------------------------

struct DenseCase {
  int64_t rows, cols;
  const char* name;
};

TEST(CudaMatmulTc, DenseMatchesCpuAtModelShapes) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMatmulTc.Dense"));
  const DenseCase cases[] = {
      {12352, 2048, "GDN in_proj qkv+z+b+a"},
      {9216, 2048, "attention q+k+v"},
      {2048, 4096, "out_proj / o_proj"},
      {512, 2048, "shared expert gate / up"},
      {2048, 512, "shared expert down"},
      {200, 384, "200 rows (partial row tiles)"},
  };
  for (const DenseCase& c : cases) {
    auto h = random_matrix(rng, WeightFormat::affine4, 1, c.rows, c.cols);
    DeviceMatrix dm(*h);
    for (int64_t T : kTokenCounts) {
      const auto x = activations(rng, T, c.cols, T % 2 == 1);
      const auto ref = cpu_product(h->m, x, T);
      DeviceBuf<float> dx(x);
      const auto dxp = prepared_x(dx.p, c.cols, T, c.cols);
      const std::string base = std::string(c.name) + " T=" + std::to_string(T);
      MatmulArgs a;
      a.w = dm.d;
      a.x = dx.p;
      a.ldx = c.cols;
      a.ldy = c.rows;
      a.tokens = T;
      std::vector<float> first;
      for (MatmulTile tile : kTensorCoreTiles) {
        if (!matmul_tile_fits(tile, false) || !matmul_tile_fits(tile, true)) continue;  // shared memory (sm_86/89/120)
        const std::string what = base + " " + tile_name(tile);
        DeviceBuf<float> dy(size_t(T * c.rows));
        a.y = dy.p;
        a.x_prep = nullptr;
        matmul(a, nullptr, tile);
        const auto got = dy.host();
        expect_product(got, ref, c.rows, what);
        if (first.empty()) {
          first = got;
        } else {  // every shape sums in the same order
          expect_close(got, first, 1e-6f * rms_of(first), 0.0f, what + " vs auto");
        }
        a.x_prep = dxp->p;  // the same product from the prepared x: bit-identical
        a.x_prep_cols = c.cols;
        matmul(a, nullptr, tile);
        expect_close(dy.host(), got, 0.0f, 0.0f, what + " from prepared x");
      }
      DeviceBuf<float> dy(size_t(T * c.rows));  // the legacy kernel, at its own accuracy (ignores x_prep)
      a.y = dy.p;
      matmul(a, nullptr, MatmulTile::tc_bf16);
      expect_product(dy.host(), ref, c.rows, base + " tc_bf16", kLegacyRms, kLegacyWorst);
    }
  }
}

// x rows gathered from a wider buffer (row stride > cols, offset start), y a slice of a wider buffer, accumulate.
TEST(CudaMatmulTc, DenseStridedGatheredAccumulating) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMatmulTc.Strided"));
  const int64_t rows = 2048, cols = 4096, T = 300, Tx = 517, ldx = cols + 96, x_off = 12, ldy = rows + 40;
  auto h = random_matrix(rng, WeightFormat::affine4, 1, rows, cols);
  DeviceMatrix dm(*h);
  const auto xbuf = activations(rng, Tx, ldx, true);
  std::vector<int> gather(static_cast<size_t>(T));
  for (auto& gi : gather) gi = int(rng() % uint64_t(Tx));  // repeats allowed
  std::vector<float> xg(size_t(T * cols));
  for (int64_t n = 0; n < T; ++n)
    std::copy_n(xbuf.begin() + gather[size_t(n)] * ldx + x_off, cols, xg.begin() + n * cols);
  const auto ref = cpu_product(h->m, xg, T);
  const auto base = random_floats(rng, size_t(T * ldy));
  DeviceBuf<float> dx(xbuf);
  DeviceBuf<int> dg(gather);
  const auto dxp = prepared_x(dx.p + x_off, ldx, Tx, cols);  // indexed like x = dx.p + x_off, 16-byte aligned
  for (int variant = 0; variant <= int(std::size(kTensorCoreTiles)) * 2; ++variant) {
    const bool legacy = variant == int(std::size(kTensorCoreTiles)) * 2;
    const MatmulTile tile = legacy ? MatmulTile::tc_bf16 : kTensorCoreTiles[variant / 2];
    const bool xp = !legacy && variant % 2 == 1;
    if (!matmul_tile_fits(tile, xp)) continue;  // shared memory this device lacks (sm_86/89/120)
    DeviceBuf<float> dy(base);
    MatmulArgs a;
    a.w = dm.d;
    a.x = dx.p + x_off;
    a.ldx = ldx;
    a.y = dy.p;
    a.ldy = ldy;
    a.tokens = T;
    a.gather = dg.p;
    a.accumulate = true;
    if (xp) {
      a.x_prep = dxp->p;
      a.x_prep_cols = cols;
    }
    matmul(a, nullptr, tile);
    const auto got = dy.host();
    std::vector<float> got_prod, want;
    ASSERT_NO_FATAL_FAILURE(unstride_accumulated(got, base, ref, T, rows, ldy, got_prod, want));
    const std::string what = std::string("strided gathered accumulate ") + tile_name(tile) + (xp ? " prepared x" : "");
    if (legacy) {
      expect_product(got_prod, want, ref, rows, what, kLegacyRms, kLegacyWorst);
    } else {
      expect_product(got_prod, want, ref, rows, what);
    }
  }
}

// silu(x·Gᵀ) ⊙ (x·Uᵀ) in one pass (the shared expert's gate and up), with partial row tiles and accumulate.
TEST(CudaMatmulTc, DenseSwigluMatchesCpu) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMatmulTc.Swiglu"));
  const DenseCase cases[] = {{512, 2048, "shared expert gate+up"}, {200, 384, "200 rows (partial row tiles)"}};
  for (const DenseCase& c : cases) {
    auto hg = random_matrix(rng, WeightFormat::affine4, 1, c.rows, c.cols);
    auto hu = random_matrix(rng, WeightFormat::affine4, 1, c.rows, c.cols);
    DeviceMatrix dg(*hg), du(*hu);
    for (int64_t T : kTokenCounts) {
      const auto x = activations(rng, T, c.cols, T % 2 == 1);
      const auto ref = swiglu_of(cpu_product(hg->m, x, T), cpu_product(hu->m, x, T));
      const bool accumulate = T == 65;
      const auto base = random_floats(rng, size_t(T * c.rows));
      std::vector<float> want(ref);
      if (accumulate)
        for (size_t i = 0; i < want.size(); ++i) want[i] += base[i];
      DeviceBuf<float> dx(x);
      const auto dxp = prepared_x(dx.p, c.cols, T, c.cols);
      for (int variant = 0; variant <= int(std::size(kTensorCoreTiles)) * 2; ++variant) {
        const bool legacy = variant == int(std::size(kTensorCoreTiles)) * 2;
        const MatmulTile tile = legacy ? MatmulTile::tc_bf16 : kTensorCoreTiles[variant / 2];
        const bool xp = !legacy && variant % 2 == 1;
        if (!matmul_tile_fits(tile, xp)) continue;  // shared memory this device lacks (sm_86/89/120)
        DeviceBuf<float> dy(size_t(T * c.rows));
        if (accumulate) TERN_CUDA(cudaMemcpy(dy.p, base.data(), base.size() * 4, cudaMemcpyHostToDevice));
        MatmulArgs a = dense_args(dg.d, dx.p, dy.p, T);
        a.accumulate = accumulate;
        if (xp) {
          a.x_prep = dxp->p;
          a.x_prep_cols = c.cols;
        }
        ASSERT_TRUE(matmul_swiglu_supported(a, du.d));
        matmul_swiglu(a, du.d, nullptr, tile);
        const std::string what = std::string(c.name) + " swiglu T=" + std::to_string(T) + " " + tile_name(tile) +
                                 (xp ? " prepared x" : "");
        if (legacy) {
          expect_product(dy.host(), want, ref, c.rows, what, 1e-2, 1e-1);
        } else {
          expect_product(dy.host(), want, ref, c.rows, what, kSwigluRms, kSwigluWorst);
        }
      }
    }
  }
}

// Shapes and formats the tensor-core kernel does not take run the fp32 SIMT kernel, at fp32 accuracy.
TEST(CudaMatmulTc, OtherFormatsAndShapesFallBackToFp32) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMatmulTc.Fallback"));
  struct Case {
    WeightFormat f;
    int64_t rows, cols;
    MatmulTile tile;
    const char* name;
  };
  const Case cases[] = {
      {WeightFormat::affine4, 96, 192, MatmulTile::automatic, "4-bit, cols not a multiple of 128"},
      {WeightFormat::affine4, 512, 2048, MatmulTile::simt, "4-bit forced simt"},
      {WeightFormat::affine8, 256, 2048, MatmulTile::tc128x64, "8-bit router (tensor-core tile asked)"},
      {WeightFormat::bf16, 300, 1024, MatmulTile::automatic, "bf16"},
  };
  for (const Case& c : cases) {
    auto h = random_matrix(rng, c.f, 1, c.rows, c.cols);
    DeviceMatrix dm(*h);
    for (int64_t T : {int64_t(2), int64_t(65)}) {
      const auto x = random_floats(rng, size_t(T * c.cols), -2.0f, 2.0f);
      const auto ref = cpu_product(h->m, x, T);
      DeviceBuf<float> dx(x), dy(size_t(T * c.rows));
      MatmulArgs a = dense_args(dm.d, dx.p, dy.p, T);
      matmul(a, nullptr, c.tile);
      const float tol = 1e-5f * std::sqrt(float(c.cols)) * 4.0f;
      expect_close(dy.host(), ref, tol * rms_of(ref) + 1e-5f, 1e-4f, std::string(c.name) + " T=" + std::to_string(T));
    }
  }
}

// ---- grouped (routed experts) --------------------------------------------------------------------------------

struct GroupedRun {
  int64_t T = 0;
  std::string name;
  std::vector<int> ids;      // [T, k]
  std::vector<int> pos_of;   // [T·k] sorted position of pair i
  std::vector<float> x;      // [T, D] gate input
  std::vector<float> xd;     // [T·k, F] down input, by sorted position
  std::vector<float> y_gate;  // [T·k, F] by position (automatic tile)
  std::vector<float> y_down;  // [T·k, D]
  std::vector<float> y_swiglu;  // [T·k, F] silu(gate) · up
  std::vector<float> l_gate, l_down, l_swiglu;  // the same from the legacy kernel (MatmulTile::tc_bf16)
  std::vector<float> ref_gate, ref_down, ref_swiglu;
};

// The grouped products follow the tile map moe_group builds on the device: gate-like (512 × 2048, rows gathered
// from the tokens), down-like (2048 × 512, rows by sorted position) and the fused gate+up SwiGLU, for evenly spread
// and skewed routing (one expert on every token, so many tiles of one expert; one expert with a single token).
TEST(CudaMatmulTc, GroupedExpertsFollowTheDeviceTileMap) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMatmulTc.Grouped"));
  const int E = 256, k = 8;
  const int64_t D = 2048, F = 512;
  auto gate = random_matrix(rng, WeightFormat::affine4, E, F, D);
  auto down = random_matrix(rng, WeightFormat::affine4, E, D, F);
  auto up = random_matrix(rng, WeightFormat::affine4, E, F, D);
  DeviceMatrix dgate(*gate), ddown(*down), dup(*up);

  std::vector<GroupedRun> runs;
  for (int64_t T : kTokenCounts) {
    runs.emplace_back();
    runs.back().T = T;
    runs.back().name = "T=" + std::to_string(T);
  }
  runs.emplace_back();
  runs.back().T = 300;
  runs.back().name = "skewed T=300";
  for (GroupedRun& run : runs) {
    const int64_t T = run.T;
    const bool skewed = run.name.rfind("skewed", 0) == 0;
    run.ids.resize(size_t(T * k));
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int> perm(E);
      std::iota(perm.begin(), perm.end(), 0);
      if (skewed) {  // expert 0 on every token, expert 1 on token 0 only
        std::shuffle(perm.begin() + 2, perm.end(), rng);
        if (t != 0) std::swap(perm[1], perm[k]);
      } else {
        std::shuffle(perm.begin(), perm.end(), rng);
      }
      std::copy_n(perm.begin(), k, run.ids.begin() + t * k);
    }
    run.x = activations(rng, T, D, T % 2 == 1);
    run.xd = activations(rng, T * k, F, T % 2 == 1);

    DeviceBuf<int> dids(run.ids);
    DeviceBuf<int> scratch(size_t(moe_group_ints(T, E, k)));
    const MoeGroups g = moe_groups_view(scratch.p, T, E, k);
    moe_group(dids.p, T, E, k, kMatmulTileTokens, g, nullptr);
    DeviceBuf<float> dx(run.x), dxd(run.xd);
    const auto dxp = prepared_x(dx.p, D, T, D), dxdp = prepared_x(dxd.p, F, T * k, F);
    MatmulArgs a;
    set_tiles(a, g, moe_max_tiles(T, E, k));
    for (int variant = 0; variant <= int(std::size(kTensorCoreTiles)) * 2; ++variant) {
      const bool legacy = variant == int(std::size(kTensorCoreTiles)) * 2;
      const MatmulTile tile = legacy ? MatmulTile::tc_bf16 : kTensorCoreTiles[variant / 2];
      const bool xp = !legacy && variant % 2 == 1;
      if (!matmul_tile_fits(tile, xp)) continue;  // shared memory this device lacks (sm_86/89/120)
      const std::string label = std::string(tile_name(tile)) + (xp ? " prepared x" : "");
      DeviceBuf<float> yg(size_t(T * k * F)), yd(size_t(T * k * D)), ys(size_t(T * k * F));
      a.w = dgate.d;
      a.x = dx.p;
      a.x_prep = xp ? dxp->p : nullptr;
      a.x_prep_cols = D;
      a.ldx = D;
      a.gather = g.sorted_token;
      a.y = yg.p;
      a.ldy = F;
      matmul(a, nullptr, tile);
      a.y = ys.p;
      matmul_swiglu(a, dup.d, nullptr, tile);
      a.w = ddown.d;
      a.x = dxd.p;
      a.x_prep = xp ? dxdp->p : nullptr;
      a.x_prep_cols = F;
      a.ldx = F;
      a.gather = nullptr;
      a.y = yd.p;
      a.ldy = D;
      matmul(a, nullptr, tile);
      if (legacy) {
        run.l_gate = yg.host();
        run.l_down = yd.host();
        run.l_swiglu = ys.host();
      } else if (variant == 0) {
        run.y_gate = yg.host();
        run.y_down = yd.host();
        run.y_swiglu = ys.host();
      } else {  // every block shape and both x sources sum each output in the same order
        expect_close(ys.host(), run.y_swiglu, 1e-6f * rms_of(run.y_swiglu), 0.0f,
                     "grouped swiglu " + run.name + " " + label + " vs auto");
        expect_close(yg.host(), run.y_gate, 1e-6f * rms_of(run.y_gate), 0.0f,
                     "grouped gate " + run.name + " " + label + " vs auto");
        expect_close(yd.host(), run.y_down, 1e-6f * rms_of(run.y_down), 0.0f,
                     "grouped down " + run.name + " " + label + " vs auto");
      }
    }
    run.pos_of.resize(size_t(T * k));
    TERN_CUDA(cudaMemcpy(run.pos_of.data(), g.pos_of, run.pos_of.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<int> sorted(run.pos_of);
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], int(i)) << "moe_group positions are not a permutation";
    run.ref_gate.assign(run.y_gate.size(), 0.0f);
    run.ref_down.assign(run.y_down.size(), 0.0f);
    run.ref_swiglu.assign(run.y_swiglu.size(), 0.0f);
  }

  // fp32 references expert by expert, every run's rows of that expert.
  for (int e = 0; e < E; ++e) {
    const Matrix ge = gate->m.expert(e), de = down->m.expert(e), ue = up->m.expert(e);
    for (GroupedRun& run : runs) {
      std::vector<int> pairs;
      for (size_t i = 0; i < run.ids.size(); ++i)
        if (run.ids[i] == e) pairs.push_back(int(i));
      if (pairs.empty()) continue;
      const int64_t n = int64_t(pairs.size());
      std::vector<float> xg(size_t(n * D)), xdg(size_t(n * F));
      for (int64_t p = 0; p < n; ++p) {
        const int i = pairs[size_t(p)], pos = run.pos_of[size_t(i)];
        std::copy_n(run.x.begin() + (i / k) * D, D, xg.begin() + p * D);
        std::copy_n(run.xd.begin() + int64_t(pos) * F, F, xdg.begin() + p * F);
      }
      const auto rg = cpu_product(ge, xg, n), rd = cpu_product(de, xdg, n);
      const auto rs = swiglu_of(rg, cpu_product(ue, xg, n));
      for (int64_t p = 0; p < n; ++p) {
        const int64_t pos = run.pos_of[size_t(pairs[size_t(p)])];
        std::copy_n(rg.begin() + p * F, F, run.ref_gate.begin() + pos * F);
        std::copy_n(rd.begin() + p * D, D, run.ref_down.begin() + pos * D);
        std::copy_n(rs.begin() + p * F, F, run.ref_swiglu.begin() + pos * F);
      }
    }
  }
  for (const GroupedRun& run : runs) {
    expect_product(run.y_gate, run.ref_gate, F, "grouped gate " + run.name);
    expect_product(run.y_down, run.ref_down, D, "grouped down " + run.name);
    expect_product(run.y_swiglu, run.ref_swiglu, F, "grouped swiglu " + run.name, kSwigluRms, kSwigluWorst);
    if (!matmul_tile_fits(MatmulTile::tc_bf16, false)) continue;  // not run on this device
    expect_product(run.l_gate, run.ref_gate, F, "grouped gate tc_bf16 " + run.name, kLegacyRms, kLegacyWorst);
    expect_product(run.l_down, run.ref_down, D, "grouped down tc_bf16 " + run.name, kLegacyRms, kLegacyWorst);
    expect_product(run.l_swiglu, run.ref_swiglu, F, "grouped swiglu tc_bf16 " + run.name, 1e-2, 1e-1);
  }
}

}  // namespace
}  // namespace tern::cuda::test
