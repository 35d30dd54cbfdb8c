// Helpers for the CPU op tests: fresh random seeds, random matrices in every weight format, hand-built models.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "model/weights.h"

namespace tern::test {

// A fresh seed per call (TERN_TEST_SEED overrides), printed so that a failing run can be repeated.
inline uint64_t fresh_seed(const char* what) {
  uint64_t s;
  if (const char* env = std::getenv("TERN_TEST_SEED")) {
    s = std::strtoull(env, nullptr, 10);
  } else {
    s = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  }
  std::printf("[seed] %s: TERN_TEST_SEED=%llu\n", what, (unsigned long long)s);
  return s;
}

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  float normal(float sd = 1.0f) { return std::normal_distribution<float>(0.0f, sd)(gen); }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
  uint32_t bits() { return uint32_t(gen()); }
  std::vector<float> normals(size_t n, float sd = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = normal(sd);
    return v;
  }
};

// Owns the buffers behind Matrix views made by these helpers.
struct HeapStorage : WeightStorage {
  std::vector<std::vector<uint32_t>> words;
  std::vector<std::vector<uint16_t>> halves;
  std::vector<std::vector<float>> floats;
};

// A random [experts, rows, cols] matrix in `format`, values of about `sd`.
inline Matrix random_matrix(Rng& rng, HeapStorage& st, WeightFormat format, int64_t rows, int64_t cols,
                            float sd = 0.05f, int64_t experts = 1, int group_size = 64) {
  Matrix m;
  m.format = format;
  m.experts = experts;
  m.rows = rows;
  m.cols = cols;
  m.group_size = group_size;
  const int64_t n = experts * rows * cols;
  switch (format) {
    case WeightFormat::f32: {
      st.floats.push_back(rng.normals(size_t(n), sd));
      m.data = st.floats.back().data();
      break;
    }
    case WeightFormat::bf16: {
      std::vector<uint16_t> v(static_cast<size_t>(n));
      for (auto& x : v) x = float_to_bf16(rng.normal(sd));
      st.halves.push_back(std::move(v));
      m.data = st.halves.back().data();
      break;
    }
    case WeightFormat::affine4:
    case WeightFormat::affine8: {
      const int bits = format == WeightFormat::affine4 ? 4 : 8;
      const int64_t words = n * bits / 32, groups = n / group_size;
      std::vector<uint32_t> w(static_cast<size_t>(words));
      for (auto& x : w) x = rng.bits();
      std::vector<uint16_t> s(static_cast<size_t>(groups)), b(static_cast<size_t>(groups));
      const float levels = float((1 << bits) - 1);
      for (int64_t g = 0; g < groups; ++g) {
        const float scale = rng.uniform(0.5f, 1.5f) * 2.0f * sd * 2.0f / levels;
        s[size_t(g)] = float_to_bf16(scale);
        b[size_t(g)] = float_to_bf16(-scale * levels / 2.0f + rng.normal(sd * 0.1f));
      }
      st.words.push_back(std::move(w));
      st.halves.push_back(std::move(s));
      m.scales = st.halves.back().data();
      st.halves.push_back(std::move(b));
      m.biases = st.halves.back().data();
      m.data = st.words.back().data();
      break;
    }
  }
  return m;
}

// A small random model of the real architecture (every layer type, MoE in every layer), built in memory.
struct TinyModelSpec {
  int layers = 4;               // types follow (i+1) % 4 == 0 -> full attention
  int64_t D = 64;
  int64_t V = 96;
  int Hq = 4, Hkv = 2, dh = 32, rot = 8;
  int Hk = 2, Hv = 4, dk = 16, dv = 16;
  int E = 8, k = 2;
  int64_t F = 32, Fs = 48;
  WeightFormat format = WeightFormat::f32;
  int64_t vocab_real = 90;
  bool mtp = false;             // also the MTP draft head (ModelWeights::mtp), drawn after everything else
};

std::shared_ptr<ModelWeights> make_tiny_model(const TinyModelSpec& spec, uint64_t seed);

}  // namespace tern::test
