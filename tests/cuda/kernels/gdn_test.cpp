// Gated DeltaNet kernels against their CPU twins at the model's real shapes (Hk 16, Hv 32, dk = dv = 128, C 8192,
// conv width 4), on fresh random inputs, outputs poisoned (NaN) first, states carried from call to call.
//   - gdn_decode (one kernel: conv + SiLU → q/k norms + gates → delta rule → gated RMSNorm) against the composition
//     of the CPU ops it replaces, on all its paths (sm_90 clusters, the portable block per v-head with its tickets,
//     and the one block per key head);
//   - gdn_decode_batched (B sequences, one token each) bit for bit against gdn_decode for each sequence alone;
//   - the portable block per v-head bit for bit against the clusters of 4 × 16 warps × 4 rows (sm_90);
//   - the batched step's shapes (8 rows per warp: cluster2_w16, cluster4_w8; 16 rows, 12 of them in shared memory:
//     smem_w16) bit for bit against the same (sm_90);
//   - gdn_decode over steps of several chunks (T up to kGdnDecodeMaxTokens) against the CPU twin and bit for bit
//     against one-token calls (outputs, states, kept states);
//   - gdn_chunked (prefill) against the CPU chunked form and the CPU recurrence, for lengths around the chunk size.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../cuda_test_util.h"
#include "cpu/ops_conv1d.h"
#include "cpu/ops_gdn.h"
#include "cpu/ops_norm.h"
#include "cuda/kernels/conv1d/conv1d.cuh"
#include "cuda/kernels/gdn/gdn.cuh"
#include "producer_tables.h"

namespace tern::cuda::test {
namespace {

// The per-layer constants of one GDN layer, host and device.
struct GdnLayer {
  GdnDims d;  // real dims
  int Ck = 4;
  std::vector<float> conv_w, A_log, dt_bias, norm_w;
  std::vector<float> conv_state, rec_state;  // the CPU twin's states
  explicit GdnLayer(std::mt19937_64& rng, int ck = 4) : Ck(ck) {
    const int64_t C = d.C();
    conv_w = random_floats(rng, size_t(C * Ck), -0.5f, 0.5f);
    A_log = random_floats(rng, size_t(d.Hv), 0.0f, 2.7f);
    dt_bias = random_floats(rng, size_t(d.Hv), -1.0f, 1.0f);
    norm_w = random_floats(rng, size_t(d.dv), 0.5f, 1.5f);
    conv_state = random_floats(rng, size_t((Ck - 1) * C), -2.0f, 2.0f);  // as if carried from earlier tokens
    rec_state = random_floats(rng, size_t(d.Hv) * d.dv * d.dk, -0.3f, 0.3f);
  }
};

// Rows of the fused in_proj's output [rows, ld] at realistic magnitudes: qkv_raw and z ~ U(-2, 2), the gates b, a ~
// U(-3, 3); the padding columns past them NaN.
std::vector<float> random_proj(std::mt19937_64& rng, const GdnDims& d, int64_t rows, int64_t ld) {
  const int64_t C = d.C(), Z = int64_t(d.Hv) * d.dv;
  std::vector<float> proj(size_t(rows * ld), std::nanf(""));
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = random_floats(rng, size_t(C + Z), -2.0f, 2.0f);
    const auto gates = random_floats(rng, size_t(2 * d.Hv), -3.0f, 3.0f);
    std::copy(row.begin(), row.end(), proj.begin() + r * ld);
    std::copy(gates.begin(), gates.end(), proj.begin() + r * ld + C + Z);
  }
  return proj;
}

// gdn_decode's arguments for T rows of proj [T, ld] over the layer's weights on the device (dw, dA, ddt, dnw: its
// conv_w, A_log, dt_bias, norm_w); the states, outputs, launch shape and tickets are the caller's.
GdnDecodeArgs decode_args(const GdnLayer& L, const DeviceBuf<float>& dw, const DeviceBuf<float>& dA,
                          const DeviceBuf<float>& ddt, const DeviceBuf<float>& dnw, const float* proj, int64_t ld,
                          int64_t T) {
  GdnDecodeArgs a;
  a.proj = proj;
  a.ld_proj = ld;
  a.conv_w = dw.p;
  a.Ck = L.Ck;
  a.A_log = dA.p;
  a.dt_bias = ddt.p;
  a.norm_w = dnw.p;
  a.eps = 1e-6f;
  a.d = L.d;
  a.d.T = T;
  return a;
}

// The CPU twin of gdn_decode: conv1d_causal_silu → gdn_qk_norm, gdn_gates → gdn_recurrent → gated_rms_norm, as
// src/cpu/cpu_runner.cpp composes the mixer. proj [T, ld] rows = [qkv_raw (C) | z (Hv·dv) | b (Hv) | a (Hv)].
std::vector<float> cpu_decode_twin(GdnLayer& L, const std::vector<float>& proj, int64_t ld, int64_t T) {
  const GdnDims& d = L.d;
  const int64_t C = d.C(), Z = int64_t(d.Hv) * d.dv;
  std::vector<float> raw(size_t(T * C)), z(size_t(T * Z)), b(size_t(T * d.Hv)), a(b.size());
  for (int64_t t = 0; t < T; ++t) {
    const float* row = proj.data() + t * ld;
    std::copy(row, row + C, raw.begin() + t * C);
    std::copy(row + C, row + C + Z, z.begin() + t * Z);
    std::copy(row + C + Z, row + C + Z + d.Hv, b.begin() + t * d.Hv);
    std::copy(row + C + Z + d.Hv, row + C + Z + 2 * d.Hv, a.begin() + t * d.Hv);
  }
  std::vector<float> qkv(raw.size());
  cpu::conv1d_causal_silu({.x = raw.data(), .T = T, .C = C, .w = L.conv_w.data(), .Ck = L.Ck,
                           .state = L.conv_state.data(), .y = qkv.data()});
  cpu::GdnDims cd{d.Hk, d.Hv, d.dk, d.dv};
  cpu::gdn_qk_norm(qkv.data(), T, cd);
  std::vector<float> g(b.size()), beta(b.size());
  cpu::gdn_gates(a.data(), b.data(), L.A_log.data(), L.dt_bias.data(), T, d.Hv, g.data(), beta.data());
  std::vector<float> core(size_t(T * Z)), out(core.size());
  cpu::GdnArgs ga = gdn_args_over_qkv(qkv, C, g, beta, T, cd);
  ga.state = L.rec_state.data();
  ga.out = core.data();
  cpu::gdn_recurrent(ga);
  cpu::gated_rms_norm(core.data(), z.data(), L.norm_w.data(), T * d.Hv, d.dv, 1e-6f, out.data());
  return out;
}

// Every ticket back at zero (GdnDecodeArgs::tickets: each launch leaves them so).
void expect_tickets_zero(const DeviceBuf<unsigned>& tickets, const std::string& what) {
  const auto t = tickets.host();
  EXPECT_EQ(size_t(std::count(t.begin(), t.end(), 0u)), t.size()) << "tickets not back at zero after " << what;
}

// Several calls (T = 1 five times, then 3, 8 and 2), the conv and recurrent states carried on the GPU and on the
// CPU alike; every launch shape runs on its own copies of the states (portable_split with its tickets).
TEST(CudaGdnDecode, MatchesCpuTwinAcrossCallsWithStateCarried) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaGdnDecode"));
  GdnLayer L(rng);
  const GdnDims& d = L.d;
  const int64_t C = d.C(), Z = int64_t(d.Hv) * d.dv;
  const int64_t ld = C + Z + 2 * d.Hv + 12;  // a row stride wider than the row, as a fused projection may leave
  DeviceBuf<float> dw(L.conv_w), dA(L.A_log), ddt(L.dt_bias), dnw(L.norm_w);
  DeviceBuf<unsigned> tickets(std::vector<unsigned>(size_t(gdn_decode_ticket_count(d.Hk)), 0u));
  // Every launch shape on its own copy of the states (the cluster shapes run as portable before sm_90: no tickets).
  constexpr GdnDecodeArgs::Kernel kDecodeKernels[] = {
      GdnDecodeArgs::Kernel::cluster8_w8,    GdnDecodeArgs::Kernel::cluster8_w16, GdnDecodeArgs::Kernel::cluster16_w8,
      GdnDecodeArgs::Kernel::cluster4_w16,   GdnDecodeArgs::Kernel::portable,     GdnDecodeArgs::Kernel::portable_split,
      GdnDecodeArgs::Kernel::cluster2_w16,   GdnDecodeArgs::Kernel::cluster4_w8,  GdnDecodeArgs::Kernel::smem_w16};
  constexpr const char* kDecodeNames[] = {"cluster8_w8", "cluster8_w16",   "cluster16_w8", "cluster4_w16",
                                          "portable",    "portable_split", "cluster2_w16", "cluster4_w8",
                                          "smem_w16"};
  constexpr int kDecodeVariants = sizeof(kDecodeKernels) / sizeof(kDecodeKernels[0]);
  std::vector<std::unique_ptr<DeviceBuf<float>>> conv, rec;
  for (int v = 0; v < kDecodeVariants; ++v) {
    conv.push_back(std::make_unique<DeviceBuf<float>>(L.conv_state));
    rec.push_back(std::make_unique<DeviceBuf<float>>(L.rec_state));
  }
  for (int64_t T : {1, 1, 1, 1, 1, 3, 8, 2}) {
    // Realistic magnitudes: qkv_raw and z ~ U(-2, 2), gates b, a ~ U(-3, 3); the padding columns are NaN.
    const std::vector<float> proj = random_proj(rng, d, T, ld);
    const auto ref = cpu_decode_twin(L, proj, ld, T);
    DeviceBuf<float> dproj(proj);
    for (int v = 0; v < kDecodeVariants; ++v) {
      const bool portable = kDecodeKernels[v] == GdnDecodeArgs::Kernel::portable;
      DeviceBuf<float> out(size_t(T * Z));  // poisoned
      GdnDecodeArgs a = decode_args(L, dw, dA, ddt, dnw, dproj.p, ld, T);
      a.conv_state = conv[size_t(v)]->p;
      a.rec_state = rec[size_t(v)]->p;
      a.out = out.p;
      a.force_portable = portable;
      a.kernel = kDecodeKernels[v];
      a.tickets = kDecodeKernels[v] == GdnDecodeArgs::Kernel::portable_split ? tickets.p : nullptr;
      gdn_decode(a, nullptr);
      TERN_CUDA(cudaGetLastError());
      const std::string tag = std::string(" ") + kDecodeNames[v] + " T=" + std::to_string(T);
      expect_close(out.host(), ref, 2e-5f * rms_of(ref), 2e-4f, "gdn_decode out" + tag);
      expect_close(conv[size_t(v)]->host(), L.conv_state, 0.0f, 0.0f, "gdn_decode conv state" + tag);
      expect_close(rec[size_t(v)]->host(), L.rec_state, 2e-5f * rms_of(L.rec_state), 2e-4f,
                   "gdn_decode recurrent state" + tag);
      expect_tickets_zero(tickets, "gdn_decode" + tag);
    }
  }
}

