// attention()'s prefill path: flash attention over the KV cache, one block per (query head, 64 new tokens)
// (attention_prefill_kernel, for T > kDecodeMaxTokens or more query rows than the decode kernels take), its kernels'
// one-time attributes and its launch.
#include "cuda/kernels/attention/attention.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <type_traits>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/attention/attention_i16_tiles.cuh"
#include "cuda/kernels/attention/attention_internal.cuh"
#include "cuda/kernels/attention/attention_tiles.cuh"
#include "cuda/weights/dmat_device.cuh"

namespace tern::cuda {
using namespace attn;
namespace {

// ---- prefill: flash attention, one block per (query head, 64 new tokens) ------------------------------------------
//
// Warp w owns query rows 16(w % 4)..+15 of the tile (tokens t0 + row), the whole head dim: O is 16×DH fp32 in registers
// (DH/8 m16n8 accumulators), one warp a row group (4 warps) unless the keys are sliced (below). Shared memory: Q
// [64][DH], K [64][DH], V [64][DH] 16-bit, swizzled (96 KB at DH = 256: two blocks of 4 warps per SM). The K and V
// tiles are single-buffered and overlapped as in FlashAttention-2: V_j streams in while S = Q·K_jᵀ is computed, K_{j+1}
// while O += P·V_j. Key tiles run 0 → the diagonal; keys past the block's last token (or past the cache rows written)
// are zero-filled and masked.
//
// With an i16 cache each tile is two planes, fp16 hi then lo, the K and V tiles with their rows' scales (I16Tile), and
// a staging area that cp.async fills with a tile's int16 rows, split into the planes once a block
// (attention_i16_tiles.cuh: 224.8 KB at DH = 256, one block per SM; scores_qk_split, accumulate_pv_split): V_j's staged
// chunks are split before the barrier that precedes P·V_j, K_{j+1}'s after P·V_j. At head dims 128 and 256 that is one
// block an SM (by registers or shared memory), so the block has 8 warps (KS = 2 key slices): warps w and w + 4 own the
// same 16 rows, w the first 32 keys of each tile and w + 4 the last 32, each with its own online softmax. At the end
// warp w + 4 hands its maxima, sums and O to warp w through shared memory (over the tiles), and warp w merges and
// writes, and a warp skips a slice of keys that every one of its rows is past. (At head dim 64 three blocks of 4 warps
// fit.)

// Warps that share a row group, each a slice of a tile's keys.
template <int DH, KvDtype KV>
constexpr int kKeySlices = kI16<KV> && DH >= 128 ? 2 : 1;

template <int DH, KvDtype KV>
constexpr size_t prefill_smem_bytes() {
  if constexpr (kI16<KV>) return size_t(2) * kPrefillRows * DH * 2 + 2 * I16Tile<DH>::kBytes + I16Staging<DH>::kBytes;
  return size_t(kPrefillRows + 2 * kBlockKeys) * DH * 2;
}

template <int DH, KvDtype KV>
__global__ void __launch_bounds__(128 * kKeySlices<DH, KV>, 2 / kKeySlices<DH, KV>)
    attention_prefill_kernel(const float* q, const float* qg, const void* cache_k, const void* cache_v,
                             const int* pos0_ptr, AttnDims d, float* out) {
  constexpr bool F16 = kF16<KV>;
  constexpr int KS = kKeySlices<DH, KV>, NTH = 128 * KS;
  static_assert(KS == 1 || kI16<KV>, "the other caches' tile copies take 128 threads");
  constexpr int BM = kPrefillRows, BN = kBlockKeys, CH = DH / 8, NT = DH / 8, PL = kPlanes<KV>;
  constexpr int SK = BN / KS, SN = SK / 8;  // a warp's keys of each tile, its score accumulators
  constexpr uint32_t Q_LO = BM * DH * 2;    // i16: q's lo plane
  constexpr uint32_t KV_TILE = kI16<KV> ? I16Tile<DH>::kBytes : BN * DH * 2;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sq = smem_addr(smem), sk = sq + PL * BM * DH * 2, sv = sk + KV_TILE;
  const uint32_t sstg = sv + KV_TILE;  // i16: the staging (I16Staging)
  int e_v = 0;  // i16: the power of two (2^e_v) the output accumulators count in
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
  const int slice = KS == 1 ? 0 : warp / 4, key0 = slice * SK;  // this warp's keys of each tile: key0..+SK - 1
  const int h = blockIdx.x, kvh = h / (d.Hq / d.Hkv);
  const int64_t t0 = int64_t(gridDim.y - 1 - blockIdx.y) * BM;  // the longest rows (latest tokens) start first
  const int64_t T = d.T;

  pdl_wait();
  pdl_trigger();
  const int64_t pos0 = *pos0_ptr;
  const int rows = int(T - t0 < BM ? T - t0 : BM);
  const int64_t kv_end = pos0 + t0 + rows;  // keys [0, kv_end) are read
  const int n_tiles = int((kv_end + BN - 1) / BN);
  using Elem = CacheElem<KV>;
  const Elem* Kh = static_cast<const Elem*>(cache_k) + int64_t(kvh) * d.capacity * DH;
  const Elem* Vh = static_cast<const Elem*>(cache_v) + int64_t(kvh) * d.capacity * DH;
  const float *Ks = nullptr, *Vs = nullptr;  // fp8, i16: the head's row scales
  if constexpr (kScaled<KV>) {
    Ks = row_scales<KV>(static_cast<const uint8_t*>(cache_k), d.Hkv, d.capacity, DH) + int64_t(kvh) * d.capacity;
    Vs = row_scales<KV>(static_cast<const uint8_t*>(cache_v), d.Hkv, d.capacity, DH) + int64_t(kvh) * d.capacity;
  }

  auto load_tile = [&](uint32_t dst, const Elem* base, const float* scales, int64_t k0) {
    if constexpr (kFp8<KV>)
      copy_tile_fp8<DH>(smem + (dst - sq), base + k0 * DH, scales + k0, int(kv_end - k0 < BN ? kv_end - k0 : BN), tid);
    else if constexpr (kI16<KV>)  // into the staging; unstage() then splits it into the tile at dst
      stage_tile_i16<DH, NTH>(sstg, base + k0 * DH, scales + k0, int(kv_end - k0 < BN ? kv_end - k0 : BN), tid);
    else
      copy_tile_async<DH>(dst, base + k0 * DH, int(kv_end - k0 < BN ? kv_end - k0 : BN), tid);
  };

  // i16: this thread's staged chunks of a tile into the planes at dst (after its wait for them).
  auto unstage = [&](uint32_t dst) {
    cp_async_wait<0>();
    unstage_tile_i16<DH, NTH>(smem + (sstg - sq), smem + (dst - sq), tid);
  };

  load_tile(sk, Kh, Ks, 0);
  cp_async_commit();
  // Q tile, fp32 -> 16 bits; rows past T are zero.
#pragma unroll 4
  for (int it = 0; it < BM * CH / NTH; ++it) {
    const int i = tid + it * NTH, r = i / CH, c = i % CH;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if constexpr (kI16<KV>) {  // hi and lo planes
      uint4 lo = val;
      if (r < rows) load8_split(q + ((t0 + r) * d.Hq + h) * DH + c * 8, val, lo);
      *reinterpret_cast<uint4*>(smem + Q_LO + swz<DH>(r, c)) = lo;
    } else if (r < rows) {
      val = load8_as16<F16>(q + ((t0 + r) * d.Hq + h) * DH + c * 8);
    }
    *reinterpret_cast<uint4*>(smem + swz<DH>(r, c)) = val;
  }

  if constexpr (kI16<KV>) unstage(sk);

  const float sl = rsqrtf(float(DH)) * kLog2e;
  const int row0 = (KS == 1 ? warp : warp % 4) * 16;
  // Last key each of this thread's rows (g, g+8) may see; rows past T see every loaded key (their output is dropped).
  int64_t limit[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int64_t lim = pos0 + t0 + row0 + g + 8 * hf;
    limit[hf] = lim < kv_end - 1 ? lim : kv_end - 1;
  }
  const int64_t warp_first_limit = pos0 + t0 + row0 < kv_end - 1 ? pos0 + t0 + row0 : kv_end - 1;
  const int64_t warp_last_limit = pos0 + t0 + row0 + 15 < kv_end - 1 ? pos0 + t0 + row0 + 15 : kv_end - 1;

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  for (int j = 0; j < n_tiles; ++j) {
    const int64_t k0 = int64_t(j) * BN, ks0 = k0 + key0;  // the tile's first key, this warp's slice's
    cp_async_wait<0>();
    __syncthreads();  // K_j (and Q) are in; every warp is done with V_{j-1}
    load_tile(sv, Vh, Vs, k0);
    cp_async_commit();

    // A slice past every one of the warp's rows' last key adds nothing: skipped.
    const bool live = KS == 1 || ks0 <= warp_last_limit;
    float s[SN][4];
    if (live) {
      if constexpr (kI16<KV>) {
        scores_qk_split<DH, SN>(s, sq, Q_LO, row0, sk + key0 * DH * 2, 0, lane);
        i16_scale_scores<SN>(s, reinterpret_cast<const float*>(smem + (sk - sq) + I16Tile<DH>::kScales) + key0, qd);
      } else {
        scores_qk<DH, SN, F16>(s, sq, row0, sk + key0 * DH * 2, 0, lane);
      }
      if (ks0 + SK - 1 > warp_first_limit) {  // the diagonal (or the end of the written keys) crosses this slice
        const int rel[2] = {clamp_rel(limit[0] - ks0, SK), clamp_rel(limit[1] - ks0, SK)};
        mask_scores<SN>(s, rel, qd);
      }
      online_softmax<SN, NT>(s, m, l, o, sl);
    }

    if constexpr (kI16<KV>) unstage(sv);  // V_j's planes: free since the barrier above (P·V_{j-1} is done)
    cp_async_wait<0>();
    __syncthreads();  // V_j is in; every warp is done with K_j
    if (j + 1 < n_tiles) load_tile(sk, Kh, Ks, k0 + BN);
    cp_async_commit();

    if constexpr (kI16<KV>) {
      if (live) {
        const float* v_scales = reinterpret_cast<const float*>(smem + (sv - sq) + I16Tile<DH>::kScales);
        const int e = i16_tile_exponent(v_scales, lane);
        i16_rescale_o<NT>(o, e_v, e);
        accumulate_pv_split<DH, SN>(o, s, sv + key0 * DH * 2, v_scales + key0, e, 0, lane);
      }
      if (j + 1 < n_tiles) unstage(sk);  // K_{j+1}'s planes: free since the barrier above (Q·K_jᵀ is done)
    } else {
      accumulate_pv<DH, SN, F16>(o, s, sv + key0 * DH * 2, 0, lane);
    }
  }
  cp_async_wait<0>();
  if constexpr (kI16<KV>) i16_rescale_o<NT>(o, e_v, 0);  // back to units of 1

  if constexpr (KS == 2) {
    // Warp w + 4 -> warp w: its maxima, partial sums and O, each lane's at [value][lane] of the warp's area (over the
    // K and V tiles, free once every warp is past the loop).
    constexpr int VALS = 4 + 4 * NT;
    static_assert(4 * VALS * 32 * 4 <= 2 * KV_TILE, "the merge's area");
    float* area = reinterpret_cast<float*>(smem + (sk - sq)) + (warp % 4) * VALS * 32 + lane;
    __syncthreads();
    if (slice == 1) {
      area[0] = m[0], area[32] = m[1], area[64] = l[0], area[96] = l[1];
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) area[(4 + 4 * n + i) * 32] = o[n][i];
    }
    __syncthreads();
    if (slice == 1) return;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float m1 = area[32 * hf], m_new = fmaxf(m[hf], m1);
      const float base = m_new == -INFINITY ? 0.0f : m_new * sl;
      const float c0 = exp2f(m[hf] * sl - base), c1 = exp2f(m1 * sl - base);  // 0 for a slice that saw no key
      l[hf] = l[hf] * c0 + area[32 * (2 + hf)] * c1;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          o[n][2 * hf + e] = o[n][2 * hf + e] * c0 + area[(4 + 4 * n + 2 * hf + e) * 32] * c1;
    }
  }

