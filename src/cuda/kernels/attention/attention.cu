// Over 1,000 lines in one file: the prefill (flash) and decode (split-KV) kernels share the device helpers of the
// anonymous namespace below (cp.async and ldmatrix over swizzled tiles, the 16-bit mma, score masks), and one host
// side sets both up and picks between them. The batched calls (one token of each of B sequences) are the same
// kernels with a sequence index (Seqs), so that a sequence's arithmetic is the one it gets alone.
//
// The batched split kernel has a second, opt-in schedule pending measurement (TERN_ATTN_BATCH_ITEMS=auto or N;
// attn_batch_set_items): attention_decode_items_kernel, one block running several (sequence, KV head, split) items
// in turn, the next item's first K/V tiles copied while it computes, combines and writes the current one. Today's
// one-item kernel spends 36 µs a launch at 8 streams × 4K (docs/benchmarks.md, real clocks: 1,040 one-tile blocks,
// the stream idle in each block's prologue and epilogue) for 64 MB that the memory reads in ~14 µs. Both run an item
// through the same helpers (decode_item .. decode_combine_write), so the form gives the same bits.
#include "cuda/kernels/attention/attention.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "core/check.h"
#include "cpu/ops_rope.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/weights/dmat_device.cuh"

namespace tern::cuda {
namespace {

constexpr int kBlockKeys = 64;        // keys per K/V tile in shared memory (both paths)
constexpr int kPrefillRows = 64;      // new tokens per prefill block: 4 warps × 16 rows
constexpr int kDecodeMaxTokens = 8;   // T <= 8 takes the split-KV decode path
constexpr int kDecodeMaxRows = 64;    // T·(Hq/Hkv) query rows per decode block: 4 warps × 16 rows at most
constexpr int kMaxRopeHalf = 64;      // rot/2 <= 64
constexpr int kMaxBatch = 32;         // AttnBatch::B
constexpr float kLog2e = 1.4426950408889634f;

// ---- small device helpers (the cp.async, ldmatrix and bf16 mma wrappers are common/ptx.cuh's) ------------------

// Waits until at most n (0..3) committed groups are pending.
__device__ __forceinline__ void cp_async_wait_dyn(int n) {
  if (n <= 0) cp_async_wait<0>();
  else if (n == 1) cp_async_wait<1>();
  else if (n == 2) cp_async_wait<2>();
  else cp_async_wait<3>();
}

// The 16-bit element type of q and the softmax weights on the tensor cores, and of the K/V tiles in shared memory:
// F16 = true is fp16 (11 significant bits; magnitudes past 65504 saturate to ±65504 when stored, NaN stays NaN:
// pack16), false bf16 (8 bits). The kernels take the cache's type (AttnDims::kv) as a template parameter KV: fp16 and
// fp8 caches compute in fp16 (kF16), a bf16 cache in bf16.
template <KvDtype KV>
constexpr bool kF16 = KV != KvDtype::bf16;
template <KvDtype KV>
constexpr bool kFp8 = KV == KvDtype::fp8;
// A cache row's element: 16 bits, or an e4m3 byte.
template <KvDtype KV>
using CacheElem = std::conditional_t<kFp8<KV>, uint8_t, uint16_t>;
//
// c[16×8] += a[16×16] · b[16×8], 16-bit inputs, fp32 accumulators. Fragments (g = lane/4, c = lane%4):
//   a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..);  b0 (k 2c..2c+1, n g), b1 (k 2c+8.., n g);
//   c0 (g, 2c), c1 (g, 2c+1), c2 (g+8, 2c), c3 (g+8, 2c+1).
template <bool F16>
__device__ __forceinline__ void mma16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  if constexpr (F16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    mma_bf16_16816_volatile(c, a, b0, b1);
  }
}

// Two floats -> a packed 16-bit pair (round to nearest even), `lo` in the low half (the lower column); every 16-bit
// value of this file (the KV cache, q, the softmax weights) is made here. fp16 is .satfinite (PTX 8.1, sm_80+): a
// magnitude past 65504, ±inf included, becomes ±65504, and NaN stays NaN so that it reaches the output (a clamp by
// fmaxf/fminf would make it a finite -65504: fmaxf drops NaN). bf16, with fp32's exponent range, only rounds.
template <bool F16>
__device__ __forceinline__ uint32_t pack16(float lo, float hi) {
  if constexpr (F16) {
    uint32_t r;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  } else {
    return cvt_bf16x2(lo, hi);
  }
}

// Byte offset of 16-byte chunk c of row r in a [rows][DH] 16-bit tile. The chunk index is XOR-swizzled with r % 8, so
// the 8 rows an ldmatrix reads at one logical chunk land in 8 distinct bank groups (no conflicts, no padding).
template <int DH>
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return uint32_t(r * (DH * 2) + ((c ^ (r & 7)) << 4));
}

// 8 fp32 values (a, b) -> one 16-byte chunk of 16-bit values.
template <bool F16>
__device__ __forceinline__ uint4 pack8_as16(const float4 a, const float4 b) {
  return make_uint4(pack16<F16>(a.x, a.y), pack16<F16>(a.z, a.w), pack16<F16>(b.x, b.y), pack16<F16>(b.z, b.w));
}

// 8 fp32 values at src -> one 16-byte chunk of 16-bit values.
template <bool F16>
__device__ __forceinline__ uint4 load8_as16(const float* src) {
  return pack8_as16<F16>(reinterpret_cast<const float4*>(src)[0], reinterpret_cast<const float4*>(src)[1]);
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// ---- the fp8 cache (KvDtype::fp8; attention.cuh has the format, core/fp8.h the CPU twin) ----------------------

// The rows' scales of an fp8 cache [Hkv, capacity, DH] bytes: [Hkv, capacity] fp32 after them.
template <typename Byte>  // uint8_t or const uint8_t
__device__ __forceinline__ auto fp8_scales(Byte* cache, int Hkv, int64_t capacity, int dh) {
  using Float = std::conditional_t<std::is_const_v<Byte>, const float, float>;
  return reinterpret_cast<Float*>(cache + int64_t(Hkv) * capacity * dh);
}

// The scale of a row whose largest magnitude is amax (NaN already dropped by fmaxf): amax / 448, ±inf as FLT_MAX.
__device__ __forceinline__ float fp8_row_scale(float amax) { return __fdiv_rn(fminf(amax, FLT_MAX), 448.0f); }

// The largest magnitude of the DH-value row that a group of CH = DH/8 lanes holds (8 values each), NaN ignored; every
// lane of the warp must call it (the shuffles span the group).
template <int DH>
__device__ __forceinline__ float row_amax(const float (&v)[8]) {
  constexpr int CH = DH / 8;
  float a = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) a = fmaxf(a, fabsf(v[e]));
#pragma unroll
  for (int off = CH / 2; off > 0; off >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, off));
  return a;
}

// 8 values of a row -> 8 e4m3 bytes, value e at byte e: e4m3(x / scale), round to nearest even, satfinite (±448; NaN
// stays NaN). A zero scale (a row of zeros) stores x itself: ±0, or NaN.
__device__ __forceinline__ uint2 quantize8_fp8(const float (&v)[8], float scale) {
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float x = scale > 0.0f ? __fdiv_rn(v[e], scale) : v[e];
    w[e / 4] |= uint32_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)) << (8 * (e % 4));
  }
  return make_uint2(w[0], w[1]);
}

// Lane c's 8 values of row `pos` of KV head `head` into an fp8 cache of `capacity` rows per head, and the row's
// scale (lane 0 of the row's group).
template <int DH>
__device__ __forceinline__ void store_fp8_chunk(void* cache, int Hkv, int64_t capacity, int head, int64_t pos, int c,
                                                const float (&x)[8], float scale) {
  uint8_t* bytes = static_cast<uint8_t*>(cache);
  const int64_t row = int64_t(head) * capacity + pos;
  *reinterpret_cast<uint2*>(bytes + row * DH + 8 * c) = quantize8_fp8(x, scale);
  if (c == 0) fp8_scales(bytes, Hkv, capacity, DH)[row] = scale;
}

// Two e4m3 bytes (the lower one first) and their row's scale -> a packed fp16 pair: fp16(float(e4m3) · scale), the
// product rounded to fp32 and then to fp16 (pack16: nearest even, satfinite, NaN kept). e4m3 -> fp16 is exact.
__device__ __forceinline__ uint32_t dequant2_f16(uint32_t two, float scale) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  return pack16<true>(f.x * scale, f.y * scale);
}

// 8 e4m3 bytes (value e at byte e) -> one 16-byte chunk of 8 fp16 values.
__device__ __forceinline__ uint4 dequant8_f16(uint32_t lo, uint32_t hi, float scale) {
  return make_uint4(dequant2_f16(lo & 0xffffu, scale), dequant2_f16(lo >> 16, scale), dequant2_f16(hi & 0xffffu, scale),
                    dequant2_f16(hi >> 16, scale));
}

// One online-softmax step for a warp's 16 rows (this thread: rows g and g+8, hf = 0/1) over SN·8 new scores s (raw
// q·k, −inf where masked). m: running raw max; l: this thread's partial row sum (its own columns; the 4 threads of a
// row are summed at the end); o: the output accumulators, rescaled. On return s holds p = 2^(s·sl − m·sl).
template <int SN, int NT>
__device__ __forceinline__ void online_softmax(float (&s)[SN][4], float (&m)[2], float (&l)[2], float (&o)[NT][4],
                                               float sl) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < SN; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * hf], s[n][2 * hf + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[hf], mx);
    const float base = m_new == -INFINITY ? 0.0f : m_new * sl;  // a row with no key yet: everything stays 0
    const float corr = exp2f(m[hf] * sl - base);                 // 0 when m was −inf
    m[hf] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < SN; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = exp2f(fmaf(s[n][2 * hf + e], sl, -base));
        s[n][2 * hf + e] = p;
        sum += p;
      }
    }
    l[hf] = l[hf] * corr + sum;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      o[n][2 * hf] *= corr;
      o[n][2 * hf + 1] *= corr;
    }
  }
}