// gdn_decode_batched against gdn_decode run for each sequence alone (T = 1), bit for bit: B sequences with their own
// proj rows and their own conv and recurrent states (separate allocations, different values), two steps with the states
// carried, for every launch shape (the batched call takes a.kernel as gdn_decode does; portable_split, and automatic as
// the runner calls it, with tickets). automatic is the cross-shape check: on sm_90 the batched call takes the batched
// shape from B = 2 on (cluster2_w16, smem_w16 where B · Hk exceeds the SMs, or TERN_GDN_BATCH_SHAPE's), the lone calls
// cluster4_w16. The outputs and both updated states must be identical to the last bit, the states must have changed,
// and the tickets must be back at zero.
TEST(CudaGdnDecode, BatchedIsBitIdenticalToEachSequenceAlone) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaGdnDecodeBatched"));
  GdnLayer L(rng);
  const GdnDims& d = L.d;
  const int64_t C = d.C(), Z = int64_t(d.Hv) * d.dv;
  const int64_t ld = C + Z + 2 * d.Hv + 12;  // a row stride wider than the row, as a fused projection may leave
  const size_t conv_n = size_t((L.Ck - 1) * C), rec_n = size_t(d.Hv) * d.dv * d.dk;
  DeviceBuf<float> dw(L.conv_w), dA(L.A_log), ddt(L.dt_bias), dnw(L.norm_w);
  DeviceBuf<unsigned> tickets(std::vector<unsigned>(size_t(gdn_decode_ticket_count(d.Hk)), 0u));
  using K = GdnDecodeArgs::Kernel;
  struct Shape {
    K kernel;
    const char* name;
    bool tickets;  // GdnDecodeArgs::tickets given
  };
  const Shape kernels[] = {{K::automatic, "automatic", false},        {K::automatic, "automatic+tickets", true},
                           {K::cluster8_w8, "cluster8_w8", false},    {K::cluster8_w16, "cluster8_w16", false},
                           {K::cluster16_w8, "cluster16_w8", false},  {K::cluster4_w16, "cluster4_w16", false},
                           {K::portable, "portable", false},          {K::portable_split, "portable_split", true},
                           {K::cluster2_w16, "cluster2_w16", false},  {K::cluster4_w8, "cluster4_w8", false},
                           {K::smem_w16, "smem_w16", false}};
  // TERN_GDN_TEST_SHAPES=name,name narrows the shapes (a sanitizer run, where every launch is slow).
  const char* only = std::getenv("TERN_GDN_TEST_SHAPES");
  const auto wanted = [&](const char* name) {
    if (!only) return true;
    const std::string list = std::string(",") + only + ",";
    return list.find(std::string(",") + name + ",") != std::string::npos;
  };
  int shapes_run = 0;
  for (const auto& [kernel, name, with_tickets] : kernels) {
    if (!wanted(name)) continue;
    ++shapes_run;
    for (int B : {1, 2, 7, 16, 32}) {
      const std::string tag = std::string(name) + " B=" + std::to_string(B);
      SCOPED_TRACE(tag);
      // Each sequence's states twice: the batched call's and the lone calls' (same values, separate allocations).
      std::vector<std::unique_ptr<DeviceBuf<float>>> conv_b, rec_b, conv_1, rec_1;
      std::vector<float*> conv_ptrs, rec_ptrs;
      for (int b = 0; b < B; ++b) {
        const auto conv = random_floats(rng, conv_n, -2.0f, 2.0f), rec = random_floats(rng, rec_n, -0.3f, 0.3f);
        conv_b.push_back(std::make_unique<DeviceBuf<float>>(conv));
        rec_b.push_back(std::make_unique<DeviceBuf<float>>(rec));
        conv_1.push_back(std::make_unique<DeviceBuf<float>>(conv));
        rec_1.push_back(std::make_unique<DeviceBuf<float>>(rec));
        conv_ptrs.push_back(conv_b.back()->p);
        rec_ptrs.push_back(rec_b.back()->p);
      }
      const std::vector<float> rec0 = rec_b[0]->host();
      DeviceBuf<float*> conv_table(conv_ptrs), rec_table(rec_ptrs);
      for (int step = 0; step < 2; ++step) {
        const std::vector<float> proj = random_proj(rng, d, B, ld);  // the padding columns are NaN
        DeviceBuf<float> dproj(proj), out_b(size_t(B * Z)), out_1(size_t(B * Z));  // outputs poisoned
        GdnDecodeArgs a = decode_args(L, dw, dA, ddt, dnw, dproj.p, ld, 1);
        a.kernel = kernel;
        a.force_portable = kernel == K::portable;
        a.tickets = with_tickets ? tickets.p : nullptr;
        a.out = out_b.p;
        // out_proj's tables beside out (every shape whose blocks hold whole groups of 64 values writes them)
        ZeroTables tables(B, Z);
        a.out_tables = tables.buf.p;
        const bool written = gdn_decode_batched(a, B, conv_table.p, rec_table.p, nullptr);
        TERN_CUDA(cudaGetLastError());
        const bool narrow = kernel == K::cluster8_w8 || kernel == K::cluster8_w16 || kernel == K::cluster16_w8;
        EXPECT_EQ(written, !narrow || !sm90_features()) << "whether out_proj's tables were written";
        if (written) expect_tables_match(tables, out_b.p, Z, Z, nullptr, 0.0f, B, "out_proj's tables");
        a.out_tables = nullptr;
        for (int b = 0; b < B; ++b) {
          GdnDecodeArgs one = a;
          one.proj = dproj.p + b * ld;
          one.out = out_1.p + b * Z;
          one.conv_state = conv_1[size_t(b)]->p;
          one.rec_state = rec_1[size_t(b)]->p;
          gdn_decode(one, nullptr);
        }
        TERN_CUDA(cudaGetLastError());
        const std::string at = " step " + std::to_string(step);
        const auto got = out_b.host(), want = out_1.host();
        EXPECT_EQ(std::count_if(want.begin(), want.end(), [](float x) { return !std::isfinite(x); }), 0)
            << "lone outputs" << at;
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "outputs" << at;
        for (int b = 0; b < B; ++b) {
          const auto cb = conv_b[size_t(b)]->host(), c1 = conv_1[size_t(b)]->host();
          const auto rb = rec_b[size_t(b)]->host(), r1 = rec_1[size_t(b)]->host();
          EXPECT_EQ(std::memcmp(cb.data(), c1.data(), cb.size() * sizeof(float)), 0)
              << "conv state of sequence " << b << at;
          EXPECT_EQ(std::memcmp(rb.data(), r1.data(), rb.size() * sizeof(float)), 0)
              << "recurrent state of sequence " << b << at;
        }
        expect_tickets_zero(tickets, tag + at);
      }
      EXPECT_NE(std::memcmp(rec_b[0]->host().data(), rec0.data(), rec0.size() * sizeof(float)), 0)
          << "the batched call left sequence 0's recurrent state as it was";
    }
  }
  EXPECT_GT(shapes_run, 0) << "TERN_GDN_TEST_SHAPES=" << (only ? only : "") << " names none of the shapes";
}

