// The prefill router's near-ties, recomputed in fp32 (issue 29). The prefill plan takes the router logits [T, E] from
// the integer kernel (qmatmul_int8.cuh), whose x is quantised per token and group of 64 columns: x' lies within
// m_g/65278 of x (m_g the group's largest |x|), so a logit is off by at most B = Σ_g (m_g/65278)·L1_g, where L1_g
// is the largest Σ_{j in g} |w_ej| over the experts e. Where a token's k-th and (k+1)-th largest logits lie within
// 2.5·B (twice the bound, with room for fp32 summation) the rounding could have swapped which experts are chosen:
// that token's E logits are recomputed from x in fp32. Every other token's top k is already the one fp32 logits
// give, and its logits stay as they are (their rounding moves the routing weights continuously, never a choice).
// The split-x bf16 product (x within 2^-17 of itself) is inside the same bound. CPU twin: the fp32 router product
// (cpu::matmul) and cpu::moe_route, which the refined tokens match.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/weights/device_weights.cuh"

namespace tern::cuda {

// Whether the two functions below take this router: one matrix of 1..1024 rows, columns a multiple of 64, affine
// with group 64, bf16 or f32.
bool moe_router_refine_takes(const DMat& router);

// bounds [router.cols / 64]: L1_g of each group of 64 columns of the router [E, D] (affine 4- or 8-bit with group 64,
// bf16 or f32; D a multiple of 64). Once per layer, at load.
void router_group_bounds(const DMat& router, float* bounds, cudaStream_t stream);

// x [T, D] fp32 (row stride ldx), the router's input; logits [T, E] (E = router.rows) from a product within the
// bound above, updated in place. refined (optional, [1]): incremented by the number of tokens recomputed.
void moe_router_refine(const float* x, int64_t ldx, const DMat& router, const float* bounds, float* logits, int64_t T,
                       int k, int* refined, cudaStream_t stream);

}  // namespace tern::cuda
