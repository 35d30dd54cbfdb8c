// Hopper's warpgroup MMA (wgmma, sm_90a only) for the kernel families that use it (the prefill products,
// qmatmul_wgmma.cu; the attention prefill, attention_prefill_wgmma.cu): the fences, commit and wait, the shared-memory
// matrix descriptor of the 128-byte-swizzle layouts, and the m64nNk16 16-bit MMAs with fp32 accumulators. Included by
// .cu files only. Built for anything but sm_90a, every MMA traps (callers check the binary first).
//
// The 128-byte-swizzle tile (both operand majors use it here): rows of 128 bytes (64 16-bit values), 16-byte chunk c
// of row r at r·128 + 16·(c ^ r % 8), 8-row atoms of 1024 bytes; a tile starts on a 1024-byte boundary (the swizzle is
// of address bits 4..6 by bits 7..9).
//   - K-major (the operand's K along the 128-byte row: A = [M][K], B = [N][K]): an m64/nN × k16 slice starts 32 bytes
//     further per k16 step inside a row of 64; 8-row groups (M or N) are 1024 bytes apart (the stride byte offset).
//   - MN-major (B only here, imm-trans-b = 1: B = [K][N], N along the row): a k16 × n64 slice is 16 rows (two 8-row
//     K groups, 1024 bytes apart: the stride byte offset) of one 64-value column panel; the leading byte offset is the
//     step between 64-value panels along N (unused by n ≤ 64).
// Accumulators of m64nNk16 (warp w of the warpgroup, g = lane / 4, t = lane % 4): d[4j + c] is row 16w + g + 8·(c / 2),
// column 8j + 2t + c % 2. The register A fragment of m64k16 is mma.sync m16n8k16's for each warp's 16 rows
// (ptx.cuh), so the accumulators of a product over N columns, packed in pairs, are the A fragments of a next product
// whose K is those N columns: k16 step i takes d[8i .. 8i + 7].
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TERN_WGMMA 1
#else
#define TERN_WGMMA 0
#endif

