// The GPU sampler (src/cuda/kernels/sampling/sampling.cu) against an exact host reference of the distribution it must
// draw from: every sampled id must lie in the kept set, and empirical frequencies over many (seed, step) draws must
// match the reference probabilities (individually for the likely ids, in groups of equal mass for the rest). Cuts are
// placed in the middle of one id's mass so that float-vs-double rounding cannot move them. Covers the full vocabulary,
// crowded histogram bins (the exact fallback over all logits), ties, non-finite logits, odd sizes, a misaligned
// pointer, multi-chunk vocabularies and replay of a captured CUDA graph with new parameters.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../cuda_test_util.h"
#include "cuda/kernels/sampling/sampling.cuh"

namespace tern::cuda::test {
namespace {

constexpr int64_t kV = 248320, kReal = 248077;
constexpr float kInf = std::numeric_limits<float>::infinity();

std::string describe(const DeviceSampling& s) {
  std::ostringstream o;
  o << "(T " << s.temperature << ", top_k " << s.top_k << ", top_p " << s.top_p << ", min_p " << s.min_p << ")";
  return o.str();
}

// Ids of the finite logits, largest logit first, lower id first on ties.
std::vector<int64_t> ranked(const std::vector<float>& l) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < int64_t(l.size()); ++i)
    if (std::isfinite(l[size_t(i)])) ids.push_back(i);
  std::sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) {
    return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b);
  });
  return ids;
}

// Unnormalised p = exp((l − max)/T) of the ranked ids, restricted to the top-k set (ties at the k-th value kept).
std::vector<double> topk_masses(const std::vector<float>& l, const std::vector<int64_t>& order, float T, int top_k) {
  const double mx = l[size_t(order[0])];
  double cut = -std::numeric_limits<double>::infinity();
  if (top_k > 0 && size_t(top_k) < order.size()) cut = l[size_t(order[size_t(top_k - 1)])];
  std::vector<double> p;
  for (int64_t i : order) {
    if (double(l[size_t(i)]) < cut) break;
    p.push_back(std::exp((double(l[size_t(i)]) - mx) / double(T)));
  }
  return p;
}

// The distribution sample_token draws from, normalised over [n]; 0 for ids it never draws.
std::vector<double> reference(const std::vector<float>& l, const DeviceSampling& s) {
  std::vector<double> out(l.size(), 0.0);
  const auto order = ranked(l);
  if (order.empty()) {
    out[0] = 1.0;
    return out;
  }
  if (!(s.temperature > 0.0f) || s.top_k == 1) {
    out[size_t(order[0])] = 1.0;
    return out;
  }
  const auto p = topk_masses(l, order, s.temperature, s.top_k);
  size_t keep = p.size();  // a prefix of `order`
  if (s.top_p < 1.0f) {
    const double need = double(s.top_p) * std::accumulate(p.begin(), p.end(), 0.0);
    double acc = 0.0;
    for (size_t j = 0; j < p.size(); ++j) {
      acc += p[j];
      if (acc >= need) {
        keep = j + 1;
        while (keep < p.size() && l[size_t(order[keep])] == l[size_t(order[j])]) ++keep;  // ties kept
        break;
      }
    }
  }
  double z = 0.0;
  for (size_t j = 0; j < keep; ++j)
    if (p[j] >= double(s.min_p)) z += p[j];
  for (size_t j = 0; j < keep; ++j)
    if (p[j] >= double(s.min_p)) out[size_t(order[j])] = p[j] / z;
  return out;
}

// A top_p whose cut falls in the middle of the mass of the rank-th id (1-based) of the top-k set; fails the test
// when that id's mass is too small for the cut to be unambiguous under float rounding.
float top_p_cutting_at(const std::vector<float>& l, float T, int top_k, size_t rank) {
  const auto order = ranked(l);
  const auto p = topk_masses(l, order, T, top_k);
  if (rank < 1 || rank > p.size()) {
    ADD_FAILURE() << "rank " << rank << " outside the top-k set of " << p.size();
    return 0.5f;
  }
  const double z = std::accumulate(p.begin(), p.end(), 0.0);
  const double before = std::accumulate(p.begin(), p.begin() + std::ptrdiff_t(rank - 1), 0.0);
  EXPECT_GT(p[rank - 1] / z, 2e-6) << "cut id too light for an unambiguous top_p";
  return float((before + 0.5 * p[rank - 1]) / z);
}

