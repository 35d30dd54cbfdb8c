// The decode merge fused into the split kernel (attention's tickets) in the attention tests (attention_test.cpp,
// attention_fp8_test.cpp): the tickets of the path the runner takes by default, and the check that the fused merge
// is bit for bit the merge kernel.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../cuda_test_util.h"
#include "cuda/kernels/attention/attention.cuh"

namespace tern::cuda::test {

// Zeroed tickets for attention calls of up to B sequences when the runner fuses the merge by default
// (attn_fused_merge), else none (null: the merge kernel), so that the tests against the references run its path.
struct DefaultTickets {
  std::unique_ptr<DeviceBuf<unsigned>> buf;
  DefaultTickets(int B, int Hkv) {
    if (attn_fused_merge())
      buf = std::make_unique<DeviceBuf<unsigned>>(std::vector<unsigned>(size_t(attn_ticket_count(B, Hkv)), 0u));
  }
  unsigned* p() const { return buf ? buf->p : nullptr; }
};

// run(tickets, out, stream) launches one decode attention call (attention or attention_batched on fixed inputs) that
// writes out [n floats]: null tickets, the split and merge kernels; else the fused merge. The fused call runs twice in
// a row and as two replays of one CUDA graph, each into a poisoned output that must be the merge kernel's bit for bit,
// with all ticket_count tickets back at 0 after each (the next launch starts from them).
template <typename Run>
void expect_fused_merge_matches(size_t n, int64_t ticket_count, const Run& run, const std::string& what) {
  SCOPED_TRACE(what);
  DeviceBuf<float> ref(n), got(n);
  DeviceBuf<unsigned> tickets(std::vector<unsigned>(size_t(ticket_count), 0u));
  cudaStream_t stream;
  TERN_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  run(nullptr, ref.p, stream);
  TERN_CUDA(cudaGetLastError());
  const std::vector<float> want = ref.host();
  EXPECT_EQ(std::count_if(want.begin(), want.end(), [](float x) { return !std::isfinite(x); }), 0)
      << "the merge kernel's output";
  auto check = [&](const std::string& how) {
    const std::vector<float> g = got.host();
    size_t same = 0;
    while (same < n && std::memcmp(&g[same], &want[same], sizeof(float)) == 0) ++same;
    const size_t at = std::min(same, n - 1);
    EXPECT_EQ(same, n) << how << ": first difference at " << at << ": got " << g[at] << ", want " << want[at];
    const std::vector<unsigned> t = tickets.host();
    EXPECT_EQ(std::count(t.begin(), t.end(), 0u), ticket_count) << how << ": tickets left nonzero";
  };
  for (int rep = 1; rep <= 2; ++rep) {
    TERN_CUDA(cudaMemsetAsync(got.p, 0xff, n * sizeof(float), stream));
    run(tickets.p, got.p, stream);
    TERN_CUDA(cudaGetLastError());
    check("fused call " + std::to_string(rep));
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TERN_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  TERN_CUDA(cudaMemsetAsync(got.p, 0xff, n * sizeof(float), stream));
  run(tickets.p, got.p, stream);
  TERN_CUDA(cudaStreamEndCapture(stream, &graph));
  TERN_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 1; rep <= 2; ++rep) {
    TERN_CUDA(cudaGraphLaunch(exec, stream));
    check("graph replay " + std::to_string(rep));
  }
  TERN_CUDA(cudaGraphExecDestroy(exec));
  TERN_CUDA(cudaGraphDestroy(graph));
  TERN_CUDA(cudaStreamDestroy(stream));
}

}  // namespace tern::cuda::test
