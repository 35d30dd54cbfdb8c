#include "cuda/kernels/qmv/qmv.cuh"
#include "cuda/kernels/qmv/qmv_dp4a.cuh"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::cuda {

namespace qtile {

int max_dynamic_smem() {
  return smem_optin_bytes();
}

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    TERN_CUDA(cudaGetDevice(&dev));
    TERN_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

int allow_dynamic_smem(const void* kernel) {
  static std::mutex mu;
  static std::map<const void*, int> done;
  std::lock_guard<std::mutex> lock(mu);
  auto it = done.find(kernel);
  if (it != done.end()) return it->second;
  // The opt-in limit covers static and dynamic shared memory together.
  cudaFuncAttributes fa{};
  TERN_CUDA(cudaFuncGetAttributes(&fa, kernel));
  const int limit = max_dynamic_smem() - int(fa.sharedSizeBytes);
  TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limit));
  done.emplace(kernel, limit);
  return limit;
}

int blocks_fit(const void* kernel, int smem) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> occ;
  std::lock_guard<std::mutex> lock(mu);
  auto it = occ.find({kernel, smem});
  if (it != occ.end()) return it->second;
  int fit = 0;
  TERN_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, kThreads, size_t(smem)));
  occ.emplace(std::make_pair(kernel, smem), fit);
  return fit;
}

int persistent_grid(const void* kernel, int smem, int64_t work_blocks) {
  const int bps = std::max(1, std::min(tuning().blocks_per_sm, blocks_fit(kernel, smem)));
  return int(std::max<int64_t>(1, std::min<int64_t>(int64_t(sm_count()) * bps, work_blocks)));
}

int balanced_grid(const void* kernel, int64_t batches, int tokens) {
  const int64_t max_warps = int64_t(std::max(1, blocks_fit(kernel, 0))) * sm_count() * kWarps;
  const int64_t all = batches * tokens;
  const int64_t rounds = std::max<int64_t>(1, (all + max_warps - 1) / max_warps);
  const int64_t warps = (all + rounds - 1) / rounds;
  const int64_t blocks = std::max<int64_t>(1, (warps + kWarps - 1) / kWarps);
  return int(std::max<int64_t>(1, blocks / tokens));  // rounded down: tokens · blocks stays within the wave
}

namespace {
Tuning& tuning_ref() {
  static Tuning t = [] {
    Tuning v;
    if (const char* e = std::getenv("TERN_QMV_BPS")) v.blocks_per_sm = std::clamp(std::atoi(e), 1, 4);
    if (const char* e = std::getenv("TERN_QMV_DEPTH")) {
      const int d = std::atoi(e);
      if (d == 4 || d == 6 || d == 8) v.depth = d;
    }
    if (const char* e = std::getenv("TERN_QMV_VARIANT")) v.variant = std::clamp(std::atoi(e), 0, 3);
    return v;
  }();
  return t;
}
}  // namespace

Tuning tuning() { return tuning_ref(); }
void set_tuning(const Tuning& t) {
  Tuning v = t;
  v.blocks_per_sm = std::clamp(v.blocks_per_sm, 1, 4);
  if (v.depth != 4 && v.depth != 8) v.depth = 6;
  v.variant = std::clamp(v.variant, 0, 3);
  tuning_ref() = v;
}

}  // namespace qtile

namespace {

using qtile::kTokens;

// ---- tensor-core path (affine4, group 64) ---------------------------------------------------------------------

struct QmvQ4Params {
  const uint32_t* words;   // expert slice [rows][row_words]
  const uint16_t* scales;  // [rows][gpr]
  const uint16_t* biases;
  int rows, row_words, gpr;
  const float* x;
  int64_t ldx;
  int T;
  const float* norm_w;
  float eps;
  bool vec_x;
  float* y;
  int64_t ldy;
  bool accumulate;
  qtile::StageLayout layout;  // rows = T, cols = the matrix's cols
};

// Staged rows = tokens; the staged value is x·norm_w (the RMSNorm factor multiplies the output) or x.
struct QmvSrc {
  const float* x;
  int64_t ldx;
  const float* norm_w;
  bool vec;
  bool norm;
  __device__ void load8(int r, int c, float xw[8], float& ss) const {
    qtile::load8_f32(x + r * ldx + c, vec, xw);
    if (norm) {
      float w[8];
      qtile::load8_f32(norm_w + c, true, w);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        ss = fmaf(xw[j], xw[j], ss);
        xw[j] *= w[j];
      }
    }
  }
};