// A min_p halfway (geometrically) between the p of the ids at ranks r and r + 1 (1-based).
float min_p_between(const std::vector<float>& l, float T, size_t r) {
  const auto order = ranked(l);
  const double mx = l[size_t(order[0])];
  const double a = std::exp((l[size_t(order[r - 1])] - mx) / double(T)), b = std::exp((l[size_t(order[r])] - mx) / double(T));
  EXPECT_GT(a / b, 1.01) << "ranks " << r << " and " << r + 1 << " too close for an unambiguous min_p";
  return float(std::sqrt(a * b));
}

// The first rank (1-based) at or after `from` whose id carries at least `frac` of the top-k mass.
size_t heavy_rank_from(const std::vector<float>& l, float T, int top_k, size_t from, double frac) {
  const auto order = ranked(l);
  const auto p = topk_masses(l, order, T, top_k);
  const double z = std::accumulate(p.begin(), p.end(), 0.0);
  for (size_t r = from; r <= p.size(); ++r)
    if (p[r - 1] / z >= frac) return r;
  ADD_FAILURE() << "no id heavy enough after rank " << from;
  return from;
}

// The rank whose running mass first reaches `frac` of the top-k mass.
size_t rank_at_mass(const std::vector<float>& l, float T, int top_k, double frac) {
  const auto order = ranked(l);
  const auto p = topk_masses(l, order, T, top_k);
  const double z = std::accumulate(p.begin(), p.end(), 0.0);
  double acc = 0.0;
  for (size_t j = 0; j < p.size(); ++j) {
    acc += p[j];
    if (acc >= frac * z) return j + 1;
  }
  return p.size();
}

// Draws `draws` ids with steps 0.., asserts each lies in the reference's support, then compares frequencies: the ids
// with probability >= 1% one by one, the rest in up to 8 groups of about equal mass (5 binomial sd + 3).
void check_draws(const float* dlogits, int64_t n, const std::vector<double>& ref, const DeviceSampling& base,
                 int draws, float* scratch, int* out, const std::string& what) {
  std::vector<int> hits(size_t(n), 0);
  for (int d = 0; d < draws; ++d) {
    DeviceSampling s = base;
    s.step = uint64_t(d);
    sample_token(dlogits, n, s, scratch, out, nullptr);
    int id = -1;
    TERN_CUDA(cudaMemcpy(&id, out, sizeof(int), cudaMemcpyDeviceToHost));
    ASSERT_TRUE(id >= 0 && id < n) << what << ": sampled id " << id << " " << describe(s);
    ASSERT_GT(ref[size_t(id)], 0.0) << what << ": sampled id " << id << " is outside the kept set " << describe(s);
    ++hits[size_t(id)];
  }
  std::vector<int64_t> support;
  for (int64_t i = 0; i < n; ++i)
    if (ref[size_t(i)] > 0) support.push_back(i);
  std::sort(support.begin(), support.end(), [&](int64_t a, int64_t b) { return ref[size_t(a)] > ref[size_t(b)]; });
  auto expect_group = [&](double prob, int got, const std::string& name) {
    const double want = draws * prob, sd = std::sqrt(draws * prob * (1 - prob));
    EXPECT_NEAR(got, want, 5 * sd + 3) << what << ": " << name << " " << describe(base);
  };
  size_t j = 0;
  for (; j < support.size() && ref[size_t(support[j])] >= 0.01; ++j)
    expect_group(ref[size_t(support[j])], hits[size_t(support[j])], "id " + std::to_string(support[j]));
  double rest = 0;
  for (size_t k = j; k < support.size(); ++k) rest += ref[size_t(support[k])];
  const double group_mass = rest / 8;
  double mass = 0;
  int got = 0, groups = 0;
  for (size_t k = j; k < support.size(); ++k) {
    mass += ref[size_t(support[k])];
    got += hits[size_t(support[k])];
    if (mass >= group_mass || k + 1 == support.size()) {
      expect_group(mass, got, "group " + std::to_string(groups++) + " of light ids");
      mass = 0;
      got = 0;
    }
  }
}

