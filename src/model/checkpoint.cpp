// Checkpoint loading: the manifest of every layer type for the HF and MLX layouts, validation with messages that
// name tensors, and the load-time transforms into the one internal layout (weights.h).
#include "model/checkpoint.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/bf16.h"
#include "core/check.h"
#include "core/text_file.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "model/quantize.h"
#include "model/safetensors.h"
#include "model/vision_checkpoint.h"

namespace tern {

namespace {

namespace fs = std::filesystem;

enum class Layout { hf, mlx };

// Heap memory created by load-time transforms (64-byte aligned).
struct HeapStorage : WeightStorage {
  explicit HeapStorage(size_t bytes) {
    const size_t n = std::max<size_t>(64, (bytes + 63) / 64 * 64);
    data = static_cast<uint8_t*>(std::aligned_alloc(64, n));
    TERN_CHECK(data != nullptr, "out of memory allocating ", n, " bytes for weights");
  }
  ~HeapStorage() override { std::free(data); }
  uint8_t* data = nullptr;
};

// Keeps the mapped checkpoint files alive while matrices point into them.
struct MappedStorage : WeightStorage {
  std::shared_ptr<SafetensorsSet> set;
};

float element_to_float(const uint8_t* p, Dtype d) {
  switch (d) {
    case Dtype::bf16: { uint16_t b; std::memcpy(&b, p, 2); return bf16_to_float(b); }
    case Dtype::f16: { uint16_t h; std::memcpy(&h, p, 2); return f16_to_float(h); }
    case Dtype::f32: { float f; std::memcpy(&f, p, 4); return f; }
    default: return 0.0f;
  }
}

bool is_float(Dtype d) { return d == Dtype::bf16 || d == Dtype::f16 || d == Dtype::f32; }

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// A source matrix (possibly stacked experts) as per-expert pointers into the mapped files.
struct Source {
  bool quantized = false;
  int bits = 0, group_size = 64;
  Dtype dtype = Dtype::bf16;        // element dtype when not quantized
  Dtype scale_dtype = Dtype::bf16;  // scales/biases dtype when quantized
  int64_t experts = 1, rows = 0, cols = 0;
  std::vector<const uint8_t*> data, scales, biases;  // [experts], each at row 0 of that expert
  int64_t source_bytes = 0;
  int64_t row_bytes() const { return quantized ? cols * bits / 8 : cols * dtype_size(dtype); }
  int64_t group_row_bytes() const { return quantized ? cols / group_size * dtype_size(scale_dtype) : 0; }
};

struct MatrixJob {
  std::string name, kind;
  Source src;
  Matrix* target = nullptr;
  WeightFormat format = WeightFormat::bf16;
  int group_size = 64;
  bool zero_copy = false;
  int64_t stride_data = 0, stride_groups = 0;  // zero-copy expert strides (storage elements)
};

struct VectorJob {
  std::string name;
  const TensorRef* ref = nullptr;
  std::vector<float>* target = nullptr;
  bool one_plus = false;
};

int64_t storage_elem_bytes(WeightFormat f) { return f == WeightFormat::bf16 ? 2 : 4; }

WeightFormat affine_format(int bits) { return bits == 8 ? WeightFormat::affine8 : WeightFormat::affine4; }

// Builds the jobs of a load: resolves every manifest entry against the files, collecting problems.
class Planner {
 public:
  Planner(const SafetensorsSet& set, const Config& cfg, const LoadOptions& opt, ModelWeights& w)
      : set_(set), cfg_(cfg), opt_(opt), w_(w) {}

  Layout layout = Layout::hf;
  std::string prefix, lm_head_base, experts_form;
  std::vector<MatrixJob> matrices;
  std::vector<VectorJob> vectors;
  std::vector<std::string> problems;
  std::set<std::string> used;
  std::string kind_override;  // every matrix planned gets this kind when set (the MTP head's: "mtp")

  void detect_layout() {
    const auto& names = set_.names();
    bool mlx_conv = false, hf_conv = false, lm_prefix = false, scales = false;
    for (const std::string& n : names) {
      if (n.rfind("language_model.", 0) == 0) lm_prefix = true;
      if (n.size() > 7 && n.compare(n.size() - 7, 7, ".scales") == 0) scales = true;
      if (n.find("linear_attn.conv1d.weight") != std::string::npos) {
        const auto& s = set_.find(n)->info->shape;
        if (s.size() == 3 && s[2] == 1 && s[1] > 1) mlx_conv = true;
        if (s.size() == 3 && s[1] == 1) hf_conv = true;
      }
    }
    layout = mlx_conv ? Layout::mlx : hf_conv ? Layout::hf : (lm_prefix || scales) ? Layout::mlx : Layout::hf;
    if (layout == Layout::hf) {
      prefix = has_prefix("model.language_model.") ? "model.language_model." : "model.";
      lm_head_base = "lm_head";
    } else {
      prefix = has_prefix("language_model.model.") ? "language_model.model." : "model.";
      lm_head_base = has_prefix("language_model.lm_head") ? "language_model.lm_head" : "lm_head";
    }
  }

  bool has_prefix(const std::string& p) const {
    const auto& names = set_.names();
    auto it = std::lower_bound(names.begin(), names.end(), p);
    return it != names.end() && it->rfind(p, 0) == 0;
  }