// The block's rows [r0, r1) in tiles of 16 rows from r0; mma row m of tile j is row r0 + 16·j + m. UG groups per step.
template <int UG>
struct QmvJob {
  int spt;
  const uint32_t* words;
  const uint16_t* scales;
  const uint16_t* biases;
  int row_words, gpr;
  int r0, r1;
  int g, tig;
  qtile::StepB bsrc;
  float* y;
  int64_t ldy;
  bool accumulate;
  int T;
  const float* rinv;  // shared [kTokens] or nullptr (no norm)

  __device__ bool known(int, int) const { return true; }
  __device__ int group(int q) const { return UG * q; }
  __device__ qtile::StepRows rows(int j, int) const {
    const int ra = r0 + 16 * j + g, rb = ra + 8, end = min(r0 + 16 * j + 16, r1);
    const int rs = (tig & 1) ? rb : ra;
    qtile::StepRows r;
    r.wa = ra < end ? words + ra * row_words : nullptr;
    r.wb = rb < end ? words + rb * row_words : nullptr;
    r.sb = rs < end ? (tig < 2 ? scales : biases) + rs * gpr : nullptr;
    return r;
  }
  __device__ qtile::StepB b(int, int) const { return bsrc; }
  __device__ void store(int j, int m, int t, float v0, float v1) const {
    if (t >= T) return;
    const int ra = r0 + 16 * j + m, rb = ra + 8, end = min(r0 + 16 * j + 16, r1);
    const float f = rinv ? rinv[t] : 1.0f;
    float* dst = y + t * ldy;
    if (ra < end) dst[ra] = accumulate ? dst[ra] + v0 * f : v0 * f;
    if (rb < end) dst[rb] = accumulate ? dst[rb] + v1 * f : v1 * f;
  }
};

// The job of the block's rows [r0, r1) (the q4 kernels' lane g, tig): B fragments from the staged tokens.
template <int UG>
__device__ __forceinline__ QmvJob<UG> qmv_job(const QmvQ4Params& p, const qtile::StageSmem& S, int r0, int r1, int g,
                                              int tig) {
  const int row_u4 = p.layout.row_u4(), gpr = p.gpr;
  QmvJob<UG> job;
  job.spt = gpr / UG;
  job.words = p.words;
  job.scales = p.scales;
  job.biases = p.biases;
  job.row_words = p.row_words;
  job.gpr = gpr;
  job.r0 = r0;
  job.r1 = r1;
  job.g = g;
  job.tig = tig;
  job.bsrc.brow = g < p.T ? S.xs + g * row_u4 : nullptr;
  job.bsrc.k0 = 2 * tig < p.T ? S.ktab + (2 * tig) * gpr : nullptr;
  job.bsrc.k1 = 2 * tig + 1 < p.T ? S.ktab + (2 * tig + 1) * gpr : nullptr;
  job.y = p.y;
  job.ldy = p.ldy;
  job.accumulate = p.accumulate;
  job.T = p.T;
  job.rinv = p.norm_w ? S.rinv : nullptr;
  return job;
}

// Stages the tokens' activations (x·norm_w with a norm) and, with a norm, their RMSNorm factors in S.rinv. Ends with
// a barrier.
__device__ __forceinline__ void stage_x(const QmvQ4Params& p, const qtile::StageSmem& S) {
  const QmvSrc src{p.x, p.ldx, p.norm_w, p.vec_x, p.norm_w != nullptr};
  qtile::stage_activations(src, p.layout, S);
  __syncthreads();
  if (p.norm_w) {
    if (int(threadIdx.x) < p.T) S.rinv[threadIdx.x] = qtile::row_rinv(S, p.layout, threadIdx.x, p.eps);
    __syncthreads();
  }
}