namespace tern::cuda::wgmma {

// Orders this thread's generic-proxy writes of shared memory (stores, cp.async once waited for) before the tensor
// cores' reads through descriptors.
__device__ __forceinline__ void fence_proxy_async() {
#if TERN_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Before the first wgmma of a batch whose registers (accumulators, A fragments) other instructions wrote.
__device__ __forceinline__ void fence() {
#if TERN_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#if TERN_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wait() {
#if TERN_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Pins registers the asynchronous MMAs read or write at this point of the program (no instruction): the compiler
// sees the MMA as done when its asm statement is, so each register an MMA in flight uses is fenced after the wait.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int R>
__device__ __forceinline__ void fence_regs(uint32_t (&a)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

// The descriptor of a 128-byte-swizzle operand slice at shared address addr: start address >> 4 in bits 0..13, the
// leading byte offset >> 4 in bits 16..29, the stride byte offset >> 4 in bits 32..45, the swizzle mode in bits
// 62..63 (1: 128 bytes). K-major slices: lbo 16 (unused), sbo 1024.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) |
         (uint64_t(1) << 62);
}

// d (=, scale_d == 0; +=, 1) A · B, m64nNk16, A fp16 (F16) or bf16 from registers, B of the same type from shared
// memory (descriptor; TransB 0: K-major, 1: MN-major), fp32 accumulators: N/2 per thread. Operands: the N/2
// accumulators, then the 4 A registers, the descriptor, scale_d (a predicate) and TransB, numbered in that order.
#define TERN_WGMMA_RS_M64N16K16(TYPE)                                                                                \
  asm volatile(                                                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"                                                                   \
      "wgmma.mma_async.sync.aligned.m64n16k16.f32." TYPE "." TYPE " "                                                 \
      "{%0, %1, %2, %3, %4, %5, %6, %7}, "                                                                            \
      "{%8, %9, %10, %11}, %12, p, 1, 1, %14;\n}\n"                                                                  \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])               \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d), "n"(TransB))
#define TERN_WGMMA_RS_M64N32K16(TYPE)                                                                                \
  asm volatile(                                                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                                   \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE " "                                                 \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "                                      \
      "{%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"                                                                \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])                   \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d), "n"(TransB))
#define TERN_WGMMA_ACC32                                                                                             \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),       \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),        \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),       \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define TERN_WGMMA_D32                                                                                               \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                         \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
#define TERN_WGMMA_RS_M64N64K16(TYPE)                                                                                \
  asm volatile(                                                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                                   \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " TERN_WGMMA_D32                                  \
      "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"                                                                \
      : TERN_WGMMA_ACC32                                                                                             \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d), "n"(TransB))
template <bool F16, int R, int TransB = 0>  // R = N/2 accumulators
__device__ __forceinline__ void mma_rs(float (&d)[R], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  static_assert(R == 8 || R == 16 || R == 32, "m64n16k16, m64n32k16 or m64n64k16");
#if TERN_WGMMA
  if constexpr (R == 8) {
    if constexpr (F16) {
      TERN_WGMMA_RS_M64N16K16("f16");
    } else {
      TERN_WGMMA_RS_M64N16K16("bf16");
    }
  } else if constexpr (R == 16) {
    if constexpr (F16) {
      TERN_WGMMA_RS_M64N32K16("f16");
    } else {
      TERN_WGMMA_RS_M64N32K16("bf16");
    }
  } else {
    if constexpr (F16) {
      TERN_WGMMA_RS_M64N64K16("f16");
    } else {
      TERN_WGMMA_RS_M64N64K16("bf16");
    }
  }
#else
  (void)d, (void)a, (void)desc, (void)scale_d;
  __trap();
#endif
}

// d (=, scale_d == 0; +=, 1) A · B, m64nNk16 (N = 32 or 64), A and B 16-bit K-major from shared memory
// (descriptors), fp32 accumulators: N/2 per thread.
#define TERN_WGMMA_SS_M64N32K16(TYPE)                                                                                \
  asm volatile(                                                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                                   \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE " "                                                 \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "                                      \
      "%16, %17, p, 1, 1, 0, 0;\n}\n"                                                                                \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])                   \
      : "l"(adesc), "l"(bdesc), "r"(scale_d))
#define TERN_WGMMA_SS_M64N64K16(TYPE)                                                                                \
  asm volatile(                                                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                                   \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " TERN_WGMMA_D32                                  \
      "%32, %33, p, 1, 1, 0, 0;\n}\n"                                                                                \
      : TERN_WGMMA_ACC32                                                                                             \
      : "l"(adesc), "l"(bdesc), "r"(scale_d))
template <bool F16, int R>  // R = N/2 accumulators
__device__ __forceinline__ void mma_ss(float (&d)[R], uint64_t adesc, uint64_t bdesc, int scale_d) {
  static_assert(R == 16 || R == 32, "m64n32k16 or m64n64k16");
#if TERN_WGMMA
  if constexpr (R == 16) {
    if constexpr (F16) {
      TERN_WGMMA_SS_M64N32K16("f16");
    } else {
      TERN_WGMMA_SS_M64N32K16("bf16");
    }
  } else {
    if constexpr (F16) {
      TERN_WGMMA_SS_M64N64K16("f16");
    } else {
      TERN_WGMMA_SS_M64N64K16("bf16");
    }
  }
#else
  (void)d, (void)adesc, (void)bdesc, (void)scale_d;
  __trap();
#endif
}
#undef TERN_WGMMA_RS_M64N16K16
#undef TERN_WGMMA_RS_M64N32K16
#undef TERN_WGMMA_RS_M64N64K16
#undef TERN_WGMMA_SS_M64N32K16
#undef TERN_WGMMA_SS_M64N64K16
#undef TERN_WGMMA_ACC32
#undef TERN_WGMMA_D32

}  // namespace tern::cuda::wgmma
