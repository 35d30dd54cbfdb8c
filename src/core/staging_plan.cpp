#include "core/staging_plan.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace tern {

void host_copies_sort_by_source(std::vector<HostCopy>& copies) {
  std::stable_sort(copies.begin(), copies.end(), [](const HostCopy& a, const HostCopy& b) {
    return reinterpret_cast<uintptr_t>(a.src) < reinterpret_cast<uintptr_t>(b.src);
  });
}

std::vector<HostCopy> host_copies_merge(const std::vector<HostCopy>& copies) {
  std::vector<HostCopy> out;
  out.reserve(copies.size());
  for (const HostCopy& c : copies) {
    if (c.bytes == 0) continue;
    if (!out.empty()) {
      HostCopy& last = out.back();
      if (last.src + last.bytes == c.src && last.dst + last.bytes == c.dst) {
        last.bytes += c.bytes;
        continue;
      }
    }
    out.push_back(c);
  }
  return out;
}

std::vector<StagingChunk> staging_plan(const std::vector<HostCopy>& copies, size_t capacity, size_t align) {
  TERN_CHECK(capacity > 0, "staging_plan: a staging buffer of 0 bytes");
  TERN_CHECK(align > 0 && (align & (align - 1)) == 0, "staging_plan: alignment ", align, " is not a power of two");
  std::vector<StagingChunk> chunks;
  size_t used = capacity;  // no chunk open yet
  for (const HostCopy& c : copies) {
    size_t done = 0;
    while (done < c.bytes) {
      size_t offset = (used + align - 1) & ~(align - 1);
      if (offset >= capacity) {
        chunks.emplace_back();
        offset = 0;
      }
      const size_t n = std::min(c.bytes - done, capacity - offset);
      StagingChunk& chunk = chunks.back();
      chunk.pieces.push_back(StagedPiece{c.src + done, c.dst + done, n, offset});
      chunk.extent = offset + n;
      chunk.payload += n;
      used = chunk.extent;
      done += n;
    }
  }
  return chunks;
}

void staging_fill(const StagingChunk& chunk, uint8_t* staging, size_t begin, size_t end) {
  // The first piece that ends after `begin` (pieces lie at increasing offsets).
  auto it = std::upper_bound(chunk.pieces.begin(), chunk.pieces.end(), begin,
                             [](size_t b, const StagedPiece& p) { return b < p.offset + p.bytes; });
  for (; it != chunk.pieces.end() && it->offset < end; ++it) {
    const size_t from = std::max(begin, it->offset), to = std::min(end, it->offset + it->bytes);
    if (from < to) std::memcpy(staging + from, it->src + (from - it->offset), to - from);
  }
}

void staging_prefetch(const StagingChunk& chunk) {
  static const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  for (const StagedPiece& p : chunk.pieces) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(p.src) / page * page;
    const uintptr_t end = reinterpret_cast<uintptr_t>(p.src) + p.bytes;
    ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);  // a hint: errors do not matter
  }
}

}  // namespace tern
