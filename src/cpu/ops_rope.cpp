#include "cpu/ops_rope.h"

#include <cmath>
#include <vector>

#include "core/check.h"

namespace tern::cpu {

float rope_inv_freq(int i, int rot, double theta) {
  // HF: 1 / (base ** (arange(0, rot, 2).float() / rot)), all in fp32.
  const float expo = float(2 * i) / float(rot);
  return 1.0f / std::pow(float(theta), expo);
}

void rope_apply(const RopeArgs& a) {
  TERN_CHECK(a.rot >= 0 && a.rot % 2 == 0 && a.rot <= a.dh, "rope: rotary dims ", a.rot, " must be even and <= ", a.dh);
  TERN_CHECK(a.pos0 >= 0, "rope: negative position ", a.pos0);
  const int half = a.rot / 2;
  std::vector<float> inv(static_cast<size_t>(half)), cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) inv[size_t(i)] = rope_inv_freq(i, a.rot, a.theta);
  for (int64_t t = 0; t < a.T; ++t) {
    const float pos = float(a.pos0 + t);
    for (int i = 0; i < half; ++i) {
      const float ang = pos * inv[size_t(i)];  // fp32 product, as HF
      cs[size_t(i)] = std::cos(ang);
      sn[size_t(i)] = std::sin(ang);
    }
    for (int h = 0; h < a.H; ++h) {
      float* v = a.x + (t * a.H + h) * a.dh;
      for (int i = 0; i < half; ++i) {
        const float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * cs[size_t(i)] - x1 * sn[size_t(i)];
        v[i + half] = x1 * cs[size_t(i)] + x0 * sn[size_t(i)];
      }
    }
  }
}

void rope_apply_angles(float* x, int64_t T, int H, int dh, int rot, const float* angles) {
  TERN_CHECK(rot >= 0 && rot % 2 == 0 && rot <= dh, "rope: rotary dims ", rot, " must be even and <= ", dh);
  const int half = rot / 2;
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int64_t t = 0; t < T; ++t) {
    for (int i = 0; i < half; ++i) {
      cs[size_t(i)] = std::cos(angles[t * half + i]);
      sn[size_t(i)] = std::sin(angles[t * half + i]);
    }
    for (int h = 0; h < H; ++h) {
      float* v = x + (t * H + h) * dh;
      for (int i = 0; i < half; ++i) {
        const float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * cs[size_t(i)] - x1 * sn[size_t(i)];
        v[i + half] = x1 * cs[size_t(i)] + x0 * sn[size_t(i)];
      }
    }
  }
}

void mrope_angles(const int64_t* const pos[3], int64_t T, const int section[3], int rot, double theta,
                  float* angles) {
  TERN_CHECK(rot >= 2 && rot % 2 == 0, "mrope: rotary dims ", rot, " must be even");
  const int half = rot / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  std::vector<int> axis(static_cast<size_t>(half), 0);
  for (int i = 0; i < half; ++i) {
    inv[size_t(i)] = rope_inv_freq(i, rot, theta);
    if (i % 3 == 1 && i < 3 * section[1]) axis[size_t(i)] = 1;
    if (i % 3 == 2 && i < 3 * section[2]) axis[size_t(i)] = 2;
  }
  for (int64_t t = 0; t < T; ++t)
    for (int i = 0; i < half; ++i)
      angles[t * half + i] = float(pos[axis[size_t(i)]][t]) * inv[size_t(i)];
}

}  // namespace tern::cpu
