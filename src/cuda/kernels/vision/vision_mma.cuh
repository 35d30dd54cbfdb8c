// Device helpers of the vision encoder's tensor-core kernels (vision_gemm.cu, vision_attention.cu): cp.async copies
// of 16-byte chunks (zero-filled outside the source), ldmatrix fragment loads and the bf16 mma.sync m16n8k16 with
// fp32 accumulators (sm_80+, the same on sm_90a). Included by those .cu files only.
//
// Fragments of c[16×8] += a[16×16] · b[16×8] (g = lane / 4, c = lane % 4), two bf16 per register, the lower column
// (or k) in the low half:
//   a0 (row g, k 2c..2c+1), a1 (row g+8, k 2c..), a2 (row g, k 2c+8..), a3 (row g+8, k 2c+8..)
//   b0 (k 2c..2c+1, col g), b1 (k 2c+8..2c+9, col g)
//   c0 (row g, col 2c), c1 (row g, col 2c+1), c2 (row g+8, col 2c), c3 (row g+8, col 2c+1)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda::vision_mma {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes from global `src` to shared `dst`; when !valid the 16 bytes are zeros and src is not read (it must still
// be a valid address: pass the tensor's base).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
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

// c += a · b (bf16 inputs, fp32 accumulators; fragments as above).
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> two bf16 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// One float -> bf16 bits (round to nearest even).
__device__ __forceinline__ uint16_t to_bf16(float x) { return uint16_t(pack_bf16(x, 0.0f) & 0xffffu); }
__device__ __forceinline__ float from_bf16(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

}  // namespace tern::cuda::vision_mma
