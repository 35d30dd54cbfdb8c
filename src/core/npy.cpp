#include "core/npy.h"

#include <cstring>
#include <fstream>

#include "core/check.h"

namespace tern {
namespace {

std::string npy_header(const char* dtype, const std::vector<int64_t>& shape) {
  std::string s = "{'descr': '";
  s += dtype;
  s += "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) s += ",";
    if (i + 1 < shape.size()) s += " ";
  }
  s += "), }";
  // Magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of 64, ending in \n.
  const size_t total = 10 + s.size() + 1;
  s.append((64 - total % 64) % 64, ' ');
  s += '\n';
  return s;
}

void npy_write(const std::filesystem::path& path, const char* dtype, const void* data, int64_t elem_bytes,
               const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    TERN_CHECK(d >= 0, "npy: negative dimension ", d, " for ", path.string());
    n *= d;
  }
  const std::string header = npy_header(dtype, shape);
  TERN_CHECK(header.size() < 65536, "npy: header too long for ", path.string());
  std::ofstream f(path, std::ios::binary);
  TERN_CHECK(f.good(), "cannot open ", path.string(), " for writing");
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  f.write(magic, 8);
  const uint16_t len = uint16_t(header.size());
  const char len_le[2] = {char(len & 0xff), char(len >> 8)};
  f.write(len_le, 2);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(static_cast<const char*>(data), std::streamsize(n * elem_bytes));
  TERN_CHECK(f.good(), "error writing ", path.string());
}

// Finds the value text following 'key': in a numpy header dict.
std::string header_field(const std::string& h, const std::string& key, const std::filesystem::path& path) {
  const size_t k = h.find("'" + key + "'");
  TERN_CHECK(k != std::string::npos, "npy: ", path.string(), " has no '", key, "' in its header");
  size_t c = h.find(':', k);
  TERN_CHECK(c != std::string::npos, "npy: malformed header in ", path.string());
  ++c;
  while (c < h.size() && h[c] == ' ') ++c;
  return h.substr(c);
}

}  // namespace

int64_t NpyArray::size() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void npy_write_f32(const std::filesystem::path& path, const float* data, const std::vector<int64_t>& shape) {
  npy_write(path, "<f4", data, 4, shape);
}

void npy_write_i32(const std::filesystem::path& path, const int32_t* data, const std::vector<int64_t>& shape) {
  npy_write(path, "<i4", data, 4, shape);
}

NpyArray npy_read(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  TERN_CHECK(f.good(), "cannot open ", path.string());
  char magic[8];
  f.read(magic, 8);
  TERN_CHECK(f.good() && std::memcmp(magic, "\x93NUMPY", 6) == 0, "npy: ", path.string(), " is not a .npy file");
  const int major = magic[6];
  uint32_t hlen = 0;
  if (major == 1) {
    unsigned char b[2];
    f.read(reinterpret_cast<char*>(b), 2);
    hlen = b[0] | (uint32_t(b[1]) << 8);
  } else {
    TERN_CHECK(major == 2 || major == 3, "npy: ", path.string(), " has unsupported version ", major);
    unsigned char b[4];
    f.read(reinterpret_cast<char*>(b), 4);
    hlen = b[0] | (uint32_t(b[1]) << 8) | (uint32_t(b[2]) << 16) | (uint32_t(b[3]) << 24);
  }
  TERN_CHECK(f.good() && hlen < (1u << 20), "npy: bad header length in ", path.string());
  std::string h(hlen, '\0');
  f.read(h.data(), hlen);
  TERN_CHECK(f.good(), "npy: truncated header in ", path.string());

  NpyArray a;
  const std::string descr = header_field(h, "descr", path);
  TERN_CHECK(descr.size() > 5 && descr[0] == '\'', "npy: malformed descr in ", path.string());
  a.dtype = descr.substr(1, descr.find('\'', 1) - 1);
  TERN_CHECK(a.dtype == "<f4" || a.dtype == "<i4", "npy: ", path.string(), " has dtype ", a.dtype,
             "; only float32 (<f4) and int32 (<i4) are read");
  TERN_CHECK(header_field(h, "fortran_order", path).rfind("False", 0) == 0, "npy: ", path.string(),
             " is in Fortran order; save it C-contiguous");
  const std::string shape = header_field(h, "shape", path);
  TERN_CHECK(!shape.empty() && shape[0] == '(', "npy: malformed shape in ", path.string());
  size_t i = 1;
  while (i < shape.size() && shape[i] != ')') {
    if (shape[i] >= '0' && shape[i] <= '9') {
      int64_t d = 0;
      while (i < shape.size() && shape[i] >= '0' && shape[i] <= '9') {
        d = d * 10 + (shape[i] - '0');
        TERN_CHECK(d < (int64_t(1) << 40), "npy: dimension too large in ", path.string());
        ++i;
      }
      a.shape.push_back(d);
    } else {
      ++i;
    }
  }
  const int64_t n = a.size();
  TERN_CHECK(n < (int64_t(1) << 34), "npy: array too large in ", path.string());
  if (a.dtype == "<f4") {
    a.f32.resize(size_t(n));
    f.read(reinterpret_cast<char*>(a.f32.data()), std::streamsize(n * 4));
  } else {
    a.i32.resize(size_t(n));
    f.read(reinterpret_cast<char*>(a.i32.data()), std::streamsize(n * 4));
  }
  TERN_CHECK(f.good() || (n == 0), "npy: ", path.string(), " is shorter than its shape says");
  return a;
}

}  // namespace tern