// Per-lane byte offsets for ldmatrix over swizzled tiles. A logical chunk c = 8·hi + lo (lo < 8) of row r sits at
// r·2·DH + 128·hi + 16·(lo ^ (r & 7)); the lanes' rows are ≡ lane (mod 8) in every use below, so the lane-dependent
// part only depends on lo, and the 4 even values of lo give 4 base offsets; the rest are immediates.
template <int DH>
struct LdmOffsets {
  uint32_t base[4];
  // rows: row0 + (lane & 7) + 8·row_bit; chunk low part: 2·i + chunk_bit, i < 4.
  __device__ __forceinline__ LdmOffsets(int row0, int lane, int row_bit, int chunk_bit) {
    const int r = row0 + (lane & 7) + 8 * row_bit;
#pragma unroll
    for (int i = 0; i < 4; ++i) base[i] = uint32_t(r * DH * 2 + (((2 * i + chunk_bit) ^ (r & 7)) << 4));
  }
  // Offset of the 8×8 matrix at logical chunk 2·k (k < DH/16) and `rows` rows further down (a multiple of 8).
  __device__ __forceinline__ uint32_t at(int k, int rows) const {
    return base[k & 3] + uint32_t((k >> 2) * 128 + rows * DH * 2);
  }
};

// S[16 rows][SN·8 keys] = Q[rows q_row0..+15] · K[keys k_row0..]ᵀ over DH dims (both swizzled 16-bit tiles in smem).
template <int DH, int SN, bool F16>
__device__ __forceinline__ void scores_qk(float (&s)[SN][4], uint32_t sq, int q_row0, uint32_t sk, int k_row0,
                                          int lane) {
  // Q matrices: (rows 0-7, dims 16kk..+7), (rows 8-15, same), (rows 0-7, dims +8..+15), (rows 8-15, +8..)
  const LdmOffsets<DH> qo(q_row0, lane, (lane >> 3) & 1, lane >> 4);
  // K matrices: (keys 16p+0-7, dims 16kk..+7), (same keys, +8..+15), (keys 16p+8-15, 16kk..), (keys +8-15, +8..)
  const LdmOffsets<DH> ko(k_row0, lane, lane >> 4, (lane >> 3) & 1);
#pragma unroll
  for (int n = 0; n < SN; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < DH / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, sq + qo.at(kk, 0));
#pragma unroll
    for (int p = 0; p < SN / 2; ++p) {
      uint32_t b[4];
      ldmatrix_x4(b, sk + ko.at(kk, 16 * p));
      mma16<F16>(s[2 * p], a, b[0], b[1]);
      mma16<F16>(s[2 * p + 1], a, b[2], b[3]);
    }
  }
}

// O[16 rows][DH] += P[16 rows][SN·8 keys] · V[keys v_row0..][DH], P from the score accumulators (rounded to 16 bits).
template <int DH, int SN, bool F16>
__device__ __forceinline__ void accumulate_pv(float (&o)[DH / 8][4], const float (&p)[SN][4], uint32_t sv, int v_row0,
                                              int lane) {
  // .trans matrices: (keys 0-7, dims 16np..+7), (keys 8-15, same dims), (keys 0-7, dims +8..), (keys 8-15, +8..)
  const LdmOffsets<DH> vo(v_row0, lane, (lane >> 3) & 1, lane >> 4);
#pragma unroll
  for (int kk = 0; kk < SN / 2; ++kk) {
    uint32_t a[4];
    a[0] = pack16<F16>(p[2 * kk][0], p[2 * kk][1]);
    a[1] = pack16<F16>(p[2 * kk][2], p[2 * kk][3]);
    a[2] = pack16<F16>(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    a[3] = pack16<F16>(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
    for (int np = 0; np < DH / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, sv + vo.at(np, 16 * kk));
      mma16<F16>(o[2 * np], a, b[0], b[1]);
      mma16<F16>(o[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// Masks (−inf) the scores of keys past each row's last visible key. rel_limit[hf]: that key minus the first key of
// the slice (clamped to [-1, SN·8]); this thread's columns are 8n + 2c + e.
template <int SN>
__device__ __forceinline__ void mask_scores(float (&s)[SN][4], const int (&rel_limit)[2], int qd) {
#pragma unroll
  for (int n = 0; n < SN; ++n)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (8 * n + 2 * qd + e > rel_limit[hf]) s[n][2 * hf + e] = -INFINITY;
}

__device__ __forceinline__ int clamp_rel(int64_t x, int hi) { return x < -1 ? -1 : x > hi ? hi : int(x); }

// This thread's share of copying rows [0, 64) of a [rows][DH] 16-bit tile from global (row stride DH) into a
// swizzled smem tile: rows tid/CH + i·(128/CH), chunk tid%CH. Rows >= valid_rows are zero-filled, not read.
template <int DH>
__device__ __forceinline__ void copy_tile_async(uint32_t dst, const uint16_t* src, int valid_rows, int tid) {
  constexpr int CH = DH / 8, RP = 128 / CH;
  const int c = tid % CH, r0 = tid / CH;
  const uint16_t* s = src + r0 * DH + c * 8;
#pragma unroll
  for (int i = 0; i < kBlockKeys / RP; ++i) {
    const int r = r0 + i * RP;
    cp_async_16(dst + swz<DH>(r, c), s + i * RP * DH, r < valid_rows ? 16u : 0u);
  }
}

// copy_tile_async for an fp8 cache: this thread's share of rows [0, 64) of an e4m3 tile (row stride DH bytes, `scale`
// the rows' scales) dequantised to fp16 (dequant8_f16) into the same swizzled 16-bit smem tile at `dst` (a generic
// pointer): 16 values a load, rows tid/CH + i·(128/CH), chunks 2·(tid%CH) and +1. Rows >= valid_rows are zero-filled,
// not read. Plain loads and stores, each thread's loads issued before its first store; the callers' cp_async waits
// (of nothing) and __syncthreads order them as they order the copies.
template <int DH>
__device__ __forceinline__ void copy_tile_fp8(uint8_t* dst, const uint8_t* src, const float* scale, int valid_rows,
                                              int tid) {
  constexpr int CH = DH / 16, RP = 128 / CH, N = kBlockKeys / RP;
  const int c = tid % CH, r0 = tid / CH;
  uint4 raw[N];
  float sc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int r = r0 + i * RP;
    raw[i] = make_uint4(0u, 0u, 0u, 0u);
    sc[i] = 0.0f;
    if (r < valid_rows) {
      raw[i] = *reinterpret_cast<const uint4*>(src + int64_t(r) * DH + 16 * c);
      sc[i] = scale[r];
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int r = r0 + i * RP;
    *reinterpret_cast<uint4*>(dst + swz<DH>(r, 2 * c)) = dequant8_f16(raw[i].x, raw[i].y, sc[i]);
    *reinterpret_cast<uint4*>(dst + swz<DH>(r, 2 * c + 1)) = dequant8_f16(raw[i].z, raw[i].w, sc[i]);
  }
}

// ---- the sequences of a launch ----------------------------------------------------------------------------------
//
// Every kernel below runs B sequences of T new tokens each, row i = b·T + t of q_out, out and the decode partials:
// attn_prepare and attention are B = 1 (one sequence's T tokens, its position, cache and split count given as
// scalars), attn_prepare_batched and attention_batched are T = 1 (B sequences, each from AttnBatch's tables). A kernel
// takes a sequence's values from seq_at / splits_at in both forms, so its arithmetic is the same code either way.

// Elem: void (attn_prepare writes the caches), const void (attention reads them); the caches in AttnDims::kv's type.
template <typename Elem>
struct Seqs {
  int B = 1;
  // No tables (B = 1): the one sequence's first position, cache [Hkv, capacity, dh] and decode split count.
  const int* pos0 = nullptr;
  Elem* cache_k = nullptr;
  Elem* cache_v = nullptr;
  int64_t capacity = 0;
  int splits = 1;
  // The batched calls: AttnBatch's tables, [B] each.
  const int* const* pos0_of = nullptr;
  void* const* cache_k_of = nullptr;
  void* const* cache_v_of = nullptr;
  const int64_t* capacity_of = nullptr;
  const int* splits_of = nullptr;
  // attn_prepare's rotary offsets (AttnRope::delta): the one sequence's, or the batched calls' table; null: 0.
  const int* rope_delta = nullptr;
  const int* const* rope_delta_of = nullptr;
};

template <typename Elem>
struct Seq {
  int64_t pos0;  // the position of the sequence's first new token
  Elem* cache_k;
  Elem* cache_v;
  int64_t capacity;
};

template <typename Elem>
__device__ __forceinline__ Seq<Elem> seq_at(const Seqs<Elem>& s, int b) {
  if (s.pos0_of) return {*s.pos0_of[b], s.cache_k_of[b], s.cache_v_of[b], s.capacity_of[b]};
  return {*s.pos0, s.cache_k, s.cache_v, s.capacity};
}

template <typename Elem>
__device__ __forceinline__ int splits_at(const Seqs<Elem>& s, int b) {
  return s.splits_of ? s.splits_of[b] : s.splits;
}

// Sequence b's M-RoPE delta (0 without one). attn_prepare only, after its pdl_wait.
template <typename Elem>
__device__ __forceinline__ int64_t rope_delta_at(const Seqs<Elem>& s, int b) {
  const int* delta = s.rope_delta_of ? s.rope_delta_of[b] : s.rope_delta;
  return delta ? *delta : 0;
}

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
  } else if (live && is_v) {  // value head: a plain copy into the cache
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(s.cache_v) + (int64_t(h - d.Hq - d.Hkv) * s.capacity + pos) * DH +
                              8 * c) = pack8_16<F16>(x);
  }
  rope_cos_sin(rope_pos, axes.section, c, d.rot, inv_s, cs, sn);
  norm_rope_chunk<DH>(x, w, d.eps, d.rot, c, cs, sn);  // every lane: the shuffles span the warp
  float k_scale = 0.0f;  // fp8: the row's scale after the norm and RoPE (every lane, before any returns)
  if constexpr (kFp8<KV>) k_scale = fp8_row_scale(row_amax<DH>(x));
  if (!live || is_v) return;
  if (is_q) {
    float4* dst = reinterpret_cast<float4*>(q_out + (i * d.Hq + h) * int64_t(DH) + 8 * c);
    dst[0] = make_float4(x[0], x[1], x[2], x[3]);
    dst[1] = make_float4(x[4], x[5], x[6], x[7]);
  } else if constexpr (kFp8<KV>) {
    store_fp8_chunk<DH>(s.cache_k, d.Hkv, s.capacity, h - d.Hq, pos, c, x, k_scale);
  } else {
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(s.cache_k) + (int64_t(h - d.Hq) * s.capacity + pos) * DH + 8 * c) =
        pack8_16<F16>(x);
  }
}

// ---- prefill: flash attention, one block per (query head, 64 new tokens) ------------------------------------------
//
// Warp w owns query rows 16w..16w+15 of the tile (tokens t0 + row), the whole head dim: O is 16×DH fp32 in registers
// (DH/8 m16n8 accumulators). Shared memory: Q [64][DH], K [64][DH], V [64][DH] 16-bit, swizzled (96 KB at DH = 256:
// two blocks per SM). The K and V tiles are single-buffered and overlapped as in FlashAttention-2: V_j streams in
// while S = Q·K_jᵀ is computed, K_{j+1} while O += P·V_j. Key tiles run 0 → the diagonal; keys past the block's last
// token (or past the cache rows written) are zero-filled and masked.

template <int DH>
constexpr size_t prefill_smem_bytes() {
  return size_t(kPrefillRows + 2 * kBlockKeys) * DH * 2;
}

template <int DH, KvDtype KV>
__global__ void __launch_bounds__(128, 2)
    attention_prefill_kernel(const float* q, const float* qg, const void* cache_k, const void* cache_v,
                             const int* pos0_ptr, AttnDims d, float* out) {
  constexpr bool F16 = kF16<KV>;
  constexpr int BM = kPrefillRows, BN = kBlockKeys, CH = DH / 8, NT = DH / 8;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sq = smem_addr(smem), sk = sq + BM * DH * 2, sv = sk + BN * DH * 2;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
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
  const float *Ks = nullptr, *Vs = nullptr;  // fp8: the head's row scales
  if constexpr (kFp8<KV>) {
    Ks = fp8_scales(static_cast<const uint8_t*>(cache_k), d.Hkv, d.capacity, DH) + int64_t(kvh) * d.capacity;
    Vs = fp8_scales(static_cast<const uint8_t*>(cache_v), d.Hkv, d.capacity, DH) + int64_t(kvh) * d.capacity;
  }

  auto load_tile = [&](uint32_t dst, const Elem* base, const float* scales, int64_t k0) {
    if constexpr (kFp8<KV>)
      copy_tile_fp8<DH>(smem + (dst - sq), base + k0 * DH, scales + k0, int(kv_end - k0 < BN ? kv_end - k0 : BN), tid);
    else
      copy_tile_async<DH>(dst, base + k0 * DH, int(kv_end - k0 < BN ? kv_end - k0 : BN), tid);
  };

  load_tile(sk, Kh, Ks, 0);
  cp_async_commit();
  // Q tile, fp32 -> 16 bits; rows past T are zero.
#pragma unroll 4
  for (int it = 0; it < BM * CH / 128; ++it) {
    const int i = tid + it * 128, r = i / CH, c = i % CH;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows) val = load8_as16<F16>(q + ((t0 + r) * d.Hq + h) * DH + c * 8);
    *reinterpret_cast<uint4*>(smem + swz<DH>(r, c)) = val;
  }

  const float sl = rsqrtf(float(DH)) * kLog2e;
  const int row0 = warp * 16;
  // Last key each of this thread's rows (g, g+8) may see; rows past T see every loaded key (their output is dropped).
  int64_t limit[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int64_t lim = pos0 + t0 + row0 + g + 8 * hf;
    limit[hf] = lim < kv_end - 1 ? lim : kv_end - 1;
  }
  const int64_t warp_first_limit = pos0 + t0 + row0 < kv_end - 1 ? pos0 + t0 + row0 : kv_end - 1;

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  for (int j = 0; j < n_tiles; ++j) {
    const int64_t k0 = int64_t(j) * BN;
    cp_async_wait<0>();
    __syncthreads();  // K_j (and Q) are in; every warp is done with V_{j-1}
    load_tile(sv, Vh, Vs, k0);
    cp_async_commit();

    float s[BN / 8][4];
    scores_qk<DH, BN / 8, F16>(s, sq, row0, sk, 0, lane);
    if (k0 + BN - 1 > warp_first_limit) {  // the diagonal (or the end of the written keys) crosses this tile
      const int rel[2] = {clamp_rel(limit[0] - k0, BN), clamp_rel(limit[1] - k0, BN)};
      mask_scores<BN / 8>(s, rel, qd);
    }
    online_softmax<BN / 8, NT>(s, m, l, o, sl);

    cp_async_wait<0>();
    __syncthreads();  // V_j is in; every warp is done with K_j
    if (j + 1 < n_tiles) load_tile(sk, Kh, Ks, k0 + BN);
    cp_async_commit();

    accumulate_pv<DH, BN / 8, F16>(o, s, sv, 0, lane);
  }
  cp_async_wait<0>();

  // out = O / l · sigmoid(gate)
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float lt = l[hf];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    const float inv = 1.0f / lt;
    const int64_t t = t0 + row0 + g + 8 * hf;
    if (t < T) {
      const float* gate = qg + (t * d.Hq + h) * 2 * DH + DH;
      float* dst = out + (t * d.Hq + h) * DH;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const int col = 8 * n + 2 * qd;
        const float2 gv = *reinterpret_cast<const float2*>(gate + col);
        *reinterpret_cast<float2*>(dst + col) =
            make_float2(o[n][2 * hf] * inv * sigmoidf(gv.x), o[n][2 * hf + 1] * inv * sigmoidf(gv.y));
      }
    }
  }
}

