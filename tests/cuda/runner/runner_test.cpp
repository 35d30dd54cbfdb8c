// The whole CUDA forward pass: against the CPU runner on the same random weights (real widths, reduced depth),
// prefill against token-by-token decode, device sampling against the logits. whole_model_test.cpp holds the checks
// against transformers' logits (TERN_GPU_REF_DIR).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "core/npy.h"
#include "cpu/cpu_runner.h"
#include "cuda/runner/cuda_runner.h"
#include "cuda/kernels/qmatmul/qmatmul_wgmma.cuh"
#include "cuda/kernels/qmv/qmv_dp4a_mma.cuh"
#include "../cuda_test_util.h"
#include "fidelity_util.h"
#include "random_model.h"
#include "engine/demo_model.h"

namespace tern::cuda::test {
namespace {

TEST(CudaRunner, MatchesCpuRunnerPrefillDecodeAndSampling) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaRunner");
  RandomModel rm;
  const int64_t V = 4096;
  auto weights = random_model(seed, 4, V, rm);
  std::mt19937_64 rng(seed ^ 0x1234);
  const int64_t n = 48;
  const auto tokens = random_tokens(rng, n, weights->vocab_real);

  auto cpu = cpu_runner_create(weights);
  // 2 chunks: the chunk seam too. The exact prefill products (16-bit x), held to fp32-level bounds; the fp16 ones of
  // the default Hopper plan are held to the bounds below (Fp16PrefillWithinTheFidelityBounds).
  auto gpu = cuda_runner_create(weights, {.max_chunk = 32, .progress = false, .exact_prefill = true});
  auto cs = cpu->create_session(256);
  auto gs = gpu->create_session(256);
  std::vector<float> ref, got;
  cpu->forward(*cs, tokens, true, ref);
  gpu->forward(*gs, tokens, true, got);
  ASSERT_EQ(got.size(), size_t(n * V));
  EXPECT_EQ(gs->position(), n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = weights->vocab_real; j < V; ++j)
      ASSERT_TRUE(std::isinf(got[size_t(i * V + j)])) << "padding id " << j << " not masked";
  const Fidelity f = compare_logits(ref, got, tokens, V, weights->vocab_real);
  std::printf("[cuda vs cpu] ppl %.5f vs %.5f, KL %.3g, top-1 %.3f, max |dlogit| %.4g\n", f.ppl, f.ppl_ref, f.kl, f.top1,
              f.max_abs);
  // The only intended difference is the fp16 KV cache (fp32 on the CPU) and summation order.
  EXPECT_LT(std::fabs(f.ppl / f.ppl_ref - 1.0), 1e-3);
  EXPECT_LT(f.kl, 1e-4);

