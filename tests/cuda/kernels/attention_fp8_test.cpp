// The fp8 KV cache of the CUDA attention kernels (AttnDims::kv = KvDtype::fp8; attention.cuh has the format):
// attn_prepare's stored bytes and scales against the CPU quantiser (core/fp8.h) bit for bit; attention() (prefill and
// decode) against an fp64 reference over the dequantised cache; the batched calls bit for bit as each sequence alone.
// Buffers start poisoned (0xff: NaN codes and NaN scales), so a row read that was never written shows.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "../cuda_test_util.h"
#include "attention_batch_tables.h"
#include "attention_fp64_reference.h"
#include "core/fp8.h"
#include "cuda/kernels/attention/attention.cuh"

namespace tern::cuda::test {
namespace {

AttnDims fp8_dims(int Hq, int Hkv, int dh, int rot) { return kv_dims(KvDtype::fp8, Hq, Hkv, dh, rot); }
AttnDims model_fp8() { return fp8_dims(16, 2, 256, 64); }  // Qwen3.6's heads

// A host image of one fp8 K (or V) cache of `capacity` rows per head: [Hkv, capacity, dh] bytes, then the rows'
// scales [Hkv, capacity] fp32 (attn_row_scales_offset).
struct Fp8Image {
  int Hkv = 0, dh = 0;
  int64_t capacity = 0;
  std::vector<uint8_t> bytes;
  Fp8Image(const AttnDims& d, int64_t cap)
      : Hkv(d.Hkv), dh(d.dh), capacity(cap), bytes(size_t(attn_cache_bytes(KvDtype::fp8, d.Hkv, cap, d.dh)), 0xff) {}
  uint8_t* row(int h, int64_t r) { return bytes.data() + (h * capacity + r) * dh; }
  const uint8_t* row(int h, int64_t r) const { return bytes.data() + (h * capacity + r) * dh; }
  float scale(int h, int64_t r) const {
    float s;
    std::memcpy(&s, bytes.data() + attn_row_scales_offset(KvDtype::fp8, Hkv, capacity, dh) + (h * capacity + r) * 4, 4);
    return s;
  }
  void set_scale(int h, int64_t r, float s) {
    std::memcpy(bytes.data() + attn_row_scales_offset(KvDtype::fp8, Hkv, capacity, dh) + (h * capacity + r) * 4, &s, 4);
  }
  // Row r of head h quantised from x (dh values) as attn_prepare does it.
  void quantise_row(int h, int64_t r, const float* x) {
    float amax = 0.0f;
    for (int i = 0; i < dh; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const float s = fp8_row_scale(amax);
    for (int i = 0; i < dh; ++i) row(h, r)[i] = fp8_row_encode(x[i], s);
    set_scale(h, r, s);
  }
  // The dequantised value e4m3 · scale, exact in double.
  double value(int h, int64_t r, int i) const { return double(fp8_e4m3_to_float(row(h, r)[i])) * scale(h, r); }
  // Every value of rows [0, n), [Hkv, n, dh].
  std::vector<double> values(int64_t n) const {
    std::vector<double> out(size_t(Hkv * n * dh));
    for (int h = 0; h < Hkv; ++h)
      for (int64_t r = 0; r < n; ++r)
        for (int i = 0; i < dh; ++i) out[size_t((h * n + r) * dh + i)] = value(h, r, i);
    return out;
  }
  // Rows [0, n) of every head random: uniform in [lo, hi) and quantised.
  void fill(std::mt19937_64& rng, int64_t n, float lo, float hi) {
    for (int h = 0; h < Hkv; ++h)
      for (int64_t r = 0; r < n; ++r) quantise_row(h, r, random_floats(rng, size_t(dh), lo, hi).data());
  }
};

std::unique_ptr<DeviceBuf<uint8_t>> upload(const Fp8Image& img) {
  return std::make_unique<DeviceBuf<uint8_t>>(img.bytes);
}

Fp8Image download(const DeviceBuf<uint8_t>& buf, const AttnDims& d, int64_t capacity) {
  Fp8Image img(d, capacity);
  img.bytes = buf.host();
  return img;
}

bool is_nan_code(uint8_t b) { return (b & 0x7f) == 0x7f; }

// attn_prepare on an fp8 cache writes each new row's bytes and scale exactly as the CPU quantiser does from the same
// fp32 row. V is quantised from attn_prepare's input; K after its norm and RoPE, which the GPU and the CPU compute
// differently in the last bits, so each token's key rows are made equal to a query head's row (the same input
// values, k_norm = q_norm): the kernel runs the same arithmetic on both, and the fp32 row it quantises is that query
// head's q_out. Special V rows: all zeros (scale 0, bytes 0), one with a NaN (NaN code there, the rest quantised by
// the row's finite amax), one of magnitudes ~1e-36 (a subnormal fp32 scale) and one with ±1e6 and ±inf (±inf counted
// as FLT_MAX: saturated to ±448, the rest 0). Rows other than the new ones stay untouched.
TEST(CudaAttentionFp8, PrepareStoresTheRowsBytesAndScalesBitForBit) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttentionFp8.Prepare"));
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const AttnDims& base : {model_fp8(), fp8_dims(4, 2, 64, 16), fp8_dims(8, 1, 128, 32)})
    for (const int64_t T : {int64_t(1), int64_t(4), int64_t(100)}) {
      AttnDims d = base;
      const int64_t pos0 = 37, G = d.Hq / d.Hkv, dh = d.dh, Hq = d.Hq, Hkv = d.Hkv;
      d.T = T;
      d.capacity = pos0 + T + 5;
      const std::string what = "dh " + std::to_string(dh) + " Hq " + std::to_string(Hq) + " T=" + std::to_string(T);
      SCOPED_TRACE(what);
      std::vector<float> qg = random_floats(rng, size_t(T * Hq * 2 * dh), -2.0f, 2.0f);
      std::vector<float> k(size_t(T * Hkv * dh)), v = random_floats(rng, size_t(T * Hkv * dh), -1.0f, 1.0f);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < Hkv; ++h)  // key head h of token t = query head h·G of token t
          std::copy_n(qg.begin() + (t * Hq + h * G) * 2 * dh, dh, k.begin() + (t * Hkv + h) * dh);
      float* v00 = v.data();  // token 0, KV head 0: zeros
      std::fill_n(v00, dh, 0.0f);
      if (T >= 4) {  // KV head 0 of tokens 1, 2, 3
        float* nan_row = v.data() + (1 * Hkv + 0) * dh;
        nan_row[3] = nan;
        float* tiny_row = v.data() + (2 * Hkv + 0) * dh;
        for (int64_t i = 0; i < dh; ++i) tiny_row[i] *= 1e-36f;
        float* big_row = v.data() + (3 * Hkv + 0) * dh;
        big_row[0] = 1e6f, big_row[1] = -1e6f, big_row[2] = inf, big_row[3] = -inf;
      }
      const std::vector<float> norm = random_floats(rng, size_t(dh), 0.5f, 1.5f);
      DeviceBuf<float> dqg(qg), dk(k), dv(v), dnorm(norm), dq(size_t(T * Hq * dh));
      DeviceBuf<uint8_t> ck(size_t(attn_cache_bytes(KvDtype::fp8, d.Hkv, d.capacity, d.dh))), cv(ck.n);
      DeviceBuf<int> dpos(std::vector<int>{int(pos0)});
      attn_prepare(dqg.p, dk.p, dv.p, dnorm.p, dnorm.p, dpos.p, d, dq.p, ck.p, cv.p, nullptr);
      TERN_CUDA(cudaGetLastError());
      const std::vector<float> q = dq.host();
      const Fp8Image got_k = download(ck, d, d.capacity), got_v = download(cv, d, d.capacity);

