// CUDA gated attention (attn_prepare + attention: the tensor-core prefill and split-KV decode paths) against the CPU
// twin (cpu::rms_norm, rope_apply, attention_causal, mul_sigmoid) at the model's shapes, on fresh random inputs, with
// outputs and unwritten cache rows poisoned (NaN) beforehand. The tests that compare against the twin run for both
// 16-bit KV cache types (AttnDims::kv: fp16, the runner's default, and bf16), the twin reading the cache as it is
// stored. The fp8 cache has its own tests (attention_fp8_test.cpp).
// The batched forms (attn_prepare_batched, attention_batched) are held bit for bit to the one-sequence calls, and
// attention_batched's opt-in items-per-block form to its default kernel.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "../cuda_test_util.h"
#include "attention_batch_tables.h"
#include "cpu/ops_attention.h"
#include "cpu/ops_elementwise.h"
#include "cpu/ops_norm.h"
#include "cpu/ops_rope.h"
#include "cuda/kernels/attention/attention.cuh"

namespace tern::cuda::test {
namespace {

// The cache's 16-bit values (f16: AttnDims::kv is KvDtype::f16, else bf16) as the kernels store them: fp16 rounds
// to nearest even and saturates past ±65504 (keeping NaN), bf16 rounds to nearest even.
uint16_t kv_bits(float x, bool f16) { return f16 ? float_to_f16_satfinite(x) : float_to_bf16(x); }
float kv_float(uint16_t b, bool f16) { return f16 ? f16_to_float(b) : bf16_to_float(b); }
float round_kv(float x, bool f16) { return kv_float(kv_bits(x, f16), f16); }
const char* kv_name(bool f16) { return f16 ? "fp16" : "bf16"; }
bool is_f16(const AttnDims& d) { return d.kv == KvDtype::f16; }

// Uniform values in [lo, hi) rounded to the cache's type (cache contents), fast enough for 40K-position caches.
std::vector<float> random_kv_values(std::mt19937_64& rng, size_t n, float lo, float hi, bool f16) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i += 2) {
    const uint64_t r = rng();
    v[i] = round_kv(lo + (hi - lo) * float(r & 0xffffff) * (1.0f / 16777216.0f), f16);
    if (i + 1 < n) v[i + 1] = round_kv(lo + (hi - lo) * float((r >> 32) & 0xffffff) * (1.0f / 16777216.0f), f16);
  }
  return v;
}

// One attention layer's KV cache on both sides: the device one [Hkv, capacity, dh] in the type of d.kv (NaN where
// nothing was written: 0xffff is NaN in both types) and a host fp32 copy of the same values.
struct Cache {
  AttnDims d;
  DeviceBuf<uint16_t> k, v;
  std::vector<float> hk, hv;
  explicit Cache(const AttnDims& dims)
      : d(dims),
        k(size_t(dims.Hkv * dims.capacity * dims.dh)),
        v(size_t(dims.Hkv * dims.capacity * dims.dh)),
        hk(size_t(dims.Hkv * dims.capacity * dims.dh), std::numeric_limits<float>::quiet_NaN()),
        hv(hk) {}

  // Positions [0, n) of every head: random keys of rms ~1 (as normalised keys) and values in [-1, 1).
  void fill_history(std::mt19937_64& rng, int64_t n) {
    const int64_t dh = d.dh;
    for (int h = 0; h < d.Hkv; ++h) {
      const auto kk = random_kv_values(rng, size_t(n * dh), -1.7f, 1.7f, is_f16(d));
      const auto vv = random_kv_values(rng, size_t(n * dh), -1.0f, 1.0f, is_f16(d));
      std::vector<uint16_t> kb(kk.size()), vb(vv.size());
      for (size_t i = 0; i < kk.size(); ++i) {
        kb[i] = kv_bits(kk[i], is_f16(d));
        vb[i] = kv_bits(vv[i], is_f16(d));
      }
      const int64_t off = h * d.capacity * dh;
      std::copy(kk.begin(), kk.end(), hk.begin() + off);
      std::copy(vv.begin(), vv.end(), hv.begin() + off);
      TERN_CUDA(cudaMemcpy(k.p + off, kb.data(), kb.size() * 2, cudaMemcpyHostToDevice));
      TERN_CUDA(cudaMemcpy(v.p + off, vb.data(), vb.size() * 2, cudaMemcpyHostToDevice));
    }
  }
};

