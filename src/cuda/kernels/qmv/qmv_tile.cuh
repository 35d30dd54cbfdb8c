// Device machinery shared by the decode matrix-vector kernels (qmv.cu, moe_decode.cu). Included by .cu files only.
//
// ---- 4-bit tensor-core tile (affine4, group 64) ------------------------------------------------------------------
// A warp runs mma.sync.m16n8k16 (fp16 operands, fp32 accumulation) with the weights as A (16 "mma rows" on M) and
// the activations as B (tokens on N, the columns of missing tokens zero). Which matrix row feeds mma row g and g+8 is
// the job's choice (qmv: rows r0+g, r0+g+8; MoE gate/up: gate row r0+g and up row r0+g).
//
// Fragment ownership (lane = 4·g + tig): A rows g and g+8, C rows g, g+8 × tokens 2·tig, 2·tig+1, B token column g.
// For group G the thread loads words 2·tig and 2·tig+1 (8 bytes) of its two rows; the 4 lanes of a row read the
// group's 32 bytes. Each word w (nibbles n0..n7, LSB first, columns 8w..8w+7) feeds two k-blocks with no per-element
// shift:
//     k-block h (h = 0, 1), word shifted right by 8h:
//       A slots (2tig, 2tig+1)   = lop3(w & 0x000F000F | 0x6400 6400) − 1032 = fp16 {n_{2h} − 8, n_{2h+4} − 8}
//       A slots (2tig+8, 2tig+9) = lop3(w & 0x00F000F0 | 0x6400 6400) − 1152 = fp16 {16·(n_{2h+1} − 8), 16·(n_{2h+5} − 8)}
// (1024 + n − 1032 and 1024 + 16n − 1152: exact in fp16), so B holds, per 8-column word, the halves
// x0, x4, x1/16, x5/16, x2, x6, x3/16, x7/16  (one uint4 in shared memory: .x .y = k-block 0, .z .w = k-block 1).
// A is exact and centred (|A| ≤ 128), so the fp32 accumulator only ever holds partial sums of the group's own
// products: no large offset to cancel.
//
// Activation precision ("hi + lo", ≈ fp32): a power-of-two scale σ per (staged row, group of 64 columns), chosen so
// that the group's max |x|·σ ∈ [128, 256); each scaled value v (v/16 for the odd columns) is split into
// hi = fp16(v) and lo = fp16(v − hi) (v − hi is exact in fp32). Both are staged; every A fragment meets the hi B
// fragment and then the lo one (two MMAs into the same fp32 accumulator, products exact), so a group's MMA sum is
// Σ (q − 8)·x'σ with x' = hi + lo (exact in fp32, within ~2^-22 of x·σ relative; fp16 subnormals only in lo, far
// below the group's maximum). The group's contribution is then s·(that)/σ + (bias + 8s)·SX, SX = Σ x' / σ, the
// fp32 sum of the same values the MMAs used, so that the result is the product of the dequantised weights with x'
// (no mismatch between the two terms; the centring keeps bias + 8s small for MLX-quantised rows). Per (row, group)
// the "ktab" holds {SX, 1/σ, 0, 0} (the first two read as a float2).
// An RMSNorm of the input is not applied to the staged values: x·norm_w is staged and the per-token factor
// rsqrt(mean(x²) + eps) multiplies the output (it is a scalar per token).
//
// ---- work split (persistent blocks, one wave) ---------------------------------------------------------------------
// The grid is at most (blocks per SM × SMs) blocks of kWarps warps, all resident at once. A block owns a few "tiles"
// (16 mma rows each); a tile's K axis is cut into "steps" of kUG groups. The block's steps, flattened as
// (tile, step), are split into kWarps contiguous ranges of equal length, one per warp, so every warp streams the
// same number of steps whatever the shape. Each warp runs its range through a register ring of D steps: the loads of
// step s + D are issued as step s is consumed, so D steps (D KB of weights per warp) stay in flight, and the first D
// steps are issued before pdl_wait(). A tile whose steps lie in one warp is finished by that warp (epilogue straight
// from the accumulators); a tile cut by a warp boundary leaves partial sums in shared memory that the block adds in
// a fixed order at the end (deterministic).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/l2_prefetch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/weights/dmat_device.cuh"

