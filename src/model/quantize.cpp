#include "model/quantize.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/bf16.h"
#include "core/check.h"
#include "core/text_file.h"
#include "core/progress.h"
#include "model/safetensors.h"

namespace tern {

namespace {

// rint (round half to even) for |v| < 2^22 without a libm call, so that the loop vectorises on baseline x86-64:
// adding and subtracting 1.5 * 2^23 leaves v rounded to an integer in the default rounding mode. Larger values
// (only from inf/NaN inputs) pass through; the caller clamps them.
inline float rint_small(float v) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  return std::abs(v) < 4194304.0f ? (v + magic) - magic : v;
}

}  // namespace

void quantize_affine(const float* w, int64_t rows, int64_t cols, int bits, int group_size, uint32_t* packed,
                     uint16_t* scales, uint16_t* biases) {
  TERN_CHECK(bits == 4 || bits == 8, "quantize_affine: bits must be 4 or 8, got ", bits);
  TERN_CHECK(group_size == 32 || group_size == 64 || group_size == 128,
             "quantize_affine: group_size must be 32, 64 or 128, got ", group_size);
  TERN_CHECK(rows >= 0 && cols > 0 && cols % group_size == 0, "quantize_affine: cols (", cols,
             ") must be a positive multiple of group_size (", group_size, ")");
  const float n_bins = float((1 << bits) - 1);
  const float eps = 1e-7f;
  const int per_word = 32 / bits;
  const int64_t groups = cols / group_size;
  float q[128];
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    uint32_t* out = packed + r * (cols / per_word);
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = row + g * group_size;
      float lo = std::numeric_limits<float>::infinity(), hi = -lo;
      for (int j = 0; j < group_size; ++j) {
        hi = std::max(hi, x[j]);
        lo = std::min(lo, x[j]);
      }
      const bool lo_edge = std::abs(lo) > std::abs(hi);
      float scale = std::max((hi - lo) / n_bins, eps);
      scale = lo_edge ? scale : -scale;
      const float edge = lo_edge ? lo : hi;
      const float q0 = std::rint(edge / scale);
      float bias = 0.0f;
      if (q0 != 0.0f) {
        scale = edge / q0;
        bias = edge;
      }
      for (int j = 0; j < group_size; ++j) {
        const float v = rint_small((x[j] - bias) / scale);  // division, as MLX does (not a reciprocal)
        q[j] = v >= 0.0f ? std::min(v, n_bins) : 0.0f;     // NaN -> 0
      }
      for (int j = 0; j < group_size; j += per_word) {
        uint32_t word = 0;
        for (int k = 0; k < per_word; ++k) word |= uint32_t(q[j + k]) << (k * bits);
        out[(g * group_size + j) / per_word] = word;
      }
      scales[r * groups + g] = float_to_bf16(scale);
      biases[r * groups + g] = float_to_bf16(bias);
    }
  }
}

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Buffers converted while writing (bf16 copies of fp32 vectors and matrices); stable addresses.
struct Scratch {
  std::deque<std::vector<uint16_t>> u16;
  std::deque<std::vector<float>> f32;
};

std::vector<int64_t> lead_shape(const Matrix& m, bool stacked, std::vector<int64_t> tail) {
  if (stacked) tail.insert(tail.begin(), m.experts);
  return tail;
}

// NAME.weight (+ .scales/.biases) for a matrix; f32 matrices become bf16 unless keep_f32.
void add_matrix(std::vector<TensorOut>& out, const std::string& base, const Matrix& m, bool stacked, Scratch& scratch,
                bool keep_f32) {
  TERN_CHECK(!m.empty(), "matrix ", base, " is empty");
  TERN_CHECK(stacked || m.experts == 1, "matrix ", base, " is stacked");
  if (m.quantized()) {
    TensorOut w{base + ".weight", Dtype::u32, lead_shape(m, stacked, {m.rows, m.row_words()}), {}};
    TensorOut sc{base + ".scales", Dtype::bf16, lead_shape(m, stacked, {m.rows, m.groups_per_row()}), {}};
    TensorOut bi{base + ".biases", Dtype::bf16, lead_shape(m, stacked, {m.rows, m.groups_per_row()}), {}};
    for (int64_t e = 0; e < m.experts; ++e) {
      const Matrix x = m.expert(e);
      w.chunks.emplace_back(x.data, size_t(m.rows * m.row_words() * 4));
      sc.chunks.emplace_back(x.scales, size_t(m.rows * m.groups_per_row() * 2));
      bi.chunks.emplace_back(x.biases, size_t(m.rows * m.groups_per_row() * 2));
    }
    out.push_back(std::move(w));
    out.push_back(std::move(sc));
    out.push_back(std::move(bi));
    return;
  }
  const bool f32 = m.format == WeightFormat::f32;
  TensorOut w{base + ".weight", f32 && keep_f32 ? Dtype::f32 : Dtype::bf16,
              lead_shape(m, stacked, {m.rows, m.cols}), {}};
  for (int64_t e = 0; e < m.experts; ++e) {
    const Matrix x = m.expert(e);
    if (f32 && !keep_f32) {
      const float* src = static_cast<const float*>(x.data);
      auto& buf = scratch.u16.emplace_back(size_t(m.rows * m.cols));
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = float_to_bf16(src[i]);
      w.chunks.emplace_back(buf.data(), buf.size() * 2);
    } else {
      w.chunks.emplace_back(x.data, size_t(m.rows * m.cols * (f32 ? 4 : 2)));
    }
  }
  out.push_back(std::move(w));
}

