// safetensors parser: hand-built files, every broken case fails with an Error naming the file and the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "core/check.h"
#include "model/safetensors.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

// 8-byte length + header JSON + `data_bytes` bytes of data.
std::string make_file(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  out += header;
  out += std::string(data_bytes, '\x01');
  return out;
}

SafetensorsHeader parse(const std::string& bytes) {
  return safetensors_parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "test.safetensors");
}

// Expects parse to throw an Error whose message contains every fragment.
void expect_error(const std::string& bytes, std::initializer_list<const char*> fragments) {
  try {
    parse(bytes);
    FAIL() << "no error for header " << bytes.substr(8, 200);
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
    EXPECT_NE(msg.find("test.safetensors"), std::string::npos) << msg;
  }
}

TEST(Safetensors, ParsesValidHeader) {
  const std::string h =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"U32","shape":[2,2],"data_offsets":[8,24]},)"
      R"("a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},"e":{"dtype":"I64","shape":[0],"data_offsets":[24,24]}})";
  const auto hdr = parse(make_file(h, 24));
  ASSERT_EQ(hdr.tensors.size(), 3u);
  EXPECT_EQ(hdr.tensors[0].name, "a");
  EXPECT_EQ(hdr.tensors[0].dtype, Dtype::bf16);
  EXPECT_EQ(hdr.tensors[1].name, "b");  // sorted by offset
  EXPECT_EQ(hdr.tensors[2].name, "e");
  EXPECT_EQ(hdr.tensors[1].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(hdr.tensors[2].numel(), 0);
  EXPECT_EQ(hdr.metadata.at("format"), "pt");
  EXPECT_EQ(hdr.data_offset, 8 + h.size());
}

TEST(Safetensors, AllDtypes) {
  const std::pair<const char*, int> dts[] = {{"BF16", 2}, {"F16", 2}, {"F32", 4}, {"U32", 4},
                                             {"U8", 1},   {"I32", 4}, {"I64", 8}};
  for (const auto& [name, size] : dts) {
    const std::string h = std::string(R"({"t":{"dtype":")") + name + R"(","shape":[3],"data_offsets":[0,)" +
                          std::to_string(3 * size) + "]}}";
    const auto hdr = parse(make_file(h, size_t(3 * size)));
    EXPECT_EQ(dtype_size(hdr.tensors[0].dtype), size);
    EXPECT_STREQ(dtype_name(hdr.tensors[0].dtype), name);
  }
}

TEST(Safetensors, TruncatedFile) {
  expect_error(std::string(5, '\0'), {"truncated"});
  std::string f = make_file(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  expect_error(f.substr(0, 20), {"truncated safetensors header"});
}

TEST(Safetensors, HeaderLengthTooLarge) {
  std::string f(16, '\0');
  f[7] = '\x7f';
  expect_error(f, {"header length"});
}

TEST(Safetensors, BadJson) {
  expect_error(make_file(R"({"t":{"dtype":"F32",)", 0), {"not valid JSON"});
  expect_error(make_file(R"([1,2,3])", 0), {"must be a JSON object"});
  expect_error(make_file(std::string(40, '[') + std::string(40, ']'), 0), {"nested too deeply"});
}

TEST(Safetensors, UnknownDtype) {
  expect_error(make_file(R"({"w":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", 1), {"'w'", "F8_E4M3"});
}

TEST(Safetensors, BadShape) {
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), {"'w'", "shape"});
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":"3","data_offsets":[0,4]}})", 4), {"'w'", "shape"});
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4), {"'w'", "shape"});
}

TEST(Safetensors, WrongByteLength) {
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24),
               {"'w'", "[2, 3]", "needs 24 bytes", "span 20"});
}

TEST(Safetensors, OffsetsOutsideFile) {
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12), {"'w'", "past the end"});
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 12), {"'w'", "reversed"});
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 12), {"'w'", "data_offsets"});
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,-4]}})", 12), {"'w'", "data_offsets"});
}

TEST(Safetensors, Overlap) {
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
               {"'a'", "'b'", "overlap"});
}

TEST(Safetensors, DuplicateName) {
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
               {"'a'", "twice"});
}

