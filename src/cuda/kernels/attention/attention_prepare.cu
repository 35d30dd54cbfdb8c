// attn_prepare and attn_prepare_batched: the q/k/v rows of a step normed and rotated (RMSNorm, RoPE or M-RoPE), q
// into q_out, k and v into the KV cache (16-bit, or fp8 with per-row scales), by one kernel (attn_prepare_kernel);
// and attention_check, which checks the shapes the attention kernels take (rope_freqs).
#include "cuda/kernels/attention/attention.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <type_traits>

#include "core/check.h"
#include "cpu/ops_rope.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/attention/attention_internal.cuh"
#include "cuda/kernels/attention/attention_tiles.cuh"
#include "cuda/weights/dmat_device.cuh"

namespace tern::cuda {
using namespace attn;
namespace {

// ---- attn_prepare -----------------------------------------------------------------------------------------------

struct RopeFreqs {
  float inv[kMaxRopeHalf];  // f_i = 1/θ^(2i/rot), computed on the host exactly as the CPU twin does
};

// A launch's 3-axis rotary positions (AttnRope::axes and section; one sequence only).
struct RopeAxes {
  const int* pos = nullptr;  // [rows, 3] (t, h, w) per row; null: every axis at the cache position + the delta
  int section[3] = {0, 0, 0};
};

// attn_prepare holds a head row of DH floats in a group of CH = DH/8 lanes (lane = sub·CH + c): lane c of the group
// holds elements 8c .. 8c+7, so a warp holds 32/CH rows at once (sub) and issues every load before any arithmetic.
__device__ __forceinline__ void load_chunk(const float* row, int c, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(row)[2 * c], b = reinterpret_cast<const float4*>(row)[2 * c + 1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// RopeFreqs (a kernel parameter) into shared memory, so that lanes reading different frequencies do not serialise on
// the parameter (constant) bank, which serves one address at a time. Every thread of the block calls it.
__device__ __forceinline__ void stage_freqs(const RopeFreqs& freqs, float* inv_s) {
  if (threadIdx.x < kMaxRopeHalf) inv_s[threadIdx.x] = freqs.inv[threadIdx.x];
  __syncthreads();
}

// Row i's rotary positions (t, h, w): its own with 3-axis positions, else its cache position pos plus its sequence's
// M-RoPE delta on every axis (all three equal: the plain RoPE position).
template <typename Elem>
__device__ __forceinline__ void rope_positions(const Seqs<Elem>& seqs, const RopeAxes& axes, int64_t i, int b,
                                               int64_t pos, int64_t (&p)[3]) {
  if (axes.pos) {
#pragma unroll
    for (int a = 0; a < 3; ++a) p[a] = axes.pos[3 * i + a];
    return;
  }
  p[0] = p[1] = p[2] = pos + rope_delta_at(seqs, b);
}

// cos and sin of the rotate-half RoPE angles of the chunk's elements at positions p (1, 0 past rot): pair j at the
// position of its interleaved M-RoPE axis (section, as cpu::mrope_angles; any axis when the three are equal); inv: the
// frequencies in shared memory (stage_freqs).
__device__ __forceinline__ void rope_cos_sin(const int64_t (&p)[3], const int (&section)[3], int c, int rot,
                                             const float* inv, float (&cs)[8], float (&sn)[8]) {
  const int half = rot / 2;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int i = 8 * c + e, j = i < half ? i : i - half;
    const int64_t pos = j % 3 == 1 && j < 3 * section[1] ? p[1] : j % 3 == 2 && j < 3 * section[2] ? p[2] : p[0];
    cs[e] = 1.0f;
    sn[e] = 0.0f;
    if (i < rot) sincosf(float(pos) * inv[j], &sn[e], &cs[e]);  // fp32, as the CPU twin
  }
}

// v = rope(rmsnorm(v)·w) for every row the warp holds (all 32 lanes call it). rot must be 0 or a power of two >= 16
// (rope_freqs checks it): element i ± rot/2 is then at the same place in lane c ^ (rot/16).
template <int DH>
__device__ __forceinline__ void norm_rope_chunk(float (&v)[8], const float (&w)[8], float eps, int rot, int c,
                                                const float (&cs)[8], const float (&sn)[8]) {
  constexpr int CH = DH / 8;
  float ss = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) ss = fmaf(v[e], v[e], ss);
#pragma unroll
  for (int off = CH / 2; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  const float inv = rsqrtf(ss / float(DH) + eps);
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = v[e] * inv * w[e];
  const int pm = rot >= 16 ? rot / 16 : 1;  // partner lane offset of element i ± rot/2
  const bool low = 8 * c < rot / 2;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float p = __shfl_xor_sync(0xffffffffu, v[e], pm);
    if (8 * c < rot) v[e] = low ? v[e] * cs[e] - p * sn[e] : v[e] * cs[e] + p * sn[e];
  }
}

template <bool F16>
__device__ __forceinline__ uint4 pack8_16(const float (&v)[8]) {
  return make_uint4(pack16<F16>(v[0], v[1]), pack16<F16>(v[2], v[3]), pack16<F16>(v[4], v[5]), pack16<F16>(v[6], v[7]));
}

// One warp per 32/CH (row, head) tasks, rows i = b·T + t (Seqs): Hq query heads, then Hkv key heads, then Hkv value
// heads. Row i of qg ([Hq][q | gate]) at qg + i·ld_qg, of k and v ([Hkv][dh]) at + i·ld_kv. The cache rows in KV's
// type: 16-bit values, or fp8 bytes and the row's scale (the amax of the row the lanes hold: every lane takes part).
template <int DH, KvDtype KV>
__global__ void __launch_bounds__(256) attn_prepare_kernel(const float* qg, const float* k, const float* v,
                                                           int64_t ld_qg, int64_t ld_kv, const float* q_norm,
                                                           const float* k_norm, Seqs<void> seqs, AttnDims d,
                                                           RopeFreqs freqs, RopeAxes axes, float* q_out) {
  constexpr bool F16 = kF16<KV>;
  constexpr int CH = DH / 8, PER_WARP = 32 / CH;
  __shared__ float inv_s[kMaxRopeHalf];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, c = lane % CH;
  const int heads = d.Hq + 2 * d.Hkv;
  const int64_t task = (int64_t(blockIdx.x) * 8 + warp) * PER_WARP + lane / CH;
  stage_freqs(freqs, inv_s);
  pdl_wait();
  pdl_trigger();
  const bool live = task < seqs.B * d.T * heads;  // dead lanes still take part in the shuffles
  const int64_t i = live ? task / heads : 0;
  const int h = live ? int(task % heads) : 0;
  const int b = int(i / d.T);
  const Seq<void> s = seq_at(seqs, b);
  const int64_t pos = s.pos0 + i % d.T;  // the cache row
  const bool is_q = h < d.Hq, is_v = h >= d.Hq + d.Hkv;
  float x[8];
  load_chunk(is_q ? qg + i * ld_qg + int64_t(h) * 2 * DH
                      : is_v ? v + i * ld_kv + int64_t(h - d.Hq - d.Hkv) * DH : k + i * ld_kv + int64_t(h - d.Hq) * DH,
                 c, x);
  // Every load (the norm weights, the M-RoPE delta or positions) is issued before the value head's store, which the
  // compiler may not move them past (it cannot tell that the cache does not alias them).
  float w[8], cs[8], sn[8];
  load_chunk(is_q ? q_norm : k_norm, c, w);
  int64_t rope_pos[3];
  rope_positions(seqs, axes, i, b, pos, rope_pos);
  if constexpr (kFp8<KV>) {  // value head: x quantised with its row's scale
    const float v_scale = fp8_row_scale(row_amax<DH>(x));  // every lane: the shuffles span the warp
    if (live && is_v) store_fp8_chunk<DH>(s.cache_v, d.Hkv, s.capacity, h - d.Hq - d.Hkv, pos, c, x, v_scale);
  } else if constexpr (kI16<KV>) {
    const float v_scale = i16_row_scale(row_amax<DH>(x), row_has_nan<DH>(x));  // every lane
    if (live && is_v) store_i16_chunk<DH>(s.cache_v, d.Hkv, s.capacity, h - d.Hq - d.Hkv, pos, c, x, v_scale);
  } else if (live && is_v) {  // value head: a plain copy into the cache
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(s.cache_v) + (int64_t(h - d.Hq - d.Hkv) * s.capacity + pos) * DH +
                              8 * c) = pack8_16<F16>(x);
  }
  rope_cos_sin(rope_pos, axes.section, c, d.rot, inv_s, cs, sn);
  norm_rope_chunk<DH>(x, w, d.eps, d.rot, c, cs, sn);  // every lane: the shuffles span the warp
  float k_scale = 0.0f;  // fp8, i16: the row's scale after the norm and RoPE (every lane, before any returns)
  if constexpr (kFp8<KV>) k_scale = fp8_row_scale(row_amax<DH>(x));
  if constexpr (kI16<KV>) k_scale = i16_row_scale(row_amax<DH>(x), row_has_nan<DH>(x));
  if (!live || is_v) return;
  if (is_q) {
    float4* dst = reinterpret_cast<float4*>(q_out + (i * d.Hq + h) * int64_t(DH) + 8 * c);
    dst[0] = make_float4(x[0], x[1], x[2], x[3]);
    dst[1] = make_float4(x[4], x[5], x[6], x[7]);
  } else if constexpr (kFp8<KV>) {
    store_fp8_chunk<DH>(s.cache_k, d.Hkv, s.capacity, h - d.Hq, pos, c, x, k_scale);
  } else if constexpr (kI16<KV>) {
    store_i16_chunk<DH>(s.cache_k, d.Hkv, s.capacity, h - d.Hq, pos, c, x, k_scale);
  } else {
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(s.cache_k) + (int64_t(h - d.Hq) * s.capacity + pos) * DH + 8 * c) =
        pack8_16<F16>(x);
  }
}