struct Norms {
  std::vector<float> q, k;
  DeviceBuf<float> dq, dk;
  Norms(std::mt19937_64& rng, int dh)
      : q(random_floats(rng, size_t(dh), 0.5f, 1.5f)), k(random_floats(rng, size_t(dh), 0.5f, 1.5f)), dq(q), dk(k) {}
};

// Inputs of one step and the device buffers the kernels read and write (outputs poisoned).
struct Step {
  int64_t T;
  std::vector<float> qg, k, v;
  DeviceBuf<float> dqg, dk, dv, dq, out, part;
  Step(std::mt19937_64& rng, const AttnDims& d)
      : T(d.T),
        qg(random_floats(rng, size_t(d.T * d.Hq * 2 * d.dh), -2.0f, 2.0f)),
        k(random_floats(rng, size_t(d.T * d.Hkv * d.dh), -2.0f, 2.0f)),
        v(random_floats(rng, size_t(d.T * d.Hkv * d.dh), -1.0f, 1.0f)),
        dqg(qg), dk(k), dv(v),
        dq(size_t(d.T * d.Hq * d.dh)),
        out(size_t(d.T * d.Hq * d.dh)),
        part(size_t(attn_partial_floats(d.T, d.Hq, d.dh))) {}
  // New random inputs in the same device buffers (for graph replays).
  void refresh(std::mt19937_64& rng) {
    for (auto* x : {&qg, &k}) *x = random_floats(rng, x->size(), -2.0f, 2.0f);
    v = random_floats(rng, v.size(), -1.0f, 1.0f);
    upload();
  }
  // The host inputs (qg, k, v, e.g. after an edit) into the device buffers; the output poisoned again.
  void upload() {
    TERN_CUDA(cudaMemcpy(dqg.p, qg.data(), qg.size() * 4, cudaMemcpyHostToDevice));
    TERN_CUDA(cudaMemcpy(dk.p, k.data(), k.size() * 4, cudaMemcpyHostToDevice));
    TERN_CUDA(cudaMemcpy(dv.p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    TERN_CUDA(cudaMemset(out.p, 0xff, out.n * 4));
  }
  void run(Cache& c, const Norms& nm, const int* dpos, cudaStream_t stream) {
    attn_prepare(dqg.p, dk.p, dv.p, nm.dq.p, nm.dk.p, dpos, c.d, dq.p, c.k.p, c.v.p, stream);
    attention(dq.p, dqg.p, c.k.p, c.v.p, dpos, c.d, part.p, out.p, stream);
  }
};

// Bounds on the ungated outputs' error, relative to each row's rms: every element, and the rms over all rows.
struct AttnBounds {
  double element, rms;
};
// The kernels round q and the softmax weights to the cache's type for the tensor cores; nothing else differs from the
// twin (it reads the cache values the kernels stored, every sum is fp32). bf16 (8 significant bits, rounding error up
// to 2^-8 relative) gives about 1.7e-3 of a row's rms; one key too many or too few in a 5000-key row gives 1.4e-2.
// fp16 (11 significant bits, 2^-11) makes the same roundings 8 times finer, so its error is 1/8 of bf16's (an
// emulation of both roundings on the CPU: 2.9e-4 rms and 1.3e-3 in the worst of 384K elements for fp16, 2.3e-3 and
// 1.2e-2 for bf16) and its bounds are bf16's over 8: tighter, to catch an error bf16's would hide.
AttnBounds attn_bounds(bool f16) { return f16 ? AttnBounds{2e-2 / 8, 5e-3 / 8} : AttnBounds{2e-2, 5e-3}; }

// Compares the ungated outputs (got and ref divided by sigmoid(gate) >= 0.12) row by row (one row = one token and
// head): every element within b.element of its row's rms, and the row-normalised rms error below b.rms.
void expect_attention_close(const std::vector<float>& got, const std::vector<float>& ref,
                            const std::vector<float>& gate, int dh, const AttnBounds& b, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const size_t rows = ref.size() / size_t(dh);
  size_t bad = 0, worst = 0;
  double worst_ratio = 0.0, sum_sq_rel = 0.0;
  for (size_t r = 0; r < rows; ++r) {
    double ss = 0.0, es = 0.0;
    std::vector<double> g(static_cast<size_t>(dh)), f(static_cast<size_t>(dh));
    for (int i = 0; i < dh; ++i) {
      const size_t e = r * size_t(dh) + size_t(i);
      const double sg = 1.0 / (1.0 + std::exp(-double(gate[e])));
      g[size_t(i)] = double(got[e]) / sg;
      f[size_t(i)] = double(ref[e]) / sg;
      ss += f[size_t(i)] * f[size_t(i)];
    }
    const double row_rms = std::sqrt(ss / dh) + 1e-30;
    for (int i = 0; i < dh; ++i) {
      const double err = std::fabs(g[size_t(i)] - f[size_t(i)]);
      const double ratio = std::isnan(err) ? 1e30 : err / row_rms;
      es += std::isnan(err) ? 1e30 : err * err;
      if (!(ratio <= b.element)) ++bad;
      if (ratio > worst_ratio) {
        worst_ratio = ratio;
        worst = r * size_t(dh) + size_t(i);
      }
    }
    sum_sq_rel += es / dh / (row_rms * row_rms);
  }
  const double rel_rms = std::sqrt(sum_sq_rel / double(std::max<size_t>(rows, 1)));
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << ref.size() << " elements off by more than " << b.element
                     << " of their row's rms; worst at " << worst << " (row " << worst / size_t(dh) << "): got "
                     << got[worst] << ", want " << ref[worst] << " (" << worst_ratio << " of the row rms)";
  EXPECT_LT(rel_rms, b.rms) << what << ": row-normalised rms error";
  std::printf("[attention] %s: row-normalised rms error %.2e, worst %.2e\n", what.c_str(), rel_rms, worst_ratio);
}

// The CPU side of one step (T new tokens at pos0), after the GPU ran it: q and the new keys after the norms and RoPE
// (fp32), the gate, the device cache, and the twin's gated output over the cache as the kernels stored it (the new
// rows are copied from the device into the host cache: a last-bit difference in a key before rounding may flip one
// ulp; NaN and saturated values are kept as stored).
struct Twin {
  std::vector<float> q, k, gate, out;
  std::vector<uint16_t> kdev, vdev;
};
Twin run_twin(Cache& c, const Norms& nm, const Step& s, int64_t pos0) {
  const AttnDims& d = c.d;
  const int64_t T = s.T, Hq = d.Hq, Hkv = d.Hkv, dh = d.dh;
  Twin tw;
  tw.q.resize(size_t(T * Hq * dh));
  tw.gate.resize(size_t(T * Hq * dh));
  tw.k = s.k;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hq; ++h) {
      std::copy_n(s.qg.begin() + (t * Hq + h) * 2 * dh, dh, tw.q.begin() + (t * Hq + h) * dh);
      std::copy_n(s.qg.begin() + (t * Hq + h) * 2 * dh + dh, dh, tw.gate.begin() + (t * Hq + h) * dh);
    }
  cpu::rms_norm(tw.q.data(), nm.q.data(), T * Hq, dh, d.eps, tw.q.data());
  cpu::rms_norm(tw.k.data(), nm.k.data(), T * Hkv, dh, d.eps, tw.k.data());
  cpu::rope_apply(
      {.x = tw.q.data(), .T = T, .H = int(Hq), .dh = int(dh), .rot = d.rot, .theta = d.theta, .pos0 = pos0});
  cpu::rope_apply(
      {.x = tw.k.data(), .T = T, .H = int(Hkv), .dh = int(dh), .rot = d.rot, .theta = d.theta, .pos0 = pos0});

  tw.kdev.resize(size_t(Hkv * d.capacity * dh));
  tw.vdev.resize(tw.kdev.size());
  TERN_CUDA(cudaDeviceSynchronize());
  TERN_CUDA(cudaMemcpy(tw.kdev.data(), c.k.p, tw.kdev.size() * 2, cudaMemcpyDeviceToHost));
  TERN_CUDA(cudaMemcpy(tw.vdev.data(), c.v.p, tw.vdev.size() * 2, cudaMemcpyDeviceToHost));
  for (int64_t h = 0; h < Hkv; ++h)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < dh; ++i) {
        const size_t ci = size_t((h * d.capacity + pos0 + t) * dh + i);
        c.hk[ci] = kv_float(tw.kdev[ci], is_f16(d));
        c.hv[ci] = kv_float(tw.vdev[ci], is_f16(d));
      }