  // A file holding only the MTP head (tern extract-mtp): MLX layout when its experts are stacked (switch_mlp).
  void detect_mtp_file_layout() {
    layout = has_prefix("mtp.layers.0.mlp.switch_mlp.") ? Layout::mlx : Layout::hf;
  }

  // The MTP draft head under `mtp.` (weights.h MtpWeights); its matrices are of kind "mtp" (tern inspect).
  void plan_mtp(MtpWeights& m) {
    const int64_t D = cfg_.hidden_size;
    const std::string form = experts_form;
    kind_override = "mtp";
    vector("mtp.pre_fc_norm_embedding", "mtp.pre_fc_norm_embedding.weight", {D}, &m.pre_fc_norm_embedding, true);
    vector("mtp.pre_fc_norm_hidden", "mtp.pre_fc_norm_hidden.weight", {D}, &m.pre_fc_norm_hidden, true);
    matrix("mtp.fc", "mtp", "mtp.fc", D, 2 * D, 4, &m.fc);
    plan_layer_weights(m.layer, LayerType::full_attention, "mtp.layers.0.", "mtp.layers.0.");
    vector("mtp.norm", "mtp.norm.weight", {D}, &m.norm, true);
    kind_override.clear();
    if (!form.empty()) experts_form = form;
  }

  void plan_all() {
    const Config& c = cfg_;
    const int64_t D = c.hidden_size, V = c.vocab_size;
    matrix("embed", "embed", prefix + "embed_tokens", V, D, 4, &w_.embed);
    if (c.tie_word_embeddings) {
      if (set_.find(lm_head_base + ".weight")) used.insert(lm_head_base + ".weight");
    } else {
      matrix("lm_head", "lm_head", lm_head_base, V, D, 4, &w_.lm_head);
    }
    vector("norm", prefix + "norm.weight", {D}, &w_.final_norm, true);
    w_.layers.resize(size_t(c.num_hidden_layers));
    for (int i = 0; i < c.num_hidden_layers; ++i) plan_layer(i);
  }

  void plan_layer(int i) {
    plan_layer_weights(w_.layers[size_t(i)], cfg_.layer_types[size_t(i)], prefix + "layers." + std::to_string(i) + ".",
                       "layers." + std::to_string(i) + ".");
  }

  // One decoder layer: its tensors under p (e.g. "model.language_model.layers.3."), named n ("layers.3.") inside.
  void plan_layer_weights(LayerWeights& l, LayerType type, const std::string& p, const std::string& n) {
    const Config& c = cfg_;
    l.type = type;
    const int64_t D = c.hidden_size, E = c.num_experts, F = c.moe_intermediate_size;
    const int64_t Fs = c.shared_expert_intermediate_size;
    vector(n + "input_norm", p + "input_layernorm.weight", {D}, &l.input_norm, true);
    vector(n + "post_attn_norm", p + "post_attention_layernorm.weight", {D}, &l.post_attn_norm, true);
    if (l.type == LayerType::linear_attention) {
      const int64_t Hv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
      const std::string a = p + "linear_attn.";
      matrix(n + "in_proj_qkv", "linear_attention", a + "in_proj_qkv", c.conv_channels(), D, 4, &l.in_proj_qkv);
      matrix(n + "in_proj_z", "linear_attention", a + "in_proj_z", Hv * dv, D, 4, &l.in_proj_z);
      matrix(n + "in_proj_b", "linear_attention", a + "in_proj_b", Hv, D, 4, &l.in_proj_b);
      matrix(n + "in_proj_a", "linear_attention", a + "in_proj_a", Hv, D, 4, &l.in_proj_a);
      matrix(n + "out_proj", "linear_attention", a + "out_proj", D, Hv * dv, 4, &l.out_proj);
      const int64_t C = c.conv_channels(), Ck = c.linear_conv_kernel_dim;
      const std::vector<int64_t> conv_shape =
          layout == Layout::hf ? std::vector<int64_t>{C, 1, Ck} : std::vector<int64_t>{C, Ck, 1};
      vector(n + "conv1d", a + "conv1d.weight", conv_shape, &l.conv1d, false);
      vector(n + "A_log", a + "A_log", {Hv}, &l.A_log, false);
      vector(n + "dt_bias", a + "dt_bias", {Hv}, &l.dt_bias, false);
      vector(n + "gdn_norm", a + "norm.weight", {dv}, &l.gdn_norm, false);
    } else {
      const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, dh = c.head_dim;
      const std::string a = p + "self_attn.";
      matrix(n + "q_proj", "attention", a + "q_proj", Hq * 2 * dh, D, 4, &l.q_proj);
      matrix(n + "k_proj", "attention", a + "k_proj", Hkv * dh, D, 4, &l.k_proj);
      matrix(n + "v_proj", "attention", a + "v_proj", Hkv * dh, D, 4, &l.v_proj);
      matrix(n + "o_proj", "attention", a + "o_proj", D, Hq * dh, 4, &l.o_proj);
      vector(n + "q_norm", a + "q_norm.weight", {dh}, &l.q_norm, true);
      vector(n + "k_norm", a + "k_norm.weight", {dh}, &l.k_norm, true);
    }
    const std::string m = p + "mlp.";
    matrix(n + "router", "router", m + "gate", E, D, 8, &l.router);
    matrix(n + "shared_gate", "shared_expert", m + "shared_expert.gate_proj", Fs, D, 4, &l.shared_gate);
    matrix(n + "shared_up", "shared_expert", m + "shared_expert.up_proj", Fs, D, 4, &l.shared_up);
    matrix(n + "shared_down", "shared_expert", m + "shared_expert.down_proj", D, Fs, 4, &l.shared_down);
    matrix(n + "shared_expert_gate", "shared_expert", m + "shared_expert_gate", 1, D, 8, &l.shared_expert_gate);
    plan_experts(n, m, E, F, D, l);
  }