  store_output<DH>(o, l, qg, out, d, h, t0 + row0 + g, qd);
}

template <int DH, KvDtype KV>
void prefill_setup_kernel(int optin) {
  constexpr size_t prefill = prefill_smem_bytes<DH, KV>();
  if (prefill > size_t(optin)) return;  // unusable on this device; attention() reports it
  TERN_CUDA(cudaFuncSetAttribute(attention_prefill_kernel<DH, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(prefill)));
  TERN_CUDA(cudaFuncSetAttribute(attention_prefill_kernel<DH, KV>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 int(cudaSharedmemCarveoutMaxShared)));
}

template <int DH>
void prefill_setup_dh(int optin) {
  prefill_setup_kernel<DH, KvDtype::f16>(optin);
  prefill_setup_kernel<DH, KvDtype::bf16>(optin);
  prefill_setup_kernel<DH, KvDtype::fp8>(optin);
  prefill_setup_kernel<DH, KvDtype::i16>(optin);
}

}  // namespace

namespace attn {

void prefill_setup(int optin) {
  prefill_setup_dh<64>(optin);
  prefill_setup_dh<128>(optin);
  prefill_setup_dh<256>(optin);
}

size_t prefill_smem(const AttnDims& d) {
  size_t bytes = 0;
  with_head_dim(d, [&]<int DH, KvDtype KV>() { bytes = prefill_smem_bytes<DH, KV>(); });
  return bytes;
}

void attention_prefill(const float* q, const float* qg, const void* cache_k, const void* cache_v, const int* pos0,
                       const AttnDims& d, float* out, cudaStream_t stream) {
  with_head_dim(d, [&]<int DH, KvDtype KV>() {
    const AttentionSetup& setup = attention_setup();
    constexpr size_t smem = prefill_smem_bytes<DH, KV>();
    TERN_CHECK(smem <= size_t(setup.smem_optin), "attention: the prefill kernel (", kv_dtype_name(KV),
               " cache) needs ", smem, " bytes of shared memory, the device has ", setup.smem_optin);
    const int64_t tiles = (d.T + kPrefillRows - 1) / kPrefillRows;
    TERN_CHECK(tiles <= 65535, "attention: ", d.T, " tokens in one call exceed the grid limit");
    launch_pdl("attention_prefill", attention_prefill_kernel<DH, KV>, dim3(unsigned(d.Hq), unsigned(tiles)),
               dim3(128 * kKeySlices<DH, KV>),
               smem, stream, q, qg, cache_k, cache_v, pos0, d, out);
  });
}

}  // namespace attn
}  // namespace tern::cuda
