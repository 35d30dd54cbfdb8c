// Host memory (mapped checkpoint files, heap) to the device at the speed of the slower of reading and PCIe: the
// copies are planned into staging-buffer chunks (core/staging_plan.h); several host threads fill a pinned buffer
// from the sources (faulting the mapped pages in, from the page cache or the disk) while the buffers filled before
// travel to the device on their own streams; an event per buffer says when it may be filled again. One host sync,
// at the end. Host-only header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/staging_plan.h"

namespace tern::cuda {

struct StagingOptions {
  size_t buffer_bytes = size_t(64) << 20;  // each pinned buffer
  int buffers = 4;                         // pinned buffers in rotation
  int streams = 2;                         // copy streams, chunk k on stream k % streams
  int threads = 0;                         // host threads filling a buffer; 0: the host's cores, at most 16
};

struct StagedUploadResult {
  int64_t bytes = 0;    // bytes read from the sources and copied to the device
  double seconds = 0;   // wall time from the first read to the last byte on the device
  double gb_per_s() const { return seconds > 0 ? double(bytes) / 1e9 / seconds : 0.0; }
};

// Copies every HostCopy (dst: device addresses) to the device; returns once all of them are there. `progress`:
// a progress line on stderr named `label`, bytes actually read per second of the copy's wall time. The sources must
// stay alive and unchanged until it returns. Throws tern::Error on CUDA failures (after the copies in flight end).
StagedUploadResult staged_upload(std::vector<HostCopy> copies, const char* label, bool progress,
                                 const StagingOptions& options = {});

}  // namespace tern::cuda
