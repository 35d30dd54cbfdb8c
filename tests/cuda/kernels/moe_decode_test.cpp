// The decode MoE block (src/cuda/kernels/moe/moe_decode.cuh: router, gate/up + SwiGLU, down + weighted sum + residual)
// against its CPU twin: cpu::rms_norm → cpu::moe_forward (router matmul, moe_route, expert_swiglu per expert, shared
// expert scaled by its sigmoid gate), then the residual add, at the model's real shapes (E = 256, k = 8, F = 512,
// D = 2048; 4-bit experts, 8-bit router), T = 1 and T = 3, every kernel launched twice to check that the router's
// ticket counter resets and that results are deterministic (the second run with the L2 prefetch of the down
// matrices on). A small float-format model checks the generic path. The batched step (moe_decode_batched) is held to
// moe_decode per token, bit for bit, with each of its gate_up forms (the ring, the grouped one) and with the ring forms
// taking two rows a step (the default) and one (TERN_MOE_RING_ROWS=1).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "cpu/ops_elementwise.h"
#include "cpu/ops_matmul.h"
#include "cpu/ops_moe.h"
#include "cpu/ops_norm.h"
#include "cuda/kernels/moe/moe_decode.cuh"
#include "cuda/kernels/moe/moe_dp4a.cuh"
#include "cuda/kernels/qmv/qmv.cuh"
#include "moe_decode_test_util.h"
#include "producer_tables.h"

namespace tern::cuda::test {
namespace {

// One expert's SwiGLU hidden for one token: silu(gate·x) ⊙ (up·x), [F].
std::vector<float> cpu_swiglu_hidden(const Matrix& gate, const Matrix& up, const float* x) {
  std::vector<float> g(size_t(gate.rows)), u(size_t(up.rows));
  cpu::matmul(gate, x, 1, g.data());
  cpu::matmul(up, x, 1, u.data());
  for (size_t i = 0; i < g.size(); ++i) g[i] = cpu::silu(g[i]) * u[i];
  return g;
}

void run_moe_case(std::mt19937_64& rng, const MoeHost& mh, MoeDevice& md, int T, bool quantised, const std::string& what) {
  const Config& c = mh.cfg;
  const int64_t D = c.hidden_size, F = c.moe_intermediate_size;
  const int E = c.num_experts, k = c.num_experts_per_tok;
  const auto hidden = random_floats(rng, size_t(T * D), -4.0f, 4.0f);

  // CPU twin.
  std::vector<float> xn(hidden.size()), mix(hidden.size()), logits(size_t(T * E)), slog(static_cast<size_t>(T));
  std::vector<int32_t> rids(size_t(T * k));
  std::vector<float> rw(size_t(T * k));
  cpu::rms_norm(hidden.data(), mh.norm_w.data(), T, D, 1e-6f, xn.data());
  cpu::moe_forward({.layer = &mh.lw, .config = &c, .x = xn.data(), .T = T, .y = mix.data(), .ids = rids.data(),
                    .weights = rw.data()});
  cpu::matmul(mh.lw.router, xn.data(), T, logits.data());
  cpu::matmul(mh.lw.shared_expert_gate, xn.data(), T, slog.data());

  // GPU: scratch poisoned, ticket zeroed once; the whole block run twice from the same input.
  DeviceBuf<uint8_t> scratch(moe_decode_scratch_bytes(T, D, E, k, F));
  const MoeDecodeScratch s = moe_decode_scratch_view(scratch.p, T, D, E, k, F);
  moe_decode_scratch_init(s, nullptr);
  DeviceBuf<float> dh(hidden);
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    if (run == 1) {  // fresh input; routing outputs poisoned so that a router that skipped routing fails
      TERN_CUDA(cudaMemcpy(dh.p, hidden.data(), hidden.size() * 4, cudaMemcpyHostToDevice));
      TERN_CUDA(cudaMemset(s.ids, 0xff, size_t(T * k) * 4));
      TERN_CUDA(cudaMemset(s.w, 0xff, size_t(T * k) * 4));
      TERN_CUDA(cudaMemset(s.h, 0xff, size_t(T * (k + 1) * F) * 4));
      TERN_CUDA(cudaMemset(s.shared_gate, 0xff, size_t(T) * 4));
    }
    // The second run with the one-token gate_up asking L2 for the down matrices (the decode plan's prefetch), the
    // first without: the bitwise comparison below also says that the prefetch changes nothing.
    MoeDecodeWeights w = md.w;
    w.prefetch_down = run == 1;
    moe_router_decode(w, dh.p, T, s, nullptr);
    const bool integer_gate_up = moe_gate_up_decode(w, T, s, nullptr);  // then down reads the routing early
    moe_down_decode(w, dh.p, T, s, nullptr, integer_gate_up);
    TERN_CUDA(cudaGetLastError());
    const auto got = dh.host();
    EXPECT_EQ(to_host(s.ticket, 1)[0], 0u) << what << ": ticket not reset after run " << run;
    if (run == 0) {
      first = got;
      continue;
    }
    size_t diff = 0;
    for (size_t i = 0; i < got.size(); ++i) diff += std::memcmp(&got[i], &first[i], 4) != 0;
    EXPECT_EQ(diff, 0u) << what << ": second run differs from the first in " << diff << " elements (T=" << T << ")";
  }

