// The batched integer product's activation tables (qmv_dp4a_mma.cu): a token tile's 8 tokens quantised in the form
// the tensor-core fragments read them, and the device code that writes one word of them. Three kinds of writer share
// it, so that the same activations give the same bytes whoever writes them:
//   - qmv_dp4a_prequant_kernel and the product's own prologue (qmv_dp4a_mma.cu: quantize_tokens),
//   - the kernels before a product in the batched step, from the values they have just made (producer tables):
//     gdn_decode_batched (out_proj's), attention_batched's merge (o_proj's), the MoE down (the next in_proj's,
//     q|k|v's or the LM head's, with the RMSNorm's Σx² from the whole row).
// Included by .cu files only.
#pragma once

#include <cstdint>

#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/qmv/dp4a_tile.cuh"

namespace tern::cuda::dp4a {

constexpr int kTileTokens = 8;  // tokens of a token tile (the MMA's n)

// Byte offsets of a token tile's tables over hg half-groups (32 columns each), from their start.
struct TableOffsets {
  int xf;     // uint4 [hg][8 tokens][4]: the {even hi, odd hi, even mid, odd mid} pairs of word 4·h + c
  int xl;     // uint2 [hg][8][4]: the {even lo, odd lo} pairs
  int sx;     // float [hg / 2][8]: σ·Σv of the group of 64
  int sig;    // float [hg / 2][8]: σ of the group of 64
  int rinv;   // float [8]: the RMSNorm's rsqrt per token (1 without a norm; slots past the batch: never read)
  int bytes;  // the tile's bytes, a multiple of 16
};
__host__ __device__ constexpr TableOffsets table_offsets(int hg) {
  const int xf = 0, xl = xf + hg * kTileTokens * 4 * 16, sx = xl + hg * kTileTokens * 4 * 8;
  const int sig = sx + hg / 2 * kTileTokens * 4, rinv = sig + hg / 2 * kTileTokens * 4;
  return TableOffsets{xf, xl, sx, sig, rinv, rinv + kTileTokens * 4};
}

// Bytes of one token tile's tables for a product of `cols` columns (tile j at tables + j · bytes).
__host__ __device__ constexpr int64_t table_tile_bytes(int64_t cols) { return table_offsets(int(cols / 32)).bytes; }

// Quantises word `word` (columns [8·word, +8)) of token slot t of one tile's tables (o: table_offsets(HG)) from its
// 8 values v, as qmv_dp4a's quantize_block<.., kWide> quantises the word (quantize_word_wide; σ = m / kQMaxWide, σ·Σv
// with Σv over the group's 8 words, as qmv_dp4a's load_lane_x makes it). All 32 lanes call; the 8 lanes of each
// aligned lane octet hold the 8 words of one group of 64 columns in order (lane & 7 == word & 7) or are all idle
// (has = false: v ignored, nothing written; idle lanes' octets must be whole).
__device__ __forceinline__ void table_word(uint8_t* tables, const TableOffsets& o, int word, int t, const float (&v)[8],
                                           bool has) {
  int sumv = 0;
  float m = 0.0f;
  uint2 lo = make_uint2(0u, 0u);
  const uint4 q = quantize_word_wide(v, sumv, m, lo);
  // Σv of the group: its 8 words are the lane octet (integer sums: any order is exact)
  sumv += __shfl_xor_sync(0xffffffffu, sumv, 1);
  sumv += __shfl_xor_sync(0xffffffffu, sumv, 2);
  sumv += __shfl_xor_sync(0xffffffffu, sumv, 4);
  if (!has) return;
  const int hg = word / 4, c = word % 4;
  reinterpret_cast<uint4*>(tables + o.xf)[(hg * kTileTokens + t) * 4 + c] = q;
  reinterpret_cast<uint2*>(tables + o.xl)[(hg * kTileTokens + t) * 4 + c] = lo;
  const float sigma = m / kQMaxWide;
  if ((word & 7) == 0) {
    reinterpret_cast<float*>(tables + o.sx)[(word / 8) * kTileTokens + t] = sigma * float(sumv);
    reinterpret_cast<float*>(tables + o.sig)[(word / 8) * kTileTokens + t] = sigma;
  }
}

// The RMSNorm's factor from the 8 warps' Σx² of a 256-thread quantiser (thread t words t, t + 256, ...; each warp's
// sum a warp_sum of its threads' sums), in warp order: qmv_dp4a's rms_factor.
__device__ __forceinline__ float table_rinv(const float* red8, int cols, float eps) {
  float t = 0.0f;
#pragma unroll
  for (int w = 0; w < 8; ++w) t += red8[w];
  return rsqrtf(t / float(cols) + eps);
}

// One token's row x [cols] (16-byte aligned, cols a multiple of 64) quantised by a block's first 256
// threads, as qmv_dp4a_prequant_kernel quantises it (thread t words t, t + 256, ..., x·norm_w with Σx² per thread
// in that order, then per warp): slot t of the tile at `tables`. With norm_w its rinv too; without, rinv = 1.
// red: 8 floats of shared memory. Threads ≥ 256 return at once; the first 256 end with a barrier of their own
// (bar.sync 1, 256), so a caller of more threads may not use barrier 1 meanwhile. x read through L2 (__ldcg): it
// may be another block's output of the same grid.
__device__ __forceinline__ void table_token(uint8_t* tables, const float* x, int cols, const float* norm_w, float eps,
                                            int t, float* red) {
  if (threadIdx.x >= 256) return;
  const TableOffsets o = table_offsets(cols / 32);
  const int words = cols / 8;
  float ss = 0.0f;
  for (int pass = 0; pass * 256 < words; ++pass) {  // uniform over the 256 threads
    const int word = int(threadIdx.x) + pass * 256;
    const bool has = word < words;
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (has) {
      const float4 a = __ldcg(reinterpret_cast<const float4*>(x) + 2 * word);
      const float4 b = __ldcg(reinterpret_cast<const float4*>(x) + 2 * word + 1);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
      if (norm_w) {
        const float4 n0 = reinterpret_cast<const float4*>(norm_w)[2 * word];
        const float4 n1 = reinterpret_cast<const float4*>(norm_w)[2 * word + 1];
        const float n[8] = {n0.x, n0.y, n0.z, n0.w, n1.x, n1.y, n1.z, n1.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          ss += v[e] * v[e];
          v[e] *= n[e];
        }
      }
    }
    table_word(tables, o, word, t, v, has);
  }
  if (!norm_w) {
    if (threadIdx.x == 0) reinterpret_cast<float*>(tables + o.rinv)[t] = 1.0f;
    return;
  }
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  asm volatile("bar.sync 1, 256;" ::: "memory");
  if (threadIdx.x == 0) reinterpret_cast<float*>(tables + o.rinv)[t] = table_rinv(red, cols, eps);
}

}  // namespace tern::cuda::dp4a
