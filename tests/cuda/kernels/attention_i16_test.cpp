// The i16 KV cache of the CUDA attention kernels (AttnDims::kv = KvDtype::i16; attention.cuh has the format):
// attn_prepare's stored values and scales against the CPU quantiser (core/kv_i16.h) bit for bit; attention() (prefill
// and decode) against an fp64 reference over the dequantised cache, at bounds 25x tighter than the fp16 cache's (q,
// K, the softmax weights and V run as fp16 hi + lo); the batched calls bit for bit as each sequence alone.
// Buffers start poisoned (0xff: values -1 and NaN scales), so a row read that was never written shows.
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
#include "core/kv_i16.h"
#include "cuda/kernels/attention/attention.cuh"

namespace tern::cuda::test {
namespace {

AttnDims i16_dims(int Hq, int Hkv, int dh, int rot) { return kv_dims(KvDtype::i16, Hq, Hkv, dh, rot); }
AttnDims model_i16() { return i16_dims(16, 2, 256, 64); }  // Qwen3.6's heads

// A host image of one i16 K (or V) cache of `capacity` rows per head: [Hkv, capacity, dh] int16, then the rows'
// scales [Hkv, capacity] fp32 (attn_row_scales_offset).
struct I16Image {
  int Hkv = 0, dh = 0;
  int64_t capacity = 0;
  std::vector<uint8_t> bytes;
  I16Image(const AttnDims& d, int64_t cap)
      : Hkv(d.Hkv), dh(d.dh), capacity(cap), bytes(size_t(attn_cache_bytes(KvDtype::i16, d.Hkv, cap, d.dh)), 0xff) {}
  int16_t code(int h, int64_t r, int i) const {
    int16_t c;
    std::memcpy(&c, bytes.data() + ((h * capacity + r) * dh + i) * 2, 2);
    return c;
  }
  void set_code(int h, int64_t r, int i, int16_t c) {
    std::memcpy(bytes.data() + ((h * capacity + r) * dh + i) * 2, &c, 2);
  }
  size_t scale_at(int h, int64_t r) const {
    return size_t(attn_row_scales_offset(KvDtype::i16, Hkv, capacity, dh) + (h * capacity + r) * 4);
  }
  float scale(int h, int64_t r) const {
    float s;
    std::memcpy(&s, bytes.data() + scale_at(h, r), 4);
    return s;
  }
  void set_scale(int h, int64_t r, float s) { std::memcpy(bytes.data() + scale_at(h, r), &s, 4); }
  // Row r of head h quantised from x (dh values) as attn_prepare does it.
  void quantise_row(int h, int64_t r, const float* x) {
    float amax = 0.0f;
    bool nan = false;
    for (int i = 0; i < dh; ++i) {
      amax = std::fmax(amax, std::fabs(x[i]));
      nan = nan || std::isnan(x[i]);
    }
    const float s = kv_i16_row_scale(amax, nan);
    for (int i = 0; i < dh; ++i) set_code(h, r, i, kv_i16_encode(x[i], s));
    set_scale(h, r, s);
  }
  // The value a row holds, code · scale, exact in double (the kernels multiply the scores and the softmax weights by
  // the scales instead).
  double value(int h, int64_t r, int i) const { return double(code(h, r, i)) * double(scale(h, r)); }
  std::vector<double> values(int64_t n) const {  // rows [0, n) of every head, [Hkv, n, dh]
    std::vector<double> out(size_t(Hkv * n * dh));
    for (int h = 0; h < Hkv; ++h)
      for (int64_t r = 0; r < n; ++r)
        for (int i = 0; i < dh; ++i) out[size_t((h * n + r) * dh + i)] = value(h, r, i);
    return out;
  }
  // Rows [0, n): uniform in [lo, hi), each row times 10^u with u uniform in [-decades, decades), quantised.
  void fill(std::mt19937_64& rng, int64_t n, float lo, float hi, float decades = 0.0f) {
    for (int h = 0; h < Hkv; ++h)
      for (int64_t r = 0; r < n; ++r) {
        std::vector<float> x = random_floats(rng, size_t(dh), lo, hi);
        const float mag = std::pow(10.0f, random_floats(rng, 1, -decades, decades)[0]);
        for (float& v : x) v *= mag;
        quantise_row(h, r, x.data());
      }
  }
};

std::unique_ptr<DeviceBuf<uint8_t>> upload(const I16Image& img) {
  return std::make_unique<DeviceBuf<uint8_t>>(img.bytes);
}

I16Image download(const DeviceBuf<uint8_t>& buf, const AttnDims& d, int64_t capacity) {
  I16Image img(d, capacity);
  img.bytes = buf.host();
  return img;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0 || (std::isnan(a) && std::isnan(b)); }

// attn_prepare on an i16 cache writes each new row's values and scale exactly as the CPU quantiser does from the same
// fp32 row (K: each token's key rows made equal to a query head's row, k_norm = q_norm, so that the fp32 row it
// quantises is that head's q_out, as in attention_fp8_test.cpp). Special V rows: all zeros (scale 0, values 0), one
// with a NaN (scale NaN, values 0: the row reads back NaN), one of magnitudes ~1e-36 (a subnormal scale) and one with
// ±1e6 and ±inf (±inf counted as FLT_MAX: ±32767, the rest 0). Rows other than the new ones stay untouched.
TEST(CudaAttentionI16, PrepareStoresTheRowsValuesAndScalesBitForBit) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttentionI16.Prepare"));
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const AttnDims& base : {model_i16(), i16_dims(4, 2, 64, 16), i16_dims(8, 1, 128, 32)})
    for (const int64_t T : {int64_t(1), int64_t(4), int64_t(100)}) {
      AttnDims d = base;
      const int64_t pos0 = 37, G = d.Hq / d.Hkv, dh = d.dh, Hq = d.Hq, Hkv = d.Hkv;
      d.T = T;
      d.capacity = pos0 + T + 5;
      SCOPED_TRACE("dh " + std::to_string(dh) + " Hq " + std::to_string(Hq) + " T=" + std::to_string(T));
      std::vector<float> qg = random_floats(rng, size_t(T * Hq * 2 * dh), -2.0f, 2.0f);
      std::vector<float> k(size_t(T * Hkv * dh)), v = random_floats(rng, size_t(T * Hkv * dh), -1.0f, 1.0f);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < Hkv; ++h)
          std::copy_n(qg.begin() + (t * Hq + h * G) * 2 * dh, dh, k.begin() + (t * Hkv + h) * dh);
      std::fill_n(v.data(), dh, 0.0f);
      if (T >= 4) {
        v[size_t((1 * Hkv + 0) * dh + 3)] = nan;
        for (int64_t i = 0; i < dh; ++i) v[size_t((2 * Hkv + 0) * dh + i)] *= 1e-36f;
        float* big_row = v.data() + (3 * Hkv + 0) * dh;
        big_row[0] = 1e6f, big_row[1] = -1e6f, big_row[2] = inf, big_row[3] = -inf;
      }
      const std::vector<float> norm = random_floats(rng, size_t(dh), 0.5f, 1.5f);
      DeviceBuf<float> dqg(qg), dk(k), dv(v), dnorm(norm), dq(size_t(T * Hq * dh));
      DeviceBuf<uint8_t> ck(size_t(attn_cache_bytes(KvDtype::i16, d.Hkv, d.capacity, d.dh))), cv(ck.n);
      DeviceBuf<int> dpos(std::vector<int>{int(pos0)});
      attn_prepare(dqg.p, dk.p, dv.p, dnorm.p, dnorm.p, dpos.p, d, dq.p, ck.p, cv.p, nullptr);
      TERN_CUDA(cudaGetLastError());
      const std::vector<float> q = dq.host();
      const I16Image got_k = download(ck, d, d.capacity), got_v = download(cv, d, d.capacity);
      I16Image want_k(d, d.capacity), want_v(d, d.capacity);  // 0xff where nothing is written
      for (int64_t t = 0; t < T; ++t)
        for (int h = 0; h < Hkv; ++h) {
          want_k.quantise_row(h, pos0 + t, q.data() + (t * Hq + h * G) * dh);
          want_v.quantise_row(h, pos0 + t, v.data() + (t * Hkv + h) * dh);
        }
      int64_t rows_off = 0;
      for (int h = 0; h < Hkv; ++h)
        for (int64_t r = 0; r < d.capacity; ++r)
          for (const I16Image* got : {&got_k, &got_v}) {
            const I16Image& want = got == &got_k ? want_k : want_v;
            bool same = same_bits(want.scale(h, r), got->scale(h, r));
            for (int i = 0; i < dh; ++i) same = same && want.code(h, r, i) == got->code(h, r, i);
            if (!same && ++rows_off <= 5)
              ADD_FAILURE() << (got == &got_k ? "K" : "V") << " head " << h << " row " << r << ": scale "
                            << got->scale(h, r) << ", want " << want.scale(h, r) << "; first values "
                            << got->code(h, r, 0) << " " << got->code(h, r, 1) << ", want " << want.code(h, r, 0)
                            << " " << want.code(h, r, 1);
          }
      EXPECT_EQ(rows_off, 0) << "rows whose values or scale differ from the CPU quantiser's";
      EXPECT_EQ(got_v.scale(0, pos0), 0.0f) << "a row of zeros";
      for (int i = 0; i < dh; ++i) EXPECT_EQ(got_v.code(0, pos0, i), 0) << "a row of zeros reads back 0";
      if (T >= 4) {
        EXPECT_TRUE(std::isnan(got_v.scale(0, pos0 + 1))) << "a NaN makes the row's scale NaN";
        EXPECT_TRUE(std::isnan(got_v.value(0, pos0 + 1, 0))) << "the row reads back NaN";
        EXPECT_GT(got_v.scale(0, pos0 + 2), 0.0f);
        EXPECT_LT(got_v.scale(0, pos0 + 2), std::numeric_limits<float>::min()) << "a subnormal scale";
        EXPECT_EQ(got_v.scale(0, pos0 + 3), std::numeric_limits<float>::max() / 32767.0f) << "±inf counted as FLT_MAX";
        EXPECT_EQ(got_v.code(0, pos0 + 3, 2), 32767) << "+inf saturates";
        EXPECT_EQ(got_v.code(0, pos0 + 3, 3), -32767) << "-inf saturates";
        EXPECT_EQ(got_v.code(0, pos0 + 3, 0), 0) << "1e6 is below the scale's half";
      }
    }
}