namespace tern::cuda::qtile {

constexpr int kTokens = 8;      // the mma's N: tokens per call at most
constexpr int kGroup = 64;      // columns per quantisation group on the tensor-core path
constexpr int kColsAlign = 256; // tensor-core path: cols (per staged row) a multiple of this
constexpr int kWarps = 8;       // warps per block of the tensor-core kernels
constexpr int kThreads = 32 * kWarps;
constexpr int kUG = 2;          // groups per step (the default; the ring also runs 4: qmv variant 1)
constexpr int kSlots = 2 * kWarps;  // partial-sum slots: a warp leaves at most two cut tiles (its first and last)

// ---- PTX helpers ---------------------------------------------------------------------------------------------

// Streaming weight load: read once, keep out of L1, let L2 fetch the 256-byte neighbourhood.
__device__ __forceinline__ uint2 ld_weights_u2(const uint32_t* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ld_weights_u4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// Scales/biases: small, the rest of the 32-byte sector is read by the next steps of the same row; cached in L1.
__device__ __forceinline__ uint32_t ld_const_u32(const uint16_t* p) {
  uint32_t v;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld_const_u2(const uint16_t* p) {
  uint2 v;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ld_const_u16(const uint16_t* p) {
  unsigned short v;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

// The same loads where `on`, zeros elsewhere, without a branch: an instruction inside a branch that uses the branch's
// own loads waits for them there, so a batch of rows each behind its own `if` costs one memory round trip a row.
__device__ __forceinline__ uint4 ld_weights_u4_if(const void* p, bool on) {
  uint4 v;
  asm volatile(
      "{\n .reg .pred q;\n .reg .b32 a, b, c, d;\n setp.ne.b32 q, %5, 0;\n"
      " mov.b32 a, 0;\n mov.b32 b, 0;\n mov.b32 c, 0;\n mov.b32 d, 0;\n"
      " @q ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {a, b, c, d}, [%4];\n"
      " mov.b32 %0, a;\n mov.b32 %1, b;\n mov.b32 %2, c;\n mov.b32 %3, d;\n}"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(int(on)));
  return v;
}
__device__ __forceinline__ uint32_t ld_const_u16_if(const uint16_t* p, bool on) {
  unsigned short v;
  asm volatile(
      "{\n .reg .pred q;\n .reg .b16 a;\n setp.ne.b32 q, %2, 0;\n mov.b16 a, 0;\n @q ld.global.nc.u16 a, [%1];\n"
      " mov.b16 %0, a;\n}"
      : "=h"(v)
      : "l"(p), "r"(int(on)));
  return v;
}

// [base, base + bytes) in 32 KB pieces, lane l taking pieces l, l + 32, ... (nullptr: nothing).
__device__ inline void prefetch_l2_range(const void* base, int64_t bytes, int lane) {
  if (!base) return;
  constexpr int64_t kPiece = 32 * 1024;
  const char* p = static_cast<const char*>(base);
  for (int64_t off = int64_t(lane) * kPiece; off < bytes; off += 32 * kPiece)
    l2_prefetch_bulk(p + off, uint32_t(bytes - off < kPiece ? bytes - off : kPiece));
}

// cp.async of 8 bytes (.ca) from global src to shared dst (a shared-window address), zero-filling the rest of the 8
// when src_bytes < 8 (0: nothing is read). The 16-byte .cg copy, commit, wait, smem_addr and lop3_and_or are
// common/ptx.cuh's.
__device__ __forceinline__ void cp_async_8(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// c += A·B, m16n8k16, fp16 operands, fp32 accumulators (row.col).
__device__ __forceinline__ void mma_f16_16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float bf16_lo(uint32_t two) { return __uint_as_float(two << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t two) { return __uint_as_float(two & 0xffff0000u); }


// 8 consecutive fp32 values from p (16-byte aligned when vec).
__device__ __forceinline__ void load8_f32(const float* p, bool vec, float v[8]) {
  if (vec) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = p[j];
  }
}

// ---- shared memory of a tensor-core block ---------------------------------------------------------------------

// Layout (all offsets 16-byte aligned), shared by host (sizes) and device (carving).
struct StageLayout {
  int rows = 0;  // staged rows (each feeds one token column of some tiles)
  int cols = 0;  // fp16 values per row (multiple of kColsAlign)
  __host__ __device__ int gpr() const { return cols / kGroup; }
  // Per group of 64 columns 16 uint4: its 8 words' hi halves, then their lo halves (the lo of a word at +8, 128
  // bytes further: the same banks as its hi, so both loads are conflict-free); +16 bytes per row: rows land on
  // different banks (row_u4 odd).
  __host__ __device__ int row_u4() const { return cols / 4 + 1; }
  __host__ __device__ int chunks() const { return cols / 256; }    // 32 words per warp pass
  __host__ __device__ static int align16(int b) { return (b + 15) & ~15; }
  __host__ __device__ int xs_bytes() const { return rows * row_u4() * 16; }
  __host__ __device__ int ktab_bytes() const { return rows * gpr() * 16; }
  __host__ __device__ int ss_bytes() const { return align16(rows * chunks() * 4); }
  __host__ __device__ static int slot_bytes() { return kSlots * kTokens * 16 * 4; }
  __host__ __device__ int bytes() const {
    return xs_bytes() + ktab_bytes() + ss_bytes() + slot_bytes() + align16(kTokens * 4);
  }
};

struct StageSmem {
  uint4* xs;      // [rows][row_u4] permuted, scaled fp16 activations: per group 8 hi uint4, then 8 lo uint4
  float4* ktab;   // [rows][gpr] {SX, 1/σ, 0, 0}
  float* ss;      // [rows][chunks] Σx² per warp pass (RMSNorm)
  float* slots;   // [kSlots][kTokens][16] partial sums of cut tiles
  float* rinv;    // [kTokens] RMSNorm factor per token
};

__device__ __forceinline__ StageSmem carve_stage(unsigned char* base, const StageLayout& L) {
  StageSmem s;
  unsigned char* p = base;
  s.xs = reinterpret_cast<uint4*>(p);
  p += L.xs_bytes();
  s.ktab = reinterpret_cast<float4*>(p);
  p += L.ktab_bytes();
  s.ss = reinterpret_cast<float*>(p);
  p += L.ss_bytes();
  s.slots = reinterpret_cast<float*>(p);
  p += StageLayout::slot_bytes();
  s.rinv = reinterpret_cast<float*>(p);
  return s;
}

// Power of two σ with m·σ ∈ [128, 256) (σ = 1 for m = 0 or non-finite m).
__device__ __forceinline__ int activation_shift(float m) {
  if (!(m > 0.0f) || !(m <= 3.0e38f)) return 0;
  const int e = int((__float_as_uint(m) >> 23) & 0xff) - 127;  // m ∈ [2^e, 2^(e+1)) for normal m
  const int sh = 7 - e;
  return sh < -100 ? -100 : (sh > 100 ? 100 : sh);
}
__device__ __forceinline__ float pow2f(int sh) { return __uint_as_float(uint32_t(127 + sh) << 23); }

// Stages rows × cols activations into shared memory (fp16 hi and lo, permuted, scaled per group) with the ktab. Src
// provides:
//   void load8(int r, int c, float xw[8], float& ss) const   the values to stage at columns c..c+7 of staged row r
//                                                           (ss += Σ x² of the raw input when the job norms)
//   bool norm                                               whether ss is wanted (per-pass partials in S.ss)
// Every thread of the block calls it; the caller synchronises afterwards. cols % 256 == 0, so a warp's 32 items lie
// in one row and the 8 items of a group in 8 consecutive lanes. Loads of 4 items per thread are issued together.
template <class Src>
__device__ __forceinline__ void stage_activations(const Src& src, const StageLayout& L, const StageSmem& S) {
  const int tid = threadIdx.x, lane = tid & 31;
  const int wpr = L.cols / 8, gpr = L.gpr(), row_u4 = L.row_u4(), chunks = L.chunks();
  const int total = L.rows * wpr;
  constexpr int kBatch = 4;
  for (int base = 0; base < total; base += kBatch * kThreads) {
    float xw[kBatch][8], ss[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = base + b * kThreads + tid;
      ss[b] = 0.0f;
      if (i < total) {
        const int r = i / wpr;
        src.load8(r, (i - r * wpr) * 8, xw[b], ss[b]);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = base + b * kThreads + tid;
      if (base + b * kThreads >= total) break;  // uniform: total is a multiple of 32 and of the warp's items
      if (i < total) {                          // warp-uniform as well
        const int r = i / wpr, wi = i - r * wpr;
        float mx = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fabsf(xw[b][j]));
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const int sh = activation_shift(mx);
        const float sg = pow2f(sh), inv_sg = pow2f(-sh);
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = xw[b][j] * sg;
        // B order of the word: x0, x4, x1/16, x5/16, x2, x6, x3/16, x7/16 (powers of two: exact)
        const float u[8] = {v[0], v[4], v[1] * 0.0625f, v[5] * 0.0625f, v[2], v[6], v[3] * 0.0625f, v[7] * 0.0625f};
        uint32_t hw[4], lw[4];
        float se = 0.0f, so = 0.0f;  // Σ x' of the even columns (u[0,1,4,5]), of the odd ones /16 (u[2,3,6,7])
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const __half ha = __float2half_rn(u[2 * j]), hb = __float2half_rn(u[2 * j + 1]);
          const float fa = __half2float(ha), fb = __half2float(hb);
          const __half la = __float2half_rn(u[2 * j] - fa), lb = __float2half_rn(u[2 * j + 1] - fb);
          hw[j] = uint32_t(__half_as_ushort(ha)) | (uint32_t(__half_as_ushort(hb)) << 16);
          lw[j] = uint32_t(__half_as_ushort(la)) | (uint32_t(__half_as_ushort(lb)) << 16);
          const float pair = (fa + __half2float(la)) + (fb + __half2float(lb));  // hi + lo exact, the pair rounded
          if (j & 1) so += pair; else se += pair;
        }
        float sx = se + 16.0f * so;
        uint4* dst = S.xs + r * row_u4 + (wi >> 3) * 16 + (wi & 7);
        dst[0] = make_uint4(hw[0], hw[1], hw[2], hw[3]);
        dst[8] = make_uint4(lw[0], lw[1], lw[2], lw[3]);
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) sx += __shfl_xor_sync(0xffffffffu, sx, o);
        if ((lane & 7) == 0) S.ktab[r * gpr + wi / 8] = make_float4(sx * inv_sg, inv_sg, 0.0f, 0.0f);
        if (src.norm) {
          const float s = warp_sum(ss[b]);
          if (lane == 0) S.ss[r * chunks + wi / 32] = s;
        }
      }
    }
  }
}

// rsqrt(mean(x²) + eps) of staged row r from the per-pass partials (a fixed order: every caller gets the same bits).
__device__ __forceinline__ float row_rinv(const StageSmem& S, const StageLayout& L, int r, float eps) {
  float s = 0.0f;
  for (int c = 0; c < L.chunks(); ++c) s += S.ss[r * L.chunks() + c];
  return 1.0f / sqrtf(s / float(L.cols) + eps);
}

// ---- one step of a warp ----------------------------------------------------------------------------------------

// The registers of one step of UG groups (2 or 4): words 2tig, 2tig+1 of groups G .. G+UG-1 for mma rows g (q[0])
// and g+8 (q[1]); sb[h] is the bf16 pair (groups G+2h, G+2h+1) this lane loads for its quad: tig 0 scales of row g,
// 1 scales of row g+8, 2 biases of row g, 3 biases of row g+8 (the quad exchanges them by shuffles). UG = 4 halves
// the per-step overhead (addresses, cursor, branches) per weight byte; its scale loads are 8 bytes (the scale and
// bias arrays 8-byte aligned: the launcher checks).
template <int UG>
struct SlotT {
  static_assert(UG == 2 || UG == 4, "2 or 4 groups per step");
  uint2 q[2][UG];
  uint32_t sb[UG / 2];
};

// Where a step's weights are: the matrix rows of mma rows g and g+8 (nullptr: row absent, not loaded), and the
// scale/bias row of this lane's sb. G is the step's first group.
struct StepRows {
  const uint32_t* wa;  // row of mma row g: words
  const uint32_t* wb;  // row of mma row g+8
  const uint16_t* sb;  // scales or biases row for this lane's tig (nullptr: absent)
};

template <int UG>
__device__ __forceinline__ void load_step(SlotT<UG>& sl, const StepRows& r, int G, int tig) {
  const int off = G * 8 + 2 * tig;
  if (r.wa) {
#pragma unroll
    for (int u = 0; u < UG; ++u) sl.q[0][u] = ld_weights_u2(r.wa + off + 8 * u);
  }
  if (r.wb) {
#pragma unroll
    for (int u = 0; u < UG; ++u) sl.q[1][u] = ld_weights_u2(r.wb + off + 8 * u);
  }
  if (r.sb) {
    if constexpr (UG == 2) {
      sl.sb[0] = ld_const_u32(r.sb + G);
    } else {
      const uint2 v = ld_const_u2(r.sb + G);
      sl.sb[0] = v.x;
      sl.sb[1] = v.y;
    }
  }
}

// Activation side of a step, per lane: the B row of token column g (nullptr: zero column) and the ktab rows of the
// C token columns 2tig, 2tig+1 (nullptr: zero).
struct StepB {
  const uint4* brow;
  const float4* k0;
  const float4* k1;
};

// a − b on fp16 pairs (exact here: integers below 2048).
__device__ __forceinline__ uint32_t hsub2_u32(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// The four A registers of one k-block from the (shifted) words of rows g and g+8: q − 8 and 16·(q − 8), exact.
__device__ __forceinline__ void a_frag(uint32_t wg, uint32_t wg8, uint32_t a[4]) {
  constexpr uint32_t kLo = 0x000F000Fu, kHi = 0x00F000F0u, kMagic = 0x64006400u;
  constexpr uint32_t kOffLo = 0x64086408u;  // fp16 {1032, 1032}: 1024 + 8
  constexpr uint32_t kOffHi = 0x64806480u;  // fp16 {1152, 1152}: 1024 + 16·8
  a[0] = hsub2_u32(lop3_and_or(wg, kLo, kMagic), kOffLo);
  a[1] = hsub2_u32(lop3_and_or(wg8, kLo, kMagic), kOffLo);
  a[2] = hsub2_u32(lop3_and_or(wg, kHi, kMagic), kOffHi);
  a[3] = hsub2_u32(lop3_and_or(wg8, kHi, kMagic), kOffHi);
}

// Two k-blocks of one 8-column word: rows g (wg) and g+8 (wg8); hi B (bh) and lo B (bl) halves, .x .y for k-block 0
// and .z .w for k-block 1. Per k-block the hi MMA and then the lo MMA (a fixed order: deterministic).
__device__ __forceinline__ void mma_word(float c[4], uint32_t wg, uint32_t wg8, const uint4& bh, const uint4& bl) {
  uint32_t a[4];
  a_frag(wg, wg8, a);
  mma_f16_16816(c, a[0], a[1], a[2], a[3], bh.x, bh.y);
  mma_f16_16816(c, a[0], a[1], a[2], a[3], bl.x, bl.y);
  a_frag(wg >> 8, wg8 >> 8, a);
  mma_f16_16816(c, a[0], a[1], a[2], a[3], bh.z, bh.w);
  mma_f16_16816(c, a[0], a[1], a[2], a[3], bl.z, bl.w);
}

// acc (rows g, g+8 × tokens 2tig, 2tig+1, the C layout) += the step's UG groups. Every lane of the warp calls it.
template <int UG>
__device__ __forceinline__ void compute_step(const SlotT<UG>& sl, int G, const StepB& B, float acc[4], int lane) {
  const int tig = lane & 3, quad = lane & ~3;
  uint32_t s_a = 0, s_b = 0, b_a = 0, b_b = 0;
#pragma unroll
  for (int u = 0; u < UG; ++u) {
    if ((u & 1) == 0) {
      const uint32_t v = sl.sb[u / 2];
      s_a = __shfl_sync(0xffffffffu, v, quad + 0);
      s_b = __shfl_sync(0xffffffffu, v, quad + 1);
      b_a = __shfl_sync(0xffffffffu, v, quad + 2);
      b_b = __shfl_sync(0xffffffffu, v, quad + 3);
    }
    const int Gu = G + u;
    uint4 H0 = make_uint4(0, 0, 0, 0), H1 = H0, L0 = H0, L1 = H0;
    if (B.brow) {
      const uint4* p = B.brow + Gu * 16 + 2 * tig;  // hi of words 2tig, 2tig+1; their lo 8 uint4 further
      H0 = p[0];
      H1 = p[1];
      L0 = p[8];
      L1 = p[9];
    }
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_word(c, sl.q[0][u].x, sl.q[1][u].x, H0, L0);
    mma_word(c, sl.q[0][u].y, sl.q[1][u].y, H1, L1);
    float2 K0 = make_float2(0.0f, 0.0f), K1 = K0;  // {SX, 1/σ}
    if (B.k0) K0 = *reinterpret_cast<const float2*>(B.k0 + Gu);
    if (B.k1) K1 = *reinterpret_cast<const float2*>(B.k1 + Gu);
    const bool hi = (u & 1) != 0;
    const float sa = hi ? bf16_hi(s_a) : bf16_lo(s_a), sb = hi ? bf16_hi(s_b) : bf16_lo(s_b);
    // the bias of the centred q: b + 8s (exact in fp32 for bf16 s and b within 2^16 of each other)
    const float ba = fmaf(8.0f, sa, hi ? bf16_hi(b_a) : bf16_lo(b_a));
    const float bb = fmaf(8.0f, sb, hi ? bf16_hi(b_b) : bf16_lo(b_b));
    acc[0] = fmaf(sa, c[0] * K0.y, fmaf(ba, K0.x, acc[0]));
    acc[1] = fmaf(sa, c[1] * K1.y, fmaf(ba, K1.x, acc[1]));
    acc[2] = fmaf(sb, c[2] * K0.y, fmaf(bb, K0.x, acc[2]));
    acc[3] = fmaf(sb, c[3] * K1.y, fmaf(bb, K1.x, acc[3]));
  }
}

// ---- the warp's range of steps ------------------------------------------------------------------------------------

// The block's flattened steps [0, S) (S = tiles · spt) cut into kWarps ranges; warp w gets [lo(w), lo(w + 1)).
__device__ __forceinline__ int range_lo(int w, int S) { return (w * S) / kWarps; }
// The warp whose range holds step x (x < S): the largest w with range_lo(w) <= x.
__device__ __forceinline__ int range_of(int x, int S) { return (kWarps * x + kWarps - 1) / S; }

// n / d for 0 <= n < 2^21 and 1 <= d < 2^21 without the integer-division sequence: (n + 0.5)/d is at least
// 0.5/d away from an integer, far more than the float error.
struct FastDiv {
  int d;
  float inv;
  __host__ __device__ static FastDiv make(int d) { return FastDiv{d, 1.0f / float(d)}; }
  __device__ __forceinline__ int div(int n) const { return int((float(n) + 0.5f) * inv); }
};

struct Cursor {
  int s, j, q;  // flat step, tile, step within the tile
  __device__ __forceinline__ void next(int spt) {
    ++s;
    if (++q == spt) {
      q = 0;
      ++j;
    }
  }
};
__device__ __forceinline__ Cursor cursor_at(int s, int spt) { return Cursor{s, s / spt, s - (s / spt) * spt}; }

// Minimum blocks per SM the kernels are compiled for: ring depth <= 6 keeps to 128 registers (two blocks, or one
// beside the next kernel's); depth 8 takes what it needs (one block per SM). ug: groups per step (the ring holds
// depth·ug groups).
__host__ __device__ constexpr int min_blocks(int depth, int ug = kUG) { return depth * ug >= 16 ? 1 : 2; }

// The warp's pipeline. Job provides:
//   int spt                                       steps per tile
//   bool known(int j, int q) const                the step's weights may be read before pdl_wait()
//   int group(int q) const                        the first group of step q of a tile
//   StepRows rows(int j, int q) const             where step (j, q) loads
//   StepB b(int j, int q) const                   its activation side
//   void store(int j, int m, int t, float v0, float v1) const
//                                                 epilogue of the finished sums of mma rows m and m + 8 (m < 8) of
//                                                 tile j for token column t (the job ignores columns it has not got)
// Use: ring_fill(pre_wait = true) before pdl_wait(); after the wait (and the job's setup) ring_fill(false) for the
// steps that were not known, then the block's staging and a __syncthreads(), then ring_run().
template <int D, int UG = kUG>
struct Ring {
  SlotT<UG> slot[D];
};

template <int D, int UG, class Job>
__device__ __forceinline__ void ring_fill(Ring<D, UG>& ring, const Job& job, int lo, int hi, bool pre_wait, int tig) {
  Cursor c = cursor_at(lo, job.spt);
#pragma unroll
  for (int d = 0; d < D; ++d) {
    if (c.s < hi && job.known(c.j, c.q) == pre_wait) load_step(ring.slot[d], job.rows(c.j, c.q), job.group(c.q), tig);
    c.next(job.spt);
  }
}

// Writes acc of tile j (mma rows g, g+8, tokens 2tig, 2tig+1) to partial slot `slot`, [kTokens][16] floats.
__device__ __forceinline__ void put_slot(float* slots, int slot, const float acc[4], int lane) {
  const int g = lane >> 2, tig = lane & 3;
  float* p = slots + slot * kTokens * 16;
  p[(2 * tig) * 16 + g] = acc[0];
  p[(2 * tig + 1) * 16 + g] = acc[1];
  p[(2 * tig) * 16 + g + 8] = acc[2];
  p[(2 * tig + 1) * 16 + g + 8] = acc[3];
}

template <int D, int UG, class Job>
__device__ __forceinline__ void ring_run(Ring<D, UG>& ring, const Job& job, int lo, int hi, float* slots, int warp,
                                         int lane) {
  const int spt = job.spt, g = lane >> 2, tig = lane & 3;
  const int first_tile = lo / spt;
  Cursor cc = cursor_at(lo, spt), lc = cursor_at(lo + D, spt);
  int piece_q0 = cc.q;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
  for (int base = lo; base < hi; base += D) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      if (base + d < hi) {
        compute_step(ring.slot[d], job.group(cc.q), job.b(cc.j, cc.q), acc, lane);
        const bool tile_end = cc.q == spt - 1, range_end = cc.s == hi - 1;
        if (tile_end || range_end) {
          if (piece_q0 == 0 && tile_end) {  // the whole tile: epilogue now
            job.store(cc.j, g, 2 * tig, acc[0], acc[2]);
            job.store(cc.j, g, 2 * tig + 1, acc[1], acc[3]);
          } else {
            put_slot(slots, 2 * warp + (cc.j == first_tile ? 0 : 1), acc, lane);
          }
          acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
          piece_q0 = 0;
        }
        cc.next(spt);
        if (lc.s < hi) {
          load_step(ring.slot[d], job.rows(lc.j, lc.q), job.group(lc.q), tig);
          lc.next(spt);
        }
      }
    }
  }
}

// After a __syncthreads() that follows every warp's ring_run: adds the pieces of the tiles cut by warp boundaries in
// warp order and runs their epilogue. S = tiles · spt of the block; T = token columns to finish.
template <class Job>
__device__ __forceinline__ void finish_cut_tiles(const Job& job, const float* slots, int S, int T) {
  const int spt = job.spt;
  for (int i = threadIdx.x; i < (kWarps - 1) * kTokens * 8; i += blockDim.x) {
    const int w = 1 + i / (kTokens * 8), rem = i % (kTokens * 8), t = rem / 8, m = rem % 8;
    if (t >= T) continue;
    const int x = range_lo(w, S);
    if (x >= S || x % spt == 0) continue;  // boundary at a tile start (or past the end): cuts nothing
    const int j = x / spt;
    if (range_lo(w - 1, S) > j * spt) continue;  // an earlier boundary in tile j handles it
    const int u0 = w - 1, u1 = range_of((j + 1) * spt - 1, S);
    float v0 = 0.0f, v1 = 0.0f;
    for (int u = u0; u <= u1; ++u) {
      const int lo_u = range_lo(u, S), hi_u = range_lo(u + 1, S);
      if (lo_u >= hi_u) continue;  // empty range
      const int slot = 2 * u + (lo_u / spt == j ? 0 : 1);
      v0 += slots[(slot * kTokens + t) * 16 + m];
      v1 += slots[(slot * kTokens + t) * 16 + m + 8];
    }
    job.store(j, m, t, v0, v1);
  }
}

// Whether a matrix takes the tensor-core path.
__host__ __device__ inline bool q4_fast_ok(const DMat& w) {
  return w.format == WeightFormat::affine4 && w.group_size == kGroup && w.cols % kColsAlign == 0 &&
         w.rows * w.row_words < (int64_t(1) << 31) &&
         ((reinterpret_cast<uintptr_t>(w.data) & 7) | (reinterpret_cast<uintptr_t>(w.scales) & 3) |
          (reinterpret_cast<uintptr_t>(w.biases) & 3)) == 0;
}

// ---- generic SIMT path (any format) ---------------------------------------------------------------------------

// acc[r][t] += Σ_{this lane's columns} W[expert][rows[r], c] · X(t, c) for t < T; lanes stride 8-column chunks.
// X provides load8(t, c, v[8]). Reduce acc over the warp afterwards.
template <WeightFormat F, int R, class X>
__device__ __forceinline__ void generic_dot(const DMat& w, int64_t expert, const int64_t (&rows)[R], const X& xs,
                                            int T, float (&acc)[R][kTokens], int lane) {
#pragma unroll 2
  for (int64_t c = int64_t(lane) * 8; c < w.cols; c += 256) {
    float wv[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) dmat_load8<F>(w, expert, rows[r], c, wv[r]);
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      if (t < T) {
        float xv[8];
        xs.load8(t, c, xv);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[r][t] = fmaf(wv[r][j], xv[j], acc[r][t]);
      }
    }
  }
}

// The same for a runtime format (small kernels: router, shared gate).
template <int R, class X>
__device__ __forceinline__ void generic_dot_any(const DMat& w, int64_t expert, const int64_t (&rows)[R], const X& xs,
                                                int T, float (&acc)[R][kTokens], int lane) {
  switch (w.format) {
    case WeightFormat::f32: generic_dot<WeightFormat::f32, R>(w, expert, rows, xs, T, acc, lane); break;
    case WeightFormat::bf16: generic_dot<WeightFormat::bf16, R>(w, expert, rows, xs, T, acc, lane); break;
    case WeightFormat::affine4: generic_dot<WeightFormat::affine4, R>(w, expert, rows, xs, T, acc, lane); break;
    case WeightFormat::affine8: generic_dot<WeightFormat::affine8, R>(w, expert, rows, xs, T, acc, lane); break;
  }
}

// inv[t] = 1 / sqrt(mean(x[t]²) + eps) for t < T into shared inv[kTokens] (1 when norm is off). Block-wide; uses
// red[blockDim/32 · kTokens] shared floats; synchronises.
__device__ inline void block_rms_factors(const float* x, int64_t ldx, int64_t cols, int T, bool norm, float eps,
                                         float* red, float* inv) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, warps = blockDim.x / 32;
  if (norm) {
    for (int t = 0; t < T; ++t) {
      float ss = 0.0f;
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = x[t * ldx + c];
        ss = fmaf(v, v, ss);
      }
      ss = warp_sum(ss);
      if (lane == 0) red[warp * kTokens + t] = ss;
    }
  }
  __syncthreads();
  if (threadIdx.x < kTokens) {
    float f = 1.0f;
    if (norm && int(threadIdx.x) < T) {
      float ss = 0.0f;
      for (int w = 0; w < warps; ++w) ss += red[w * kTokens + threadIdx.x];
      f = 1.0f / sqrtf(ss / float(cols) + eps);
    }
    inv[threadIdx.x] = f;
  }
  __syncthreads();
}