// Background uniform in [lo, hi) over [0, real), a head of `head` ids at 10 − 0.25·r (± 0.02), padding at +50
// (masked to -inf by mask_padding before sampling).
std::vector<float> head_logits(std::mt19937_64& rng, int64_t n, int64_t real, int head, float lo, float hi) {
  auto l = random_floats(rng, size_t(n), lo, hi);
  std::vector<int64_t> ids(static_cast<size_t>(real));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::uniform_real_distribution<float> jitter(-0.02f, 0.02f);
  for (int r = 0; r < head; ++r) l[size_t(ids[size_t(r)])] = 10.0f - 0.25f * float(r) + jitter(rng);
  for (int64_t i = real; i < n; ++i) l[size_t(i)] = 50.0f;
  return l;
}

std::vector<float> masked(std::vector<float> l, int64_t real) {
  for (size_t i = size_t(real); i < l.size(); ++i) l[i] = -kInf;
  return l;
}

int sample_once(const float* dlogits, int64_t n, const DeviceSampling& s, float* scratch, int* out) {
  sample_token(dlogits, n, s, scratch, out, nullptr);
  int id = -1;
  TERN_CUDA(cudaMemcpy(&id, out, sizeof(int), cudaMemcpyDeviceToHost));
  return id;
}

TEST(CudaSampling, FullVocabularyMatchesReference) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaSampling.FullVocabularyMatchesReference"));
  const auto raw = head_logits(rng, kV, kReal, 40, -6.0f, 2.0f);
  DeviceBuf<float> dl(raw), scratch(size_t(sample_scratch_floats(kV)));
  DeviceBuf<int> out(1);
  mask_padding(dl.p, 1, kV, kReal, nullptr);
  const auto l = dl.host();
  ASSERT_EQ(l, masked(raw, kReal));

  std::vector<DeviceSampling> cases;
  // top-k 20, top-p cutting inside the head: the first excluded ids are heavy, so a wrong cut shows.
  cases.push_back({.temperature = 0.7f, .top_k = 20, .top_p = top_p_cutting_at(l, 0.7f, 20, 12)});
  // top-p alone reaching deep into the background (tens of thousands of kept ids).
  cases.push_back({.temperature = 1.0f,
                   .top_p = top_p_cutting_at(l, 1.0f, 0, heavy_rank_from(l, 1.0f, 0, rank_at_mass(l, 1.0f, 0, 0.85), 3e-6))});
  // min-p alone, between two head ids (gaps of ~0.25 in the logit).
  cases.push_back({.temperature = 1.3f, .min_p = min_p_between(l, 1.3f, 6)});
  // A large top-k with top-p cutting far above the k-th id: the k and p cuts lie in different bins.
  cases.push_back({.temperature = 1.0f, .top_k = 2000, .top_p = top_p_cutting_at(l, 1.0f, 2000, 15)});
  // Everything at once; plain temperature.
  cases.push_back({.temperature = 0.9f, .top_k = 30, .top_p = top_p_cutting_at(l, 0.9f, 30, 9),
                   .min_p = min_p_between(l, 0.9f, 5)});
  cases.push_back({.temperature = 1.0f});
  const uint64_t seed = rng();
  for (DeviceSampling s : cases) {
    s.seed = seed;
    SCOPED_TRACE(describe(s));
    check_draws(dl.p, kV, reference(l, s), s, 3000, scratch.p, out.p, "full vocabulary");
  }

  // Greedy, with a tie for the max: the lowest id wins.
  auto tied = raw;
  const auto order = ranked(masked(raw, kReal));
  const int64_t a = std::min(order[0], order[1]), b = std::max(order[0], order[1]);
  tied[size_t(a)] = tied[size_t(b)] = 12.5f;
  DeviceBuf<float> dt(tied);
  mask_padding(dt.p, 1, kV, kReal, nullptr);
  EXPECT_EQ(sample_once(dt.p, kV, DeviceSampling{}, scratch.p, out.p), a) << "greedy with a tie";
  EXPECT_EQ(sample_once(dt.p, kV, DeviceSampling{.temperature = 0.8f, .top_k = 1}, scratch.p, out.p), a)
      << "top_k 1 is greedy";
}