// Bounds on the ungated outputs' error relative to each row's rms (attention_test.cpp's attn_bounds): the reference
// reads the cache exactly (code · scale in fp64); the kernels hold the rows' integers exactly, q and the softmax
// weights (times the V scales) as fp16 hi + lo (about 2^-22 relative each) and sum in fp32 (the prefill drops the
// lo·lo products, the decode keeps all four).
// The fp16 cache's bounds are 2.5e-3 per element and 6.25e-4 rms; these are 25 and 31 times tighter.
constexpr double kElementBound = 1e-4, kRmsBound = 2e-5;

void expect_matches_fp64(const AttnDims& d, int64_t pos0, const std::vector<float>& q, const std::vector<float>& qg,
                         const I16Image& kc, const I16Image& vc, const std::vector<float>& out,
                         const std::string& what) {
  const int64_t L = pos0 + d.T;
  expect_attention_matches_fp64(d, pos0, q, qg, kc.values(L), vc.values(L), out, kElementBound, kRmsBound, "i16",
                                what);
}

// T new tokens after pos0 cached rows (keys in [-1.7, 1.7), values in [-1, 1) times v_scale, each row also times
// 10^u for u uniform in [-v_decades, v_decades), quantised) in an i16 cache of `capacity` rows: attn_prepare then
// attention(), against the fp64 reference over the cache the kernels read.
void run_i16_case(std::mt19937_64& rng, AttnDims d, int64_t pos0, int64_t T, int64_t capacity, float v_scale = 1.0f,
                  float v_decades = 0.0f) {
  d.T = T;
  d.capacity = capacity;
  const std::string what = "dh " + std::to_string(d.dh) + " Hq " + std::to_string(d.Hq) + " T=" + std::to_string(T) +
                           " at pos0 " + std::to_string(pos0) + " (capacity " + std::to_string(capacity) + "), V ×" +
                           std::to_string(v_scale) + " ±" + std::to_string(v_decades) + " decades";
  SCOPED_TRACE(what);
  I16Image k0(d, capacity), v0(d, capacity);
  k0.fill(rng, pos0, -1.7f, 1.7f);
  v0.fill(rng, pos0, -v_scale, v_scale, v_decades);
  auto ck = upload(k0), cv = upload(v0);
  const std::vector<float> qg = random_floats(rng, size_t(T * d.Hq * 2 * d.dh), -2.0f, 2.0f);
  const std::vector<float> k = random_floats(rng, size_t(T * d.Hkv * d.dh), -2.0f, 2.0f);
  const std::vector<float> v = random_floats(rng, size_t(T * d.Hkv * d.dh), -v_scale, v_scale);
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

// The prefill's cases: T from 9 to 640 at pos0 0 and 300 (and 96, a multiple of the wgmma kernel's 32-key tiles),
// then values whose rows span six decades (each tile's power of two then differs, and so does each row's scale within
// a tile), small values (fp16 hi + lo of the values themselves would lose bits to subnormals) and values past fp16's
// range (the rows' integers and fp32 scales hold them).
void run_prefill_cases(std::mt19937_64& rng) {
  for (int64_t pos0 : {int64_t(0), int64_t(300)})
    for (int64_t T : {int64_t(9), int64_t(64), int64_t(65), int64_t(200)})
      run_i16_case(rng, model_i16(), pos0, T, pos0 + T + (T % 2 ? 0 : 45));
  run_i16_case(rng, model_i16(), 0, 640, 700);
  run_i16_case(rng, model_i16(), 96, 131, 227);  // T past one 128-token block
  run_i16_case(rng, model_i16(), 300, 200, 600, 1.0f, 3.0f);
  run_i16_case(rng, model_i16(), 300, 65, 400, 1e-3f);
  run_i16_case(rng, model_i16(), 300, 65, 400, 1e5f);
}

// On Hopper at head dim 256 the warpgroup-MMA kernel (attn_prefill_wgmma_available), elsewhere the mma.sync one.
TEST(CudaAttentionI16, PrefillMatchesFp64OverTheDequantisedCache) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttentionI16.Prefill"));
  run_prefill_cases(rng);
}

