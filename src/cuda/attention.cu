#include "cuda/attention.cuh"

#include <cmath>

#include "core/check.h"
#include "cuda/cuda_common.cuh"
#include "cuda/dmat_device.cuh"

namespace tern::cuda {
namespace {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One warp per (token, head) for Hq query heads then Hkv key heads then Hkv value heads. dh <= 512.
__global__ void attn_prepare_kernel(const float* qg, const float* k, const float* v, const float* q_norm,
                                    const float* k_norm, const int* pos0, AttnDims d, float* q_out, uint16_t* cache_k,
                                    uint16_t* cache_v) {
  __shared__ float buf[8][512];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int heads = d.Hq + 2 * d.Hkv;
  const int64_t task = int64_t(blockIdx.x) * 8 + warp;
  if (task >= d.T * heads) return;
  const int64_t t = task / heads;
  const int h = int(task % heads);
  const int64_t pos = int64_t(*pos0) + t;
  float* x = buf[warp];
  if (h >= d.Hq + d.Hkv) {  // value head: plain copy into the cache
    const int kvh = h - d.Hq - d.Hkv;
    const float* src = v + t * d.Hkv * d.dh + int64_t(kvh) * d.dh;
    uint16_t* dst = cache_v + (int64_t(kvh) * d.capacity + pos) * d.dh;
    for (int i = lane; i < d.dh; i += 32) dst[i] = float_to_bf16_bits(src[i]);
    return;
  }
  const bool is_q = h < d.Hq;
  const float* src = is_q ? qg + t * d.Hq * 2 * d.dh + int64_t(h) * 2 * d.dh : k + t * d.Hkv * d.dh + int64_t(h - d.Hq) * d.dh;
  const float* w = is_q ? q_norm : k_norm;
  float ss = 0.0f;
  for (int i = lane; i < d.dh; i += 32) {
    x[i] = src[i];
    ss += x[i] * x[i];
  }
  const float inv = rsqrtf(warp_sum(ss) / float(d.dh) + d.eps);
  for (int i = lane; i < d.dh; i += 32) x[i] = x[i] * inv * w[i];
  __syncwarp();
  const int half = d.rot / 2;
  float y[16];  // dh / 32 <= 16
  int n = 0;
  for (int i = lane; i < d.dh; i += 32, ++n) {
    float val = x[i];
    if (i < d.rot) {
      const int j = i < half ? i : i - half;
      const float inv_freq = 1.0f / powf(d.theta, float(2 * j) / float(d.rot));
      const float ang = float(pos) * inv_freq;
      float sn, cs;
      sincosf(ang, &sn, &cs);
      val = i < half ? x[i] * cs - x[i + half] * sn : x[i] * cs + x[i - half] * sn;
    }
    y[n] = val;
  }
  n = 0;
  if (is_q) {
    float* dst = q_out + (t * d.Hq + h) * int64_t(d.dh);
    for (int i = lane; i < d.dh; i += 32, ++n) dst[i] = y[n];
  } else {
    uint16_t* dst = cache_k + (int64_t(h - d.Hq) * d.capacity + pos) * d.dh;
    for (int i = lane; i < d.dh; i += 32, ++n) dst[i] = float_to_bf16_bits(y[n]);
  }
}

constexpr int kKeysPerTile = 32;

// Block = (kv head, split, token); warp w = query head kvh·G + w. Each lane scores one key of the tile, then every
// lane accumulates dh/32 output dims. Online softmax; writes the unnormalised partial o with its max m and sum l.
template <int DH>
__global__ void attention_split_kernel(const float* q, const uint16_t* cache_k, const uint16_t* cache_v,
                                       const int* pos0, AttnDims d, int splits, float* part_o, float* part_m,
                                       float* part_l) {
  constexpr int KW = DH / 2 + 1;  // K row stride in 32-bit words (odd: conflict-free per-lane rows)
  constexpr int DPL = DH / 32;    // output dims per lane
  extern __shared__ uint32_t smem[];
  uint32_t* ks = smem;                                                   // [32][KW] bf16 pairs
  uint16_t* vs = reinterpret_cast<uint16_t*>(smem + kKeysPerTile * KW);  // [32][DH]
  float* qs = reinterpret_cast<float*>(vs + kKeysPerTile * DH);          // [G][DH]
  const int G = d.Hq / d.Hkv;
  const int kvh = blockIdx.x, split = blockIdx.y;
  const int64_t t = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = kvh * G + warp;
  const int64_t L = int64_t(*pos0) + t + 1;
  const int64_t chunk = (L + splits - 1) / splits;
  const int64_t k_begin = split * chunk, k_end = k_begin + chunk < L ? k_begin + chunk : L;
  for (int i = lane; i < DH; i += 32) qs[warp * DH + i] = q[(t * d.Hq + h) * DH + i];
  const float scale = rsqrtf(float(DH));
  float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;
  const uint16_t* Kh = cache_k + int64_t(kvh) * d.capacity * DH;
  const uint16_t* Vh = cache_v + int64_t(kvh) * d.capacity * DH;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kKeysPerTile) {
    const int nk = int(k_end - k0 < kKeysPerTile ? k_end - k0 : kKeysPerTile);
    __syncthreads();
    for (int idx = threadIdx.x; idx < nk * (DH / 2); idx += blockDim.x) {
      const int r = idx / (DH / 2), c = idx % (DH / 2);
      ks[r * KW + c] = reinterpret_cast<const uint32_t*>(Kh + (k0 + r) * DH)[c];
    }
    for (int idx = threadIdx.x; idx < nk * (DH / 8); idx += blockDim.x) {
      const int r = idx / (DH / 8), c = idx % (DH / 8);
      reinterpret_cast<uint4*>(vs + r * DH)[c] = reinterpret_cast<const uint4*>(Vh + (k0 + r) * DH)[c];
    }
    __syncthreads();
    float s = -INFINITY;
    if (lane < nk) {
      const uint32_t* kr = ks + lane * KW;
      const float* qq = qs + warp * DH;
      float dot = 0.0f;
#pragma unroll 8
      for (int c = 0; c < DH / 2; ++c) {
        const uint32_t kk = kr[c];
        dot += qq[2 * c] * __uint_as_float(kk << 16) + qq[2 * c + 1] * __uint_as_float(kk & 0xffff0000u);
      }
      s = dot * scale;
    }
    const float m_new = fmaxf(m, warp_max(s));
    const float p = lane < nk ? expf(s - m_new) : 0.0f;
    const float corr = expf(m - m_new);
    l = l * corr + warp_sum(p);
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] *= corr;
    for (int j = 0; j < nk; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      const uint16_t* vr = vs + j * DH + lane * DPL;
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[i] += pj * bf16_bits_to_float(vr[i]);
    }
    m = m_new;
  }
  if (warp >= G) return;
  const int64_t pi = (t * d.Hq + h) * splits + split;
#pragma unroll
  for (int i = 0; i < DPL; ++i) part_o[pi * DH + lane * DPL + i] = acc[i];
  if (lane == 0) {
    part_m[pi] = m;
    part_l[pi] = l;
  }
}