      Fp8Image want_k(d, d.capacity), want_v(d, d.capacity);  // 0xff where nothing is written
      for (int64_t t = 0; t < T; ++t)
        for (int h = 0; h < Hkv; ++h) {
          want_k.quantise_row(h, pos0 + t, q.data() + (t * Hq + h * G) * dh);
          want_v.quantise_row(h, pos0 + t, v.data() + (t * Hkv + h) * dh);
        }
      int64_t rows_off = 0;
      for (int h = 0; h < Hkv; ++h)
        for (int64_t r = 0; r < d.capacity; ++r) {
          for (const auto* pair : {&got_k, &got_v}) {
            const Fp8Image& got = *pair;
            const Fp8Image& want = pair == &got_k ? want_k : want_v;
            bool same = std::memcmp(&want.bytes[size_t(attn_row_scales_offset(KvDtype::fp8, Hkv, d.capacity, int(dh)) +
                                                       (h * d.capacity + r) * 4)],
                                    &got.bytes[size_t(attn_row_scales_offset(KvDtype::fp8, Hkv, d.capacity, int(dh)) +
                                                      (h * d.capacity + r) * 4)],
                                    4) == 0;
            for (int64_t i = 0; i < dh; ++i) {
              const uint8_t a = want.row(h, r)[i], b = got.row(h, r)[i];
              // A NaN input's code: any NaN (0x7f or 0xff) written in a new row.
              const bool new_row = r >= pos0 && r < pos0 + T;
              same = same && (a == b || (new_row && is_nan_code(a) && is_nan_code(b)));
            }
            if (!same) {
              if (++rows_off <= 5)
                ADD_FAILURE() << (pair == &got_k ? "K" : "V") << " head " << h << " row " << r << ": scale "
                              << got.scale(h, r) << ", want " << want.scale(h, r) << "; first bytes "
                              << int(got.row(h, r)[0]) << " " << int(got.row(h, r)[1]) << ", want "
                              << int(want.row(h, r)[0]) << " " << int(want.row(h, r)[1]);
            }
          }
        }
      EXPECT_EQ(rows_off, 0) << "rows whose bytes or scale differ from the CPU quantiser's";
      // The special rows, as the format says.
      EXPECT_EQ(got_v.scale(0, pos0), 0.0f) << "a row of zeros";
      for (int64_t i = 0; i < dh; ++i) EXPECT_EQ(got_v.value(0, pos0, int(i)), 0.0) << "a row of zeros reads back 0";
      if (T >= 4) {
        EXPECT_TRUE(is_nan_code(got_v.row(0, pos0 + 1)[3])) << "NaN stays NaN";
        EXPECT_TRUE(std::isfinite(got_v.scale(0, pos0 + 1))) << "NaN is not the row's amax";
        EXPECT_GT(got_v.scale(0, pos0 + 2), 0.0f);
        EXPECT_LT(got_v.scale(0, pos0 + 2), std::numeric_limits<float>::min()) << "a subnormal scale";
        EXPECT_EQ(got_v.scale(0, pos0 + 3), std::numeric_limits<float>::max() / 448.0f) << "±inf counted as FLT_MAX";
        EXPECT_EQ(got_v.row(0, pos0 + 3)[2], 0x7e) << "+inf saturates to 448";
        EXPECT_EQ(got_v.row(0, pos0 + 3)[3], 0xfe) << "-inf saturates to -448";
      }
    }
}