// The same on the mma.sync prefill kernel where the default is the warpgroup-MMA one: the kernel every other GPU runs
// stays held to the reference on this one.
TEST(CudaAttentionI16, PrefillOnTheMmaSyncKernelMatchesFp64) {
  TERN_REQUIRE_GPU();
  if (!attn_prefill_wgmma_available(KvDtype::i16))
    GTEST_SKIP() << "the default prefill kernel is the mma.sync one here";
  std::mt19937_64 rng(fresh_seed("CudaAttentionI16.PrefillMmaSync"));
  const PrefillOnMmaSync mma_sync;
  run_prefill_cases(rng);
}

// The warpgroup kernel's other form of the scores (attn_prefill_set_i16_stack: the K tile's planes stacked, or not),
// held to the reference too.
TEST(CudaAttentionI16, PrefillOnTheOtherScoresFormMatchesFp64) {
  TERN_REQUIRE_GPU();
  if (!attn_prefill_wgmma_available(KvDtype::i16) || !attn_prefill_wgmma())
    GTEST_SKIP() << "the prefill does not run the warpgroup-MMA kernel here";
  std::mt19937_64 rng(fresh_seed("CudaAttentionI16.PrefillOtherScores"));
  struct OtherForm {
    const bool was = attn_prefill_i16_stack();
    OtherForm() { attn_prefill_set_i16_stack(!was); }
    ~OtherForm() { attn_prefill_set_i16_stack(was); }
  } const other;
  run_prefill_cases(rng);
}

