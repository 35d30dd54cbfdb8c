// Workbench cases of the tiled product (cuda::matmul): the prefill projections of one layer at their real shapes,
// dense (T tokens) and grouped over the 256 routed experts (top-8; the tile map built once by moe_group in setup),
// for each block shape of the 4-bit tensor-core kernel, with x fp32 (split into bf16 hi + lo in every block) and x
// prepared once (MatmulArgs::x_prep; "prepx" in the name), the previous bf16-operand kernel (tc_bf16) and the fp32
// SIMT kernel for reference, and the preparation pass itself (matmul_prepare_x); then the integer kernel
// (qmatmul_int8.cuh: x quantised once by matmul_quantize_x, "int8" in the name) for each of its block shapes, with the
// 8-bit router beside the 4-bit products; then the Hopper warpgroup kernel (qmatmul_wgmma.cuh: x as fp16 with a scale
// per token by matmul_prepare_x_f16, "wgmma f16", or the hi + lo split of matmul_prepare_x, "wgmma split"), its
// grouped products also on tiles of at most 16 or 32 tokens ("tile=16", "tile=32" in the name: blocks of that many
// tokens, TERN_MOE_TILE_TOKENS) beside 64 at short chunks; `tern_kernels wgmma grouped T=256` compares them.
#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/workbench.h"
#include "core/check.h"
#include "cuda/kernels/moe/moe.cuh"
#include "cuda/kernels/qmatmul/qmatmul.cuh"
#include "cuda/kernels/qmatmul/qmatmul_int8.cuh"
#include "cuda/kernels/qmatmul/qmatmul_wgmma.cuh"