  tw.out.resize(size_t(T * Hq * dh));
  cpu::attention_causal({.q = tw.q.data(), .k_cache = c.hk.data(), .v_cache = c.hv.data(), .capacity = d.capacity,
                         .pos0 = pos0, .T = T, .Hq = int(Hq), .Hkv = int(Hkv), .dh = int(dh),
                         .scale = 1.0f / std::sqrt(float(dh)), .out = tw.out.data()});
  cpu::mul_sigmoid_inplace(tw.out.data(), tw.gate.data(), int64_t(tw.out.size()));
  return tw;
}

// The CPU twin of one step after the GPU ran it: checks q, the new cache rows (keys within one ulp of the twin's
// rounding: 2^-10 of the value in fp16, 2^-7 in bf16; values exact) and the gated attention output.
void check_step(Cache& c, const Norms& nm, const Step& s, int64_t pos0, const std::string& what) {
  const AttnDims& d = c.d;
  const int64_t T = s.T, Hkv = d.Hkv, dh = d.dh;
  const Twin tw = run_twin(c, nm, s, pos0);
  expect_close(s.dq.host(), tw.q, 1e-5f, 1e-4f, what + ": q after norm and rope");

  std::vector<float> k_got, k_want, v_got, v_want;
  for (int64_t h = 0; h < Hkv; ++h)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < dh; ++i) {
        const size_t ci = size_t((h * d.capacity + pos0 + t) * dh + i), si = size_t((t * Hkv + h) * dh + i);
        k_got.push_back(kv_float(tw.kdev[ci], is_f16(d)));
        k_want.push_back(round_kv(tw.k[si], is_f16(d)));
        v_got.push_back(kv_float(tw.vdev[ci], is_f16(d)));
        v_want.push_back(round_kv(s.v[si], is_f16(d)));
      }
  expect_close(k_got, k_want, 1e-6f, is_f16(d) ? 1e-3f : 8e-3f, what + ": new K cache rows");
  expect_close(v_got, v_want, 0.0f, 0.0f, what + ": new V cache rows");
  expect_attention_close(s.out.host(), tw.out, tw.gate, int(dh), attn_bounds(is_f16(d)), what);
}