TEST(CudaAttentionI16, DecodeMatchesFp64OverTheDequantisedCache) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttentionI16.Decode"));
  for (const DecodeCase& c : kScaledDecodeCases) run_i16_case(rng, model_i16(), c.context - c.T, c.T, c.capacity);
  run_i16_case(rng, model_i16(), 4999, 1, 5003, 1.0f, 3.0f);  // as in the prefill test
  run_i16_case(rng, model_i16(), 2999, 1, 3000, 1e-3f);
  run_i16_case(rng, model_i16(), 770, 7, 1000, 1e5f);
}

TEST(CudaAttentionI16, OtherHeadShapesMatchFp64) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttentionI16.OtherShapes"));
  for (const AttnDims& d : {i16_dims(4, 2, 64, 16), i16_dims(8, 1, 128, 32)})
    for (int64_t T : {int64_t(1), int64_t(8), int64_t(100)}) run_i16_case(rng, d, 250, T, 400);
}

// With at most 8 query rows the decode kernel stacks q's hi and lo on one tile's 16 rows (attention_i16_tiles.cuh);
// with more it keeps two planes and sums the same products in the same order. So the first token of a two-token call
// (16 rows, the planes) gets the bits the same token gets alone (8 rows, stacked): the second token's key is masked
// for it, both calls read the same tiles and splits (the same capacity, both lengths within one tile), and that key's
// V row is below the tile's largest scale (a tile's power of two counts every row it holds, masked or not).
TEST(CudaAttentionI16, StackedRowsGetThePlanesBits) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttentionI16.Stacked"));
  for (const int64_t pos0 : {int64_t(0), int64_t(100), int64_t(4000)}) {
    SCOPED_TRACE("pos0 " + std::to_string(pos0));
    AttnDims d = model_i16();
    d.capacity = 5003;
    I16Image kc(d, d.capacity), vc(d, d.capacity);
    kc.fill(rng, pos0 + 2, -1.7f, 1.7f);
    vc.fill(rng, pos0 + 2, -1.0f, 1.0f);
    for (int h = 0; h < d.Hkv; ++h) {
      const std::vector<float> small = random_floats(rng, size_t(d.dh), -1e-3f, 1e-3f);
      vc.quantise_row(h, pos0 + 1, small.data());
      if (pos0 == 0) {  // a tile of two rows: the first one's scale the larger
        const std::vector<float> big = random_floats(rng, size_t(d.dh), 1.0f, 2.0f);
        vc.quantise_row(h, pos0, big.data());
      }
    }
    auto ck = upload(kc), cv = upload(vc);
    const std::vector<float> q = random_floats(rng, size_t(2 * d.Hq * d.dh), -2.0f, 2.0f);
    const std::vector<float> qg = random_floats(rng, size_t(2 * d.Hq * 2 * d.dh), -2.0f, 2.0f);
    DeviceBuf<float> dq(q), dqg(qg), out1(size_t(d.Hq * d.dh)), out2(size_t(2 * d.Hq * d.dh));
    DeviceBuf<float> part(size_t(attn_partial_floats(2, d.Hq, d.dh)));
    DeviceBuf<int> dpos(std::vector<int>{int(pos0)});
    d.T = 1;
    attention(dq.p, dqg.p, ck->p, cv->p, dpos.p, d, part.p, out1.p, nullptr);
    d.T = 2;
    attention(dq.p, dqg.p, ck->p, cv->p, dpos.p, d, part.p, out2.p, nullptr);
    TERN_CUDA(cudaGetLastError());
    const std::vector<float> alone = out1.host(), first = out2.host();
    int off = 0;
    for (size_t i = 0; i < alone.size(); ++i) off += !same_bits(alone[i], first[i]);
    EXPECT_EQ(off, 0) << "of " << alone.size() << " outputs differ between the stacked and the planes' rows";
    EXPECT_TRUE(std::all_of(alone.begin(), alone.end(), [](float x) { return std::isfinite(x); }));
  }
}

// The batched step over i16 caches gives each sequence the bits it gets alone (the 16-bit caches' test with the same
// sequences, attention_test.cpp); the items-per-block form is not taken for i16 (asked for, the one-item kernel runs).
TEST(CudaAttentionI16, BatchedIsBitIdenticalToEachSequenceAlone) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttentionI16.Batched"));
  const AttnDims d = model_i16();
  expect_image_batched_matches_alone<I16Image>(rng, d);
  const BatchItemsScope on(kAttnBatchItemsAuto);
  const int64_t launches = attn_batch_items_launches();
  expect_batched_matches_alone(rng, d, sixteen_seqs(), "items form asked, B=16", image_caches<I16Image>(d));
  EXPECT_EQ(attn_batch_items_launches(), launches) << "the i16 cache has no items-per-block form";
}

}  // namespace
}  // namespace tern::cuda::test