  void plan_experts(const std::string& n, const std::string& m, int64_t E, int64_t F, int64_t D, LayerWeights& l) {
    if (layout == Layout::mlx) {
      experts_form = "stacked";
      stacked(n + "expert_gate", m + "switch_mlp.gate_proj", E, F, D, &l.expert_gate);
      stacked(n + "expert_up", m + "switch_mlp.up_proj", E, F, D, &l.expert_up);
      stacked(n + "expert_down", m + "switch_mlp.down_proj", E, D, F, &l.expert_down);
      return;
    }
    const std::string fused = m + "experts.gate_up_proj";
    if (set_.find(fused) || !set_.find(m + "experts.0.gate_proj.weight")) {
      experts_form = "fused";
      const TensorRef* gu = take_float(fused, {E, 2 * F, D});
      const TensorRef* dn = take_float(m + "experts.down_proj", {E, D, F});
      if (gu) {
        const int64_t es = dtype_size(gu->info->dtype);
        Source g = float_source(gu, E, F, D), u = g;
        for (int64_t e = 0; e < E; ++e) {
          g.data[size_t(e)] = gu->data() + e * 2 * F * D * es;
          u.data[size_t(e)] = gu->data() + (e * 2 * F + F) * D * es;
        }
        g.source_bytes = u.source_bytes = int64_t(gu->bytes() / 2);
        add_job(n + "expert_gate", "experts", std::move(g), 4, &l.expert_gate);
        add_job(n + "expert_up", "experts", std::move(u), 4, &l.expert_up);
      }
      if (dn) add_job(n + "expert_down", "experts", float_source(dn, E, D, F), 4, &l.expert_down);
      return;
    }
    experts_form = "per-expert";
    const char* parts[3] = {"gate_proj", "up_proj", "down_proj"};
    Matrix* targets[3] = {&l.expert_gate, &l.expert_up, &l.expert_down};
    const char* names[3] = {"expert_gate", "expert_up", "expert_down"};
    for (int k = 0; k < 3; ++k) {
      const int64_t rows = k == 2 ? D : F, cols = k == 2 ? F : D;
      Source s;
      s.experts = E;
      s.rows = rows;
      s.cols = cols;
      s.data.assign(size_t(E), nullptr);
      s.source_bytes = 0;
      bool ok = true, first = true;
      for (int64_t e = 0; e < E; ++e) {
        const TensorRef* t = take_float(m + "experts." + std::to_string(e) + "." + parts[k] + ".weight", {rows, cols});
        if (!t) { ok = false; continue; }
        if (first) s.dtype = t->info->dtype;
        first = false;
        if (t->info->dtype != s.dtype) {
          problem("tensor '" + t->info->name + "': dtype " + dtype_name(t->info->dtype) + " differs from expert 0 (" +
                  dtype_name(s.dtype) + ")");
          ok = false;
          continue;
        }
        s.data[size_t(e)] = t->data();
        s.source_bytes += int64_t(t->bytes());
      }
      if (ok) add_job(n + names[k], "experts", std::move(s), 4, targets[k]);
    }
  }

  // Every tensor not consumed and not under a skipped prefix is unexpected.
  // A file of the MTP head alone (--draft-weights) skips nothing.
  void check_unexpected(std::map<std::string, std::pair<int64_t, int64_t>>& skipped, bool skip_parts = true) {
    static const std::vector<const char*> kSkip = {"model.visual.", "vision_tower.", "mtp.", "model.mtp.",
                                                   "language_model.mtp."};
    for (const std::string& name : set_.names()) {
      if (used.count(name)) continue;
      bool skip = false;
      for (const char* s : skip_parts ? kSkip : std::vector<const char*>{})
        if (name.rfind(s, 0) == 0) {
          auto& [count, bytes] = skipped[s];
          ++count;
          bytes += int64_t(set_.find(name)->bytes());
          skip = true;
          break;
        }
      if (!skip) {
        const TensorInfo& t = *set_.find(name)->info;
        problem("unexpected tensor '" + name + "' (" + dtype_name(t.dtype) + " " + t.shape_string() + ")");
      }
    }
  }

 private:
  void problem(std::string s) { problems.push_back(std::move(s)); }

  const TensorRef* take(const std::string& name) {
    const TensorRef* t = set_.find(name);
    if (t) used.insert(name);
    return t;
  }

  // A float tensor (BF16, F16 or F32) of the given shape, else a problem and nullptr.
  const TensorRef* take_float(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorRef* t = take(name);
    if (!t) {
      problem("missing tensor '" + name + "' (expected BF16|F16|F32 " + shape_str(shape) + ")");
      return nullptr;
    }
    if (!is_float(t->info->dtype) || t->info->shape != shape) {
      problem("tensor '" + name + "': expected BF16|F16|F32 " + shape_str(shape) + ", got " +
              dtype_name(t->info->dtype) + " " + t->info->shape_string());
      return nullptr;
    }
    return t;
  }