  // Prefill logits agree with token-by-token decode logits (the decode plan: fused kernels, integer products on
  // 24-bit activations, the MoE's on 16-bit): the same distributions (KL) and arg-max; at the median position every logit within 1% of
  // the largest, and none off by 5%. (Not every position within 1%: seed 5013674590490602982 gives, deterministically
  // on the H200, KL 2.0e-5, top-1 100% and max |dlogit| 0.136 of 11.8, against ~0.01 for 10 other seeds; likely,
  // not established, a near-tie of two experts' router probabilities that the two plans' rounding breaks apart.)
  auto ds = gpu->create_session(256);
  std::vector<float> step, dec(size_t(n * V));
  double scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    gpu->forward(*ds, std::span(tokens).subspan(size_t(i), 1), false, step);
    std::copy(step.begin(), step.end(), dec.begin() + i * V);
    for (int64_t j = 0; j < weights->vocab_real; ++j) scale = std::max(scale, double(std::fabs(got[size_t(i * V + j)])));
  }
  const Fidelity pd = compare_logits(got, dec, tokens, V, weights->vocab_real);
  std::vector<double> pos_max(static_cast<size_t>(n), 0.0);  // max |dlogit| of each position
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < weights->vocab_real; ++j)
      pos_max[size_t(i)] = std::max(pos_max[size_t(i)], double(std::fabs(got[size_t(i * V + j)] - dec[size_t(i * V + j)])));
  std::nth_element(pos_max.begin(), pos_max.begin() + n / 2, pos_max.end());
  const double median_max = pos_max[size_t(n / 2)];
  std::printf("[prefill vs decode] KL %.3g, top-1 %.3f, max |dlogit| %.3g, median position's %.3g (max |logit| %.3g)\n",
              pd.kl, pd.top1, pd.max_abs, median_max, scale);
  EXPECT_LE(pd.kl, 1e-4);
  EXPECT_GE(pd.top1, 0.97);
  EXPECT_LT(median_max, 1e-2 * scale + 1e-4);
  EXPECT_LT(pd.max_abs, 5e-2 * scale + 1e-4);

  // Greedy device sampling returns the arg-max of the same step's logits; one more token on both paths.
  auto s1 = gpu->create_session(256);
  auto s2 = gpu->create_session(256);
  std::vector<float> last;
  gpu->forward(*s1, tokens, false, last);
  const auto id = gpu->forward_sample(*s2, tokens, DeviceSampling{});
  ASSERT_TRUE(id.has_value());
  const int32_t want = int32_t(std::max_element(last.begin(), last.begin() + weights->vocab_real) - last.begin());
  EXPECT_EQ(*id, want);
  EXPECT_EQ(s2->position(), n);
  // Single-token steps replay a CUDA graph bound to the session; interleaving a second session forces a
  // re-capture. Each sampled id equals the arg-max of forward()'s logits for the same step.
  auto s3 = gpu->create_session(256);
  int32_t next = *id;
  for (int step = 0; step < 6; ++step) {
    const std::vector<int32_t> one = {next};
    gpu->forward(*s1, one, false, last);
    const int32_t want_step = int32_t(std::max_element(last.begin(), last.begin() + weights->vocab_real) - last.begin());
    const auto got_step = gpu->forward_sample(*s2, one, DeviceSampling{.seed = 5, .step = uint64_t(step)});
    ASSERT_TRUE(got_step.has_value());
    EXPECT_EQ(*got_step, want_step) << "decode step " << step;
    if (step % 2 == 0) (void)gpu->forward_sample(*s3, one, DeviceSampling{});  // other session in between
    next = want_step;
  }
  EXPECT_EQ(s2->position(), n + 6);
  EXPECT_EQ(s3->position(), 3);

  // Capacity errors throw and consume nothing.
  auto small = gpu->create_session(8);
  EXPECT_THROW(gpu->forward(*small, tokens, false, last), Error);
  EXPECT_EQ(small->position(), 0);
  const std::vector<int32_t> bad = {int32_t(V)};
  EXPECT_THROW(gpu->forward(*small, bad, false, last), Error);
}

// The fp16 prefill inputs on Hopper (the 4-bit products on the warpgroup kernel with x to 11 significant bits; an
// option)
// against the CPU runner and against the decode plan, at the bounds of the issue (mean KL ≤ 1e-3, perplexity within
// 0.5%) rather than the exact plan's fp32-level ones above.
TEST(CudaRunner, Fp16PrefillWithinTheFidelityBounds) {
  TERN_REQUIRE_GPU();
  if (!matmul_wgmma_available()) GTEST_SKIP() << "the fp16 prefill products run on Hopper GPUs only";
  const uint64_t seed = fresh_seed("CudaRunner.Fp16");
  RandomModel rm;
  const int64_t V = 4096;
  auto weights = random_model(seed, 4, V, rm);
  std::mt19937_64 rng(seed ^ 0x5678);
  const int64_t n = 96;
  const auto tokens = random_tokens(rng, n, weights->vocab_real);
  auto cpu = cpu_runner_create(weights);
  // 96 tokens: below the default floor under which chunks take the exact products, so the floor is set to 0 here;
  // the fp16 inputs are an option (off by default), every site but the GDN in_proj takes them here.
  auto gpu = cuda_runner_create(weights, {.progress = false, .f16_min_tokens = 0, .f16_sites = 30});
  auto cs = cpu->create_session(256);
  auto gs = gpu->create_session(256);
  std::vector<float> ref, got;
  cpu->forward(*cs, tokens, true, ref);
  gpu->forward(*gs, tokens, true, got);
  const Fidelity f = compare_logits(ref, got, tokens, V, weights->vocab_real);
  std::printf("[fp16 prefill vs cpu] ppl %.5f vs %.5f, KL %.3g, top-1 %.3f, max |dlogit| %.4g\n", f.ppl, f.ppl_ref,
              f.kl, f.top1, f.max_abs);
  EXPECT_LT(std::fabs(f.ppl / f.ppl_ref - 1.0), 5e-3);
  EXPECT_LE(f.kl, 1e-3);
  {  // the default floor (512 tokens): this 96-token prompt takes the exact products, closer to the CPU runner
    auto exact = cuda_runner_create(weights, {.progress = false, .f16_sites = 30});
    auto es = exact->create_session(256);
    std::vector<float> eg;
    exact->forward(*es, tokens, true, eg);
    const Fidelity fe = compare_logits(ref, eg, tokens, V, weights->vocab_real);
    std::printf("[short prompt, default floor, vs cpu] KL %.3g, top-1 %.3f, max |dlogit| %.4g\n", fe.kl, fe.top1,
                fe.max_abs);
    EXPECT_LT(fe.kl, f.kl) << "a short prompt did not take the exact products";
    EXPECT_LT(fe.kl, 1e-4);
  }
  auto ds = gpu->create_session(256);
  std::vector<float> step, dec(size_t(n * V));
  for (int64_t i = 0; i < n; ++i) {
    gpu->forward(*ds, std::span(tokens).subspan(size_t(i), 1), false, step);
    std::copy(step.begin(), step.end(), dec.begin() + i * V);
  }
  const Fidelity pd = compare_logits(got, dec, tokens, V, weights->vocab_real);
  std::printf("[fp16 prefill vs decode] KL %.3g, top-1 %.3f, max |dlogit| %.3g\n", pd.kl, pd.top1, pd.max_abs);
  EXPECT_LE(pd.kl, 1e-3);
}