// ---- decode: split-KV flash decoding with the query heads of a KV head packed on the rows ------------------------
//
// Block (KV head, split, sequence b) over keys [tile_begin·64, tile_end·64) ∩ [0, pos0 + T) of sequence b; query
// rows r = t·G + hg (token t, head kvh·G + hg), R = T·G <= 16·RW. Warp w = kw·RW + rw handles rows 16rw..16rw+15 and
// keys 16·(4/RW)… of each tile: KW = 4/RW warps split a tile's 64 keys (T·G <= 16: four warps of 16 keys each). K/V
// tiles stream through a `stages`-deep cp.async ring; the KW key-warps are combined in shared memory at the end and
// the block writes the unnormalised partial o with its max m (log2 units) and sum l. Empty splits write m = −inf,
// l = 0 and no o. The grid has the largest split count's columns; a sequence's columns past its own count do nothing.

// Where a launch's split partials are: sequence b's o at o + b·stride·dh, [T, Hq, splits_b, dh]; its m and l at
// m + b·stride and l + b·stride, [T, Hq, splits_b]. attention (one sequence): stride unused; attention_batched:
// stride = Hq·kAttnMaxSplits, room for any split count.
struct Partials {
  float* o = nullptr;
  float* m = nullptr;
  float* l = nullptr;
  int64_t stride = 0;
};

template <int DH, int RW>
constexpr size_t decode_smem_bytes(int stages) {
  const size_t q = size_t(16 * RW) * DH * 2, stats = 2 * 4 * 16 * sizeof(float);
  const size_t tiles = size_t(stages) * 2 * kBlockKeys * DH * 2, merge = 4 * 16 * size_t(DH + 8) * sizeof(float);
  return q + stats + (tiles > merge ? tiles : merge);
}

// ---- the decode kernels' per-item body -------------------------------------------------------------------------
//
// A work item is one (KV head, split, sequence b) of a launch: the one-item kernel (attention_decode_split_kernel)
// runs one per block, the items-per-block form (attention_decode_items_kernel, below it) several in turn. Both run an
// item through the helpers below, so that its arithmetic is one copy of the code: the tile range, the Q rows, each
// tile's scores, masks, online softmax and P·V, the key-warp combine and the partial's writes. Only when the tiles'
// copies are issued differs.

// An item's keys [0, L) (L = pos0 + T) in ⌈L/64⌉ tiles, of which it takes [tb, te) (split `split` of `splits`).
struct DecodeItem {
  int64_t pos0, L, tb, te;
};

__device__ __forceinline__ DecodeItem decode_item(int64_t pos0, int64_t T, int split, int splits) {
  const int64_t L = pos0 + T;  // keys [0, L)
  const int64_t n_tiles = (L + kBlockKeys - 1) / kBlockKeys;
  return {pos0, L, split * n_tiles / splits, (split + 1) * n_tiles / splits};
}