  Source float_source(const TensorRef* t, int64_t experts, int64_t rows, int64_t cols) {
    Source s;
    s.dtype = t->info->dtype;
    s.experts = experts;
    s.rows = rows;
    s.cols = cols;
    s.data.assign(size_t(experts), t->data());
    for (int64_t e = 0; e < experts; ++e) s.data[size_t(e)] = t->data() + e * rows * cols * dtype_size(s.dtype);
    s.source_bytes = int64_t(t->bytes());
    return s;
  }

  // A plain or stacked matrix stored as base.weight, or quantised (MLX) as base.{weight,scales,biases}.
  bool resolve(const std::string& base, int64_t experts, int64_t rows, int64_t cols, Source& out) {
    std::vector<int64_t> lead;
    if (experts > 1 || base.find("switch_mlp") != std::string::npos) lead.push_back(experts);
    auto with = [&](std::vector<int64_t> tail) {
      std::vector<int64_t> s = lead;
      s.insert(s.end(), tail.begin(), tail.end());
      return s;
    };
    const TensorRef* sc = set_.find(base + ".scales");
    if (!sc) {
      const TensorRef* t = take_float(base + ".weight", with({rows, cols}));
      if (!t) return false;
      out = float_source(t, experts, rows, cols);
      return true;
    }
    const QuantSpec q = cfg_.quant_for(base);
    const TensorRef* w = take(base + ".weight");
    const TensorRef* bi = take(base + ".biases");
    take(base + ".scales");
    if (q.bits == 0) {
      problem("tensor '" + base + ".scales': the module is quantised but config.json has no quantization bits for it");
      return false;
    }
    if (cols % q.group_size != 0 || (cols * q.bits) % 32 != 0) {
      problem("tensor '" + base + ".weight': " + std::to_string(cols) + " columns do not split into groups of " +
              std::to_string(q.group_size));
      return false;
    }
    const auto wshape = with({rows, cols * q.bits / 32}), gshape = with({rows, cols / q.group_size});
    bool ok = true;
    if (!w) { problem("missing tensor '" + base + ".weight' (expected U32 " + shape_str(wshape) + ")"); ok = false; }
    else if (w->info->dtype != Dtype::u32 || w->info->shape != wshape) {
      problem("tensor '" + base + ".weight': expected U32 " + shape_str(wshape) + " (" + std::to_string(q.bits) +
              "-bit), got " + dtype_name(w->info->dtype) + " " + w->info->shape_string());
      ok = false;
    }
    for (auto [t, suffix] : {std::pair{sc, ".scales"}, std::pair{bi, ".biases"}}) {
      if (!t) { problem("missing tensor '" + base + suffix + "' (expected BF16 " + shape_str(gshape) + ")"); ok = false; }
      else if (!is_float(t->info->dtype) || t->info->shape != gshape) {
        problem("tensor '" + base + suffix + "': expected BF16 " + shape_str(gshape) + ", got " +
                dtype_name(t->info->dtype) + " " + t->info->shape_string());
        ok = false;
      }
    }
    if (ok && sc->info->dtype != bi->info->dtype) {
      problem("tensor '" + base + ".biases': dtype differs from its scales");
      ok = false;
    }
    if (!ok) return false;
    out.quantized = true;
    out.bits = q.bits;
    out.group_size = q.group_size;
    out.scale_dtype = sc->info->dtype;
    out.experts = experts;
    out.rows = rows;
    out.cols = cols;
    const int64_t wbytes = rows * cols * q.bits / 8, gbytes = rows * (cols / q.group_size) * dtype_size(sc->info->dtype);
    for (int64_t e = 0; e < experts; ++e) {
      out.data.push_back(w->data() + e * wbytes);
      out.scales.push_back(sc->data() + e * gbytes);
      out.biases.push_back(bi->data() + e * gbytes);
    }
    out.source_bytes = int64_t(w->bytes() + sc->bytes() + bi->bytes());
    return true;
  }

  void matrix(const std::string& name, const std::string& kind, const std::string& base, int64_t rows, int64_t cols,
              int auto_bits, Matrix* target) {
    Source s;
    if (resolve(base, 1, rows, cols, s)) add_job(name, kind, std::move(s), auto_bits, target);
  }

  void stacked(const std::string& name, const std::string& base, int64_t E, int64_t rows, int64_t cols, Matrix* t) {
    Source s;
    if (resolve(base, E, rows, cols, s)) add_job(name, "experts", std::move(s), 4, t);
  }

  void vector(const std::string& name, const std::string& tensor, const std::vector<int64_t>& shape,
              std::vector<float>* target, bool zero_centred) {
    const TensorRef* t = take_float(tensor, shape);
    if (!t) return;
    vectors.push_back(VectorJob{name, t, target, zero_centred && layout == Layout::hf});
  }