  // Router outputs.
  expect_close(to_host(s.xhat, size_t(T * D)), xn, 1e-6f, 1e-5f, what + " x̂");
  expect_close(to_host(s.router_logits, size_t(T * E)), logits, 1e-5f * rms_of(logits) + 1e-6f, 1e-4f, what + " router logits");
  std::vector<float> sg_ref(static_cast<size_t>(T));
  for (int t = 0; t < T; ++t) sg_ref[size_t(t)] = cpu::sigmoid(slog[size_t(t)]);
  expect_close(to_host(s.shared_gate, size_t(T)), sg_ref, 1e-6f, 1e-5f, what + " shared gate");
  const auto ids = to_host(s.ids, size_t(T * k));
  const auto wts = to_host(s.w, size_t(T * k));
  bool same_ids = true;
  for (int t = 0; t < T; ++t) {
    // CPU probabilities, to judge any disagreement
    std::vector<double> p(static_cast<size_t>(E));
    double mx = -1e30, sum = 0;
    for (int e = 0; e < E; ++e) mx = std::max(mx, double(logits[size_t(t * E + e)]));
    for (int e = 0; e < E; ++e) sum += p[size_t(e)] = std::exp(double(logits[size_t(t * E + e)]) - mx);
    for (auto& v : p) v /= sum;
    std::set<int> seen;
    for (int j = 0; j < k; ++j) {
      const int id = ids[size_t(t * k + j)], want = rids[size_t(t * k + j)];
      ASSERT_TRUE(id >= 0 && id < E) << what << ": expert id " << id << " (token " << t << ", slot " << j << ")";
      ASSERT_TRUE(seen.insert(id).second) << what << ": expert " << id << " chosen twice (token " << t << ")";
      if (id != want) {
        same_ids = false;
        EXPECT_NEAR(p[size_t(id)], p[size_t(want)], 1e-5 * p[size_t(want)] + 1e-12)
            << what << ": token " << t << " slot " << j << " picked expert " << id << ", CPU " << want
            << " — only a near-tie may differ";
      }
    }
  }
  if (same_ids) expect_close(wts, rw, 1e-6f, 1e-5f, what + " routing weights");

  // h against the CPU SwiGLU of the experts the GPU chose.
  const auto h = to_host(s.h, size_t(T * (k + 1) * F));
  std::vector<float> h_ref(h.size());
  for (int t = 0; t < T; ++t)
    for (int j = 0; j <= k; ++j) {
      const Matrix g = j < k ? mh.lw.expert_gate.expert(ids[size_t(t * k + j)]) : mh.lw.shared_gate;
      const Matrix u = j < k ? mh.lw.expert_up.expert(ids[size_t(t * k + j)]) : mh.lw.shared_up;
      const auto hv = cpu_swiglu_hidden(g, u, xn.data() + t * D);
      std::copy(hv.begin(), hv.end(), h_ref.begin() + (int64_t(t) * (k + 1) + j) * F);
    }
  // 4-bit: hi + lo activations, ≈ fp32 (was 5e-3 with fp16); T = 1 under variant 3, the integer path: activations
  // rounded per group of 64 to 24 bits (moe_dp4a_wide(), the default: ≤ 2^-24 of the group's largest) or to 16
  // (≤ 2^-16; elements measured up to ~1.6e-4·rms here). The rms error over all of h (and of the block's output) tells
  // the two apart: ~3e-7 of the rms expected at 24 bits (fp32 sums on both sides), ~2.5e-5 at 16.
  const bool int_path = quantised && T == 1 && qmv_variant() == 3, wide = int_path && moe_dp4a_wide();
  const float htol = wide ? 2e-5f : int_path ? 5e-4f : quantised ? 1e-4f : 1e-5f;
  expect_close(h, h_ref, htol * rms_of(h_ref) + 1e-7f, 1e-4f, what + " SwiGLU hidden");
  const auto rel_rms = [](const std::vector<float>& got, const std::vector<float>& ref) {
    double e = 0, r = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      e += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
      r += double(ref[i]) * ref[i];
    }
    return std::sqrt(e / std::max(r, 1e-300));
  };
  const double rms_bound = wide ? 3e-6 : int_path ? 1e-4 : 1.0;
  if (int_path) {
    const double he = rel_rms(h, h_ref);
    std::printf("[moe decode] %s: SwiGLU hidden rms error %.3g of its rms (%d-bit activations)\n", what.c_str(), he,
                wide ? 24 : 16);
    EXPECT_LE(he, rms_bound) << what << ": SwiGLU hidden's rms error";
  }

