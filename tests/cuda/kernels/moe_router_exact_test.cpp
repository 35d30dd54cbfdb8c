// The prefill plan's exact router (issue 29) against its CPU twin: the fp32 router product (cpu::matmul on x itself)
// and cpu::moe_route. The 8-bit router runs on the integer kernel twice: on x in 16 bits per group of 64, then
// accumulating on the residual quantised again (matmul_quantize_x's residual). The sum must be the fp32 product to
// fp32 summation, and every token must route to the CPU's experts but where the CPU's own two logits lie within
// fp32 summation of each other. The one-term product's error is reported beside it (it swapped experts at near-ties).
#include <algorithm>
#include <cmath>

#include "cpu/ops_moe.h"
#include "cuda/kernels/moe/moe.cuh"
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

// The largest |got − want| over all elements, relative to the rms of want.
double worst_relative(const std::vector<float>& got, const std::vector<float>& want) {
  double ss = 0, worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ss += double(want[i]) * want[i];
    worst = std::max(worst, std::fabs(double(got[i]) - double(want[i])));
  }
  return worst / (std::sqrt(ss / double(want.size())) + 1e-30);
}

TEST(CudaMoeRouterExact, TwoTermXRoutesAsFp32) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMoeRouterExact"));
  const int E = 256, k = 8;
  const int64_t D = 2048, T = 2048;
  auto h = random_matrix(rng, WeightFormat::affine8, 1, E, D);
  DeviceMatrix dm(*h);
  ASSERT_TRUE(matmul_int8_takes(dm.d));
  // Half the tokens plain, half with a per-token scale and outlier columns (wide groups: a coarser 16-bit x).
  std::vector<float> x = activations(rng, T / 2, D, false), ranged = activations(rng, T / 2, D, true);
  x.insert(x.end(), ranged.begin(), ranged.end());
  const std::vector<float> want = cpu_product(h->m, x, T);
  const std::vector<int32_t> want_ids = cpu_route(want, T, E, k);

  DeviceBuf<float> dx(x), dy(size_t(T * E));
  DeviceBuf<unsigned char> xq(size_t(matmul_q16_bytes(T, D))), rest(size_t(matmul_q16_bytes(T, D)));
  matmul_quantize_x(dx.p, D, T, D, xq.p, nullptr, rest.p);
  MatmulArgs a = dense_args(dm.d, dx.p, dy.p, T);
  a.x_q16 = xq.p;
  a.x_q16_cols = D;
  matmul(a, nullptr);
  const std::vector<float> one_term = dy.host();
  a.x_q16 = rest.p;
  a.accumulate = true;
  matmul(a, nullptr);
  const std::vector<float> got = dy.host();
  expect_product(got, want, E, "two-term router product against fp32 on x");

  DeviceBuf<int> ids(size_t(T * k));
  DeviceBuf<float> w(size_t(T * k));
  moe_route(dy.p, T, E, k, ids.p, w.p, nullptr);
  const std::vector<int> got_ids = ids.host();
  const std::vector<int32_t> one_term_ids = cpu_route(one_term, T, E, k);
  int64_t one_term_other = 0, other = 0, fp32_ties = 0;
  for (int64_t t = 0; t < T; ++t) {
    const size_t r = size_t(t * E);
    one_term_other += !same_set(&one_term_ids[size_t(t * k)], &want_ids[size_t(t * k)], k);
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
  const double err_one = worst_relative(one_term, want), err_two = worst_relative(got, want);
  std::printf("[router exact] %lld tokens: worst error / rms %.2e with x in one 16-bit term, %.2e in two; experts "
              "other than fp32's: %lld with one term, %lld with two (%lld at fp32 ties)\n",
              static_cast<long long>(T), err_one, err_two, static_cast<long long>(one_term_other),
              static_cast<long long>(other + fp32_ties), static_cast<long long>(fp32_ties));
  EXPECT_LT(err_two * 8, err_one) << "the second term must take the product well past the 16-bit rounding";
  EXPECT_LE(fp32_ties, 2);
}

}  // namespace
}  // namespace tern::cuda::test
