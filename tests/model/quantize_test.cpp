// MLX affine quantiser: byte-exact against values mx.quantize produced (mlx 0.32.4, CPU), and round-trip bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/bf16.h"
#include "core/check.h"
#include "model/quantize.h"

namespace tern {
namespace {

// w[i] = float32(sin(0.37 i) * 0.05 + (i % 7 == 0 ? 0.02 : 0)), i < 128, as bits.
const uint32_t kInputBits[128] = {0x3ca3d70a, 0x3c941e20, 0x3d0a181b, 0x3d377068, 0x3d4bf4d6, 0x3d44de81, 0x3d2322f9, 0x3d3d3e89, 0x3c13f1c8, 0xbc196e8a, 0xbcd90559, 0xbd23fa00, 0xbd453fcd, 0xbd4bd33b, 0xbcc9c9da, 0xbd090f71, 0xbc918309, 0x39b2a447, 0x3c96b775, 0x3d0b1f21, 0x3d380e30, 0x3d8effc5, 0x3d447adf, 0x3d224a01, 0x3cd4442a, 0x3c0e7345, 0xbc1ee978, 0xbcdb6215, 0xbca5c71d, 0xbd459ebf, 0xbd4baf33, 0xbd362e50, 0xbd080526, 0xbc8ee637, 0x3a32a337, 0x3d1e9304, 0x3d0c247f, 0x3d38a9c7, 0x3d4c30c7, 0x3d4414e7, 0x3d216f1c, 0x3cd1dfc7, 0x3ce85092, 0xbc246283, 0xbcddbc35, 0xbd25a232, 0xbd45fb59, 0xbd4b88bf, 0xbd358a03, 0xbc5436e1, 0xbc8c47b2, 0x3a85f915, 0x3c9be4b6, 0x3d0d2832, 0x3d39432d, 0x3d4c4b1b, 0x3d8acc0f, 0x3d20924c, 0x3ccf78e4, 0x3c037139, 0xbc29d999, 0xbce013b2, 0xbd267358, 0xbce8d425, 0xbd4b5fe0, 0xbd34e38e, 0xbd05ebba, 0xbc89a782, 0x3ab29ef7, 0x3c9e7892, 0x3d6015be, 0x3d39da5e, 0x3d4c6302, 0x3d4341f9, 0x3d1fb392, 0x3ccd0f8a, 0x3bfbdba7, 0x3c185f6a, 0xbce26886, 0xbd274283, 0xbd46ad7b, 0xbd4b3495, 0xbd343af2, 0xbd04dc9e, 0x3b668ad7, 0x3adf42ba, 0x3ca10a8d, 0x3d0f2a8e, 0x3d3a6f5a, 0x3d4c787a, 0x3d42d506, 0x3d70be78, 0x3ccaa3c0, 0x3bf0d1dc, 0xbc34c1a7, 0xbce4baa8, 0xbd280fb2, 0xbd470301, 0xbcf236b7, 0xbd339032, 0xbd03cbef, 0xbc846242, 0x3b05f1ea, 0x3ca39a9d, 0x3d10292f, 0x3d8676d2, 0x3d4c8b85, 0x3d4265c2, 0x3d1df070, 0x3cc8358e, 0x3be5c535, 0xbc3a327d, 0xbc066610, 0xbd28dae1, 0xbd47562a, 0xbd4ad6c2, 0xbd32e34f, 0xbd02b9ae, 0xbc81bd41, 0x3cb75f26, 0x3ca628bb, 0x3d11261a, 0x3d3b92aa, 0x3d4c9c20, 0x3d41f42f, 0x3d1d0c0d, 0x3d34ce02, 0x3bdab5d2};

std::vector<float> known_input() {
  std::vector<float> w(128);
  std::memcpy(w.data(), kInputBits, sizeof kInputBits);
  return w;
}

TEST(QuantizeAffine, MatchesMlx4Bit) {
  const uint32_t q[16] = {0x34333576, 0xdcffeca8, 0x4303579b, 0xfffcca86, 0x333549bd, 0xffeca564, 0x33579bbf,
                          0xdeda8640, 0x3269bdff, 0xfd886422, 0x4699dfff, 0xdb861223, 0x69bdfdff, 0xb8642204,
                          0x6bdffffa, 0x83432346};
  const uint16_t s[2] = {0xbbfe, 0xbbef}, b[2] = {0x3d8f, 0x3d86};
  const auto w = known_input();
  uint32_t packed[16];
  uint16_t scales[2], biases[2];
  quantize_affine(w.data(), 1, 128, 4, 64, packed, scales, biases);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(packed[i], q[i]) << "word " << i;
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(scales[i], s[i]) << "scale " << i;
    EXPECT_EQ(biases[i], b[i]) << "bias " << i;
  }
}

TEST(QuantizeAffine, MatchesMlx8Bit) {
  const uint32_t q[32] = {0x354d6e6a, 0x32402e2b, 0xeacea982, 0xdccafffc, 0x4d6e94bb, 0x402f0035, 0xceaa825e,
                          0xf4fffcc0, 0x4294badc, 0x2f2b354c, 0xaa585e41, 0xfffcebcf, 0x93bab1f4, 0x2b344b6c,
                          0x845f4104, 0xd2eccfab, 0xb6d9f3ff, 0x2d18668e, 0x5a3b2823, 0xebce7c80, 0xd9f2fffc,
                          0x44668d89, 0x0f28232c, 0xcfa9815a, 0xf2d2fcec, 0x658cb5d8, 0x28230043, 0xaa825b3c,
                          0xfefceca3, 0x60b4d7f1, 0x232c4364, 0x82303c28};
  const uint16_t s[2] = {0xb9f6, 0xb9ed}, b[2] = {0x3d8f, 0x3d86};
  const auto w = known_input();
  uint32_t packed[32];
  uint16_t scales[2], biases[2];
  quantize_affine(w.data(), 1, 128, 8, 64, packed, scales, biases);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(packed[i], q[i]) << "word " << i;
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(scales[i], s[i]) << "scale " << i;
    EXPECT_EQ(biases[i], b[i]) << "bias " << i;
  }
}