// The prefill products' x past bf16 hi + lo against the CPU runner: the GDN in_proj's x as fp16 hi + lo
// (prefill_pair_sites = 1, 22 bits) and every site's (31), each against bf16 hi + lo everywhere (0). Each runs (other
// logits than bf16 hi + lo's) and stays within the exact plan's bound; every site on fp16 hi + lo takes the logits
// closer to the CPU's (mean |Δlogit| over every position and id, a statistic one near-tie does not move much) than bf16
// hi + lo and than the GDN's site alone. One site alone is not asked to: in this small model the other sites' 16-bit x
// dominates the error (H100, 48th session: the GDN's site alone read 4.61e-5 and 4.09e-5 against bf16 hi + lo's
// 4.29e-5 and 4.60e-5; every site 2.94e-5 and 2.89e-5). The i16 cache (whose default, 15, is set aside here),
// so that the fp16 cache's rounding does not hide the products'.
TEST(CudaRunner, WiderXTakesThePrefillCloserToTheCpu) {
  TERN_REQUIRE_GPU();
  if (!matmul_wgmma_available()) GTEST_SKIP() << "the wider forms of x run on Hopper GPUs only";
  for (const char* plan : {"TERN_CUDA_FP32", "TERN_PREFILL_WGMMA", "TERN_PREFILL_INT8", "TERN_PREFILL_F16_SITES"})
    if (const char* e = std::getenv(plan); e && *e) GTEST_SKIP() << plan << " is set: another prefill plan";
  const uint64_t seed = fresh_seed("CudaRunner.WiderX");
  RandomModel rm;
  const int64_t V = 4096;
  auto weights = random_model(seed, 4, V, rm);  // the easy router: no expert choice flips, the error stays continuous
  std::mt19937_64 rng(seed ^ 0x2424);
  const int64_t n = 200;  // past the short-call threshold: one prefill-plan chunk
  const auto tokens = random_tokens(rng, n, weights->vocab_real);
  auto cpu = cpu_runner_create(weights);
  auto cs = cpu->create_session(256);
  std::vector<float> ref;
  cpu->forward(*cs, tokens, true, ref);
  struct Form {
    const char* name;
    int pair_sites;
  };
  const Form forms[] = {{"bf16 hi + lo", 0},
                        {"the GDN in_proj on fp16 hi + lo", 1},
                        {"every site on fp16 hi + lo", 31}};
  constexpr int kForms = int(std::size(forms));
  std::vector<float> got[kForms];
  double mean_abs[kForms] = {};
  for (int i = 0; i < kForms; ++i) {
    auto gpu = cuda_runner_create(weights,
                                  {.progress = false, .prefill_pair_sites = forms[i].pair_sites, .kv = KvDtype::i16});
    auto gs = gpu->create_session(256);
    gpu->forward(*gs, tokens, true, got[i]);
    ASSERT_EQ(got[i].size(), ref.size());
    const Fidelity f = compare_logits(ref, got[i], tokens, V, weights->vocab_real);
    double sum = 0;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t j = 0; j < weights->vocab_real; ++j)
        sum += std::fabs(double(got[i][size_t(p * V + j)]) - double(ref[size_t(p * V + j)]));
    mean_abs[i] = sum / double(n * weights->vocab_real);
    std::printf("[%s vs cpu] ppl %.5f vs %.5f, KL %.3g, top-1 %.3f, max |dlogit| %.4g, mean %.4g\n", forms[i].name,
                f.ppl, f.ppl_ref, f.kl, f.top1, f.max_abs, mean_abs[i]);
    EXPECT_LT(f.kl, 1e-4) << forms[i].name;
  }
  for (int i = 1; i < kForms; ++i) EXPECT_NE(got[0], got[i]) << forms[i].name << " changed nothing: it did not run";
  EXPECT_LT(mean_abs[2], mean_abs[0]) << "every site on fp16 hi + lo did not take the logits closer to the CPU's";
  EXPECT_LT(mean_abs[2], mean_abs[1]) << "every site on fp16 hi + lo is not closer to the CPU than the GDN's alone";
}