TEST(Safetensors, BadEntries) {
  expect_error(make_file(R"({"a":[1]})", 0), {"'a'", "object"});
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4), {"'a'", "unknown"});
  expect_error(make_file(R"({"__metadata__":{"k":1}})", 0), {"__metadata__"});
  expect_error(make_file(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), {"'a'", "dtype"});
}

// Random byte flips in a valid file either parse or throw tern::Error; never anything else.
TEST(Safetensors, RandomCorruptionNeverCrashes) {
  const uint32_t seed = std::random_device{}();
  std::printf("seed=%u\n", seed);
  std::mt19937 rng(seed);
  const std::string good = make_file(
      R"({"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},"b":{"dtype":"U32","shape":[2,2],"data_offsets":[8,24]}})",
      24);
  for (int i = 0; i < 3000; ++i) {
    std::string f = good;
    const int flips = 1 + int(rng() % 4);
    for (int k = 0; k < flips; ++k) f[rng() % f.size()] = char(rng() & 0xff);
    if (rng() % 5 == 0) f.resize(rng() % f.size());
    try {
      parse(f);
    } catch (const Error&) {
    }
  }
}

class SafetensorsDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tern_st_" + std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
  }
  fs::path dir_;
};

TEST_F(SafetensorsDir, WriteThenReadRoundTrip) {
  const float a[3] = {1.0f, -2.0f, 3.5f};
  const uint16_t b[4] = {1, 2, 3, 4};
  std::vector<TensorOut> t = {{"x.a", Dtype::f32, {3}, {{a, 12}}}, {"x.b", Dtype::bf16, {2, 2}, {{b, 4}, {b + 2, 4}}}};
  safetensors_write(dir_ / "model.safetensors", t, {{"format", "mlx"}});
  SafetensorsSet set(dir_);
  ASSERT_EQ(set.names().size(), 2u);
  const TensorRef* r = set.find("x.a");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(std::memcmp(r->data(), a, 12), 0);
  r = set.find("x.b");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(std::memcmp(r->data(), b, 8), 0);
  EXPECT_EQ(set.files()[0]->header().metadata.at("format"), "mlx");
  EXPECT_EQ(set.files()[0]->header().data_offset % 8, 0u);
}

TEST_F(SafetensorsDir, ShardMissingFromIndex) {
  const float a[1] = {1.0f};
  safetensors_write(dir_ / "s1.safetensors", {{"a", Dtype::f32, {1}, {{a, 4}}}});
  write("model.safetensors.index.json", R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
  try {
    SafetensorsSet set(dir_);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("s2.safetensors"), std::string::npos) << m;
    EXPECT_NE(m.find("missing"), std::string::npos) << m;
  }
}

TEST_F(SafetensorsDir, IndexAndShardDisagree) {
  const float a[2] = {1.0f, 2.0f};
  safetensors_write(dir_ / "s1.safetensors", {{"a", Dtype::f32, {1}, {{a, 4}}}, {"c", Dtype::f32, {1}, {{a + 1, 4}}}});
  write("model.safetensors.index.json", R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors"}})");
  EXPECT_THROW(SafetensorsSet{dir_}, Error);
  write("model.safetensors.index.json", R"({"weight_map":{"a":"s1.safetensors"}})");
  EXPECT_THROW(SafetensorsSet{dir_}, Error);  // c is not listed
  write("model.safetensors.index.json", R"({"weight_map":{"a":"../s1.safetensors"}})");
  EXPECT_THROW(SafetensorsSet{dir_}, Error);
  write("model.safetensors.index.json", R"({"weight_map":{"a":"s1.safetensors","c":"s1.safetensors"}})");
  EXPECT_NO_THROW(SafetensorsSet{dir_});
}

TEST_F(SafetensorsDir, EmptyDirectoryAndEmptyFile) {
  EXPECT_THROW(SafetensorsSet{dir_}, Error);
  write("model.safetensors", "");
  EXPECT_THROW(SafetensorsSet{dir_}, Error);
  EXPECT_THROW(SafetensorsSet{dir_ / "nope"}, Error);
}

}  // namespace
}  // namespace tern