// ---- host side ------------------------------------------------------------------------------------------------

// The opt-in shared memory limit of the current device (cached).
int max_dynamic_smem();
// Streaming multiprocessors of the current device (cached).
int sm_count();
// Raises kernel's dynamic shared memory limit to the device's opt-in limit less the kernel's static shared memory,
// once (the first call; before any graph capture). Returns that limit.
int allow_dynamic_smem(const void* kernel);

// Tuning of the tensor-core kernels (qmv, MoE gate_up and down): blocks per SM of the persistent grid and the depth
// of the register ring (steps in flight per warp: 4, 6 or 8). Defaults from TERN_QMV_BPS / TERN_QMV_DEPTH, else
// 1 and 6 (a 256-thread block then keeps to 128 registers per thread: half an SM, so that the next kernel's blocks
// fit beside it and issue their weight loads before their pdl_wait()).
// variant (qmv only; TERN_QMV_VARIANT): 0 = 2 groups per step (1 KB of weights per warp step), 1 = 4 groups per
// step (2 KB; the ring holds depth/2 steps, the same bytes in flight); 1 falls back to 0 when the scale or bias
// arrays are not 8-byte aligned. 2 (opt-in, qmv only; the MoE kernels run variant 1 then) = the steps of variant 1
// copied by cp.async into a per-warp shared-memory pipeline of depth/2 stages, each warp copy reading 4 rows × 128
// contiguous bytes instead of 16 rows × 8 bytes (qmv.cu); falls back to 1 when the words are not 16-byte aligned
// or the stages do not fit in shared memory. Results are bit-identical to variant 1. 3 (the default) = one-token
// qmv products and MoE expert kernels through the integer path (qmv_dp4a.cuh, moe_dp4a.cuh) where it applies,
// everything else as variant 1.
struct Tuning {
  int blocks_per_sm = 1;
  int depth = 6;
  int variant = 3;  // H200, 4K decode: 433 tok/s (3) vs 361 (2) vs 345 (1)
};
Tuning tuning();
void set_tuning(const Tuning& t);
// Blocks of a persistent launch: min(work_blocks, SMs × min(tuning().blocks_per_sm, blocks that fit per SM)), so
// that every block is resident at once.
int persistent_grid(const void* kernel, int smem, int64_t work_blocks);
// Blocks of `kernel` (kThreads threads, smem bytes of dynamic shared memory) that fit on one SM; looked up once.
int blocks_fit(const void* kernel, int smem);
// A balanced one-wave grid of kWarps-warp blocks for `batches` warp batches handed out round-robin (the one-token
// integer kernels): the fewest rounds the resident warps allow, then just enough blocks for them. tokens > 1 (the
// batched forms: grid (blocks, tokens), each token its own `batches`): the blocks per token, a token's share (at least
// one) of that grid for all tokens' batches, so that every token's blocks are resident together; tokens = 1 is the
// one-token grid.
int balanced_grid(const void* kernel, int64_t batches, int tokens = 1);

}  // namespace tern::cuda::qtile
