// The fused MoE router + integer gate_up (src/cuda/kernels/moe/moe_router_gate_up.cuh) against the two kernels it
// replaces for one token: the multi-block ticket router and the integer gate_up (moe_dp4a.cuh), each followed by the
// same down kernel. x̂, the router logits, the shared logit, ids, routing weights, shared gate, h and the hidden row
// after down must be equal bit for bit, at the model's shapes (D = 2048, E = 256, k = 8, F = 512) and a smaller one
// (D = 1024, E = 64, F = 256), for random, scaled and all-zero inputs; on the default grid, the most blocks that can be
// resident at once and 2 blocks (whose warps then do most rows after the wait); 3 launches in a row (the second and
// third with the L2 prefetch of the down matrices, which must change nothing) and a CUDA graph replayed 4 times:
// after every launch the ticket is back at 0 and the epoch one further. The tests call the kernel itself, on any
// device; moe_decode's choice of it is checked apart.
#include <cstring>
#include <string>
#include <vector>

#include "cuda/common/cuda_common.cuh"
#include "cuda/kernels/moe/moe_decode.cuh"
#include "cuda/kernels/moe/moe_dp4a.cuh"
#include "cuda/kernels/moe/moe_router_gate_up.cuh"
#include "cuda/kernels/qmv/qmv.cuh"
#include "moe_decode_test_util.h"

