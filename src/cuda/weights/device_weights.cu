#include "cuda/weights/device_weights.cuh"

#include <cstdio>
#include <cmath>

#include "core/bf16.h"
#include "cuda/weights/staged_upload.cuh"

namespace tern::cuda {
namespace {

int64_t storage_bytes(WeightFormat f) { return f == WeightFormat::bf16 ? 2 : 4; }

int64_t row_words_of(WeightFormat f, int64_t cols) {
  switch (f) {
    case WeightFormat::f32:
    case WeightFormat::bf16: return cols;
    case WeightFormat::affine4: return cols / 8;
    case WeightFormat::affine8: return cols / 4;
  }
  return 0;
}

// Sizes of one DMat's three pieces, in bytes.
struct MatBytes {
  size_t data = 0, groups = 0;
};
MatBytes mat_bytes(const DMat& d) {
  MatBytes b;
  b.data = size_t(d.experts * d.rows * d.row_words * storage_bytes(d.format));
  if (d.format == WeightFormat::affine4 || d.format == WeightFormat::affine8)
    b.groups = size_t(d.experts * d.rows * d.groups_per_row * 2);
  return b;
}

DMat dmat_shape(WeightFormat f, int64_t experts, int64_t rows, int64_t cols, int group_size, const std::string& name) {
  DMat d;
  d.format = f;
  d.experts = experts;
  d.rows = rows;
  d.cols = cols;
  d.group_size = group_size;
  d.row_words = row_words_of(f, cols);
  const bool q = f == WeightFormat::affine4 || f == WeightFormat::affine8;
  d.groups_per_row = q ? cols / group_size : 0;
  // The kernels read 8 consecutive elements at a time, and whole groups per 32-element step.
  TERN_CHECK(cols % 32 == 0, "matrix ", name, ": the CUDA kernels need cols to be a multiple of 32, got ", cols);
  if (q)
    TERN_CHECK(group_size % 32 == 0 && cols % group_size == 0, "matrix ", name, ": unsupported group size ", group_size,
               " for ", cols, " columns (the CUDA kernels take multiples of 32)");
  return d;
}

bool fusable(const std::vector<const Matrix*>& parts) {
  for (const Matrix* m : parts)
    if (m->empty() || m->experts != 1 || m->format != parts[0]->format || m->cols != parts[0]->cols ||
        m->group_size != parts[0]->group_size)
      return false;
  return true;
}

}  // namespace

DMat dmat_rows(const DMat& m, int64_t row0, int64_t rows) {
  TERN_CHECK(m.experts == 1 && row0 >= 0 && row0 + rows <= m.rows, "dmat_rows: rows [", row0, ", ", row0 + rows,
             ") outside a matrix of ", m.rows, " rows");
  DMat v = m;
  v.rows = rows;
  v.data = static_cast<const uint8_t*>(m.data) + row0 * m.row_words * storage_bytes(m.format);
  if (m.scales) {
    v.scales = m.scales + row0 * m.groups_per_row;
    v.biases = m.biases + row0 * m.groups_per_row;
  }
  return v;
}

// --------------------------------------------------------------------------------------------------------------
// Upload from host weights.

std::unique_ptr<DeviceWeights> device_weights_upload(const ModelWeights& w, bool progress) {
  auto dw = std::make_unique<DeviceWeights>();
  dw->config = w.config;
  dw->vocab_real = w.vocab_real > 0 ? w.vocab_real : w.config.vocab_size;
  dw->layers.resize(w.layers.size());

  // Pass 1: shapes and sizes.
  size_t total = 0;
  int64_t weight_bytes = 0;
  auto shape = [&](DMat& d, const Matrix& m, const std::string& name) {
    if (m.empty()) return;
    d = dmat_shape(m.format, m.experts, m.rows, m.cols, m.group_size, name);
    const MatBytes b = mat_bytes(d);
    total += DeviceArena::align(b.data) + 2 * DeviceArena::align(b.groups);
    weight_bytes += int64_t(b.data + 2 * b.groups);
  };
  auto shape_fused = [&](DMat& d, const std::vector<const Matrix*>& parts, const std::string& name) {
    int64_t rows = 0;
    for (const Matrix* m : parts) rows += m->rows;
    const Matrix& m0 = *parts[0];
    d = dmat_shape(m0.format, 1, rows, m0.cols, m0.group_size, name);
    const MatBytes b = mat_bytes(d);
    total += DeviceArena::align(b.data) + 2 * DeviceArena::align(b.groups);
    weight_bytes += int64_t(b.data + 2 * b.groups);
  };
  auto vsize = [&](const std::vector<float>& v) {
    if (!v.empty()) total += DeviceArena::align(v.size() * 4);
  };
  shape(dw->embed, w.embed, "embed");
  shape(dw->lm_head, w.lm_head, "lm_head");
  vsize(w.final_norm);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    DeviceLayer& d = dw->layers[i];
    d.type = l.type;
    const std::string p = "layers." + std::to_string(i) + ".";
    // Fused groups count once; their parts become views after the copy.
    const std::vector<const Matrix*> gdn_in = {&l.in_proj_qkv, &l.in_proj_z, &l.in_proj_b, &l.in_proj_a};
    const std::vector<const Matrix*> attn_in = {&l.q_proj, &l.k_proj, &l.v_proj};
    if (fusable(gdn_in)) {
      shape_fused(d.in_proj_all, gdn_in, p + "in_proj_all");
    } else {
      shape(d.in_proj_qkv, l.in_proj_qkv, p + "in_proj_qkv");
      shape(d.in_proj_z, l.in_proj_z, p + "in_proj_z");
      shape(d.in_proj_b, l.in_proj_b, p + "in_proj_b");
      shape(d.in_proj_a, l.in_proj_a, p + "in_proj_a");
    }
    shape(d.out_proj, l.out_proj, p + "out_proj");
    if (fusable(attn_in)) {
      shape_fused(d.attn_qkv, attn_in, p + "attn_qkv");
    } else {
      shape(d.q_proj, l.q_proj, p + "q_proj");
      shape(d.k_proj, l.k_proj, p + "k_proj");
      shape(d.v_proj, l.v_proj, p + "v_proj");
    }
    shape(d.o_proj, l.o_proj, p + "o_proj");
    shape(d.router, l.router, p + "router");
    shape(d.expert_gate, l.expert_gate, p + "expert_gate");
    shape(d.expert_up, l.expert_up, p + "expert_up");
    shape(d.expert_down, l.expert_down, p + "expert_down");
    shape(d.shared_gate, l.shared_gate, p + "shared_gate");
    shape(d.shared_up, l.shared_up, p + "shared_up");
    shape(d.shared_down, l.shared_down, p + "shared_down");
    shape(d.shared_expert_gate, l.shared_expert_gate, p + "shared_expert_gate");
    for (const auto* v : {&l.input_norm, &l.post_attn_norm, &l.conv1d, &l.A_log, &l.dt_bias, &l.gdn_norm, &l.q_norm,
                          &l.k_norm})
      vsize(*v);
  }
  TERN_CHECK(!w.embed.empty() && !w.lm_head.empty(), "weights without embed or lm_head cannot be uploaded");

