// The prefill plan of the CUDA runner (cuda_runner_impl.cuh), for chunks of more than kQmvMaxTokens tokens: the inputs
// of the matrix products prepared once per input (fp16, bf16 hi + lo or 16-bit integers, by kernel and site), the
// Gated DeltaNet mixer (the chunked form from 64 tokens), the attention mixer, and the MoE block with its expert
// products grouped by expert.
#include "cuda/runner/cuda_runner_impl.cuh"

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/kernels/attention/attention.cuh"
#include "cuda/kernels/conv1d/conv1d.cuh"
#include "cuda/kernels/gdn/gdn.cuh"
#include "cuda/kernels/moe/moe.cuh"
#include "cuda/kernels/norm/norm.cuh"
#include "cuda/kernels/qmatmul/qmatmul.cuh"
#include "cuda/kernels/qmatmul/qmatmul_int8.cuh"
#include "cuda/kernels/qmatmul/qmatmul_wgmma.cuh"

namespace tern::cuda {

// TERN_MOE_TILE_TOKENS=auto (the default): the chunk's grouped expert tiles hold at most 16 tokens where its average
// tokens per expert T·k/E is at most kMoeTile16MaxAverage, 32 where at most kMoeTile32MaxAverage, else 64 (on the
// model, k = 8 of E = 256: 16 up to 384 tokens, 32 up to 1,024). From the H200's prefill at 256 / 512 / 1K / 4K tokens
// (averages 8 / 16 / 32 / 128; the constructor's comment has the figures): 16 fastest at 256, 16 and 32 even at 512,
// 32 at 1K, 64 at 4K; 2K (64 on average) not measured. A narrower block does less padded tensor work but reads an
// expert's weights once per tile, and an expert past the width takes two tiles.
constexpr int64_t kMoeTile16MaxAverage = 12, kMoeTile32MaxAverage = 32;

// y [T, rows] (+)= x [T, cols] · Wᵀ, y's row stride ldy (0: rows)
// prep: x prepared by prepare_x (the kernels read it instead of converting x in every block); exact: the product
// takes prep.q16 (the integer kernel's 16-bit x) whenever it is there.
void CudaRunner::proj(const DMat& w, const float* x, int64_t T, float* y, bool accumulate, const PreparedX& prep,
                      bool exact, int64_t ldy) {
  if (T == 1) {
    GemvArgs a;
    a.w = w;
    a.x = x;
    a.y = y;
    a.accumulate = accumulate;
    gemv(a, stream_);
  } else {
    MatmulArgs a;
    a.w = w;
    a.x = x;
    a.ldx = w.cols;
    a.y = y;
    a.ldy = ldy > 0 ? ldy : w.rows;
    a.tokens = T;
    a.accumulate = accumulate;
    matmul(a, stream_, with_prepared_x(a, prep, exact));
  }
}

PreparedX CudaRunner::prepare_x(const float* x, int64_t ldx, int64_t T, int64_t cols, PrefillSite site,
                                bool with_8bit, bool with_rest) {
  PreparedX p;
  if (fp32_prefill_ || T <= 1) return p;
  const PrefillKernel kernel = site_kernel(site);
  p.split = kernel == PrefillKernel::wgmma_split && prefill_kernel_ == PrefillKernel::wgmma_f16;
  if (!prep_fits(kernel, T, cols)) return p;
  switch (kernel) {
    case PrefillKernel::int8:
      with_rest = with_rest && with_8bit && matmul_q16_bytes(T, cols) <= int64_t(prep_q16_bytes_);
      matmul_quantize_x(x, ldx, T, cols, prep_, stream_, with_rest ? prep_q16_rest_ : nullptr);
      p.main = p.q16 = prep_;
      if (with_rest) p.q16_rest = prep_q16_rest_;
      return p;
    case PrefillKernel::wgmma_f16:
      matmul_prepare_x_f16(x, ldx, T, cols, prep_, stream_);
      p.main = prep_;
      break;
    case PrefillKernel::split:  // no 16-bit x: the 8-bit products take the fp32 SIMT kernel
      with_8bit = false;
      [[fallthrough]];
    case PrefillKernel::wgmma_split:
      p.pair = takes_pair(site, T, cols);
      if (p.pair) {
        matmul_prepare_x_f16x2(x, ldx, T, cols, prep_, stream_);
      } else {
        matmul_prepare_x(x, ldx, T, cols, prep_, stream_);
      }
      p.main = prep_;
      break;
  }
  if (with_8bit && cols % 128 == 0 && matmul_q16_bytes(T, cols) <= int64_t(prep_q16_bytes_)) {
    matmul_quantize_x(x, ldx, T, cols, prep_q16_, stream_, with_rest ? prep_q16_rest_ : nullptr);
    p.q16 = prep_q16_;
    if (with_rest) p.q16_rest = prep_q16_rest_;
  }
  return p;
}

// Whether prepare_x prepares x [T, cols] in `kernel`'s form: the form's column multiple, and prep_ holds it.
bool CudaRunner::prep_fits(PrefillKernel kernel, int64_t T, int64_t cols) const {
  switch (kernel) {
    case PrefillKernel::int8: return cols % 128 == 0 && matmul_q16_bytes(T, cols) <= int64_t(prep_bytes_);
    case PrefillKernel::wgmma_f16: return cols % 512 == 0 && matmul_f16_bytes(T, cols) <= int64_t(prep_bytes_);
    case PrefillKernel::split:
    case PrefillKernel::wgmma_split: return cols % 64 == 0 && matmul_prepared_bytes(T, cols) <= int64_t(prep_bytes_);
  }
  return false;
}

// Whether x [T, cols] at `site` takes fp16 hi + lo (matmul_prepare_x_f16x2) where it would take bf16 hi + lo on the
// warpgroup kernel: a site of pair_sites_ (15 with the i16 cache, or TERN_PREFILL_PAIR_SITES), columns the kernel
// takes (a multiple of 512; the products of other widths keep bf16 hi + lo for the other kernels), and prep_ holds
// the layout.
bool CudaRunner::takes_pair(PrefillSite site, int64_t T, int64_t cols) const {
  return (pair_sites_ & site) && !fp32_prefill_ && T > 1 && site_kernel(site) == PrefillKernel::wgmma_split &&
         cols % 512 == 0 && matmul_f16x2_bytes(T, cols) <= int64_t(prep_bytes_);
}

// Whether the 4-bit product of w on an input at `site` of T rows, prepared by prepare_x without the 8-bit forms,
// runs on the warpgroup kernel (as prepare_x and with_prepared_x decide).
bool CudaRunner::runs_wgmma(PrefillSite site, const DMat& w, int64_t T) const {
  const PrefillKernel kernel = site_kernel(site);
  return !fp32_prefill_ && T > 1 && (kernel == PrefillKernel::wgmma_f16 || kernel == PrefillKernel::wgmma_split) &&
         prep_fits(kernel, T, w.cols) && matmul_wgmma_takes(w);
}

// The kernel the products at `site` take x for: the warpgroup kernel's fp16 input only at the chunk's fp16 sites.
CudaRunner::PrefillKernel CudaRunner::site_kernel(PrefillSite site) const {
  if (prefill_kernel_ == PrefillKernel::wgmma_f16 && !(chunk_f16_sites_ & site)) return PrefillKernel::wgmma_split;
  return prefill_kernel_;
}

// normed_ [T, D] = rmsnorm(hidden_)·w, prepared for the products at `site` as prepare_x prepares it: in one pass over
// hidden_ (rmsnorm_prepare) where the site takes bf16 or fp16 hi + lo (and the 8-bit products the 16-bit forms), else
// rmsnorm then prepare_x. The same forms either way (rmsnorm_prepare sums the squares in another order).
PreparedX CudaRunner::norm_prepare(const float* w, int64_t T, PrefillSite site, bool with_8bit, bool with_rest) {
  const int64_t D = w_->config.hidden_size;
  const float eps = float(w_->config.rms_norm_eps);
  const PrefillKernel kernel = site_kernel(site);
  const bool split_x = kernel == PrefillKernel::wgmma_split || kernel == PrefillKernel::split;
  const bool pair = takes_pair(site, T, D);  // then prep_ holds fp16 hi + lo (takes_pair checks its size)
  if (fp32_prefill_ || T <= 1 || !split_x || !rmsnorm_prepare_takes(D) ||
      (!pair && matmul_prepared_bytes(T, D) > int64_t(prep_bytes_))) {
    rmsnorm(hidden_, w, eps, T, D, normed_, stream_);
    return prepare_x(normed_, D, T, D, site, with_8bit, with_rest);
  }
  // As prepare_x: the split-x kernel's 8-bit products take the fp32 SIMT kernel (no 16-bit x).
  const bool q16 = with_8bit && kernel != PrefillKernel::split && matmul_q16_bytes(T, D) <= int64_t(prep_q16_bytes_);
  const bool rest = q16 && with_rest;
  rmsnorm_prepare(hidden_, w, eps, T, D, normed_, pair ? nullptr : prep_, q16 ? prep_q16_ : nullptr,
                  rest ? prep_q16_rest_ : nullptr, stream_, pair ? prep_ : nullptr);
  PreparedX p;
  p.main = prep_;
  p.pair = pair;
  p.split = kernel == PrefillKernel::wgmma_split && prefill_kernel_ == PrefillKernel::wgmma_f16;
  if (q16) p.q16 = prep_q16_;
  if (rest) p.q16_rest = prep_q16_rest_;
  return p;
}

// Sets the prepared input on `a` (when a kernel that reads it takes the matrix) and picks the tile: the integer and
// warpgroup kernels choose their own; the split-x kernel's fastest with prepared x is 128×64 (docs/benchmarks.md).
MatmulTile CudaRunner::with_prepared_x(MatmulArgs& a, const PreparedX& prep, bool exact) const {
  if (fp32_prefill_) return MatmulTile::simt;
  if (prep.q16 && matmul_int8_takes(a.w) &&
      (exact || prefill_kernel_ == PrefillKernel::int8 || a.w.format != WeightFormat::affine4)) {
    a.x_q16 = prep.q16;
    a.x_q16_cols = a.w.cols;
    return MatmulTile::automatic;
  }
  if (!prep.main || a.w.format != WeightFormat::affine4) return MatmulTile::automatic;
  switch (prep.split ? PrefillKernel::wgmma_split : prefill_kernel_) {
    case PrefillKernel::int8: return MatmulTile::automatic;
    case PrefillKernel::wgmma_f16:
      if (matmul_wgmma_takes(a.w)) {
        a.x_f16 = prep.main;
        a.x_f16_cols = a.w.cols;
      }
      return MatmulTile::automatic;
    case PrefillKernel::wgmma_split:
      // fp16 hi + lo: the warpgroup kernel alone reads it (a matrix it does not take runs on fp32 x).
      if (prep.pair && !matmul_wgmma_takes(a.w)) return MatmulTile::automatic;
      a.x_prep = prep.main;
      a.x_prep_cols = a.w.cols;
      a.x_prep_f16 = prep.pair;
      return matmul_wgmma_takes(a.w) ? MatmulTile::wgmma : MatmulTile::tc128x64;
    case PrefillKernel::split: break;
  }
  a.x_prep = prep.main;
  a.x_prep_cols = a.w.cols;
  a.x_prep_f16 = false;
  return MatmulTile::tc128x64;
}

void CudaRunner::gdn_mixer(const DeviceLayer& l, CudaSession::LayerCache& lc, int64_t T) {
  const Config& c = w_->config;
  GdnDims d = gdn_dims(T);
  const int64_t C = d.C();
  // The decay and write-strength gates (b, a: 32 rows each) steer the recurrence over the whole sequence: when the
  // in_proj takes x as fp16 they take the 16-bit integer x instead (exact_gates_); on bf16 or fp16 hi + lo they
  // share the in_proj's input.
  const bool gates_q16 = exact_gates_ && (chunk_f16_sites_ & kGdnIn);
  // in_proj_out_ [T, P] = [qkv_raw (C) | z (Z) | b (Hv) | a (Hv)]: one product over the matrices stored back to back
  // (in_proj_all), else one per matrix into its columns; the gates on the 16-bit x when gates_q16.
  const int64_t Z = int64_t(d.Hv) * d.dv, P = C + Z + 2 * d.Hv;
  float *qkv_raw = in_proj_out_, *z = qkv_raw + C, *b = z + Z, *a = b + d.Hv;
  const PreparedX xp = norm_prepare(l.input_norm, T, kGdnIn, gates_q16);
  if (l.in_proj_all.rows == P && !gates_q16) {
    proj(l.in_proj_all, normed_, T, in_proj_out_, false, xp);
  } else {
    proj(l.in_proj_qkv, normed_, T, qkv_raw, false, xp, false, P);
    proj(l.in_proj_z, normed_, T, z, false, xp, false, P);
    proj(l.in_proj_b, normed_, T, b, false, xp, /*exact=*/true, P);
    proj(l.in_proj_a, normed_, T, a, false, xp, /*exact=*/true, P);
  }
  d.ld_ba = d.ld_z = P;
  if (d.dk == 128) {  // the q/k norms inside the convolution (a warp per 128-channel head), then the gates
    conv1d_silu_qknorm(qkv_raw, P, T, C, c.linear_conv_kernel_dim, l.conv1d, lc.conv, conv_out_,
                       int64_t(d.Hk) * d.dk, int64_t(d.Hk) * d.dk, d.dk, stream_);
    gdn_gates(b, a, l.A_log, l.dt_bias, d, g_, beta_, stream_);
  } else {
    conv1d_silu(qkv_raw, P, T, C, c.linear_conv_kernel_dim, l.conv1d, lc.conv, conv_out_, stream_);
    gdn_prepare(conv_out_, b, a, l.A_log, l.dt_bias, d, g_, beta_, stream_);
  }
  // Prefill: the chunked (WY) form through a workspace that aliases the MoE down-projection output (yd_, not live
  // here); short prompts and decode stay on the token-by-token recurrence.
  if (T >= 64)
    gdn_chunked(conv_out_, g_, beta_, lc.rec, d, o_, stream_, 64,
                fp32_prefill_ ? GdnChunkedKernel::simt : gdn_prefill_kernel_, yd_, yd_bytes_);
  else
    gdn_recurrent(conv_out_, g_, beta_, lc.rec, d, o_, stream_);
  gdn_gated_norm(o_, z, l.gdn_norm, float(c.rms_norm_eps), d, gated_, stream_);
  proj(l.out_proj, gated_, T, hidden_, /*accumulate=*/true, prepare_x(gated_, Z, T, Z, kMixerOut));
}

void CudaRunner::attention_mixer(const DeviceLayer& l, CudaSession::LayerCache& lc, CudaSession& s, int64_t T,
                                 int64_t cap) {
  const Config& c = w_->config;
  const AttnDims d = attn_dims(T, cap);
  const PreparedX xp = norm_prepare(l.input_norm, T, kAttnIn);
  proj(l.q_proj, normed_, T, qg_, false, xp);
  proj(l.k_proj, normed_, T, k_, false, xp);
  proj(l.v_proj, normed_, T, v_, false, xp);
  attn_prepare(qg_, k_, v_, l.q_norm, l.k_norm, s.d_pos, d, q_, lc.k, lc.v, stream_, attn_rope(s));
  attention(q_, qg_, lc.k, lc.v, s.d_pos, d, attn_part_, attn_out_, stream_);
  const int64_t O = int64_t(d.Hq) * d.dh;
  proj(l.o_proj, attn_out_, T, hidden_, /*accumulate=*/true, prepare_x(attn_out_, O, T, O, kMixerOut));
}

void CudaRunner::moe(const DeviceLayer& l, int64_t T) {
  const Config& c = w_->config;
  const int E = c.num_experts, k = c.num_experts_per_tok;
  const int64_t D = c.hidden_size, F = c.moe_intermediate_size;
  // normed_ prepared once for the router, the shared-expert gate and the routed and shared gate/up products. The
  // 8-bit router takes x in two 16-bit terms (x to fp32's precision: a near-tie between experts is decided as in
  // fp32; TERN_PREFILL_ROUTER in the constructor). The shared-expert gate (a sigmoid, no choice to flip) takes the
  // first term only: its logit is off by ~1e-5 relative.
  const PreparedX xp = norm_prepare(l.post_attn_norm, T, kMoeIn, /*with_8bit=*/router_prefill_ != RouterPrefill::fp32,
                                    /*with_rest=*/router_prefill_ == RouterPrefill::exact);
  proj(l.router, normed_, T, router_logits_, false, xp);
  proj(l.shared_expert_gate, normed_, T, shared_logit_, false, xp);
  if (xp.q16_rest && matmul_int8_takes(l.router))  // the second term (any other product already took x whole)
    proj(l.router, normed_, T, router_logits_, true, PreparedX{.q16 = xp.q16_rest}, /*exact=*/true);
  moe_route(router_logits_, T, E, k, route_ids_, route_w_, stream_);
  const int* pos_of = nullptr;
  if (T == 1) {
    GemvArgs a;
    a.x = normed_;
    a.ids = route_ids_;
    a.slots = k;
    a.y_stride = F;
    a.w = l.expert_gate;
    a.y = hg_;
    gemv(a, stream_);
    a.w = l.expert_up;
    a.y = hu_;
    gemv(a, stream_);
    swiglu(hg_, hu_, k * F, hg_, stream_);
    a.w = l.expert_down;
    a.x = hg_;
    a.x_stride = F;
    a.y = yd_;
    a.y_stride = D;
    gemv(a, stream_);
    shared_expert(l, T, PreparedX{});
  } else {
    // hg_ prepared for the down product once the gate/up products are done. The tiles' width (moe_tile_tokens)
    // depends on the kernels of both grouped products: the gate/up product's is known from its arguments, the down
    // product's from its input's site (runs_wgmma).
    MatmulArgs a;
    a.x = normed_;
    a.ldx = D;
    a.ldy = F;
    a.w = l.expert_gate;
    a.y = hg_;
    const MatmulTile tile = with_prepared_x(a, xp);
    const bool wgmma = (a.x_f16 || tile == MatmulTile::wgmma) && runs_wgmma(kMoeDown, l.expert_down, T * k);
    const int tile_tokens = moe_tile_tokens(T, wgmma);
    moe_group(route_ids_, T, E, k, tile_tokens, groups_, stream_);
    set_tiles(a, groups_, moe_max_tiles(T, E, k), tile_tokens);
    a.gather = groups_.sorted_token;
    if (!fp32_prefill_ && matmul_swiglu_supported(a, l.expert_up)) {  // h = silu(gate·x) ⊙ (up·x) in one pass
      matmul_swiglu(a, l.expert_up, stream_, tile);
    } else {
      matmul(a, stream_, tile);
      a.w = l.expert_up;
      a.y = hu_;
      matmul(a, stream_, tile);
      swiglu(hg_, hu_, T * k * F, hg_, stream_);
    }
    shared_expert(l, T, xp);
    a.gather = nullptr;
    a.x = hg_;
    a.ldx = F;
    a.x_prep = nullptr;
    a.x_prep_f16 = false;
    a.x_q16 = nullptr;
    a.x_f16 = nullptr;
    a.w = l.expert_down;
    a.y = yd_;
    a.ldy = D;
    matmul(a, stream_, with_prepared_x(a, prepare_x(hg_, F, T * k, F, kMoeDown)));
    pos_of = groups_.pos_of;
  }
  moe_combine(hidden_, yd_, pos_of, route_w_, ys_, shared_logit_, T, D, k, stream_);
}

// The most tokens of the chunk's grouped expert tiles: TERN_MOE_TILE_TOKENS's width (16, 32 or 64, for any kernel),
// or with auto one by the chunk's average tokens per expert where the warpgroup kernel runs both grouped products
// (wgmma), whose blocks then take 16 or 32 tokens; 64 elsewhere (the other kernels' blocks hold 64 tokens whatever
// the width: narrower tiles would only leave more of them idle).
int CudaRunner::moe_tile_tokens(int64_t T, bool wgmma) const {
  if (moe_tile_tokens_ != 0) return moe_tile_tokens_;
  if (!wgmma) return kMatmulTileTokens;
  const Config& c = w_->config;
  const int64_t pairs = T * c.num_experts_per_tok, E = c.num_experts;  // average per expert: pairs / E
  if (pairs <= kMoeTile16MaxAverage * E) return 16;
  if (pairs <= kMoeTile32MaxAverage * E) return 32;
  return kMatmulTileTokens;
}

// The shared expert of the prefill plan: ys_ [T, D] = down(silu(gate·x) ⊙ (up·x)), x = normed_ (split in xp).
void CudaRunner::shared_expert(const DeviceLayer& l, int64_t T, const PreparedX& xp) {
  const Config& c = w_->config;
  const int64_t D = c.hidden_size, Fs = c.shared_expert_intermediate_size;
  MatmulArgs sa;
  sa.w = l.shared_gate;
  sa.x = normed_;
  sa.ldx = D;
  sa.y = sg_;
  sa.ldy = Fs;
  sa.tokens = T;
  const MatmulTile tile = with_prepared_x(sa, xp);
  if (T > 1 && !fp32_prefill_ && matmul_swiglu_supported(sa, l.shared_up)) {
    matmul_swiglu(sa, l.shared_up, stream_, tile);
  } else {
    proj(l.shared_gate, normed_, T, sg_, false, xp);
    proj(l.shared_up, normed_, T, su_, false, xp);
    swiglu(sg_, su_, T * Fs, sg_, stream_);
  }
  proj(l.shared_down, sg_, T, ys_, false, prepare_x(sg_, Fs, T, Fs, kMoeDown));  // xp is not read after this
}


}  // namespace tern::cuda