// The K and V rows [capacity, DH] of KV head kvh of a sequence's caches (fp8: and the rows' scales).
template <int DH, KvDtype KV>
struct DecodeKv {
  using Elem = CacheElem<KV>;
  const Elem* Kh;
  const Elem* Vh;
  const float* Ks = nullptr;  // fp8: the head's row scales
  const float* Vs = nullptr;
  __device__ __forceinline__ DecodeKv(const void* cache_k, const void* cache_v, int64_t capacity, int Hkv, int kvh)
      : Kh(static_cast<const Elem*>(cache_k) + int64_t(kvh) * capacity * DH),
        Vh(static_cast<const Elem*>(cache_v) + int64_t(kvh) * capacity * DH) {
    if constexpr (kFp8<KV>) {
      Ks = fp8_scales(static_cast<const uint8_t*>(cache_k), Hkv, capacity, DH) + int64_t(kvh) * capacity;
      Vs = fp8_scales(static_cast<const uint8_t*>(cache_v), Hkv, capacity, DH) + int64_t(kvh) * capacity;
    }
  }
};

// This thread's share of copying tile `tile` (keys tile·64 .. +63; those >= L zero-filled) of K and V into a stage:
// K [64][DH] at `stage` (a generic pointer; smem address sstage), V [64][DH] right after it. 16-bit caches by
// cp.async (the caller commits), fp8 by plain loads and stores (copy_tile_fp8).
template <int DH, KvDtype KV>
__device__ __forceinline__ void decode_load_tile(const DecodeKv<DH, KV>& kv, int64_t L, int64_t tile, uint8_t* stage,
                                                 uint32_t sstage, int tid) {
  constexpr int TILE = kBlockKeys * DH * 2;
  const int64_t k0 = tile * kBlockKeys;
  const int valid = int(L - k0 < kBlockKeys ? L - k0 : kBlockKeys);
  if constexpr (kFp8<KV>) {
    copy_tile_fp8<DH>(stage, kv.Kh + k0 * DH, kv.Ks + k0, valid, tid);
    copy_tile_fp8<DH>(stage + TILE, kv.Vh + k0 * DH, kv.Vs + k0, valid, tid);
  } else {
    copy_tile_async<DH>(sstage, kv.Kh + k0 * DH, valid, tid);
    copy_tile_async<DH>(sstage + TILE, kv.Vh + k0 * DH, valid, tid);
  }
}

// The item's query rows r = t·G + hg (token t, head kvh·G + hg; q: the sequence's rows [T, Hq, DH]), fp32 -> 16 bits,
// into sQ [16·RW][DH] swizzled; rows past R are zero.
template <int DH, int RW, bool F16>
__device__ __forceinline__ void decode_load_q(uint8_t* sQ, const float* q, int Hq, int kvh, int G, int R, int tid) {
  constexpr int CH = DH / 8, QROWS = 16 * RW;
#pragma unroll
  for (int it = 0; it < QROWS * CH / 128; ++it) {
    const int i = tid + it * 128, r = i / CH, c = i % CH;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (r < R) val = load8_as16<F16>(q + ((int64_t(r / G) * Hq + kvh * G + r % G) * DH + c * 8));
    *reinterpret_cast<uint4*>(sQ + swz<DH>(r, c)) = val;
  }
}

// decode_load_q in two halves, for the items kernel to fetch an item's rows while it combines the item before: this
// thread's fp32 values of them (decode_load_q's chunks, rows past R not read) into registers, then into sQ as
// decode_load_q stores them (pack8_as16: the same conversion).
template <int DH, int RW>
struct DecodeQRows {
  float4 v[16 * RW * (DH / 8) / 128][2];
};

template <int DH, int RW>
__device__ __forceinline__ void decode_fetch_q(DecodeQRows<DH, RW>& f, const float* q, int Hq, int kvh, int G, int R,
                                               int tid) {
  constexpr int CH = DH / 8, QROWS = 16 * RW;
#pragma unroll
  for (int it = 0; it < QROWS * CH / 128; ++it) {
    const int i = tid + it * 128, r = i / CH, c = i % CH;
    f.v[it][0] = f.v[it][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < R) {
      const float4* src = reinterpret_cast<const float4*>(q + ((int64_t(r / G) * Hq + kvh * G + r % G) * DH + c * 8));
      f.v[it][0] = src[0];
      f.v[it][1] = src[1];
    }
  }
}

template <int DH, int RW, bool F16>
__device__ __forceinline__ void decode_store_q(uint8_t* sQ, const DecodeQRows<DH, RW>& f, int R, int tid) {
  constexpr int CH = DH / 8, QROWS = 16 * RW;
#pragma unroll
  for (int it = 0; it < QROWS * CH / 128; ++it) {
    const int i = tid + it * 128, r = i / CH, c = i % CH;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (r < R) val = pack8_as16<F16>(f.v[it][0], f.v[it][1]);
    *reinterpret_cast<uint4*>(sQ + swz<DH>(r, c)) = val;
  }
}

// The last key each of this thread's rows (row0 + g, +8) may see: pos0 + t; padding rows see all keys.
__device__ __forceinline__ void decode_limits(int64_t (&limit)[2], const DecodeItem& it, int row0, int g, int G,
                                              int R) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = row0 + g + 8 * hf;
    limit[hf] = r < R ? it.pos0 + r / G : it.L - 1;
  }
}

// One tile j of the item (K at sk, V at sk + TILE): this warp's rows row0.. against its keys kb..kb+KPW-1 of the tile,
// scores, masks, online softmax and O += P·V.
template <int DH, int RW, bool F16>
__device__ __forceinline__ void decode_tile(float (&m)[2], float (&l)[2], float (&o)[DH / 8][4],
                                            const int64_t (&limit)[2], uint32_t sq, uint32_t sk, int64_t j,
                                            int64_t pos0, int row0, int kb, float sl, int lane, int qd) {
  constexpr int KW = 4 / RW, KPW = kBlockKeys / KW, SN = KPW / 8, TILE = kBlockKeys * DH * 2;
  float s[SN][4];
  scores_qk<DH, SN, F16>(s, sq, row0, sk, kb, lane);
  const int64_t k0 = j * kBlockKeys + kb;
  if (k0 + KPW - 1 > pos0) {  // keys past pos0 (the new tokens', or past L) are in this slice
    const int rel[2] = {clamp_rel(limit[0] - k0, KPW), clamp_rel(limit[1] - k0, KPW)};
    mask_scores<SN>(s, rel, qd);
  }
  online_softmax<SN, DH / 8>(s, m, l, o, sl);
  accumulate_pv<DH, SN, F16>(o, s, sk + TILE, kb, lane);
}

// Where an item's partials go: row r's at index (t·Hq + kvh·G + hg)·splits + split of the sequence's m, l (o: × DH).
struct DecodePartial {
  float* o;
  float* m;
  float* l;
  int64_t Hq;
  int kvh, G, splits, split;
  __device__ __forceinline__ int64_t index(int r) const { return (int64_t(r / G) * Hq + kvh * G + r % G) * splits + split; }
};

__device__ __forceinline__ DecodePartial decode_partial(const Partials& part, int b, int Hq, int kvh, int G, int splits,
                                                        int split, int dh) {
  return {part.o + b * part.stride * dh, part.m + b * part.stride, part.l + b * part.stride, Hq, kvh, G, splits, split};
}

// An empty item (tb >= te): m = −inf, l = 0, no o.
__device__ __forceinline__ void decode_write_empty(const DecodePartial& p, int R, int tid) {
  for (int r = tid; r < R; r += blockDim.x) {
    p.m[p.index(r)] = -INFINITY;
    p.l[p.index(r)] = 0.0f;
  }
}

// The key-warp combine, first half: each warp's m, row sums and o into s_m, s_l [4 warps][16] and sO
// [4 warps][16][DH + 8] fp32. The caller then syncs the block and calls decode_combine_write.
template <int DH>
__device__ __forceinline__ void decode_combine_stage(const float (&m)[2], const float (&l)[2],
                                                     const float (&o)[DH / 8][4], float* s_m, float* s_l, float* sO,
                                                     int warp, int g, int qd) {
  constexpr int OSTRIDE = DH + 8;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float lt = l[hf];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    if (qd == 0) {
      s_m[warp * 16 + g + 8 * hf] = m[hf];
      s_l[warp * 16 + g + 8 * hf] = lt;
    }
    float* row = sO + (warp * 16 + g + 8 * hf) * OSTRIDE;
#pragma unroll
    for (int n = 0; n < DH / 8; ++n)
      *reinterpret_cast<float2*>(row + 8 * n + 2 * qd) = make_float2(o[n][2 * hf], o[n][2 * hf + 1]);
  }
}

// The key-warp combine, second half: the KW key-warps of each of the R rows weighted by 2^(m_w − M) into the
// item's partial: unnormalised o, m = M·sl (log2 units), l.
template <int DH, int RW>
__device__ __forceinline__ void decode_combine_write(const float* s_m, const float* s_l, const float* sO,
                                                     const DecodePartial& p, int R, float sl, int tid) {
  constexpr int KW = 4 / RW, OSTRIDE = DH + 8, C4 = DH / 4;
  for (int i = tid; i < R * C4; i += 128) {
    const int r = i / C4, c = i % C4, rg = r / 16, rr = r % 16;
    float M = -INFINITY;
#pragma unroll
    for (int k = 0; k < KW; ++k) M = fmaxf(M, s_m[(k * RW + rg) * 16 + rr]);
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float lsum = 0.0f;
    if (M != -INFINITY) {
#pragma unroll
      for (int k = 0; k < KW; ++k) {
        const int w = k * RW + rg;
        const float wt = exp2f((s_m[w * 16 + rr] - M) * sl);  // 0 for a warp that saw no key of this row
        const float4 v = *reinterpret_cast<const float4*>(sO + (w * 16 + rr) * OSTRIDE + 4 * c);
        acc.x += wt * v.x;
        acc.y += wt * v.y;
        acc.z += wt * v.z;
        acc.w += wt * v.w;
        lsum += wt * s_l[w * 16 + rr];
      }
    }
    const int64_t pi = p.index(r);
    reinterpret_cast<float4*>(p.o + pi * DH)[c] = acc;  // columns 4c..4c+3 (one 16-byte store)
    if (c == 0) {
      p.m[pi] = M == -INFINITY ? -INFINITY : M * sl;
      p.l[pi] = lsum;
    }
  }
}

