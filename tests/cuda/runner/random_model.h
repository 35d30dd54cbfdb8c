// Random models of Qwen3.6's real widths (reduced depth) for the CUDA runner's tests: runner_test.cpp (against the
// CPU runner, batch invariance) and verify_test.cpp (speculative decoding's verify step and rollback).
#pragma once

#include <memory>
#include <random>
#include <vector>

#include "../cuda_test_util.h"
#include "cuda/runner/cuda_runner.h"
#include "model/weights.h"

namespace tern::cuda::test {

struct RandomModel {
  std::vector<std::unique_ptr<HostMatrix>> mats;
  std::shared_ptr<ModelWeights> w = std::make_shared<ModelWeights>();
};

// The weight scales of a random model. easy: the router 20x the matrices (router logits far apart: no near-ties,
// model.md §6.10), embeddings of rms ~1, norm multipliers in [0.8, 1.2]. trained: the router and embeddings at the
// matrices' scale (~1/√cols, as transformers initialises; router logits about one unit, near-ties between the 8th
// and 9th experts common), norm multipliers in [0.95, 1.05]: every rounding upstream can change an expert choice.
enum class Scales { easy, trained };

// Qwen3.6 widths (D 2048, 256 experts, real heads), `layers` layers [lin, lin, lin, full], vocabulary V.
inline std::shared_ptr<const ModelWeights> random_model(uint64_t seed, int layers, int64_t V, RandomModel& rm,
                                                        Scales scales = Scales::easy) {
  std::mt19937_64 rng(seed);
  Config& c = rm.w->config;
  c.num_hidden_layers = layers;
  c.layer_types.clear();
  for (int i = 0; i < layers; ++i)
    c.layer_types.push_back((i + 1) % 4 == 0 ? LayerType::full_attention : LayerType::linear_attention);
  c.vocab_size = V;
  rm.w->vocab_real = V - 37;
  const int64_t D = c.hidden_size, C = c.conv_channels(), Hv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, dh = c.head_dim;
  const int64_t E = c.num_experts, F = c.moe_intermediate_size, Fs = c.shared_expert_intermediate_size;
  const WeightFormat q4 = WeightFormat::affine4, q8 = WeightFormat::affine8;
  auto mat = [&](Matrix& m, WeightFormat f, int64_t e, int64_t r, int64_t cols, float scale = 1.0f) {
    rm.mats.push_back(random_matrix(rng, f, e, r, cols));
    HostMatrix& h = *rm.mats.back();
    for (size_t g = 0; scale != 1.0f && g < h.scales.size(); ++g) {
      h.scales[g] = float_to_bf16(bf16_to_float(h.scales[g]) * scale);
      h.biases[g] = float_to_bf16(bf16_to_float(h.biases[g]) * scale);
    }
    m = h.m;
  };
  auto vec = [&](std::vector<float>& v, int64_t n, float lo, float hi) { v = random_floats(rng, size_t(n), lo, hi); };
  const bool trained = scales == Scales::trained;
  const float norm_lo = trained ? 0.95f : 0.8f, norm_hi = trained ? 1.05f : 1.2f;
  mat(rm.w->embed, q4, 1, V, D, trained ? 1.0f : 30.0f);  // easy: embedding rows of rms ~ 1
  mat(rm.w->lm_head, q4, 1, V, D, 3.0f);
  vec(rm.w->final_norm, D, norm_lo, norm_hi);
  rm.w->layers.resize(size_t(layers));
  for (int i = 0; i < layers; ++i) {
    LayerWeights& l = rm.w->layers[size_t(i)];
    l.type = c.layer_types[size_t(i)];
    vec(l.input_norm, D, norm_lo, norm_hi);
    vec(l.post_attn_norm, D, norm_lo, norm_hi);
    if (l.type == LayerType::linear_attention) {
      mat(l.in_proj_qkv, q4, 1, C, D);
      mat(l.in_proj_z, q4, 1, Hv * dv, D);
      mat(l.in_proj_b, q4, 1, Hv, D);
      mat(l.in_proj_a, q4, 1, Hv, D);
      mat(l.out_proj, q4, 1, D, Hv * dv);
      vec(l.conv1d, C * c.linear_conv_kernel_dim, -0.5f, 0.5f);
      vec(l.A_log, Hv, 0.0f, 2.7f);
      vec(l.dt_bias, Hv, -1.0f, 1.0f);
      vec(l.gdn_norm, dv, norm_lo, norm_hi);
    } else {
      mat(l.q_proj, q4, 1, Hq * 2 * dh, D);
      mat(l.k_proj, q4, 1, Hkv * dh, D);
      mat(l.v_proj, q4, 1, Hkv * dh, D);
      mat(l.o_proj, q4, 1, D, Hq * dh);
      vec(l.q_norm, dh, norm_lo, norm_hi);
      vec(l.k_norm, dh, norm_lo, norm_hi);
    }
    mat(l.router, q8, 1, E, D, trained ? 1.0f : 20.0f);
    mat(l.expert_gate, q4, E, F, D);
    mat(l.expert_up, q4, E, F, D);
    mat(l.expert_down, q4, E, D, F);
    mat(l.shared_gate, q4, 1, Fs, D);
    mat(l.shared_up, q4, 1, Fs, D);
    mat(l.shared_down, q4, 1, D, Fs);
    mat(l.shared_expert_gate, q8, 1, 1, D);
  }
  return rm.w;
}

// The CUDA runner on a random model at trained scales, `layers` layers, vocabulary V (4,096 by default: any difference
// in a logit shows as another token before long).
struct TrainedRunner {
  explicit TrainedRunner(uint64_t seed, int layers = 8, int64_t V = 4096)
      : weights(random_model(seed, layers, V, rm, Scales::trained)),
        gpu(cuda_runner_create(weights, {.progress = false})) {}
  RandomModel rm;
  std::shared_ptr<const ModelWeights> weights;
  std::unique_ptr<ModelRunner> gpu;
};

inline std::vector<int32_t> random_tokens(std::mt19937_64& rng, int64_t n, int64_t V) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint64_t(V));
  return t;
}

}  // namespace tern::cuda::test