namespace tern::cuda::test {
namespace {

constexpr int kK = 8;  // top-k: the integer gate_up's

// What one token's MoE block leaves: the scratch's tables and the hidden row.
struct BlockOut {
  std::vector<float> xhat, logits, slogit, w, sgate, h, hidden;
  std::vector<int> ids;
};

BlockOut read_out(const MoeDecodeScratch& s, const float* hidden, int64_t D, int E, int64_t F) {
  BlockOut o;
  o.xhat = to_host(s.xhat, size_t(D));
  o.logits = to_host(s.router_logits, size_t(E));
  o.slogit = to_host(s.shared_logit, 1);
  o.w = to_host(s.w, kK);
  o.sgate = to_host(s.shared_gate, 1);
  o.h = to_host(s.h, size_t((kK + 1) * F));
  o.hidden = to_host(hidden, size_t(D));
  o.ids = to_host(s.ids, kK);
  return o;
}

void expect_same(const BlockOut& got, const BlockOut& want, const std::string& what) {
  const auto same = [&](const auto& a, const auto& b, const char* name) {
    ASSERT_EQ(a.size(), b.size());
    size_t diff = 0, first = 0;
    for (size_t i = 0; i < a.size(); ++i)
      if (std::memcmp(&a[i], &b[i], sizeof(a[i])) != 0 && diff++ == 0) first = i;
    EXPECT_EQ(diff, 0u) << what << ": " << name << " differs from the two kernels' in " << diff << " of " << a.size()
                        << " elements; first at " << first << ": " << a[first] << " vs " << b[first];
  };
  same(got.xhat, want.xhat, "x̂");
  same(got.logits, want.logits, "router logits");
  same(got.slogit, want.slogit, "shared logit");
  same(got.ids, want.ids, "expert ids");
  same(got.w, want.w, "routing weights");
  same(got.sgate, want.sgate, "shared gate");
  same(got.h, want.h, "SwiGLU hidden");
  same(got.hidden, want.hidden, "hidden after down");
}

// Every table the block writes poisoned (NaN, ids -1), so that one left unwritten fails; the ticket and epoch kept.
void poison(const MoeDecodeScratch& s, int64_t D, int E, int64_t F, cudaStream_t stream) {
  TERN_CUDA(cudaMemsetAsync(s.xhat, 0xff, size_t(D) * 4, stream));
  TERN_CUDA(cudaMemsetAsync(s.router_logits, 0xff, size_t(E) * 4, stream));
  TERN_CUDA(cudaMemsetAsync(s.shared_logit, 0xff, 4, stream));
  TERN_CUDA(cudaMemsetAsync(s.ids, 0xff, kK * 4, stream));
  TERN_CUDA(cudaMemsetAsync(s.w, 0xff, kK * 4, stream));
  TERN_CUDA(cudaMemsetAsync(s.shared_gate, 0xff, 4, stream));
  TERN_CUDA(cudaMemsetAsync(s.h, 0xff, size_t((kK + 1) * F) * 4, stream));
}

// The two kernels the fused one replaces, then down as moe_decode runs it after them: the multi-block ticket router
// (under qmv variant 1 for the call: variant 3 takes the one-cluster router at T = 1 on sm_90), the integer gate_up.
void two_kernels_then_down(const MoeDecodeWeights& w, float* hidden, const MoeDecodeScratch& s, cudaStream_t stream) {
  qmv_set_variant(1);
  moe_router_decode(w, hidden, 1, s, stream);
  qmv_set_variant(3);
  ASSERT_TRUE(moe_gate_up_dp4a(w, s, stream));
  moe_down_decode(w, hidden, 1, s, stream, true);
}

void fused_then_down(const MoeDecodeWeights& w, float* hidden, const MoeDecodeScratch& s, int blocks,
                     cudaStream_t stream) {
  ASSERT_TRUE(moe_router_gate_up_dp4a(w, hidden, s, stream, blocks));
  moe_down_decode(w, hidden, 1, s, stream, true);
}

unsigned read_u32(const unsigned* p) { return to_host(p, 1)[0]; }

// One shape: 4 inputs (random, ×100, ×1e-2, all zero), each through the two kernels once and through the fused one on
// every grid, 3 times in a row and as a graph replayed 4 times.
void check_shape(std::mt19937_64& rng, int E, int64_t D, int64_t F) {
  const std::string shape = "D=" + std::to_string(D) + " E=" + std::to_string(E) + " F=" + std::to_string(F);
  auto mh = make_moe(rng, WeightFormat::affine4, WeightFormat::affine8, E, kK, D, F);
  MoeDevice md(*mh);
  ASSERT_TRUE(moe_router_gate_up_fits(md.w)) << shape;
  const int most = moe_router_gate_up_max_blocks(md.w);
  ASSERT_GE(most, 2) << shape;
  cudaStream_t stream;
  TERN_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t bytes = moe_decode_scratch_bytes(1, D, E, kK, F);
  DeviceBuf<uint8_t> ref_scratch(bytes), scratch(bytes);
  const MoeDecodeScratch ref_s = moe_decode_scratch_view(ref_scratch.p, 1, D, E, kK, F);
  const MoeDecodeScratch s = moe_decode_scratch_view(scratch.p, 1, D, E, kK, F);
  moe_decode_scratch_init(ref_s, stream);
  moe_decode_scratch_init(s, stream);
  for (int input = 0; input < 4 && !::testing::Test::HasFailure(); ++input) {
    std::vector<float> hidden = random_floats(rng, size_t(D), -4.0f, 4.0f);
    const float scale = input == 0 ? 1.0f : input == 1 ? 100.0f : input == 2 ? 1e-2f : 0.0f;
    for (float& v : hidden) v *= scale;
    const std::string what_in = shape + " input ×" + std::to_string(scale);
    DeviceBuf<float> x0(hidden), dh(hidden);
    poison(ref_s, D, E, F, stream);
    two_kernels_then_down(md.w, dh.p, ref_s, stream);
    const BlockOut want = read_out(ref_s, dh.p, D, E, F);
    for (const int blocks : {0, most, 2}) {
      const std::string what_grid = what_in + (blocks ? " grid " + std::to_string(blocks) : " default grid");
      for (int run = 0; run < 3; ++run) {
        const std::string what = what_grid + " run " + std::to_string(run);
        MoeDecodeWeights w = md.w;
        w.prefetch_down = run >= 1;
        TERN_CUDA(cudaMemcpyAsync(dh.p, x0.p, size_t(D) * 4, cudaMemcpyDeviceToDevice, stream));
        poison(s, D, E, F, stream);
        const unsigned epoch = read_u32(s.epoch);
        fused_then_down(w, dh.p, s, blocks, stream);
        TERN_CUDA(cudaGetLastError());
        expect_same(read_out(s, dh.p, D, E, F), want, what);
        EXPECT_EQ(read_u32(s.ticket), 0u) << what << ": ticket not back at 0";
        EXPECT_EQ(read_u32(s.epoch), epoch + 1) << what << ": epoch not one further";
      }
      if (blocks == most) continue;  // graphs on the default grid and on 2 blocks
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      TERN_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
      TERN_CUDA(cudaMemcpyAsync(dh.p, x0.p, size_t(D) * 4, cudaMemcpyDeviceToDevice, stream));
      fused_then_down(md.w, dh.p, s, blocks, stream);
      TERN_CUDA(cudaStreamEndCapture(stream, &graph));
      TERN_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      for (int replay = 0; replay < 4; ++replay) {
        const std::string what = what_grid + " graph replay " + std::to_string(replay);
        poison(s, D, E, F, stream);
        const unsigned epoch = read_u32(s.epoch);
        TERN_CUDA(cudaGraphLaunch(exec, stream));
        expect_same(read_out(s, dh.p, D, E, F), want, what);
        EXPECT_EQ(read_u32(s.ticket), 0u) << what << ": ticket not back at 0";
        EXPECT_EQ(read_u32(s.epoch), epoch + 1) << what << ": epoch not one further";
      }
      TERN_CUDA(cudaGraphExecDestroy(exec));
      TERN_CUDA(cudaGraphDestroy(graph));
    }
  }
  TERN_CUDA(cudaStreamDestroy(stream));
}

TEST(CudaMoeRouterGateUp, MatchesRouterThenGateUpBitwise) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMoeRouterGateUp"));
  const int v0 = qmv_variant();
  MoeWidth width(true);  // x̂ at 24 bits (the default) at the model's shape, at 16 on the small one
  check_shape(rng, 256, 2048, 512);
  width.set(false);
  if (!HasFailure()) check_shape(rng, 64, 1024, 256);
  qmv_set_variant(v0);
}

// moe_decode's choice: the fused kernel for one token under qmv variant 3 exactly where Hopper's features are
// missing (the portable path, GPUs before sm_90), unless TERN_MOE_FUSED_ROUTER=0; never for T > 1. Where it chooses
// it, moe_decode leaves the bits of the two kernels.
TEST(CudaMoeRouterGateUp, DecodeChoosesItWithoutHopperFeatures) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMoeRouterGateUp.Choice"));
  const int E = 64;
  const int64_t D = 1024, F = 256;
  auto mh = make_moe(rng, WeightFormat::affine4, WeightFormat::affine8, E, kK, D, F);
  MoeDevice md(*mh);
  const int v0 = qmv_variant();
  qmv_set_variant(1);
  EXPECT_FALSE(moe_decode_fuses_router(md.w, 1)) << "variant 1";
  qmv_set_variant(3);
  const bool want = !sm90_features() && !env_is("TERN_MOE_FUSED_ROUTER", "0");
  EXPECT_EQ(moe_decode_fuses_router(md.w, 1), want) << "sm_90 features " << sm90_features();
  EXPECT_FALSE(moe_decode_fuses_router(md.w, 3)) << "T = 3";
  if (moe_decode_fuses_router(md.w, 1)) {
    const std::vector<float> hidden = random_floats(rng, size_t(D), -4.0f, 4.0f);
    const size_t bytes = moe_decode_scratch_bytes(1, D, E, kK, F);
    DeviceBuf<uint8_t> ref_scratch(bytes), scratch(bytes);
    const MoeDecodeScratch ref_s = moe_decode_scratch_view(ref_scratch.p, 1, D, E, kK, F);
    const MoeDecodeScratch s = moe_decode_scratch_view(scratch.p, 1, D, E, kK, F);
    moe_decode_scratch_init(ref_s, nullptr);
    moe_decode_scratch_init(s, nullptr);
    DeviceBuf<float> ref_h(hidden), dh(hidden);
    two_kernels_then_down(md.w, ref_h.p, ref_s, nullptr);
    moe_decode(md.w, dh.p, 1, s, nullptr);
    TERN_CUDA(cudaGetLastError());
    expect_same(read_out(s, dh.p, D, E, F), read_out(ref_s, ref_h.p, D, E, F), "moe_decode");
    EXPECT_EQ(read_u32(s.ticket), 0u);
    EXPECT_EQ(read_u32(s.epoch), 1u);
  }
  qmv_set_variant(v0);
}

}  // namespace
}  // namespace tern::cuda::test