  // hidden += the block's output. With a near-tie the reference is composed with the GPU's choice.
  std::vector<float> want(hidden);
  if (same_ids) {
    for (size_t i = 0; i < want.size(); ++i) want[i] += mix[i];
  } else {
    for (int t = 0; t < T; ++t) {
      std::vector<float> y(static_cast<size_t>(D));
      for (int j = 0; j <= k; ++j) {
        const Matrix dn = j < k ? mh.lw.expert_down.expert(ids[size_t(t * k + j)]) : mh.lw.shared_down;
        cpu::matmul(dn, h_ref.data() + (int64_t(t) * (k + 1) + j) * F, 1, y.data());
        const float coef = j < k ? wts[size_t(t * k + j)] : sg_ref[size_t(t)];
        for (int64_t d = 0; d < D; ++d) want[size_t(t * D + d)] += coef * y[size_t(d)];
      }
    }
  }
  const float tol = wide ? 2e-5f : int_path ? 5e-4f : quantised ? 1e-4f : 2e-5f;
  expect_close(first, want, tol * rms_of(mix) + 1e-6f, 1e-5f, what + " hidden after the MoE block");
  if (int_path && same_ids) {  // the block's output alone: first − hidden against the CPU's mix
    std::vector<float> out(first.size());
    double u2 = 0, m2 = 0;  // the GPU's add of hidden and this subtraction: half an ulp of first each, at most
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = first[i] - hidden[i];
      const double ulp = double(std::nextafter(std::fabs(first[i]), INFINITY)) - std::fabs(first[i]);
      u2 += ulp * ulp;
      m2 += double(mix[i]) * mix[i];
    }
    const double oe = rel_rms(out, mix), allowance = std::sqrt(u2 / std::max(m2, 1e-300));
    std::printf("[moe decode] %s: the block's output rms error %.3g of its rms (%.3g of it the adds' rounding)\n",
                what.c_str(), oe, allowance);
    EXPECT_LE(oe, rms_bound + allowance) << what << ": the output's rms error";
  }
}

TEST(CudaMoeDecode, MatchesCpuMoeForwardAtModelShapes) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMoeDecode"));
  auto mh = make_moe(rng, WeightFormat::affine4, WeightFormat::affine8, 256, 8, 2048, 512);
  MoeDevice md(*mh);
  const int v0 = qmv_variant();
  MoeWidth width(true);
  for (int v : {3, 1, 0}) {  // 3: T = 1 on the integer path (moe_dp4a.cuh); 1, 0: the tensor-core step variants
    qmv_set_variant(v);
    for (const bool wide : {true, false}) {  // the integer path's 24- and 16-bit activations
      if (v != 3 && !wide) continue;
      width.set(wide);
      for (int T : {1, 3})
        run_moe_case(rng, *mh, md, T, true,
                     "4-bit experts T=" + std::to_string(T) + " variant " + std::to_string(v) +
                         (v == 3 ? (wide ? ", 24-bit" : ", 16-bit") : ""));
    }
  }
  qmv_set_variant(v0);
}

// The 8-bit router's rows repeated (row e = row e mod 16): the logits of the copies are equal bit for bit.
void repeat_router_rows(MoeHost& mh) {
  HostMatrix& r = *mh.router;
  const int64_t E = r.m.rows, D = r.m.cols, row_words = D / 4, gpr = D / 64;
  for (int64_t e = 16; e < E; ++e) {
    std::copy_n(r.words.begin() + (e % 16) * row_words, row_words, r.words.begin() + e * row_words);
    std::copy_n(r.scales.begin() + (e % 16) * gpr, gpr, r.scales.begin() + e * gpr);
    std::copy_n(r.biases.begin() + (e % 16) * gpr, gpr, r.biases.begin() + e * gpr);
  }
}

