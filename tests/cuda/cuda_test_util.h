// Helpers for the CUDA kernel tests: fresh random seeds, host matrices in every weight format, device buffers that
// start poisoned (NaN) so unwritten elements fail, and a tolerance check that reports the worst element.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cpu/ops_gdn.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/weights/device_weights.cuh"
#include "model/weights.h"

namespace tern::cuda::test {

// The CPU GDN arguments for qkv [T, C] (rows q | k | v, as the conv leaves them), g and beta [T, Hv]; the caller sets
// state and out.
inline cpu::GdnArgs gdn_args_over_qkv(const std::vector<float>& qkv, int64_t C, const std::vector<float>& g,
                                      const std::vector<float>& beta, int64_t T, const cpu::GdnDims& cd) {
  cpu::GdnArgs ga;
  ga.q = qkv.data();
  ga.k = qkv.data() + cd.Hk * cd.dk;
  ga.v = qkv.data() + 2 * cd.Hk * cd.dk;
  ga.ld = C;
  ga.g = g.data();
  ga.beta = beta.data();
  ga.T = T;
  ga.dims = cd;
  return ga;
}


// A fresh seed per test, printed so a failure can be replayed (TERN_TEST_SEED fixes it).
inline uint64_t fresh_seed(const char* what) {
  uint64_t s;
  if (const char* e = std::getenv("TERN_TEST_SEED")) {
    s = std::strtoull(e, nullptr, 10);
  } else {
    s = std::random_device{}();
    s = (s << 32) ^ std::random_device{}();
  }
  std::printf("[seed] %s: %llu\n", what, static_cast<unsigned long long>(s));
  return s;
}

// fp16 bits of f as the kernels' cvt.rn.satfinite.f16x2.f32 makes them: round to nearest even (subnormals below
// 2^-14), magnitudes past 65504 (±inf included) to ±65504, NaN to a quiet NaN. core/bf16.h's f16_to_float reads them.
inline uint16_t float_to_f16_satfinite(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7bffu);  // >= 65520, which rounds past 65504 (inf too): saturate
  if (a >= 0x38800000u) {                                 // >= 2^-14: a normal fp16
    const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);     // to nearest even at bit 13 (a carry moves the exponent)
    return uint16_t(sign | ((r - (112u << 23)) >> 13));   // exponent bias 127 -> 15
  }
  float af;
  std::memcpy(&af, &a, 4);
  return uint16_t(sign | uint32_t(std::nearbyint(af * 16777216.0f)));  // subnormal: k·2^-24 (k = 1024 is 2^-14)
}
inline float round_f16_satfinite(float f) { return f16_to_float(float_to_f16_satfinite(f)); }

// Whether two float vectors hold the same bits (NaNs included), and whether every value is finite.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
inline bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

