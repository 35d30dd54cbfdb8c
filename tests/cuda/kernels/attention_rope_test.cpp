// attn_prepare's rotary positions other than the cache positions (AttnRope: M-RoPE after images, docs/architecture.md
// "Images in the language model"), at the model's shapes (Hq 16, Hkv 2, dh 256, rot 64, mrope_section [11, 11, 10]):
//   - a delta rotates as the plain call at the shifted position, bit for bit, and writes the cache rows of the
//     unshifted one;
//   - 3-axis positions that are equal rotate bit for bit as the delta does (text tokens in a call with images);
//   - distinct axes match the CPU twin (rms_norm, then rope_apply_angles with mrope_angles' interleaved angles);
//   - attn_prepare_batched takes each sequence's delta from its table, bit for bit as attn_prepare alone.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../cuda_test_util.h"
#include "cpu/ops_norm.h"
#include "cpu/ops_rope.h"
#include "cuda/kernels/attention/attention.cuh"

namespace tern::cuda::test {
namespace {

constexpr int kSection[3] = {11, 11, 10};

// One attn_prepare call's inputs on the device and its outputs (q, the whole K and V caches) read back.
struct PrepareCase {
  AttnDims d;
  std::vector<float> qg, k, v, qn, kn;
  DeviceBuf<float> dqg, dk, dv, dqn, dkn;
  PrepareCase(std::mt19937_64& rng, int64_t T, int64_t capacity)
      : d(dims(T, capacity)),
        qg(random_floats(rng, size_t(T * d.Hq * 2 * d.dh), -2.0f, 2.0f)),
        k(random_floats(rng, size_t(T * d.Hkv * d.dh), -2.0f, 2.0f)),
        v(random_floats(rng, size_t(T * d.Hkv * d.dh), -1.0f, 1.0f)),
        qn(random_floats(rng, size_t(d.dh), 0.5f, 1.5f)),
        kn(random_floats(rng, size_t(d.dh), 0.5f, 1.5f)),
        dqg(qg), dk(k), dv(v), dqn(qn), dkn(kn) {}
  static AttnDims dims(int64_t T, int64_t capacity) {
    AttnDims d;  // the model's heads
    d.T = T;
    d.capacity = capacity;
    d.kv = KvDtype::f16;
    return d;
  }
  struct Out {
    std::vector<float> q;
    std::vector<uint16_t> k, v;
  };
  Out run(int pos0, const AttnRope& rope) const {
    DeviceBuf<int> dpos(std::vector<int>{pos0});
    DeviceBuf<float> q(size_t(d.T * d.Hq * d.dh));
    DeviceBuf<uint16_t> ck(size_t(d.Hkv * d.capacity * d.dh)), cv(ck.n);
    attn_prepare(dqg.p, dk.p, dv.p, dqn.p, dkn.p, dpos.p, d, q.p, ck.p, cv.p, nullptr, rope);
    return {q.host(), ck.host(), cv.host()};
  }
};

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

TEST(CudaAttentionRope, DeltaAndEqualAxesRotateAsPlainRope) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttentionRope.Delta"));
  for (const int64_t T : {1, 5, 70}) {  // the decode plan's T and the prefill plan's
    SCOPED_TRACE("T=" + std::to_string(T));
    const PrepareCase c(rng, T, 128);
    const int pos0 = 9, delta = -4;
    const PrepareCase::Out plain = c.run(pos0, {});
    const PrepareCase::Out shifted = c.run(pos0 + delta, {});
    DeviceBuf<int> ddelta(std::vector<int>{delta});
    const PrepareCase::Out with_delta = c.run(pos0, {.delta = ddelta.p});
    EXPECT_TRUE(same_bits(with_delta.q, shifted.q)) << "q at pos0 + delta";
    EXPECT_TRUE(same_bits(with_delta.v, plain.v)) << "V rows at the cache position";
    DeviceBuf<int> zero(std::vector<int>{0});
    EXPECT_TRUE(same_bits(c.run(pos0, {.delta = zero.p}).q, plain.q)) << "a delta of 0";
    // K: the rows of `shifted` moved back by delta are with_delta's rows.
    std::vector<uint16_t> moved(shifted.k.size(), 0xffff);
    const int64_t dh = c.d.dh;
    for (int64_t h = 0; h < c.d.Hkv; ++h)
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(&moved[size_t((h * c.d.capacity + pos0 + t) * dh)],
                    &shifted.k[size_t((h * c.d.capacity + pos0 + delta + t) * dh)], size_t(dh) * 2);
    EXPECT_TRUE(same_bits(with_delta.k, moved)) << "K rows at the cache position, rotated at pos0 + delta";

    std::vector<int> axes(size_t(3 * T));
    for (int64_t t = 0; t < T; ++t)
      for (int a = 0; a < 3; ++a) axes[size_t(3 * t + a)] = int(pos0 + delta + t);
    DeviceBuf<int> daxes(axes);
    const PrepareCase::Out equal_axes =
        c.run(pos0, {.delta = ddelta.p, .axes = daxes.p, .section = {kSection[0], kSection[1], kSection[2]}});
    EXPECT_TRUE(same_bits(equal_axes.q, with_delta.q)) << "equal axes: q";
    EXPECT_TRUE(same_bits(equal_axes.k, with_delta.k)) << "equal axes: K";
  }
}

TEST(CudaAttentionRope, DistinctAxesMatchCpu) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttentionRope.Axes"));
  for (const int64_t T : {6, 40}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    const PrepareCase c(rng, T, 64);
    const int pos0 = 3;
    std::vector<int> axes(size_t(3 * T));
    std::vector<int64_t> pos[3];
    for (int a = 0; a < 3; ++a) pos[a].resize(size_t(T));
    for (int64_t t = 0; t < T; ++t)
      for (int a = 0; a < 3; ++a) {
        pos[a][size_t(t)] = int64_t(rng() % 5000);
        axes[size_t(3 * t + a)] = int(pos[a][size_t(t)]);
      }
    DeviceBuf<int> daxes(axes);
    const PrepareCase::Out got =
        c.run(pos0, {.axes = daxes.p, .section = {kSection[0], kSection[1], kSection[2]}});

    const AttnDims& d = c.d;
    const int64_t Hq = d.Hq, Hkv = d.Hkv, dh = d.dh;
    std::vector<float> angles(size_t(T * d.rot / 2));
    const int64_t* const p3[3] = {pos[0].data(), pos[1].data(), pos[2].data()};
    cpu::mrope_angles(p3, T, kSection, d.rot, double(d.theta), angles.data());
    std::vector<float> q(size_t(T * Hq * dh)), k = c.k;
    for (int64_t r = 0; r < T * Hq; ++r) std::copy_n(c.qg.begin() + r * 2 * dh, dh, q.begin() + r * dh);
    cpu::rms_norm(q.data(), c.qn.data(), T * Hq, dh, d.eps, q.data());
    cpu::rms_norm(k.data(), c.kn.data(), T * Hkv, dh, d.eps, k.data());
    cpu::rope_apply_angles(q.data(), T, int(Hq), int(dh), d.rot, angles.data());
    cpu::rope_apply_angles(k.data(), T, int(Hkv), int(dh), d.rot, angles.data());
    expect_close(got.q, q, 1e-5f, 1e-4f, "q after norm and M-RoPE");
    std::vector<float> k_got, k_want;
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < dh; ++i) {
          k_got.push_back(f16_to_float(got.k[size_t((h * d.capacity + pos0 + t) * dh + i)]));
          k_want.push_back(round_f16_satfinite(k[size_t((t * Hkv + h) * dh + i)]));
        }
    expect_close(k_got, k_want, 1e-6f, 1e-3f, "new K cache rows after M-RoPE");
  }
}

