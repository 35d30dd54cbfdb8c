#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/check.h"
#include "core/npy.h"

namespace tern {
namespace {

TEST(Npy, RoundTrip) {
  const auto dir = std::filesystem::temp_directory_path() / ("tern_npy_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::vector<float> f = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  npy_write_f32(dir / "a.npy", f.data(), {2, 3});
  NpyArray a = npy_read(dir / "a.npy");
  EXPECT_EQ(a.dtype, "<f4");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.f32, f);
  const std::vector<int32_t> i = {7, -1, 300000};
  npy_write_i32(dir / "b.npy", i.data(), {3});
  NpyArray b = npy_read(dir / "b.npy");
  EXPECT_EQ(b.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(b.i32, i);
  // Header is a multiple of 64 bytes, as numpy writes it.
  EXPECT_EQ((std::filesystem::file_size(dir / "b.npy") - 12) % 64, 0u);
  std::ofstream(dir / "bad.npy") << "not numpy";
  EXPECT_THROW(npy_read(dir / "bad.npy"), Error);
  EXPECT_THROW(npy_read(dir / "missing.npy"), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tern