  void add_job(const std::string& name, const std::string& kind, Source s, int auto_bits, Matrix* target) {
    MatrixJob j;
    j.name = name;
    j.kind = kind_override.empty() ? kind : kind_override;
    j.target = target;
    const bool quantizable = s.cols % 64 == 0;
    if (s.quantized) {
      if (opt_.dtype == LoadOptions::Dtype::bf16) {
        problem("tensor '" + name + "' is stored " + std::to_string(s.bits) +
                "-bit; --dtype bf16 needs an unquantised (BF16) checkpoint");
        return;
      }
      j.format = affine_format(s.bits);
      j.group_size = s.group_size;
    } else if (opt_.dtype == LoadOptions::Dtype::bf16) {
      j.format = WeightFormat::bf16;
    } else if (opt_.dtype == LoadOptions::Dtype::q4 ||
               (layout == Layout::hf && opt_.dtype != LoadOptions::Dtype::stored)) {
      j.format = quantizable ? affine_format(auto_bits) : WeightFormat::bf16;
    } else {  // MLX file stored unquantised: as stored (F16 widened to f32)
      j.format = s.dtype == Dtype::bf16 ? WeightFormat::bf16 : WeightFormat::f32;
    }
    // Zero-copy when the stored bytes already are the target format, aligned, at a uniform expert stride.
    const bool same = (s.quantized && s.scale_dtype == Dtype::bf16) ||
                      (!s.quantized && ((j.format == WeightFormat::bf16 && s.dtype == Dtype::bf16) ||
                                        (j.format == WeightFormat::f32 && s.dtype == Dtype::f32)));
    if (same) {
      const int64_t eb = storage_elem_bytes(j.format);
      bool ok = true;
      for (const uint8_t* p : s.data) ok = ok && reinterpret_cast<uintptr_t>(p) % uintptr_t(eb) == 0;
      for (const uint8_t* p : s.scales) ok = ok && reinterpret_cast<uintptr_t>(p) % 2 == 0;
      for (const uint8_t* p : s.biases) ok = ok && reinterpret_cast<uintptr_t>(p) % 2 == 0;
      if (ok && s.experts > 1) {
        const int64_t sd = s.data[1] - s.data[0];
        const int64_t sg = s.quantized ? s.scales[1] - s.scales[0] : 0;
        const int64_t sb = s.quantized ? s.biases[1] - s.biases[0] : 0;
        ok = sd > 0 && sd % eb == 0 && sg == sb && sg % 2 == 0 && (!s.quantized || sg > 0);
        for (int64_t e = 1; ok && e < s.experts; ++e) {
          ok = s.data[size_t(e)] - s.data[0] == e * sd;
          if (s.quantized) ok = ok && s.scales[size_t(e)] - s.scales[0] == e * sg && s.biases[size_t(e)] - s.biases[0] == e * sg;
        }
        if (ok) {
          j.stride_data = sd / eb;
          j.stride_groups = sg / 2;
        }
      }
      j.zero_copy = ok;
    }
    j.src = std::move(s);
    matrices.push_back(std::move(j));
  }

