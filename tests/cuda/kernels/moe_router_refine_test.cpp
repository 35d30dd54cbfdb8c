// moe_router_refine (issue 29) against its CPU twin: the fp32 router product (cpu::matmul) and cpu::moe_route. The
// 8-bit router's logits come from the integer kernel (x in 16 bits per group of 64), then the refine recomputes in
// fp32 the tokens whose k-th and (k+1)-th logits lie within that rounding's bound. Every token must then route to
// the CPU's experts (but where the CPU's own two logits lie within fp32 summation of each other), the recomputed
// rows must be the fp32 product, and the rest untouched; the refine must be selective (it is on the prefill's path).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/ops_moe.h"
#include "cuda/kernels/moe/moe.cuh"
#include "cuda/kernels/moe/moe_router_refine.cuh"
#include "cuda/kernels/qmatmul/qmatmul_int8.cuh"
#include "matmul_test_util.h"

namespace tern::cuda::test {
namespace {

std::vector<int32_t> cpu_route(const std::vector<float>& logits, int64_t T, int E, int k) {
  std::vector<int32_t> ids(size_t(T * k));
  std::vector<float> w(size_t(T * k));
  cpu::moe_route({.logits = logits.data(), .T = T, .E = E, .k = k, .ids = ids.data(), .weights = w.data()});
  return ids;
}

bool same_set(const int32_t* a, const int32_t* b, int k) {
  std::vector<int32_t> x(a, a + k), y(b, b + k);
  std::sort(x.begin(), x.end());
  std::sort(y.begin(), y.end());
  return x == y;
}

// The gap between a row's k-th and (k+1)-th largest values.
float kth_gap(const float* row, int E, int k) {
  std::vector<float> v(row, row + E);
  std::partial_sort(v.begin(), v.begin() + k + 1, v.end(), std::greater<float>());
  return v[size_t(k - 1)] - v[size_t(k)];
}

TEST(CudaMoeRouterRefine, NearTiesTakeTheFp32Choice) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMoeRouterRefine"));
  const int E = 256, k = 8;
  const int64_t D = 2048, T = 2048, G = D / 64;
  auto h = random_matrix(rng, WeightFormat::affine8, 1, E, D);
  DeviceMatrix dm(*h);
  ASSERT_TRUE(moe_router_refine_takes(dm.d));
  // Half the tokens plain, half with a per-token scale and outlier columns (wide groups: a coarser 16-bit x).
  std::vector<float> x = activations(rng, T / 2, D, false), ranged = activations(rng, T / 2, D, true);
  x.insert(x.end(), ranged.begin(), ranged.end());
  const std::vector<float> want = cpu_product(h->m, x, T);
  const std::vector<int32_t> want_ids = cpu_route(want, T, E, k);

  // The bounds against their twin: the largest Σ |w| over the rows in each group of 64 columns.
  std::vector<float> twin_bounds(size_t(G), 0.0f);
  {
    const int64_t row_words = h->m.row_words(), groups = h->m.groups_per_row();
    for (int e = 0; e < E; ++e) {
      for (int64_t g = 0; g < G; ++g) {
        const float sc = bf16_to_float(h->scales[size_t(e * groups + g)]);
        const float bi = bf16_to_float(h->biases[size_t(e * groups + g)]);
        float s = 0.0f;
        for (int64_t j = g * 64; j < g * 64 + 64; ++j) {  // 8-bit: four columns per word, lowest byte first
          const uint32_t q = (h->words[size_t(e * row_words + j / 4)] >> (8 * (j % 4))) & 255u;
          s += std::fabs(sc * float(q) + bi);
        }
        twin_bounds[size_t(g)] = std::max(twin_bounds[size_t(g)], s);
      }
    }
  }
  DeviceBuf<float> bounds(static_cast<size_t>(G));
  router_group_bounds(dm.d, bounds.p, nullptr);
  expect_close(bounds.host(), twin_bounds, 1e-5f, 1e-6f, "group bounds");

