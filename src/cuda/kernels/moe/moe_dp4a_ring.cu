// The batched (B >= 2) forms of the one-token MoE expert kernels of moe_dp4a.cu, with each warp's weight rows
// streamed through a ring of shared-memory stages (cp.async, kStages − 1 rows ahead) instead of one row ahead in
// registers. In a batched step a warp takes many rows in turn (at 8 tokens: ~8 output rows of down, ~18 batches of
// gate_up per warp), and one row in flight per warp left both kernels waiting on memory (docs/benchmarks.md).
//
// Every value is made as in the one-token kernels: the same lane owns the same columns of a row, the same activations
// (quantised by the same quantize_block), the same fold (dot_row / the segment loop) and the same warp_sum, so each
// token's h and hidden are bit for bit its one-token result. Only where a lane's weights wait differs.
//
// A stage holds one row's bytes in the order of its 16-byte chunks; lane l copies chunks l, l + 32, ...:
//   gate_up (S slices of 1024 columns): gate words [S·512 B], up words [S·512 B], then the gate's scales, its biases,
//            the up's scales, its biases [2S chunks each]: 72·S chunks;
//   down:    the 9 segments' words [9][256 B] (8 routed experts, then the shared one), their scales [9][16 B], their
//            biases [9][16 B]: 162 chunks.
#include <algorithm>
#include <cstdint>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/l2_prefetch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/moe/moe_dp4a_parts.cuh"
#include "cuda/kernels/qmv/dp4a_tile.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::cuda::moe_parts {
namespace {

template <int S>
constexpr int gate_up_stages() { return S <= 2 ? 4 : 3; }
template <int S>
constexpr int gate_up_stage_bytes() { return 1152 * S; }
constexpr int kDownStages = 4;
constexpr int kDownStageBytes = kSeg * 256 + 2 * kSeg * 16;  // 2592
constexpr int kDownChunks = kDownStageBytes / 16;            // 162

// ---- gate_up + SwiGLU ---------------------------------------------------------------------------------------------

// Copies batch b's chunks (of this lane) into the stage at dst (shared-window address); b past the end: nothing.
template <int S>
__device__ __forceinline__ void issue_gate_up(const GateUpParams& p, const int* ids, int b, int lane, uint32_t dst) {
  if (b >= (p.k + 1) * p.F) return;
  const int pair = b / p.F, i = b - pair * p.F;
  const bool sh = pair == 0;
  const int64_t e = sh ? 0 : ids[pair - 1];
  const Q4 G = pick(sh, p.sgate, p.gate), U = pick(sh, p.sup, p.up);
  constexpr int kChunks = 72 * S, kWordChunks = 32 * S, kSbChunks = 2 * S;
#pragma unroll
  for (int c = lane; c < kChunks; c += 32) {
    const void* src;
    if (c < 2 * kWordChunks) {
      const Q4 M = pick(c < kWordChunks, G, U);
      const int piece = c < kWordChunks ? c : c - kWordChunks;
      src = M.words + e * M.expert_words + int64_t(i) * p.row_words + piece * 4;
    } else {
      const int d = c - 2 * kWordChunks, which = d / kSbChunks, piece = d - which * kSbChunks;
      const Q4 M = pick(which < 2, G, U);
      const uint16_t* base = (which & 1) ? M.biases : M.scales;
      src = base + e * M.expert_groups + int64_t(i) * p.gpr + piece * 8;
    }
    cp_async_16(dst + uint32_t(c * 16), src, 16u);
  }
}

template <int S>
__global__ void __launch_bounds__(kThreads) moe_gate_up_ring_kernel(const GateUpParams p) {
  constexpr int kStages = gate_up_stages<S>(), kStageBytes = gate_up_stage_bytes<S>();
  extern __shared__ __align__(16) uint8_t ring[];  // [kWarps][kStages][kStageBytes]
  __shared__ int ids_s[kTopK];
  __shared__ uint4 xs[S * 128];
  __shared__ __align__(16) int xsum[S * 128];
  __shared__ float xsig[S * 16];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = int(gridDim.x) * kWarps, batches = (p.k + 1) * p.F;  // of this token
  const int first = int(blockIdx.x) * kWarps + warp;
  const int token = int(blockIdx.y);
  const int* ids = p.ids + token * p.k;
  const float* xhat = p.xhat + int64_t(token) * (S * 1024);
  float* h = p.h + int64_t(token) * (p.k + 1) * p.F;
  uint8_t* my_ring = ring + warp * kStages * kStageBytes;
  const uint32_t ring_addr = smem_addr(my_ring);
  pdl_wait();  // the routing and x̂ come from the router kernel
  if (int(threadIdx.x) < p.k) {
    const int e = ids[threadIdx.x];
    ids_s[threadIdx.x] = e < 0 ? 0 : (e >= p.E ? p.E - 1 : e);
  }
  __syncthreads();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    issue_gate_up<S>(p, ids_s, first + s * warps, lane, ring_addr + uint32_t(s * kStageBytes));
    cp_async_commit();
  }
  if (p.down_ahead) prefetch_down(p, ids_s);
  float unused_ss = 0.0f;
  dp4a::quantize_block<dp4a::quantize_passes(S * 128, kThreads)>(xhat, nullptr, S * 128, xs, xsum, xsig, unused_ss);
  __syncthreads();
  pdl_trigger();  // after pdl_wait in every block: moe_down's early routing read stays safe (moe_dp4a.cuh)
  uint4 xq[S][4];
  float sig[S], sx[S];
  gate_up_lane_x<S>(xs, xsum, xsig, lane, xq, sig, sx);
  for (int it = 0;; ++it) {
    const int batch = first + it * warps;
    if (batch >= batches) break;
    const int slot_ahead = (it + kStages - 1) % kStages;
    issue_gate_up<S>(p, ids_s, batch + (kStages - 1) * warps, lane, ring_addr + uint32_t(slot_ahead * kStageBytes));
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncwarp();  // every lane's chunks of this batch have landed
    const uint8_t* st = my_ring + (it % kStages) * kStageBytes;
    const uint4* gw = reinterpret_cast<const uint4*>(st);
    const uint4* uw = gw + 32 * S;
    const uint16_t* gsc = reinterpret_cast<const uint16_t*>(st + 1024 * S);
    const uint16_t* gbi = gsc + 16 * S;
    const uint16_t* usc = gbi + 16 * S;
    const uint16_t* ubi = usc + 16 * S;
    uint4 gv[S], uv[S];
    uint32_t gsb[S], usb[S];
#pragma unroll
    for (int j = 0; j < S; ++j) {
      gv[j] = gw[32 * j + lane];
      uv[j] = uw[32 * j + lane];
      const int g = 16 * j + lane / 2;
      gsb[j] = uint32_t(gsc[g]) | (uint32_t(gbi[g]) << 16);
      usb[j] = uint32_t(usc[g]) | (uint32_t(ubi[g]) << 16);
    }
    __syncwarp();  // the stage is read: the next iteration may refill it
    const float g = warp_sum(dot_row<S>(gv, gsb, xq, sig, sx));
    const float u = warp_sum(dot_row<S>(uv, usb, xq, sig, sx));
    if (lane == 0) {
      const int pair = batch / p.F, i = batch - pair * p.F;
      const int slot = pair == 0 ? p.k : pair - 1;
      h[int64_t(slot) * p.F + i] = silu_f(g) * u;
    }
  }
  cp_async_wait<0>();
}