// The RoPE frequencies, after checking the shapes the kernels take: head dims 64, 128, 256; rotary dims 0 or 16·2^k
// (element i ± rot/2 of a row then sits at the same place of another lane's 8-element chunk, norm_rope_chunk).
RopeFreqs rope_freqs(const AttnDims& d) {
  TERN_CHECK(d.dh == 64 || d.dh == 128 || d.dh == 256, "attention: head dim ", d.dh,
             " not supported by the CUDA kernels (64, 128 or 256)");
  const bool pow2 = d.rot >= 16 && (d.rot & (d.rot - 1)) == 0;
  TERN_CHECK((d.rot == 0 || pow2) && d.rot <= d.dh && d.rot / 2 <= kMaxRopeHalf, "attention: rotary dims ", d.rot,
             " not supported by the CUDA kernels (0, or a power of two from 16 to min(head dim, 128))");
  RopeFreqs freqs = {};
  for (int i = 0; i < d.rot / 2; ++i) freqs.inv[i] = cpu::rope_inv_freq(i, d.rot, double(d.theta));
  return freqs;
}

// attn_prepare's one launch over seqs (rows seqs.B · d.T): attn_prepare's and attn_prepare_batched's. Row i of qg
// at qg + i·ld_qg, of k and v at + i·ld_kv.
void launch_prepare(const float* qg, const float* k, const float* v, int64_t ld_qg, int64_t ld_kv, const float* q_norm,
                    const float* k_norm, const Seqs<void>& seqs, const AttnDims& d, const RopeFreqs& freqs,
                    const RopeAxes& axes, float* q_out, cudaStream_t stream) {
  const int64_t tasks = seqs.B * d.T * (d.Hq + 2 * d.Hkv);
  const int per_block = 8 * (32 / (d.dh / 8));  // 8 warps, each 32 / (dh/8) rows at once
  with_head_dim(d, [&]<int DH, KvDtype KV>() {
    launch_pdl("attn_prepare", attn_prepare_kernel<DH, KV>, dim3(blocks_for(tasks, per_block)), dim3(256), 0, stream,
               qg, k, v, ld_qg, ld_kv, q_norm, k_norm, seqs, d, freqs, axes, q_out);
  });
}

}  // namespace

