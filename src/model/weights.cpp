#include "model/weights.h"

#include "core/bf16.h"
#include "core/check.h"

namespace tern {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::f32: return "f32";
    case WeightFormat::bf16: return "bf16";
    case WeightFormat::affine4: return "affine4";
    case WeightFormat::affine8: return "affine8";
  }
  return "?";
}

int weight_format_bits(WeightFormat f) {
  switch (f) {
    case WeightFormat::f32: return 32;
    case WeightFormat::bf16: return 16;
    case WeightFormat::affine4: return 4;
    case WeightFormat::affine8: return 8;
  }
  return 0;
}

int64_t Matrix::row_words() const {
  switch (format) {
    case WeightFormat::f32:
    case WeightFormat::bf16: return cols;
    case WeightFormat::affine4: return cols / 8;
    case WeightFormat::affine8: return cols / 4;
  }
  return 0;
}

Matrix Matrix::expert(int64_t e) const {
  TERN_CHECK(e >= 0 && e < experts, "expert index ", e, " out of range [0, ", experts, ")");
  Matrix m = *this;
  m.experts = 1;
  m.expert_stride_data = 0;
  m.expert_stride_groups = 0;
  const int64_t elem_bytes = format == WeightFormat::f32 ? 4 : format == WeightFormat::bf16 ? 2 : 4;
  m.data = static_cast<const uint8_t*>(data) + e * data_stride() * elem_bytes;
  if (quantized()) {
    m.scales = scales + e * group_stride();
    m.biases = biases + e * group_stride();
  }
  return m;
}

int64_t Matrix::bytes() const {
  const int64_t elem_bytes = format == WeightFormat::bf16 ? 2 : 4;
  int64_t b = experts * rows * row_words() * elem_bytes;
  if (quantized()) b += 2 * experts * rows * groups_per_row() * 2;
  return b;
}

void matrix_row_to_f32(const Matrix& m, int64_t r, float* out) {
  TERN_CHECK(m.experts == 1, "matrix_row_to_f32 needs a plain matrix; take .expert(e) first");
  TERN_CHECK(r >= 0 && r < m.rows, "row ", r, " out of range [0, ", m.rows, ")");
  switch (m.format) {
    case WeightFormat::f32: {
      const float* p = static_cast<const float*>(m.data) + r * m.cols;
      for (int64_t c = 0; c < m.cols; ++c) out[c] = p[c];
      return;
    }
    case WeightFormat::bf16: {
      const uint16_t* p = static_cast<const uint16_t*>(m.data) + r * m.cols;
      for (int64_t c = 0; c < m.cols; ++c) out[c] = bf16_to_float(p[c]);
      return;
    }
    case WeightFormat::affine4:
    case WeightFormat::affine8: {
      const int bits = weight_format_bits(m.format);
      const int per_word = 32 / bits;
      const uint32_t mask = (1u << bits) - 1u;
      const uint32_t* w = static_cast<const uint32_t*>(m.data) + r * m.row_words();
      const uint16_t* s = m.scales + r * m.groups_per_row();
      const uint16_t* b = m.biases + r * m.groups_per_row();
      for (int64_t c = 0; c < m.cols; ++c) {
        const uint32_t q = (w[c / per_word] >> (bits * (c % per_word))) & mask;
        const int64_t g = c / m.group_size;
        out[c] = bf16_to_float(s[g]) * float(q) + bf16_to_float(b[g]);
      }
      return;
    }
  }
}

std::vector<std::pair<std::string, const Matrix*>> ModelWeights::all_matrices() const {
  std::vector<std::pair<std::string, const Matrix*>> out;
  out.emplace_back("embed", &embed);
  out.emplace_back("lm_head", &lm_head);
  auto layer_matrices = [&](const LayerWeights& l, const std::string& p) {
    const std::pair<const char*, const Matrix*> named[] = {
        {"in_proj_qkv", &l.in_proj_qkv}, {"in_proj_z", &l.in_proj_z},     {"in_proj_b", &l.in_proj_b},
        {"in_proj_a", &l.in_proj_a},     {"out_proj", &l.out_proj},       {"q_proj", &l.q_proj},
        {"k_proj", &l.k_proj},           {"v_proj", &l.v_proj},           {"o_proj", &l.o_proj},
        {"router", &l.router},           {"expert_gate", &l.expert_gate}, {"expert_up", &l.expert_up},
        {"expert_down", &l.expert_down}, {"shared_gate", &l.shared_gate}, {"shared_up", &l.shared_up},
        {"shared_down", &l.shared_down}, {"shared_expert_gate", &l.shared_expert_gate},
    };
    for (const auto& [n, m] : named)
      if (!m->empty()) out.emplace_back(p + n, m);
  };
  for (size_t i = 0; i < layers.size(); ++i) layer_matrices(layers[i], "layers." + std::to_string(i) + ".");
  if (mtp) {
    out.emplace_back("mtp.fc", &mtp->fc);
    layer_matrices(mtp->layer, "mtp.layers.0.");
  }
  return out;
}

int64_t ModelWeights::total_bytes() const {
  int64_t b = 0;
  for (const auto& [n, m] : all_matrices()) b += m->bytes();
  auto vec = [&](const std::vector<float>& v) { b += int64_t(v.size()) * 4; };
  vec(final_norm);
  auto layer_vectors = [&](const LayerWeights& l) {
    vec(l.input_norm); vec(l.post_attn_norm); vec(l.conv1d); vec(l.A_log); vec(l.dt_bias);
    vec(l.gdn_norm); vec(l.q_norm); vec(l.k_norm);
  };
  for (const LayerWeights& l : layers) layer_vectors(l);
  if (mtp) {
    vec(mtp->pre_fc_norm_embedding); vec(mtp->pre_fc_norm_hidden); vec(mtp->norm);
    layer_vectors(mtp->layer);
  }
  return b;
}

}  // namespace tern
