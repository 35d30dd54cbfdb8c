// TERN_STEP_TIMING=1: where a graph decode step's wall time goes. CUDA events around the step's stream work give the
// device's span (first stream operation to the token copied back); the host's wall time inside the step (from before
// its first stream operation to the return of its synchronisation) adds what the device does not cover: the graph's
// submission and the wake-up after it. Printed to stderr when the runner ends. Off (no events, no cost) unless the
// variable is 1.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tern::cuda {

class StepTimer {
 public:
  StepTimer() {
    const char* e = std::getenv("TERN_STEP_TIMING");
    on_ = e && std::strcmp(e, "1") == 0;
    if (on_ && (cudaEventCreate(&a_) != cudaSuccess || cudaEventCreate(&b_) != cudaSuccess)) on_ = false;
  }
  ~StepTimer() {
    if (!on_) return;
    if (steps_ > 0)
      std::fprintf(stderr,
                   "tern: %lld graph decode steps: device span %.4f ms/step (events), host wall %.4f ms/step inside "
                   "the step call: %.1f us/step not covered by the device\n",
                   steps_, device_ms_ / double(steps_), wall_ms_ / double(steps_),
                   1e3 * (wall_ms_ - device_ms_) / double(steps_));
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;

  // Before the step's first stream operation.
  void begin(cudaStream_t stream) {
    if (!on_) return;
    start_ = std::chrono::steady_clock::now();
    cudaEventRecord(a_, stream);
  }
  // After the step's last stream operation, before the host waits for it.
  void end(cudaStream_t stream) {
    if (on_) cudaEventRecord(b_, stream);
  }
  // After the host has waited for the step.
  void collect() {
    if (!on_) return;
    const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, a_, b_) == cudaSuccess) {
      device_ms_ += ms;
      wall_ms_ += wall;
      ++steps_;
    }
  }

 private:
  bool on_ = false;
  cudaEvent_t a_ = nullptr, b_ = nullptr;
  double device_ms_ = 0, wall_ms_ = 0;
  long long steps_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tern::cuda