// Persistent grid: block b owns rows [b·rows/grid, (b+1)·rows/grid); its warps split the block's steps evenly.
// D steps of UG groups in flight per warp.
template <int D, int UG>
__global__ void __launch_bounds__(qtile::kThreads, qtile::min_blocks(D, UG)) qmv_q4_kernel(const QmvQ4Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const qtile::StageSmem S = qtile::carve_stage(smem, p.layout);
  const int r0 = int(int64_t(blockIdx.x) * p.rows / gridDim.x);
  const int r1 = int(int64_t(blockIdx.x + 1) * p.rows / gridDim.x);
  const int tiles = (r1 - r0 + 15) / 16;
  const QmvJob<UG> job = qmv_job<UG>(p, S, r0, r1, g, tig);
  const int steps = tiles * job.spt;
  const int lo = qtile::range_lo(warp, steps), hi = qtile::range_lo(warp + 1, steps);

  // Weights do not depend on earlier kernels: the first D steps are in flight before the wait.
  qtile::Ring<D, UG> ring = {};
  qtile::ring_fill(ring, job, lo, hi, true, tig);
  pdl_trigger();
  pdl_wait();
  stage_x(p, S);
  qtile::ring_run(ring, job, lo, hi, S.slots, warp, lane);
  __syncthreads();
  qtile::finish_cut_tiles(job, S.slots, steps, p.T);
}

// ---- variant 2: the steps of variant 1 through a per-warp cp.async pipeline ------------------------------------
//
// A step (tile j, groups 4q .. 4q+3) is 16 rows × 256 columns: 16 × 128 contiguous bytes of words. Lane l copies
// 16-byte piece l % 8 of rows l / 8 + 4i (i = 0..3), so each warp-level copy reads 4 whole 128-byte row segments
// (instead of 8 bytes of 16 rows per load as in the register ring), plus the 16 rows' 4 scales (lanes 0..15) and 4
// biases (lanes 16..31), 8 bytes each. D stages per warp (one commit group per step, empty groups past the range
// keep the count uniform); the first D are issued before pdl_wait(). Rows past the block's end are zero-filled.
// The lane then reads exactly the registers of variant 1's slot from the stage and runs compute_step<4>; the step
// split is variant 1's, so the results are bit-identical.
constexpr int kCpRowBytes = 160;                  // 128 bytes + 32 of padding: fragment reads conflict-free
constexpr int kCpWordBytes = 16 * kCpRowBytes;    // the stage's words [16][40] uint32
constexpr int kCpStageBytes = kCpWordBytes + 256;  // + [2 (scales, biases)][16 rows][4] bf16

// Shared memory of variant 2 beyond the staging layout: D stages per warp.
constexpr int cp_stage_smem(int D) { return qtile::kWarps * D * kCpStageBytes; }

__device__ __forceinline__ void cp_issue_step(uint32_t st, const QmvJob<4>& job, int j, int q, int lane) {
  const int tr = job.r0 + 16 * j, end = min(tr + 16, job.r1), piece = lane & 7;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = 4 * i + (lane >> 3), r = tr + row;
    const bool ok = r < end;
    const uint32_t* src = job.words + (ok ? r * job.row_words + 32 * q + 4 * piece : 0);
    cp_async_16(st + row * kCpRowBytes + piece * 16, src, ok ? 16u : 0u);
  }
  const int row = lane & 15, r = tr + row;
  const bool ok = r < end;
  const uint16_t* arr = lane < 16 ? job.scales : job.biases;
  qtile::cp_async_8(st + kCpWordBytes + lane * 8, arr + (ok ? r * job.gpr + 4 * q : 0), ok ? 8u : 0u);
}

// Variant 1's slot of this lane from a stage: words 2tig, 2tig+1 of the 4 groups of rows g and g+8, and the bf16
// pairs of its quad role (tig 0: scales of row g, 1: scales of row g+8, 2: biases of row g, 3: biases of row g+8).
__device__ __forceinline__ void cp_read_slot(const unsigned char* st, qtile::SlotT<4>& sl, int g, int tig) {
  const unsigned char* ra = st + g * kCpRowBytes + 8 * tig;
  const unsigned char* rb = ra + 8 * kCpRowBytes;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    sl.q[0][u] = *reinterpret_cast<const uint2*>(ra + 32 * u);
    sl.q[1][u] = *reinterpret_cast<const uint2*>(rb + 32 * u);
  }
  const uint2 v =
      *reinterpret_cast<const uint2*>(st + kCpWordBytes + ((tig >> 1) * 16 + g + 8 * (tig & 1)) * 8);
  sl.sb[0] = v.x;
  sl.sb[1] = v.y;
}

