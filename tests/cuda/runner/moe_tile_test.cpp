// TERN_MOE_TILE_TOKENS: the prefill plan's grouped expert tiles of at most 16, 32 or 64 tokens (and auto's choice)
// give the same bits of every logit. On Hopper the warpgroup kernel then runs blocks of 16, 32 or 64 tokens, which
// sum each output in the same order (matmul_wgmma_test checks the products alone); elsewhere the other kernels take
// the narrow tiles on their 64-token blocks.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "../cuda_test_util.h"
#include "cuda/runner/cuda_runner.h"
#include "random_model.h"

namespace tern::cuda::test {
namespace {

// Sets an environment variable for its lifetime (the runner reads its switches when it is made), then restores the
// previous value or its absence.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::unique_ptr<ModelRunner> runner_with_tiles(std::shared_ptr<const ModelWeights> weights, const char* width,
                                               int f16_sites) {
  const ScopedEnv env("TERN_MOE_TILE_TOKENS", width);
  return cuda_runner_create(std::move(weights), {.progress = false, .f16_min_tokens = 0, .f16_sites = f16_sites});
}

// Elements whose bits differ (NaN against NaN included).
int64_t bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], 4) != 0 || std::isnan(a[i]);
  return d;
}

// A 200-token prefill (one prefill-plan chunk: 200·8/256 = 6.25 tokens per expert, auto's 16) on a model at trained
// scales (router near-ties: a difference upstream would flip experts), on the default inputs (bf16 hi + lo) and with
// the MoE's inputs in fp16 (sites 8 + 16). "64" last again: a difference there would be the runner's own
// nondeterminism, not the widths'.
TEST(CudaRunner, MoeTileWidthsGiveTheSameLogits) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaRunner.MoeTileTokens");
  RandomModel rm;
  const int64_t V = 4096, n = 200;
  auto weights = random_model(seed, 4, V, rm, Scales::trained);
  std::mt19937_64 rng(seed ^ 0x7117);
  const auto tokens = random_tokens(rng, n, weights->vocab_real);
  for (const int f16_sites : {0, 24}) {
    std::vector<float> want;
    for (const char* width : {"64", "16", "32", "auto", "64"}) {
      auto gpu = runner_with_tiles(weights, width, f16_sites);
      auto s = gpu->create_session(256);
      std::vector<float> got;
      gpu->forward(*s, tokens, true, got);
      ASSERT_EQ(got.size(), size_t(n * V));
      if (want.empty()) {
        want = std::move(got);
        continue;
      }
      EXPECT_EQ(bit_differences(got, want), 0) << "TERN_MOE_TILE_TOKENS=" << width << " against 64, f16 sites "
                                                << f16_sites << ": logits that differ";
    }
  }
  EXPECT_THROW(runner_with_tiles(weights, "8", 0), Error) << "a width the kernels do not take";
}

}  // namespace
}  // namespace tern::cuda::test
