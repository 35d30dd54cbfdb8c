// Read-only memory-mapped files (checkpoint shards). Errors name the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

namespace tern {

class MappedFile {
 public:
  // Maps the whole file read-only. Throws tern::Error naming the file when it cannot be opened or mapped.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }  // nullptr for an empty file
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

  // Hints that [offset, offset+length) will be read soon, front to back (madvise; best effort).
  void advise_sequential(size_t offset, size_t length) const;

 private:
  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tern
