// Per-layer activations of the CUDA forward pass, gathered for `tern logits --dump-activations` and the whole-model
// error breakdown (tests/cuda/runner_test.cpp): a debugging aid, off unless a directory is set, never inside a CUDA
// graph capture. Rows of every forward call are appended in host memory (a decode loop of one-token calls adds one
// row per call) and written as DIR/<name>.npy [rows, cols] float32 when the directory changes or the runner ends.
// Names follow the CPU runner's dumps: "mixer_res.3" (the residual after layer 3's mixer), "layer_out.3" (after its
// MoE block), "route_ids.3" (its top-k expert ids, as floats).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tern::cuda {

class ActivationDump {
 public:
  ActivationDump() = default;
  ~ActivationDump();
  ActivationDump(const ActivationDump&) = delete;
  ActivationDump& operator=(const ActivationDump&) = delete;

  // Writes what was gathered for the previous directory, then gathers for `dir` ("" stops).
  void set_dir(const std::string& dir);
  bool on() const { return !dir_.empty(); }
  // Appends rows [rows, cols] of device memory (synchronises `stream`). No-op when off.
  void add(const std::string& name, const float* device, int64_t rows, int64_t cols, cudaStream_t stream);
  void add_ids(const std::string& name, const int* device, int64_t rows, int64_t cols, cudaStream_t stream);
  void flush();

 private:
  struct Tensor {
    int64_t cols = 0;
    std::vector<float> data;
  };
  std::string dir_;
  std::map<std::string, Tensor> tensors_;
};

}  // namespace tern::cuda
