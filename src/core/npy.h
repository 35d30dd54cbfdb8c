// NumPy .npy files (format version 1.0, little-endian, C order): float32 and int32 arrays, for logits dumps,
// activation dumps and test data. Errors are tern::Error naming the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace tern {

void npy_write_f32(const std::filesystem::path& path, const float* data, const std::vector<int64_t>& shape);
void npy_write_i32(const std::filesystem::path& path, const int32_t* data, const std::vector<int64_t>& shape);

struct NpyArray {
  std::string dtype;            // "<f4" or "<i4"
  std::vector<int64_t> shape;
  std::vector<float> f32;       // when dtype is <f4
  std::vector<int32_t> i32;     // when dtype is <i4
  int64_t size() const;         // product of shape
};

// Reads a .npy of dtype <f4 or <i4 (also |i1-free plain headers written by numpy.save). Fortran order is refused.
NpyArray npy_read(const std::filesystem::path& path);

}  // namespace tern