// Router rows repeated (repeat_router_rows): every choice is an exact tie among the 16 copies of a row, which the CPU
// breaks by the lower expert id. The GPU's top-k must choose the same experts in the same order (no tolerance here:
// run_moe_case accepts any expert of equal probability).
TEST(CudaMoeDecode, TiedRouterLogitsPickTheLowerExperts) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMoeDecode.Ties"));
  const int E = 256, k = 8;
  const int64_t D = 2048, F = 512;
  auto mh = make_moe(rng, WeightFormat::affine4, WeightFormat::affine8, E, k, D, F);
  repeat_router_rows(*mh);
  MoeDevice md(*mh);
  const int v0 = qmv_variant();
  for (int v : {3, 1}) {  // 3: the one-cluster router at T = 1 on sm_90; the multi-block router otherwise
    qmv_set_variant(v);
    for (int T : {1, 3}) {
      const auto hidden = random_floats(rng, size_t(T * D), -4.0f, 4.0f);
      std::vector<float> xn(hidden.size()), logits(size_t(T * E)), want_w(size_t(T * k));
      std::vector<int32_t> want(size_t(T * k));
      cpu::rms_norm(hidden.data(), mh->norm_w.data(), T, D, 1e-6f, xn.data());
      cpu::matmul(mh->lw.router, xn.data(), T, logits.data());
      cpu::moe_route({.logits = logits.data(), .T = T, .E = E, .k = k, .ids = want.data(), .weights = want_w.data()});
      DeviceBuf<uint8_t> scratch(moe_decode_scratch_bytes(T, D, E, k, F));
      const MoeDecodeScratch s = moe_decode_scratch_view(scratch.p, T, D, E, k, F);
      moe_decode_scratch_init(s, nullptr);
      DeviceBuf<float> dh(hidden);
      moe_router_decode(md.w, dh.p, T, s, nullptr);
      TERN_CUDA(cudaGetLastError());
      const auto ids = to_host(s.ids, size_t(T * k));
      const auto gl = to_host(s.router_logits, size_t(T * E));
      for (int t = 0; t < T; ++t) {
        for (int e = 16; e < E; ++e)
          ASSERT_EQ(std::memcmp(&gl[size_t(t * E + e)], &gl[size_t(t * E + e % 16)], 4), 0)
              << "variant " << v << " T=" << T << ": copies of router row " << e % 16 << " differ on the GPU";
        for (int j = 0; j < k; ++j)
          EXPECT_EQ(ids[size_t(t * k + j)], want[size_t(t * k + j)])
              << "variant " << v << " T=" << T << " token " << t << " slot " << j;
        // The choice is the 8 lowest copies of one row, in id order.
        for (int j = 1; j < k; ++j)
          EXPECT_EQ(ids[size_t(t * k + j)], ids[size_t(t * k)] + 16 * j) << "variant " << v << " T=" << T;
      }
    }
  }
  qmv_set_variant(v0);
}

TEST(CudaMoeDecode, GenericFormatsMatchCpu) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMoeDecode.Generic"));
  {
    auto mh = make_moe(rng, WeightFormat::f32, WeightFormat::f32, 16, 4, 256, 128);
    MoeDevice md(*mh);
    for (int T : {1, 8}) run_moe_case(rng, *mh, md, T, false, "f32 experts T=" + std::to_string(T));
  }
  {
    auto mh = make_moe(rng, WeightFormat::bf16, WeightFormat::bf16, 32, 2, 512, 64);
    MoeDevice md(*mh);
    run_moe_case(rng, *mh, md, 3, false, "bf16 experts T=3");
  }
}