// The built-in demo model (what `tern serve` runs without -m): small head dims (64), 16 experts top-4.
TEST(CudaRunner, DemoModelMatchesCpuRunner) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaRunner.Demo");
  auto weights = demo_model_build({.seed = seed});
  std::mt19937_64 rng(seed);
  const auto tokens = random_tokens(rng, 70, weights->vocab_real);
  auto cpu = cpu_runner_create(weights);
  auto gpu = cuda_runner_create(weights, {.progress = false, .exact_prefill = true});
  auto cs = cpu->create_session(128);
  auto gs = gpu->create_session(128);
  std::vector<float> ref, got;
  cpu->forward(*cs, tokens, true, ref);
  gpu->forward(*gs, tokens, true, got);
  const int64_t V = weights->config.vocab_size;
  const Fidelity f = compare_logits(ref, got, tokens, V, weights->vocab_real);
  std::printf("[demo cuda vs cpu] ppl %.5f vs %.5f, KL %.3g (median %.3g), top-1 %.3f, max |dlogit| %.4g\n", f.ppl,
              f.ppl_ref, f.kl, f.median_kl, f.top1, f.max_abs);
  // The demo's router picks 4 of 16 experts: where two logits nearly tie, the GPU's rounding (8-bit activations)
  // can pick the other expert. On the H200 about 1 seed in 7 did (mean KL 1.9e-4, ppl off by 0.13-0.25%; the other
  // seeds 4-5e-7), before and after the 2026-12-02 attn_prepare rewrite alike. So the mean is held to the fidelity
  // bar of the real model (1e-3) and the median position, which one flip does not move, to 1e-5.
  EXPECT_LT(std::fabs(f.ppl / f.ppl_ref - 1.0), 5e-3);
  EXPECT_LT(f.kl, 1e-3);
  EXPECT_LT(f.median_kl, 1e-5);
  // a few decode steps through the graph path agree with forward()
  std::vector<float> last;
  for (int step = 0; step < 3; ++step) {
    const std::vector<int32_t> one = {tokens[size_t(step)]};
    cpu->forward(*cs, one, false, last);
    const int32_t want = int32_t(std::max_element(last.begin(), last.begin() + weights->vocab_real) - last.begin());
    const auto id = gpu->forward_sample(*gs, one, DeviceSampling{});
    ASSERT_TRUE(id.has_value());
    EXPECT_EQ(*id, want) << "demo decode step " << step;
  }
}

