// Inline-PTX wrappers shared by the kernel families (sm_80+, the same on sm_90a): cp.async copies global -> shared and
// their groups, ldmatrix fragment loads, the bf16 mma.sync m16n8k16 with fp32 accumulators, and a few bit operations.
// One definition of each; wrappers only one family uses stay in that family's files. Included by .cu files only.
//
// Fragments of c[16×8] += a[16×16] · b[16×8] (m16n8k16, g = lane / 4, c = lane % 4), two 16-bit values per
// register, the lower column (or k) in the low half:
//   a0 (row g, k 2c..2c+1), a1 (row g+8, k 2c..), a2 (row g, k 2c+8..), a3 (row g+8, k 2c+8..)
//   b0 (k 2c..2c+1, col g), b1 (k 2c+8..2c+9, col g)
//   c0 (row g, col 2c), c1 (row g, col 2c+1), c2 (row g+8, col 2c), c3 (row g+8, col 2c+1)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

// The shared-window address of a generic pointer to shared memory (what cp.async and ldmatrix take).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes from global `src` to shared `dst` (a shared-window address), through L2 only (.cg, not L1); when
// src_bytes < 16 the rest is zero-filled (0: nothing is read, but src must still be a valid address).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// The same to a generic pointer into shared memory: the 16 bytes when `valid`, else 16 zeros (src not read; pass a
// valid address such as the tensor's base). The byte count is formed before the address, as the vision kernels had
// it: the other order moves instructions in vision_attention.cu's SASS.
__device__ __forceinline__ void cp_async_16_if(void* dst, const void* src, bool valid) {
  const uint32_t bytes = valid ? 16u : 0u;
  cp_async_16(smem_addr(dst), src, bytes);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8×8 16-bit matrices: lanes 8i..8i+7 give the row addresses of matrix i; register i of lane (g, c) holds
// matrix i's row g, columns 2c, 2c+1 (.trans: rows 2c, 2c+1 of column g).
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a · b, m16n8k16, bf16 operands, fp32 accumulators (fragments as above). Not volatile: a pure function of its
// operands, so the compiler may interleave independent MMAs with other work (the prefill products).
__device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// The same as asm volatile: kept in program order with the other volatile asm (ldmatrix, cp.async), as the attention
// and vision kernels were written and measured; a different instruction schedule from mma_bf16_16816.
__device__ __forceinline__ void mma_bf16_16816_volatile(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> a bf16 pair (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t cvt_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// (a & mask) | magic in one instruction: nibbles into the mantissa of a 16-bit float pair (the dequantisations).
__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t mask, uint32_t magic) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(mask), "r"(magic));
  return d;
}

}  // namespace tern::cuda