// The scratch's x_lanes (moe_decode.cuh) that the cluster router writes for B tokens' x̂ [B, D], made on the host: a
// twin of quantize_word (dp4a_tile.cuh: v = rint(x·(32639/m)) per group of 64 columns, v = 256·hi + lo, the bytes
// {even hi, odd hi, even lo, odd lo} of each 8-column word) and of gate_up_lane_x's σ and σ·Σv of a lane's 32
// columns, as uint32 words.
std::vector<uint32_t> host_x_lanes(const std::vector<float>& xhat, int B, int64_t D) {
  const int64_t slices = D / 1024, slice_words = kMoeXLaneSliceBytes / 4;
  std::vector<uint32_t> out(size_t(B * slices * slice_words));
  const auto pack = [](const int* b) {  // bytes b[0], b[2], b[4], b[6] (or from b + 1), low first
    return (uint32_t(b[0]) & 255u) | (uint32_t(b[2]) & 255u) << 8 | (uint32_t(b[4]) & 255u) << 16 |
           (uint32_t(b[6]) & 255u) << 24;
  };
  for (int t = 0; t < B; ++t)
    for (int64_t j = 0; j < slices; ++j)
      for (int l = 0; l < 32; ++l) {
        const float* x = xhat.data() + t * D + 1024 * j + 32 * l;  // the lane's 32 columns
        const float* group = xhat.data() + t * D + (1024 * j + 32 * l) / 64 * 64;
        float m = 0.0f;
        for (int c = 0; c < 64; ++c) m = std::max(m, std::fabs(group[c]));
        const float inv = m >= 0x1p-100f ? 32639.0f / m : 0.0f;
        uint32_t* slice = out.data() + (t * slices + j) * slice_words;
        int sum = 0;
        for (int k = 0; k < 4; ++k) {  // word 4·l + k
          int hi[8], lo[8];
          for (int e = 0; e < 8; ++e) {
            const int q = std::clamp(int(std::lrintf(x[8 * k + e] * inv)), -32639, 32639);
            sum += q;
            hi[e] = (q + 128) >> 8;
            lo[e] = q - hi[e] * 256;
          }
          uint32_t* word = slice + 4 * (32 * k + l);
          word[0] = pack(hi), word[1] = pack(hi + 1), word[2] = pack(lo), word[3] = pack(lo + 1);
        }
        const float sig = m / 32639.0f, sx = sig * float(sum);
        std::memcpy(slice + 512 + 2 * l, &sig, 4);
        std::memcpy(slice + 513 + 2 * l, &sx, 4);
      }
  return out;
}

