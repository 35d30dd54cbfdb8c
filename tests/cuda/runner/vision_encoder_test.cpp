// The vision encoder on the GPU (cuda/runner/vision_plan.cuh, CudaRunner::encode_image) against the CPU encoder
// (cpu::vision_encode, which matches transformers' Qwen3_5MoeVisionModel in fp32) on random weights, and the time of
// a 1024 x 1024 image at Qwen3.6's widths.
//
// Expected error: the GPU rounds the products' inputs to bf16 (the norms' outputs, q, k, v, the softmax weights, the
// attention output, fc1's activations: 2^-9 relative each) and keeps the residual stream and every accumulator in
// fp32; the matrices are the same bf16 values on both sides (the demo's F32 ones are rounded at upload, a further
// 2^-9 per weight). Measured as ‖gpu − cpu‖₂ / ‖cpu‖₂ over the whole output: a few 1e-3, not growing much with
// depth (LayerNorm rescales each block's input; H200: 3.7e-3 at the real widths over 27 blocks, ~5e-3 at the demo's
// with its F32 weights rounded); asserted at 1e-2 for the real widths and 1.5e-2 for the demo's, with every element
// within 15% of the output's largest magnitude (an indexing error moves elements by ~100% of it).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>
#include <random>
#include <vector>

#include "../cuda_test_util.h"
#include "cpu/vision_encoder.h"
#include "cuda/runner/cuda_runner.h"
#include "cuda/runner/vision_plan.cuh"
#include "engine/demo_vision.h"
#include "model/vision_weights.h"
#include "random_model.h"

namespace tern::cuda::test {
namespace {

// The demo model's vision widths (engine/demo_vision.cpp): 2 blocks of width 64, 4 heads of 16.
VisionConfig demo_widths(int64_t out_hidden) {
  VisionConfig c;
  c.depth = 2;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_heads = 4;
  c.out_hidden_size = out_hidden;
  c.num_position_embeddings = 64;
  return c;
}

// Qwen3.6-35B-A3B's vision tower (config.h's defaults; the LM width of its config.json).
VisionConfig real_widths() {
  VisionConfig c;
  c.out_hidden_size = 2048;
  return c;
}

struct Bf16Storage : WeightStorage {
  std::deque<std::vector<uint16_t>> data;
};

// The same weights with every matrix in bf16 (as Qwen3.6's checkpoint stores them).
std::shared_ptr<const VisionWeights> with_bf16_matrices(const VisionWeights& w) {
  auto out = std::make_shared<VisionWeights>(w);
  auto storage = std::make_shared<Bf16Storage>();
  auto convert = [&](Matrix& m) {
    ASSERT_EQ(m.format, WeightFormat::f32);
    std::vector<uint16_t>& bits = storage->data.emplace_back(size_t(m.rows * m.cols));
    const float* f = static_cast<const float*>(m.data);
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = float_to_bf16(f[i]);
    m.format = WeightFormat::bf16;
    m.data = bits.data();
  };
  convert(out->patch_embed);
  convert(out->pos_embed);
  for (VisionBlockWeights& b : out->blocks) {
    convert(b.qkv);
    convert(b.proj);
    convert(b.fc1);
    convert(b.fc2);
  }
  convert(out->merger_fc1);
  convert(out->merger_fc2);
  out->storage.push_back(storage);
  return out;
}

// Pixels in the processor's normalised range [-1, 1].
ImagePixels random_pixels(std::mt19937_64& rng, const VisionConfig& c, MropeGrid g) {
  ImagePixels p;
  p.grid = g;
  p.patch_dim = c.patch_dim();
  p.values = random_floats(rng, size_t(g.t * g.h * g.w * p.patch_dim), -1.0f, 1.0f);
  return p;
}

std::vector<float> cpu_encode(const VisionWeights& w, const ImagePixels& p) {
  const MropeGrid& g = p.grid;
  return cpu::vision_encode(w, p.values.data(), g.t * g.h * g.w, p.patch_dim, {{g.t, g.h, g.w}});
}

// ‖got − ref‖₂ / ‖ref‖₂ within rel_l2, every element within 15% of max|ref|; prints both errors.
void expect_encoder_close(const std::vector<float>& got, const std::vector<float>& ref, double rel_l2,
                          const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double diff = 0.0, norm = 0.0, worst = 0.0;
  bool finite = true;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = double(got[i]) - double(ref[i]);
    finite = finite && std::isfinite(got[i]);
    diff += e * e;
    norm += double(ref[i]) * ref[i];
    worst = std::max(worst, std::fabs(e));
  }
  const double rel = std::sqrt(diff / std::max(norm, 1e-30)), peak = max_abs(ref);
  std::printf("[vision] %s: relative L2 error %.3e, largest error %.3e of max |ref| %.3e\n", what.c_str(), rel, worst,
              peak);
  EXPECT_TRUE(finite) << what;
  EXPECT_LE(rel, rel_l2) << what;
  EXPECT_LE(worst, 0.15 * peak) << what;
}

TEST(VisionEncoderCuda, DemoWidthsMatchCpu) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("vision encoder demo widths");
  std::mt19937_64 rng(seed);
  const auto w = demo_vision_build(demo_widths(96), seed);  // F32 matrices: rounded to bf16 at upload
  VisionPlan plan(*w, nullptr);
  // One merge block; one partial key tile; two frames; several key tiles with a partial last one.
  for (const MropeGrid g : {MropeGrid{1, 2, 2}, MropeGrid{1, 6, 10}, MropeGrid{2, 4, 6}, MropeGrid{1, 20, 34}}) {
    const ImagePixels p = random_pixels(rng, w->config, g);
    const ImageEmbeddings e = plan.encode(p);
    EXPECT_EQ(e.tokens, g.t * g.h * g.w / 4);
    EXPECT_EQ(e.grid.h, g.h);
    expect_encoder_close(e.values, cpu_encode(*w, p), 1.5e-2,
                         "demo widths, grid (" + std::to_string(g.t) + ", " + std::to_string(g.h) + ", " +
                             std::to_string(g.w) + ")");
  }
  EXPECT_GT(plan.scratch_bytes(), 0);
}