// ---- down + weighted sum + residual -------------------------------------------------------------------------------

// Copies output row r's chunks (of this lane) into the stage at dst; r past the end: nothing.
__device__ __forceinline__ void issue_down(const DownParams& p, const int* ids, int r, int lane, uint32_t dst) {
  if (r >= p.D) return;
#pragma unroll
  for (int c = lane; c < kDownChunks; c += 32) {
    int s, piece, kind;  // kind 0: words, 1: scales, 2: biases
    if (c < kSeg * 16) {
      s = c / 16, piece = c % 16, kind = 0;
    } else {
      const int d = c - kSeg * 16;
      kind = 1 + d / kSeg, s = d % kSeg, piece = 0;
    }
    const bool sh = s == kTopK;
    const Q4 M = pick(sh, p.sdown, p.down);
    const int64_t e = sh ? 0 : ids[s];
    const void* src = kind == 0 ? static_cast<const void*>(M.words + e * M.expert_words + int64_t(r) * p.row_words +
                                                           piece * 4)
                                : static_cast<const void*>((kind == 1 ? M.scales : M.biases) + e * M.expert_groups +
                                                           int64_t(r) * p.gpr);
    cp_async_16(dst + uint32_t(c * 16), src, 16u);
  }
}

__global__ void __launch_bounds__(kThreads, 2) moe_down_ring_kernel(const DownParams p) {
  extern __shared__ __align__(16) uint8_t ring[];  // [kWarps][kDownStages][kDownStageBytes]
  __shared__ int ids_s[kTopK];
  __shared__ uint4 xs[kSeg * 64];
  __shared__ int xsum[kSeg * 64];
  __shared__ float xsig[kSeg * 8];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = int(gridDim.x) * kWarps;  // of this token
  const int first = int(blockIdx.x) * kWarps + warp;
  const int token = int(blockIdx.y);
  const int* ids = p.ids + token * kTopK;
  const float* h = p.h + int64_t(token) * (kSeg * kDownCols);
  float* hidden = p.hidden + int64_t(token) * p.D;
  uint8_t* my_ring = ring + warp * kDownStages * kDownStageBytes;
  const uint32_t ring_addr = smem_addr(my_ring);
  if (!p.early_routing) pdl_wait();
  if (int(threadIdx.x) < kTopK) {
    const int e = __ldcg(ids + threadIdx.x);  // L2: written by another kernel, maybe while this one was resident
    ids_s[threadIdx.x] = e < 0 ? 0 : (e >= p.E ? p.E - 1 : e);
  }
  __syncthreads();
  // The first rows' weights in flight while gate_up finishes / the activations are quantised.
#pragma unroll
  for (int s = 0; s < kDownStages - 1; ++s) {
    issue_down(p, ids_s, first + s * warps, lane, ring_addr + uint32_t(s * kDownStageBytes));
    cp_async_commit();
  }
  if (p.early_routing) pdl_wait();  // h comes from gate_up
  float unused_ss = 0.0f;
  dp4a::quantize_block<dp4a::quantize_passes(kSeg * 64, kThreads)>(h, nullptr, kSeg * 64, xs, xsum, xsig, unused_ss);
  __syncthreads();
  pdl_trigger();
  float sig[kSeg], sx[kSeg];  // coefficient·σ of the lane's group, coefficient·σ·Σv of its 16 columns
  down_lane_coefficients(p, token, xsum, xsig, lane, sig, sx);
  // The residual row lane 0 adds to, a row ahead (after pdl_wait: an earlier kernel writes it).
  float hid = lane == 0 && first < p.D ? __ldcg(hidden + first) : 0.0f;
  for (int it = 0;; ++it) {
    const int row = first + it * warps;
    if (row >= p.D) break;
    const int slot_ahead = (it + kDownStages - 1) % kDownStages;
    issue_down(p, ids_s, row + (kDownStages - 1) * warps, lane, ring_addr + uint32_t(slot_ahead * kDownStageBytes));
    cp_async_commit();
    const float hid_next = lane == 0 && row + warps < p.D ? __ldcg(hidden + row + warps) : 0.0f;
    cp_async_wait<kDownStages - 1>();
    __syncwarp();  // every lane's chunks of this row have landed
    const uint8_t* st = my_ring + (it % kDownStages) * kDownStageBytes;
    const uint2* wv = reinterpret_cast<const uint2*>(st);
    const uint16_t* sc = reinterpret_cast<const uint16_t*>(st + kSeg * 256);
    const uint16_t* bi = sc + kSeg * 8;
    uint2 w[kSeg];
    uint32_t sb[kSeg];
#pragma unroll
    for (int s = 0; s < kSeg; ++s) {
      w[s] = wv[s * 32 + lane];
      sb[s] = uint32_t(sc[s * 8 + lane / 4]) | (uint32_t(bi[s * 8 + lane / 4]) << 16);
    }
    __syncwarp();  // the stage is read: the next iteration may refill it
    float acc = 0.0f;
#pragma unroll
    for (int s = 0; s < kSeg; ++s) {
      int dh = 0, dl = 0;
      dp4a::dot_word(w[s].x, xs[dp4a::xs_slot(s * 64 + 2 * lane)], dh, dl);
      dp4a::dot_word(w[s].y, xs[dp4a::xs_slot(s * 64 + 2 * lane + 1)], dh, dl);
      acc = fmaf(dp4a::scale_of(sb[s]) * sig[s], float(dh * 256 + dl), acc);
      acc = fmaf(dp4a::bias_of(sb[s]), sx[s], acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) hidden[row] = hid + acc;
    hid = hid_next;
  }
  cp_async_wait<0>();
}

// Blocks per token of a grid (blocks, B) whose blocks are all resident: the wave shared by the tokens, at most
// enough for `work` warps per token.
int ring_blocks(const void* kernel, int smem, int64_t work, int B) {
  const int wave = std::max(1, qtile::blocks_fit(kernel, smem)) * qtile::sm_count();
  return int(std::clamp<int64_t>(wave / B, 1, (work + kWarps - 1) / kWarps));
}

// False (nothing launched) when the ring does not fit the device's shared memory.
template <int S>
bool launch_gate_up_ring(const GateUpParams& p, int B, cudaStream_t stream) {
  auto kernel = moe_gate_up_ring_kernel<S>;
  constexpr int smem = kWarps * gate_up_stages<S>() * gate_up_stage_bytes<S>();
  if (smem > qtile::max_dynamic_smem()) return false;
  static bool attribute_set = false;
  if (!attribute_set) {
    TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attribute_set = true;
  }
  const int blocks = ring_blocks(reinterpret_cast<const void*>(kernel), smem, int64_t(p.k + 1) * p.F, B);
  launch_pdl("moe_gate_up_ring", kernel, dim3(unsigned(blocks), unsigned(B)), dim3(kThreads), size_t(smem), stream,
             p);
  return true;
}

}  // namespace

bool ring_enabled() {
  static const bool on = !env_is("TERN_MOE_RING", "0");
  return on;
}

bool gate_up_ring(const GateUpParams& p, int cols, int B, cudaStream_t stream) {
  if (B < 2 || !ring_enabled()) return false;
  switch (cols) {
    case 1024: return launch_gate_up_ring<1>(p, B, stream);
    case 2048: return launch_gate_up_ring<2>(p, B, stream);
    default: return launch_gate_up_ring<4>(p, B, stream);
  }
}

bool down_ring(const DownParams& p, int B, cudaStream_t stream) {
  if (B < 2 || !ring_enabled()) return false;
  constexpr int smem = kWarps * kDownStages * kDownStageBytes;
  static bool attribute_set = false;
  if (!attribute_set) {
    TERN_CUDA(cudaFuncSetAttribute(moe_down_ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attribute_set = true;
  }
  const int blocks = ring_blocks(reinterpret_cast<const void*>(moe_down_ring_kernel), smem, p.D, B);
  launch_pdl("moe_down_ring", moe_down_ring_kernel, dim3(unsigned(blocks), unsigned(B)), dim3(kThreads), size_t(smem),
             stream, p);
  return true;
}

}  // namespace tern::cuda::moe_parts
