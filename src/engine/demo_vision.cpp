#include "engine/demo_vision.h"

#include <cmath>
#include <deque>
#include <vector>

#include "core/check.h"
#include "engine/demo_random.h"

namespace tern {

namespace {

struct VisionStorage : WeightStorage {
  std::deque<std::vector<float>> floats;  // deque: references stay valid as buffers are added
};

// Draws the encoder's tensors in a fixed order, each from its own stream.
class VisionBuilder {
 public:
  VisionBuilder(uint64_t seed, VisionStorage& storage)
      : seed_(demo::mix(seed ^ 0x766973696f6eull)), storage_(storage) {}  // "vision": a stream of its own

  // An fp32 [rows, cols] matrix, uniform with standard deviation `stddev`.
  Matrix matrix(int64_t rows, int64_t cols, float stddev) {
    std::vector<float>& data = storage_.floats.emplace_back(size_t(rows * cols));
    const uint64_t tensor = next_tensor_++;
    const float amplitude = stddev * std::sqrt(3.0f);  // uniform on [-a, a] has standard deviation a / sqrt(3)
    for (int64_t r = 0; r < rows; ++r) {
      demo::Uniform u(seed_, tensor, uint64_t(r));
      for (int64_t c = 0; c < cols; ++c) data[size_t(r * cols + c)] = amplitude * u.next();
    }
    Matrix m;
    m.format = WeightFormat::f32;
    m.rows = rows;
    m.cols = cols;
    m.data = data.data();
    return m;
  }

  // center + spread * uniform[-1, 1).
  std::vector<float> vector(int64_t n, float center, float spread) {
    demo::Uniform u(seed_, next_tensor_++, 0);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = center + spread * u.next();
    return v;
  }

 private:
  uint64_t seed_;
  VisionStorage& storage_;
  uint64_t next_tensor_ = 1;
};

}  // namespace

std::string demo_vision_config_json(int64_t out_hidden) {
  return detail::concat(
      "{\"model_type\": \"qwen3_5_moe_vision\", \"depth\": 2, \"hidden_size\": 64, \"intermediate_size\": 128, "
      "\"num_heads\": 4, \"in_channels\": 3, \"patch_size\": 16, \"temporal_patch_size\": 2, "
      "\"spatial_merge_size\": 2, \"out_hidden_size\": ", out_hidden, ", \"num_position_embeddings\": 64, "
      "\"hidden_act\": \"gelu_pytorch_tanh\", \"deepstack_visual_indexes\": []}");
}

std::shared_ptr<const VisionWeights> demo_vision_build(const VisionConfig& c, uint64_t seed) {
  auto w = std::make_shared<VisionWeights>();
  auto storage = std::make_shared<VisionStorage>();
  VisionBuilder b(seed, *storage);
  w->config = c;
  const int64_t Dv = c.hidden_size, Iv = c.intermediate_size, Dm = c.merged_dim();
  const float s_in = 1.0f / std::sqrt(float(Dv));
  w->patch_embed = b.matrix(Dv, c.patch_dim(), 1.0f / std::sqrt(float(c.patch_dim())));
  w->patch_embed_bias = b.vector(Dv, 0.0f, 0.05f);
  w->pos_embed = b.matrix(c.num_position_embeddings, Dv, 0.5f);
  for (int i = 0; i < c.depth; ++i) {
    VisionBlockWeights& k = w->blocks.emplace_back();
    k.norm1_weight = b.vector(Dv, 1.0f, 0.1f);
    k.norm1_bias = b.vector(Dv, 0.0f, 0.1f);
    k.norm2_weight = b.vector(Dv, 1.0f, 0.1f);
    k.norm2_bias = b.vector(Dv, 0.0f, 0.1f);
    k.qkv = b.matrix(3 * Dv, Dv, s_in);
    k.qkv_bias = b.vector(3 * Dv, 0.0f, 0.05f);
    k.proj = b.matrix(Dv, Dv, s_in);
    k.proj_bias = b.vector(Dv, 0.0f, 0.05f);
    k.fc1 = b.matrix(Iv, Dv, s_in);
    k.fc1_bias = b.vector(Iv, 0.0f, 0.05f);
    k.fc2 = b.matrix(Dv, Iv, 1.0f / std::sqrt(float(Iv)));
    k.fc2_bias = b.vector(Dv, 0.0f, 0.05f);
  }
  w->merger_norm_weight = b.vector(Dv, 1.0f, 0.1f);
  w->merger_norm_bias = b.vector(Dv, 0.0f, 0.1f);
  w->merger_fc1 = b.matrix(Dm, Dm, 1.0f / std::sqrt(float(Dm)));
  w->merger_fc1_bias = b.vector(Dm, 0.0f, 0.05f);
  w->merger_fc2 = b.matrix(c.out_hidden_size, Dm, 1.0f / std::sqrt(float(Dm)));
  w->merger_fc2_bias = b.vector(c.out_hidden_size, 0.0f, 0.05f);
  w->source_layout = "demo";
  w->storage.push_back(storage);
  return w;
}

}  // namespace tern