// ---- the one-item kernel: one block per (KV head, split, sequence) ----------------------------------------------

template <int DH, int RW, KvDtype KV>
__global__ void __launch_bounds__(128, 1)
    attention_decode_split_kernel(const float* q, Seqs<const void> seqs, AttnDims d, int stages,
                                  bool kv_prefetch_enabled, Partials part) {
  constexpr bool F16 = kF16<KV>;
  constexpr int BN = kBlockKeys, NT = DH / 8;
  constexpr int KW = 4 / RW, KPW = BN / KW;
  constexpr int QROWS = 16 * RW, TILE = BN * DH * 2;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* sQ = smem;                                            // [QROWS][DH] 16-bit, swizzled
  float* s_m = reinterpret_cast<float*>(smem + QROWS * DH * 2);  // [4 warps][16 rows]
  float* s_l = s_m + 4 * 16;
  uint8_t* ring = reinterpret_cast<uint8_t*>(s_l + 4 * 16);     // stages × {K [64][DH], V [64][DH]}
  float* sO = reinterpret_cast<float*>(ring);                     // after the loop: [4 warps][16][OSTRIDE] fp32
  const uint32_t sq = smem_addr(sQ), sring = smem_addr(ring);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
  const int rw = warp % RW, kw = warp / RW;
  const int kvh = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int G = d.Hq / d.Hkv, R = int(d.T) * G;

  // A column past the sequence's own split count (a batched launch, whose grid has the largest count's columns)
  // exits at once, before any pdl_wait or pdl_trigger: a block that exits counts as triggered, and the merge kernel's
  // pdl_wait still waits for this whole grid, whose other blocks (split 0 of every sequence at least) wait for the
  // kernel before. The tables are launch constants (attention_batched), read before the wait like the position.
  const int splits = splits_at(seqs, b);
  if (splits > int(gridDim.y)) __trap();  // attention_batched's d.capacity below this sequence's: fail, loudly
  if (split >= splits) return;
  const Seq<const void> sb = seq_at(seqs, b);
  q += int64_t(b) * d.T * d.Hq * DH;  // the sequence's rows [T, Hq, DH]
  const DecodePartial pp = decode_partial(part, b, d.Hq, kvh, G, splits, split, DH);

  // The position and the cache rows before it were written by earlier steps, complete before this launch (the
  // kernel before it, attn_prepare, triggers after its pdl_wait): tiles of keys < pos0 may stream in before the
  // wait; the tiles holding the new tokens' rows (written by attn_prepare) only after it.
  const DecodeItem it = decode_item(sb.pos0, d.T, split, splits);
  const int64_t pos0 = it.pos0, tb = it.tb, te = it.te;
  if (tb >= te) {
    pdl_wait();
    pdl_trigger();
    decode_write_empty(pp, R, tid);
    return;
  }
  const DecodeKv<DH, KV> kv(sb.cache_k, sb.cache_v, sb.capacity, d.Hkv, kvh);
  auto load_tile = [&](int64_t tile, int stage) {
    decode_load_tile<DH, KV>(kv, it.L, tile, ring + size_t(stage) * 2 * TILE, sring + uint32_t(stage) * 2 * TILE,
                             tid);
  };
  // Tiles [tb, prologue_end) are copied first: stages - 1 of them, or with one stage (a batched launch whose splits
  // hold one or two tiles, see launch_decode) the first tile, into the one stage the loop then refills.
  const int ahead = stages > 1 ? stages - 1 : 1;
  const int64_t prologue_end = tb + ahead < te ? tb + ahead : te;
  const bool early = prologue_end * BN <= pos0 && kv_prefetch_enabled;  // none holds a new row
  if (!early) {
    pdl_wait();
    pdl_trigger();
  }
  for (int s = 0; s < ahead; ++s) {
    if (tb + s < te) load_tile(tb + s, s);
    cp_async_commit();
  }
  if (early) {
    pdl_wait();
    pdl_trigger();
  }
  decode_load_q<DH, RW, F16>(sQ, q, d.Hq, kvh, G, R, tid);

  const float sl = rsqrtf(float(DH)) * kLog2e;
  const int row0 = 16 * rw, kb = kw * KPW;
  int64_t limit[2];
  decode_limits(limit, it, row0, g, G, R);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  for (int64_t j = tb; j < te; ++j) {
    const int i = int(j - tb);
    if (stages == 1) {
      if (j > tb) load_tile(j, 0);  // the stage read at i - 1, free since the barrier that ended it
    } else if (j + stages - 1 < te) {
      load_tile(j + stages - 1, (i + stages - 1) % stages);  // the stage read at i - 1
    }
    cp_async_commit();
    cp_async_wait_dyn(stages - 1);
    __syncthreads();  // tile j is in for every thread
    decode_tile<DH, RW, F16>(m, l, o, limit, sq, sring + uint32_t(i % stages) * 2 * TILE, j, pos0, row0, kb, sl, lane,
                             qd);
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  cp_async_wait<0>();

  // Combine the KW key-warps of each row group through shared memory (the ring is free now).
  decode_combine_stage<DH>(m, l, o, s_m, s_l, sO, warp, g, qd);
  __syncthreads();
  decode_combine_write<DH, RW>(s_m, s_l, sO, pp, R, sl, tid);
}

// ---- the items-per-block form (TERN_ATTN_BATCH_ITEMS; opt-in pending measurement) ------------------------------
//
// attention_batched's split kernel in another schedule: a block runs several work items in turn, items
// it = blockIdx.x + i·gridDim.x of the B·columns·Hkv items it = (b·columns + split)·Hkv + kvh (an item past its
// sequence's split count is skipped, as the one-item kernel's block for it exits). The K/V tiles of the block's items
// form one stream through a ring of `stages` (2 or 3) stages: tile k of the stream goes to stage k % stages, copied
// stages − 1 tiles before it is computed, so the next item's first tiles stream in while the current item's last
// tile is computed and the item is combined and written (a block of the one-item kernel waits for its one tile with
// nothing behind it, and has no copy in flight while it combines and writes). A stage holds a K/V tile pair or the
// combine's sO [4 warps][16][DH + 8] fp32, whichever is larger: an item combines in the stage of its last tile while
// the other stages fill, and the next item's query rows are fetched into registers meanwhile (decode_fetch_q). Each
// item runs the per-item helpers above in the one-item kernel's order, so every partial gets the same bits; only when
// each copy is issued differs (and the order in which the block's items are written).
//
// Shared memory: sQ [16·RW][DH] 16-bit | s_m, s_l [4][16] | stages × stage | the sequence table [B]. At DH = 256:
// 8.5 KB + 3 × 66 KB + 1.3 KB = 207 KB (Hopper: 1 block per SM) or with 2 stages 141 KB (A100's 163 KB); where two
// stages do not fit, the form is off and attention_batched takes the one-item kernel. Only RW = 1 (T·G <= 16, the
// batched step's one token of up to 16 query heads per KV head) has the form.

// A batched launch's sequence, as the items kernel keeps it in shared memory (launch constants, read once a block).
struct DecodeSeqEntry {
  const void* cache_k;
  const void* cache_v;
  int64_t pos0, capacity;
  int splits, unused;
};

template <int DH>
constexpr size_t decode_items_stage_bytes() {
  const size_t tiles = 2 * size_t(kBlockKeys) * DH * 2, merge = 4 * 16 * size_t(DH + 8) * sizeof(float);
  return tiles > merge ? tiles : merge;
}

template <int DH, int RW>
constexpr size_t decode_items_smem_bytes(int stages) {
  return size_t(16 * RW) * DH * 2 + 2 * 4 * 16 * sizeof(float) + size_t(stages) * decode_items_stage_bytes<DH>() +
         kMaxBatch * sizeof(DecodeSeqEntry);
}

template <int DH, int RW, KvDtype KV>
__global__ void __launch_bounds__(128, 1)
    attention_decode_items_kernel(const float* q, Seqs<const void> seqs, AttnDims d, int columns, int stages,
                                  bool kv_prefetch_enabled, Partials part) {
  constexpr bool F16 = kF16<KV>;
  constexpr int BN = kBlockKeys, NT = DH / 8;
  constexpr int KW = 4 / RW, KPW = BN / KW;
  constexpr int QROWS = 16 * RW;
  constexpr uint32_t STAGE = uint32_t(decode_items_stage_bytes<DH>());
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* sQ = smem;                                            // [QROWS][DH] 16-bit, swizzled
  float* s_m = reinterpret_cast<float*>(smem + QROWS * DH * 2);  // [4 warps][16 rows]
  float* s_l = s_m + 4 * 16;
  uint8_t* ring = reinterpret_cast<uint8_t*>(s_l + 4 * 16);     // stages × {K [64][DH], V [64][DH]} or sO
  DecodeSeqEntry* table = reinterpret_cast<DecodeSeqEntry*>(ring + size_t(stages) * STAGE);  // [B]
  const uint32_t sq = smem_addr(sQ), sring = smem_addr(ring);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
  const int rw = warp % RW, kw = warp / RW;
  const int G = d.Hq / d.Hkv, R = int(d.T) * G;
  const int n_items = seqs.B * columns * d.Hkv;

  // The tables are launch constants (attention_batched), read before the wait as the one-item kernel reads them.
  if (tid < seqs.B) {
    const Seq<const void> sb = seq_at(seqs, tid);
    const int splits = splits_at(seqs, tid);
    if (splits > columns) __trap();  // attention_batched's d.capacity below this sequence's: fail, loudly
    table[tid] = {sb.cache_k, sb.cache_v, sb.pos0, sb.capacity, splits, 0};
  }
  __syncthreads();

  // Every block waits for the kernel before (and triggers the merge) before it reads q or a tile with a new row, or
  // writes a partial; a block with no item exits without (it counts as triggered, as the one-item kernel's).
  bool waited = false;
  auto wait_once = [&] {
    if (!waited) {
      pdl_wait();
      pdl_trigger();
      waited = true;
    }
  };

  // The producer: tile p_j of item p_it (of tiles up to p_te) is the stream's next copy; p_it >= n_items: none left.
  int p_it = n_items;
  int64_t p_j = 0, p_te = 0;
  auto seek = [&](int it) {  // the block's first item from `it` on that has a tile
    for (; it < n_items; it += gridDim.x) {
      const int split = (it / d.Hkv) % columns;
      const DecodeSeqEntry& e = table[it / (d.Hkv * columns)];
      if (split >= e.splits) continue;
      const DecodeItem x = decode_item(e.pos0, d.T, split, e.splits);
      if (x.tb < x.te) {
        p_j = x.tb;
        p_te = x.te;
        break;
      }
    }
    p_it = it;
  };
  auto produce = [&](int stage) {  // the next tile (if any) into `stage`, which no warp reads; the caller commits
    if (p_it >= n_items) return;
    const DecodeSeqEntry& e = table[p_it / (d.Hkv * columns)];
    // A tile of keys < pos0 only may stream in before the wait (the one-item kernel's `early`); one with a new row
    // (written by attn_prepare) only after it.
    if (!(kv_prefetch_enabled && (p_j + 1) * BN <= e.pos0)) wait_once();
    const DecodeKv<DH, KV> kv(e.cache_k, e.cache_v, e.capacity, d.Hkv, p_it % d.Hkv);
    decode_load_tile<DH, KV>(kv, e.pos0 + d.T, p_j, ring + size_t(stage) * STAGE, sring + uint32_t(stage) * STAGE,
                             tid);
    if (++p_j >= p_te) seek(p_it + int(gridDim.x));
  };
  seek(blockIdx.x);
  for (int s = 0; s + 1 < stages; ++s) {
    produce(s);
    cp_async_commit();
  }
  // Invariant at each tile: produced − consumed = stages − 1 (one commit group per copy, empty ones included).
  int produced = stages - 1, consumed = 0;

  // The block's items in turn: from `it` on, writes the partials of the empty ones (tb >= te, no tile) and returns
  // the first with a tile (n_items: none left). Skips the columns past a sequence's split count.
  auto next_item = [&](int it) {
    for (; it < n_items; it += gridDim.x) {
      const int kvh = it % d.Hkv, split = (it / d.Hkv) % columns, b = it / (d.Hkv * columns);
      const DecodeSeqEntry& e = table[b];
      if (split >= e.splits) continue;
      wait_once();
      const DecodeItem x = decode_item(e.pos0, d.T, split, e.splits);
      if (x.tb < x.te) break;
      decode_write_empty(decode_partial(part, b, d.Hq, kvh, G, e.splits, split, DH), R, tid);
    }
    return it;
  };
  auto fetch_q = [&](DecodeQRows<DH, RW>& f, int it) {  // item it's query rows (after the wait)
    const int b = it / (d.Hkv * columns);
    decode_fetch_q<DH, RW>(f, q + int64_t(b) * d.T * d.Hq * DH, d.Hq, it % d.Hkv, G, R, tid);
  };

  const float sl = rsqrtf(float(DH)) * kLog2e;
  const int row0 = 16 * rw, kb = kw * KPW;
  DecodeQRows<DH, RW> qrows;
  int it = next_item(blockIdx.x);
  if (it < n_items) fetch_q(qrows, it);
  while (it < n_items) {
    const int kvh = it % d.Hkv, split = (it / d.Hkv) % columns, b = it / (d.Hkv * columns);
    const DecodeSeqEntry& e = table[b];
    const int splits = e.splits;
    const DecodeItem x = decode_item(e.pos0, d.T, split, splits);
    // sQ is free: every warp read the last one before the barrier that ended the block's previous item.
    decode_store_q<DH, RW, F16>(sQ, qrows, R, tid);
    int64_t limit[2];
    decode_limits(limit, x, row0, g, G, R);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    for (int64_t j = x.tb; j < x.te; ++j) {
      produce(produced % stages);  // the stage read at the stream's previous tile (or its item's sO): free
      ++produced;
      cp_async_commit();
      cp_async_wait_dyn(stages - 1);
      __syncthreads();  // tile j is in for every thread (and this item's sQ)
      decode_tile<DH, RW, F16>(m, l, o, limit, sq, sring + uint32_t(consumed % stages) * STAGE, j, x.pos0, row0, kb,
                               sl, lane, qd);
      __syncthreads();  // every warp is done with this stage before it is refilled
      ++consumed;
    }

    // Combine the KW key-warps in the stage of the item's last tile (no copy is in flight to it); the next item's
    // query rows are fetched meanwhile.
    float* sO = reinterpret_cast<float*>(ring + size_t((consumed - 1) % stages) * STAGE);
    decode_combine_stage<DH>(m, l, o, s_m, s_l, sO, warp, g, qd);
    __syncthreads();
    const int next = next_item(it + int(gridDim.x));
    if (next < n_items) fetch_q(qrows, next);
    decode_combine_write<DH, RW>(s_m, s_l, sO, decode_partial(part, b, d.Hq, kvh, G, splits, split, DH), R, sl, tid);
    __syncthreads();  // sO, s_m, s_l and sQ are free again
    it = next;
  }
  cp_async_wait<0>();
}

// out[i, h·dh + j] = (Σ_s 2^{m_s−M} o_s[j]) / (Σ_s 2^{m_s−M} l_s) · sigmoid(gate[i, h, j]) for row i = b·T + t;
// one block per (t, h, sequence b) over the sequence's own split count. Row i of qg at qg + i·ld_qg ([Hq][q | gate]).
// Thread (split group sg, column quad c) sums splits sg, sg + SG, ...; splits of weight 0 (empty) are not read.
template <int DH>
__global__ void __launch_bounds__(256)
    attention_decode_merge_kernel(Partials part, const float* qg, int64_t ld_qg, Seqs<const void> seqs,
                                  AttnDims d, float* out) {
  constexpr int C4 = DH / 4, SG = 256 / C4;
  __shared__ float wts[kAttnMaxSplits];
  __shared__ float inv_sum;
  __shared__ float4 red[256];
  const int tid = threadIdx.x;
  const int64_t th = blockIdx.x, t = th / d.Hq;
  const int h = int(th % d.Hq), b = blockIdx.y;
  const int64_t row = b * d.T + t;  // of qg and out
  const int splits = splits_at(seqs, b);
  const float* const part_o = part.o + b * part.stride * DH;
  const float* const part_m = part.m + b * part.stride;
  const float* const part_l = part.l + b * part.stride;
  pdl_wait();
  pdl_trigger();
  if (tid < 32) {
    float M = -INFINITY;
    for (int s = tid; s < splits; s += 32) M = fmaxf(M, part_m[th * splits + s]);
    M = warp_max(M);
    float L = 0.0f;
    for (int s = tid; s < splits; s += 32) {
      const float ms = part_m[th * splits + s];
      const float w = ms == -INFINITY ? 0.0f : exp2f(ms - M);
      wts[s] = w;
      if (w != 0.0f) L += w * part_l[th * splits + s];
    }
    L = warp_sum(L);
    if (tid == 0) inv_sum = 1.0f / L;
  }
  __syncthreads();
  const int c = tid % C4, sg = tid / C4;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int s = sg; s < splits; s += SG) {
    const float w = wts[s];
    if (w != 0.0f) {
      const float4 v = *reinterpret_cast<const float4*>(part_o + (th * splits + s) * DH + 4 * c);
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
  }
  red[tid] = acc;
  __syncthreads();
  if (sg == 0) {
#pragma unroll
    for (int k = 1; k < SG; ++k) {
      const float4 v = red[k * C4 + c];
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    const float inv = inv_sum;
    const float4 gv = *reinterpret_cast<const float4*>(qg + row * ld_qg + int64_t(h) * 2 * DH + DH + 4 * c);
    *reinterpret_cast<float4*>(out + (row * d.Hq + h) * DH + 4 * c) =
        make_float4(acc.x * inv * sigmoidf(gv.x), acc.y * inv * sigmoidf(gv.y), acc.z * inv * sigmoidf(gv.z),
                    acc.w * inv * sigmoidf(gv.w));
  }
}

// ---- host side --------------------------------------------------------------------------------------------------

struct DecodeVariant {
  int stages = 1;
  size_t smem = 0;
  int blocks_per_sm = 1;
  // The one-stage form of the same kernel (launch_decode takes it for a batched grid of more than one wave whose
  // splits hold at most two tiles): less shared memory, more blocks per SM, the same arithmetic.
  size_t smem_one_stage = 0;
  int blocks_per_sm_one_stage = 1;
  // The items-per-block form (attention_decode_items_kernel; RW = 1 only): its ring's stages (0: the form does not
  // fit this device, attention_batched keeps the one-item kernel), shared memory and blocks per SM.
  int items_stages = 0;
  size_t items_smem = 0;
  int items_blocks_per_sm = 1;
};

struct AttentionSetup {
  int sms = 1, smem_optin = 0;
  DecodeVariant decode[3][3];  // [dh 64/128/256][RW 1/2/4]
};

int dh_index(int dh) { return dh == 64 ? 0 : dh == 128 ? 1 : 2; }
int rw_index(int rw) { return rw == 1 ? 0 : rw == 2 ? 1 : 2; }

template <int DH, int RW>
void setup_decode(AttentionSetup& s, int optin) {
  DecodeVariant& v = s.decode[dh_index(DH)][rw_index(RW)];
  v.stages = 3;
  while (v.stages > 1 && decode_smem_bytes<DH, RW>(v.stages) > size_t(optin)) --v.stages;
  v.smem = decode_smem_bytes<DH, RW>(v.stages);
  if (v.smem > size_t(optin)) return;  // unusable on this device; attention() reports it
  for (auto kernel : {attention_decode_split_kernel<DH, RW, KvDtype::f16>,
                      attention_decode_split_kernel<DH, RW, KvDtype::bf16>,
                      attention_decode_split_kernel<DH, RW, KvDtype::fp8>}) {
    TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(v.smem)));
    TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                   int(cudaSharedmemCarveoutMaxShared)));
  }
  // The split count comes from the fp16 kernel's occupancy for every cache type (the same shared memory; the fp8
  // kernel's registers may differ), so that it depends on the capacity alone, as the batched calls need.
  int n = 0;
  TERN_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_decode_split_kernel<DH, RW, KvDtype::f16>, 128,
                                                          v.smem));
  v.blocks_per_sm = std::max(1, n);
  v.smem_one_stage = decode_smem_bytes<DH, RW>(1);
  TERN_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_decode_split_kernel<DH, RW, KvDtype::f16>, 128,
                                                          v.smem_one_stage));
  v.blocks_per_sm_one_stage = std::max(1, n);
  if constexpr (RW == 1) {  // the items-per-block form: 3 stages where they fit (Hopper), else 2 (A100), else off
    int stages = 3;
    while (stages >= 2 && decode_items_smem_bytes<DH, RW>(stages) > size_t(optin)) --stages;
    if (stages < 2) return;
    v.items_smem = decode_items_smem_bytes<DH, RW>(stages);
    for (auto kernel : {attention_decode_items_kernel<DH, RW, KvDtype::f16>,
                        attention_decode_items_kernel<DH, RW, KvDtype::bf16>,
                        attention_decode_items_kernel<DH, RW, KvDtype::fp8>}) {
      TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(v.items_smem)));
      TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     int(cudaSharedmemCarveoutMaxShared)));
    }
    TERN_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_decode_items_kernel<DH, RW, KvDtype::f16>,
                                                            128, v.items_smem));
    v.items_blocks_per_sm = std::max(1, n);
    v.items_stages = stages;
  }
}