TEST(QuantizeAffine, RampHitsEveryLevel) {
  // 0..63: the larger-magnitude edge is the max, so scale = -63/15 and bias = 63; w = 63 - 4.2 q.
  std::vector<float> w(64);
  for (int i = 0; i < 64; ++i) w[size_t(i)] = float(i);
  uint32_t packed[8];
  uint16_t s, b;
  quantize_affine(w.data(), 1, 64, 4, 64, packed, &s, &b);
  EXPECT_EQ(b, float_to_bf16(63.0f));
  EXPECT_EQ(s, float_to_bf16(-4.2f));
  EXPECT_EQ(packed[0] & 0xf, 15u);          // w = 0 -> q = 15
  EXPECT_EQ(packed[7] >> 28, 0u);           // w = 63 -> q = 0
}

// Random rows: every element dequantises to within one step (half a step of rounding, plus up to half a step of
// clipping at the far edge because MLX re-derives the scale so that the near edge maps exactly), plus the bf16
// rounding of scale and bias.
TEST(QuantizeAffine, RoundTripWithinOneStep) {
  const uint32_t seed = std::random_device{}();
  std::printf("seed=%u\n", seed);
  std::mt19937 rng(seed);
  for (int bits : {4, 8}) {
    for (int group : {32, 64, 128}) {
      const int64_t rows = 5, cols = 256;
      std::vector<float> w(size_t(rows * cols));
      std::normal_distribution<float> nd(0.0f, 0.05f);
      for (float& x : w) x = nd(rng);
      std::vector<uint32_t> packed(size_t(rows * cols * bits / 32));
      std::vector<uint16_t> scales(size_t(rows * cols / group)), biases(scales.size());
      quantize_affine(w.data(), rows, cols, bits, group, packed.data(), scales.data(), biases.data());
      Matrix m;
      m.format = bits == 4 ? WeightFormat::affine4 : WeightFormat::affine8;
      m.rows = rows;
      m.cols = cols;
      m.group_size = group;
      m.data = packed.data();
      m.scales = scales.data();
      m.biases = biases.data();
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        matrix_row_to_f32(m, r, row.data());
        for (int64_t c = 0; c < cols; ++c) {
          const float step = std::abs(bf16_to_float(scales[size_t(r * cols / group + c / group)]));
          // one step, plus the bf16 rounding of scale (x 2^bits levels) and of bias: 2^-8 relative each
          const float tol = step + step * float(1 << bits) / 256.0f + 0.2f / 256.0f;
          ASSERT_NEAR(row[size_t(c)], w[size_t(r * cols + c)], tol)
              << "bits " << bits << " group " << group << " row " << r << " col " << c;
        }
      }
    }
  }
}