TEST(CudaSampling, TiesAtTheCutsAreKept) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaSampling.TiesAtTheCutsAreKept"));
  auto l = masked(head_logits(rng, kV, kReal, 12, -6.0f, 0.0f), kReal);
  const auto order = ranked(l);
  for (int r = 3; r <= 6; ++r) l[size_t(order[size_t(r)])] = 8.5f;  // ranks 3..6 tied
  DeviceBuf<float> dl(l), scratch(size_t(sample_scratch_floats(kV)));
  DeviceBuf<int> out(1);
  const uint64_t seed = rng();
  // k = 4 falls on the tie: all 7 ids kept. Then top-p with its cut inside the tie group.
  for (DeviceSampling s : {DeviceSampling{.temperature = 1.0f, .top_k = 4},
                           DeviceSampling{.temperature = 1.0f, .top_k = 10, .top_p = top_p_cutting_at(l, 1.0f, 10, 5)}}) {
    s.seed = seed;
    const auto ref = reference(l, s);
    int kept = 0;
    for (double p : ref) kept += p > 0;
    EXPECT_EQ(kept, 7) << "reference kept set " << describe(s);
    check_draws(dl.p, kV, ref, s, 3000, scratch.p, out.p, "ties");
  }
}

TEST(CudaSampling, CrowdedBinsSelectExactlyOverAllLogits) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaSampling.CrowdedBinsSelectExactlyOverAllLogits"));
  // 60,000 ids within 2e-3 of each other (many exact ties), the rest far below: one histogram bin holds far more
  // ids than the candidate list, so the cuts are found by the exact selection over all logits.
  std::vector<float> l(size_t(kV), -30.0f);
  std::vector<int64_t> ids(static_cast<size_t>(kReal));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::uniform_real_distribution<float> near(1.0f, 1.002f);
  for (size_t r = 0; r < 60000; ++r) l[size_t(ids[r])] = near(rng);
  for (int64_t i = kReal; i < kV; ++i) l[size_t(i)] = -kInf;
  DeviceBuf<float> dl(l), scratch(size_t(sample_scratch_floats(kV)));
  DeviceBuf<int> out(1);
  const uint64_t seed = rng();
  for (DeviceSampling s : {DeviceSampling{.temperature = 1.0f, .top_k = 100},
                           DeviceSampling{.temperature = 1.0f, .top_k = 30000},
                           DeviceSampling{.temperature = 1.0f, .top_p = top_p_cutting_at(l, 1.0f, 0, 20000)},
                           DeviceSampling{.temperature = 1.0f, .top_k = 50000, .top_p = top_p_cutting_at(l, 1.0f, 50000, 9000)}}) {
    s.seed = seed;
    check_draws(dl.p, kV, reference(l, s), s, 3000, scratch.p, out.p, "crowded bin");
  }
}