// moe_decode_batched (one token of each of B sequences) against moe_decode per token (T = 1, its own scratch): the
// hidden rows bit for bit, and every row of the scratch the same (x̂, router logits, shared logit and gate, ids,
// routing weights, h). Tokens of different magnitudes (×100, ×1e-2) and, for B > 3, an all-zero one (x̂ = 0: every
// logit ties, the lowest k experts win). The batched step runs twice, the second time with the down matrices' L2
// prefetch, which must change nothing. x_lanes: the scratch's x_lanes (the grouped gate_up's input) are held to their
// host twin too.
void expect_batched_matches_alone(std::mt19937_64& rng, const MoeDevice& md, int E, int k, int64_t D, int64_t F, int B,
                                  const std::string& label, bool x_lanes = false) {
  auto hidden = random_floats(rng, size_t(B * D), -4.0f, 4.0f);
  for (int t = 0; t < B; ++t) {
    const float f = (B > 3 && t == B - 1) ? 0.0f : t == 1 ? 100.0f : t == 2 ? 1e-2f : 1.0f;
    for (int64_t d = 0; d < D; ++d) hidden[size_t(t * D + d)] *= f;
  }
  const std::string what = label + " B=" + std::to_string(B);

  // Each token alone (moe_decode at T = 1), its scratch rows gathered into [B, ...] arrays.
  DeviceBuf<float> dh_alone(hidden);
  std::vector<float> xhat(size_t(B * D)), logits(size_t(B * E)), slogit(static_cast<size_t>(B)),
      wts(size_t(B * k)), sgate(static_cast<size_t>(B)), h(size_t(B * (k + 1) * F));
  std::vector<int> ids(size_t(B * k));
  {
    DeviceBuf<uint8_t> scratch(moe_decode_scratch_bytes(1, D, E, k, F));
    const MoeDecodeScratch s = moe_decode_scratch_view(scratch.p, 1, D, E, k, F);
    moe_decode_scratch_init(s, nullptr);
    const auto gather = [](auto& rows, int row, const auto* src, size_t n) {  // rows[row] = src[0, n)
      const auto v = to_host(src, n);
      std::copy(v.begin(), v.end(), rows.begin() + int64_t(row) * int64_t(n));
    };
    for (int t = 0; t < B; ++t) {
      moe_decode(md.w, dh_alone.p + t * D, 1, s, nullptr);
      TERN_CUDA(cudaGetLastError());
      gather(xhat, t, s.xhat, size_t(D));
      gather(logits, t, s.router_logits, size_t(E));
      gather(slogit, t, s.shared_logit, 1);
      gather(ids, t, s.ids, size_t(k));
      gather(wts, t, s.w, size_t(k));
      gather(sgate, t, s.shared_gate, 1);
      gather(h, t, s.h, size_t((k + 1) * F));
    }
  }
  const auto want = dh_alone.host();
  {  // The tokens alone are held to the CPU elsewhere; here only that they ran: finite, hidden changed.
    size_t bad = 0;
    for (float v : want) bad += std::isfinite(v) ? 0 : 1;
    EXPECT_EQ(bad, 0u) << what << ": non-finite hidden from the tokens alone";
    EXPECT_NE(std::memcmp(want.data(), hidden.data(), hidden.size() * 4), 0) << what << ": hidden unchanged";
    if (B > 3) {  // the all-zero token: every logit 0, the lowest k experts in order
      for (int j = 0; j < k; ++j) EXPECT_EQ(ids[size_t((B - 1) * k + j)], j) << what << ": zero token slot " << j;
    }
  }

  // The batch, twice from the same input (the second with the L2 prefetch of the down matrices); scratch for B
  // tokens, poisoned before each run (NaN / -1) so that rows left unwritten fail.
  const size_t scratch_bytes = moe_decode_scratch_bytes(B, D, E, k, F);
  DeviceBuf<uint8_t> scratch(scratch_bytes);
  const MoeDecodeScratch s = moe_decode_scratch_view(scratch.p, B, D, E, k, F);
  for (int run = 0; run < 2; ++run) {
    const std::string what_run = what + (run ? " (L2 prefetch of the down matrices)" : "");
    TERN_CUDA(cudaMemset(scratch.p, 0xff, scratch_bytes));
    moe_decode_scratch_init(s, nullptr);
    DeviceBuf<float> dh(hidden);
    MoeDecodeWeights w = md.w;
    w.prefetch_down = run == 1;
    // The first run also writes the next product's tables (MoeTablesOut) from the finished rows, with a norm.
    ZeroTables tables(B, D);
    const std::vector<float> next_norm = random_floats(rng, size_t(D), 0.5f, 1.5f);
    DeviceBuf<float> dnorm(next_norm);
    const MoeTablesOut next = run == 0 ? MoeTablesOut{tables.buf.p, dnorm.p, 1e-6f} : MoeTablesOut{};
    const bool written = moe_decode_batched(w, dh.p, B, s, nullptr, next);
    TERN_CUDA(cudaGetLastError());
    EXPECT_EQ(written, run == 0) << what_run << ": whether the down kernel wrote the tables";
    if (written) expect_tables_match(tables, dh.p, D, D, dnorm.p, 1e-6f, B, what_run + ": the next product's tables");
    {
      const auto tickets = to_host(s.down_tickets, size_t(B));
      EXPECT_TRUE(std::all_of(tickets.begin(), tickets.end(), [](unsigned t) { return t == 0u; }))
          << what_run << ": the down kernel's tickets are not back at zero";
    }
    const auto got = dh.host();
    const auto same = [&](const auto& a, const auto& b, const char* name) {
      ASSERT_EQ(a.size(), b.size());
      size_t diff = 0, first = 0;
      for (size_t i = 0; i < a.size(); ++i)
        if (std::memcmp(&a[i], &b[i], sizeof(a[i])) != 0 && diff++ == 0) first = i;
      EXPECT_EQ(diff, 0u) << what_run << ": " << name << " differs from the tokens alone in " << diff << " of "
                          << a.size() << " elements; first at " << first << " (token " << first * B / a.size()
                          << "): " << a[first] << " vs " << b[first];
    };
    same(got, want, "hidden");
    same(to_host(s.xhat, xhat.size()), xhat, "x̂");
    same(to_host(s.router_logits, logits.size()), logits, "router logits");
    same(to_host(s.shared_logit, slogit.size()), slogit, "shared logit");
    same(to_host(s.ids, ids.size()), ids, "expert ids");
    same(to_host(s.w, wts.size()), wts, "routing weights");
    same(to_host(s.shared_gate, sgate.size()), sgate, "shared gate");
    same(to_host(s.h, h.size()), h, "SwiGLU hidden");
    if (x_lanes) {  // the router's quantised x̂ for the grouped gate_up
      const auto want_lanes = host_x_lanes(xhat, B, D);
      same(to_host(reinterpret_cast<const uint32_t*>(s.x_lanes), want_lanes.size()), want_lanes, "x_lanes");
    }
  }
}