template <int D>
__global__ void __launch_bounds__(qtile::kThreads, 2) qmv_q4_cp_kernel(const QmvQ4Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const qtile::StageSmem S = qtile::carve_stage(smem, p.layout);
  unsigned char* stages = smem + p.layout.bytes() + warp * D * kCpStageBytes;
  const uint32_t stages_s = smem_addr(stages);
  const int r0 = int(int64_t(blockIdx.x) * p.rows / gridDim.x);
  const int r1 = int(int64_t(blockIdx.x + 1) * p.rows / gridDim.x);
  const int tiles = (r1 - r0 + 15) / 16;
  const QmvJob<4> job = qmv_job<4>(p, S, r0, r1, g, tig);
  const int spt = job.spt;
  const int steps = tiles * spt;
  const int lo = qtile::range_lo(warp, steps), hi = qtile::range_lo(warp + 1, steps);

  // The first D steps in flight before the wait (weights do not depend on earlier kernels).
  qtile::Cursor lc = qtile::cursor_at(lo, spt);
#pragma unroll
  for (int d = 0; d < D; ++d) {
    if (lc.s < hi) {
      cp_issue_step(stages_s + d * kCpStageBytes, job, lc.j, lc.q, lane);
      lc.next(spt);
    }
    cp_async_commit();
  }
  pdl_trigger();
  pdl_wait();
  stage_x(p, S);

  // ring_run's bookkeeping, the slot read from stage d (then refilled with step s + D before the MMAs).
  const int first_tile = lo / spt;
  qtile::Cursor cc = qtile::cursor_at(lo, spt);
  int piece_q0 = cc.q;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int d = 0;
#pragma unroll 1
  for (int s = lo; s < hi; ++s) {
    cp_async_wait<D - 1>();  // this lane's copies of step s have landed
    __syncwarp();                   // and every lane's
    qtile::SlotT<4> sl;
    cp_read_slot(stages + d * kCpStageBytes, sl, g, tig);
    __syncwarp();  // every lane has read stage d
    if (lc.s < hi) {
      cp_issue_step(stages_s + d * kCpStageBytes, job, lc.j, lc.q, lane);
      lc.next(spt);
    }
    cp_async_commit();
    d = d + 1 == D ? 0 : d + 1;
    qtile::compute_step<4>(sl, job.group(cc.q), job.bsrc, acc, lane);
    const bool tile_end = cc.q == spt - 1, range_end = cc.s == hi - 1;
    if (tile_end || range_end) {
      if (piece_q0 == 0 && tile_end) {  // the whole tile: epilogue now
        job.store(cc.j, g, 2 * tig, acc[0], acc[2]);
        job.store(cc.j, g, 2 * tig + 1, acc[1], acc[3]);
      } else {
        qtile::put_slot(S.slots, 2 * warp + (cc.j == first_tile ? 0 : 1), acc, lane);
      }
      acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
      piece_q0 = 0;
    }
    cc.next(spt);
  }
  __syncthreads();
  qtile::finish_cut_tiles(job, S.slots, steps, p.T);
}

// ---- generic path (every format) ------------------------------------------------------------------------------

struct QmvGenericParams {
  DMat w;
  int64_t expert;
  const float* x;
  int64_t ldx;
  int T;
  const float* norm_w;
  float eps;
  float* y;
  int64_t ldy;
  bool accumulate;
};

struct GenericX {
  const float* x;
  int64_t ldx;
  const float* norm_w;
  const float* inv;  // shared [kTokens]
  __device__ void load8(int t, int64_t c, float v[8]) const {
    const float f = inv[t];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = x[t * ldx + c + j] * f;
    if (norm_w) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] *= norm_w[c + j];
    }
  }
};