// Every default plan against the CPU runner (the exact reference) on a model at trained scales: a prefill long enough
// for the fp16 threshold (f16_min_tokens) were the fp16 inputs turned on, one token per call (the integer products), 8 tokens per call (the
// tensor-core products of the multi-token step). Mean KL over positions is dominated by rare near-tie flips of expert choices,
// which any rounding (fp32 sums in another order too) makes now and then, so it is held to the milestone (2e-3); the
// rounding itself is held where no flip has happened yet: the residual after layer 0, median position, within 3e-5
// of the CPU's (measured on the H200: 1e-5 prefill, 1.6e-5 decode, 1e-6 for 8 tokens; 16-bit activations in the
// one-token products reach 7e-5, fp16 prefill inputs 2e-4).
TEST(CudaRunner, DefaultPlansMatchCpuRunnerOnTrainedScales) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaRunner.Trained");
  RandomModel rm;
  const int64_t V = 4096;
  auto weights = random_model(seed, 4, V, rm, Scales::trained);
  std::mt19937_64 rng(seed ^ 0x9abc);
  const int64_t n = 576, D = weights->config.hidden_size;
  const auto tokens = random_tokens(rng, n, weights->vocab_real);
  const auto root =
      std::filesystem::temp_directory_path() / std::string("tern-trained-").append(std::to_string(seed));
  auto cpu = cpu_runner_create(weights);
  cpu->set_activation_dump_dir((root / "cpu").string());
  auto cs = cpu->create_session(n);
  std::vector<float> ref;
  cpu->forward(*cs, tokens, true, ref);
  const std::vector<float> want = npy_read(root / "cpu" / "layer_out.0.npy").f32;
  auto gpu = cuda_runner_create(weights, {.progress = false});
  for (const int64_t step : {n, int64_t(1), int64_t(8)}) {
    const auto dir = root / std::string("gpu").append(std::to_string(step));
    gpu->set_activation_dump_dir(dir.string());
    auto gs = gpu->create_session(n);
    std::vector<float> got(size_t(n * V)), part;
    for (int64_t i = 0; i < n; i += step) {
      gpu->forward(*gs, std::span(tokens).subspan(size_t(i), size_t(std::min(step, n - i))), true, part);
      std::copy(part.begin(), part.end(), got.begin() + i * V);
    }
    gpu->set_activation_dump_dir("");
    const std::vector<float> layer0 = npy_read(dir / "layer_out.0.npy").f32;
    ASSERT_EQ(layer0.size(), want.size());
    const double median_error = relative_error(layer0, want, D).second;
    const Fidelity f = compare_logits(ref, got, tokens, V, weights->vocab_real);
    std::printf("[cuda vs cpu, trained scales] %lld tokens per call: layer 0 error %.3g (median position), ppl %+.4f%%, "
                "KL %.3g (median %.3g), top-1 %.4f\n",
                static_cast<long long>(step), median_error, 100.0 * (f.ppl / f.ppl_ref - 1.0), f.kl, f.median_kl,
                f.top1);
    EXPECT_LE(median_error, 3e-5) << step << " tokens per call";
    EXPECT_LE(f.kl, 2e-3) << step << " tokens per call";
  }
  std::filesystem::remove_all(root);
}