// gdn_decode_from_tables (the verify step's call: one sequence of T tokens, its states and kept buffers through device
// tables) writes out_proj's activation tables for T ≤ 8 (token t in slot t of the one tile), byte for byte what the
// pre-quantising kernel makes of its outputs, and says so; for T = 9 (two chunks) it writes none and says so. The
// outputs are those of gdn_decode on the same states, keeping the states before each token as the verify does.
TEST(CudaGdnDecode, FromTablesWritesOutProjTablesForOneChunk) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaGdnDecodeFromTables"));
  GdnLayer L(rng);
  const GdnDims& d = L.d;
  const int64_t C = d.C(), Z = int64_t(d.Hv) * d.dv;
  const int64_t ld = C + Z + 2 * d.Hv + 12;
  const size_t conv_n = size_t((L.Ck - 1) * C), rec_n = size_t(d.Hv) * d.dv * d.dk;
  DeviceBuf<float> dw(L.conv_w), dA(L.A_log), ddt(L.dt_bias), dnw(L.norm_w);
  DeviceBuf<unsigned> tickets(std::vector<unsigned>(size_t(gdn_decode_ticket_count(d.Hk)), 0u));
  for (int64_t T : {1, 3, 8, 9}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    const auto conv = random_floats(rng, conv_n, -2.0f, 2.0f), rec = random_floats(rng, rec_n, -0.3f, 0.3f);
    DeviceBuf<float> conv_t(conv), rec_t(rec), conv_1(conv), rec_1(rec);  // the tables' states, the lone call's
    DeviceBuf<float> conv_keep(size_t(T) * conv_n), rec_keep(size_t(gdn_kept_rec_floats(d, T)));
    DeviceBuf<float> conv_keep_1(conv_keep.n), rec_keep_1(rec_keep.n);
    DeviceBuf<float*> conv_table(std::vector<float*>{conv_t.p}), rec_table(std::vector<float*>{rec_t.p});
    DeviceBuf<float*> conv_keep_table(std::vector<float*>{conv_keep.p});
    DeviceBuf<float*> rec_keep_table(std::vector<float*>{rec_keep.p});
    const std::vector<float> proj = random_proj(rng, d, T, ld);
    DeviceBuf<float> dproj(proj), out_t(size_t(T * Z)), out_1(size_t(T * Z));  // poisoned
    GdnDecodeArgs a = decode_args(L, dw, dA, ddt, dnw, dproj.p, ld, T);
    a.tickets = tickets.p;
    a.out = out_t.p;
    ZeroTables tables(int(T), Z);
    a.out_tables = tables.buf.p;
    const bool written = gdn_decode_from_tables(a, conv_table.p, rec_table.p, conv_keep_table.p, rec_keep_table.p,
                                                nullptr, nullptr);
    TERN_CUDA(cudaGetLastError());
    EXPECT_EQ(written, T <= 8) << "whether out_proj's tables were written";
    if (written) {
      expect_tables_match(tables, out_t.p, Z, Z, nullptr, 0.0f, int(T), "out_proj's tables");
    } else {
      const std::vector<uint8_t> bytes = tables.buf.host();
      EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; })) << "tables written";
    }
    a.out_tables = nullptr;
    a.out = out_1.p;
    a.conv_state = conv_1.p;
    a.rec_state = rec_1.p;
    a.conv_keep = conv_keep_1.p;
    a.rec_keep = rec_keep_1.p;
    gdn_decode(a, nullptr);
    TERN_CUDA(cudaGetLastError());
    EXPECT_TRUE(all_finite(out_1.host()));
    EXPECT_TRUE(same_bits(out_t.host(), out_1.host())) << "outputs";
    EXPECT_TRUE(same_bits(rec_t.host(), rec_1.host())) << "recurrent state";
    EXPECT_TRUE(same_bits(rec_keep.host(), rec_keep_1.host())) << "kept recurrent state and replay values";
    expect_tickets_zero(tickets, "T=" + std::to_string(T));
  }
}

