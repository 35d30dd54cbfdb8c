#include "engine/bench_roofline.h"

#include "core/check.h"

namespace tern {

double Roofline::prefill_flops(int64_t tokens) const {
  const double t = double(tokens);
  return t * (linear_flops_per_token + gdn_flops_per_token) + lm_head_flops + attention_flops_coeff * t * (t + 1) / 2;
}

namespace {

// Bytes and parameters per token of one matrix: stacked experts count k of E.
void add_matrix(const Matrix& m, double expert_fraction, int64_t k, Roofline& r, double& params) {
  if (m.rows == 0 || m.cols == 0) return;
  const double bytes = double(m.bytes());
  r.total_weight_bytes += bytes;
  if (m.experts > 1) {
    r.weight_bytes_per_token += bytes * expert_fraction;
    params += double(m.rows) * double(m.cols) * double(k);
  } else {
    r.weight_bytes_per_token += bytes;
    params += double(m.rows) * double(m.cols);
  }
}

double vector_bytes(const std::vector<float>& v) { return 4.0 * double(v.size()); }

}  // namespace

Roofline roofline_from_weights(const ModelWeights& w, const RooflineAssumptions& a) {
  const Config& c = w.config;
  TERN_CHECK(c.num_experts > 0 && c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.num_experts,
             "roofline: num_experts_per_tok ", c.num_experts_per_tok, " of num_experts ", c.num_experts);
  TERN_CHECK(int64_t(w.layers.size()) == c.num_hidden_layers, "roofline: ", w.layers.size(),
             " layers of weights for num_hidden_layers ", c.num_hidden_layers);
  Roofline r;
  const double fraction = double(c.num_experts_per_tok) / double(c.num_experts);
  const int64_t k = c.num_experts_per_tok;
  double params = 0;  // active matrix parameters per token, LM head excluded

  // Embedding: one row per token is read; the whole table counts towards the total.
  if (w.embed.rows > 0) {
    r.total_weight_bytes += double(w.embed.bytes());
    r.weight_bytes_per_token += double(w.embed.bytes()) / double(w.embed.rows);
  }
  // The LM head is read whole every token; when tied to the embedding it adds nothing to the total.
  const Matrix& head = w.lm_head.rows > 0 ? w.lm_head : w.embed;
  r.weight_bytes_per_token += double(head.bytes());
  if (!c.tie_word_embeddings && w.lm_head.rows > 0) r.total_weight_bytes += double(w.lm_head.bytes());
  r.lm_head_flops = 2.0 * double(c.vocab_size) * double(c.hidden_size);
  r.weight_bytes_per_token += vector_bytes(w.final_norm);

  const double Hv = c.linear_num_value_heads, dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const double C = double(c.conv_channels()), Ck = c.linear_conv_kernel_dim;
  for (const LayerWeights& l : w.layers) {
    for (const Matrix* m : {&l.in_proj_qkv, &l.in_proj_z, &l.in_proj_b, &l.in_proj_a, &l.out_proj, &l.q_proj,
                            &l.k_proj, &l.v_proj, &l.o_proj, &l.router, &l.expert_gate, &l.expert_up,
                            &l.expert_down, &l.shared_gate, &l.shared_up, &l.shared_down, &l.shared_expert_gate})
      add_matrix(*m, fraction, k, r, params);
    double vec = vector_bytes(l.input_norm) + vector_bytes(l.post_attn_norm) + vector_bytes(l.conv1d) +
                 vector_bytes(l.A_log) + vector_bytes(l.dt_bias) + vector_bytes(l.gdn_norm) +
                 vector_bytes(l.q_norm) + vector_bytes(l.k_norm);
    r.weight_bytes_per_token += vec;
    r.total_weight_bytes += vec;
    if (l.type == LayerType::linear_attention) {
      r.state_bytes_per_token += 2.0 * Hv * dk * dv * a.recurrent_state_bytes;
      r.state_bytes_per_token += 2.0 * (Ck - 1) * C * a.conv_state_bytes;
      r.gdn_flops_per_token += Hv * (6.0 * dk * dv + 2.0 * a.gdn_chunk * (3.0 * dk + 2.0 * dv)) + 2.0 * C * Ck;
    } else {
      r.kv_bytes_per_context += 2.0 * double(c.num_key_value_heads) * c.head_dim * a.kv_bytes_per_value;
      r.attention_flops_coeff += 4.0 * double(c.num_attention_heads) * c.head_dim;
    }
  }
  r.linear_flops_per_token = 2.0 * params;
  return r;
}

namespace {

Matrix shape(WeightFormat f, int64_t rows, int64_t cols, int64_t experts = 1) {
  Matrix m;
  m.format = f;
  m.rows = rows;
  m.cols = cols;
  m.experts = experts;
  m.group_size = 64;
  return m;
}

}  // namespace

ModelWeights weights_mlx4_shapes(const Config& c) {
  TERN_CHECK(int64_t(c.layer_types.size()) == c.num_hidden_layers, "weights_mlx4_shapes: ", c.layer_types.size(),
             " layer types for num_hidden_layers ", c.num_hidden_layers);
  ModelWeights w;
  w.config = c;
  w.source_layout = "shapes";
  w.vocab_real = c.vocab_size;
  const auto q4 = WeightFormat::affine4, q8 = WeightFormat::affine8;
  const int64_t D = c.hidden_size, V = c.vocab_size, E = c.num_experts, F = c.moe_intermediate_size;
  const int64_t Fs = c.shared_expert_intermediate_size;
  w.embed = shape(q4, V, D);
  if (!c.tie_word_embeddings) w.lm_head = shape(q4, V, D);
  w.final_norm.resize(size_t(D));
  for (LayerType t : c.layer_types) {
    LayerWeights l;
    l.type = t;
    l.input_norm.resize(size_t(D));
    l.post_attn_norm.resize(size_t(D));
    if (t == LayerType::linear_attention) {
      const int64_t Hv = c.linear_num_value_heads, vdim = Hv * c.linear_value_head_dim;
      l.in_proj_qkv = shape(q4, c.conv_channels(), D);
      l.in_proj_z = shape(q4, vdim, D);
      l.in_proj_b = shape(q4, Hv, D);
      l.in_proj_a = shape(q4, Hv, D);
      l.out_proj = shape(q4, D, vdim);
      l.conv1d.resize(size_t(c.conv_channels() * c.linear_conv_kernel_dim));
      l.A_log.resize(size_t(Hv));
      l.dt_bias.resize(size_t(Hv));
      l.gdn_norm.resize(size_t(c.linear_value_head_dim));
    } else {
      const int64_t qdim = int64_t(c.num_attention_heads) * c.head_dim;
      const int64_t kvdim = int64_t(c.num_key_value_heads) * c.head_dim;
      l.q_proj = shape(q4, (c.attn_output_gate ? 2 : 1) * qdim, D);
      l.k_proj = shape(q4, kvdim, D);
      l.v_proj = shape(q4, kvdim, D);
      l.o_proj = shape(q4, D, qdim);
      l.q_norm.resize(size_t(c.head_dim));
      l.k_norm.resize(size_t(c.head_dim));
    }
    l.router = shape(q8, E, D);
    l.expert_gate = shape(q4, F, D, E);
    l.expert_up = shape(q4, F, D, E);
    l.expert_down = shape(q4, D, F, E);
    l.shared_gate = shape(q4, Fs, D);
    l.shared_up = shape(q4, Fs, D);
    l.shared_down = shape(q4, D, Fs);
    l.shared_expert_gate = shape(q8, 1, D);
    w.layers.push_back(std::move(l));
  }
  return w;
}

}  // namespace tern
