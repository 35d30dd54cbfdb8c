// The vision tower's manifest (transformers' Qwen3_5MoeVisionModel state dict) resolved against the files.
#include "model/vision_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/bf16.h"
#include "core/check.h"

namespace tern {

namespace {

// Keeps the mapped checkpoint files alive while matrices point into them.
struct MappedFiles : WeightStorage {
  std::shared_ptr<SafetensorsSet> set;
};

// Load-time copies (misaligned or F16 sources, the permuted mlx-vlm patch embedding).
struct CopiedF32 : WeightStorage {
  std::vector<float> values;
};
struct CopiedBf16 : WeightStorage {
  std::vector<uint16_t> values;
};

std::string shape_text(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

float element_f32(const uint8_t* p, Dtype d) {
  switch (d) {
    case Dtype::bf16: { uint16_t b; std::memcpy(&b, p, 2); return bf16_to_float(b); }
    case Dtype::f16: { uint16_t h; std::memcpy(&h, p, 2); return f16_to_float(h); }
    case Dtype::f32: { float f; std::memcpy(&f, p, 4); return f; }
    default: return 0.0f;
  }
}

class VisionPlanner {
 public:
  VisionPlanner(const std::shared_ptr<SafetensorsSet>& set, const std::string& prefix, VisionWeights& w)
      : set_(set), prefix_(prefix), w_(w) {}

  std::vector<std::string> problems;

  // A BF16/F16/F32 tensor of exactly `shape`, else a problem and nullptr.
  const TensorRef* take(const std::string& name, const std::vector<int64_t>& shape) {
    const std::string full = prefix_ + name;
    const TensorRef* t = set_->find(full);
    if (!t) {
      problems.push_back("missing tensor '" + full + "' (expected BF16|F16|F32 " + shape_text(shape) + ")");
      return nullptr;
    }
    used_.insert(full);
    const Dtype d = t->info->dtype;
    if ((d != Dtype::bf16 && d != Dtype::f16 && d != Dtype::f32) || t->info->shape != shape) {
      problems.push_back("tensor '" + full + "': expected BF16|F16|F32 " + shape_text(shape) + ", got " +
                         dtype_name(d) + " " + t->info->shape_string());
      return nullptr;
    }
    return t;
  }

  void vector(const std::string& name, int64_t n, std::vector<float>& out) {
    const TensorRef* t = take(name, {n});
    if (!t) return;
    out.resize(size_t(n));
    const int es = dtype_size(t->info->dtype);
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = element_f32(t->data() + i * es, t->info->dtype);
  }

  // name.weight [rows, cols] as a Matrix; name.bias [rows] into bias when given.
  void linear(const std::string& name, int64_t rows, int64_t cols, Matrix& m, std::vector<float>* bias) {
    if (const TensorRef* t = take(name + ".weight", {rows, cols})) m = matrix_of(t, rows, cols);
    if (bias) vector(name + ".bias", rows, *bias);
  }

  // Conv3d weight: HF [Dv, C, Tp, P, P] read flat; mlx-vlm's [Dv, Tp, P, P, C] permuted into (c, t, y, x) order.
  void patch_embed(const VisionConfig& c) {
    const int64_t Dv = c.hidden_size, C = c.in_channels, T = c.temporal_patch_size, P = c.patch_size;
    const std::vector<int64_t> first = {Dv, C, T, P, P}, last = {Dv, T, P, P, C};
    const std::string name = "patch_embed.proj.weight";
    const TensorRef* found = set_->find(prefix_ + name);
    // The layout's own order unless the shape says otherwise (mlx-vlm's sanitize keeps a weight already
    // channels-last and transposes one that is not; both shapes are accepted when they differ).
    bool channels_last = w_.source_layout == "mlx";
    if (found && first != last) {
      if (found->info->shape == first) channels_last = false;
      if (found->info->shape == last) channels_last = true;
    }
    const TensorRef* t = take(name, channels_last ? last : first);
    if (t && !channels_last) w_.patch_embed = matrix_of(t, Dv, c.patch_dim());
    if (t && channels_last) {
      auto copy = std::make_shared<CopiedF32>();
      copy->values.resize(size_t(Dv * c.patch_dim()));
      const int es = dtype_size(t->info->dtype);
      for (int64_t o = 0; o < Dv; ++o)
        for (int64_t ch = 0; ch < C; ++ch)
          for (int64_t tt = 0; tt < T; ++tt)
            for (int64_t y = 0; y < P; ++y)
              for (int64_t x = 0; x < P; ++x) {
                const int64_t src = (((o * T + tt) * P + y) * P + x) * C + ch;
                const int64_t dst = (((o * C + ch) * T + tt) * P + y) * P + x;
                copy->values[size_t(dst)] = element_f32(t->data() + src * es, t->info->dtype);
              }
      w_.patch_embed = Matrix{};
      w_.patch_embed.format = WeightFormat::f32;
      w_.patch_embed.rows = Dv;
      w_.patch_embed.cols = c.patch_dim();
      w_.patch_embed.data = copy->values.data();
      w_.storage.push_back(copy);
    }
    vector("patch_embed.proj.bias", Dv, w_.patch_embed_bias);
  }

  // Every tensor under the prefix must have been taken (mlx-vlm drops position_ids; HF files hold none).
  void check_unexpected() {
    const auto& names = set_->names();
    for (auto it = std::lower_bound(names.begin(), names.end(), prefix_);
         it != names.end() && it->rfind(prefix_, 0) == 0; ++it)
      if (!used_.count(*it)) {
        const TensorInfo& t = *set_->find(*it)->info;
        problems.push_back("unexpected tensor '" + *it + "' (" + dtype_name(t.dtype) + " " + t.shape_string() + ")");
      }
  }

  bool any_mapped = false;

 private:
  // Zero-copy when stored BF16 or F32 at an aligned address; else a copy (F16 widened to F32).
  Matrix matrix_of(const TensorRef* t, int64_t rows, int64_t cols) {
    Matrix m;
    m.rows = rows;
    m.cols = cols;
    const Dtype d = t->info->dtype;
    const uintptr_t addr = reinterpret_cast<uintptr_t>(t->data());
    if (d == Dtype::bf16 && addr % 2 == 0) {
      m.format = WeightFormat::bf16;
      m.data = t->data();
      any_mapped = true;
    } else if (d == Dtype::f32 && addr % 4 == 0) {
      m.format = WeightFormat::f32;
      m.data = t->data();
      any_mapped = true;
    } else if (d == Dtype::bf16) {
      auto copy = std::make_shared<CopiedBf16>();
      copy->values.resize(size_t(rows * cols));
      std::memcpy(copy->values.data(), t->data(), copy->values.size() * 2);
      m.format = WeightFormat::bf16;
      m.data = copy->values.data();
      w_.storage.push_back(copy);
    } else {
      auto copy = std::make_shared<CopiedF32>();
      copy->values.resize(size_t(rows * cols));
      const int es = dtype_size(d);
      for (int64_t i = 0; i < rows * cols; ++i) copy->values[size_t(i)] = element_f32(t->data() + i * es, d);
      m.format = WeightFormat::f32;
      m.data = copy->values.data();
      w_.storage.push_back(copy);
    }
    return m;
  }

  std::shared_ptr<SafetensorsSet> set_;
  std::string prefix_;
  VisionWeights& w_;
  std::set<std::string> used_;
};

}  // namespace

std::string vision_prefix(const SafetensorsSet& set) {
  const auto& names = set.names();
  auto has = [&](const std::string& p) {
    auto it = std::lower_bound(names.begin(), names.end(), p);
    return it != names.end() && it->rfind(p, 0) == 0;
  };
  const bool hf = has("model.visual."), mlx = has("vision_tower.");
  TERN_CHECK(!(hf && mlx), "the checkpoint holds vision tensors under both model.visual.* and vision_tower.*");
  return hf ? "model.visual." : mlx ? "vision_tower." : "";
}

std::vector<std::pair<std::string, const Matrix*>> VisionWeights::all_matrices() const {
  std::vector<std::pair<std::string, const Matrix*>> out = {{"patch_embed", &patch_embed}, {"pos_embed", &pos_embed}};
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    out.emplace_back(p + "qkv", &blocks[i].qkv);
    out.emplace_back(p + "proj", &blocks[i].proj);
    out.emplace_back(p + "fc1", &blocks[i].fc1);
    out.emplace_back(p + "fc2", &blocks[i].fc2);
  }
  out.emplace_back("merger.fc1", &merger_fc1);
  out.emplace_back("merger.fc2", &merger_fc2);
  return out;
}

int64_t VisionWeights::total_bytes() const {
  int64_t b = 0;
  for (const auto& [n, m] : all_matrices()) b += m->bytes();
  auto vec = [&](const std::vector<float>& v) { b += int64_t(v.size()) * 4; };
  vec(patch_embed_bias); vec(merger_norm_weight); vec(merger_norm_bias); vec(merger_fc1_bias); vec(merger_fc2_bias);
  for (const VisionBlockWeights& k : blocks) {
    vec(k.norm1_weight); vec(k.norm1_bias); vec(k.norm2_weight); vec(k.norm2_bias);
    vec(k.qkv_bias); vec(k.proj_bias); vec(k.fc1_bias); vec(k.fc2_bias);
  }
  return b;
}

std::shared_ptr<VisionWeights> vision_weights_load(const std::shared_ptr<SafetensorsSet>& set,
                                                   const VisionConfig& c, const std::string& prefix) {
  TERN_CHECK(prefix == "model.visual." || prefix == "vision_tower.", "vision tensors: unknown key prefix '", prefix,
             "'");
  c.validate();
  auto w = std::make_shared<VisionWeights>();
  w->config = c;
  w->source_layout = prefix == "vision_tower." ? "mlx" : "hf";
  VisionPlanner p(set, prefix, *w);
  const int64_t Dv = c.hidden_size, Iv = c.intermediate_size, Dm = c.merged_dim();
  p.patch_embed(c);
  p.linear("pos_embed", c.num_position_embeddings, Dv, w->pos_embed, nullptr);
  w->blocks.resize(size_t(c.depth));
  for (int i = 0; i < c.depth; ++i) {
    VisionBlockWeights& b = w->blocks[size_t(i)];
    const std::string n = "blocks." + std::to_string(i) + ".";
    p.vector(n + "norm1.weight", Dv, b.norm1_weight);
    p.vector(n + "norm1.bias", Dv, b.norm1_bias);
    p.vector(n + "norm2.weight", Dv, b.norm2_weight);
    p.vector(n + "norm2.bias", Dv, b.norm2_bias);
    p.linear(n + "attn.qkv", 3 * Dv, Dv, b.qkv, &b.qkv_bias);
    p.linear(n + "attn.proj", Dv, Dv, b.proj, &b.proj_bias);
    p.linear(n + "mlp.linear_fc1", Iv, Dv, b.fc1, &b.fc1_bias);
    p.linear(n + "mlp.linear_fc2", Dv, Iv, b.fc2, &b.fc2_bias);
  }
  p.vector("merger.norm.weight", Dv, w->merger_norm_weight);
  p.vector("merger.norm.bias", Dv, w->merger_norm_bias);
  p.linear("merger.linear_fc1", Dm, Dm, w->merger_fc1, &w->merger_fc1_bias);
  p.linear("merger.linear_fc2", c.out_hidden_size, Dm, w->merger_fc2, &w->merger_fc2_bias);
  p.check_unexpected();
  if (!p.problems.empty()) {
    std::string msg = "vision tensors ('" + prefix + "*') do not match config.json's vision_config: " +
                      std::to_string(p.problems.size()) + " problem(s):";
    for (size_t i = 0; i < p.problems.size() && i < 8; ++i) msg += "\n  " + p.problems[i];
    if (p.problems.size() > 8) msg += "\n  ... and " + std::to_string(p.problems.size() - 8) + " more";
    throw Error(msg);
  }
  if (p.any_mapped) {
    auto mapped = std::make_shared<MappedFiles>();
    mapped->set = set;
    w->storage.push_back(std::move(mapped));
  }
  return w;
}

std::shared_ptr<VisionWeights> vision_load(const std::filesystem::path& dir) {
  const Config config = config_load(dir);
  TERN_CHECK(config.vision.has_value(), "config.json in ", dir.string(), " has no vision_config");
  auto set = std::make_shared<SafetensorsSet>(dir);
  const std::string prefix = vision_prefix(*set);
  TERN_CHECK(!prefix.empty(), "the checkpoint in ", dir.string(),
             " holds no vision tensors (model.visual.* or vision_tower.*)");
  return vision_weights_load(set, *config.vision, prefix);
}

}  // namespace tern