TEST(VisionEncoderCuda, RealWidthsMatchCpu) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("vision encoder real widths");
  std::mt19937_64 rng(seed);
  const auto w = with_bf16_matrices(*demo_vision_build(real_widths(), seed));
  VisionPlan plan(*w, nullptr);
  // 252 patches (63 tokens): four key tiles, the last one partial; the CPU side takes a few seconds at full depth.
  const ImagePixels p = random_pixels(rng, w->config, MropeGrid{1, 14, 18});
  const ImageEmbeddings e = plan.encode(p);
  ASSERT_EQ(e.tokens, 63);
  expect_encoder_close(e.values, cpu_encode(*w, p), 1e-2, "real widths, 27 blocks, grid (1, 14, 18)");
}

TEST(VisionEncoderCuda, RefusesPixelsThatDoNotMatchTheGrid) {
  TERN_REQUIRE_GPU();
  const auto w = demo_vision_build(demo_widths(64), 7);
  VisionPlan plan(*w, nullptr);
  std::mt19937_64 rng(7);
  ImagePixels p = random_pixels(rng, w->config, MropeGrid{1, 4, 4});
  p.values.pop_back();
  EXPECT_THROW(plan.encode(p), Error);  // one value short
  p = random_pixels(rng, w->config, MropeGrid{1, 4, 4});
  p.patch_dim = 768;
  EXPECT_THROW(plan.encode(p), Error);  // another patch width
  p = random_pixels(rng, w->config, MropeGrid{1, 3, 4});
  EXPECT_THROW(plan.encode(p), Error);  // not whole 2 x 2 merge blocks
  p = random_pixels(rng, w->config, MropeGrid{1, 4, 4});
  EXPECT_NO_THROW(plan.encode(p));      // and the plan still works after refusing
}

