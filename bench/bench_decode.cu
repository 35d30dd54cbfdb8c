// Workbench cases of the decode matrix-vector kernels (cuda::qmv) and the decode MoE block (cuda::moe_decode) at the
// model's real shapes. Bytes are the fewest the kernel must read: the weight rows it uses (4-bit: cols/2 + 4 bytes of
// scale and bias per 64 columns), plus activations. Weight copies rotate (bench_copies_for) so that timed runs read
// device memory; the MoE cases rotate inputs whose routing differs, over 4 copies of the expert stacks.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/workbench.h"
#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/kernels/moe/moe_decode.cuh"
#include "cuda/kernels/qmv/qmv.cuh"
#include "cuda/kernels/qmv/qmv_dp4a.cuh"
#include "cuda/kernels/qmv/qmv_dp4a_mma.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::bench {
namespace {

using cuda::DMat;

// Random bits → bf16 of magnitude in [2^-7, 2^-6) with a random sign (sane scales and biases: the MoE routing must
// not see NaNs).
__global__ void sane_bf16_kernel(uint16_t* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint16_t((p[i] & 0x807Fu) | 0x3C00u);
}

const uint16_t* sane_bf16(size_t n, uint64_t seed) {
  auto* p = static_cast<uint16_t*>(bench_alloc_random_bytes(n * 2, seed));
  sane_bf16_kernel<<<1024, 256>>>(p, n);
  TERN_CUDA(cudaGetLastError());
  return p;
}

DMat random_quant(WeightFormat f, int64_t experts, int64_t rows, int64_t cols, uint64_t seed) {
  DMat w;
  w.format = f;
  w.experts = experts;
  w.rows = rows;
  w.cols = cols;
  w.group_size = 64;
  w.row_words = f == WeightFormat::affine4 ? cols / 8 : cols / 4;
  w.groups_per_row = cols / 64;
  const size_t n = size_t(experts * rows);
  w.data = bench_alloc_random_bytes(n * size_t(w.row_words) * 4, seed);
  w.scales = sane_bf16(n * size_t(w.groups_per_row), seed + 1);
  w.biases = sane_bf16(n * size_t(w.groups_per_row), seed + 2);
  return w;
}

double quant_bytes(WeightFormat f, int64_t rows, int64_t cols) {
  return double(rows) * double(cols * (f == WeightFormat::affine4 ? 4 : 8) / 8 + cols / 64 * 4);
}

// ---- qmv ------------------------------------------------------------------------------------------------------

struct QmvData {
  std::vector<DMat> w;
  std::vector<float*> x;
  float* norm_w = nullptr;
  float* y = nullptr;
};

// Tuning of the tensor-core kernels for one case: ring depth and blocks per SM (0: the defaults), step variant
// (-1: the default; 0: 2 groups per step, the previous kernel; 1: 4 groups per step; 2: qmv, 1 through cp.async).
struct Tune {
  int depth = 0, bps = 0, variant = -1;
  int dp4a_rows = 0;  // variant 3: rows per warp batch (0: the default)
  bool hot = false;   // one weight copy: timed runs read it from L2 (what the kernel does without DRAM latency)
  bool l2_down = false; // the MoE gate_up asks L2 for the chosen experts' down matrices (MoeDecodeWeights)
  std::string label() const {
    std::string s;
    if (l2_down) s += "L2 down ahead";
    if (depth) s += "depth " + std::to_string(depth) + ", " + std::to_string(bps) + " block/SM";
    if (variant >= 0) s += (s.empty() ? "" : ", ") + std::string("variant ") + std::to_string(variant);
    if (dp4a_rows) s += (s.empty() ? "" : ", ") + std::to_string(dp4a_rows) + " rows/batch";
    if (hot) s += (s.empty() ? "" : ", ") + std::string("L2-hot");
    return s.empty() ? s : " [" + s + "]";
  }
  void apply() const {
    static const cuda::qtile::Tuning base = cuda::qtile::tuning();  // TERN_QMV_* or built-in
    cuda::qtile::Tuning t = base;
    if (depth) {
      t.depth = depth;
      t.blocks_per_sm = bps;
    }
    if (variant >= 0) t.variant = variant;
    cuda::qtile::set_tuning(t);
    cuda::qmv_dp4a_set_rows_per_batch(dp4a_rows ? dp4a_rows : 2);
  }
};

void add_qmv(CaseList& cases, const char* what, int64_t rows, int64_t cols, int T, bool norm, bool accumulate,
             Tune tune = {}) {
  const double wbytes = quant_bytes(WeightFormat::affine4, rows, cols);
  const double bytes = wbytes + double(T) * cols * 4 + double(T) * rows * 4 * (accumulate ? 2 : 1) + (norm ? cols * 4 : 0);
  auto d = std::make_shared<QmvData>();
  Case c;
  c.group = "decode";
  c.name = std::string("qmv 4-bit ") + what + " " + std::to_string(rows) + "x" + std::to_string(cols) +
           " T=" + std::to_string(T) + tune.label();
  c.bytes = bytes;
  c.flops = 2.0 * double(rows) * double(cols) * T;
  const bool hot = tune.hot;
  c.setup = [d, rows, cols, T, wbytes, hot] {
    if (!d->w.empty()) return;
    const int copies = hot ? 1 : bench_copies_for(wbytes);
    for (int i = 0; i < copies; ++i) {
      d->w.push_back(random_quant(WeightFormat::affine4, 1, rows, cols, 100 + 7 * i));
      d->x.push_back(bench_alloc_random_floats(size_t(T * cols), -2.0f, 2.0f, 200 + 7 * i));
    }
    d->norm_w = bench_alloc_random_floats(size_t(cols), 0.5f, 1.5f, 300);
    d->y = bench_alloc_random_floats(size_t(T * rows), -1.0f, 1.0f, 400);
  };
  c.run = [d, rows, cols, T, norm, accumulate, tune](cudaStream_t stream, int rep) {
    tune.apply();
    const size_t i = size_t(rep) % d->w.size();
    cuda::QmvArgs a;
    a.w = d->w[i];
    a.x = d->x[i];
    a.ldx = cols;
    a.T = T;
    a.norm_w = norm ? d->norm_w : nullptr;
    a.y = d->y;
    a.ldy = rows;
    a.accumulate = accumulate;
    cuda::qmv(a, stream);
  };
  cases.push_back(std::move(c));
}

// ---- the batched step's products (qmv_dp4a_batched) and MoE block (moe_decode_batched) -------------------------

// B tokens through qmv_dp4a_batched as the batched step runs it: with activation scratch, its tables either written
// by the kernel before (tables_written: the producer tables of the step, quantised once here in the setup) or by
// the product's own pre-quantising launch. B = 1 runs the one-token kernel. Bytes: the weights once, x, y.
void add_qmv_batched(CaseList& cases, const char* what, int64_t rows, int64_t cols, int B, bool norm, bool accumulate,
                     bool tables_written) {
  struct Data {
    std::vector<DMat> w;
    float* x = nullptr;
    float* norm_w = nullptr;
    float* y = nullptr;
    void* xq = nullptr;
    size_t xq_bytes = 0;
  };
  auto d = std::make_shared<Data>();
  const double wbytes = quant_bytes(WeightFormat::affine4, rows, cols);
  Case c;
  c.group = "decode";
  c.name = std::string("qmv batched 4-bit ") + what + " " + std::to_string(rows) + "x" + std::to_string(cols) +
           " B=" + std::to_string(B) + (B == 1 ? "" : tables_written ? " [tables written before]" : " [prequant]");
  c.bytes = wbytes + double(B) * cols * 4 + double(B) * rows * 4 * (accumulate ? 2 : 1) + (norm ? cols * 4 : 0);
  c.flops = 2.0 * double(rows) * double(cols) * B;
  c.setup = [d, rows, cols, B, wbytes, norm, tables_written] {
    if (!d->w.empty()) return;
    const int copies = bench_copies_for(wbytes);
    for (int i = 0; i < copies; ++i) d->w.push_back(random_quant(WeightFormat::affine4, 1, rows, cols, 150 + 7 * i));
    d->x = bench_alloc_random_floats(size_t(B * cols), -2.0f, 2.0f, 250);
    d->norm_w = bench_alloc_random_floats(size_t(cols), 0.5f, 1.5f, 350);
    d->y = bench_alloc_random_floats(size_t(B * rows), -1.0f, 1.0f, 450);
    d->xq_bytes = cuda::qmv_dp4a_mma_scratch_bytes(B, cols);
    if (d->xq_bytes) {
      TERN_CUDA(cudaMalloc(&d->xq, d->xq_bytes));
      TERN_CUDA(cudaMemset(d->xq, 0, d->xq_bytes));
      if (tables_written && B >= 2)
        cuda::qmv_dp4a_mma_quantize(d->x, cols, cols, norm ? d->norm_w : nullptr, 1e-6f, B, d->xq, d->xq_bytes,
                                    nullptr);
    }
    TERN_CUDA(cudaDeviceSynchronize());
  };
  c.run = [d, cols, rows, B, norm, accumulate, tables_written](cudaStream_t stream, int rep) {
    Tune{0, 0, 3}.apply();  // the integer one-token kernels, which the batched forms match
    cuda::QmvArgs a;
    a.w = d->w[size_t(rep) % d->w.size()];
    a.x = d->x;
    a.ldx = cols;
    a.norm_w = norm ? d->norm_w : nullptr;
    a.y = d->y;
    a.ldy = rows;
    a.accumulate = accumulate;
    a.xq = d->xq;
    a.xq_bytes = d->xq_bytes;
    a.xq_written = tables_written;
    cuda::qmv_dp4a_batched(a, B, stream);
  };
  cases.push_back(std::move(c));
}

// ---- the read roofline ------------------------------------------------------------------------------------------

// Reads n16 uint4 with the weight loads of the qmv kernels. Each thread issues its N loads of a round together
// (predicated past the end) before it uses any, so a grid of ceil(n16 / (256·N)) blocks that fits the GPU at once
// has every byte in flight from the start: one DRAM round trip plus the transfer, the least any kernel reading these
// bytes can take. Larger inputs loop (rounds of N loads per thread, the resident blocks interleaved). Writes one word
// only when the XOR of everything is a value random data practically never gives (so nothing is optimised away).
template <int N>
__global__ void read_roofline_kernel(const uint4* p, int64_t n16, uint32_t* out) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n16; i += N * stride) {
    uint4 v[N];
#pragma unroll
    for (int k = 0; k < N; ++k)
      v[k] = i + k * stride < n16 ? cuda::qtile::ld_weights_u4(p + i + k * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int k = 0; k < N; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  if (acc == 0x9e3779b9u) *out = acc;
}

// N: loads per thread and round (1, 2, 4, 8 or 16); the grid is capped at 8 blocks of 256 threads per SM.
void add_read_roofline(CaseList& cases, const std::string& what, double bytes, int N) {
  struct Data {
    std::vector<const uint4*> copies;
    uint32_t* out = nullptr;
  };
  auto d = std::make_shared<Data>();
  const int64_t n16 = int64_t(bytes / 16);
  Case c;
  c.group = "decode";
  c.name = "read roofline " + what + " (" + std::to_string(int64_t(bytes / 1e3)) + " KB) [" + std::to_string(N) +
           " loads/thread]";
  c.bytes = double(n16) * 16.0;
  c.setup = [d, n16] {
    if (!d->copies.empty()) return;
    const int copies = bench_copies_for(double(n16) * 16.0);
    for (int i = 0; i < copies; ++i)
      d->copies.push_back(static_cast<const uint4*>(bench_alloc_random_bytes(size_t(n16) * 16, 900 + i)));
    d->out = static_cast<uint32_t*>(bench_alloc_random_bytes(4, 999));
  };
  c.run = [d, n16, N](cudaStream_t stream, int rep) {
    int dev = 0, sms = 0;
    TERN_CUDA(cudaGetDevice(&dev));
    TERN_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(int64_t(sms) * 8, (n16 + 256 * N - 1) / (256 * N)));
    const uint4* src = d->copies[size_t(rep) % d->copies.size()];
    const dim3 grid{unsigned(blocks)}, block{256};
    switch (N) {
      case 1: read_roofline_kernel<1><<<grid, block, 0, stream>>>(src, n16, d->out); break;
      case 2: read_roofline_kernel<2><<<grid, block, 0, stream>>>(src, n16, d->out); break;
      case 4: read_roofline_kernel<4><<<grid, block, 0, stream>>>(src, n16, d->out); break;
      case 8: read_roofline_kernel<8><<<grid, block, 0, stream>>>(src, n16, d->out); break;
      default: read_roofline_kernel<16><<<grid, block, 0, stream>>>(src, n16, d->out); break;
    }
  };
  cases.push_back(std::move(c));
}

