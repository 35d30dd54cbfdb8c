// Planning a bulk copy from host memory (mapped files, heap) through a few fixed-size staging buffers: the copies
// cut into chunks of at most one buffer each, small copies packed together, big ones split. Several threads then
// fill one buffer, each its own byte range (staging_fill), while the buffers filled before travel on (the CUDA
// weight upload: src/cuda/weights/staged_upload). Knows nothing of devices: destinations are opaque addresses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tern {

// One copy to make: `bytes` bytes from host `src` to destination address `dst`.
struct HostCopy {
  const uint8_t* src = nullptr;
  uintptr_t dst = 0;
  size_t bytes = 0;
};

// The part of a copy that travels in one staging buffer, at `offset` in it.
struct StagedPiece {
  const uint8_t* src = nullptr;
  uintptr_t dst = 0;
  size_t bytes = 0;
  size_t offset = 0;
};

// What one staging buffer carries: pieces at increasing offsets, each aligned, none overlapping.
struct StagingChunk {
  std::vector<StagedPiece> pieces;
  size_t extent = 0;   // end of the last piece in the buffer (alignment gaps included)
  size_t payload = 0;  // bytes of data (the pieces' sum)
};

// Sorts copies by source address (stable), so that each mapped file is read front to back: the order a cold disk
// reads fastest, and the order readahead expects.
void host_copies_sort_by_source(std::vector<HostCopy>& copies);

// Copies whose source and destination both continue the previous one's become one copy (stacked experts put one
// by one, tensors back to back in the file and on the device). Copies of 0 bytes are dropped. Order is kept.
std::vector<HostCopy> host_copies_merge(const std::vector<HostCopy>& copies);

// Cuts `copies`, in their order, into chunks of at most `capacity` bytes. Each piece starts at a multiple of `align`
// (a power of two) in its chunk; a copy that does not fit in what its chunk has left fills it and continues at
// offset 0 of the next. Every byte of every copy is in exactly one piece. Throws tern::Error for capacity 0 or an
// alignment that is not a power of two.
std::vector<StagingChunk> staging_plan(const std::vector<HostCopy>& copies, size_t capacity, size_t align = 256);

// Copies the bytes of the chunk's pieces that lie in buffer bytes [begin, end) from their sources into
// `staging` (the buffer's start). Ranges that do not overlap may be filled by different threads at once.
void staging_fill(const StagingChunk& chunk, uint8_t* staging, size_t begin, size_t end);

// Asks the kernel to start reading the chunk's source pages (madvise WILLNEED; best effort, never throws): called a
// chunk or two ahead, so that a cold disk reads while earlier chunks are copied.
void staging_prefetch(const StagingChunk& chunk);

}  // namespace tern