  const SafetensorsSet& set_;
  const Config& cfg_;
  const LoadOptions& opt_;
  ModelWeights& w_;
};

int64_t planned_bytes(const MatrixJob& j) {
  Matrix m;
  m.format = j.format;
  m.experts = j.src.experts;
  m.rows = j.src.rows;
  m.cols = j.src.cols;
  m.group_size = j.group_size;
  return m.bytes();
}

// Reads one source row of expert e as fp32 (dequantising when the source is affine).
void source_row_f32(const Source& s, int64_t e, int64_t r, float* out) {
  const uint8_t* row = s.data[size_t(e)] + r * s.row_bytes();
  if (!s.quantized) {
    if (s.dtype == Dtype::bf16) {  // the common case, kept simple enough to vectorise
      for (int64_t c = 0; c < s.cols; ++c) {
        uint16_t b;
        std::memcpy(&b, row + c * 2, 2);
        out[c] = bf16_to_float(b);
      }
      return;
    }
    const int es = dtype_size(s.dtype);
    for (int64_t c = 0; c < s.cols; ++c) out[c] = element_to_float(row + c * es, s.dtype);
    return;
  }
  const int per_word = 32 / s.bits;
  const uint32_t mask = (1u << s.bits) - 1u;
  const int gs = dtype_size(s.scale_dtype);
  const uint8_t* sc = s.scales[size_t(e)] + r * s.group_row_bytes();
  const uint8_t* bi = s.biases[size_t(e)] + r * s.group_row_bytes();
  for (int64_t c = 0; c < s.cols; ++c) {
    uint32_t word;
    std::memcpy(&word, row + (c / per_word) * 4, 4);
    const uint32_t q = (word >> (s.bits * (c % per_word))) & mask;
    const int64_t g = c / s.group_size;
    out[c] = element_to_float(sc + g * gs, s.scale_dtype) * float(q) + element_to_float(bi + g * gs, s.scale_dtype);
  }
}

// Asks the kernel to start reading a job's source bytes (called one job ahead, so disk reads overlap the work).
void prefetch(const MatrixJob& j) {
  static const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  auto advise = [](const uint8_t* p, int64_t bytes) {
    if (!p || bytes <= 0) return;
    const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
    const uintptr_t end = reinterpret_cast<uintptr_t>(p) + uintptr_t(bytes);
    ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);
  };
  const Source& s = j.src;
  for (size_t e = 0; e < s.data.size(); ++e) {
    advise(s.data[e], s.rows * s.row_bytes());
    if (s.quantized) {
      advise(s.scales[e], s.rows * s.group_row_bytes());
      advise(s.biases[e], s.rows * s.group_row_bytes());
    }
  }
}

// Produces job.target from its source, in parallel over rows. Returns heap storage (or null for zero-copy).
std::shared_ptr<HeapStorage> run_job(MatrixJob& j, Progress& progress) {
  const Source& s = j.src;
  Matrix& m = *j.target;
  m = Matrix{};
  m.format = j.format;
  m.experts = s.experts;
  m.rows = s.rows;
  m.cols = s.cols;
  m.group_size = j.group_size;
  if (j.zero_copy) {
    m.data = s.data[0];
    if (s.quantized) {
      m.scales = reinterpret_cast<const uint16_t*>(s.scales[0]);
      m.biases = reinterpret_cast<const uint16_t*>(s.biases[0]);
    }
    m.expert_stride_data = s.experts > 1 ? j.stride_data : 0;
    m.expert_stride_groups = s.experts > 1 ? j.stride_groups : 0;
    if (m.expert_stride_data == m.rows * m.row_words()) m.expert_stride_data = 0;
    if (m.expert_stride_groups == m.rows * m.groups_per_row()) m.expert_stride_groups = 0;
    return nullptr;
  }
  const int64_t words = m.row_words(), groups = m.groups_per_row();
  const int64_t data_bytes = s.experts * s.rows * words * storage_elem_bytes(m.format);
  const int64_t group_bytes = s.experts * s.rows * groups * 2;
  auto heap = std::make_shared<HeapStorage>(size_t(data_bytes + 2 * group_bytes));
  uint8_t* data = heap->data;
  uint16_t* scales = m.quantized() ? reinterpret_cast<uint16_t*>(data + data_bytes) : nullptr;
  uint16_t* biases = m.quantized() ? scales + s.experts * s.rows * groups : nullptr;
  m.data = data;
  m.scales = scales;
  m.biases = biases;
  const int64_t total_rows = s.experts * s.rows;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, s.cols));
  const int64_t src_row_bytes = s.source_bytes / std::max<int64_t>(1, total_rows);
  thread_pool_global().parallel_for(total_rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(size_t(s.cols));
    for (int64_t i = begin; i < end; ++i) {
      const int64_t e = i / s.rows, r = i % s.rows;
      uint8_t* out = data + i * words * storage_elem_bytes(m.format);
      const bool same_affine = s.quantized && m.quantized() && s.bits == weight_format_bits(m.format) &&
                               s.group_size == m.group_size;
      if (same_affine) {  // copy packed words; scales/biases to bf16
        std::memcpy(out, s.data[size_t(e)] + r * s.row_bytes(), size_t(s.row_bytes()));
        const int gs = dtype_size(s.scale_dtype);
        for (int64_t g = 0; g < groups; ++g) {
          const uint8_t* sp = s.scales[size_t(e)] + r * s.group_row_bytes() + g * gs;
          const uint8_t* bp = s.biases[size_t(e)] + r * s.group_row_bytes() + g * gs;
          scales[i * groups + g] = s.scale_dtype == Dtype::bf16 ? uint16_t(sp[0] | (sp[1] << 8))
                                                                : float_to_bf16(element_to_float(sp, s.scale_dtype));
          biases[i * groups + g] = s.scale_dtype == Dtype::bf16 ? uint16_t(bp[0] | (bp[1] << 8))
                                                                : float_to_bf16(element_to_float(bp, s.scale_dtype));
        }
        continue;
      }
      if (!s.quantized && m.format == WeightFormat::bf16 && s.dtype == Dtype::bf16) {
        std::memcpy(out, s.data[size_t(e)] + r * s.row_bytes(), size_t(s.row_bytes()));
        continue;
      }
      source_row_f32(s, e, r, buf.data());
      switch (m.format) {
        case WeightFormat::f32: std::memcpy(out, buf.data(), size_t(s.cols) * 4); break;
        case WeightFormat::bf16:
          for (int64_t c = 0; c < s.cols; ++c) {
            const uint16_t b = float_to_bf16(buf[size_t(c)]);
            std::memcpy(out + c * 2, &b, 2);
          }
          break;
        case WeightFormat::affine4:
        case WeightFormat::affine8:
          quantize_affine(buf.data(), 1, s.cols, weight_format_bits(m.format), m.group_size,
                          reinterpret_cast<uint32_t*>(out), scales + i * groups, biases + i * groups);
          break;
      }
    }
    progress.add(src_row_bytes * (end - begin));
  });
  return heap;
}

struct Loaded {
  std::shared_ptr<SafetensorsSet> set;
  Config config;
  std::unique_ptr<Planner> planner;
  // --draft-weights: the file's tensors and their planner (its own layout and quantisation).
  std::shared_ptr<SafetensorsSet> draft_set;
  Config draft_config;
  std::unique_ptr<Planner> draft_planner;
  CheckpointSummary summary;
  std::shared_ptr<VisionWeights> vision;
  std::vector<Planner*> planners() const {
    std::vector<Planner*> v{planner.get()};
    if (draft_planner) v.push_back(draft_planner.get());
    return v;
  }
};

// The vision tower when config.json describes one and the files hold it (a text-only conversion keeps the config
// but drops the tensors: images are then unavailable).
void plan_vision(const fs::path& dir, Loaded& out) {
  if (!out.config.vision) return;
  const std::string prefix = vision_prefix(*out.set);
  if (prefix.empty()) return;
  try {
    out.vision = vision_weights_load(out.set, *out.config.vision, prefix);
  } catch (const Error& e) {
    throw Error("checkpoint " + dir.string() + ": " + e.what());
  }
  CheckpointSummary& s = out.summary;
  s.vision = true;
  if (auto it = s.skipped.find(prefix); it != s.skipped.end()) {
    s.vision_tensors = it->second.first;
    s.vision_bytes = it->second.second;
    s.skipped.erase(it);
  }
}