TEST(CudaSampling, NonFiniteOddSizesAndMisalignment) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaSampling.NonFiniteOddSizesAndMisalignment"));
  DeviceBuf<float> scratch(size_t(sample_scratch_floats(kV)));
  DeviceBuf<int> out(1);
  const uint64_t seed = rng();
  const float nan = std::numeric_limits<float>::quiet_NaN();

  // One id.
  {
    DeviceBuf<float> d(std::vector<float>{0.25f});
    EXPECT_EQ(sample_once(d.p, 1, DeviceSampling{}, scratch.p, out.p), 0);
    EXPECT_EQ(sample_once(d.p, 1, DeviceSampling{.temperature = 1.0f, .top_p = 0.5f, .seed = seed}, scratch.p, out.p), 0);
  }
  // Five ids behind a misaligned pointer (no 16-byte loads), a tie for the max.
  {
    const std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f, -kInf};
    std::vector<float> host = {7.0f};
    host.insert(host.end(), l.begin(), l.end());
    DeviceBuf<float> d(host);
    EXPECT_EQ(sample_once(d.p + 1, 5, DeviceSampling{}, scratch.p, out.p), 1) << "greedy, lowest id of the tie";
    for (DeviceSampling s : {DeviceSampling{.temperature = 1.0f, .top_k = 2}, DeviceSampling{.temperature = 2.0f},
                             DeviceSampling{.temperature = 0.5f, .top_p = 0.75f}}) {
      s.seed = seed;
      check_draws(d.p + 1, 5, reference(l, s), s, 2000, scratch.p, out.p, "five misaligned ids");
    }
  }
  // NaN and +inf are never sampled; nothing finite gives id 0.
  {
    std::vector<float> l(size_t(kV), -kInf);
    l[100] = nan;
    l[200] = kInf;
    l[300] = 1.0f;
    l[400] = 2.0f;
    l[kV - 5] = 1.5f;
    DeviceBuf<float> d(l);
    EXPECT_EQ(sample_once(d.p, kV, DeviceSampling{}, scratch.p, out.p), 400);
    check_draws(d.p, kV, reference(l, DeviceSampling{.temperature = 1.0f}), DeviceSampling{.temperature = 1.0f, .seed = seed},
                2000, scratch.p, out.p, "sparse finite");
    DeviceBuf<float> none(std::vector<float>(1000, -kInf));
    EXPECT_EQ(sample_once(none.p, 1000, DeviceSampling{}, scratch.p, out.p), 0);
    EXPECT_EQ(sample_once(none.p, 1000, DeviceSampling{.temperature = 1.0f, .top_k = 5, .seed = seed}, scratch.p, out.p), 0);
  }
  // Odd sizes: below one chunk, a few chunks, and beyond 256·2048 (chunks of 4096).
  for (int64_t n : {int64_t(13), int64_t(6001), int64_t(600001)}) {
    const auto l = head_logits(rng, n, n, int(std::min<int64_t>(n, 30)), -6.0f, 2.0f);
    DeviceBuf<float> d(l);
    const auto order = ranked(l);
    EXPECT_EQ(sample_once(d.p, n, DeviceSampling{}, scratch.p, out.p), order[0]) << "greedy, n " << n;
    const int k = n > 20 ? 20 : 5;
    DeviceSampling s{.temperature = 0.8f, .top_k = k, .top_p = top_p_cutting_at(l, 0.8f, k, 4), .seed = seed};
    check_draws(d.p, n, reference(l, s), s, 2000, scratch.p, out.p, "n " + std::to_string(n));
  }
}

