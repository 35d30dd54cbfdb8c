// The device tables of a batched step (batch_plan.cu) and of a verify step (verify_plan.cu): per token slot its id,
// its session's attention split count, capacity and position; then per layer two pointer tables, (conv, rec) of a
// Gated DeltaNet layer or (k, v) of an attention layer. The runner fills them in pinned memory and copies them once
// per step, so that one CUDA graph serves any sessions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/kernels/qmv/qmv_dp4a.cuh"

namespace tern::cuda {

constexpr int kBatchSlots = kBatchMaxTokens;  // token slots of one step

// Slots past the step's token count are not read.
struct BatchHeader {
  int tokens[kBatchSlots];
  int splits[kBatchSlots];      // attn_batch_splits of each slot's session capacity
  int64_t capacity[kBatchSlots];
  int* pos[kBatchSlots];        // the slot's position: CudaSession::d_pos (batched step), p0 + slot (verify step)
};
constexpr size_t kLayerTableBytes = 2 * kBatchSlots * sizeof(void*);

inline size_t layer_table_offset(size_t layer) { return sizeof(BatchHeader) + layer * kLayerTableBytes; }

}  // namespace tern::cuda
