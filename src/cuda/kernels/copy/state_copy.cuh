// Many device-to-device copies in one kernel launch: Session::rollback's restore of every Gated DeltaNet layer's conv
// and recurrent state (CudaSession::copy_kept_states: 2 copies per linear-attention layer, ~66 MB at the model's
// widths) and the session's new position, instead of one cudaMemcpyAsync per state and a host-to-device copy of the
// position. The host twin is a memcpy per entry (tests/cuda/kernels/state_copy_test.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace tern::cuda {

// One region to copy: n16 16-byte words (n16 x 16 bytes) from src to dst, both 16-byte aligned, device memory, the
// regions of one state_copy call not overlapping one another (no entry's dst is another's src).
struct StateCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  int64_t n16 = 0;
};

// The entries one launch carries in its parameters (the model has <= 48 layers: <= 96 states); state_copy splits a
// longer list into launches of this many.
constexpr int kStateCopyMaxEntries = 96;

// The entry for `bytes` bytes from src to dst. Throws tern::InternalError when dst, src or bytes is not a multiple of
// 16 (the kernel moves 16-byte words: a layout that breaks that fails here rather than copying the wrong bytes).
StateCopy state_copy_entry(void* dst, const void* src, size_t bytes);

// Every entry's words from src to dst, and *pos_dst = pos when pos_dst is not null, on `stream`: one plain launch
// (no PDL) per kStateCopyMaxEntries entries, whose blocks each copy a chunk of 1024 words (16 KB) of one entry, so the
// copies run at the memory's bandwidth together rather than one after another. Asynchronous: the caller syncs.
void state_copy(std::span<const StateCopy> entries, int* pos_dst, int pos, cudaStream_t stream);

}  // namespace tern::cuda