// T new tokens after `pos0` random cached positions, in a fresh cache of `capacity` positions.
void run_case(std::mt19937_64& rng, AttnDims d, int64_t pos0, int64_t T, int64_t capacity) {
  d.T = T;
  d.capacity = capacity;
  const std::string what = std::string(kv_name(is_f16(d))).append(" dh ").append(std::to_string(d.dh))
                               .append(" Hq ").append(std::to_string(d.Hq)).append(" T=").append(std::to_string(T))
                               .append(" at pos0 ").append(std::to_string(pos0)).append(" (capacity ")
                               .append(std::to_string(capacity)).append(")");
  SCOPED_TRACE(what);
  Cache c(d);
  c.fill_history(rng, pos0);
  Norms nm(rng, d.dh);
  Step s(rng, d);
  DeviceBuf<int> dpos(std::vector<int>{int(pos0)});
  s.run(c, nm, dpos.p, nullptr);
  TERN_CUDA(cudaDeviceSynchronize());
  check_step(c, nm, s, pos0, what);
}

AttnDims model_dims() { return AttnDims{};  /* Hq 16, Hkv 2, dh 256, rot 64, theta 1e7 */ }
AttnDims with_kv(AttnDims d, bool f16) {
  d.kv = f16 ? KvDtype::f16 : KvDtype::bf16;
  return d;
}

// The tests against the twin, once per 16-bit cache type: the parameter is AttnDims::kv == KvDtype::f16.
class CudaAttentionKv : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(CacheType, CudaAttentionKv, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) { return std::string(p.param ? "f16" : "bf16"); });

// The demo model's attention (Hq 4, Hkv 2, dh 64, rot 16) and a dh-128 variant with 8:1 grouping, over AttnDims'
// default cache type (kv_dims, attention_batch_tables.h).
AttnDims small_dims(int Hq, int Hkv, int dh, int rot) { return kv_dims(AttnDims{}.kv, Hq, Hkv, dh, rot); }