  dw->arena = DeviceArena(total, "model weights");
  dw->bytes = weight_bytes;

  // Pass 2: where every byte goes (the arena's slices, fused parts at their rows' offsets); then one staged upload
  // of them all, the reading of the host memory overlapping the copies to the device.
  std::vector<HostCopy> copies;
  auto put = [&](const void* dst, const void* src, size_t bytes) {
    copies.push_back(HostCopy{static_cast<const uint8_t*>(src), reinterpret_cast<uintptr_t>(dst), bytes});
  };
  auto put_mat = [&](DMat& d, const Matrix& m) {
    if (m.empty()) return;
    const MatBytes b = mat_bytes(d);
    void* data = dw->arena.take(b.data);
    uint16_t* sc = b.groups ? dw->arena.take_n<uint16_t>(b.groups / 2) : nullptr;
    uint16_t* bi = b.groups ? dw->arena.take_n<uint16_t>(b.groups / 2) : nullptr;
    const size_t per_e = b.data / size_t(d.experts), per_g = b.groups / size_t(d.experts);
    for (int64_t e = 0; e < d.experts; ++e) {
      const Matrix me = m.experts == 1 ? m : m.expert(e);
      put(static_cast<uint8_t*>(data) + e * per_e, me.data, per_e);
      if (per_g) {
        put(reinterpret_cast<uint8_t*>(sc) + e * per_g, me.scales, per_g);
        put(reinterpret_cast<uint8_t*>(bi) + e * per_g, me.biases, per_g);
      }
    }
    d.data = data;
    d.scales = sc;
    d.biases = bi;
  };
  // One allocation for the stacked parts; each part's rows are copied at its offset and its DMat becomes a view.
  auto put_fused = [&](DMat& d, const std::vector<const Matrix*>& parts, const std::vector<DMat*>& views) {
    const MatBytes b = mat_bytes(d);
    void* data = dw->arena.take(b.data);
    uint16_t* sc = b.groups ? dw->arena.take_n<uint16_t>(b.groups / 2) : nullptr;
    uint16_t* bi = b.groups ? dw->arena.take_n<uint16_t>(b.groups / 2) : nullptr;
    d.data = data;
    d.scales = sc;
    d.biases = bi;
    int64_t row0 = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const Matrix& m = *parts[i];
      DMat v = dmat_rows(d, row0, m.rows);
      const MatBytes pb = mat_bytes(v);
      put(v.data, m.data, pb.data);
      if (pb.groups) {
        put(v.scales, m.scales, pb.groups);
        put(v.biases, m.biases, pb.groups);
      }
      *views[i] = v;
      row0 += m.rows;
    }
  };
  auto put_vec = [&](const float*& dst, const std::vector<float>& v) {
    if (v.empty()) return;
    float* p = dw->arena.take_n<float>(v.size());
    put(p, v.data(), v.size() * 4);
    dst = p;
  };
  put_mat(dw->embed, w.embed);
  put_mat(dw->lm_head, w.lm_head);
  put_vec(dw->final_norm, w.final_norm);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    DeviceLayer& d = dw->layers[i];
    if (d.in_proj_all.rows > 0) {
      put_fused(d.in_proj_all, {&l.in_proj_qkv, &l.in_proj_z, &l.in_proj_b, &l.in_proj_a},
                {&d.in_proj_qkv, &d.in_proj_z, &d.in_proj_b, &d.in_proj_a});
    } else {
      put_mat(d.in_proj_qkv, l.in_proj_qkv);
      put_mat(d.in_proj_z, l.in_proj_z);
      put_mat(d.in_proj_b, l.in_proj_b);
      put_mat(d.in_proj_a, l.in_proj_a);
    }
    put_mat(d.out_proj, l.out_proj);
    if (d.attn_qkv.rows > 0) {
      put_fused(d.attn_qkv, {&l.q_proj, &l.k_proj, &l.v_proj}, {&d.q_proj, &d.k_proj, &d.v_proj});
    } else {
      put_mat(d.q_proj, l.q_proj);
      put_mat(d.k_proj, l.k_proj);
      put_mat(d.v_proj, l.v_proj);
    }
    put_mat(d.o_proj, l.o_proj);
    put_mat(d.router, l.router);
    put_mat(d.expert_gate, l.expert_gate);
    put_mat(d.expert_up, l.expert_up);
    put_mat(d.expert_down, l.expert_down);
    put_mat(d.shared_gate, l.shared_gate);
    put_mat(d.shared_up, l.shared_up);
    put_mat(d.shared_down, l.shared_down);
    put_mat(d.shared_expert_gate, l.shared_expert_gate);
    put_vec(d.input_norm, l.input_norm);
    put_vec(d.post_attn_norm, l.post_attn_norm);
    put_vec(d.conv1d, l.conv1d);
    put_vec(d.A_log, l.A_log);
    put_vec(d.dt_bias, l.dt_bias);
    put_vec(d.gdn_norm, l.gdn_norm);
    put_vec(d.q_norm, l.q_norm);
    put_vec(d.k_norm, l.k_norm);
  }
  staged_upload(std::move(copies), "upload to GPU", progress);
  return dw;
}