// portable_split against cluster4_w16, bit for bit (sm_90: the clusters must run). Both give each warp 4 state rows
// and each v-head 32 warps, so every sum is formed in the same order. B = 3 sequences, each with a copy of its states
// per shape; calls of one token (gdn_decode_batched over the three) and of three tokens (gdn_decode for each
// sequence, sequence 0 keeping the states before each token), the states carried from call to call. The outputs, the
// conv and recurrent states and the kept states must be identical, and the tickets back at zero after every call
// (the next call's q/k conv state would be written by the wrong block, or not at all, otherwise).
// B sequences' conv and recurrent states on the device, one copy per launch shape under test (the same random values
// in every copy), with each copy's pointer tables for gdn_decode_batched: states(shape).conv[b], .rec_table, ...
class ShapeStates {
 public:
  struct Copy {
    std::vector<std::unique_ptr<DeviceBuf<float>>> conv, rec;
    std::vector<float*> conv_ptrs, rec_ptrs;
    std::unique_ptr<DeviceBuf<float*>> conv_table, rec_table;
  };
  ShapeStates(std::mt19937_64& rng, int shapes, int B, size_t conv_n, size_t rec_n) : copies_(size_t(shapes)) {
    for (int b = 0; b < B; ++b) {
      const auto conv = random_floats(rng, conv_n, -2.0f, 2.0f), rec = random_floats(rng, rec_n, -0.3f, 0.3f);
      for (Copy& st : copies_) {
        st.conv.push_back(std::make_unique<DeviceBuf<float>>(conv));
        st.rec.push_back(std::make_unique<DeviceBuf<float>>(rec));
        st.conv_ptrs.push_back(st.conv.back()->p);
        st.rec_ptrs.push_back(st.rec.back()->p);
      }
    }
    for (Copy& st : copies_) {
      st.conv_table = std::make_unique<DeviceBuf<float*>>(st.conv_ptrs);
      st.rec_table = std::make_unique<DeviceBuf<float*>>(st.rec_ptrs);
    }
  }
  Copy& operator[](int shape) { return copies_[size_t(shape)]; }

 private:
  std::vector<Copy> copies_;
};

TEST(CudaGdnDecode, PortableSplitIsBitIdenticalToCluster4) {
  TERN_REQUIRE_GPU();
  if (!sm90_features()) GTEST_SKIP() << "cluster4_w16 needs sm_90 code and no TERN_GPU_PATH=portable";
  std::mt19937_64 rng(fresh_seed("CudaGdnDecodeSplit"));
  GdnLayer L(rng);
  const GdnDims& d = L.d;
  const int64_t C = d.C(), Z = int64_t(d.Hv) * d.dv;
  const int64_t ld = C + Z + 2 * d.Hv + 12;  // a row stride wider than the row, as a fused projection may leave
  const size_t conv_n = size_t((L.Ck - 1) * C), rec_n = size_t(d.Hv) * d.dv * d.dk;
  constexpr int B = 3;
  using K = GdnDecodeArgs::Kernel;
  const K shapes[2] = {K::cluster4_w16, K::portable_split};
  DeviceBuf<float> dw(L.conv_w), dA(L.A_log), ddt(L.dt_bias), dnw(L.norm_w);
  DeviceBuf<unsigned> tickets(std::vector<unsigned>(size_t(gdn_decode_ticket_count(d.Hk)), 0u));
  ShapeStates states(rng, 2, B, conv_n, rec_n);  // states[shape]: the same values for both shapes
  const std::vector<float> rec0 = states[1].rec[0]->host();
  int call = 0;
  for (int64_t T : {1, 3, 1, 1, 3, 1}) {
    const std::string at = "call " + std::to_string(call++) + " T=" + std::to_string(T);
    SCOPED_TRACE(at);
    // Sequence b's T rows at row b·T; the padding columns are NaN.
    const std::vector<float> proj = random_proj(rng, d, B * T, ld);
    DeviceBuf<float> dproj(proj);
    std::vector<float> out[2], conv_keep[2], rec_keep[2];
    for (int s = 0; s < 2; ++s) {
      ShapeStates::Copy& st = states[s];
      DeviceBuf<float> dout(size_t(B * T * Z));  // poisoned
      GdnDecodeArgs a = decode_args(L, dw, dA, ddt, dnw, dproj.p, ld, T);
      a.out = dout.p;
      a.kernel = shapes[s];
      a.tickets = tickets.p;
      if (T == 1) {
        gdn_decode_batched(a, B, st.conv_table->p, st.rec_table->p, nullptr);
      } else {
        DeviceBuf<float> dconv_keep(size_t(T) * conv_n), drec_keep(size_t(gdn_kept_rec_floats(d, T)));  // poisoned
        for (int b = 0; b < B; ++b) {
          GdnDecodeArgs one = a;
          one.proj = dproj.p + b * T * ld;
          one.out = dout.p + b * T * Z;
          one.conv_state = st.conv[size_t(b)]->p;
          one.rec_state = st.rec[size_t(b)]->p;
          if (b == 0) {
            one.conv_keep = dconv_keep.p;
            one.rec_keep = drec_keep.p;
          }
          gdn_decode(one, nullptr);
        }
        conv_keep[s] = dconv_keep.host();
        rec_keep[s] = drec_keep.host();
      }
      TERN_CUDA(cudaGetLastError());
      out[s] = dout.host();
      expect_tickets_zero(tickets, std::string(s ? "portable_split " : "cluster4_w16 ") + at);
    }
    EXPECT_TRUE(all_finite(out[0])) << "cluster4_w16 outputs";
    EXPECT_TRUE(same_bits(out[0], out[1])) << "outputs";
    if (T > 1) {
      EXPECT_TRUE(all_finite(conv_keep[0]) && all_finite(rec_keep[0])) << "cluster4_w16 kept states";
      EXPECT_TRUE(same_bits(conv_keep[0], conv_keep[1])) << "kept conv states";
      EXPECT_TRUE(same_bits(rec_keep[0], rec_keep[1])) << "kept recurrent states";
    }
    for (int b = 0; b < B; ++b) {
      EXPECT_TRUE(same_bits(states[0].conv[size_t(b)]->host(), states[1].conv[size_t(b)]->host()))
          << "conv state of sequence " << b;
      EXPECT_TRUE(same_bits(states[0].rec[size_t(b)]->host(), states[1].rec[size_t(b)]->host()))
          << "recurrent state of sequence " << b;
    }
  }
  EXPECT_FALSE(same_bits(states[1].rec[0]->host(), rec0)) << "portable_split left sequence 0's recurrent state as it was";
}

