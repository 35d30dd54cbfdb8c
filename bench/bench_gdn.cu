// Gated DeltaNet kernels at the model's shapes (Hk 16, Hv 32, dk = dv = 128, C 8192, conv width 4):
//   decode:  gdn_decode at T = 1 (and 4), against the four-kernel path it replaces (conv1d_silu → gdn_prepare →
//            gdn_recurrent → gdn_gated_norm); bytes = state read + written, conv state read + written, the in_proj
//            row, conv weights, the output.
//   prefill: one layer at T = 4096: gdn_chunked (each kernel; the two-pass ones with a workspace for all 4096
//            tokens, their bytes counting the workspace written and read back), gdn_recurrent, conv1d_silu (and with
//            the q/k norms fused), gdn_prepare, gdn_gates, gdn_gated_norm.
//            FLOPs of the chunked form: 2·T·Hv·(3·dk·dv + 2·64·dk + 2·64·dv) (Q·S, K·S, the state update; the two
//            64-wide grams; T·R and P·Δ).
//   Decode also times each launch shape of gdn_decode at T = 1.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/workbench.h"
#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/kernels/conv1d/conv1d.cuh"
#include "cuda/kernels/gdn/gdn.cuh"

namespace tern::bench {
namespace {

using cuda::GdnDims;
constexpr int kCk = 4;

// The per-layer constants, shared by every case.
struct Layer {
  GdnDims d;
  float *conv_w, *A_log, *dt_bias, *norm_w;
};
const Layer& layer() {
  static const Layer l = [] {
    Layer x;
    x.conv_w = bench_alloc_random_floats(size_t(x.d.C() * kCk), -0.5f, 0.5f, 11);
    x.A_log = bench_alloc_random_floats(size_t(x.d.Hv), 0.0f, 2.0f, 12);
    x.dt_bias = bench_alloc_random_floats(size_t(x.d.Hv), -1.0f, 1.0f, 13);
    x.norm_w = bench_alloc_random_floats(size_t(x.d.dv), 0.5f, 1.5f, 14);
    return x;
  }();
  return l;
}

// Decode: `copies` independent layer states and in_proj rows, so that timed runs read device memory.
struct DecodeSet {
  int64_t ld = 0;
  int copies = 0;
  std::vector<float*> proj, conv_state, rec_state, out;
  unsigned* tickets = nullptr;  // gdn_decode's tickets (zero), as the runner passes them
  // unfused path scratch
  std::vector<float*> qkv, g, beta, o;
};
DecodeSet& decode_set(int64_t T) {
  static std::unique_ptr<DecodeSet> sets[9];
  auto& s = sets[T];
  if (!s) {
    s = std::make_unique<DecodeSet>();
    const GdnDims& d = layer().d;
    const int64_t C = d.C(), Z = int64_t(d.Hv) * d.dv;
    s->ld = C + Z + 2 * d.Hv;
    const double per_copy = 4.0 * (2.0 * Z * d.dk + T * s->ld + (kCk - 1) * C);
    s->copies = bench_copies_for(per_copy);
    for (int c = 0; c < s->copies; ++c) {
      s->proj.push_back(bench_alloc_random_floats(size_t(T * s->ld), -1.0f, 1.0f, 100 + c));
      s->conv_state.push_back(bench_alloc_random_floats(size_t((kCk - 1) * C), -1.0f, 1.0f, 200 + c));
      s->rec_state.push_back(bench_alloc_random_floats(size_t(Z * d.dk), -0.1f, 0.1f, 300 + c));
      s->out.push_back(bench_alloc_random_floats(size_t(T * Z), 0.0f, 1.0f, 400 + c));
      s->qkv.push_back(bench_alloc_random_floats(size_t(T * C), 0.0f, 1.0f, 500 + c));
      s->g.push_back(bench_alloc_random_floats(size_t(T * d.Hv), 0.0f, 1.0f, 600 + c));
      s->beta.push_back(bench_alloc_random_floats(size_t(T * d.Hv), 0.0f, 1.0f, 700 + c));
      s->o.push_back(bench_alloc_random_floats(size_t(T * Z), 0.0f, 1.0f, 800 + c));
    }
    const size_t tickets = size_t(cuda::gdn_decode_ticket_count(d.Hk));
    TERN_CUDA(cudaMalloc(&s->tickets, tickets * sizeof(unsigned)));
    TERN_CUDA(cudaMemset(s->tickets, 0, tickets * sizeof(unsigned)));
    TERN_CUDA(cudaDeviceSynchronize());
  }
  return *s;
}

// gdn_decode's arguments for the layer's constants over T tokens of proj (row stride ld) into out; the states are
// the caller's to set.
cuda::GdnDecodeArgs decode_args(const float* proj, int64_t ld, float* out, int64_t T, unsigned* tickets) {
  const Layer& l = layer();
  cuda::GdnDecodeArgs a;
  a.proj = proj;
  a.ld_proj = ld;
  a.conv_w = l.conv_w;
  a.Ck = kCk;
  a.A_log = l.A_log;
  a.dt_bias = l.dt_bias;
  a.norm_w = l.norm_w;
  a.eps = 1e-6f;
  a.d = l.d;
  a.d.T = T;
  a.out = out;
  a.tickets = tickets;
  return a;
}

// Prefill: one layer's inputs at T = 4096 (each larger than L2: one copy).
constexpr int64_t kPrefillT = 4096;
struct PrefillSet {
  float *raw, *qkv, *z, *b, *a, *g, *beta, *state, *o, *out, *conv_state, *conv_out;
  void* ws = nullptr;  // the two-pass gdn_chunked workspace for kPrefillT tokens
  size_t ws_bytes = 0;
};
PrefillSet& prefill_set() {
  static const std::unique_ptr<PrefillSet> p = [] {
    auto x = std::make_unique<PrefillSet>();
    const GdnDims& d = layer().d;
    const int64_t T = kPrefillT, C = d.C(), Z = int64_t(d.Hv) * d.dv;
    x->raw = bench_alloc_random_floats(size_t(T * C), -1.0f, 1.0f, 21);
    // q/k of unit norm per head as gdn_prepare leaves them (q scaled by 1/√dk): U(-a, a) with a = √(3/dk)
    x->qkv = bench_alloc_random_floats(size_t(T * C), -0.153f, 0.153f, 22);
    x->z = bench_alloc_random_floats(size_t(T * Z), -2.0f, 2.0f, 23);
    x->b = bench_alloc_random_floats(size_t(T * d.Hv), -3.0f, 3.0f, 24);
    x->a = bench_alloc_random_floats(size_t(T * d.Hv), -3.0f, 3.0f, 25);
    x->g = bench_alloc_random_floats(size_t(T * d.Hv), -0.2f, -0.001f, 26);
    x->beta = bench_alloc_random_floats(size_t(T * d.Hv), 0.0f, 1.0f, 27);
    x->state = bench_alloc_random_floats(size_t(Z * d.dk), -0.1f, 0.1f, 28);
    x->o = bench_alloc_random_floats(size_t(T * Z), -1.0f, 1.0f, 29);
    x->out = bench_alloc_random_floats(size_t(T * Z), 0.0f, 1.0f, 30);
    x->conv_state = bench_alloc_random_floats(size_t((kCk - 1) * C), -1.0f, 1.0f, 31);
    x->conv_out = bench_alloc_random_floats(size_t(T * C), -1.0f, 1.0f, 32);
    GdnDims dt = d;
    dt.T = T;
    x->ws_bytes = cuda::gdn_chunked_workspace_bytes(dt);
    if (x->ws_bytes) x->ws = bench_alloc_random_bytes(x->ws_bytes, 33);
    TERN_CUDA(cudaDeviceSynchronize());
    return x;
  }();
  return *p;
}

}  // namespace

TERN_BENCH_CASES(gdn) {
  const GdnDims d0;
  const double C = double(d0.C()), Z = double(d0.Hv) * d0.dv, state_bytes = 4.0 * Z * d0.dk;

  // ---- decode ----
  for (int64_t T : {1, 4}) {
    const double ld = C + Z + 2.0 * d0.Hv;
    const double bytes = 2 * state_bytes + 2 * 4.0 * (kCk - 1) * C + 4.0 * T * ld + 4.0 * C * kCk + 4.0 * T * Z;
    Case fused;
    fused.group = "decode";
    fused.name = "gdn_decode T=" + std::to_string(T) + " (conv+norms+gates+delta rule+gated norm, one kernel)";
    fused.bytes = bytes;
    fused.flops = 2.0 * T * Z * d0.dk * 3;
    fused.setup = [T] { decode_set(T); };
    fused.run = [T](cudaStream_t stream, int rep) {
      DecodeSet& s = decode_set(T);
      const int c = rep % s.copies;
      cuda::GdnDecodeArgs a = decode_args(s.proj[size_t(c)], s.ld, s.out[size_t(c)], T, s.tickets);
      a.conv_state = s.conv_state[size_t(c)];
      a.rec_state = s.rec_state[size_t(c)];
      cuda::gdn_decode(a, stream);
    };
    cases.push_back(fused);
    // Each launch shape of the fused kernel (automatic = cluster4_w16 on sm_90, else portable_split).
    using DK = cuda::GdnDecodeArgs::Kernel;
    const std::pair<DK, const char*> shapes[] = {{DK::cluster8_w16, "clusters 8 x 16 warps x 2 rows"},
                                                 {DK::cluster16_w8, "clusters 16 x 8 warps x 2 rows"},
                                                 {DK::cluster4_w16, "clusters 4 x 16 warps x 4 rows"},
                                                 {DK::cluster2_w16, "clusters 2 x 16 warps x 8 rows"},
                                                 {DK::cluster4_w8, "clusters 4 x 8 warps x 8 rows"},
                                                 {DK::smem_w16, "blocks of 16 warps x 16 rows, 12 in smem"},
                                                 {DK::portable, "portable, 16 blocks x 32 warps"},
                                                 {DK::portable_split, "portable split, 32 blocks x 32 warps"}};
    for (const auto& [kind, label] : shapes) {
      if (T != 1) break;
      Case v = fused;
      v.name = "gdn_decode T=" + std::to_string(T) + " " + label;
      const DK k = kind;
      v.run = [T, k](cudaStream_t stream, int rep) {
        DecodeSet& s = decode_set(T);
        const int c = rep % s.copies;
        cuda::GdnDecodeArgs a = decode_args(s.proj[size_t(c)], s.ld, s.out[size_t(c)], T, s.tickets);
        a.conv_state = s.conv_state[size_t(c)];
        a.rec_state = s.rec_state[size_t(c)];
        a.kernel = k;
        cuda::gdn_decode(a, stream);
      };
      cases.push_back(v);
    }

    Case unfused = fused;
    unfused.name = "gdn mixer core T=" + std::to_string(T) + " unfused (conv1d, prepare, recurrent, gated norm)";
    unfused.run = [T](cudaStream_t stream, int rep) {
      DecodeSet& s = decode_set(T);
      const int c = rep % s.copies;
      const Layer& l = layer();
      GdnDims d = l.d;
      d.T = T;
      const int64_t Cc = d.C(), Zc = int64_t(d.Hv) * d.dv;
      const float* proj = s.proj[size_t(c)];
      cuda::conv1d_silu(proj, s.ld, T, Cc, kCk, l.conv_w, s.conv_state[size_t(c)], s.qkv[size_t(c)], stream);
      // b and a are columns of proj (row stride ld): gdn_prepare wants [T, Hv] rows; at T = 1 the two coincide.
      const float* b = proj + Cc + Zc;
      cuda::gdn_prepare(s.qkv[size_t(c)], b, b + d.Hv, l.A_log, l.dt_bias, d, s.g[size_t(c)], s.beta[size_t(c)], stream);
      cuda::gdn_recurrent(s.qkv[size_t(c)], s.g[size_t(c)], s.beta[size_t(c)], s.rec_state[size_t(c)], d, s.o[size_t(c)],
                          stream);
      cuda::gdn_gated_norm(s.o[size_t(c)], proj + Cc, l.norm_w, 1e-6f, d, s.out[size_t(c)], stream);
    };
    if (T == 1) cases.push_back(unfused);  // (at T > 1 the strided b/a/z would need copies: T = 1 only)
  }

  // ---- the batched step's GDN core: one token of each of B sequences (gdn_decode_batched, the automatic shape) ----
  for (const int B : {1, 2, 4, 8, 16, 32}) {
    struct Batch {
      std::vector<float**> conv, rec;  // [rotation] device tables of B states
      float *proj = nullptr, *out = nullptr;
    };
    auto bt = std::make_shared<Batch>();
    const double ld = C + Z + 2.0 * d0.Hv;
    Case c;
    c.group = "decode";
    c.name = "gdn_decode_batched B=" + std::to_string(B) + " (one token of each of B sequences)";
    c.bytes = B * (2 * state_bytes + 2 * 4.0 * (kCk - 1) * C + 4.0 * ld + 4.0 * Z) + 4.0 * C * kCk;
    c.flops = 2.0 * B * Z * d0.dk * 3;
    c.setup = [bt, B] {
      if (!bt->conv.empty()) return;
      DecodeSet& s = decode_set(1);  // its copies' states, B of them a rotation
      const GdnDims& d = layer().d;
      const int64_t Zc = int64_t(d.Hv) * d.dv;
      bt->proj = bench_alloc_random_floats(size_t(B * s.ld), -1.0f, 1.0f, 900 + B);
      bt->out = bench_alloc_random_floats(size_t(B * Zc), 0.0f, 1.0f, 950 + B);
      const int rotations = std::max(1, s.copies / B);
      for (int r = 0; r < rotations; ++r) {
        std::vector<float*> conv(static_cast<size_t>(B)), rec(static_cast<size_t>(B));
        for (int b = 0; b < B; ++b) {
          conv[size_t(b)] = s.conv_state[size_t((r * B + b) % s.copies)];
          rec[size_t(b)] = s.rec_state[size_t((r * B + b) % s.copies)];
        }
        float** dc = nullptr;
        float** dr = nullptr;
        TERN_CUDA(cudaMalloc(&dc, size_t(B) * sizeof(float*)));
        TERN_CUDA(cudaMalloc(&dr, size_t(B) * sizeof(float*)));
        TERN_CUDA(cudaMemcpy(dc, conv.data(), size_t(B) * sizeof(float*), cudaMemcpyHostToDevice));
        TERN_CUDA(cudaMemcpy(dr, rec.data(), size_t(B) * sizeof(float*), cudaMemcpyHostToDevice));
        bt->conv.push_back(dc);
        bt->rec.push_back(dr);
      }
    };
    c.run = [bt, B](cudaStream_t stream, int rep) {
      DecodeSet& s = decode_set(1);
      const size_t r = size_t(rep) % bt->conv.size();
      cuda::gdn_decode_batched(decode_args(bt->proj, s.ld, bt->out, 1, s.tickets), B, bt->conv[r], bt->rec[r], stream);
    };
    cases.push_back(c);
  }

  // ---- prefill, one layer at T = 4096 ----
  const double T = double(kPrefillT);
  const double chunk_flops = 2.0 * T * d0.Hv * (3.0 * d0.dk * d0.dv + 2.0 * 64 * d0.dk + 2.0 * 64 * d0.dv);
  const double chunk_bytes = 4.0 * T * (C + 2.0 * d0.Hv + Z) + 2 * state_bytes;  // qkv, g, β in; o out; state
  struct Variant {
    cuda::GdnChunkedKernel k;
    int chunk;
    const char* name;
    bool workspace = false;
  };
  for (const Variant& v : {Variant{cuda::GdnChunkedKernel::twopass_tf32x3, 64, "two-pass tf32x3", true},
                           Variant{cuda::GdnChunkedKernel::twopass_mixed, 64, "two-pass mixed (output tf32)", true},
                           Variant{cuda::GdnChunkedKernel::tf32x3, 64, "tf32x3"},
                           Variant{cuda::GdnChunkedKernel::tf32, 64, "tf32"},
                           Variant{cuda::GdnChunkedKernel::tf32x3_slice16, 64, "tf32x3, 16-row slices"},
                           Variant{cuda::GdnChunkedKernel::simt, 64, "simt fp32 (old)"}}) {
    Case c;
    c.group = "prefill";
    c.name = std::string("gdn_chunked ") + v.name + " T=4096 (per layer)";
    c.bytes = chunk_bytes;
    c.flops = chunk_flops;
    c.setup = [] { prefill_set(); };
    c.run = [v](cudaStream_t stream, int) {
      PrefillSet& p = prefill_set();
      GdnDims d = layer().d;
      d.T = kPrefillT;
      cuda::gdn_chunked(p.qkv, p.g, p.beta, p.state, d, p.o, stream, v.chunk, v.k, v.workspace ? p.ws : nullptr,
                        v.workspace ? p.ws_bytes : 0);
    };
    if (v.workspace) {
      GdnDims d = d0;
      d.T = kPrefillT;
      if (cuda::gdn_chunked_workspace_bytes(d) == 0) continue;  // not on this device
      c.bytes += 2.0 * double(cuda::gdn_chunked_workspace_bytes(d));  // the workspace written, then read
    }
    cases.push_back(c);
  }
  {
    Case c;
    c.group = "prefill";
    c.name = "gdn_recurrent T=4096 (per layer)";
    c.bytes = chunk_bytes;
    c.flops = 2.0 * T * Z * d0.dk * 3;
    c.setup = [] { prefill_set(); };
    c.run = [](cudaStream_t stream, int) {
      PrefillSet& p = prefill_set();
      GdnDims d = layer().d;
      d.T = kPrefillT;
      cuda::gdn_recurrent(p.qkv, p.g, p.beta, p.state, d, p.o, stream);
    };
    cases.push_back(c);
  }
  {
    Case c;
    c.group = "prefill";
    c.name = "conv1d_silu T=4096 C=8192";
    c.bytes = 2 * 4.0 * T * C;
    c.flops = 2.0 * T * C * kCk;
    c.setup = [] { prefill_set(); };
    c.run = [](cudaStream_t stream, int) {
      PrefillSet& p = prefill_set();
      const Layer& l = layer();
      cuda::conv1d_silu(p.raw, l.d.C(), kPrefillT, l.d.C(), kCk, l.conv_w, p.conv_state, p.conv_out, stream);
    };
    cases.push_back(c);
  }
  {
    Case c;
    c.group = "prefill";
    c.name = "conv1d_silu_qknorm T=4096 C=8192 (conv + SiLU + q/k L2 norms)";
    c.bytes = 2 * 4.0 * T * C;
    c.flops = 2.0 * T * C * kCk;
    c.setup = [] { prefill_set(); };
    c.run = [](cudaStream_t stream, int) {
      PrefillSet& p = prefill_set();
      const Layer& l = layer();
      const int64_t qk = int64_t(l.d.Hk) * l.d.dk;
      cuda::conv1d_silu_qknorm(p.raw, l.d.C(), kPrefillT, l.d.C(), kCk, l.conv_w, p.conv_state, p.conv_out, qk, qk,
                               l.d.dk, stream);
    };
    cases.push_back(c);
  }
  {
    Case c;
    c.group = "prefill";
    c.name = "gdn_gates T=4096";
    c.bytes = 4.0 * T * 4.0 * d0.Hv;
    c.setup = [] { prefill_set(); };
    c.run = [](cudaStream_t stream, int) {
      PrefillSet& p = prefill_set();
      const Layer& l = layer();
      GdnDims d = l.d;
      d.T = kPrefillT;
      cuda::gdn_gates(p.b, p.a, l.A_log, l.dt_bias, d, p.g, p.beta, stream);
    };
    cases.push_back(c);
  }
  {
    Case c;
    c.group = "prefill";
    c.name = "gdn_prepare T=4096 (q/k norms in place, gates)";
    c.bytes = 4.0 * T * (2 * 2.0 * d0.Hk * d0.dk + 4.0 * d0.Hv);
    c.setup = [] { prefill_set(); };
    c.run = [](cudaStream_t stream, int) {
      PrefillSet& p = prefill_set();
      const Layer& l = layer();
      GdnDims d = l.d;
      d.T = kPrefillT;
      cuda::gdn_prepare(p.conv_out, p.b, p.a, l.A_log, l.dt_bias, d, p.g, p.beta, stream);
    };
    cases.push_back(c);
  }
  {
    Case c;
    c.group = "prefill";
    c.name = "gdn_gated_norm T=4096";
    c.bytes = 3 * 4.0 * T * Z;
    c.setup = [] { prefill_set(); };
    c.run = [](cudaStream_t stream, int) {
      PrefillSet& p = prefill_set();
      const Layer& l = layer();
      GdnDims d = l.d;
      d.T = kPrefillT;
      cuda::gdn_gated_norm(p.o, p.z, l.norm_w, 1e-6f, d, p.out, stream);
    };
    cases.push_back(c);
  }
}

}  // namespace tern::bench