template <int DH>
void setup_dh(AttentionSetup& s, int optin) {
  constexpr size_t prefill = prefill_smem_bytes<DH>();
  if (prefill <= size_t(optin)) {
    for (auto kernel : {attention_prefill_kernel<DH, KvDtype::f16>, attention_prefill_kernel<DH, KvDtype::bf16>,
                        attention_prefill_kernel<DH, KvDtype::fp8>}) {
      TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(prefill)));
      TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     int(cudaSharedmemCarveoutMaxShared)));
    }
  }
  setup_decode<DH, 1>(s, optin);
  setup_decode<DH, 2>(s, optin);
  setup_decode<DH, 4>(s, optin);
}

// Device properties and kernel attributes, once per process (the first attention call; keep it out of capture).
const AttentionSetup& attention_setup() {
  static const AttentionSetup setup = [] {
    AttentionSetup s;
    int dev = 0;
    TERN_CUDA(cudaGetDevice(&dev));
    TERN_CUDA(cudaDeviceGetAttribute(&s.sms, cudaDevAttrMultiProcessorCount, dev));
    const int optin = smem_optin_bytes();
    s.smem_optin = optin;
    setup_dh<64>(s, optin);
    setup_dh<128>(s, optin);
    setup_dh<256>(s, optin);
    return s;
  }();
  return setup;
}