// expect_batched_matches_alone at the model's shapes, B in {1, 3, 16, 32}, with random router rows and with repeated
// ones (exact ties among 16 copies of each row). Skipped where the batched step does not apply (not an sm_90 binary).
TEST(CudaMoeDecode, BatchedMatchesOneTokenBitwise) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMoeDecode.Batched"));
  const int E = 256, k = 8;
  const int64_t D = 2048, F = 512;
  const int v0 = qmv_variant();
  qmv_set_variant(3);
  for (const bool tied : {false, true}) {
    auto mh = make_moe(rng, WeightFormat::affine4, WeightFormat::affine8, E, k, D, F);
    if (tied) repeat_router_rows(*mh);
    MoeDevice md(*mh);
    if (!moe_decode_batched_supported(md.w)) {
      qmv_set_variant(v0);
      GTEST_SKIP() << "moe_decode_batched does not apply here (needs the sm_90 cluster router)";
    }
    for (int B : {1, 3, 16, 32}) {
      expect_batched_matches_alone(rng, md, E, k, D, F, B, tied ? "repeated router rows" : "random router");
      if (HasFailure()) break;
    }
    if (HasFailure()) break;
  }
  qmv_set_variant(v0);
}

// The same at D = 1024 (the ring gate_up kernel's one-slice form; the model's D = 2048 takes two slices) with 64
// experts, B in {2, 5, 8}, with the experts' activations at 24 bits and at 16 (moe_dp4a_set_wide): each B its own
// grid, so the warps' last batches and rows end at other places. D = 4096 (four
// slices) has no batched step here: the cluster router takes D up to 2048, and the ticket router batches only where
// clusters are missing.
TEST(CudaMoeDecode, BatchedMatchesOneTokenBitwiseOneSlice) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMoeDecode.BatchedOneSlice"));
  const int E = 64, k = 8;
  const int64_t D = 1024, F = 512;
  const int v0 = qmv_variant();
  qmv_set_variant(3);
  auto mh = make_moe(rng, WeightFormat::affine4, WeightFormat::affine8, E, k, D, F);
  MoeDevice md(*mh);
  if (!moe_decode_batched_supported(md.w)) {
    qmv_set_variant(v0);
    GTEST_SKIP() << "moe_decode_batched does not apply here (needs the sm_90 cluster router)";
  }
  MoeWidth width(true);
  for (const bool wide : {true, false}) {  // the experts' activations at 24 bits (the default) and at 16
    width.set(wide);
    for (int B : {2, 5, 8}) {
      expect_batched_matches_alone(rng, md, E, k, D, F, B, wide ? "D=1024, 24-bit" : "D=1024, 16-bit");
      if (HasFailure()) break;
    }
    if (HasFailure()) break;
  }
  qmv_set_variant(v0);
}

// The cases of the batched forms' opt-in tests: the model's shapes, and D = 1024 (one slice) with 64 experts; random
// router rows and repeated ones (repeat_router_rows: tokens share experts).
constexpr int kBatchedK = 8;
constexpr int64_t kBatchedF = 512;
struct BatchedCase {
  int E;
  int64_t D;
  bool tied;
};
constexpr BatchedCase kBatchedCases[] = {{256, 2048, false}, {256, 2048, true}, {64, 1024, false}, {64, 1024, true}};

// Runs body(md, case, label) on each case's weights until a failure; returns why the test is skipped (the batched
// step does not apply here, or body's reason), empty when it ran.
template <typename Body>
std::string for_each_batched_case(std::mt19937_64& rng, const std::string& form, Body body) {
  for (const BatchedCase& c : kBatchedCases) {
    auto mh = make_moe(rng, WeightFormat::affine4, WeightFormat::affine8, c.E, kBatchedK, c.D, kBatchedF);
    if (c.tied) repeat_router_rows(*mh);
    MoeDevice md(*mh);
    if (!moe_decode_batched_supported(md.w))
      return "moe_decode_batched does not apply here (needs the sm_90 cluster router)";
    const std::string label = std::string(c.tied ? "repeated router rows" : "random router") + " D=" +
                              std::to_string(c.D) + " E=" + std::to_string(c.E) + " (" + form + ")";
    if (std::string skip = body(md, c, label); !skip.empty()) return skip;
    if (::testing::Test::HasFailure()) break;
  }
  return "";
}