namespace tern::bench {
namespace {

using cuda::DMat;
using cuda::MatmulArgs;
using cuda::MatmulTile;

const char* tile_label(MatmulTile t) {
  switch (t) {
    case MatmulTile::automatic: return "auto";
    case MatmulTile::simt: return "simt";
    case MatmulTile::tc128x64: return "tc128x64";
    case MatmulTile::tc256x64: return "tc256x64";
    case MatmulTile::tc128x128: return "tc128x128";
    case MatmulTile::tc256x64w: return "tc256x64w";
    case MatmulTile::tc_bf16: return "tc_bf16";
    case MatmulTile::wgmma: return "wgmma";
  }
  return "?";
}

// Random 4-bit weights [experts][rows, cols] (random bits: timing does not depend on the values).
DMat random_affine4(int64_t experts, int64_t rows, int64_t cols, uint64_t seed) {
  DMat w;
  w.format = WeightFormat::affine4;
  w.experts = experts;
  w.rows = rows;
  w.cols = cols;
  w.group_size = 64;
  w.row_words = cols / 8;
  w.groups_per_row = cols / 64;
  const size_t n = size_t(experts * rows);
  w.data = bench_alloc_random_bytes(n * size_t(w.row_words) * 4, seed);
  w.scales = static_cast<const uint16_t*>(bench_alloc_random_bytes(n * size_t(w.groups_per_row) * 2, seed + 1));
  w.biases = static_cast<const uint16_t*>(bench_alloc_random_bytes(n * size_t(w.groups_per_row) * 2, seed + 2));
  return w;
}

// The same for the 8-bit router.
DMat random_affine8(int64_t rows, int64_t cols, uint64_t seed) {
  DMat w = random_affine4(1, rows, cols, seed);
  w.format = WeightFormat::affine8;
  w.row_words = cols / 4;
  w.data = bench_alloc_random_bytes(size_t(rows * w.row_words) * 4, seed + 3);
  return w;
}

const char* int8_tile_label(cuda::Int8Tile t) {
  switch (t) {
    case cuda::Int8Tile::automatic: return "auto";
    case cuda::Int8Tile::b64x64: return "64x64";
    case cuda::Int8Tile::b128x64: return "128x64";
    case cuda::Int8Tile::b128x128: return "128x128";
  }
  return "?";
}

double affine4_bytes(int64_t experts, int64_t rows, int64_t cols) {
  return double(experts * rows) * double(cols / 2 + cols / 64 * 4);
}

// Inputs of a dense case, shared by its block shapes: `copies` sets of weights and x (so that timed runs read
// device memory where one set fits in L2), one y.
struct DenseData {
  std::vector<DMat> w;
  std::vector<float*> x;
  std::vector<void*> xp;  // x prepared by matmul_prepare_x
  std::vector<void*> xq;  // x quantised by matmul_quantize_x
  std::vector<void*> xb;  // x as fp16 by matmul_prepare_x_f16
  std::vector<void*> xh;  // x as fp16 hi + lo by matmul_prepare_x_f16x2 (made by the split_f16 cases' setup only)
  float* y = nullptr;
};

// x [rows, cols] in a prepared form: `bytes` of device memory that prepare(x, ldx, rows, cols, out, stream) fills.
template <class Prepare>
void* prepared_form(const float* x, int64_t rows, int64_t cols, int64_t bytes, Prepare prepare) {
  void* p = nullptr;
  TERN_CUDA(cudaMalloc(&p, size_t(bytes)));
  prepare(x, cols, rows, cols, p, nullptr);
  TERN_CUDA(cudaDeviceSynchronize());
  return p;
}
void* quantised_copy(const float* x, int64_t rows, int64_t cols) {
  return prepared_form(x, rows, cols, cuda::matmul_q16_bytes(rows, cols),
                       [](const float* v, int64_t ld, int64_t r, int64_t c, void* out, cudaStream_t st) {
                         cuda::matmul_quantize_x(v, ld, r, c, out, st);
                       });
}
void* f16_copy(const float* x, int64_t rows, int64_t cols) {
  return prepared_form(x, rows, cols, cuda::matmul_f16_bytes(rows, cols), cuda::matmul_prepare_x_f16);
}
void* prepared_copy(const float* x, int64_t rows, int64_t cols) {
  return prepared_form(x, rows, cols, cuda::matmul_prepared_bytes(rows, cols), cuda::matmul_prepare_x);
}
void* f16x2_copy(const float* x, int64_t rows, int64_t cols) {
  return prepared_form(x, rows, cols, cuda::matmul_f16x2_bytes(rows, cols), cuda::matmul_prepare_x_f16x2);
}

std::shared_ptr<DenseData> dense_data(int64_t rows, int64_t cols, int64_t T) {
  static std::map<std::string, std::shared_ptr<DenseData>> cache;
  const std::string key = std::to_string(rows) + "x" + std::to_string(cols) + "T" + std::to_string(T);
  auto& d = cache[key];
  if (!d) {
    d = std::make_shared<DenseData>();
    const int copies = bench_copies_for(affine4_bytes(1, rows, cols) + double(T * cols) * 4);
    for (int c = 0; c < copies; ++c) {
      d->w.push_back(random_affine4(1, rows, cols, 1000 + 17 * c));
      d->x.push_back(bench_alloc_random_floats(size_t(T * cols), -2.0f, 2.0f, 2000 + 17 * c));
      d->xp.push_back(prepared_copy(d->x.back(), T, cols));
      d->xq.push_back(quantised_copy(d->x.back(), T, cols));
      d->xb.push_back(f16_copy(d->x.back(), T, cols));
    }
    d->y = bench_alloc_random_floats(size_t(T * rows), -1.0f, 1.0f, 3000);
  }
  return d;
}

// swiglu: matmul_swiglu with two such matrices (the second is the next weight copy). xp: x prepared.
void add_dense(CaseList& cases, const char* what, int64_t rows, int64_t cols, int64_t T, MatmulTile tile,
               bool swiglu = false, bool xp = false) {
  const int mats = swiglu ? 2 : 1;
  Case c;
  c.group = "prefill";
  c.name = std::string(swiglu ? "matmul_swiglu 4-bit " : "matmul 4-bit ") + what + " " + std::to_string(rows) + "x" +
           std::to_string(cols) + " T=" + std::to_string(T) + " " + tile_label(tile) + (xp ? " prepx" : "");
  c.flops = 2.0 * mats * double(T) * double(rows) * double(cols);
  c.bytes = mats * affine4_bytes(1, rows, cols) +
            (xp ? double(cuda::matmul_prepared_bytes(T, cols)) : double(T) * double(cols) * 4) + double(T * rows) * 4;
  auto data = std::make_shared<std::shared_ptr<DenseData>>();
  c.setup = [=] { *data = dense_data(rows, cols, T); };
  c.run = [=](cudaStream_t stream, int rep) {
    const DenseData& d = **data;
    const size_t i = size_t(rep) % d.w.size();
    MatmulArgs a;
    a.w = d.w[i];
    a.x = d.x[i];
    if (xp) {
      a.x_prep = d.xp[i];
      a.x_prep_cols = cols;
    }
    a.ldx = cols;
    a.y = d.y;
    a.ldy = rows;
    a.tokens = T;
    if (swiglu) {
      cuda::matmul_swiglu(a, d.w[(i + 1) % d.w.size()], stream, tile);
    } else {
      cuda::matmul(a, stream, tile);
    }
  };
  cases.push_back(std::move(c));
}

// A grouped case: all 256 experts of one projection (two for SwiGLU), T tokens routed to 8 distinct random experts
// each.
struct GroupedData {
  DMat w, up;
  float* x = nullptr;
  void* xp = nullptr;  // x prepared by matmul_prepare_x
  void* xq = nullptr;  // x quantised by matmul_quantize_x
  void* xb = nullptr;  // x as fp16 by matmul_prepare_x_f16
  void* xh = nullptr;  // x as fp16 hi + lo by matmul_prepare_x_f16x2
  float* y = nullptr;
  int* ids = nullptr;
  int* scratch = nullptr;
  cuda::MoeGroups groups;
  int max_tiles = 0;
  int tile_tokens = cuda::kMatmulTileTokens;  // the most tokens of a tile (moe_group's tile)
};

std::shared_ptr<GroupedData> grouped_data(int64_t rows, int64_t cols, int64_t T, int E, int k, bool gather,
                                          int tile_tokens = cuda::kMatmulTileTokens) {
  static std::map<std::string, std::shared_ptr<GroupedData>> cache;
  const std::string key = std::to_string(rows) + "x" + std::to_string(cols) + "T" + std::to_string(T) + "tile" +
                          std::to_string(tile_tokens);
  auto& d = cache[key];
  if (!d) {
    d = std::make_shared<GroupedData>();
    d->w = random_affine4(E, rows, cols, 4000 + uint64_t(rows));
    d->up = random_affine4(E, rows, cols, 4500 + uint64_t(rows));
    const int64_t xrows = gather ? T : T * k;
    d->x = bench_alloc_random_floats(size_t(xrows * cols), -2.0f, 2.0f, 5000);
    d->xp = prepared_copy(d->x, xrows, cols);
    d->xq = quantised_copy(d->x, xrows, cols);
    d->xb = f16_copy(d->x, xrows, cols);
    d->xh = f16x2_copy(d->x, xrows, cols);
    d->y = bench_alloc_random_floats(size_t(T * k * rows), -1.0f, 1.0f, 6000);
    std::mt19937_64 rng(7);
    std::vector<int> ids(static_cast<size_t>(T * k)), perm(static_cast<size_t>(E));
    for (int64_t t = 0; t < T; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::copy_n(perm.begin(), k, ids.begin() + t * k);
    }
    TERN_CUDA(cudaMalloc(&d->ids, ids.size() * sizeof(int)));
    TERN_CUDA(cudaMemcpy(d->ids, ids.data(), ids.size() * sizeof(int), cudaMemcpyHostToDevice));
    TERN_CUDA(cudaMalloc(&d->scratch, size_t(cuda::moe_group_ints(T, E, k)) * sizeof(int)));
    d->groups = cuda::moe_groups_view(d->scratch, T, E, k);
    cuda::moe_group(d->ids, T, E, k, tile_tokens, d->groups, nullptr);
    TERN_CUDA(cudaDeviceSynchronize());
    d->max_tiles = cuda::moe_max_tiles(T, E, k);
    d->tile_tokens = tile_tokens;
  }
  return d;
}

// The arguments of a grouped product over d (x rows gathered from the tokens or by sorted position), x fp32 only.
MatmulArgs grouped_args(const GroupedData& d, int64_t rows, int64_t cols, bool gather) {
  MatmulArgs a;
  a.w = d.w;
  a.x = d.x;
  a.ldx = cols;
  a.y = d.y;
  a.ldy = rows;
  cuda::set_tiles(a, d.groups, d.max_tiles, d.tile_tokens);
  a.gather = gather ? d.groups.sorted_token : nullptr;
  return a;
}

// swiglu: matmul_swiglu over two such projections (gate and up) in one pass. xp: x prepared.
void add_grouped(CaseList& cases, const char* what, int64_t rows, int64_t cols, int64_t T, bool gather,
                 MatmulTile tile, bool swiglu = false, bool xp = false) {
  constexpr int E = 256, k = 8;
  const int mats = swiglu ? 2 : 1;
  Case c;
  c.group = "prefill";
  c.name = std::string(swiglu ? "matmul_swiglu grouped 4-bit " : "matmul grouped 4-bit ") + what + " 256x " +
           std::to_string(rows) + "x" + std::to_string(cols) + " T=" + std::to_string(T) + " k=8 " + tile_label(tile) +
           (xp ? " prepx" : "");
  const int64_t xrows = gather ? T : T * k;
  c.flops = 2.0 * mats * double(T * k) * double(rows) * double(cols);
  c.bytes = mats * affine4_bytes(E, rows, cols) +
            (xp ? double(cuda::matmul_prepared_bytes(xrows, cols)) : double(xrows) * double(cols) * 4) +
            double(T * k * rows) * 4;
  auto data = std::make_shared<std::shared_ptr<GroupedData>>();
  c.setup = [=] { *data = grouped_data(rows, cols, T, E, k, gather); };
  c.run = [=](cudaStream_t stream, int) {
    const GroupedData& d = **data;
    MatmulArgs a = grouped_args(d, rows, cols, gather);
    if (xp) {
      a.x_prep = d.xp;
      a.x_prep_cols = cols;
    }
    if (swiglu) {
      cuda::matmul_swiglu(a, d.up, stream, tile);
    } else {
      cuda::matmul(a, stream, tile);
    }
  };
  cases.push_back(std::move(c));
}

// The integer kernel on a dense product: 4-bit (or the 8-bit router: bits 8), x quantised once.
void add_dense_int8(CaseList& cases, const char* what, int64_t rows, int64_t cols, int64_t T, cuda::Int8Tile tile,
                    bool swiglu = false, int bits = 4) {
  const int mats = swiglu ? 2 : 1;
  Case c;
  c.group = "prefill";
  c.name = std::string(swiglu ? "matmul_swiglu int8 " : "matmul int8 ") + std::to_string(bits) + "-bit " + what + " " +
           std::to_string(rows) + "x" + std::to_string(cols) + " T=" + std::to_string(T) + " " + int8_tile_label(tile);
  c.flops = 2.0 * mats * double(T) * double(rows) * double(cols);
  c.bytes = mats * affine4_bytes(1, rows, cols) * (bits == 8 ? 1.9 : 1.0) + double(cuda::matmul_q16_bytes(T, cols)) +
            double(T * rows) * 4;
  auto data = std::make_shared<std::shared_ptr<DenseData>>();
  auto router = std::make_shared<DMat>();
  c.setup = [=] {
    *data = dense_data(rows, cols, T);
    if (bits == 8 && !router->data) *router = random_affine8(rows, cols, 8100);
  };
  c.run = [=](cudaStream_t stream, int rep) {
    const DenseData& d = **data;
    const size_t i = size_t(rep) % d.w.size();
    MatmulArgs a;
    a.w = bits == 8 ? *router : d.w[i];
    a.x = d.x[i];
    a.x_q16 = d.xq[i];
    a.x_q16_cols = cols;
    a.ldx = cols;
    a.y = d.y;
    a.ldy = rows;
    a.tokens = T;
    if (swiglu) {
      cuda::matmul_int8_swiglu(a, d.w[(i + 1) % d.w.size()], stream, tile);
    } else {
      cuda::matmul_int8(a, stream, tile);
    }
  };
  cases.push_back(std::move(c));
}

// The integer kernel on a grouped product (gate, down, or gate+up with SwiGLU).
void add_grouped_int8(CaseList& cases, const char* what, int64_t rows, int64_t cols, int64_t T, bool gather,
                      cuda::Int8Tile tile, bool swiglu = false) {
  constexpr int E = 256, k = 8;
  const int mats = swiglu ? 2 : 1;
  Case c;
  c.group = "prefill";
  c.name = std::string(swiglu ? "matmul_swiglu int8 grouped 4-bit " : "matmul int8 grouped 4-bit ") + what + " 256x " +
           std::to_string(rows) + "x" + std::to_string(cols) + " T=" + std::to_string(T) + " k=8 " +
           int8_tile_label(tile);
  const int64_t xrows = gather ? T : T * k;
  c.flops = 2.0 * mats * double(T * k) * double(rows) * double(cols);
  c.bytes = mats * affine4_bytes(E, rows, cols) + double(cuda::matmul_q16_bytes(xrows, cols)) + double(T * k * rows) * 4;
  auto data = std::make_shared<std::shared_ptr<GroupedData>>();
  c.setup = [=] { *data = grouped_data(rows, cols, T, E, k, gather); };
  c.run = [=](cudaStream_t stream, int) {
    const GroupedData& d = **data;
    MatmulArgs a = grouped_args(d, rows, cols, gather);
    a.x_q16 = d.xq;
    a.x_q16_cols = cols;
    if (swiglu) {
      cuda::matmul_int8_swiglu(a, d.up, stream, tile);
    } else {
      cuda::matmul_int8(a, stream, tile);
    }
  };
  cases.push_back(std::move(c));
}

// The warpgroup kernel on a dense product (xk: x in one fp16 term, bf16 or fp16 hi + lo) or a
// grouped one (gate, down, gate+up).
const char* wgmma_label(cuda::WgmmaX xk) {
  switch (xk) {
    case cuda::WgmmaX::f16: return "f16";
    case cuda::WgmmaX::split: return "split";
    case cuda::WgmmaX::split_f16: return "split_f16";
  }
  return "?";
}
void set_wgmma_x(MatmulArgs& a, cuda::WgmmaX xk, void* xb, void* xp, int64_t cols) {
  if (xk == cuda::WgmmaX::f16) {
    a.x_f16 = xb;
    a.x_f16_cols = cols;
  } else {
    a.x_prep = xp;
    a.x_prep_cols = cols;
    a.x_prep_f16 = xk == cuda::WgmmaX::split_f16;
  }
}
// x with at most 8 significant bits (k/64 for integers |k| ≤ 128): exact in bf16 and in fp16 of x/σ, so the lo term
// of either two-term form is all zeros. Device memory [T, cols].
float* exact8_floats(int64_t T, int64_t cols, uint64_t seed) {
  std::vector<float> h(size_t(T * cols));
  uint64_t r = seed;
  for (float& v : h) {
    r = r * 6364136223846793005ULL + 1442695040888963407ULL;
    v = float(int64_t(r >> 33) % 257 - 128) / 64.0f;
  }
  float* d = nullptr;
  TERN_CUDA(cudaMalloc(&d, h.size() * 4));
  TERN_CUDA(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  return d;
}

// exact8: x from exact8_floats instead (the two-term forms' lo all zeros: whether the products' time depends on the
// values the tensor cores multiply).
void add_dense_wgmma(CaseList& cases, const char* what, int64_t rows, int64_t cols, int64_t T, cuda::WgmmaX xk,
                     bool swiglu = false, bool exact8 = false) {
  const int mats = swiglu ? 2 : 1;
  Case c;
  c.group = "prefill";
  c.name = std::string(swiglu ? "matmul_swiglu wgmma " : "matmul wgmma ") + wgmma_label(xk) + " 4-bit " + what + " " +
           std::to_string(rows) + "x" + std::to_string(cols) + " T=" + std::to_string(T) +
           (exact8 ? " x exact in 8 bits" : "");
  c.flops = 2.0 * mats * double(T) * double(rows) * double(cols);
  c.bytes = mats * affine4_bytes(1, rows, cols) +
            double(xk == cuda::WgmmaX::f16       ? cuda::matmul_f16_bytes(T, cols)
                   : xk == cuda::WgmmaX::split   ? cuda::matmul_prepared_bytes(T, cols)
                                                 : cuda::matmul_f16x2_bytes(T, cols)) +
            double(T * rows) * 4;
  auto data = std::make_shared<std::shared_ptr<DenseData>>();
  c.setup = [=] {
    if (exact8) {  // one copy of each form of its own x, the weights of dense_data's
      static std::map<std::string, std::shared_ptr<DenseData>> cache;
      auto& e = cache[std::to_string(rows) + "x" + std::to_string(cols) + "T" + std::to_string(T)];
      if (!e) {
        const DenseData& base = *dense_data(rows, cols, T);
        e = std::make_shared<DenseData>();
        e->w = base.w;
        e->y = base.y;
        for (size_t i = 0; i < base.w.size(); ++i) {
          e->x.push_back(exact8_floats(T, cols, 4000 + 17 * i));
          e->xp.push_back(prepared_copy(e->x.back(), T, cols));
          e->xb.push_back(f16_copy(e->x.back(), T, cols));
          e->xh.push_back(f16x2_copy(e->x.back(), T, cols));
        }
      }
      *data = e;
      return;
    }
    *data = dense_data(rows, cols, T);
    DenseData& d = **data;
    if (xk == cuda::WgmmaX::split_f16 && d.xh.empty())
      for (const float* x : d.x) d.xh.push_back(f16x2_copy(x, T, cols));
  };
  c.run = [=](cudaStream_t stream, int rep) {
    const DenseData& d = **data;
    const size_t i = size_t(rep) % d.w.size();
    MatmulArgs a;
    a.w = d.w[i];
    a.x = d.x[i];
    set_wgmma_x(a, xk, d.xb[i], xk == cuda::WgmmaX::split_f16 ? d.xh[i] : d.xp[i], cols);
    a.ldx = cols;
    a.y = d.y;
    a.ldy = rows;
    a.tokens = T;
    if (swiglu) {
      cuda::matmul_wgmma_swiglu(a, d.w[(i + 1) % d.w.size()], stream, xk);
    } else {
      cuda::matmul_wgmma(a, stream, xk);
    }
  };
  cases.push_back(std::move(c));
}
// tile: the most tokens of a tile (the kernel's blocks: 16, 32 or 64 tokens); named "tile=N" unless 64.
void add_grouped_wgmma(CaseList& cases, const char* what, int64_t rows, int64_t cols, int64_t T, bool gather,
                       cuda::WgmmaX xk, bool swiglu = false, int tile = cuda::kMatmulTileTokens) {
  constexpr int E = 256, k = 8;
  const int mats = swiglu ? 2 : 1;
  Case c;
  c.group = "prefill";
  c.name = std::string(swiglu ? "matmul_swiglu wgmma " : "matmul wgmma ") + wgmma_label(xk) + " grouped 4-bit " +
           what + " 256x " + std::to_string(rows) + "x" + std::to_string(cols) + " T=" + std::to_string(T) + " k=8" +
           (tile != cuda::kMatmulTileTokens ? " tile=" + std::to_string(tile) : std::string());
  const int64_t xrows = gather ? T : T * k;
  c.flops = 2.0 * mats * double(T * k) * double(rows) * double(cols);
  c.bytes = mats * affine4_bytes(E, rows, cols) + double(cuda::matmul_f16_bytes(xrows, cols)) +
            double(T * k * rows) * 4;
  auto data = std::make_shared<std::shared_ptr<GroupedData>>();
  c.setup = [=] { *data = grouped_data(rows, cols, T, E, k, gather, tile); };
  c.run = [=](cudaStream_t stream, int) {
    const GroupedData& d = **data;
    MatmulArgs a = grouped_args(d, rows, cols, gather);
    set_wgmma_x(a, xk, d.xb, xk == cuda::WgmmaX::split_f16 ? d.xh : d.xp, cols);
    if (swiglu) {
      cuda::matmul_wgmma_swiglu(a, d.up, stream, xk);
    } else {
      cuda::matmul_wgmma(a, stream, xk);
    }
  };
  cases.push_back(std::move(c));
}

// A pass that prepares x [rows, cols] fp32 for the products, alone: matmul_prepare_x (split into bf16 hi, lo and
// group sums) or matmul_quantize_x (int8 hi, lo, per-group σ and σ·Σv).
void add_x_pass(CaseList& cases, int64_t rows, int64_t cols, bool quantise) {
  Case c;
  c.group = "prefill";
  c.name = std::string(quantise ? "matmul_quantize_x " : "matmul_prepare_x ") + std::to_string(rows) + "x" +
           std::to_string(cols);
  const int64_t out_bytes = quantise ? cuda::matmul_q16_bytes(rows, cols) : cuda::matmul_prepared_bytes(rows, cols);
  c.bytes = double(rows * cols) * 4 + double(out_bytes);
  auto data = std::make_shared<std::pair<float*, void*>>();
  c.setup = [=] {
    if (!data->first) {
      data->first = bench_alloc_random_floats(size_t(rows * cols), -2.0f, 2.0f, 7000);
      TERN_CUDA(cudaMalloc(&data->second, size_t(out_bytes)));
    }
  };
  c.run = [=](cudaStream_t stream, int) {
    if (quantise) {
      cuda::matmul_quantize_x(data->first, cols, rows, cols, data->second, stream);
    } else {
      cuda::matmul_prepare_x(data->first, cols, rows, cols, data->second, stream);
    }
  };
  cases.push_back(std::move(c));
}

}  // namespace

TERN_BENCH_CASES(matmul) {
  // The exact kernel's shapes, then the previous bf16-operand kernel (tc_bf16: fp32 x only) for comparison.
  const MatmulTile shapes[] = {MatmulTile::automatic, MatmulTile::tc128x64,  MatmulTile::tc256x64,
                               MatmulTile::tc128x128, MatmulTile::tc256x64w, MatmulTile::tc_bf16};
  struct Dense {
    const char* what;
    int64_t rows, cols;
  };
  const Dense dense[] = {{"GDN in_proj", 12352, 2048}, {"attn qkv", 9216, 2048}, {"out_proj", 2048, 4096},
                         {"shared up", 512, 2048}};
  for (bool xp : {false, true})
    for (const Dense& d : dense)
      for (MatmulTile t : shapes)
        if (!xp || t != MatmulTile::tc_bf16) add_dense(cases, d.what, d.rows, d.cols, 4096, t, false, xp);
  for (bool xp : {false, true}) {
    for (const Dense& d : dense) add_dense(cases, d.what, d.rows, d.cols, 512, MatmulTile::automatic, false, xp);
    add_dense(cases, "GDN in_proj", 12352, 2048, 512, MatmulTile::tc128x64, false, xp);
    add_dense(cases, "shared gate+up", 512, 2048, 4096, MatmulTile::automatic, true, xp);
  }
  for (const Dense& d : dense) add_dense(cases, d.what, d.rows, d.cols, 512, MatmulTile::tc_bf16);
  add_dense(cases, "shared gate+up", 512, 2048, 4096, MatmulTile::tc_bf16, true);
  add_dense(cases, "out_proj", 2048, 4096, 4096, MatmulTile::simt);
  add_x_pass(cases, 4096, 2048, false);
  add_x_pass(cases, 4096 * 8, 512, false);
  for (bool xp : {false, true}) {
    for (int64_t T : {int64_t(4096), int64_t(512)}) {
      for (MatmulTile t : shapes) {
        if (xp && t == MatmulTile::tc_bf16) continue;
        if (T != 4096 && t != MatmulTile::automatic && t != MatmulTile::tc_bf16) continue;
        add_grouped(cases, "gate", 512, 2048, T, true, t, false, xp);
        add_grouped(cases, "down", 2048, 512, T, false, t, false, xp);
        add_grouped(cases, "gate+up", 512, 2048, T, true, t, true, xp);
      }
    }
  }
  // The integer kernel, every block shape at T = 4096 (128x128: dense only), the default at T = 512.
  using cuda::Int8Tile;
  const Int8Tile int8_tiles[] = {Int8Tile::b64x64, Int8Tile::b128x64, Int8Tile::b128x128};
  for (Int8Tile t : int8_tiles) {
    for (const Dense& d : dense) add_dense_int8(cases, d.what, d.rows, d.cols, 4096, t);
    add_dense_int8(cases, "shared gate+up", 512, 2048, 4096, t, true);
    add_dense_int8(cases, "router", 256, 2048, 4096, t, false, 8);
    if (t == Int8Tile::b128x128) continue;
    add_grouped_int8(cases, "gate", 512, 2048, 4096, true, t);
    add_grouped_int8(cases, "down", 2048, 512, 4096, false, t);
    add_grouped_int8(cases, "gate+up", 512, 2048, 4096, true, t, true);
  }
  for (const Dense& d : dense) add_dense_int8(cases, d.what, d.rows, d.cols, 512, Int8Tile::automatic);
  add_grouped_int8(cases, "gate+up", 512, 2048, 512, true, Int8Tile::automatic, true);
  add_x_pass(cases, 4096, 2048, true);
  add_x_pass(cases, 4096 * 8, 512, true);
  // The warpgroup kernel (Hopper only), x in one fp16 term, as bf16 hi + lo and as fp16 hi + lo, at T = 4096 and 512.
  if (!cuda::matmul_wgmma_available()) return;
  for (cuda::WgmmaX xk : {cuda::WgmmaX::f16, cuda::WgmmaX::split, cuda::WgmmaX::split_f16}) {
    for (int64_t T : {int64_t(4096), int64_t(512)}) {
      for (const Dense& d : dense) add_dense_wgmma(cases, d.what, d.rows, d.cols, T, xk);
      add_dense_wgmma(cases, "shared gate+up", 512, 2048, T, xk, true);
      // The two-term forms with lo all zeros: fp16 hi + lo runs 1–13% slower than bf16 hi + lo on the same tensor
      // work (docs/benchmarks.md, forty-eighth session); if it does not here, the values are what costs.
      if (T == 4096 && xk != cuda::WgmmaX::f16) add_dense_wgmma(cases, "attn qkv", 9216, 2048, T, xk, false, true);
      add_grouped_wgmma(cases, "gate", 512, 2048, T, true, xk);
      add_grouped_wgmma(cases, "down", 2048, 512, T, false, xk);
      add_grouped_wgmma(cases, "gate+up", 512, 2048, T, true, xk, true);
    }
  }
  // The grouped products of short chunks (T = 256: 8 tokens per expert on average; 512: 16) on tiles of at most 16,
  // 32 and 64 tokens (the blocks' width; TERN_MOE_TILE_TOKENS).
  for (cuda::WgmmaX xk : {cuda::WgmmaX::f16, cuda::WgmmaX::split}) {
    for (int64_t T : {int64_t(256), int64_t(512)}) {
      for (int tile : {16, 32, 64}) {
        if (T == 512 && tile == 64) continue;  // above
        add_grouped_wgmma(cases, "gate", 512, 2048, T, true, xk, false, tile);
        add_grouped_wgmma(cases, "down", 2048, 512, T, false, xk, false, tile);
        add_grouped_wgmma(cases, "gate+up", 512, 2048, T, true, xk, true, tile);
      }
    }
  }
  // The runner's products at T = 32,768 (a 32K prompt in one product call; the runner itself cuts prompts into
  // 4,096-token chunks, so these say how the kernel scales, not what a 32K prefill runs).
  constexpr int64_t kT32 = 32768;
  for (const Dense& d : dense) add_dense_wgmma(cases, d.what, d.rows, d.cols, kT32, cuda::WgmmaX::f16);
  add_dense_wgmma(cases, "shared gate+up", 512, 2048, kT32, cuda::WgmmaX::f16, true);
  add_grouped_wgmma(cases, "down", 2048, 512, kT32, false, cuda::WgmmaX::f16);
  add_grouped_wgmma(cases, "gate+up", 512, 2048, kT32, true, cuda::WgmmaX::f16, true);
}

}  // namespace tern::bench
