// Token masks on the GPU (constrained decoding): the kernel of src/cuda/kernels/token_mask/token_mask.cu against its
// host twin (tern::apply_token_mask, bit for bit, over odd sizes, short masks and non-finite logits), and the CUDA
// runner's forward_sample with a DeviceSampling::mask: every id it returns is allowed, greedy steps return the arg-max
// of the allowed logits of forward() on the same inputs (the eager first step and the graph steps), and steps without a
// mask in between still match the unmasked path.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/cpu_runner.h"
#include "cuda/kernels/token_mask/token_mask.cuh"
#include "cuda/runner/cuda_runner.h"
#include "../cuda_test_util.h"
#include "engine/demo_model.h"
#include "engine/token_mask.h"

namespace tern::cuda::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<uint32_t> random_mask(std::mt19937_64& rng, int64_t words, double density) {
  std::bernoulli_distribution bit(density);
  std::vector<uint32_t> m(size_t(words), 0u);
  for (auto& w : m)
    for (int b = 0; b < 32; ++b)
      if (bit(rng)) w |= 1u << b;
  return m;
}

TEST(TokenMask, KernelMatchesHostTwin) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("TokenMask.Kernel"));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (int64_t V : {int64_t(1), int64_t(31), int64_t(33), int64_t(1000), int64_t(151669), int64_t(248320)}) {
    for (double density : {0.0, 0.001, 0.5, 1.0}) {
      for (int64_t missing_words : {int64_t(0), int64_t(1)}) {  // 1: the mask is a word short of V
        const int64_t words = std::max<int64_t>(0, (V + 31) / 32 - missing_words);
        auto logits = random_floats(rng, size_t(V), -20.0f, 20.0f);
        for (int64_t i = 0; i < V; i += 97) logits[size_t(i)] = (i % 3 == 0) ? -kInf : (i % 3 == 1 ? kInf : NAN);
        const auto mask = random_mask(rng, std::max<int64_t>(words, 1), density);
        std::vector<float> want = logits;
        apply_token_mask(want, std::span(mask).first(size_t(words)));

        float* d_logits = nullptr;
        uint32_t* d_mask = nullptr;
        ASSERT_EQ(cudaMalloc(&d_logits, size_t(V) * 4), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&d_mask, std::max<size_t>(1, size_t(words)) * 4), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(d_logits, logits.data(), size_t(V) * 4, cudaMemcpyHostToDevice), cudaSuccess);
        if (words > 0) {
          ASSERT_EQ(cudaMemcpy(d_mask, mask.data(), size_t(words) * 4, cudaMemcpyHostToDevice), cudaSuccess);
        }
        token_mask_apply(d_logits, V, d_mask, words, stream);
        std::vector<float> got(static_cast<size_t>(V));
        ASSERT_EQ(cudaMemcpyAsync(got.data(), d_logits, size_t(V) * 4, cudaMemcpyDeviceToHost, stream), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        cudaFree(d_logits);
        cudaFree(d_mask);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), size_t(V) * 4), 0)
            << "V " << V << ", density " << density << ", words " << words;
        for (int64_t i = 0; i < V; ++i)
          if (!token_mask_allows(std::span(mask).first(size_t(words)), i)) {
            ASSERT_EQ(got[size_t(i)], -kInf) << "id " << i << " is masked, V " << V;
          }
      }
    }
  }
  cudaStreamDestroy(stream);
}

std::vector<int32_t> some_tokens(std::mt19937_64& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int32_t> id(0, int32_t(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = id(rng);
  return t;
}

// A mask source that allows a fixed random subset; counts its calls. `off` steps return no mask.
class SubsetMask final : public TokenMaskSource {
 public:
  SubsetMask(std::mt19937_64& rng, int64_t vocab_real, int n_allowed) : words_(size_t((vocab_real + 31) / 32), 0u) {
    std::uniform_int_distribution<int64_t> id(0, vocab_real - 1);
    while (int(allowed_.size()) < n_allowed) {
      const int64_t i = id(rng);
      if (token_mask_allows(words_, i)) continue;
      words_[size_t(i / 32)] |= 1u << (i % 32);
      allowed_.push_back(int32_t(i));
    }
  }
  std::span<const uint32_t> fill() override {
    ++calls;
    if (off) return {};
    return words_;
  }
  bool allows(int32_t id) const { return token_mask_allows(words_, id); }
  int calls = 0;
  bool off = false;
  std::vector<uint32_t> words_;
  std::vector<int32_t> allowed_;
};

TEST(TokenMask, ForwardSampleHonoursTheMask) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("TokenMask.ForwardSample");
  std::mt19937_64 rng(seed);
  auto weights = demo_model_build({.seed = seed});
  const int64_t Vr = weights->vocab_real;
  auto gpu = cuda_runner_create(weights, {.progress = false});
  SubsetMask mask(rng, Vr, 40);
  const auto tokens = some_tokens(rng, 20, Vr);

  auto ref = gpu->create_session(128);  // forward() logits of the same inputs
  auto s = gpu->create_session(128);
  std::vector<float> last;
  gpu->forward(*ref, tokens, false, last);
  const auto masked_argmax = [&](const std::vector<float>& l) {
    int32_t best = -1;
    for (int32_t i = 0; i < int32_t(Vr); ++i)
      if (mask.allows(i) && std::isfinite(l[size_t(i)]) && (best < 0 || l[size_t(i)] > l[size_t(best)])) best = i;
    return best;
  };
  // Prefill (eager path) with the mask.
  auto id = gpu->forward_sample(*s, tokens, DeviceSampling{.mask = &mask});
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(*id, masked_argmax(last));
  EXPECT_EQ(mask.calls, 1);
  // Decode steps: the first eager, then the forward-only graph; an unmasked step and a step whose source gives no
  // mask in between (the full graph / no upload), then masked again.
  int32_t next = *id;
  for (int step = 0; step < 8; ++step) {
    const std::vector<int32_t> one = {next};
    gpu->forward(*ref, one, false, last);
    const bool unmasked = step == 3, source_off = step == 5;
    mask.off = source_off;
    const int32_t want = unmasked || source_off
                             ? int32_t(std::max_element(last.begin(), last.begin() + Vr) - last.begin())
                             : masked_argmax(last);
    const auto got = gpu->forward_sample(*s, one, DeviceSampling{.mask = unmasked ? nullptr : &mask});
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(*got, want) << "decode step " << step;
    if (!unmasked && !source_off) {
      EXPECT_TRUE(mask.allows(*got)) << "decode step " << step;
    }
    next = *got;
  }
  mask.off = false;
  // Sampled steps (temperature 1, several seeds): always an allowed id.
  for (int step = 0; step < 16; ++step) {
    const std::vector<int32_t> one = {next};
    const auto got = gpu->forward_sample(
        *s, one, DeviceSampling{.temperature = 1.0f, .seed = seed + 1, .step = uint64_t(step), .mask = &mask});
    ASSERT_TRUE(got.has_value());
    EXPECT_TRUE(mask.allows(*got)) << "sampled step " << step << " gave id " << *got;
    next = *got;
  }
}

}  // namespace
}  // namespace tern::cuda::test