// The gate_up grouped by expert across the batch (TERN_MOE_RING_GATE_UP=grouped, set here with
// moe_ring_gate_up_set_mode) held to the tokens alone as the ring is: B in {2, 3, 8, 9, 16, 32} (one group; two groups
// of 4 and 5; up to four groups of 8), random router rows and repeated ones (repeat_router_rows: tokens share
// experts, up to all 8 of them, so that an expert's rows serve many (token, slot) pairs), at the model's shapes and at
// D = 1024 (one slice) with 64 experts. The router's x_lanes are held to their host twin (host_x_lanes), and the
// grouped kernel must have run (its launch count: the ring form, which it falls back to, would pass the rest). The
// grouped form takes the 16-bit activations only (moe_dp4a_set_wide(false) here); with 24 it is not asked for.
TEST(CudaMoeDecode, GroupedGateUpMatchesOneTokenBitwise) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaMoeDecode.Grouped"));
  const int v0 = qmv_variant(), mode0 = moe_ring_gate_up_mode();
  MoeWidth width(true);
  const auto restore = [&] {
    qmv_set_variant(v0);
    moe_ring_gate_up_set_mode(mode0);
  };
  qmv_set_variant(3);
  moe_ring_gate_up_set_mode(kMoeRingGateUpGrouped);
  const std::string skip = for_each_batched_case(rng, "grouped gate_up", [&](MoeDevice& md, const BatchedCase& c,
                                                                          const std::string& label) -> std::string {
    width.set(true);  // the grouped form takes 16-bit activations only: with 24 the ring form runs
    EXPECT_FALSE(moe_gate_up_wants_x_lanes(md.w, 2)) << label << ": the grouped form asked for at 24 bits";
    width.set(false);
    if (!moe_gate_up_wants_x_lanes(md.w, 2)) return "the batched gate_up rings are off (TERN_MOE_RING=0)";
    for (int B : {2, 3, 8, 9, 16, 32}) {
      const int64_t launches = moe_gate_up_grouped_launches();
      expect_batched_matches_alone(rng, md, c.E, kBatchedK, c.D, kBatchedF, B, label, true);
      EXPECT_EQ(moe_gate_up_grouped_launches() - launches, 2) << label << " B=" << B << ": the grouped gate_up ran";
      if (HasFailure()) break;
    }
    return "";
  });
  restore();
  if (!skip.empty()) GTEST_SKIP() << skip;
}

// The ring forms taking two rows a step (the default; gate_up's batches and down's output rows in pairs, their sums
// through one transposed butterfly) and one (TERN_MOE_RING_ROWS=1), each set here with moe_ring_set_rows, at both
// activation widths (the 16-bit form on B 3 and 8 only), held to the tokens alone: B in {2, 3, 5, 8, 16, 32}, random
// router rows and repeated ones, at the model's shapes and at D = 1024 (one slice) with 64 experts. Each B is its own
// grid, and a warp whose count of rows is odd ends on a half pair (its second row past the end). On the H200 (132 SMs)
// B = 2, 3, 5 and 8 give every kernel such warps, e.g. down at D = 2048, B = 2: 1056 warps for 2048 rows, 64 of them
// with one row; D = 1024, B = 2: one row each; gate_up at D = 2048, B = 8: 264 warps for 4608 batches, 18 or 17 each.
// B = 16 and 32 there give even counts at D = 2048.
TEST(CudaMoeDecode, OneAndTwoRowRingsMatchOneTokenBitwise) {
  TERN_REQUIRE_GPU();
  if (const char* ring = std::getenv("TERN_MOE_RING"); ring && std::string(ring) == "0")
    GTEST_SKIP() << "the batched rings are off (TERN_MOE_RING=0)";
  std::mt19937_64 rng(fresh_seed("CudaMoeDecode.TwoRowRings"));
  const int v0 = qmv_variant(), rows0 = moe_ring_rows();
  const auto restore = [&] {
    qmv_set_variant(v0);
    moe_ring_set_rows(rows0);
  };
  qmv_set_variant(3);
  MoeWidth width(true);
  std::string skip;
  for (const bool wide : {true, false}) {  // the experts' activations at 24 bits (the default), then at 16 (B 3 and 8)
    width.set(wide);
    for (int rows : {2, 1}) {
      moe_ring_set_rows(rows);
      const std::string form = std::string(rows == 2 ? "two-row rings" : "one-row rings") + (wide ? "" : ", 16-bit");
      skip = for_each_batched_case(rng, form, [&](MoeDevice& md, const BatchedCase& c,
                                                  const std::string& label) -> std::string {
        for (int B : {2, 3, 5, 8, 16, 32}) {
          if (!wide && B != 3 && B != 8) continue;
          expect_batched_matches_alone(rng, md, c.E, kBatchedK, c.D, kBatchedF, B, form + ", " + label);
          if (HasFailure()) break;
        }
        return "";
      });
      if (!skip.empty() || HasFailure()) break;
    }
    if (!skip.empty() || HasFailure()) break;
  }
  restore();
  if (!skip.empty()) GTEST_SKIP() << skip;
}

}  // namespace
}  // namespace tern::cuda::test