// The batched step's shapes against cluster4_w16, bit for bit (sm_90: the clusters must run): cluster2_w16 and
// cluster4_w8 hold 8 state rows per warp where cluster4_w16 holds 4, smem_w16 16 (12 of them in shared memory, at one
// token and conv width 4; cluster2_w16's kernels otherwise), but each row's arithmetic is the same and the
// gated norm's sums of squares are formed over the same sets of 4 rows in the same order, so every number must be
// the same. Conv widths 4 and 6 (the kernels of 4 and 8 taps). Per width, B = 3 sequences with a copy of their states
// per shape, the states carried from call to call:
//   gdn_decode of sequence 0 forced to each shape, T = 1, 5 (one chunk), 20 (three chunks, the last short) and 1
//   again, keeping the states before each token (so one token too runs the one-chunk kernel: the one-token kernels
//   keep nothing);
//   gdn_decode_batched over the three (T = 1), forced to each shape.
// The outputs, the conv and recurrent states of every sequence and the kept states must be identical.
TEST(CudaGdnDecode, BatchShapesAreBitIdenticalToCluster4) {
  TERN_REQUIRE_GPU();
  if (!sm90_features()) GTEST_SKIP() << "the cluster shapes need sm_90 code and no TERN_GPU_PATH=portable";
  std::mt19937_64 rng(fresh_seed("CudaGdnDecodeBatchShapes"));
  using K = GdnDecodeArgs::Kernel;
  constexpr int kShapes = 4;
  const K shapes[kShapes] = {K::cluster4_w16, K::cluster2_w16, K::cluster4_w8, K::smem_w16};
  const char* const names[kShapes] = {"cluster4_w16", "cluster2_w16", "cluster4_w8", "smem_w16"};
  constexpr int B = 3;
  for (int Ck : {4, 6}) {
    GdnLayer L(rng, Ck);
    const GdnDims& d = L.d;
    const int64_t C = d.C(), Z = int64_t(d.Hv) * d.dv;
    const int64_t ld = C + Z + 2 * d.Hv + 12;  // a row stride wider than the row, as a fused projection may leave
    const size_t conv_n = size_t((Ck - 1) * C), rec_n = size_t(d.Hv) * d.dv * d.dk;
    DeviceBuf<float> dw(L.conv_w), dA(L.A_log), ddt(L.dt_bias), dnw(L.norm_w);
    ShapeStates states(rng, kShapes, B, conv_n, rec_n);  // states[shape]: the same values for every shape
    const std::vector<float> rec0 = states[0].rec[0]->host();
    // Every sequence's states of each shape against cluster4_w16's.
    auto expect_states_match = [&](const std::string& at) {
      for (int s = 1; s < kShapes; ++s)
        for (int b = 0; b < B; ++b) {
          EXPECT_TRUE(same_bits(states[0].conv[size_t(b)]->host(), states[s].conv[size_t(b)]->host()))
              << names[s] << " conv state of sequence " << b << " " << at;
          EXPECT_TRUE(same_bits(states[0].rec[size_t(b)]->host(), states[s].rec[size_t(b)]->host()))
              << names[s] << " recurrent state of sequence " << b << " " << at;
        }
    };
    int call = 0;
    for (int64_t T : {1, 5, 20, 1}) {
      const std::string at = "Ck=" + std::to_string(Ck) + " call " + std::to_string(call++) + " T=" + std::to_string(T);
      SCOPED_TRACE(at);
      const std::vector<float> proj = random_proj(rng, d, T, ld);  // the padding columns are NaN
      DeviceBuf<float> dproj(proj);
      std::vector<float> out[kShapes], conv_keep[kShapes], rec_keep[kShapes];
      for (int s = 0; s < kShapes; ++s) {
        DeviceBuf<float> dout(size_t(T * Z)), dconv_keep(size_t(T) * conv_n),
            drec_keep(size_t(gdn_kept_rec_floats(d, T)));  // poisoned
        GdnDecodeArgs a = decode_args(L, dw, dA, ddt, dnw, dproj.p, ld, T);
        a.kernel = shapes[s];
        a.out = dout.p;
        a.conv_state = states[s].conv[0]->p;
        a.rec_state = states[s].rec[0]->p;
        a.conv_keep = dconv_keep.p;
        a.rec_keep = drec_keep.p;
        gdn_decode(a, nullptr);
        TERN_CUDA(cudaGetLastError());
        out[s] = dout.host();
        conv_keep[s] = dconv_keep.host();
        rec_keep[s] = drec_keep.host();
      }
      EXPECT_TRUE(all_finite(out[0])) << "cluster4_w16 outputs";
      EXPECT_TRUE(all_finite(conv_keep[0]) && all_finite(rec_keep[0])) << "cluster4_w16 kept states";
      for (int s = 1; s < kShapes; ++s) {
        EXPECT_TRUE(same_bits(out[0], out[s])) << names[s] << " outputs";
        EXPECT_TRUE(same_bits(conv_keep[0], conv_keep[s])) << names[s] << " kept conv states";
        EXPECT_TRUE(same_bits(rec_keep[0], rec_keep[s])) << names[s] << " kept recurrent states";
      }
      expect_states_match("after gdn_decode");
    }
    for (int step = 0; step < 2; ++step) {
      const std::string at = "Ck=" + std::to_string(Ck) + " batched step " + std::to_string(step);
      SCOPED_TRACE(at);
      const std::vector<float> proj = random_proj(rng, d, B, ld);  // sequence b's row at row b
      DeviceBuf<float> dproj(proj);
      std::vector<float> out[kShapes];
      for (int s = 0; s < kShapes; ++s) {
        DeviceBuf<float> dout(size_t(B * Z));  // poisoned
        GdnDecodeArgs a = decode_args(L, dw, dA, ddt, dnw, dproj.p, ld, 1);
        a.kernel = shapes[s];
        a.out = dout.p;
        gdn_decode_batched(a, B, states[s].conv_table->p, states[s].rec_table->p, nullptr);
        TERN_CUDA(cudaGetLastError());
        out[s] = dout.host();
      }
      EXPECT_TRUE(all_finite(out[0])) << "cluster4_w16 outputs";
      for (int s = 1; s < kShapes; ++s) EXPECT_TRUE(same_bits(out[0], out[s])) << names[s] << " outputs";
      expect_states_match("after gdn_decode_batched");
    }
    EXPECT_FALSE(same_bits(states[0].rec[0]->host(), rec0)) << "the calls left sequence 0's recurrent state as it was";
  }
}