// out[t, h·dh + i] = (Σ_s e^{m_s−M} o_s[i]) / (Σ_s e^{m_s−M} l_s) · sigmoid(gate[t, h, i]).
// The split weights are computed once per block; every output element then sums independent loads.
__global__ void attention_merge_kernel(const float* part_o, const float* part_m, const float* part_l, const float* qg,
                                       AttnDims d, int splits, float* out) {
  __shared__ float wts[64];
  const int64_t th = blockIdx.x;  // t·Hq + h
  const int64_t t = th / d.Hq;
  const int h = int(th % d.Hq);
  if (threadIdx.x < 32) {
    float M = -INFINITY;
    for (int s = threadIdx.x; s < splits; s += 32) M = fmaxf(M, part_m[th * splits + s]);
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    float L = 0.0f;
    for (int s = threadIdx.x; s < splits; s += 32) {
      const float ms = part_m[th * splits + s];
      const float e = ms == -INFINITY ? 0.0f : expf(ms - M);
      wts[s] = e;
      L += e * part_l[th * splits + s];
    }
    for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    if (threadIdx.x == 0) wts[63] = 1.0f / L;
  }
  __syncthreads();
  const float invL = wts[63];
  for (int i = threadIdx.x; i < d.dh; i += blockDim.x) {
    float o = 0.0f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) o += wts[s] * part_o[(th * splits + s) * d.dh + i];
    const float gate = qg[t * d.Hq * 2 * d.dh + int64_t(h) * 2 * d.dh + d.dh + i];
    out[t * d.Hq * d.dh + int64_t(h) * d.dh + i] = o * invL / (1.0f + expf(-gate));
  }
}

}  // namespace