// Why the model's config rules the MTP head out (empty when tern can run it).
std::string mtp_unsupported(const Config& c) {
  if (c.mtp_num_hidden_layers != 1)
    return "config.json has mtp_num_hidden_layers = " + std::to_string(c.mtp_num_hidden_layers) +
           "; tern's drafter runs exactly one MTP layer";
  if (c.mtp_use_dedicated_embeddings)
    return "config.json has mtp_use_dedicated_embeddings = true; tern's drafter shares the model's embedding";
  return "";
}

void throw_problems(const std::string& what, const Planner& p) {
  std::string msg = what + ": " + std::to_string(p.problems.size()) + " problem(s):";
  for (size_t i = 0; i < p.problems.size() && i < 8; ++i) msg += "\n  " + p.problems[i];
  if (p.problems.size() > 8) msg += "\n  ... and " + std::to_string(p.problems.size() - 8) + " more";
  throw Error(msg);
}

// The MTP head: from --draft-weights, else the folder's mtp.* tensors, else absent (w.mtp_absent says why).
void plan_mtp(const fs::path& dir, const LoadOptions& options, ModelWeights& w, Loaded& out) {
  const std::string unsupported = mtp_unsupported(w.config);
  if (!options.draft_weights.empty()) {
    const fs::path& file = options.draft_weights;
    TERN_CHECK(fs::is_regular_file(file), "--draft-weights ", file.string(), " is not a file");
    TERN_CHECK(unsupported.empty(), "--draft-weights ", file.string(), ": ", unsupported);
    out.draft_set = std::make_shared<SafetensorsSet>(file);
    out.draft_config = w.config;
    const TensorRef* any = out.draft_set->names().empty() ? nullptr : out.draft_set->find(out.draft_set->names()[0]);
    const auto& meta = any ? any->file->header().metadata : std::map<std::string, std::string>{};
    if (auto q = meta.find("quantization"); q != meta.end()) {
      try {
        config_set_quantization(out.draft_config, q->second);
      } catch (const Error& e) {
        throw Error("--draft-weights " + file.string() + ": " + e.what());
      }
    }
    out.draft_planner = std::make_unique<Planner>(*out.draft_set, out.draft_config, options, w);
    Planner& dp = *out.draft_planner;
    dp.detect_mtp_file_layout();
    TERN_CHECK(dp.has_prefix("mtp."), "--draft-weights ", file.string(),
               " holds no mtp.* tensors (tern extract-mtp -m HF_DIR -o FILE writes them)");
    w.mtp.emplace();
    dp.plan_mtp(*w.mtp);
    std::map<std::string, std::pair<int64_t, int64_t>> none;
    dp.check_unexpected(none, /*skip_parts=*/false);
    if (!dp.problems.empty())
      throw_problems("--draft-weights " + file.string() + " does not hold the MTP head of this model", dp);
    w.mtp_source = file.string();
    return;
  }
  Planner& p = *out.planner;
  if (!p.has_prefix("mtp.")) {
    w.mtp_absent = "no mtp.* tensors in " + dir.string() +
                   " (MLX conversions drop them; tern extract-mtp -m HF_DIR -o mtp.safetensors writes them from the "
                   "BF16 checkpoint for --draft-weights)";
    return;
  }
  if (!unsupported.empty()) {
    w.mtp_absent = unsupported;
    return;
  }
  w.mtp.emplace();
  p.plan_mtp(*w.mtp);
  w.mtp_source = dir.string();
}

// Reads config and headers, resolves the manifest and fails with the first problems when they do not match.
void plan(const fs::path& dir, const LoadOptions& options, ModelWeights& w, Loaded& out) {
  out.config = config_load(dir);
  out.set = std::make_shared<SafetensorsSet>(dir);
  w.config = out.config;
  out.planner = std::make_unique<Planner>(*out.set, w.config, options, w);
  Planner& p = *out.planner;
  p.detect_layout();
  p.plan_all();
  plan_mtp(dir, options, w, out);
  CheckpointSummary& s = out.summary;
  p.check_unexpected(s.skipped);
  const std::string layout = p.layout == Layout::hf ? "hf" : "mlx";
  if (!p.problems.empty())
    throw_problems("checkpoint " + dir.string() + " (" + layout + " layout, keys '" + p.prefix +
                       "*') does not match the Qwen3.6-MoE manifest",
                   p);
  s.mtp = w.mtp_source;
  s.mtp_absent = w.mtp_absent;
  s.layout = layout;
  s.naming = p.prefix;
  s.experts_form = p.experts_form;
  s.files = int64_t(out.set->files().size());
  s.tensors = int64_t(out.set->names().size());
  s.source_bytes = int64_t(out.set->total_bytes());
  s.config = out.config;
  const int64_t tok = tokenizer_id_count(dir);
  TERN_CHECK(tok <= out.config.vocab_size, "tokenizer.json in ", dir.string(), " has ", tok,
             " ids but the embedding has only vocab_size = ", out.config.vocab_size, " rows");
  s.vocab_real = tok > 0 ? tok : out.config.vocab_size;
  for (const Planner* q : out.planners()) {
    for (const MatrixJob& j : q->matrices)
      s.matrices.push_back(PlannedMatrix{j.name, j.kind, j.format, j.src.experts, j.src.rows, j.src.cols,
                                         j.group_size, planned_bytes(j), j.zero_copy});
    for (const VectorJob& v : q->vectors) s.vector_bytes += v.ref->info->numel() * 4;
  }
  plan_vision(dir, out);
}

}  // namespace