// Steps of more than one chunk (gdn_decode walks T = 1..kGdnDecodeMaxTokens tokens in chunks of 8): T = 9, 16, 17,
// 32 (and 8, one whole chunk), conv widths 4 and 6 (the kernels of 4 and of 8 taps), every launch shape
// (portable_split with its tickets), the states carried from step to step on the GPU and on the CPU alike. Each step
// runs three ways on each shape's own copies of the states:
//   long:  one call of T tokens keeping the states before each token (conv_keep, rec_keep);
//   plain: the same call without kept states (its own state copies);
//   one:   T calls of one token in order (its own state copies), the states downloaded before each token.
// (a) long against the CPU twin (outputs and recurrent state within tolerance, conv state exact); (b) long, plain
// and one bit for bit: outputs, final conv and recurrent states; (c) long's kept states bit for bit the states the
// one-token calls had before each token. The tickets must be back at zero after every call.
TEST(CudaGdnDecode, LongStepsMatchOneTokenCallsAndCpuTwin) {
  TERN_REQUIRE_GPU();
  static_assert(kGdnDecodeMaxTokens == 32, "the lengths below cover chunks of 8 up to 32 tokens");
  std::mt19937_64 rng(fresh_seed("CudaGdnDecodeLong"));
  using K = GdnDecodeArgs::Kernel;
  const K kShapes[] = {K::cluster8_w8, K::cluster8_w16,   K::cluster16_w8,  K::cluster4_w16,
                       K::portable,    K::portable_split, K::cluster2_w16, K::cluster4_w8, K::smem_w16};
  const char* const kNames[] = {"cluster8_w8", "cluster8_w16",   "cluster16_w8", "cluster4_w16", "portable",
                                "portable_split", "cluster2_w16", "cluster4_w8", "smem_w16"};
  constexpr int kShapeCount = sizeof(kShapes) / sizeof(kShapes[0]);
  for (int Ck : {4, 6}) {
    GdnLayer L(rng, Ck);
    const GdnDims& d = L.d;
    const int64_t C = d.C(), Z = int64_t(d.Hv) * d.dv;
    const int64_t ld = C + Z + 2 * d.Hv + 12;  // a row stride wider than the row, as a fused projection may leave
    const size_t conv_n = size_t((Ck - 1) * C), rec_n = size_t(d.Hv) * d.dv * d.dk;
    DeviceBuf<float> dw(L.conv_w), dA(L.A_log), ddt(L.dt_bias), dnw(L.norm_w);
    DeviceBuf<unsigned> tickets(std::vector<unsigned>(size_t(gdn_decode_ticket_count(d.Hk)), 0u));
    // [shape][long, plain, one]: the states of each way of running the steps.
    std::unique_ptr<DeviceBuf<float>> conv[kShapeCount][3], rec[kShapeCount][3];
    for (int v = 0; v < kShapeCount; ++v)
      for (int w = 0; w < 3; ++w) {
        conv[v][w] = std::make_unique<DeviceBuf<float>>(L.conv_state);
        rec[v][w] = std::make_unique<DeviceBuf<float>>(L.rec_state);
      }
    for (int64_t T : {9, 16, 17, 32, 8}) {
      const std::string step = "Ck=" + std::to_string(Ck) + " T=" + std::to_string(T);
      // qkv_raw and z ~ U(-2, 2), gates b, a ~ U(-3, 3); the padding columns are NaN.
      const std::vector<float> proj = random_proj(rng, d, T, ld);
      const auto ref = cpu_decode_twin(L, proj, ld, T);
      DeviceBuf<float> dproj(proj);
      for (int v = 0; v < kShapeCount; ++v) {
        const std::string tag = std::string(kNames[v]) + " " + step;
        SCOPED_TRACE(tag);
        GdnDecodeArgs a = decode_args(L, dw, dA, ddt, dnw, dproj.p, ld, T);
        a.kernel = kShapes[v];
        a.force_portable = kShapes[v] == K::portable;
        a.tickets = kShapes[v] == K::portable_split ? tickets.p : nullptr;
        // long: T tokens in one call, the states before each token kept.
        DeviceBuf<float> out_long(size_t(T * Z)), conv_keep(size_t(T) * conv_n),
            rec_keep(size_t(gdn_kept_rec_floats(d, T)));
        GdnDecodeArgs la = a;
        la.out = out_long.p;
        la.conv_state = conv[v][0]->p;
        la.rec_state = rec[v][0]->p;
        la.conv_keep = conv_keep.p;
        la.rec_keep = rec_keep.p;
        gdn_decode(la, nullptr);
        TERN_CUDA(cudaGetLastError());
        expect_tickets_zero(tickets, "long " + tag);
        // plain: the same without kept states.
        DeviceBuf<float> out_plain(size_t(T * Z));
        GdnDecodeArgs pa = a;
        pa.out = out_plain.p;
        pa.conv_state = conv[v][1]->p;
        pa.rec_state = rec[v][1]->p;
        gdn_decode(pa, nullptr);
        TERN_CUDA(cudaGetLastError());
        expect_tickets_zero(tickets, "plain " + tag);
        // one: T calls of one token, the states before each token downloaded.
        DeviceBuf<float> out_one(size_t(T * Z));
        std::vector<std::vector<float>> conv_before, rec_before;
        for (int64_t t = 0; t < T; ++t) {
          conv_before.push_back(conv[v][2]->host());
          rec_before.push_back(rec[v][2]->host());
          GdnDecodeArgs oa = a;
          oa.d.T = 1;
          oa.proj = dproj.p + t * ld;
          oa.out = out_one.p + t * Z;
          oa.conv_state = conv[v][2]->p;
          oa.rec_state = rec[v][2]->p;
          gdn_decode(oa, nullptr);
          TERN_CUDA(cudaGetLastError());
          expect_tickets_zero(tickets, "one-token call " + std::to_string(t) + " " + tag);
        }
        const auto got = out_long.host();
        const auto conv_got = conv[v][0]->host(), rec_got = rec[v][0]->host();
        // (a) the CPU twin
        expect_close(got, ref, 2e-5f * rms_of(ref), 2e-4f, "gdn_decode out " + tag);
        expect_close(conv_got, L.conv_state, 0.0f, 0.0f, "gdn_decode conv state " + tag);
        expect_close(rec_got, L.rec_state, 2e-5f * rms_of(L.rec_state), 2e-4f, "gdn_decode recurrent state " + tag);
        // (b) bit for bit: long, plain and one token at a time
        const auto one = out_one.host();
        EXPECT_TRUE(all_finite(got) && all_finite(one)) << "outputs";
        EXPECT_TRUE(same_bits(got, one)) << "outputs: T tokens in one call vs one token per call";
        EXPECT_TRUE(same_bits(got, out_plain.host())) << "outputs: with vs without kept states";
        EXPECT_TRUE(same_bits(conv_got, conv[v][2]->host())) << "conv state: one call vs one token per call";
        EXPECT_TRUE(same_bits(rec_got, rec[v][2]->host())) << "recurrent state: one call vs one token per call";
        EXPECT_TRUE(same_bits(conv_got, conv[v][1]->host())) << "conv state: with vs without kept states";
        EXPECT_TRUE(same_bits(rec_got, rec[v][1]->host())) << "recurrent state: with vs without kept states";
        EXPECT_FALSE(same_bits(rec_got, rec_before[0])) << "the call left the recurrent state as it was";
        // (c) the kept states: the one-token calls' states before each token (the recurrent ones as
        // gdn_state_replay rebuilds them from the state before token 0, poisoned first)
        const auto ck = conv_keep.host();
        for (int64_t t = 0; t < T; ++t) {
          const std::vector<float> ck_t(ck.begin() + t * int64_t(conv_n), ck.begin() + (t + 1) * int64_t(conv_n));
          EXPECT_TRUE(same_bits(ck_t, conv_before[size_t(t)])) << "kept conv state before token " << t;
          DeviceBuf<float> replayed(rec_n);  // poisoned
          const GdnReplay entry{replayed.p, rec_keep.p};
          gdn_state_replay(&entry, 1, d, int(t), nullptr);
          TERN_CUDA(cudaGetLastError());
          EXPECT_TRUE(same_bits(replayed.host(), rec_before[size_t(t)]))
              << "replayed recurrent state before token " << t;
        }
      }
    }
  }
}