void attn_prepare(const float* qg, const float* k, const float* v, const float* q_norm, const float* k_norm,
                  const int* pos0, const AttnDims& d, float* q_out, uint16_t* cache_k, uint16_t* cache_v,
                  cudaStream_t stream) {
  TERN_CHECK(d.dh % 32 == 0 && d.dh <= 512, "attention: head dim ", d.dh, " not supported");
  TERN_CHECK(d.rot % 2 == 0 && d.rot <= d.dh, "attention: rotary dims ", d.rot, " not supported");
  if (d.T == 0) return;
  const int64_t tasks = d.T * (d.Hq + 2 * d.Hkv);
  attn_prepare_kernel<<<blocks_for(tasks, 8), 256, 0, stream>>>(qg, k, v, q_norm, k_norm, pos0, d, q_out, cache_k, cache_v);
  TERN_CUDA_LAUNCHED("attn_prepare");
}

int attn_splits_for(int64_t T, int Hkv) {
  const int64_t s = 128 / (T * Hkv);
  return int(s < 1 ? 1 : s > 32 ? 32 : s);
}

int64_t attn_partial_floats(int64_t T, int Hq, int dh, int splits) {
  return T * Hq * splits * (int64_t(dh) + 2);
}

void attention(const float* q, const float* qg, const uint16_t* cache_k, const uint16_t* cache_v, const int* pos0,
               const AttnDims& d, float* partial, float* out, cudaStream_t stream) {
  if (d.T == 0) return;
  const int G = d.Hq / d.Hkv;
  TERN_CHECK(d.Hkv > 0 && d.Hq % d.Hkv == 0 && G <= 32, "attention: ", d.Hq, " query heads over ", d.Hkv, " KV heads");
  TERN_CHECK(d.T <= 65535, "attention: ", d.T, " tokens in one call exceed the grid limit");
  const int splits = attn_splits_for(d.T, d.Hkv);
  float* po = partial;
  float* pm = po + d.T * d.Hq * splits * d.dh;
  float* pl = pm + d.T * d.Hq * splits;
  const dim3 grid(unsigned(d.Hkv), unsigned(splits), unsigned(d.T));
  const unsigned threads = unsigned(32 * G);
  auto launch = [&](auto kernel, int DH) {
    const size_t smem = size_t(kKeysPerTile) * (DH / 2 + 1) * 4 + size_t(kKeysPerTile) * DH * 2 + size_t(G) * DH * 4;
    if (smem > 48 * 1024)  // above the default limit only (keeps the launch capturable in a CUDA graph)
      TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    kernel<<<grid, threads, smem, stream>>>(q, cache_k, cache_v, pos0, d, splits, po, pm, pl);
  };
  switch (d.dh) {
    case 64: launch(attention_split_kernel<64>, 64); break;
    case 128: launch(attention_split_kernel<128>, 128); break;
    case 256: launch(attention_split_kernel<256>, 256); break;
    default: TERN_FAIL("attention: head dim ", d.dh, " not supported by the CUDA kernel (64, 128 or 256)");
  }
  TERN_CUDA_LAUNCHED("attention_split");
  attention_merge_kernel<<<unsigned(d.T * d.Hq), 256, 0, stream>>>(po, pm, pl, qg, d, splits, out);
  TERN_CUDA_LAUNCHED("attention_merge");
}

}  // namespace tern::cuda