void attention_check(const AttnDims& d) {
  rope_freqs(d);
  TERN_CHECK(d.Hkv > 0 && d.Hq % d.Hkv == 0, "attention: ", d.Hq, " query heads over ", d.Hkv, " KV heads");
  if (d.kv == KvDtype::i16) attn::check_i16_fits(d);
}

void attn_prepare(const float* qg, const float* k, const float* v, const float* q_norm, const float* k_norm,
                  const int* pos0, const AttnDims& d, float* q_out, void* cache_k, void* cache_v,
                  cudaStream_t stream, const AttnRope& rope) {
  const RopeFreqs freqs = rope_freqs(d);
  if (d.T == 0) return;
  const Seqs<void> seqs{
      .pos0 = pos0, .cache_k = cache_k, .cache_v = cache_v, .capacity = d.capacity, .rope_delta = rope.delta};
  RopeAxes axes;
  if (rope.axes) axes = {.pos = rope.axes, .section = {rope.section[0], rope.section[1], rope.section[2]}};
  launch_prepare(qg, k, v, int64_t(d.Hq) * 2 * d.dh, int64_t(d.Hkv) * d.dh, q_norm, k_norm, seqs, d, freqs, axes,
                 q_out, stream);
}

void attn_prepare_batched(const float* qg, const float* k, const float* v, const float* q_norm, const float* k_norm,
                          const AttnBatch& batch, const AttnDims& d, float* q_out, cudaStream_t stream) {
  const RopeFreqs freqs = rope_freqs(d);
  check_batch(batch, d, "attn_prepare_batched");
  launch_prepare(qg, k, v, batch.ld_qkv, batch.ld_qkv, q_norm, k_norm, batch_seqs<void>(batch), d, freqs, {},
                 q_out, stream);
}

}  // namespace tern::cuda
