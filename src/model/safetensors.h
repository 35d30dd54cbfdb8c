// A paranoid safetensors reader: mmap'd files, one or sharded through model.safetensors.index.json.
//
// File format: u64 little-endian header length N, N bytes of JSON {"name": {"dtype", "shape", "data_offsets":
// [begin, end]}, "__metadata__": {str: str}}, then the data section; offsets are relative to the data section.
// Every violation (truncated header, bad JSON, unknown dtype, shape x dtype size != byte length, offsets outside
// the file, overlapping tensors, duplicate names) is a tern::Error naming the file and the tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/mmap.h"

namespace tern {

enum class Dtype : uint8_t { bf16, f16, f32, u32, u8, i32, i64 };

const char* dtype_name(Dtype d);  // safetensors spelling: "BF16", "F16", ...
int dtype_size(Dtype d);          // bytes per element
bool dtype_parse(const std::string& name, Dtype& out);

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::f32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets in the data section
  int64_t numel() const;
  std::string shape_string() const;  // "[8, 128]"
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;   // in file order of their offsets
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;          // 8 + N
};

// Limits that keep a hostile header from exhausting memory.
constexpr uint64_t kSafetensorsMaxHeader = 100ull << 20;  // 100 MiB of JSON
constexpr size_t kSafetensorsMaxTensors = 1u << 20;
constexpr size_t kSafetensorsMaxDims = 8;

// Parses and validates the header of a safetensors file held in [data, data + size). `file_name` names the file in
// messages. Throws tern::Error; never reads outside the buffer.
SafetensorsHeader safetensors_parse(const uint8_t* data, size_t size, const std::string& file_name);

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);  // maps and parses
  const std::filesystem::path& path() const { return file_.path(); }
  const SafetensorsHeader& header() const { return header_; }
  const uint8_t* tensor_data(const TensorInfo& t) const { return file_.data() + header_.data_offset + t.begin; }
  const MappedFile& mapped() const { return file_; }

 private:
  MappedFile file_;
  SafetensorsHeader header_;
};

// One tensor of a checkpoint: its description and where its bytes are.
struct TensorRef {
  const TensorInfo* info = nullptr;
  const SafetensorsFile* file = nullptr;
  const uint8_t* data() const { return file->tensor_data(*info); }
  uint64_t bytes() const { return info->end - info->begin; }
};

// All the safetensors files of a checkpoint directory: model.safetensors.index.json (every listed shard must exist
// and hold exactly the tensors the index assigns to it), else model.safetensors, else every *.safetensors file.
// Given a file instead of a directory: that one file.
class SafetensorsSet {
 public:
  explicit SafetensorsSet(const std::filesystem::path& dir);
  const TensorRef* find(const std::string& name) const;  // nullptr when absent
  const std::vector<std::string>& names() const { return names_; }  // sorted
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  void add_file(const std::filesystem::path& path);
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, TensorRef> tensors_;
  std::vector<std::string> names_;
  uint64_t total_bytes_ = 0;
};

// A tensor to write: its bytes are the concatenation of `chunks` (e.g. one per expert of a strided matrix).
struct TensorOut {
  std::string name;
  Dtype dtype = Dtype::bf16;
  std::vector<int64_t> shape;
  std::vector<std::pair<const void*, size_t>> chunks;
  uint64_t bytes() const;
};

// Writes a safetensors file (header padded to 8 bytes, tensors in the given order). Throws tern::Error naming the
// file on an I/O failure or when a tensor's bytes do not match its shape x dtype.
void safetensors_write(const std::filesystem::path& path, const std::vector<TensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace tern