// ---- MoE ------------------------------------------------------------------------------------------------------

constexpr int kE = 256, kK = 8;
constexpr int64_t kD = 2048, kF = 512;
constexpr int kExpertCopies = 4;

// Weights shared by every MoE case (allocated once): router, shared expert per rotation copy; the routed expert
// stacks in kExpertCopies copies (a rep uses copy rep % kExpertCopies with its own routing).
struct MoeData {
  int copies = 0;
  std::vector<cuda::MoeDecodeWeights> w;  // [copies]
  std::vector<float*> hidden;              // [copies] [T, D] inputs (routing differs per copy)
  std::vector<void*> scratch;              // [copies]
  std::vector<cuda::MoeDecodeScratch> s;
  int T = 0;
};

std::shared_ptr<MoeData> moe_data(int T) {
  static std::map<int, std::shared_ptr<MoeData>> cache;
  auto& d = cache[T];
  if (d) return d;
  d = std::make_shared<MoeData>();
  d->T = T;
  const double per_run = 9.0 * T * (2 * quant_bytes(WeightFormat::affine4, kF, kD) + quant_bytes(WeightFormat::affine4, kD, kF));
  d->copies = std::max(bench_copies_for(per_run), 2 * kExpertCopies);
  static std::vector<DMat> gate, up, down;  // shared by every T
  if (gate.empty())
    for (int i = 0; i < kExpertCopies; ++i) {
      gate.push_back(random_quant(WeightFormat::affine4, kE, kF, kD, 5000 + 10 * i));
      up.push_back(random_quant(WeightFormat::affine4, kE, kF, kD, 5003 + 10 * i));
      down.push_back(random_quant(WeightFormat::affine4, kE, kD, kF, 5006 + 10 * i));
    }
  std::mt19937_64 rng(77 + T);
  const float* norm_w = bench_alloc_random_floats(size_t(kD), 0.5f, 1.5f, 6000);
  for (int i = 0; i < d->copies; ++i) {
    cuda::MoeDecodeWeights w;
    w.norm_w = norm_w;
    w.router = random_quant(WeightFormat::affine8, 1, kE, kD, 7000 + 20 * i);
    w.shared_expert_gate = random_quant(WeightFormat::affine8, 1, 1, kD, 7003 + 20 * i);
    w.expert_gate = gate[size_t(i % kExpertCopies)];
    w.expert_up = up[size_t(i % kExpertCopies)];
    w.expert_down = down[size_t(i % kExpertCopies)];
    w.shared_gate = random_quant(WeightFormat::affine4, 1, kF, kD, 7006 + 20 * i);
    w.shared_up = random_quant(WeightFormat::affine4, 1, kF, kD, 7009 + 20 * i);
    w.shared_down = random_quant(WeightFormat::affine4, 1, kD, kF, 7012 + 20 * i);
    d->w.push_back(w);
    d->hidden.push_back(bench_alloc_random_floats(size_t(T * kD), -3.0f, 3.0f, 8000 + 20 * i));
    const size_t sb = cuda::moe_decode_scratch_bytes(T, kD, kE, kK, kF);
    void* p = nullptr;
    TERN_CUDA(cudaMalloc(&p, sb));
    d->scratch.push_back(p);
    const cuda::MoeDecodeScratch s = cuda::moe_decode_scratch_view(p, T, kD, kE, kK, kF);
    cuda::moe_decode_scratch_init(s, nullptr);
    // Routing and activations for the cases that run a kernel alone: distinct random experts per token.
    std::vector<int> ids(size_t(T * kK));
    for (int t = 0; t < T; ++t) {
      std::vector<int> perm(kE);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::copy_n(perm.begin(), kK, ids.begin() + t * kK);
    }
    std::vector<float> wts(size_t(T * kK), 1.0f / kK), sg(size_t(T), 0.5f);
    TERN_CUDA(cudaMemcpy(s.ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    TERN_CUDA(cudaMemcpy(s.w, wts.data(), wts.size() * 4, cudaMemcpyHostToDevice));
    TERN_CUDA(cudaMemcpy(s.shared_gate, sg.data(), sg.size() * 4, cudaMemcpyHostToDevice));
    const float* xh = bench_alloc_random_floats(size_t(T * kD), -2.0f, 2.0f, 9000 + 20 * i);
    const float* hh = bench_alloc_random_floats(size_t(T * (kK + 1) * kF), -1.0f, 1.0f, 9001 + 20 * i);
    TERN_CUDA(cudaMemcpy(s.xhat, xh, size_t(T * kD) * 4, cudaMemcpyDeviceToDevice));
    TERN_CUDA(cudaMemcpy(s.h, hh, size_t(T * (kK + 1) * kF) * 4, cudaMemcpyDeviceToDevice));
    d->s.push_back(s);
  }
  TERN_CUDA(cudaDeviceSynchronize());
  return d;
}

enum class MoePart { router, gate_up, down, all, batched };

// prefetch: whether the router asks L2 for the chosen experts (off by default: a 2x regression on the H200).
void add_moe(CaseList& cases, MoePart part, int T, Tune tune = {}, int prefetch = 0) {
  const double router_b = quant_bytes(WeightFormat::affine8, kE + 1, kD) + double(T) * kD * 4;
  const double pairs = double(T) * kK + 1;  // routed (token, slot) pairs + the shared expert
  const double gate_up_b = pairs * 2 * quant_bytes(WeightFormat::affine4, kF, kD) + double(T) * kD * 4 +
                           double(T) * (kK + 1) * kF * 4;
  const double down_b = pairs * quant_bytes(WeightFormat::affine4, kD, kF) + double(T) * (kK + 1) * kF * 4 +
                        2.0 * T * kD * 4;
  const double router_f = 2.0 * (kE + 1) * kD * T, gate_up_f = 2.0 * pairs * 2 * kF * kD,
               down_f = 2.0 * pairs * kD * kF;
  Case c;
  c.group = "decode";
  const std::string shape = " E=256 k=8 D=2048 F=512 T=" + std::to_string(T);
  switch (part) {
    case MoePart::router:
      c.name = "moe router 8-bit + softmax/top-k" + shape;
      c.bytes = router_b;
      c.flops = router_f;
      break;
    case MoePart::gate_up:
      c.name = "moe gate_up+swiglu 4-bit (9 experts)" + shape;
      c.bytes = gate_up_b;
      c.flops = gate_up_f;
      break;
    case MoePart::down:
      c.name = "moe down+combine 4-bit (9 experts)" + shape;
      c.bytes = down_b;
      c.flops = down_f;
      break;
    case MoePart::all:
      c.name = "moe block (router, gate_up, down)" + shape;
      c.bytes = router_b + gate_up_b + down_b;
      c.flops = router_f + gate_up_f + down_f;
      break;
    case MoePart::batched:  // T tokens as the batched step's T sessions: the distinct experts' bytes are the least
      c.name = "moe batched block (router clusters, gate_up, down rings)" + shape;
      c.bytes = router_b + (1.0 + kE * (1.0 - std::pow(1.0 - double(kK) / kE, double(T)))) *
                               (2 * quant_bytes(WeightFormat::affine4, kF, kD) +
                                quant_bytes(WeightFormat::affine4, kD, kF));
      c.flops = router_f + gate_up_f + down_f;
      break;
  }
  auto holder = std::make_shared<std::shared_ptr<MoeData>>();
  c.setup = [holder, T] { *holder = moe_data(T); };
  c.name += tune.label();
  if (part == MoePart::router || part == MoePart::all || part == MoePart::batched)
    c.name += prefetch ? " (L2 prefetch)" : " (no prefetch)";
  c.run = [holder, part, tune, prefetch](cudaStream_t stream, int rep) {
    tune.apply();
    cuda::moe_decode_set_l2_prefetch(prefetch != 0);
    MoeData& d = **holder;
    const size_t i = size_t(rep) % size_t(d.copies);
    cuda::MoeDecodeWeights w = d.w[i];
    w.prefetch_down = tune.l2_down;
    switch (part) {
      case MoePart::router: cuda::moe_router_decode(w, d.hidden[i], d.T, d.s[i], stream); break;
      case MoePart::gate_up: cuda::moe_gate_up_decode(w, d.T, d.s[i], stream); break;
      case MoePart::down: cuda::moe_down_decode(w, d.hidden[i], d.T, d.s[i], stream); break;
      case MoePart::all: cuda::moe_decode(w, d.hidden[i], d.T, d.s[i], stream); break;
      case MoePart::batched: cuda::moe_decode_batched(w, d.hidden[i], d.T, d.s[i], stream); break;
    }
  };
  cases.push_back(std::move(c));
}

}  // namespace

TERN_BENCH_CASES(decode) {
  // What reading the same bytes costs with nothing else to do (one kernel of a graph of 20), by loads per thread.
  for (int N : {1, 2, 4, 8, 16}) {
    add_read_roofline(cases, "router 256x2048 8-bit", quant_bytes(WeightFormat::affine8, 256, 2048), N);
    add_read_roofline(cases, "out/o proj 2048x4096", quant_bytes(WeightFormat::affine4, 2048, 4096), N);
    add_read_roofline(cases, "attn q|k|v 9216x2048", quant_bytes(WeightFormat::affine4, 9216, 2048), N);
    add_read_roofline(cases, "gdn in_proj 12352x2048", quant_bytes(WeightFormat::affine4, 12352, 2048), N);
    add_read_roofline(cases, "9 experts gate_up+down", 9 * quant_bytes(WeightFormat::affine4, 1536, 2048), N);
    add_read_roofline(cases, "lm head 248320x2048", quant_bytes(WeightFormat::affine4, 248320, 2048), N);
  }
  // Size sweep: the one-token product of R×2048 and the read of the same bytes, R = 1K..128K, for the fixed cost of
  // one launch and the bandwidth of every further byte (a straight-line fit of µs against bytes).
  for (int64_t rows = 1024; rows <= 131072; rows *= 2) {
    add_qmv(cases, "sweep", rows, 2048, 1, true, false);
    for (int N : {4, 8}) add_read_roofline(cases, "sweep " + std::to_string(rows) + "x2048",
                                           quant_bytes(WeightFormat::affine4, rows, 2048), N);
  }
  // The one-token integer path (variant 3) beside the default, cold and L2-hot, and its rows per batch.
  for (int v : {1, 3})
    for (bool hot : {false, true}) {
      Tune t{0, 0, v};
      t.hot = hot;
      add_qmv(cases, "gdn in_proj (norm)", 12352, 2048, 1, true, false, t);
      add_qmv(cases, "attn q|k|v (norm)", 9216, 2048, 1, true, false, t);
      add_qmv(cases, "out/o proj (+residual)", 2048, 4096, 1, false, true, t);
      if (!hot) add_qmv(cases, "lm head (norm)", 248320, 2048, 1, true, false, t);
    }
  // The batched step's products at the stream counts of issue 31 (tern bench --concurrency), the tables written by
  // the kernel before them as in the step (the 4096-column ones by the mixers; hidden's by the MoE down).
  for (int B : {1, 2, 4, 8, 16, 32}) {
    add_qmv_batched(cases, "gdn in_proj (norm)", 12352, 2048, B, true, false, true);
    add_qmv_batched(cases, "attn q|k|v (norm)", 9216, 2048, B, true, false, true);
    add_qmv_batched(cases, "out/o proj (+residual)", 2048, 4096, B, false, true, true);
    add_qmv_batched(cases, "lm head (norm)", 248320, 2048, B, true, false, true);
  }
  for (int B : {8, 16}) add_qmv_batched(cases, "lm head (norm)", 248320, 2048, B, true, false, false);
  for (int B : {1, 2, 4, 8, 16, 32}) add_moe(cases, MoePart::batched, B, Tune{0, 0, 3});
  {
    const Tune t{0, 0, 3};
    add_moe(cases, MoePart::gate_up, 1, t);
    add_moe(cases, MoePart::down, 1, t);
    add_moe(cases, MoePart::all, 1, t);
  }
  // The MoE gate_up asking L2 for the chosen experts' down matrices (TERN_L2_PREFETCH bit 4 of the decode plan).
  {
    Tune t{0, 0, 3};
    t.l2_down = true;
    add_moe(cases, MoePart::gate_up, 1, t);
    add_moe(cases, MoePart::all, 1, t);
  }
  for (int rows : {4, 8}) {
    Tune t{0, 0, 3};
    t.dp4a_rows = rows;
    add_qmv(cases, "gdn in_proj (norm)", 12352, 2048, 1, true, false, t);
    add_qmv(cases, "lm head (norm)", 248320, 2048, 1, true, false, t);
  }
  add_qmv(cases, "gdn in_proj (norm)", 12352, 2048, 1, true, false);
  add_qmv(cases, "attn q|k|v (norm)", 9216, 2048, 1, true, false);
  add_qmv(cases, "out/o proj (+residual)", 2048, 4096, 1, false, true);
  add_qmv(cases, "lm head (norm)", 248320, 2048, 1, true, false);
  add_qmv(cases, "gdn in_proj (norm)", 12352, 2048, 4, true, false);
  add_qmv(cases, "gdn in_proj (norm)", 12352, 2048, 8, true, false);
  add_qmv(cases, "out/o proj (+residual)", 2048, 4096, 4, false, true);
  add_qmv(cases, "out/o proj (+residual)", 2048, 4096, 8, false, true);
  for (int T : {1, 4, 8}) {
    add_moe(cases, MoePart::router, T);
    add_moe(cases, MoePart::gate_up, T);
    add_moe(cases, MoePart::down, T);
    add_moe(cases, MoePart::all, T);
  }
  add_moe(cases, MoePart::router, 1, {}, 1);
  add_moe(cases, MoePart::all, 1, {}, 1);
  // Step variants (0: the previous kernel, 2 groups per warp step; 1: 4 groups per step; 2: qmv only, variant 1's
  // steps through a cp.async shared-memory pipeline) at the default depth.
  for (int v : {0, 1, 2})
    for (int T : {1, 8}) {
      const Tune t{0, 0, v};
      add_qmv(cases, "gdn in_proj (norm)", 12352, 2048, T, true, false, t);
      add_qmv(cases, "attn q|k|v (norm)", 9216, 2048, T, true, false, t);
      add_qmv(cases, "out/o proj (+residual)", 2048, 4096, T, false, true, t);
      if (T == 1) add_qmv(cases, "lm head (norm)", 248320, 2048, T, true, false, t);
      if (v == 2) continue;  // the MoE kernels have no variant 2 (they run variant 0)
      add_moe(cases, MoePart::gate_up, T, t);
      add_moe(cases, MoePart::down, T, t);
      add_moe(cases, MoePart::all, T, t);
    }
  // Tuning sweep (ring depth × blocks per SM × variant) of the tensor-core kernels at T = 1.
  for (int depth : {4, 6, 8})
    for (int bps : {1, 2})
      for (int v : {0, 1}) {
        const Tune t{depth, bps, v};
        add_qmv(cases, "gdn in_proj (norm)", 12352, 2048, 1, true, false, t);
        add_qmv(cases, "attn q|k|v (norm)", 9216, 2048, 1, true, false, t);
        add_qmv(cases, "out/o proj (+residual)", 2048, 4096, 1, false, true, t);
        add_qmv(cases, "lm head (norm)", 248320, 2048, 1, true, false, t);
        add_moe(cases, MoePart::gate_up, 1, t);
        add_moe(cases, MoePart::down, 1, t);
        add_moe(cases, MoePart::all, 1, t);
      }
}

}  // namespace tern::bench