// TERN_ATTN_KV_EARLY=0: the decode kernel loads no K/V tile before pdl_wait (for comparison).
bool kv_early() {
  static const bool on = !env_is("TERN_ATTN_KV_EARLY", "0");
  return on;
}

// TERN_ATTN_BATCH_STAGES=0: batched launches keep the deep ring (launch_decode's one-stage form off; for comparison).
bool attn_batch_one_stage() {
  static const bool on = !env_is("TERN_ATTN_BATCH_STAGES", "0");
  return on;
}

// TERN_ATTN_BATCH_ITEMS (attention.cuh: attn_batch_set_items): attention_batched's items-per-block form. Read once,
// at the first batched call (outside capture); the tests set it with attn_batch_set_items.
int& batch_items() {
  static int items = [] {
    const char* e = std::getenv("TERN_ATTN_BATCH_ITEMS");
    if (e == nullptr || *e == '\0' || std::strcmp(e, "0") == 0) return 0;
    if (std::strcmp(e, "auto") == 0) return kAttnBatchItemsAuto;
    char* end = nullptr;
    const long n = std::strtol(e, &end, 10);
    TERN_CHECK(*end == '\0' && n >= 1 && n <= 1000000, "TERN_ATTN_BATCH_ITEMS=", e,
               ": 0 (off), auto, or a count of work items per block");
    return int(n);
  }();
  return items;
}

std::atomic<int64_t> items_launches{0};  // attn_batch_items_launches

// attn_batch_set_items_stages: the items form's ring stages asked by a test (0: the device's choice).
int& items_stages_asked() {
  static int stages = 0;
  return stages;
}

int decode_rows_warps(int64_t rows) { return rows <= 16 ? 1 : rows <= 32 ? 2 : 4; }

// The decode kernels' variant (rows per warp: its stages, shared memory and occupancy) for d.T tokens of d's heads.
const DecodeVariant& decode_variant(const AttentionSetup& setup, const AttnDims& d) {
  return setup.decode[dh_index(d.dh)][rw_index(decode_rows_warps(d.T * (d.Hq / d.Hkv)))];
}

// Splits of the decode grid: enough (KV head, split) blocks to fill every SM once, at most one per 64-key tile of
// the capacity. Fixed for a given capacity, so a captured decode step stays valid as the length grows.
int decode_splits(const AttnDims& d, const DecodeVariant& v, int sms) {
  const int64_t want = (int64_t(sms) * v.blocks_per_sm + d.Hkv - 1) / d.Hkv;
  const int64_t tiles = (d.capacity + kBlockKeys - 1) / kBlockKeys;
  return int(std::clamp<int64_t>(std::min(want, tiles), 1, kAttnMaxSplits));
}

// The decode path's two launches over seqs (B sequences of d.T tokens), `columns` splits in the grid: attention's
// (one sequence, its split count) and attention_batched's (the largest split count of the batch). Row i of qg at
// qg + i·ld_qg. items: 0 for the one-item split kernel; kAttnBatchItemsAuto or N >= 1 for the items-per-block form
// where it exists (RW = 1, fits the device; else the one-item kernel): one wave of blocks, or ⌈items / N⌉ blocks.
template <int DH, KvDtype KV>
void launch_decode(const float* q, const float* qg, int64_t ld_qg, const Seqs<const void>& seqs, int columns,
                   const AttnDims& d, const Partials& part, float* out, cudaStream_t stream, bool kv_before_wait,
                   int items = 0) {
  const AttentionSetup& setup = attention_setup();
  const int RW = decode_rows_warps(d.T * (d.Hq / d.Hkv));
  const DecodeVariant& v = decode_variant(setup, d);
  TERN_CHECK(v.smem <= size_t(setup.smem_optin), "attention: the decode kernel needs ", v.smem,
             " bytes of shared memory, the device has ", setup.smem_optin);
  const int64_t n_items = int64_t(seqs.B) * columns * d.Hkv;  // (sequence, split column, KV head)
  if (items != 0 && RW == 1 && v.items_stages >= 2) {
    // (A test may ask for fewer stages than fit: the same shared memory, the ring using only the first of them.)
    const int stages = items_stages_asked() > 0 ? std::min(items_stages_asked(), v.items_stages) : v.items_stages;
    const int64_t wave = int64_t(setup.sms) * v.items_blocks_per_sm;
    const int64_t blocks = items == kAttnBatchItemsAuto ? std::min(n_items, wave) : (n_items + items - 1) / items;
    items_launches.fetch_add(1, std::memory_order_relaxed);
    launch_pdl("attention_decode_items", attention_decode_items_kernel<DH, 1, KV>, dim3(unsigned(blocks)), dim3(128),
               v.items_smem, stream, q, seqs, d, columns, stages, kv_before_wait, part);
    launch_pdl("attention_decode_merge", attention_decode_merge_kernel<DH>,
               dim3(unsigned(d.T * d.Hq), unsigned(seqs.B)), dim3(256), 0, stream, part, qg, ld_qg, seqs, d, out);
    return;
  }
  auto kernel = RW == 1 ? attention_decode_split_kernel<DH, 1, KV>
                : RW == 2 ? attention_decode_split_kernel<DH, 2, KV>
                          : attention_decode_split_kernel<DH, 4, KV>;
  // A grid of more than one wave whose splits hold one or two 64-key tiles (the batched step at short and middle
  // lengths: 8 sequences at 4K are 8 waves of one-tile splits) gains nothing from a deep ring and loses blocks per
  // SM to it: it takes the one-stage form (at DH = 256: 76 KB of shared memory, 2 blocks per SM instead of 1, the
  // registers allowing no more). The stages change only when the copies are issued, not what is summed, so every
  // sequence's values are the same either way.
  const int64_t tiles_per_split = ((d.capacity + kBlockKeys - 1) / kBlockKeys + columns - 1) / columns;
  const int64_t blocks = n_items;
  const bool one_stage = attn_batch_one_stage() && v.stages > 1 && tiles_per_split <= 2 &&
                         v.blocks_per_sm_one_stage > v.blocks_per_sm &&
                         blocks > int64_t(setup.sms) * v.blocks_per_sm;
  launch_pdl("attention_decode_split", kernel, dim3(unsigned(d.Hkv), unsigned(columns), unsigned(seqs.B)), dim3(128),
             one_stage ? v.smem_one_stage : v.smem, stream, q, seqs, d, one_stage ? 1 : v.stages, kv_before_wait,
             part);
  launch_pdl("attention_decode_merge", attention_decode_merge_kernel<DH>,
             dim3(unsigned(d.T * d.Hq), unsigned(seqs.B)), dim3(256), 0, stream, part, qg, ld_qg, seqs, d, out);
}