// One warp per R rows; 8 warps per block.
template <WeightFormat F, int R>
__global__ void __launch_bounds__(256) qmv_generic_kernel(const QmvGenericParams p) {
  __shared__ float red[8 * kTokens];
  __shared__ float inv[kTokens];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  pdl_wait();
  qtile::block_rms_factors(p.x, p.ldx, p.w.cols, p.T, p.norm_w != nullptr, p.eps, red, inv);
  pdl_trigger();
  const int64_t row0 = (int64_t(blockIdx.x) * 8 + warp) * R;
  if (row0 >= p.w.rows) return;
  int64_t rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = min(row0 + r, p.w.rows - 1);
  float acc[R][kTokens] = {};
  const GenericX xs{p.x, p.ldx, p.norm_w, inv};
  qtile::generic_dot<F, R>(p.w, p.expert, rows, xs, p.T, acc, lane);
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      if (t >= p.T) break;
      const float v = warp_sum(acc[r][t]);
      if (lane == 0 && row0 + r < p.w.rows) {
        float* dst = p.y + t * p.ldy + row0 + r;
        *dst = p.accumulate ? *dst + v : v;
      }
    }
}

template <WeightFormat F>
void launch_generic(const QmvArgs& a, cudaStream_t stream) {
  const QmvGenericParams p{a.w, a.expert, a.x, a.ldx, a.T, a.norm_w, a.eps, a.y, a.ldy, a.accumulate};
  if (a.w.rows >= 4096) {
    launch_pdl("qmv_generic", qmv_generic_kernel<F, 4>, dim3(blocks_for(a.w.rows, 32)), dim3(256), 0, stream, p);
  } else {
    launch_pdl("qmv_generic", qmv_generic_kernel<F, 1>, dim3(blocks_for(a.w.rows, 8)), dim3(256), 0, stream, p);
  }
}

template <int D, int UG>
void launch_q4_depth(const QmvQ4Params& p, int64_t work_blocks, int smem, cudaStream_t stream) {
  auto kernel = qmv_q4_kernel<D, UG>;
  const void* k = reinterpret_cast<const void*>(kernel);
  const int limit = qtile::allow_dynamic_smem(k);
  TERN_CHECK(smem <= limit, "qmv: ", smem, " bytes of shared memory needed, the device allows ", limit);
  const int grid = qtile::persistent_grid(k, smem, work_blocks);
  launch_pdl("qmv_q4", kernel, dim3(unsigned(grid)), dim3(qtile::kThreads), size_t(smem), stream, p);
}

template <int D>
bool launch_q4_cp(const QmvQ4Params& p, int64_t work_blocks, int smem, cudaStream_t stream) {
  auto kernel = qmv_q4_cp_kernel<D>;
  const void* k = reinterpret_cast<const void*>(kernel);
  const int total = smem + cp_stage_smem(D);
  if (total > qtile::allow_dynamic_smem(k)) return false;
  const int grid = qtile::persistent_grid(k, total, work_blocks);
  launch_pdl("qmv_q4_cp", kernel, dim3(unsigned(grid)), dim3(qtile::kThreads), size_t(total), stream, p);
  return true;
}

// Shared memory the tensor-core path needs for T tokens of `cols` columns.
int q4_smem(int T, int64_t cols) {
  qtile::StageLayout L;
  L.rows = T;
  L.cols = int(cols);
  return L.bytes();
}