// On Hopper at head dim 256 the warpgroup-MMA kernel (attn_prefill_wgmma_available), elsewhere the mma.sync one.
TEST_P(CudaAttentionKv, PrefillMatchesCpu) {
  TERN_REQUIRE_GPU();
  const bool wgmma = attn_prefill_wgmma_available(with_kv(model_dims(), GetParam()).kv);
  std::printf("prefill kernel at head dim 256: %s\n", wgmma ? "wgmma" : "mma.sync");
  std::mt19937_64 rng(fresh_seed("CudaAttention.Prefill"));
  for (int64_t pos0 : {int64_t(0), int64_t(300)})
    for (int64_t T : {int64_t(9), int64_t(64), int64_t(65), int64_t(640), int64_t(2000)}) {
      // capacity exactly pos0 + T (the last K/V tile ends past the cache) or with unwritten (NaN) rows after it
      const int64_t capacity = pos0 + T + (T % 2 ? 0 : 45);
      run_case(rng, with_kv(model_dims(), GetParam()), pos0, T, capacity);
    }
}

// The same cases on the mma.sync prefill kernel where the default is the warpgroup-MMA one (Hopper, head dim 256):
// the kernel every other GPU runs stays held to the twin on this one.
TEST_P(CudaAttentionKv, PrefillOnTheMmaSyncKernelMatchesCpu) {
  TERN_REQUIRE_GPU();
  if (!attn_prefill_wgmma_available(with_kv(model_dims(), GetParam()).kv))
    GTEST_SKIP() << "the default prefill kernel is the mma.sync one here";
  std::mt19937_64 rng(fresh_seed("CudaAttention.PrefillMmaSync"));
  const PrefillOnMmaSync mma_sync;
  for (int64_t pos0 : {int64_t(0), int64_t(300)})
    for (int64_t T : {int64_t(9), int64_t(65), int64_t(640)})
      run_case(rng, with_kv(model_dims(), GetParam()), pos0, T, pos0 + T + (T % 2 ? 0 : 45));
}

TEST_P(CudaAttentionKv, DecodeMatchesCpu) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttention.Decode"));
  struct C {
    int64_t context, T, capacity;
  };
  // context = pos0 + T keys. Large capacities give many splits, most of them empty at short contexts.
  for (const C& c : {C{1, 1, 65536}, C{100, 1, 100}, C{100, 1, 4096}, C{5000, 1, 5003}, C{40000, 1, 65536},
                     C{5000, 3, 8192}, C{66, 3, 100}, C{64 * 40 + 1, 2, 65536}, C{3000, 4, 3000}, C{777, 5, 1000},
                     C{20000, 8, 32768}, C{8, 8, 8}})
    run_case(rng, with_kv(model_dims(), GetParam()), c.context - c.T, c.T, c.capacity);
}

TEST_P(CudaAttentionKv, OtherHeadShapesMatchCpu) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttention.OtherShapes"));
  for (const AttnDims& d : {small_dims(4, 2, 64, 16), small_dims(8, 1, 128, 32)})
    for (int64_t T : {int64_t(1), int64_t(8), int64_t(100)}) run_case(rng, with_kv(d, GetParam()), 250, T, 400);
}