void add_vector_bf16(std::vector<TensorOut>& out, const std::string& name, const std::vector<float>& v,
                     std::vector<int64_t> shape, Scratch& scratch) {
  auto& buf = scratch.u16.emplace_back(v.size());
  for (size_t i = 0; i < v.size(); ++i) buf[i] = float_to_bf16(v[i]);
  out.push_back(TensorOut{name, Dtype::bf16, std::move(shape), {{buf.data(), buf.size() * 2}}});
}

}  // namespace

void checkpoint_write_mlx(const ModelWeights& w, const fs::path& source_dir, const fs::path& out_dir,
                          int64_t max_shard_bytes, bool progress) {
  const Config& c = w.config;
  if (fs::exists(out_dir)) {
    TERN_CHECK(fs::is_directory(out_dir) && fs::is_empty(out_dir), "output directory ", out_dir.string(),
               " exists and is not empty");
  } else {
    fs::create_directories(out_dir);
  }
  Scratch scratch;
  std::vector<TensorOut> t;
  std::map<std::string, std::pair<int, int>> quant;  // module -> (bits, group) of every affine matrix
  auto matrix = [&](const std::string& module, const Matrix& m, bool stacked) {
    add_matrix(t, module, m, stacked, scratch, false);
    if (m.quantized()) quant[module] = {weight_format_bits(m.format), m.group_size};
  };
  const std::string p = "language_model.model.";
  matrix(p + "embed_tokens", w.embed, false);
  if (!c.tie_word_embeddings) matrix("language_model.lm_head", w.lm_head, false);
  add_vector_bf16(t, p + "norm.weight", w.final_norm, {c.hidden_size}, scratch);
  // One decoder layer's tensors under n ("language_model.model.layers.3.", "mtp.layers.0.").
  auto layer = [&](const LayerWeights& l, const std::string& n) {
    add_vector_bf16(t, n + "input_layernorm.weight", l.input_norm, {c.hidden_size}, scratch);
    add_vector_bf16(t, n + "post_attention_layernorm.weight", l.post_attn_norm, {c.hidden_size}, scratch);
    if (l.type == LayerType::linear_attention) {
      const std::string a = n + "linear_attn.";
      matrix(a + "in_proj_qkv", l.in_proj_qkv, false);
      matrix(a + "in_proj_z", l.in_proj_z, false);
      matrix(a + "in_proj_b", l.in_proj_b, false);
      matrix(a + "in_proj_a", l.in_proj_a, false);
      matrix(a + "out_proj", l.out_proj, false);
      add_vector_bf16(t, a + "conv1d.weight", l.conv1d, {c.conv_channels(), c.linear_conv_kernel_dim, 1}, scratch);
      add_vector_bf16(t, a + "A_log", l.A_log, {c.linear_num_value_heads}, scratch);
      add_vector_bf16(t, a + "dt_bias", l.dt_bias, {c.linear_num_value_heads}, scratch);
      add_vector_bf16(t, a + "norm.weight", l.gdn_norm, {c.linear_value_head_dim}, scratch);
    } else {
      const std::string a = n + "self_attn.";
      matrix(a + "q_proj", l.q_proj, false);
      matrix(a + "k_proj", l.k_proj, false);
      matrix(a + "v_proj", l.v_proj, false);
      matrix(a + "o_proj", l.o_proj, false);
      add_vector_bf16(t, a + "q_norm.weight", l.q_norm, {c.head_dim}, scratch);
      add_vector_bf16(t, a + "k_norm.weight", l.k_norm, {c.head_dim}, scratch);
    }
    const std::string m = n + "mlp.";
    matrix(m + "gate", l.router, false);
    matrix(m + "shared_expert.gate_proj", l.shared_gate, false);
    matrix(m + "shared_expert.up_proj", l.shared_up, false);
    matrix(m + "shared_expert.down_proj", l.shared_down, false);
    matrix(m + "shared_expert_gate", l.shared_expert_gate, false);
    matrix(m + "switch_mlp.gate_proj", l.expert_gate, true);
    matrix(m + "switch_mlp.up_proj", l.expert_up, true);
    matrix(m + "switch_mlp.down_proj", l.expert_down, true);
  };
  for (size_t i = 0; i < w.layers.size(); ++i) layer(w.layers[i], p + "layers." + std::to_string(i) + ".");
  if (w.mtp) {  // the MTP head keeps HF's top-level mtp.* names, in the MLX forms (switch_mlp, norms stored 1 + w)
    const MtpWeights& m = *w.mtp;
    add_vector_bf16(t, "mtp.pre_fc_norm_embedding.weight", m.pre_fc_norm_embedding, {c.hidden_size}, scratch);
    add_vector_bf16(t, "mtp.pre_fc_norm_hidden.weight", m.pre_fc_norm_hidden, {c.hidden_size}, scratch);
    matrix("mtp.fc", m.fc, false);
    layer(m.layer, "mtp.layers.0.");
    add_vector_bf16(t, "mtp.norm.weight", m.norm, {c.hidden_size}, scratch);
  }
  std::sort(t.begin(), t.end(), [](const TensorOut& a, const TensorOut& b) { return a.name < b.name; });

  // Shards of at most max_shard_bytes, always with an index (as mlx-lm writes them).
  std::vector<std::vector<size_t>> shards(1);
  uint64_t cur = 0, total = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const uint64_t b = t[i].bytes();
    if (!shards.back().empty() && max_shard_bytes > 0 && cur + b > uint64_t(max_shard_bytes)) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += b;
    total += b;
  }
  Progress bar("writing " + out_dir.filename().string(), int64_t(total), progress);
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    if (shards.size() == 1) std::snprintf(name, sizeof name, "model.safetensors");
    else std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    std::vector<TensorOut> part;
    uint64_t bytes = 0;
    for (size_t i : shards[s]) {
      part.push_back(t[i]);
      weight_map[t[i].name] = name;
      bytes += t[i].bytes();
    }
    safetensors_write(out_dir / name, part, {{"format", "mlx"}});
    bar.add(int64_t(bytes));
  }
  bar.finish();
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::ofstream(out_dir / "model.safetensors.index.json") << index.dump(4) << "\n";

  // config.json: the source config (text_config form), with the quantization section mlx-lm writes.
  json src = json::parse(read_text_file(source_dir / "config.json"), nullptr, false);
  TERN_CHECK(!src.is_discarded() && src.is_object(), (source_dir / "config.json").string(), " is not a JSON object");
  json cfg;
  if (src.value("model_type", "") == "qwen3_5_moe") {
    cfg = src;
    cfg.erase("vision_config");
  } else {
    json text = src;
    for (const char* k : {"architectures", "transformers_version", "quantization", "quantization_config"}) text.erase(k);
    cfg = {{"architectures", {"Qwen3_5MoeForConditionalGeneration"}}, {"model_type", "qwen3_5_moe"},
           {"text_config", text}, {"tie_word_embeddings", c.tie_word_embeddings}};
    if (src.contains("eos_token_id")) cfg["eos_token_id"] = src["eos_token_id"];
  }
  cfg.erase("quantization");
  cfg.erase("quantization_config");
  if (!quant.empty()) {
    std::map<std::pair<int, int>, int> votes;
    for (const auto& [module, bg] : quant) ++votes[bg];
    auto best = std::max_element(votes.begin(), votes.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; })->first;
    json q = json::object();
    q["group_size"] = best.second;
    q["bits"] = best.first;
    q["mode"] = "affine";
    for (const auto& [module, bg] : quant)
      if (bg != best) q[module] = {{"group_size", bg.second}, {"bits", bg.first}};
    cfg["quantization"] = q;
    cfg["quantization_config"] = q;
  }
  std::ofstream(out_dir / "config.json") << cfg.dump(4) << "\n";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                        "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt",
                        "generation_config.json"})
    if (fs::exists(source_dir / f)) fs::copy_file(source_dir / f, out_dir / f, fs::copy_options::overwrite_existing);
}

