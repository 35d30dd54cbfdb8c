// CUDA gated attention (attn_prepare + attention: the tensor-core prefill and split-KV decode paths) against the CPU
// twin (cpu::rms_norm, rope_apply, attention_causal, mul_sigmoid) at the model's shapes, on fresh random inputs, with
// outputs and unwritten cache rows poisoned (NaN) beforehand.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "../cuda_test_util.h"
#include "cpu/ops_attention.h"
#include "cpu/ops_elementwise.h"
#include "cpu/ops_norm.h"
#include "cpu/ops_rope.h"
#include "cuda/kernels/attention/attention.cuh"

namespace tern::cuda::test {
namespace {

// Uniform values in [lo, hi) rounded to bf16 (cache contents), fast enough for 40K-position caches.
std::vector<float> random_bf16_values(std::mt19937_64& rng, size_t n, float lo, float hi) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i += 2) {
    const uint64_t r = rng();
    v[i] = round_bf16(lo + (hi - lo) * float(r & 0xffffff) * (1.0f / 16777216.0f));
    if (i + 1 < n) v[i + 1] = round_bf16(lo + (hi - lo) * float((r >> 32) & 0xffffff) * (1.0f / 16777216.0f));
  }
  return v;
}

// One attention layer's KV cache on both sides: the device bf16 [Hkv, capacity, dh] (NaN where nothing was written)
// and a host fp32 copy of the same values.
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
      const auto kk = random_bf16_values(rng, size_t(n * dh), -1.7f, 1.7f);
      const auto vv = random_bf16_values(rng, size_t(n * dh), -1.0f, 1.0f);
      std::vector<uint16_t> kb(kk.size()), vb(vv.size());
      for (size_t i = 0; i < kk.size(); ++i) {
        kb[i] = float_to_bf16(kk[i]);
        vb[i] = float_to_bf16(vv[i]);
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

// Compares the ungated outputs (got and ref divided by sigmoid(gate) >= 0.12) row by row (one row = one token and
// head): every element within 2e-2 of its row's rms, and the row-normalised rms error below 5e-3. bf16 q and bf16
// softmax weights give about 1.7e-3 of a row's rms; one key too many or too few in a 5000-key row gives 1.4e-2.
void expect_attention_close(const std::vector<float>& got, const std::vector<float>& ref,
                            const std::vector<float>& gate, int dh, const std::string& what) {
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
      if (!(ratio <= 2e-2)) ++bad;
      if (ratio > worst_ratio) {
        worst_ratio = ratio;
        worst = r * size_t(dh) + size_t(i);
      }
    }
    sum_sq_rel += es / dh / (row_rms * row_rms);
  }
  const double rel_rms = std::sqrt(sum_sq_rel / double(std::max<size_t>(rows, 1)));
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << ref.size() << " elements off by more than 2e-2 of their "
                     << "row's rms; worst at " << worst << " (row " << worst / size_t(dh) << "): got " << got[worst]
                     << ", want " << ref[worst] << " (" << worst_ratio << " of the row rms)";
  EXPECT_LT(rel_rms, 5e-3) << what << ": row-normalised rms error";
  std::printf("[attention] %s: row-normalised rms error %.2e, worst %.2e\n", what.c_str(), rel_rms, worst_ratio);
}