// Prefill front end: conv1d_silu_qknorm + gdn_gates against the CPU conv, q/k norms and gates, over calls with the
// conv state carried (x read with a row stride wider than C, as the fused projection leaves it).
TEST(CudaGdnPrefill, ConvWithQkNormAndGatesMatchCpu) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaGdnPrefill"));
  GdnLayer L(rng);
  GdnDims d = L.d;
  cpu::GdnDims cd{d.Hk, d.Hv, d.dk, d.dv};
  const int64_t C = d.C(), ldx = C + 8;
  DeviceBuf<float> dw(L.conv_w), dstate(L.conv_state), dA(L.A_log), ddt(L.dt_bias);
  for (int64_t T : {1, 40, 300}) {
    d.T = T;
    std::vector<float> xs(size_t(T * ldx), std::nanf("")), x(size_t(T * C));
    for (int64_t t = 0; t < T; ++t) {
      const auto row = random_floats(rng, size_t(C), -2.0f, 2.0f);
      std::copy(row.begin(), row.end(), xs.begin() + t * ldx);
      std::copy(row.begin(), row.end(), x.begin() + t * C);
    }
    const auto a = random_floats(rng, size_t(T * d.Hv), -3.0f, 3.0f), b = random_floats(rng, size_t(T * d.Hv), -3.0f, 3.0f);
    std::vector<float> ref(x.size()), g(a.size()), beta(a.size());
    cpu::conv1d_causal_silu({.x = x.data(), .T = T, .C = C, .w = L.conv_w.data(), .Ck = L.Ck,
                             .state = L.conv_state.data(), .y = ref.data()});
    cpu::gdn_qk_norm(ref.data(), T, cd);
    cpu::gdn_gates(a.data(), b.data(), L.A_log.data(), L.dt_bias.data(), T, d.Hv, g.data(), beta.data());
    DeviceBuf<float> dx(xs), dy(x.size()), da(a), db(b), dg(g.size()), dbeta(g.size());
    conv1d_silu_qknorm(dx.p, ldx, T, C, L.Ck, dw.p, dstate.p, dy.p, int64_t(d.Hk) * d.dk, int64_t(d.Hk) * d.dk, d.dk,
                       nullptr);
    gdn_gates(db.p, da.p, dA.p, ddt.p, d, dg.p, dbeta.p, nullptr);
    TERN_CUDA(cudaGetLastError());
    const std::string tag = " T=" + std::to_string(T);
    expect_close(dy.host(), ref, 1e-6f, 1e-5f, "conv1d_silu_qknorm" + tag);
    expect_close(dstate.host(), L.conv_state, 0.0f, 0.0f, "conv1d_silu_qknorm state" + tag);
    expect_close(dg.host(), g, 1e-6f, 1e-5f, "gdn_gates log decay" + tag);
    expect_close(dbeta.host(), beta, 1e-6f, 1e-5f, "gdn_gates beta" + tag);
    // The same gates read with a row stride (b and a as columns of the prefill plan's in_proj output).
    GdnDims ds = d;
    ds.ld_ba = 2 * d.Hv + 3;
    std::vector<float> ba(size_t(T * ds.ld_ba), std::nanf(""));
    for (int64_t t = 0; t < T; ++t) {
      std::copy_n(b.begin() + t * d.Hv, d.Hv, ba.begin() + t * ds.ld_ba);
      std::copy_n(a.begin() + t * d.Hv, d.Hv, ba.begin() + t * ds.ld_ba + d.Hv);
    }
    DeviceBuf<float> dba(ba), dg2(g.size()), dbeta2(g.size());
    gdn_gates(dba.p, dba.p + d.Hv, dA.p, ddt.p, ds, dg2.p, dbeta2.p, nullptr);
    expect_close(dg2.host(), g, 1e-6f, 1e-5f, "gdn_gates log decay, strided" + tag);
    expect_close(dbeta2.host(), beta, 1e-6f, 1e-5f, "gdn_gates beta, strided" + tag);
  }
}

// max |got − ref| / max |ref|: printed so that the precision of each kernel shows in the log.
float normalized_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double worst = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = std::fabs(double(got[i]) - double(ref[i]));
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return float(worst / std::max(1e-30, double(max_abs(ref))));
}