// A sequence's 16-bit caches for expect_batched_matches_alone (attention_batch_tables.h): random rows below its
// position, NaN bits above.
MakeSeqCaches sixteen_bit_caches(const AttnDims& d) {
  return [d](std::mt19937_64& rng, int64_t capacity, int64_t pos) {
    BatchSeqCaches c;
    const size_t bytes = size_t(d.Hkv * capacity * d.dh) * 2;
    for (auto* p : {&c.kb, &c.vb, &c.k1, &c.v1}) *p = std::make_unique<DeviceBuf<uint8_t>>(bytes);  // NaN bits
    for (int64_t h = 0; h < d.Hkv; ++h)
      for (int kv = 0; kv < 2; ++kv) {
        const auto vals = random_kv_values(rng, size_t(pos * d.dh), kv ? -1.0f : -1.7f, kv ? 1.0f : 1.7f, is_f16(d));
        std::vector<uint16_t> bits(vals.size());
        for (size_t i = 0; i < vals.size(); ++i) bits[i] = kv_bits(vals[i], is_f16(d));
        const size_t off = size_t(h * capacity * d.dh) * 2;
        for (const auto* dst : {kv ? &c.vb : &c.kb, kv ? &c.v1 : &c.k1})
          TERN_CUDA(cudaMemcpy((*dst)->p + off, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
      }
    return c;
  };
}

// The batched decode step's attention at the model's shapes for B = 1, 3 and 16 (sixteen_seqs) and 12 short caches
// (the one-stage form), and at the other head shapes.
TEST_P(CudaAttentionKv, BatchedIsBitIdenticalToEachSequenceAlone) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttention.Batched"));
  const AttnDims d = with_kv(model_dims(), GetParam());
  const auto sixteen = sixteen_seqs();
  const MakeSeqCaches caches = sixteen_bit_caches(d);
  expect_batched_matches_alone(rng, d, {{40000, 2000}}, "B=1", caches);
  expect_batched_matches_alone(rng, d, {sixteen.begin(), sixteen.begin() + 3}, "B=3", caches);
  expect_batched_matches_alone(rng, d, sixteen, "B=16", caches);
  expect_batched_matches_alone(rng, d, short_caches(), "B=12 short caches", caches);
  for (const AttnDims& o : {small_dims(4, 2, 64, 16), small_dims(8, 1, 128, 32)}) {
    const AttnDims od = with_kv(o, GetParam());
    expect_batched_matches_alone(rng, od, {{400, 250}, {64, 0}, {3000, 2999}},
                                 "dh " + std::to_string(o.dh) + " Hq " + std::to_string(o.Hq) + " B=3",
                                 sixteen_bit_caches(od));
  }
}

// attention_batched's items-per-block form (TERN_ATTN_BATCH_ITEMS; attn_batch_set_items) against the default
// kernel, bit for bit (the outputs and every split partial), for B = 2, 3, 8, 16 and 32 over mixed lengths and
// capacities (items_form_seqs) at one wave of blocks, 1, 2, 3 and 7 items a block and one block for all; at the other
// head shapes (dh 64 and 128; 1, 2, 8 and 16 query heads per KV head); and with the form on, each sequence against
// itself alone, bit for bit, as BatchedIsBitIdenticalToEachSequenceAlone (the lone calls are the ones held to the CPU
// twin above), the form seen to run in each.
TEST_P(CudaAttentionKv, BatchedItemsFormIsBitIdenticalToTheDefault) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttention.BatchedItems"));
  const AttnDims d = with_kv(model_dims(), GetParam());
  const MakeSeqCaches caches = sixteen_bit_caches(d);
  const std::vector<int> settings = {kAttnBatchItemsAuto, 1, 2, 3, 7, 1 << 20};
  for (const int B : {2, 3, 8, 16, 32})
    expect_items_form_matches_default(rng, d, items_form_seqs(B), "items form B=" + std::to_string(B), caches,
                                      settings);
  for (const AttnDims& o :
       {small_dims(4, 2, 64, 16), small_dims(8, 1, 128, 32), small_dims(16, 1, 128, 32), small_dims(2, 2, 64, 16)}) {
    const AttnDims od = with_kv(o, GetParam());
    for (const int B : {3, 8})
      expect_items_form_matches_default(rng, od, items_form_seqs(B),
                                        "items form dh " + std::to_string(o.dh) + " Hq " + std::to_string(o.Hq) +
                                            " B=" + std::to_string(B),
                                        sixteen_bit_caches(od), settings);
  }
  const BatchItemsScope on(kAttnBatchItemsAuto);
  const int64_t launches = attn_batch_items_launches();
  expect_batched_matches_alone(rng, d, items_form_seqs(8), "items form on, B=8", caches);
  expect_batched_matches_alone(rng, d, items_form_seqs(32), "items form on, B=32", caches);
  expect_batched_matches_alone(rng, d, sixteen_seqs(), "items form on, B=16", caches);
  expect_batched_matches_alone(rng, d, short_caches(), "items form on, B=12 short caches", caches);
  if (attn_batch_items_available(d.dh)) {
    EXPECT_EQ(attn_batch_items_launches() - launches, 4) << "the form ran";
  }
}