// Bounds on the ungated outputs' error relative to each row's rms (see attention_test.cpp, attn_bounds): the
// reference reads the dequantised cache exactly (e4m3 · scale in fp64); the kernels round q, the softmax weights and
// each dequantised K and V value to fp16 (2^-11 relative each). That is the fp16 cache path's roundings of q and the
// weights (bounds 2.5e-3 per element, 6.25e-4 rms, measured ~1.3e-3 and 2.9e-4) and as many again for K and V: twice
// the fp16 bounds.
constexpr double kElementBound = 5e-3, kRmsBound = 1.25e-3;

// out [T, Hq, dh] against the fp64 reference over the dequantised caches and the kernels' own q (fp32 from
// attn_prepare), gated by sigmoid(gate) in fp64: every element within kElementBound of its row's rms, and the
// row-normalised rms error below kRmsBound (both on the ungated outputs).
void expect_matches_fp64(const AttnDims& d, int64_t pos0, const std::vector<float>& q, const std::vector<float>& qg,
                         const Fp8Image& kc, const Fp8Image& vc, const std::vector<float>& out,
                         const std::string& what) {
  const int64_t L = pos0 + d.T;
  expect_attention_matches_fp64(d, pos0, q, qg, kc.values(L), vc.values(L), out, kElementBound, kRmsBound, "fp8",
                                what);
}

// T new tokens after pos0 cached rows (keys in [-1.7, 1.7), values in [-1, 1), quantised), in an fp8 cache of
// `capacity` rows: attn_prepare then attention(), against the fp64 reference over the cache the kernels read (the
// new rows as attn_prepare stored them).
void run_fp8_case(std::mt19937_64& rng, AttnDims d, int64_t pos0, int64_t T, int64_t capacity) {
  d.T = T;
  d.capacity = capacity;
  const std::string what = "dh " + std::to_string(d.dh) + " Hq " + std::to_string(d.Hq) + " T=" + std::to_string(T) +
                           " at pos0 " + std::to_string(pos0) + " (capacity " + std::to_string(capacity) + ")";
  SCOPED_TRACE(what);
  Fp8Image k0(d, capacity), v0(d, capacity);
  k0.fill(rng, pos0, -1.7f, 1.7f);
  v0.fill(rng, pos0, -1.0f, 1.0f);
  auto ck = upload(k0), cv = upload(v0);
  const std::vector<float> qg = random_floats(rng, size_t(T * d.Hq * 2 * d.dh), -2.0f, 2.0f);
  const std::vector<float> k = random_floats(rng, size_t(T * d.Hkv * d.dh), -2.0f, 2.0f);
  const std::vector<float> v = random_floats(rng, size_t(T * d.Hkv * d.dh), -1.0f, 1.0f);
  const std::vector<float> qn = random_floats(rng, size_t(d.dh), 0.5f, 1.5f);
  const std::vector<float> kn = random_floats(rng, size_t(d.dh), 0.5f, 1.5f);
  DeviceBuf<float> dqg(qg), dk(k), dv(v), dqn(qn), dkn(kn), dq(size_t(T * d.Hq * d.dh)), out(dq.n);
  DeviceBuf<float> part(size_t(attn_partial_floats(T, d.Hq, d.dh)));
  DeviceBuf<int> dpos(std::vector<int>{int(pos0)});
  attn_prepare(dqg.p, dk.p, dv.p, dqn.p, dkn.p, dpos.p, d, dq.p, ck->p, cv->p, nullptr);
  attention(dq.p, dqg.p, ck->p, cv->p, dpos.p, d, part.p, out.p, nullptr);
  TERN_CUDA(cudaGetLastError());
  expect_matches_fp64(d, pos0, dq.host(), qg, download(*ck, d, capacity), download(*cv, d, capacity), out.host(),
                      what);
}