  DeviceBuf<float> dx(x), dy(size_t(T * E));
  DeviceBuf<unsigned char> dxq(size_t(matmul_q16_bytes(T, D)));
  matmul_quantize_x(dx.p, D, T, D, dxq.p, nullptr);
  MatmulArgs a = dense_args(dm.d, dx.p, dy.p, T);
  a.x_q16 = dxq.p;
  a.x_q16_cols = D;
  matmul(a, nullptr);
  const std::vector<float> q16 = dy.host();
  DeviceBuf<int> refined(std::vector<int>{0});
  moe_router_refine(dx.p, D, dm.d, bounds.p, dy.p, T, k, refined.p, nullptr);
  const std::vector<float> got = dy.host();
  DeviceBuf<int> ids(size_t(T * k));
  DeviceBuf<float> w(size_t(T * k));
  moe_route(dy.p, T, E, k, ids.p, w.p, nullptr);
  const std::vector<int> got_ids = ids.host();
  const std::vector<int32_t> q16_ids = cpu_route(q16, T, E, k);

  int64_t recomputed = 0, q16_other = 0, other = 0, fp32_ties = 0;
  for (int64_t t = 0; t < T; ++t) {
    const size_t r = size_t(t * E);
    const bool changed = std::memcmp(&got[r], &q16[r], size_t(E) * 4) != 0;
    if (changed) {
      ++recomputed;
      std::vector<float> g(got.begin() + ptrdiff_t(r), got.begin() + ptrdiff_t(r) + E);
      std::vector<float> want_row(want.begin() + ptrdiff_t(r), want.begin() + ptrdiff_t(r) + E);
      expect_product(g, want_row, E, "recomputed token " + std::to_string(t));
    }
    q16_other += !same_set(&q16_ids[size_t(t * k)], &want_ids[size_t(t * k)], k);
    if (!same_set(reinterpret_cast<const int32_t*>(&got_ids[size_t(t * k)]), &want_ids[size_t(t * k)], k)) {
      const float gap = kth_gap(&want[r], E, k);
      if (gap < 1e-5f * std::max(1.0f, std::fabs(want[r]))) {
        ++fp32_ties;
      } else {
        ++other;
        ADD_FAILURE() << "token " << t << " routes to other experts than the CPU's (its fp32 gap " << gap << ")";
      }
    }
  }
  const int n_refined = refined.host()[0];
  std::printf("[router refine] %lld tokens: the integer router alone picks other experts than fp32 for %lld; %d "
              "recomputed; after the refine %lld differ (%lld at fp32 ties)\n",
              static_cast<long long>(T), static_cast<long long>(q16_other), n_refined,
              static_cast<long long>(other + fp32_ties), static_cast<long long>(fp32_ties));
  EXPECT_EQ(n_refined, recomputed) << "a recomputed row must differ from the integer product's";
  EXPECT_GT(n_refined, 0) << "no near-tie among " << T << " tokens: the test does not reach the refine";
  EXPECT_LT(n_refined, T / 4) << "the refine recomputes too many tokens to stay cheap";
  EXPECT_LE(fp32_ties, 2);
}

TEST(CudaMoeRouterRefine, RefusesRoutersItCannotBound) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMoeRouterRefine.Refuses"));
  auto h = random_matrix(rng, WeightFormat::affine8, 1, 256, 2048);
  DeviceMatrix dm(*h);
  DMat odd = dm.d;
  odd.cols = 2000;  // not a multiple of 64
  EXPECT_FALSE(moe_router_refine_takes(odd));
  DeviceBuf<float> b(64), x(size_t(4 * 2048)), l(size_t(4 * 256));
  EXPECT_THROW(router_group_bounds(odd, b.p, nullptr), Error);
  EXPECT_THROW(moe_router_refine(x.p, 2048, dm.d, b.p, l.p, 4, 256, nullptr, nullptr), Error);  // k = E
}

}  // namespace
}  // namespace tern::cuda::test
