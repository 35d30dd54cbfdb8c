#include "cpu_test_util.h"

#include <cmath>
#include <string>

namespace tern::test {

std::shared_ptr<ModelWeights> make_tiny_model(const TinyModelSpec& s, uint64_t seed) {
  Rng rng(seed);
  auto w = std::make_shared<ModelWeights>();
  auto st = std::make_shared<HeapStorage>();
  w->storage.push_back(st);
  Config& c = w->config;
  c.hidden_size = s.D;
  c.num_hidden_layers = s.layers;
  c.layer_types.clear();
  for (int i = 0; i < s.layers; ++i)
    c.layer_types.push_back((i + 1) % 4 == 0 ? LayerType::full_attention : LayerType::linear_attention);
  c.vocab_size = s.V;
  c.num_attention_heads = s.Hq;
  c.num_key_value_heads = s.Hkv;
  c.head_dim = s.dh;
  c.partial_rotary_factor = double(s.rot) / double(s.dh);
  c.linear_num_key_heads = s.Hk;
  c.linear_num_value_heads = s.Hv;
  c.linear_key_head_dim = s.dk;
  c.linear_value_head_dim = s.dv;
  c.num_experts = s.E;
  c.num_experts_per_tok = s.k;
  c.moe_intermediate_size = s.F;
  c.shared_expert_intermediate_size = s.Fs;
  w->vocab_real = s.vocab_real;
  w->source_layout = "test";
  const WeightFormat f = s.format;
  auto mat = [&](int64_t rows, int64_t cols, float sd, int64_t experts = 1) {
    return random_matrix(rng, *st, f, rows, cols, sd, experts);
  };
  auto norm = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = 1.0f + rng.normal(0.1f);
    return v;
  };
  w->embed = mat(s.V, s.D, 1.0f);
  w->lm_head = mat(s.V, s.D, 0.2f);
  w->final_norm = norm(s.D);
  const int64_t C = c.conv_channels();
  auto layer = [&](LayerType type) {
    LayerWeights l;
    l.type = type;
    l.input_norm = norm(s.D);
    l.post_attn_norm = norm(s.D);
    if (l.type == LayerType::linear_attention) {
      l.in_proj_qkv = mat(C, s.D, 0.2f);
      l.in_proj_z = mat(int64_t(s.Hv) * s.dv, s.D, 0.2f);
      l.in_proj_b = mat(s.Hv, s.D, 0.2f);
      l.in_proj_a = mat(s.Hv, s.D, 0.2f);
      l.conv1d = rng.normals(size_t(C * 4), 0.5f);
      for (int h = 0; h < s.Hv; ++h) {
        l.A_log.push_back(std::log(rng.uniform(0.5f, 8.0f)));
        l.dt_bias.push_back(rng.normal(0.5f));
      }
      l.gdn_norm = norm(s.dv);
      l.out_proj = mat(s.D, int64_t(s.Hv) * s.dv, 0.1f);
    } else {
      l.q_proj = mat(int64_t(s.Hq) * 2 * s.dh, s.D, 0.2f);
      l.k_proj = mat(int64_t(s.Hkv) * s.dh, s.D, 0.2f);
      l.v_proj = mat(int64_t(s.Hkv) * s.dh, s.D, 0.2f);
      l.o_proj = mat(s.D, int64_t(s.Hq) * s.dh, 0.1f);
      l.q_norm = norm(s.dh);
      l.k_norm = norm(s.dh);
    }
    l.router = mat(s.E, s.D, 0.5f);
    l.expert_gate = mat(s.F, s.D, 0.2f, s.E);
    l.expert_up = mat(s.F, s.D, 0.2f, s.E);
    l.expert_down = mat(s.D, s.F, 0.2f, s.E);
    l.shared_gate = mat(s.Fs, s.D, 0.2f);
    l.shared_up = mat(s.Fs, s.D, 0.2f);
    l.shared_down = mat(s.D, s.Fs, 0.2f);
    l.shared_expert_gate = mat(1, s.D, 0.2f);
    return l;
  };
  for (int i = 0; i < s.layers; ++i) w->layers.push_back(layer(c.layer_types[size_t(i)]));
  if (s.mtp) {
    MtpWeights& m = w->mtp.emplace();
    m.pre_fc_norm_embedding = norm(s.D);
    m.pre_fc_norm_hidden = norm(s.D);
    m.fc = mat(s.D, 2 * s.D, 0.2f);
    m.layer = layer(LayerType::full_attention);
    m.norm = norm(s.D);
  }
  return w;
}

}  // namespace tern::test