// Shapes the kernels do not take are refused with an error before anything is launched, by attn_prepare and by
// attention_check (which the runner calls at load); no GPU needed: head dims other than 64/128/256, rotary dims that
// are not 0 or a power of two from 16 (attn_prepare's lanes hold 8-element chunks, so element i ± rot/2 must sit in
// another lane at the same place), query heads that are not a multiple of the KV heads.
TEST(CudaAttention, RefusesShapesTheKernelsDoNotTake) {
  const int pos = 0;
  for (const AttnDims& d : {small_dims(4, 2, 96, 16), small_dims(4, 2, 64, 24), small_dims(4, 2, 64, 8),
                            small_dims(4, 2, 128, 48), small_dims(16, 2, 256, 512)}) {
    AttnDims t = d;
    t.T = 1;
    t.capacity = 16;
    std::string message;
    try {
      attn_prepare(nullptr, nullptr, nullptr, nullptr, nullptr, &pos, t, nullptr, nullptr, nullptr, nullptr);
    } catch (const tern::Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("not supported by the CUDA kernels"), std::string::npos)
        << "dh " << d.dh << " rot " << d.rot << ": " << message;
    EXPECT_THROW(attention_check(t), tern::Error) << "dh " << d.dh << " rot " << d.rot;  // what the runner asks at load
  }
  for (const AttnDims& d : {model_dims(), small_dims(4, 2, 64, 16), small_dims(8, 1, 128, 32), small_dims(4, 2, 64, 0)})
    EXPECT_NO_THROW(attention_check(d)) << "dh " << d.dh << " rot " << d.rot;
  {
    AttnDims d = model_dims();
    d.Hkv = 3;  // 16 query heads over 3 KV heads
    EXPECT_THROW(attention_check(d), tern::Error);
  }
}

