// L2Ranges: byte ranges of device memory that a decode kernel asks L2 to fetch for the kernels after it (see
// l2_prefetch.cuh, which issues them). Host-safe: filled by the decode plan, passed by value as a kernel parameter.
#pragma once

#include <cstdint>

namespace tern::cuda {

struct L2Ranges {
  static constexpr int kMax = 16;
  static constexpr uint32_t kPiece = 4096;  // bytes per prefetch instruction
  const char* p[kMax] = {};
  uint32_t bytes[kMax] = {};
  uint32_t first[kMax] = {};  // index of range i's first piece among all the ranges' pieces
  uint32_t pieces = 0;        // pieces of all the ranges
  int n = 0;

  // Adds [ptr, ptr + nbytes), trimmed inward to 16-byte bounds (the instruction's alignment); ranges of 4 GB or more
  // are cut to their first 4 GB - 4 KB. Returns false, adding nothing, when the list is full.
  bool add(const void* ptr, int64_t nbytes) {
    if (!ptr || nbytes <= 0) return true;
    if (n == kMax) return false;
    const uintptr_t a = reinterpret_cast<uintptr_t>(ptr), b = a + uintptr_t(nbytes);
    const uintptr_t lo = (a + 15) & ~uintptr_t(15), hi = b & ~uintptr_t(15);
    if (hi <= lo) return true;
    const uint64_t cap = 0xFFFFF000ull;
    const uint64_t len = uint64_t(hi - lo) < cap ? uint64_t(hi - lo) : cap;
    p[n] = reinterpret_cast<const char*>(lo);
    bytes[n] = uint32_t(len);
    first[n] = pieces;
    pieces += uint32_t((len + kPiece - 1) / kPiece);
    ++n;
    return true;
  }
};

}  // namespace tern::cuda
