#include "cuda/runner/activation_dump.cuh"

#include <filesystem>

#include "core/check.h"
#include "core/npy.h"
#include "cuda/common/cuda_common.cuh"

namespace tern::cuda {

ActivationDump::~ActivationDump() {
  try {
    flush();
  } catch (...) {  // a destructor must not throw; the dump is a debugging aid
  }
}

void ActivationDump::set_dir(const std::string& dir) {
  flush();
  dir_ = dir;
}

void ActivationDump::add(const std::string& name, const float* device, int64_t rows, int64_t cols,
                         cudaStream_t stream) {
  if (!on() || rows <= 0) return;
  Tensor& t = tensors_[name];
  TERN_CHECK(t.data.empty() || t.cols == cols, "activation dump: ", name, " has ", cols, " columns, earlier ", t.cols);
  t.cols = cols;
  const size_t old = t.data.size();
  t.data.resize(old + size_t(rows * cols));
  TERN_CUDA(cudaStreamSynchronize(stream));
  TERN_CUDA(cudaMemcpy(t.data.data() + old, device, size_t(rows * cols) * 4, cudaMemcpyDeviceToHost));
}

void ActivationDump::add_ids(const std::string& name, const int* device, int64_t rows, int64_t cols,
                             cudaStream_t stream) {
  if (!on() || rows <= 0) return;
  std::vector<int> ids(size_t(rows * cols));
  TERN_CUDA(cudaStreamSynchronize(stream));
  TERN_CUDA(cudaMemcpy(ids.data(), device, ids.size() * 4, cudaMemcpyDeviceToHost));
  Tensor& t = tensors_[name];
  TERN_CHECK(t.data.empty() || t.cols == cols, "activation dump: ", name, " has ", cols, " columns, earlier ", t.cols);
  t.cols = cols;
  t.data.insert(t.data.end(), ids.begin(), ids.end());
}

void ActivationDump::flush() {
  if (!dir_.empty() && !tensors_.empty()) {
    std::filesystem::create_directories(dir_);
    for (const auto& [name, t] : tensors_)
      npy_write_f32(std::filesystem::path(dir_) / (name + ".npy"), t.data.data(),
                    {int64_t(t.data.size()) / t.cols, t.cols});
  }
  tensors_.clear();
}

}  // namespace tern::cuda