TEST(CudaAttentionFp8, PrefillMatchesFp64OverTheDequantisedCache) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttentionFp8.Prefill"));
  for (int64_t pos0 : {int64_t(0), int64_t(300)})
    for (int64_t T : {int64_t(9), int64_t(64), int64_t(65), int64_t(200)})
      run_fp8_case(rng, model_fp8(), pos0, T, pos0 + T + (T % 2 ? 0 : 45));  // the cache ending in a tile, or not
  run_fp8_case(rng, model_fp8(), 0, 640, 700);
}

TEST(CudaAttentionFp8, DecodeMatchesFp64OverTheDequantisedCache) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttentionFp8.Decode"));
  for (const DecodeCase& c : kScaledDecodeCases) run_fp8_case(rng, model_fp8(), c.context - c.T, c.T, c.capacity);
}

TEST(CudaAttentionFp8, OtherHeadShapesMatchFp64) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttentionFp8.OtherShapes"));
  for (const AttnDims& d : {fp8_dims(4, 2, 64, 16), fp8_dims(8, 1, 128, 32)})
    for (int64_t T : {int64_t(1), int64_t(8), int64_t(100)}) run_fp8_case(rng, d, 250, T, 400);
}

// attn_prepare_batched + attention_batched over sequences of one token each with fp8 caches, against attn_prepare +
// attention for each sequence alone: q, the outputs and the whole caches (bytes and scales) identical, as the 16-bit
// caches are (attention_test.cpp, BatchedIsBitIdenticalToEachSequenceAlone).
// A sequence's fp8 caches for expect_batched_matches_alone (attention_batch_tables.h): random quantised rows below
// its position.
MakeSeqCaches fp8_caches(const AttnDims& d) { return image_caches<Fp8Image>(d); }

// The batched step over fp8 caches gives each sequence the bits it gets alone (the 16-bit caches' test with the same
// sequences, attention_test.cpp).
TEST(CudaAttentionFp8, BatchedIsBitIdenticalToEachSequenceAlone) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttentionFp8.Batched"));
  expect_image_batched_matches_alone<Fp8Image>(rng, model_fp8());
}

// attention_batched's items-per-block form over fp8 caches (tile copies by plain loads, copy_tile_fp8) against the
// default kernel, bit for bit, as the 16-bit caches' test (attention_test.cpp,
// BatchedItemsFormIsBitIdenticalToTheDefault).
TEST(CudaAttentionFp8, BatchedItemsFormIsBitIdenticalToTheDefault) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttentionFp8.BatchedItems"));
  const AttnDims d = model_fp8();
  const std::vector<int> settings = {kAttnBatchItemsAuto, 1, 2, 3, 7, 1 << 20};
  for (const int B : {2, 3, 8, 16, 32})
    expect_items_form_matches_default(rng, d, items_form_seqs(B), "items form B=" + std::to_string(B), fp8_caches(d),
                                      settings);
  for (const AttnDims& o : {fp8_dims(4, 2, 64, 16), fp8_dims(8, 1, 128, 32)})
    expect_items_form_matches_default(rng, o, items_form_seqs(8),
                                      "items form dh " + std::to_string(o.dh) + " Hq " + std::to_string(o.Hq) + " B=8",
                                      fp8_caches(o), settings);
  const BatchItemsScope on(kAttnBatchItemsAuto);
  const int64_t launches = attn_batch_items_launches();
  expect_batched_matches_alone(rng, d, items_form_seqs(32), "items form on, B=32", fp8_caches(d));
  expect_batched_matches_alone(rng, d, sixteen_seqs(), "items form on, B=16", fp8_caches(d));
  if (attn_batch_items_available(d.dh)) {
    EXPECT_EQ(attn_batch_items_launches() - launches, 2) << "the form ran";
  }
}

}  // namespace
}  // namespace tern::cuda::test