inline std::vector<float> random_floats(std::mt19937_64& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Host storage of one matrix (data + scales + biases), with a Matrix view.
struct HostMatrix {
  std::vector<uint32_t> words;  // f32 bits / packed bf16 pairs / affine words
  std::vector<uint16_t> scales, biases;
  Matrix m;
};

// Random matrix [experts][rows, cols] in `format`; affine groups of 64 with weights ~ U(-a, a), a = 1/sqrt(cols).
inline std::unique_ptr<HostMatrix> random_matrix(std::mt19937_64& rng, WeightFormat f, int64_t experts, int64_t rows,
                                                 int64_t cols) {
  auto h = std::make_unique<HostMatrix>();
  h->m.format = f;
  h->m.experts = experts;
  h->m.rows = rows;
  h->m.cols = cols;
  h->m.group_size = 64;
  const float a = 1.0f / std::sqrt(float(cols));
  const int64_t n = experts * rows * cols;
  switch (f) {
    case WeightFormat::f32: {
      h->words.resize(size_t(n));
      std::uniform_real_distribution<float> d(-a, a);
      for (auto& w : h->words) {
        const float x = d(rng);
        std::memcpy(&w, &x, 4);
      }
      break;
    }
    case WeightFormat::bf16: {
      h->words.resize(size_t(n / 2));
      std::uniform_real_distribution<float> d(-a, a);
      for (auto& w : h->words) w = uint32_t(float_to_bf16(d(rng))) | (uint32_t(float_to_bf16(d(rng))) << 16);
      break;
    }
    case WeightFormat::affine4:
    case WeightFormat::affine8: {
      const int bits = f == WeightFormat::affine4 ? 4 : 8;
      h->words.resize(size_t(n * bits / 32));
      for (auto& w : h->words) w = uint32_t(rng());
      const int64_t groups = n / 64;
      h->scales.resize(size_t(groups));
      h->biases.resize(size_t(groups));
      std::uniform_real_distribution<float> js(0.5f, 1.5f), jb(-1.2f, -0.8f);
      const float qmax = float((1 << bits) - 1);
      for (int64_t g = 0; g < groups; ++g) {
        const float s = 2.0f * a / qmax * js(rng);
        h->scales[size_t(g)] = float_to_bf16(s);
        h->biases[size_t(g)] = float_to_bf16(jb(rng) * a);
      }
      h->m.scales = h->scales.data();
      h->m.biases = h->biases.data();
      break;
    }
  }
  h->m.data = h->words.data();
  return h;
}

// A device copy of a host buffer, or a poisoned (all-NaN) buffer of n elements.
template <typename T>
struct DeviceBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceBuf(size_t count) : n(count) {
    TERN_CUDA(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    TERN_CUDA(cudaMemset(p, 0xff, std::max<size_t>(n, 1) * sizeof(T)));  // NaN for floats, -1 for ints
  }
  explicit DeviceBuf(const std::vector<T>& host) : DeviceBuf(host.size()) {
    TERN_CUDA(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuf() { cudaFree(p); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  std::vector<T> host() const {
    TERN_CUDA(cudaDeviceSynchronize());
    std::vector<T> h(n);
    TERN_CUDA(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// Uploads a host matrix as a DMat (same layout the runner uses) and owns the device memory.
struct DeviceMatrix {
  DeviceBuf<uint32_t> words;
  std::unique_ptr<DeviceBuf<uint16_t>> scales, biases;
  DMat d;
  explicit DeviceMatrix(const HostMatrix& h) : words(h.words) {
    const Matrix& m = h.m;
    d.format = m.format;
    d.experts = m.experts;
    d.rows = m.rows;
    d.cols = m.cols;
    d.group_size = m.group_size;
    d.row_words = m.row_words();
    d.groups_per_row = m.groups_per_row();
    d.data = words.p;
    if (m.quantized()) {
      scales = std::make_unique<DeviceBuf<uint16_t>>(h.scales);
      biases = std::make_unique<DeviceBuf<uint16_t>>(h.biases);
      d.scales = scales->p;
      d.biases = biases->p;
    }
  }
};

// Every element within atol + rtol·|ref| (NaN fails). Prints the worst element.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& ref, float atol, float rtol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t bad = 0, worst = 0;
  double worst_excess = -1.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double tol = atol + rtol * std::fabs(ref[i]);
    const double err = std::fabs(double(got[i]) - double(ref[i]));
    const double excess = std::isnan(err) ? 1e30 : err - tol;
    if (!(err <= tol)) ++bad;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << ref.size() << " elements outside atol " << atol << " + rtol "
                     << rtol << "; worst at " << worst << ": got " << got[worst] << ", want " << ref[worst];
}

// Root mean square and largest magnitude of a vector (tolerances are scaled by these).
inline float rms_of(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return float(std::sqrt(s / double(std::max<size_t>(1, v.size()))));
}
inline float max_abs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

inline bool have_gpu() { return device_count() > 0; }
#define TERN_REQUIRE_GPU() \
  if (!::tern::cuda::test::have_gpu()) GTEST_SKIP() << "no CUDA GPU"

}  // namespace tern::cuda::test