void launch_q4(const QmvArgs& a, cudaStream_t stream) {
  const DMat& w = a.w;
  QmvQ4Params p;
  const int64_t e = a.expert;
  p.words = static_cast<const uint32_t*>(w.data) + e * w.rows * w.row_words;
  p.scales = w.scales + e * w.rows * w.groups_per_row;
  p.biases = w.biases + e * w.rows * w.groups_per_row;
  p.rows = int(w.rows);
  p.row_words = int(w.row_words);
  p.gpr = int(w.groups_per_row);
  p.x = a.x;
  p.ldx = a.ldx;
  p.T = a.T;
  p.norm_w = a.norm_w;
  p.eps = a.eps;
  p.vec_x = ((reinterpret_cast<uintptr_t>(a.x) | uintptr_t(a.ldx * 4)) & 15) == 0;
  p.y = a.y;
  p.ldy = a.ldy;
  p.accumulate = a.accumulate;
  p.layout.rows = a.T;
  p.layout.cols = int(w.cols);
  const int smem = p.layout.bytes();
  const int64_t tiles = (w.rows + 15) / 16;
  const qtile::Tuning tu = qtile::tuning();
  // Variant 2: variant 1's steps through the cp.async pipeline, depth/2 stages per warp; its 16-byte copies want
  // 16-byte aligned words (row starts are: row_words % 32 == 0), its 8-byte scale/bias copies 8-byte aligned bases.
  const bool cp_ok = tu.variant == 2 && p.gpr % 4 == 0 &&
                     ((reinterpret_cast<uintptr_t>(p.scales) | reinterpret_cast<uintptr_t>(p.biases)) & 7) == 0 &&
                     (reinterpret_cast<uintptr_t>(p.words) & 15) == 0;
  if (cp_ok) {
    bool done = false;
    switch (tu.depth) {
      case 4: done = launch_q4_cp<2>(p, tiles, smem, stream); break;
      case 8: done = launch_q4_cp<4>(p, tiles, smem, stream); break;
      default: done = launch_q4_cp<3>(p, tiles, smem, stream); break;
    }
    if (done) return;
  }
  // Variant 1 (and 2 where it cannot run): 4 groups per step, depth/2 steps in flight (the same bytes as variant 0
  // at that depth); its scale and bias loads are 8 bytes (gpr % 4 == 0 as cols % 256 == 0, so only the bases matter).
  const bool wide = tu.variant >= 1 && p.gpr % 4 == 0 &&
                    ((reinterpret_cast<uintptr_t>(p.scales) | reinterpret_cast<uintptr_t>(p.biases)) & 7) == 0;
  if (wide) {
    switch (tu.depth) {
      case 4: launch_q4_depth<2, 4>(p, tiles, smem, stream); break;
      case 8: launch_q4_depth<4, 4>(p, tiles, smem, stream); break;
      default: launch_q4_depth<3, 4>(p, tiles, smem, stream); break;
    }
    return;
  }
  switch (tu.depth) {
    case 4: launch_q4_depth<4, 2>(p, tiles, smem, stream); break;
    case 8: launch_q4_depth<8, 2>(p, tiles, smem, stream); break;
    default: launch_q4_depth<6, 2>(p, tiles, smem, stream); break;
  }
}

}  // namespace

int qmv_variant() { return qtile::tuning().variant; }
void qmv_set_variant(int v) {
  qtile::Tuning t = qtile::tuning();
  t.variant = v;
  qtile::set_tuning(t);
}

bool qmv_takes_dp4a(const QmvArgs& a) {
  return qtile::tuning().variant == 3 && qmv_dp4a_supported(a) && a.w.rows >= qmv_dp4a_min_rows();
}

void qmv(const QmvArgs& a, cudaStream_t stream) {
  const DMat& w = a.w;
  TERN_CHECK(!w.empty() && a.x && a.y, "qmv: null matrix, input or output");
  TERN_CHECK(a.T >= 1 && a.T <= kQmvMaxTokens, "qmv: T = ", a.T, " outside 1..", kQmvMaxTokens);
  TERN_CHECK(a.expert >= 0 && a.expert < w.experts, "qmv: expert ", a.expert, " of ", w.experts);
  TERN_CHECK(w.cols % 8 == 0, "qmv: cols = ", w.cols, " not a multiple of 8");
  TERN_CHECK(a.T == 1 || (a.ldx >= w.cols && a.ldy >= w.rows), "qmv: ldx ", a.ldx, " / ldy ", a.ldy,
             " smaller than the matrix [", w.rows, ", ", w.cols, "]");
  TERN_CHECK((reinterpret_cast<uintptr_t>(a.norm_w) & 15) == 0, "qmv: norm_w must be 16-byte aligned");
  QmvArgs b = a;
  if (b.T == 1) {  // strides unused for one token; keep them sane for the index arithmetic
    b.ldx = std::max(b.ldx, w.cols);
    b.ldy = std::max(b.ldy, w.rows);
  }
  if (qmv_takes_dp4a(b)) {
    qmv_dp4a(b, stream);
    return;
  }
  if (qtile::q4_fast_ok(w) && q4_smem(b.T, w.cols) <= qtile::max_dynamic_smem() - 1024) {
    launch_q4(b, stream);
    return;
  }
  switch (w.format) {
    case WeightFormat::f32: launch_generic<WeightFormat::f32>(b, stream); break;
    case WeightFormat::bf16: launch_generic<WeightFormat::bf16>(b, stream); break;
    case WeightFormat::affine4: launch_generic<WeightFormat::affine4>(b, stream); break;
    case WeightFormat::affine8: launch_generic<WeightFormat::affine8>(b, stream); break;
  }
}

}  // namespace tern::cuda