TEST(CudaSampling, GraphReplayWithNewParametersMatchesDirectCalls) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaSampling.GraphReplayWithNewParametersMatchesDirectCalls"));
  const auto l = masked(head_logits(rng, kV, kReal, 40, -6.0f, 2.0f), kReal);
  DeviceBuf<float> dl(l), scratch(size_t(sample_scratch_floats(kV)));
  DeviceBuf<int> out(1);
  cudaStream_t stream;
  TERN_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TERN_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  sample_token_device(dl.p, kV, scratch.p, out.p, stream);
  TERN_CUDA(cudaStreamEndCapture(stream, &graph));
  TERN_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const uint64_t seed = rng();
  std::vector<DeviceSampling> params = {DeviceSampling{}, DeviceSampling{.temperature = 0.7f, .top_k = 20, .top_p = 0.95f},
                                        DeviceSampling{.temperature = 1.0f, .top_p = 0.9f},
                                        DeviceSampling{.temperature = 1.0f, .min_p = 0.05f}, DeviceSampling{}};
  int differing = 0;
  for (const DeviceSampling& p : params)
    for (uint64_t step = 0; step < 25; ++step) {
      DeviceSampling s = p;
      s.seed = seed;
      s.step = step;
      TERN_CUDA(cudaMemcpy(sample_params_slot(scratch.p, kV), &s, sizeof(s), cudaMemcpyHostToDevice));
      TERN_CUDA(cudaGraphLaunch(exec, stream));
      TERN_CUDA(cudaStreamSynchronize(stream));
      int from_graph = -1;
      TERN_CUDA(cudaMemcpy(&from_graph, out.p, sizeof(int), cudaMemcpyDeviceToHost));
      const int direct = sample_once(dl.p, kV, s, scratch.p, out.p);
      EXPECT_EQ(from_graph, direct) << "graph replay vs direct call, step " << step << " " << describe(s);
      EXPECT_EQ(sample_once(dl.p, kV, s, scratch.p, out.p), direct) << "not deterministic " << describe(s);
      differing += direct != int(ranked(l)[0]);
    }
  EXPECT_GT(differing, 0) << "sampling never left the arg-max";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Several rows sampled by one sample_tokens_device launch (the batched decode step's sessions), each with its own
// logits and parameters (greedy, temperature with top-k / top-p / min-p, seeds and steps; one row of all -inf, one
// with ties at the top), give the ids each row gets alone; repeated over steps so that the draws differ.
TEST(CudaSampling, RowsOfOneLaunchMatchEachRowAlone) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaSampling.RowsOfOneLaunchMatchEachRowAlone"));
  const int rows = 7;
  const int64_t stride = (sample_scratch_floats(kV) + 63) / 64 * 64 + 64;  // not the minimum: the stride is honoured
  std::vector<float> all;
  for (int r = 0; r < rows; ++r) {
    std::vector<float> l = masked(head_logits(rng, kV, kReal, 10 + 10 * r, -6.0f, 2.0f), kReal);
    if (r == 3) std::fill(l.begin(), l.end(), -kInf);
    if (r == 5) l[17] = l[1234] = *std::max_element(l.begin(), l.end()) + 1.0f;  // a tie at the top
    all.insert(all.end(), l.begin(), l.end());
  }
  DeviceBuf<float> dl(all), scratch(size_t(rows * stride)), alone(size_t(sample_scratch_floats(kV)));
  DeviceBuf<int> out(static_cast<size_t>(rows)), one(1);
  const std::vector<DeviceSampling> kinds = {DeviceSampling{},
                                             DeviceSampling{.temperature = 0.7f, .top_k = 20, .top_p = 0.95f},
                                             DeviceSampling{.temperature = 1.0f, .top_p = 0.9f},
                                             DeviceSampling{.temperature = 1.0f, .min_p = 0.05f},
                                             DeviceSampling{.temperature = 1.3f},
                                             DeviceSampling{.temperature = 0.8f, .top_k = 2},
                                             DeviceSampling{.temperature = 1.0f, .top_k = 1}};
  int differing = 0;
  for (uint64_t step = 0; step < 20; ++step) {
    std::vector<DeviceSampling> p(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      p[size_t(r)] = kinds[size_t((r + int(step)) % rows)];
      p[size_t(r)].seed = rng();
      p[size_t(r)].step = step;
      TERN_CUDA(cudaMemcpy(sample_params_slot(scratch.p + r * stride, kV), &p[size_t(r)], sizeof(DeviceSampling),
                           cudaMemcpyHostToDevice));
    }
    sample_tokens_device(dl.p, kV, rows, scratch.p, stride, out.p, nullptr);
    TERN_CUDA(cudaDeviceSynchronize());
    const std::vector<int> got = out.host();
    for (int r = 0; r < rows; ++r) {
      const int want = sample_once(dl.p + r * kV, kV, p[size_t(r)], alone.p, one.p);
      EXPECT_EQ(got[size_t(r)], want) << "row " << r << ", step " << step << " " << describe(p[size_t(r)]);
      differing += r != 3 && want != int(ranked(std::vector<float>(all.begin() + r * kV, all.begin() + (r + 1) * kV))[0]);
    }
  }
  EXPECT_GT(differing, 0) << "sampling never left the arg-max";
  EXPECT_THROW(sample_tokens_device(dl.p, kV, 2, scratch.p, sample_scratch_floats(kV) - 4, out.p, nullptr), tern::Error);
}

}  // namespace
}  // namespace tern::cuda::test