// --------------------------------------------------------------------------------------------------------------
// Synthetic weights generated on the GPU.

namespace {

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return uint32_t(x);
}

__device__ __forceinline__ uint16_t to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

__global__ void fill_words_kernel(uint32_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = hash32(seed * 0x9e3779b97f4a7c15ULL + uint64_t(i));
}

// Scale s and bias b per group so that s*q + b has mean 0 and the given spread, for q uniform in [0, qmax].
__global__ void fill_groups_kernel(uint16_t* s, uint16_t* b, int64_t n, float scale, float qmax, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float jitter = 0.75f + 0.5f * float(hash32(seed + uint64_t(i) * 7919u) & 0xffff) / 65535.0f;
    const float sc = scale * jitter;
    s[i] = to_bf16_bits(sc);
    b[i] = to_bf16_bits(-0.5f * qmax * sc);
  }
}

__global__ void fill_floats_kernel(float* p, int64_t n, float base, float spread, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float u = float(hash32(seed * 31 + uint64_t(i)) & 0xffffff) / 16777216.0f;  // [0, 1)
    p[i] = base + spread * (2.0f * u - 1.0f);
  }
}

}  // namespace

std::unique_ptr<DeviceWeights> device_weights_synthetic(const Config& c, uint64_t seed, bool progress) {
  auto dw = std::make_unique<DeviceWeights>();
  dw->config = c;
  dw->vocab_real = c.vocab_size;
  const int L = c.num_hidden_layers;
  TERN_CHECK(int(c.layer_types.size()) == L, "config: layer_types has ", c.layer_types.size(), " entries for ", L, " layers");
  dw->layers.resize(size_t(L));
  const int64_t D = c.hidden_size, C = c.conv_channels(), Hv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, dh = c.head_dim;
  const int64_t E = c.num_experts, F = c.moe_intermediate_size, Fs = c.shared_expert_intermediate_size;
  const WeightFormat q4 = WeightFormat::affine4, q8 = WeightFormat::affine8;

  struct VecSpec {
    const float** dst;
    int64_t n;
    float base, spread;
  };
  std::vector<DMat*> mats;
  std::vector<VecSpec> vecs;
  auto mat = [&](DMat& d, WeightFormat f, int64_t e, int64_t r, int64_t cols, const char* name) {
    d = dmat_shape(f, e, r, cols, 64, name);
    mats.push_back(&d);
  };
  mat(dw->embed, q4, 1, c.vocab_size, D, "embed");
  mat(dw->lm_head, q4, 1, c.vocab_size, D, "lm_head");
  vecs.push_back({&dw->final_norm, D, 1.0f, 0.1f});
  for (int i = 0; i < L; ++i) {
    DeviceLayer& d = dw->layers[size_t(i)];
    d.type = c.layer_types[size_t(i)];
    vecs.push_back({&d.input_norm, D, 1.0f, 0.1f});
    vecs.push_back({&d.post_attn_norm, D, 1.0f, 0.1f});
    if (d.type == LayerType::linear_attention) {
      mat(d.in_proj_all, q4, 1, C + Hv * dv + 2 * Hv, D, "in_proj_all");  // qkv | z | b | a, views set below
      mat(d.out_proj, q4, 1, D, Hv * dv, "out_proj");
      vecs.push_back({&d.conv1d, C * c.linear_conv_kernel_dim, 0.0f, 0.3f});
      vecs.push_back({&d.A_log, Hv, 0.0f, 1.0f});
      vecs.push_back({&d.dt_bias, Hv, 0.0f, 1.0f});
      vecs.push_back({&d.gdn_norm, dv, 1.0f, 0.1f});
    } else {
      mat(d.attn_qkv, q4, 1, Hq * 2 * dh + 2 * Hkv * dh, D, "attn_qkv");  // q | k | v, views set below
      mat(d.o_proj, q4, 1, D, Hq * dh, "o_proj");
      vecs.push_back({&d.q_norm, dh, 1.0f, 0.1f});
      vecs.push_back({&d.k_norm, dh, 1.0f, 0.1f});
    }
    mat(d.router, q8, 1, E, D, "router");
    mat(d.expert_gate, q4, E, F, D, "expert_gate");
    mat(d.expert_up, q4, E, F, D, "expert_up");
    mat(d.expert_down, q4, E, D, F, "expert_down");
    mat(d.shared_gate, q4, 1, Fs, D, "shared_gate");
    mat(d.shared_up, q4, 1, Fs, D, "shared_up");
    mat(d.shared_down, q4, 1, D, Fs, "shared_down");
    mat(d.shared_expert_gate, q8, 1, 1, D, "shared_expert_gate");
  }
  size_t total = 0;
  int64_t weight_bytes = 0;
  for (DMat* d : mats) {
    const MatBytes b = mat_bytes(*d);
    total += DeviceArena::align(b.data) + 2 * DeviceArena::align(b.groups);
    weight_bytes += int64_t(b.data + 2 * b.groups);
  }
  for (const VecSpec& v : vecs) total += DeviceArena::align(size_t(v.n) * 4);
  dw->arena = DeviceArena(total, "synthetic model weights");
  dw->bytes = weight_bytes;

  uint64_t salt = seed * 1000003ULL + 1;
  int64_t done = 0;
  int last_pct = -1;
  for (DMat* d : mats) {
    const MatBytes b = mat_bytes(*d);
    uint32_t* data = static_cast<uint32_t*>(dw->arena.take(b.data));
    uint16_t* sc = dw->arena.take_n<uint16_t>(b.groups / 2);
    uint16_t* bi = dw->arena.take_n<uint16_t>(b.groups / 2);
    fill_words_kernel<<<1024, 256>>>(data, int64_t(b.data / 4), salt++);
    TERN_CUDA_LAUNCHED("fill_words_kernel");
    const float qmax = d->format == WeightFormat::affine4 ? 15.0f : 255.0f;
    // Uniform q in [0, qmax] has std qmax/sqrt(12); pick s so the weights have std ~ 1/sqrt(cols).
    const float target_std = 1.0f / std::sqrt(float(d->cols));
    fill_groups_kernel<<<1024, 256>>>(sc, bi, int64_t(b.groups / 2), target_std * std::sqrt(12.0f) / qmax, qmax, salt++);
    TERN_CUDA_LAUNCHED("fill_groups_kernel");
    d->data = data;
    d->scales = sc;
    d->biases = bi;
    done += int64_t(b.data + 2 * b.groups);
    const int pct = int(100 * done / weight_bytes);
    if (progress && pct != last_pct) {
      last_pct = pct;
      std::fprintf(stderr, "\rsynthetic weights on GPU %3d%% %6.2f GB", pct, double(done) / 1e9);
      if (pct == 100) std::fputc('\n', stderr);
    }
  }
  for (DeviceLayer& d : dw->layers) {
    if (d.type == LayerType::linear_attention) {
      d.in_proj_qkv = dmat_rows(d.in_proj_all, 0, C);
      d.in_proj_z = dmat_rows(d.in_proj_all, C, Hv * dv);
      d.in_proj_b = dmat_rows(d.in_proj_all, C + Hv * dv, Hv);
      d.in_proj_a = dmat_rows(d.in_proj_all, C + Hv * dv + Hv, Hv);
    } else {
      d.q_proj = dmat_rows(d.attn_qkv, 0, Hq * 2 * dh);
      d.k_proj = dmat_rows(d.attn_qkv, Hq * 2 * dh, Hkv * dh);
      d.v_proj = dmat_rows(d.attn_qkv, Hq * 2 * dh + Hkv * dh, Hkv * dh);
    }
  }
  for (const VecSpec& v : vecs) {
    float* p = dw->arena.take_n<float>(size_t(v.n));
    fill_floats_kernel<<<blocks_for(v.n, 256) > 1024 ? 1024 : blocks_for(v.n, 256), 256>>>(p, v.n, v.base, v.spread, salt++);
    TERN_CUDA_LAUNCHED("fill_floats_kernel");
    *v.dst = p;
  }
  TERN_CUDA(cudaDeviceSynchronize());
  return dw;
}

}  // namespace tern::cuda