void weights_dump(const ModelWeights& w, const fs::path& file) {
  Scratch scratch;
  std::vector<TensorOut> t;
  auto vec = [&](const std::string& name, const std::vector<float>& v) {
    if (!v.empty()) t.push_back(TensorOut{name, Dtype::f32, {int64_t(v.size())}, {{v.data(), v.size() * 4}}});
  };
  for (const auto& [name, m] : w.all_matrices()) {
    if (name == "lm_head" && w.config.tie_word_embeddings) continue;
    add_matrix(t, name, *m, m->experts > 1 || name.find(".expert_") != std::string::npos, scratch, true);
  }
  vec("final_norm", w.final_norm);
  auto layer = [&](const LayerWeights& l, const std::string& p) {
    vec(p + "input_norm", l.input_norm);
    vec(p + "post_attn_norm", l.post_attn_norm);
    vec(p + "conv1d", l.conv1d);
    vec(p + "A_log", l.A_log);
    vec(p + "dt_bias", l.dt_bias);
    vec(p + "gdn_norm", l.gdn_norm);
    vec(p + "q_norm", l.q_norm);
    vec(p + "k_norm", l.k_norm);
  };
  for (size_t i = 0; i < w.layers.size(); ++i) layer(w.layers[i], "layers." + std::to_string(i) + ".");
  if (w.mtp) {
    vec("mtp.pre_fc_norm_embedding", w.mtp->pre_fc_norm_embedding);
    vec("mtp.pre_fc_norm_hidden", w.mtp->pre_fc_norm_hidden);
    vec("mtp.norm", w.mtp->norm);
    layer(w.mtp->layer, "mtp.layers.0.");
  }
  safetensors_write(file, t, {{"format", "tern-internal"}, {"source_layout", w.source_layout}});
}

}  // namespace tern