// A plain transcription of MLX's encoder (std::rint, scalar loops): the optimised quantiser must match it bit for bit,
// including ties at .5 that round to even.
void reference_quantize(const float* x, int n, int bits, uint32_t* packed, uint16_t* scale_out, uint16_t* bias_out) {
  const float n_bins = float((1 << bits) - 1);
  float lo = INFINITY, hi = -INFINITY;
  for (int j = 0; j < n; ++j) {
    hi = std::max(hi, x[j]);
    lo = std::min(lo, x[j]);
  }
  const bool lo_edge = std::abs(lo) > std::abs(hi);
  float scale = std::max((hi - lo) / n_bins, 1e-7f);
  scale = lo_edge ? scale : -scale;
  const float edge = lo_edge ? lo : hi;
  const float q0 = std::rint(edge / scale);
  float bias = 0;
  if (q0 != 0) {
    scale = edge / q0;
    bias = edge;
  }
  const int per_word = 32 / bits;
  for (int j = 0; j < n / per_word; ++j) {
    uint32_t word = 0;
    for (int k = 0; k < per_word; ++k) {
      float v = std::rint((x[j * per_word + k] - bias) / scale);
      v = std::min(std::max(v, 0.0f), n_bins);
      word |= uint32_t(v) << (k * bits);
    }
    packed[j] = word;
  }
  *scale_out = float_to_bf16(scale);
  *bias_out = float_to_bf16(bias);
}

TEST(QuantizeAffine, MatchesScalarReferenceIncludingTies) {
  const uint32_t seed = std::random_device{}();
  std::printf("seed=%u\n", seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> level(0, 30);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int trial = 0; trial < 2000; ++trial) {
    const int bits = trial % 2 ? 4 : 8;
    float x[64];
    if (trial % 3 == 0) {  // half-integer grid: many exact ties
      for (float& v : x) v = float(level(rng)) * 0.5f;
      x[0] = 0.0f;
      x[1] = 15.0f;
    } else {
      const float s = std::exp(nd(rng) * 3.0f);
      for (float& v : x) v = nd(rng) * s;
    }
    uint32_t a[16], b[16];
    uint16_t sa, ba, sb, bb;
    quantize_affine(x, 1, 64, bits, 64, a, &sa, &ba);
    reference_quantize(x, 64, bits, b, &sb, &bb);
    ASSERT_EQ(sa, sb) << "trial " << trial;
    ASSERT_EQ(ba, bb) << "trial " << trial;
    for (int j = 0; j < 64 * bits / 32; ++j) ASSERT_EQ(a[j], b[j]) << "trial " << trial << " word " << j;
  }
}

TEST(QuantizeAffine, ConstantGroupIsExact) {
  std::vector<float> w(64, 0.25f);
  uint32_t packed[8];
  uint16_t s, b;
  quantize_affine(w.data(), 1, 64, 4, 64, packed, &s, &b);
  Matrix m;
  m.format = WeightFormat::affine4;
  m.rows = 1;
  m.cols = 64;
  m.data = packed;
  m.scales = &s;
  m.biases = &b;
  float row[64];
  matrix_row_to_f32(m, 0, row);
  for (float x : row) EXPECT_NEAR(x, 0.25f, 1e-6f);
}

TEST(QuantizeAffine, RejectsBadArguments) {
  std::vector<float> w(64, 1.0f);
  uint32_t packed[16];
  uint16_t s[2], b[2];
  EXPECT_THROW(quantize_affine(w.data(), 1, 64, 3, 64, packed, s, b), Error);
  EXPECT_THROW(quantize_affine(w.data(), 1, 64, 4, 48, packed, s, b), Error);
  EXPECT_THROW(quantize_affine(w.data(), 1, 60, 4, 32, packed, s, b), Error);
}

}  // namespace
}  // namespace tern