// gdn_chunked, every kernel, against the CPU recurrence (the definition) and the CPU chunked form, at lengths around
// the chunk size and a long one; a non-zero state carried in and from each call to the next (each GPU kernel on its
// own device copy, the CPU forms on theirs).
TEST(CudaGdnChunked, EveryKernelMatchesCpuWithStateCarried) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaGdnChunked"));
  GdnDims d;  // real dims
  cpu::GdnDims cd{d.Hk, d.Hv, d.dk, d.dv};
  const int64_t C = d.C();
  struct Variant {
    GdnChunkedKernel kernel;
    int chunk;
    float tol;  // × max|ref|, absolute, plus the same relative
    const char* name;
    int ws_chunks = 0;  // two-pass: workspace for this many chunks (0: the whole call; 3: segments of 192 tokens)
  };
  const bool twopass = gdn_chunked_twopass_supported(d);
  std::vector<Variant> variants = {
      {GdnChunkedKernel::simt, 64, 2e-4f, "simt"},
      {GdnChunkedKernel::simt, 16, 2e-4f, "simt/16"},
  };
  if (gdn_chunked_tc_fits()) {
    variants.push_back({GdnChunkedKernel::tf32x3, 64, 2e-4f, "tf32x3"});
    variants.push_back({GdnChunkedKernel::tf32x3_slice16, 64, 2e-4f, "tf32x3/16"});
    variants.push_back({GdnChunkedKernel::tf32, 64, 5e-3f, "tf32"});
  } else {
    std::printf("[gdn chunked] the one-pass tensor-core kernel does not fit this device's shared memory: not tested\n");
  }
  if (twopass) {
    variants.push_back({GdnChunkedKernel::twopass_tf32x3, 64, 2e-4f, "2p-tf32x3"});
    variants.push_back({GdnChunkedKernel::twopass_tf32x3, 64, 2e-4f, "2p-x3/seg3", 3});
    variants.push_back({GdnChunkedKernel::twopass_mixed, 64, 3e-3f, "2p-mixed"});
    variants.push_back({GdnChunkedKernel::automatic, 64, 2e-4f, "automatic"});
  } else {
    std::printf("[gdn chunked] two-pass kernels not supported on this device: not tested\n");
  }
  // One workspace for the longest call (the segmented variant uses its first 3 chunks' worth).
  GdnDims dmax = d;
  dmax.T = 1000;
  const size_t ws_bytes = twopass ? gdn_chunked_workspace_bytes(dmax) : 0;
  DeviceBuf<float> workspace(std::max<size_t>(ws_bytes / sizeof(float), 1));  // poisoned: NaN
  const int kVariants = int(variants.size());
  std::vector<float> st_rec = random_floats(rng, size_t(d.Hv) * d.dv * d.dk, -0.3f, 0.3f), st_chk(st_rec);
  std::vector<std::unique_ptr<DeviceBuf<float>>> dstate;
  for (int v = 0; v < kVariants; ++v) dstate.push_back(std::make_unique<DeviceBuf<float>>(st_rec));
  const auto A_log = random_floats(rng, size_t(d.Hv), 0.0f, 2.7f), dt_bias = random_floats(rng, size_t(d.Hv), -1.0f, 1.0f);
  for (int64_t T : {1, 63, 64, 65, 200, 1000}) {
    d.T = T;
    auto qkv = random_floats(rng, size_t(T * C), -1.0f, 1.0f);
    const auto a = random_floats(rng, size_t(T * d.Hv), -3.0f, 3.0f), b = random_floats(rng, size_t(T * d.Hv), -3.0f, 3.0f);
    std::vector<float> g(size_t(T * d.Hv)), beta(g.size());
    cpu::gdn_gates(a.data(), b.data(), A_log.data(), dt_bias.data(), T, d.Hv, g.data(), beta.data());
    cpu::gdn_qk_norm(qkv.data(), T, cd);  // the kernel's inputs as gdn_prepare leaves them
    std::vector<float> o_rec(size_t(T * d.Hv * d.dv)), o_chk(o_rec.size());
    cpu::GdnArgs ga = gdn_args_over_qkv(qkv, C, g, beta, T, cd);
    ga.state = st_rec.data();
    ga.out = o_rec.data();
    cpu::gdn_recurrent(ga);
    ga.state = st_chk.data();
    ga.out = o_chk.data();
    cpu::gdn_chunked(ga);
    DeviceBuf<float> dqkv(qkv), dg(g), db(beta);
    for (int v = 0; v < kVariants; ++v) {
      const Variant& var = variants[v];
      DeviceBuf<float> o(o_rec.size());  // poisoned
      GdnDims d1 = d;
      d1.T = 1;
      const size_t wsb = var.ws_chunks ? size_t(var.ws_chunks) * gdn_chunked_workspace_bytes(d1) : ws_bytes;
      gdn_chunked(dqkv.p, dg.p, db.p, dstate[size_t(v)]->p, d, o.p, nullptr, var.chunk, var.kernel, workspace.p, wsb);
      TERN_CUDA(cudaGetLastError());
      const auto got_o = o.host(), got_s = dstate[size_t(v)]->host();
      const std::string tag = std::string(" ") + var.name + " T=" + std::to_string(T);
      std::printf("[gdn chunked] %-11s T=%-5lld max error / max |ref|: output %.2e, state %.2e\n", var.name,
                  static_cast<long long>(T), double(normalized_error(got_o, o_rec)),
                  double(normalized_error(got_s, st_rec)));
      expect_close(got_o, o_rec, var.tol * max_abs(o_rec), var.tol, "output vs cpu recurrent" + tag);
      expect_close(got_s, st_rec, var.tol * max_abs(st_rec), var.tol, "state vs cpu recurrent" + tag);
      expect_close(got_o, o_chk, var.tol * max_abs(o_chk), var.tol, "output vs cpu chunked" + tag);
      expect_close(got_s, st_chk, var.tol * max_abs(st_chk), var.tol, "state vs cpu chunked" + tag);
    }
  }
}

// The tensor-core kernel at a realistic operating point: keys that repeat (k·k ≈ 1, β ≈ 1, little decay: the
// triangular system is far from the identity) over 300 tokens, against the CPU recurrence.
TEST(CudaGdnChunked, TensorCoreKernelHoldsOnNearlyRepeatedKeys) {
  TERN_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed("CudaGdnChunkedRepeated"));
  GdnDims d;
  cpu::GdnDims cd{d.Hk, d.Hv, d.dk, d.dv};
  const int64_t C = d.C(), T = 300;
  d.T = T;
  auto qkv = random_floats(rng, size_t(T * C), -1.0f, 1.0f);
  const auto base = random_floats(rng, size_t(d.Hk) * d.dk, -1.0f, 1.0f);
  for (int64_t t = 0; t < T; ++t)  // k_t = base + small noise per key head
    for (int64_t i = 0; i < int64_t(d.Hk) * d.dk; ++i)
      qkv[size_t(t * C + int64_t(d.Hk) * d.dk + i)] = base[size_t(i)] + 0.05f * qkv[size_t(t * C + int64_t(d.Hk) * d.dk + i)];
  std::vector<float> g(size_t(T * d.Hv)), beta(g.size());
  for (auto& x : g) x = -std::uniform_real_distribution<float>(0.0f, 0.02f)(rng);
  for (auto& x : beta) x = std::uniform_real_distribution<float>(0.9f, 1.0f)(rng);
  cpu::gdn_qk_norm(qkv.data(), T, cd);
  std::vector<float> st = random_floats(rng, size_t(d.Hv) * d.dv * d.dk, -0.3f, 0.3f), o_rec(size_t(T * d.Hv * d.dv));
  const std::vector<float> st0 = st;  // the state before the call (st becomes the reference's state after it)
  DeviceBuf<float> dqkv(qkv), dg(g), db(beta);
  const size_t ws_bytes = gdn_chunked_workspace_bytes(d);
  DeviceBuf<float> workspace(std::max<size_t>(ws_bytes / sizeof(float), 1));
  cpu::GdnArgs ga = gdn_args_over_qkv(qkv, C, g, beta, T, cd);
  ga.state = st.data();
  ga.out = o_rec.data();
  cpu::gdn_recurrent(ga);
  struct Variant {
    GdnChunkedKernel kernel;
    const char* name;
    float tol;  // host emulation of the fused kernels measured 2.6e-6 (tf32x3) / 4.8e-3 (tf32)
  };
  std::vector<Variant> variants;
  if (gdn_chunked_tc_fits()) {
    variants.push_back({GdnChunkedKernel::tf32x3, "tf32x3", 5e-4f});
    variants.push_back({GdnChunkedKernel::tf32, "tf32", 2e-2f});
  }
  if (ws_bytes > 0) {
    variants.push_back({GdnChunkedKernel::twopass_tf32x3, "2p-tf32x3", 5e-4f});
    variants.push_back({GdnChunkedKernel::twopass_mixed, "2p-mixed", 2e-2f});
  }
  for (const Variant& var : variants) {
    DeviceBuf<float> o(o_rec.size()), ds(st0);
    gdn_chunked(dqkv.p, dg.p, db.p, ds.p, d, o.p, nullptr, 64, var.kernel, workspace.p, ws_bytes);
    const auto got_o = o.host(), got_s = ds.host();
    std::printf("[gdn chunked] repeated keys %s: max error / max |ref|: output %.2e, state %.2e\n", var.name,
                double(normalized_error(got_o, o_rec)), double(normalized_error(got_s, st)));
    expect_close(got_o, o_rec, var.tol * max_abs(o_rec), var.tol, std::string("repeated keys output ") + var.name);
    expect_close(got_s, st, var.tol * max_abs(st), var.tol, std::string("repeated keys state ") + var.name);
  }
}

}  // namespace
}  // namespace tern::cuda::test