// Batch invariance (issue 31): 16 sessions of mixed prompt lengths and capacities (different attention split counts)
// generate alone (forward_sample per step) and then together (forward_batch), half greedy and half sampled with a
// seed, on a model at trained scales (a 4,096-token vocabulary of near-uniform logits: any difference in a logit
// shows as another token before long). The batches change from step to step (sessions skip rounds), so each session
// runs among different others at different batch sizes. Every session must produce the same ids, and the steps must
// have run through the batched kernels. producer_tables: qmv_dp4a_set_producer_tables for the runner (set before it
// is made: its graphs keep the setting they were captured with).
void expect_batched_step_matches_alone(bool producer_tables) {
  const bool saved = qmv_dp4a_producer_tables();
  qmv_dp4a_set_producer_tables(producer_tables);
  struct Restore {
    bool on;
    ~Restore() { qmv_dp4a_set_producer_tables(on); }
  } restore{saved};
  const uint64_t seed = fresh_seed("CudaRunner.Batched");
  RandomModel rm;
  const int64_t V = 4096;
  auto weights = random_model(seed, 8, V, rm, Scales::trained);
  auto gpu = cuda_runner_create(weights, {.progress = false});
  std::mt19937_64 rng(seed ^ 0x5eed);
  constexpr int kSessions = 16, kNew = 20;
  const int64_t prompt_lengths[kSessions] = {1, 2, 7, 8, 9, 17, 63, 64, 65, 100, 128, 200, 257, 300, 31, 5};
  const int64_t capacities[kSessions] = {64, 256, 512, 4096, 70000, 1024, 300, 2048, 8192, 512, 640, 16384, 1000, 600,
                                         128, 32};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<DeviceSampling> sampling(kSessions);
  for (int i = 0; i < kSessions; ++i) {
    prompts.push_back(random_tokens(rng, prompt_lengths[i], weights->vocab_real));
    if (i % 2 == 1) sampling[size_t(i)] = {.temperature = 0.8f, .top_p = 0.95f, .seed = seed + uint64_t(i)};
  }
  // Alone: the first new id from the prompt's own forward_sample, then one token per call.
  std::vector<std::vector<int32_t>> alone(kSessions);
  for (int i = 0; i < kSessions; ++i) {
    auto s = gpu->create_session(capacities[i]);
    DeviceSampling p = sampling[size_t(i)];
    int32_t next = *gpu->forward_sample(*s, prompts[size_t(i)], p);
    alone[size_t(i)].push_back(next);
    for (int k = 1; k < kNew; ++k) {
      p.step = uint64_t(k);
      next = *gpu->forward_sample(*s, std::span(&next, 1), p);
      alone[size_t(i)].push_back(next);
    }
  }
  // Together: the same first ids from the prompts (run alone, as the scheduler runs prompt chunks), then rounds of
  // forward_batch over the sessions still generating, each skipping every fourth round at its own phase.
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<std::vector<int32_t>> together(kSessions);
  std::vector<DeviceSampling> params = sampling;
  for (int i = 0; i < kSessions; ++i) {
    sessions.push_back(gpu->create_session(capacities[i]));
    together[size_t(i)].push_back(*gpu->forward_sample(*sessions.back(), prompts[size_t(i)], params[size_t(i)]));
  }
  const int64_t batched_before = cuda_runner_batched_steps(*gpu);
  std::vector<int32_t> inputs(kSessions);
  for (int round = 0;; ++round) {
    std::vector<BatchEntry> batch;
    std::vector<int> who;
    for (int i = 0; i < kSessions; ++i) {
      if (int(together[size_t(i)].size()) >= kNew || (round + i) % 4 == 0) continue;
      inputs[size_t(i)] = together[size_t(i)].back();
      params[size_t(i)].step = together[size_t(i)].size();
      BatchEntry e;
      e.session = sessions[size_t(i)].get();
      e.tokens = std::span(&inputs[size_t(i)], 1);
      e.sampling = &params[size_t(i)];
      batch.push_back(e);
      who.push_back(i);
    }
    if (batch.empty()) {
      if (std::all_of(together.begin(), together.end(), [](const auto& t) { return int(t.size()) >= kNew; })) break;
      continue;
    }
    gpu->forward_batch(batch);
    for (size_t j = 0; j < batch.size(); ++j) {
      ASSERT_FALSE(batch[j].error) << "session " << who[j];
      ASSERT_TRUE(batch[j].sampled.has_value()) << "session " << who[j];
      together[size_t(who[j])].push_back(*batch[j].sampled);
    }
  }
  EXPECT_GT(cuda_runner_batched_steps(*gpu) - batched_before, kNew / 2) << "the rounds did not run batched";
  for (int i = 0; i < kSessions; ++i)
    EXPECT_EQ(together[size_t(i)], alone[size_t(i)]) << "session " << i << " (prompt " << prompt_lengths[i]
                                                       << ", capacity " << capacities[i] << ", "
                                                       << (i % 2 ? "sampled" : "greedy") << ")";
  // A full session among the others fails alone and leaves the others' steps whole.
  auto full = gpu->create_session(2);
  std::vector<float> logits;
  gpu->forward(*full, std::vector<int32_t>{1, 2}, false, logits);
  int32_t t0 = 3, t1 = 4;
  DeviceSampling greedy;
  std::vector<BatchEntry> batch(2);
  batch[0].session = full.get();
  batch[0].tokens = std::span(&t0, 1);
  batch[0].sampling = &greedy;
  batch[1].session = sessions[0].get();
  batch[1].tokens = std::span(&t1, 1);
  batch[1].sampling = &greedy;
  gpu->forward_batch(batch);
  EXPECT_TRUE(batch[0].error);
  EXPECT_FALSE(batch[1].error);
  EXPECT_TRUE(batch[1].sampled.has_value());
}

// The default: the kernels before the batched products write their activation tables (producer tables).
TEST(CudaRunner, BatchedStepGivesEverySessionItsTokensAlone) {
  TERN_REQUIRE_GPU();
  expect_batched_step_matches_alone(true);
}

// TERN_QMV_PRODUCER_TABLES=0: each product's own pre-quantising kernel.
TEST(CudaRunner, BatchedStepWithoutProducerTablesGivesEverySessionItsTokensAlone) {
  TERN_REQUIRE_GPU();
  expect_batched_step_matches_alone(false);
}

}  // namespace
}  // namespace tern::cuda::test