// CudaRunner::encode_image: the weights' own tower (a random language model of 4 layers with the demo's tower
// attached), and the refusal of a model without one.
TEST(VisionEncoderCuda, RunnerEncodesWithTheWeightsTower) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaRunner encode_image");
  RandomModel rm;
  auto text_only = random_model(seed, 4, 4096, rm);
  {
    auto gpu = cuda_runner_create(text_only, {.progress = false});
    ImagePixels p;
    p.grid = {1, 2, 2};
    p.patch_dim = 1536;
    p.values.assign(4 * 1536, 0.0f);
    EXPECT_THROW(gpu->encode_image(p), Error);
  }
  const VisionConfig vc = demo_widths(rm.w->config.hidden_size);
  rm.w->config.vision = vc;
  rm.w->vision = demo_vision_build(vc, seed);
  auto gpu = cuda_runner_create(text_only, {.progress = false});
  // The scratch set aside for images of up to 64 patches holds this one (48): encoding it grows nothing.
  const int64_t reserved = gpu->reserve_image_memory(64);
  EXPECT_GT(reserved, 0);
  std::mt19937_64 rng(seed);
  const ImagePixels p = random_pixels(rng, vc, MropeGrid{1, 8, 6});
  const ImageEmbeddings e = gpu->encode_image(p);
  EXPECT_EQ(gpu->reserve_image_memory(48), reserved);
  EXPECT_EQ(e.tokens, 12);
  expect_encoder_close(e.values, cpu_encode(*rm.w->vision, p), 1.5e-2, "CudaRunner::encode_image");
}

// A tower the GPU encoder cannot take (head dim 160: its attention holds at most 128) turns images off with the
// reason and leaves the language model as it is: the same logits as the same model without a tower.
TEST(VisionEncoderCuda, UnsupportedTowerTurnsImagesOffNotTheRunner) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("CudaRunner unsupported tower");
  RandomModel rm;
  auto model = random_model(seed, 4, 4096, rm);
  const std::vector<int32_t> tokens = {1, 7, 42, 300, 5, 9};
  std::vector<float> want, got;
  {
    auto gpu = cuda_runner_create(model, {.progress = false});
    auto s = gpu->create_session(64);
    gpu->forward(*s, tokens, true, want);
  }
  VisionConfig vc = demo_widths(rm.w->config.hidden_size);
  vc.hidden_size = 320;
  vc.num_heads = 2;  // head dim 160
  rm.w->config.vision = vc;
  rm.w->vision = demo_vision_build(vc, seed);
  std::unique_ptr<ModelRunner> gpu;
  ASSERT_NO_THROW(gpu = cuda_runner_create(model, {.progress = false}));
  const std::string why = gpu->images_unavailable();
  EXPECT_NE(why.find("head dim 160"), std::string::npos) << why;
  std::mt19937_64 rng(seed);
  EXPECT_THROW(gpu->encode_image(random_pixels(rng, vc, MropeGrid{1, 4, 4})), Error);
  auto s = gpu->create_session(64);
  gpu->forward(*s, tokens, true, got);
  EXPECT_TRUE(got == want) << "the language model changed with an unusable tower attached";
}

// A 1024 x 1024 image at Qwen3.6's widths (random weights made on the device): the processor resizes it to itself
// (both sides already multiples of 32, the area inside [256², 4096²]), so its grid is (1, 64, 64): 4,096 patches,
// 1,024 tokens. Prints the time; no assertion on it (the target is 40 ms on an H200).
TEST(VisionEncoderCuda, Time1024x1024) {
  TERN_REQUIRE_GPU();
  const VisionConfig c = real_widths();
  VisionPlan plan(c, 1234, nullptr);
  std::mt19937_64 rng(1234);
  const ImagePixels p = random_pixels(rng, c, MropeGrid{1, 64, 64});
  ImageEmbeddings e = plan.encode(p);  // warm-up (scratch, module load)
  std::vector<double> ms;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    e = plan.encode(p);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("[vision] encode 1024x1024 (grid 1 x 64 x 64, %lld tokens, 27 blocks of width 1152): median %.2f ms "
              "(min %.2f, max %.2f) on %s\n",
              static_cast<long long>(e.tokens), ms[2], ms[0], ms[4], device_description().c_str());
  ASSERT_EQ(e.tokens, 1024);
  ASSERT_EQ(e.values.size(), size_t(1024 * 2048));
  EXPECT_TRUE(std::all_of(e.values.begin(), e.values.end(), [](float v) { return std::isfinite(v); }));
}

}  // namespace
}  // namespace tern::cuda::test