LoadOptions::Dtype load_dtype_parse(const std::string& text) {
  if (text == "auto") return LoadOptions::Dtype::auto_;
  if (text == "q4") return LoadOptions::Dtype::q4;
  if (text == "bf16") return LoadOptions::Dtype::bf16;
  if (text == "stored") return LoadOptions::Dtype::stored;
  TERN_FAIL("--dtype must be auto, q4, bf16 or stored, got '", text, "'");
}

int64_t CheckpointSummary::weight_bytes() const {
  int64_t b = vector_bytes;
  for (const PlannedMatrix& m : matrices) b += m.bytes;
  return b;
}

int64_t tokenizer_id_count(const fs::path& dir) {
  const fs::path p = dir / "tokenizer.json";
  if (!fs::exists(p)) return 0;
  const nlohmann::json j = nlohmann::json::parse(read_text_file(p), nullptr, false);
  TERN_CHECK(!j.is_discarded() && j.is_object(), p.string(), " is not a JSON object");
  int64_t max_id = -1;
  auto see = [&](const nlohmann::json& id) {
    if (id.is_number_integer()) max_id = std::max<int64_t>(max_id, id.get<int64_t>());
  };
  if (auto m = j.find("model"); m != j.end() && m->is_object())
    if (auto v = m->find("vocab"); v != m->end() && v->is_object())
      for (const auto& id : *v) see(id);
  if (auto a = j.find("added_tokens"); a != j.end() && a->is_array())
    for (const auto& t : *a)
      if (t.is_object() && t.contains("id")) see(t["id"]);
  TERN_CHECK(max_id >= 0, p.string(), " holds no token ids");
  return max_id + 1;
}

CheckpointSummary checkpoint_summary(const fs::path& dir, const LoadOptions& options) {
  ModelWeights w;
  Loaded l;
  plan(dir, options, w, l);
  return l.summary;
}

ModelWeights model_load(const fs::path& dir, const LoadOptions& options) {
  ModelWeights w;
  Loaded l;
  plan(dir, options, w, l);
  w.source_layout = l.summary.layout;
  w.vocab_real = l.summary.vocab_real;
  std::vector<MatrixJob*> matrices;
  std::vector<const VectorJob*> vectors;
  for (Planner* q : l.planners()) {
    for (MatrixJob& j : q->matrices) matrices.push_back(&j);
    for (const VectorJob& v : q->vectors) vectors.push_back(&v);
  }
  w.vision = l.vision;
  // The bar counts the bytes read and transformed here. Matrices used in place in the mapped files are read later
  // (by the upload to a GPU, or as the CPU backend touches them): they add no bytes, and no speed, to it.
  int64_t read_bytes = 0, mapped_bytes = 0, transformed = 0;
  for (const MatrixJob* j : matrices) {
    (j->zero_copy ? mapped_bytes : read_bytes) += j->src.source_bytes;
    transformed += j->zero_copy ? 0 : 1;
  }
  for (const VectorJob* v : vectors) read_bytes += int64_t(v->ref->bytes());
  const std::string name = "loading " + dir.filename().string();
  if (options.progress && mapped_bytes > 0)
    std::fprintf(stderr, "%s: %.2f GB mapped in place (read when first used)\n", name.c_str(), double(mapped_bytes) / 1e9);
  Progress progress(name, read_bytes, options.progress && transformed > 0);
  bool any_zero_copy = false;
  if (!matrices.empty() && !matrices[0]->zero_copy) prefetch(*matrices[0]);
  for (size_t i = 0; i < matrices.size(); ++i) {
    MatrixJob& j = *matrices[i];
    if (i + 1 < matrices.size() && !matrices[i + 1]->zero_copy) prefetch(*matrices[i + 1]);
    if (auto heap = run_job(j, progress)) w.storage.push_back(std::move(heap));
    any_zero_copy = any_zero_copy || j.zero_copy;
  }
  for (const VectorJob* vp : vectors) {
    const VectorJob& v = *vp;
    const int64_t n = v.ref->info->numel();
    const int es = dtype_size(v.ref->info->dtype);
    v.target->resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) {
      const float x = element_to_float(v.ref->data() + i * es, v.ref->info->dtype);
      (*v.target)[size_t(i)] = v.one_plus ? 1.0f + x : x;
    }
    progress.add(int64_t(v.ref->bytes()));
  }
  if (w.config.tie_word_embeddings) w.lm_head = w.embed;
  if (any_zero_copy) {
    for (const auto& set : {l.set, l.draft_set}) {
      if (!set) continue;
      auto mapped = std::make_shared<MappedStorage>();
      mapped->set = set;
      w.storage.push_back(std::move(mapped));
    }
  }
  progress.finish();
  if (options.progress && !w.mtp) std::fprintf(stderr, "tern: no MTP draft head: %s\n", w.mtp_absent.c_str());
  return w;
}

}  // namespace tern
