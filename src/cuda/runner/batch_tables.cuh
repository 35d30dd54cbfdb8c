// The device tables of a batched step (batch_plan.cu) and of a verify step (verify_plan.cu): per token slot its id,
// its session's attention split count, capacity and position; then per layer two pointer tables of kBatchSlots
// entries: (k, v) of an attention layer per slot; of a Gated DeltaNet layer (conv, rec) per slot in a batched step,
// and in a verify step (one session) the states at slot 0 and the kept buffers (conv_keep, rec_keep) at slot 1 (a
// kept snapshot's layer buffers when the step keeps one state, BatchHeader::keep_token). The
// runner fills them in pinned memory and copies them once per step, so that one CUDA graph serves any sessions.
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
  int* rope_delta[kBatchSlots]; // the slot's session's M-RoPE delta: CudaSession::d_rope_delta
  int* session_pos;             // the verify step's session: its CudaSession::d_pos, advanced by the step's tokens
  int keep_token;               // a verify step that keeps one state (a prefix snapshot): the token it is before
};
constexpr size_t kLayerTableBytes = 2 * kBatchSlots * sizeof(void*);

inline size_t layer_table_offset(size_t layer) { return sizeof(BatchHeader) + layer * kLayerTableBytes; }

}  // namespace tern::cuda