// The decode step captured once in a CUDA graph and replayed while the position advances in device memory (across
// a 64-key tile boundary), as the runner's decode graph does.
TEST_P(CudaAttentionKv, DecodeReplaysInAGraphAsThePositionAdvances) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttention.Graph"));
  AttnDims d = with_kv(model_dims(), GetParam());
  d.T = 1;
  d.capacity = 8192;
  const int64_t start = 1021;
  Cache c(d);
  c.fill_history(rng, start);
  Norms nm(rng, d.dh);
  Step s(rng, d);
  DeviceBuf<int> dpos(std::vector<int>{int(start)});
  cudaStream_t stream;
  TERN_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  s.run(c, nm, dpos.p, stream);  // first call outside capture (kernel attributes); its row is rewritten below
  TERN_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TERN_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  s.run(c, nm, dpos.p, stream);
  TERN_CUDA(cudaStreamEndCapture(stream, &graph));
  TERN_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int64_t pos0 = start; pos0 < start + 6; ++pos0) {
    s.refresh(rng);
    const int p = int(pos0);
    TERN_CUDA(cudaMemcpy(dpos.p, &p, sizeof(int), cudaMemcpyHostToDevice));
    TERN_CUDA(cudaGraphLaunch(exec, stream));
    TERN_CUDA(cudaStreamSynchronize(stream));
    const std::string what = std::string(kv_name(is_f16(d))).append(" graph replay at pos0 ");
    check_step(c, nm, s, pos0, std::string(what).append(std::to_string(pos0)));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// NaN and values past fp16's range in a new token's K/V rows (attn_prepare's inputs), on both paths (T = 3: decode,
// T = 100: prefill), after 70 cached positions; token tn's key (pos0 + tn: 71 or 120) sits inside the 64-key tile
// 64..127, whose earlier keys every query at or after it also sees. KV head 0 of token tn gets a NaN in its K input
// (the whole key row after the norm) or in V (column 5): the cache keeps NaN (fp16 as bf16; a clamp by fmaxf stored
// -65504), and every query at or after tn in the heads of KV head 0 comes out NaN there (K: the whole row, as the
// softmax sum is NaN; V: column 5). Queries before tn are not looked at: in the same tile they may multiply a masked
// weight 0 by the NaN value. KV head 1 of token tn gets ±1e6 (and, in fp16, ±inf) in V columns 7.. : fp16 stores
// ±65504, bf16 its own rounding of ±1e6; the heads of KV head 1 stay finite at every query, match the twin with the
// usual bounds before tn, and after it in those columns within 16 roundings (q and the weight: 16·2^-11, 16·2^-8).
TEST_P(CudaAttentionKv, NaNInTheCacheReachesTheOutputAndLargeValuesSaturate) {
  TERN_REQUIRE_GPU();
  const bool f16 = GetParam();
  std::mt19937_64 rng(fresh_seed("CudaAttention.NaN"));
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t nan_col = 5, big_col = 7;
  const std::vector<float> big = f16 ? std::vector<float>{1e6f, -1e6f, inf, -inf} : std::vector<float>{1e6f, -1e6f};
  const double rel_tol = 16.0 * (f16 ? 0x1p-11 : 0x1p-8);
  for (const int64_t T : {int64_t(3), int64_t(100)})
    for (const bool in_k : {true, false}) {
      AttnDims d = with_kv(model_dims(), f16);
      const int64_t pos0 = 70, tn = T == 3 ? 1 : 50;
      d.T = T;
      d.capacity = pos0 + T + 20;
      const int64_t Hq = d.Hq, Hkv = d.Hkv, G = Hq / Hkv, dh = d.dh;
      const std::string what = std::string(kv_name(f16)).append(" T=").append(std::to_string(T))
                                   .append(in_k ? ", NaN in K" : ", NaN in V");
      SCOPED_TRACE(what);
      Cache c(d);
      c.fill_history(rng, pos0);
      Norms nm(rng, d.dh);
      Step s(rng, d);
      (in_k ? s.k : s.v)[size_t((tn * Hkv + 0) * dh + nan_col)] = nan;
      for (size_t i = 0; i < big.size(); ++i) s.v[size_t((tn * Hkv + 1) * dh + big_col) + i] = big[i];
      s.upload();
      DeviceBuf<int> dpos(std::vector<int>{int(pos0)});
      s.run(c, nm, dpos.p, nullptr);
      const Twin tw = run_twin(c, nm, s, pos0);

      // The cache rows of token tn.
      const size_t row0 = size_t((0 * d.capacity + pos0 + tn) * dh), row1 = size_t((1 * d.capacity + pos0 + tn) * dh);
      if (in_k) {
        int64_t nans = 0;
        for (int64_t i = 0; i < dh; ++i) nans += std::isnan(kv_float(tw.kdev[row0 + size_t(i)], f16)) ? 1 : 0;
        EXPECT_EQ(nans, dh) << "the key row with a NaN input: NaN after the norm, stored as NaN";
      } else {
        EXPECT_TRUE(std::isnan(kv_float(tw.vdev[row0 + size_t(nan_col)], f16))) << "NaN value stored as NaN";
      }
      for (size_t i = 0; i < big.size(); ++i) {
        const uint16_t b = tw.vdev[row1 + size_t(big_col) + i];
        EXPECT_EQ(b, kv_bits(big[i], f16)) << "value " << big[i] << " stored as " << kv_float(b, f16);
        EXPECT_TRUE(std::isfinite(kv_float(b, f16))) << "value " << big[i];
        if (f16) {
          EXPECT_EQ(kv_float(b, f16), big[i] > 0 ? 65504.0f : -65504.0f) << "value " << big[i];
        }
      }

      // The outputs.
      const std::vector<float> got = s.out.host();
      std::vector<float> g_before, r_before, gate_before;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < Hq; ++h) {
          const size_t o = size_t((t * Hq + h) * dh);
          if (h < G) {  // KV head 0
            if (t < tn) continue;
            if (in_k) {
              int64_t nans = 0;
              for (int64_t i = 0; i < dh; ++i) nans += std::isnan(got[o + size_t(i)]) ? 1 : 0;
              EXPECT_EQ(nans, dh) << "token " << t << " head " << h << ": a NaN key leaves the output NaN";
            } else {
              EXPECT_TRUE(std::isnan(got[o + size_t(nan_col)]))
                  << "token " << t << " head " << h << ": got " << got[o + size_t(nan_col)] << " below a NaN value";
            }
            continue;
          }
          // KV head 1
          int64_t bad = 0;
          for (int64_t i = 0; i < dh; ++i) bad += std::isfinite(got[o + size_t(i)]) ? 0 : 1;
          EXPECT_EQ(bad, 0) << "token " << t << " head " << h << ": non-finite outputs";
          if (t < tn) {
            g_before.insert(g_before.end(), got.begin() + o, got.begin() + o + dh);
            r_before.insert(r_before.end(), tw.out.begin() + o, tw.out.begin() + o + dh);
            gate_before.insert(gate_before.end(), tw.gate.begin() + o, tw.gate.begin() + o + dh);
          } else {
            for (size_t i = 0; i < big.size(); ++i) {
              const size_t e = o + size_t(big_col) + i;
              EXPECT_LE(std::fabs(double(got[e]) - double(tw.out[e])), rel_tol * std::fabs(double(tw.out[e])))
                  << "token " << t << " head " << h << " column " << big_col + int64_t(i) << ": got " << got[e]
                  << ", want " << tw.out[e];
            }
          }
        }
      expect_attention_close(g_before, r_before, gate_before, int(dh), attn_bounds(f16),
                             what + ": KV head 1 before the large values");
    }
}

}  // namespace
}  // namespace tern::cuda::test