TEST(CudaAttentionRope, BatchedTakesEachSequencesDelta) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaAttentionRope.Batched"));
  constexpr int B = 3;
  const int pos[B] = {0, 17, 64}, delta[B] = {0, -9, 250};
  const int64_t capacity = 128;
  const PrepareCase c(rng, B, capacity);  // row b of qg, k, v: sequence b's token
  const AttnDims& d = c.d;
  const int64_t Q = int64_t(d.Hq) * 2 * d.dh, KV = int64_t(d.Hkv) * d.dh;
  // One fused buffer [B, Q + 2·KV] as the batched step has it.
  std::vector<float> proj(size_t(B * (Q + 2 * KV)));
  for (int b = 0; b < B; ++b) {
    std::copy_n(c.qg.begin() + b * Q, Q, proj.begin() + b * (Q + 2 * KV));
    std::copy_n(c.k.begin() + b * KV, KV, proj.begin() + b * (Q + 2 * KV) + Q);
    std::copy_n(c.v.begin() + b * KV, KV, proj.begin() + b * (Q + 2 * KV) + Q + KV);
  }
  DeviceBuf<float> dproj(proj), q_b(size_t(B * d.Hq * d.dh));
  std::vector<std::unique_ptr<DeviceBuf<uint16_t>>> ck, cv;
  std::vector<std::unique_ptr<DeviceBuf<int>>> dpos, ddelta;
  std::vector<void*> k_ptrs, v_ptrs;
  std::vector<int*> pos_ptrs, delta_ptrs;
  for (int b = 0; b < B; ++b) {
    ck.push_back(std::make_unique<DeviceBuf<uint16_t>>(size_t(d.Hkv * capacity * d.dh)));
    cv.push_back(std::make_unique<DeviceBuf<uint16_t>>(size_t(d.Hkv * capacity * d.dh)));
    dpos.push_back(std::make_unique<DeviceBuf<int>>(std::vector<int>{pos[b]}));
    ddelta.push_back(std::make_unique<DeviceBuf<int>>(std::vector<int>{delta[b]}));
    k_ptrs.push_back(ck.back()->p);
    v_ptrs.push_back(cv.back()->p);
    pos_ptrs.push_back(dpos.back()->p);
    delta_ptrs.push_back(ddelta.back()->p);
  }
  DeviceBuf<void*> dk_ptrs(k_ptrs), dv_ptrs(v_ptrs);
  DeviceBuf<int*> dpos_ptrs(pos_ptrs), ddelta_ptrs(delta_ptrs);
  DeviceBuf<int64_t> dcap(std::vector<int64_t>(B, capacity));
  AttnBatch batch;
  batch.B = B;
  batch.ld_qkv = Q + 2 * KV;
  batch.pos0 = dpos_ptrs.p;
  batch.cache_k = dk_ptrs.p;
  batch.cache_v = dv_ptrs.p;
  batch.capacity = dcap.p;
  batch.rope_delta = ddelta_ptrs.p;
  AttnDims one = d;
  one.T = 1;
  attn_prepare_batched(dproj.p, dproj.p + Q, dproj.p + Q + KV, c.dqn.p, c.dkn.p, batch, one, q_b.p, nullptr);
  const std::vector<float> q_all = q_b.host();
  for (int b = 0; b < B; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    const float* row = dproj.p + b * (Q + 2 * KV);
    DeviceBuf<float> q1(size_t(d.Hq * d.dh));
    DeviceBuf<uint16_t> k1(ck[size_t(b)]->n), v1(k1.n);
    attn_prepare(row, row + Q, row + Q + KV, c.dqn.p, c.dkn.p, dpos[size_t(b)]->p, one, q1.p, k1.p, v1.p, nullptr,
                 {.delta = ddelta[size_t(b)]->p});
    const std::vector<float> q_alone = q1.host();
    EXPECT_TRUE(same_bits(std::vector<float>(q_all.begin() + b * d.Hq * d.dh, q_all.begin() + (b + 1) * d.Hq * d.dh),
                          q_alone))
        << "q";
    EXPECT_TRUE(same_bits(ck[size_t(b)]->host(), k1.host())) << "K cache";
  }
}

}  // namespace
}  // namespace tern::cuda::test