// The CPU twin of one step (T new tokens at pos0), after the GPU ran it: checks q and the new cache rows, copies
// them into the host cache (keys as the GPU rounded them: a last-bit difference before rounding may flip a bf16 ulp)
// and checks the gated attention output.
void check_step(Cache& c, const Norms& nm, const Step& s, int64_t pos0, const std::string& what) {
  const AttnDims& d = c.d;
  const int64_t T = s.T, Hq = d.Hq, Hkv = d.Hkv, dh = d.dh;
  std::vector<float> q(size_t(T * Hq * dh)), kk(s.k), gate(size_t(T * Hq * dh));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hq; ++h) {
      std::copy_n(s.qg.begin() + (t * Hq + h) * 2 * dh, dh, q.begin() + (t * Hq + h) * dh);
      std::copy_n(s.qg.begin() + (t * Hq + h) * 2 * dh + dh, dh, gate.begin() + (t * Hq + h) * dh);
    }
  cpu::rms_norm(q.data(), nm.q.data(), T * Hq, dh, d.eps, q.data());
  cpu::rms_norm(kk.data(), nm.k.data(), T * Hkv, dh, d.eps, kk.data());
  cpu::rope_apply({.x = q.data(), .T = T, .H = int(Hq), .dh = int(dh), .rot = d.rot, .theta = d.theta, .pos0 = pos0});
  cpu::rope_apply({.x = kk.data(), .T = T, .H = int(Hkv), .dh = int(dh), .rot = d.rot, .theta = d.theta, .pos0 = pos0});
  expect_close(s.dq.host(), q, 1e-5f, 1e-4f, what + ": q after norm and rope");

  std::vector<uint16_t> kdev(size_t(Hkv * d.capacity * dh)), vdev(kdev.size());
  TERN_CUDA(cudaDeviceSynchronize());
  TERN_CUDA(cudaMemcpy(kdev.data(), c.k.p, kdev.size() * 2, cudaMemcpyDeviceToHost));
  TERN_CUDA(cudaMemcpy(vdev.data(), c.v.p, vdev.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> k_got, k_want, v_got, v_want;
  for (int64_t h = 0; h < Hkv; ++h)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < dh; ++i) {
        const size_t ci = size_t((h * d.capacity + pos0 + t) * dh + i), si = size_t((t * Hkv + h) * dh + i);
        k_got.push_back(bf16_to_float(kdev[ci]));
        k_want.push_back(round_bf16(kk[si]));
        v_got.push_back(bf16_to_float(vdev[ci]));
        v_want.push_back(round_bf16(s.v[si]));
        c.hk[ci] = bf16_to_float(kdev[ci]);
        c.hv[ci] = round_bf16(s.v[si]);
      }
  expect_close(k_got, k_want, 1e-6f, 8e-3f, what + ": new K cache rows");
  expect_close(v_got, v_want, 0.0f, 0.0f, what + ": new V cache rows");

  std::vector<float> ref(size_t(T * Hq * dh));
  cpu::attention_causal({.q = q.data(), .k_cache = c.hk.data(), .v_cache = c.hv.data(), .capacity = d.capacity,
                         .pos0 = pos0, .T = T, .Hq = int(Hq), .Hkv = int(Hkv), .dh = int(dh),
                         .scale = 1.0f / std::sqrt(float(dh)), .out = ref.data()});
  cpu::mul_sigmoid_inplace(ref.data(), gate.data(), int64_t(ref.size()));
  expect_attention_close(s.out.host(), ref, gate, int(dh), what);
}

// T new tokens after `pos0` random cached positions, in a fresh cache of `capacity` positions.
void run_case(std::mt19937_64& rng, AttnDims d, int64_t pos0, int64_t T, int64_t capacity) {
  d.T = T;
  d.capacity = capacity;
  const std::string what = "dh " + std::to_string(d.dh) + " Hq " + std::to_string(d.Hq) + " T=" + std::to_string(T) +
                           " at pos0 " + std::to_string(pos0) + " (capacity " + std::to_string(capacity) + ")";
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

// The demo model's attention (Hq 4, Hkv 2, dh 64, rot 16) and a dh-128 variant with 8:1 grouping.
AttnDims small_dims(int Hq, int Hkv, int dh, int rot) {
  AttnDims d;
  d.Hq = Hq;
  d.Hkv = Hkv;
  d.dh = dh;
  d.rot = rot;
  return d;
}

TEST(CudaAttention, PrefillMatchesCpu) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttention.Prefill"));
  for (int64_t pos0 : {int64_t(0), int64_t(300)})
    for (int64_t T : {int64_t(9), int64_t(64), int64_t(65), int64_t(640), int64_t(2000)}) {
      // capacity exactly pos0 + T (the last K/V tile ends past the cache) or with unwritten (NaN) rows after it
      const int64_t capacity = pos0 + T + (T % 2 ? 0 : 45);
      run_case(rng, model_dims(), pos0, T, capacity);
    }
}

TEST(CudaAttention, DecodeMatchesCpu) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttention.Decode"));
  struct C {
    int64_t context, T, capacity;
  };
  // context = pos0 + T keys. Large capacities give many splits, most of them empty at short contexts.
  for (const C& c : {C{1, 1, 65536}, C{100, 1, 100}, C{100, 1, 4096}, C{5000, 1, 5003}, C{40000, 1, 65536},
                     C{5000, 3, 8192}, C{66, 3, 100}, C{64 * 40 + 1, 2, 65536}, C{3000, 4, 3000}, C{777, 5, 1000},
                     C{20000, 8, 32768}, C{8, 8, 8}})
    run_case(rng, model_dims(), c.context - c.T, c.T, c.capacity);
}

TEST(CudaAttention, OtherHeadShapesMatchCpu) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttention.OtherShapes"));
  for (const AttnDims& d : {small_dims(4, 2, 64, 16), small_dims(8, 1, 128, 32)})
    for (int64_t T : {int64_t(1), int64_t(8), int64_t(100)}) run_case(rng, d, 250, T, 400);
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
TEST(CudaAttention, DecodeReplaysInAGraphAsThePositionAdvances) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttention.Graph"));
  AttnDims d = model_dims();
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
    check_step(c, nm, s, pos0, "graph replay at pos0 " + std::to_string(pos0));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace tern::cuda::test