template <int DH, KvDtype KV>
void attention_dh(const float* q, const float* qg, const void* cache_k, const void* cache_v, const int* pos0,
                  const AttnDims& d, float* partial, float* out, cudaStream_t stream) {
  const AttentionSetup& setup = attention_setup();
  const int G = d.Hq / d.Hkv;
  if (d.T <= kDecodeMaxTokens && d.T * G <= kDecodeMaxRows) {
    TERN_CHECK(partial != nullptr, "attention: decode needs the partial scratch");
    const int splits = decode_splits(d, decode_variant(setup, d), setup.sms);
    Partials part;  // [T, Hq, splits] (o: × DH), one sequence
    part.o = partial;
    part.m = part.o + d.T * d.Hq * splits * DH;
    part.l = part.m + d.T * d.Hq * splits;
    const Seqs<const void> seqs{
        .pos0 = pos0, .cache_k = cache_k, .cache_v = cache_v, .capacity = d.capacity, .splits = splits};
    launch_decode<DH, KV>(q, qg, int64_t(d.Hq) * 2 * DH, seqs, splits, d, part, out, stream, kv_early());
  } else {
    TERN_CHECK(prefill_smem_bytes<DH>() <= size_t(setup.smem_optin), "attention: the prefill kernel needs ",
               prefill_smem_bytes<DH>(), " bytes of shared memory, the device has ", setup.smem_optin);
    const int64_t tiles = (d.T + kPrefillRows - 1) / kPrefillRows;
    TERN_CHECK(tiles <= 65535, "attention: ", d.T, " tokens in one call exceed the grid limit");
    launch_pdl("attention_prefill", attention_prefill_kernel<DH, KV>, dim3(unsigned(d.Hq), unsigned(tiles)), dim3(128),
               prefill_smem_bytes<DH>(), stream, q, qg, cache_k, cache_v, pos0, d, out);
  }
}

// f.template operator()<DH, KV>() for a cache type (d.kv) at head dim DH.
template <int DH, typename F>
void with_cache_type(const AttnDims& d, F&& f) {
  switch (d.kv) {
    case KvDtype::f16: return f.template operator()<DH, KvDtype::f16>();
    case KvDtype::bf16: return f.template operator()<DH, KvDtype::bf16>();
    case KvDtype::fp8: return f.template operator()<DH, KvDtype::fp8>();
  }
  TERN_FAIL("attention: KV cache type ", int(d.kv), " unknown");
}

// f.template operator()<DH, KV>() for d's head dim (64, 128 or 256) and cache type (d.kv).
template <typename F>
void with_head_dim(const AttnDims& d, F&& f) {
  switch (d.dh) {
    case 64: return with_cache_type<64>(d, f);
    case 128: return with_cache_type<128>(d, f);
    case 256: return with_cache_type<256>(d, f);
    default: TERN_FAIL("attention: head dim ", d.dh, " not supported by the CUDA kernels (64, 128 or 256)");
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

// The batched calls' sequences: AttnBatch's tables.
template <typename Elem>
Seqs<Elem> batch_seqs(const AttnBatch& b) {
  return {.B = b.B, .pos0_of = b.pos0, .cache_k_of = b.cache_k, .cache_v_of = b.cache_v, .capacity_of = b.capacity,
          .splits_of = b.splits, .rope_delta_of = b.rope_delta};
}

// What attn_prepare_batched and attention_batched both require (d's head shapes are checked by the caller).
void check_batch(const AttnBatch& b, const AttnDims& d, const char* what) {
  TERN_CHECK(d.T == 1, what, ": one token per sequence (d.T = ", d.T, ")");
  TERN_CHECK(b.B >= 1 && b.B <= kMaxBatch, what, ": ", b.B, " sequences (1..", kMaxBatch, ")");
  TERN_CHECK(b.ld_qkv >= int64_t(d.Hq) * 2 * d.dh && b.ld_qkv % 4 == 0, what, ": row stride ", b.ld_qkv,
             " (at least Hq·2·dh = ", int64_t(d.Hq) * 2 * d.dh, ", a multiple of 4 floats)");
  TERN_CHECK(b.pos0 && b.cache_k && b.cache_v && b.capacity, what, ": null table");
}

}  // namespace

void attention_check(const AttnDims& d) {
  rope_freqs(d);
  TERN_CHECK(d.Hkv > 0 && d.Hq % d.Hkv == 0, "attention: ", d.Hq, " query heads over ", d.Hkv, " KV heads");
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

void attention_init() {
  attention_setup();
  batch_items();  // TERN_ATTN_BATCH_ITEMS parsed here, outside any capture: a bad value fails at start-up
}

int64_t attn_partial_floats(int64_t T, int Hq, int dh) {
  const int64_t t = std::min<int64_t>(T, kDecodeMaxTokens);
  return t * Hq * kAttnMaxSplits * (int64_t(dh) + 2);
}

void attention(const float* q, const float* qg, const void* cache_k, const void* cache_v, const int* pos0,
               const AttnDims& d, float* partial, float* out, cudaStream_t stream) {
  if (d.T == 0) return;
  TERN_CHECK(d.Hkv > 0 && d.Hq % d.Hkv == 0, "attention: ", d.Hq, " query heads over ", d.Hkv, " KV heads");
  TERN_CHECK(d.capacity > 0, "attention: empty KV cache");
  with_head_dim(d, [&]<int DH, KvDtype KV>() {
    attention_dh<DH, KV>(q, qg, cache_k, cache_v, pos0, d, partial, out, stream);
  });
}

int attn_batch_splits(const AttnDims& d) {
  attention_check(d);
  TERN_CHECK(d.capacity > 0, "attn_batch_splits: empty KV cache");
  TERN_CHECK(d.Hq / d.Hkv <= kDecodeMaxRows, "attn_batch_splits: ", d.Hq / d.Hkv,
             " query heads per KV head (the decode kernels take ", kDecodeMaxRows, ")");
  AttnDims one = d;
  one.T = 1;
  const AttentionSetup& setup = attention_setup();
  return decode_splits(one, decode_variant(setup, one), setup.sms);
}

int64_t attn_batch_partial_floats(int B, int Hq, int dh) { return B * attn_partial_floats(1, Hq, dh); }

void attn_batch_set_items(int items) {
  TERN_CHECK(items >= 0 || items == kAttnBatchItemsAuto, "attn_batch_set_items: ", items,
             " (0: off, kAttnBatchItemsAuto, or items per block >= 1)");
  batch_items() = items;
}
int attn_batch_items() { return batch_items(); }
bool attn_batch_items_available(int dh) {
  TERN_CHECK(dh == 64 || dh == 128 || dh == 256, "attn_batch_items_available: head dim ", dh, " (64, 128 or 256)");
  return attention_setup().decode[dh_index(dh)][rw_index(1)].items_stages >= 2;
}
void attn_batch_set_items_stages(int stages) {
  TERN_CHECK(stages == 0 || stages == 2 || stages == 3, "attn_batch_set_items_stages: ", stages, " (0, 2 or 3)");
  items_stages_asked() = stages;
}
int attn_batch_items_stages() { return items_stages_asked(); }
int64_t attn_batch_items_launches() { return items_launches.load(std::memory_order_relaxed); }

void attn_prepare_batched(const float* qg, const float* k, const float* v, const float* q_norm, const float* k_norm,
                          const AttnBatch& batch, const AttnDims& d, float* q_out, cudaStream_t stream) {
  const RopeFreqs freqs = rope_freqs(d);
  check_batch(batch, d, "attn_prepare_batched");
  launch_prepare(qg, k, v, batch.ld_qkv, batch.ld_qkv, q_norm, k_norm, batch_seqs<void>(batch), d, freqs, {},
                 q_out, stream);
}

void attention_batched(const float* q, const float* qg, const AttnBatch& batch, const AttnDims& d, float* partial,
                       float* out, cudaStream_t stream) {
  const int columns = attn_batch_splits(d);  // the largest capacity's: no sequence has more splits
  check_batch(batch, d, "attention_batched");
  TERN_CHECK(batch.splits && partial, "attention_batched: null split table or partial scratch");
  const int64_t room = int64_t(d.Hq) * kAttnMaxSplits;  // partials m, l of one sequence (o: × dh)
  Partials part;  // [B, Hq, kAttnMaxSplits] (o: × dh)
  part.o = partial;
  part.m = part.o + batch.B * room * d.dh;
  part.l = part.m + batch.B * room;
  part.stride = room;
  with_head_dim(d, [&]<int DH, KvDtype KV>() {
    // The items-per-block form (opt-in) from two sequences on; one sequence keeps attention()'s kernel.
    launch_decode<DH, KV>(q, qg, batch.ld_qkv, batch_seqs<const void>(batch), columns, d, part, out, stream,
                           kv_early() && !batch.one_session, batch.B >= 2 ? batch_items() : 0);
  });
}

}  // namespace tern::cuda
