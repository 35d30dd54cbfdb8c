#include "cuda/runner/vision_plan.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>

#include "core/bf16.h"
#include "core/check.h"
#include "core/thread_pool.h"
#include "cpu/ops_vision.h"
#include "cuda/runner/cuda_runner_impl.cuh"
#include "cuda/kernels/vision/vision_attention.cuh"
#include "cuda/kernels/vision/vision_embed.cuh"
#include "cuda/kernels/vision/vision_gemm.cuh"
#include "cuda/kernels/vision/vision_layernorm.cuh"
#include "cuda/kernels/vision/vision_random.cuh"
#include "cuda/weights/staged_upload.cuh"
#include "model/mrope.h"
#include "model/vision_weights.h"

namespace tern::cuda {
namespace {

constexpr float kLayerNormEps = 1e-6f;  // every LayerNorm of the vision tower (as cpu/vision_encoder.cpp)

// The vision tower's copies to the device, gathered and then sent at once through the staged upload (one sync, not
// one per tensor). Matrices go as bf16 [rows, cols]: BF16 as stored, F32 rounded to nearest even here, on the host's
// threads, into buffers kept (with the vectors built here) until the upload is done.
class VisionUpload {
 public:
  void matrix(const uint16_t* dst, const Matrix& m, int64_t rows, int64_t cols, const char* name) {
    TERN_CHECK(m.experts == 1 && m.rows == rows && m.cols == cols, "vision weights: ", name, " is [", m.rows, ", ",
               m.cols, "], the config wants [", rows, ", ", cols, "]");
    TERN_CHECK(m.format == WeightFormat::bf16 || m.format == WeightFormat::f32, "vision weights: ", name, " is ",
               weight_format_name(m.format), "; the GPU encoder takes BF16 or F32");
    const size_t n = size_t(rows * cols);
    if (m.format == WeightFormat::bf16) {
      put(dst, m.data, n * 2);
      return;
    }
    std::vector<uint16_t>& rounded = rounded_.emplace_back(n);
    const float* src = static_cast<const float*>(m.data);
    thread_pool_global().parallel_for(int64_t(n), int64_t(1) << 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) rounded[size_t(i)] = float_to_bf16(src[i]);
    });
    put(dst, rounded.data(), n * 2);
  }
  void vector(const float* dst, const std::vector<float>& v, int64_t n, const char* name) {
    TERN_CHECK(int64_t(v.size()) == n, "vision weights: ", name, " holds ", v.size(), " values, the config wants ", n);
    put(dst, v.data(), size_t(n) * 4);
  }
  // A vector built for the upload: kept until it is done.
  void vector(const float* dst, std::vector<float>&& v, int64_t n, const char* name) {
    vector(dst, kept_.emplace_back(std::move(v)), n, name);
  }
  void run() { staged_upload(std::move(copies_), "vision tower to GPU", false); }

 private:
  void put(const void* dst, const void* src, size_t bytes) {
    copies_.push_back(HostCopy{static_cast<const uint8_t*>(src), reinterpret_cast<uintptr_t>(dst), bytes});
  }
  std::vector<HostCopy> copies_;
  std::deque<std::vector<uint16_t>> rounded_;
  std::deque<std::vector<float>> kept_;
};

}  // namespace

void VisionPlan::check_config() const {
  c_.validate();
  TERN_CHECK(c_.patch_dim() % 8 == 0 && c_.hidden_size % 8 == 0 && c_.intermediate_size % 8 == 0 &&
                 c_.out_hidden_size % 2 == 0,
             "vision encoder on the GPU: patch width ", c_.patch_dim(), ", width ", c_.hidden_size, " and MLP width ",
             c_.intermediate_size, " must be multiples of 8, the output width ", c_.out_hidden_size, " even");
  TERN_CHECK(c_.head_dim() <= 128, "vision encoder on the GPU: head dim ", c_.head_dim(), " (at most 128)");
}

void VisionPlan::layout_weights() {
  const int64_t Dv = c_.hidden_size, Iv = c_.intermediate_size, Dm = c_.merged_dim(), out = c_.out_hidden_size;
  blocks_.assign(size_t(c_.depth), Block{});
  // Pass 0 counts the bytes, pass 1 carves the arena in the same order.
  for (int pass = 0; pass < 2; ++pass) {
    size_t bytes = 0;
    auto f32 = [&](const float*& p, int64_t n) {
      if (pass == 0) bytes += DeviceArena::align(size_t(n) * 4);
      else p = weights_.take_n<float>(size_t(n));
    };
    auto b16 = [&](const uint16_t*& p, int64_t n) {
      if (pass == 0) bytes += DeviceArena::align(size_t(n) * 2);
      else p = weights_.take_n<uint16_t>(size_t(n));
    };
    b16(patch_embed_, Dv * c_.patch_dim());
    f32(patch_embed_b_, Dv);
    f32(pos_table_, table_rows_ * Dv);
    for (Block& b : blocks_) {
      f32(b.norm1_w, Dv);
      f32(b.norm1_b, Dv);
      f32(b.norm2_w, Dv);
      f32(b.norm2_b, Dv);
      b16(b.qkv, 3 * Dv * Dv);
      f32(b.qkv_b, 3 * Dv);
      b16(b.proj, Dv * Dv);
      f32(b.proj_b, Dv);
      b16(b.fc1, Iv * Dv);
      f32(b.fc1_b, Iv);
      b16(b.fc2, Dv * Iv);
      f32(b.fc2_b, Dv);
    }
    f32(merger_norm_w_, Dv);
    f32(merger_norm_b_, Dv);
    b16(merger_fc1_, Dm * Dm);
    f32(merger_fc1_b_, Dm);
    b16(merger_fc2_, out * Dm);
    f32(merger_fc2_b_, out);
    if (pass == 0) weights_ = DeviceArena(bytes, "the vision encoder's weights");
  }
}

VisionPlan::VisionPlan(const VisionWeights& w, cudaStream_t stream) : c_(w.config), stream_(stream) {
  check_config();
  const int64_t Dv = c_.hidden_size, Iv = c_.intermediate_size, Dm = c_.merged_dim(), out = c_.out_hidden_size;
  TERN_CHECK(int64_t(w.blocks.size()) == c_.depth, "vision weights: ", w.blocks.size(), " blocks, the config wants ",
             c_.depth);
  TERN_CHECK(w.pos_embed.experts == 1 && w.pos_embed.cols == Dv && w.pos_embed.rows > 0,
             "vision weights: pos_embed is [", w.pos_embed.rows, ", ", w.pos_embed.cols, "], want [rows, ", Dv, "]");
  table_rows_ = w.pos_embed.rows;
  layout_weights();

  VisionUpload up;
  up.matrix(patch_embed_, w.patch_embed, Dv, c_.patch_dim(), "patch_embed");
  up.vector(patch_embed_b_, w.patch_embed_bias, Dv, "patch_embed bias");
  {
    std::vector<float> table(size_t(table_rows_ * Dv));
    for (int64_t r = 0; r < table_rows_; ++r) matrix_row_to_f32(w.pos_embed, r, table.data() + r * Dv);
    up.vector(pos_table_, std::move(table), table_rows_ * Dv, "pos_embed");
  }
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const VisionBlockWeights& s = w.blocks[i];
    const Block& b = blocks_[i];
    up.vector(b.norm1_w, s.norm1_weight, Dv, "norm1 weight");
    up.vector(b.norm1_b, s.norm1_bias, Dv, "norm1 bias");
    up.vector(b.norm2_w, s.norm2_weight, Dv, "norm2 weight");
    up.vector(b.norm2_b, s.norm2_bias, Dv, "norm2 bias");
    up.matrix(b.qkv, s.qkv, 3 * Dv, Dv, "attn.qkv");
    up.vector(b.qkv_b, s.qkv_bias, 3 * Dv, "attn.qkv bias");
    up.matrix(b.proj, s.proj, Dv, Dv, "attn.proj");
    up.vector(b.proj_b, s.proj_bias, Dv, "attn.proj bias");
    up.matrix(b.fc1, s.fc1, Iv, Dv, "mlp.linear_fc1");
    up.vector(b.fc1_b, s.fc1_bias, Iv, "mlp.linear_fc1 bias");
    up.matrix(b.fc2, s.fc2, Dv, Iv, "mlp.linear_fc2");
    up.vector(b.fc2_b, s.fc2_bias, Dv, "mlp.linear_fc2 bias");
  }
  up.vector(merger_norm_w_, w.merger_norm_weight, Dv, "merger norm weight");
  up.vector(merger_norm_b_, w.merger_norm_bias, Dv, "merger norm bias");
  up.matrix(merger_fc1_, w.merger_fc1, Dm, Dm, "merger.linear_fc1");
  up.vector(merger_fc1_b_, w.merger_fc1_bias, Dm, "merger.linear_fc1 bias");
  up.matrix(merger_fc2_, w.merger_fc2, out, Dm, "merger.linear_fc2");
  up.vector(merger_fc2_b_, w.merger_fc2_bias, out, "merger.linear_fc2 bias");
  up.run();
}

VisionPlan::VisionPlan(const VisionConfig& config, uint64_t seed, cudaStream_t stream) : c_(config), stream_(stream) {
  check_config();
  const int64_t Dv = c_.hidden_size, Iv = c_.intermediate_size, Dm = c_.merged_dim(), out = c_.out_hidden_size;
  table_rows_ = c_.num_position_embeddings;
  layout_weights();
  uint64_t tensor = 0;
  // Matrices uniform with standard deviation 1/sqrt(cols) (amplitude sqrt(3/cols)), norms near 1, biases near 0.
  auto mat = [&](const uint16_t* p, int64_t rows, int64_t cols) {
    vision_fill_bf16(const_cast<uint16_t*>(p), rows * cols, std::sqrt(3.0f / float(cols)), seed * 1000 + tensor++,
                     stream_);
  };
  auto vec = [&](const float* p, int64_t n, float center, float spread) {
    vision_fill_f32(const_cast<float*>(p), n, center, spread, seed * 1000 + tensor++, stream_);
  };
  mat(patch_embed_, Dv, c_.patch_dim());
  vec(patch_embed_b_, Dv, 0.0f, 0.05f);
  vec(pos_table_, table_rows_ * Dv, 0.0f, 0.5f);
  for (const Block& b : blocks_) {
    vec(b.norm1_w, Dv, 1.0f, 0.1f);
    vec(b.norm1_b, Dv, 0.0f, 0.1f);
    vec(b.norm2_w, Dv, 1.0f, 0.1f);
    vec(b.norm2_b, Dv, 0.0f, 0.1f);
    mat(b.qkv, 3 * Dv, Dv);
    vec(b.qkv_b, 3 * Dv, 0.0f, 0.05f);
    mat(b.proj, Dv, Dv);
    vec(b.proj_b, Dv, 0.0f, 0.05f);
    mat(b.fc1, Iv, Dv);
    vec(b.fc1_b, Iv, 0.0f, 0.05f);
    mat(b.fc2, Dv, Iv);
    vec(b.fc2_b, Dv, 0.0f, 0.05f);
  }
  vec(merger_norm_w_, Dv, 1.0f, 0.1f);
  vec(merger_norm_b_, Dv, 0.0f, 0.1f);
  mat(merger_fc1_, Dm, Dm);
  vec(merger_fc1_b_, Dm, 0.0f, 0.05f);
  mat(merger_fc2_, out, Dm);
  vec(merger_fc2_b_, out, 0.0f, 0.05f);
  TERN_CUDA(cudaStreamSynchronize(stream_));
}

VisionPlan::ScratchSizes VisionPlan::scratch_sizes(int64_t N) const {
  const int64_t Dv = c_.hidden_size, pd = c_.patch_dim(), M2 = int64_t(c_.spatial_merge_size) * c_.spatial_merge_size;
  const int64_t tokens = N / M2, dhp = vision_attn_padded_dim(c_.head_dim());
  const size_t qkv_floats = size_t(N * 3 * Dv);
  const size_t mid_halves = size_t(std::max({N * c_.intermediate_size, N * pd, tokens * c_.merged_dim()}));
  const size_t head_halves = size_t(c_.num_heads * N * dhp);
  ScratchSizes s{{size_t(N * Dv) * 4, size_t(N * Dv) * 2, qkv_floats * 4, head_halves * 2, head_halves * 2,
                  head_halves * 2, mid_halves * 2, size_t(tokens * c_.out_hidden_size) * 4,
                  size_t(N * (c_.head_dim() / 2)) * 4, size_t(N * 4) * 4, size_t(N * 4) * 4},
                 0};
  for (const size_t b : s.part) s.total += DeviceArena::align(b);
  return s;
}

int64_t VisionPlan::scratch_bytes_for(int64_t patches) const { return int64_t(scratch_sizes(patches).total); }

void VisionPlan::ensure_scratch(int64_t N) {
  if (N <= scratch_patches_) return;
  const ScratchSizes z = scratch_sizes(N);
  const size_t* sizes = z.part;
  const size_t bytes = z.total;
  scratch_ = DeviceArena();  // the old one first: both need not fit at once
  scratch_patches_ = 0;
  scratch_ = DeviceArena(bytes, "the vision encoder's scratch");
  x_ = static_cast<float*>(scratch_.take(sizes[0]));
  h_ = static_cast<uint16_t*>(scratch_.take(sizes[1]));
  qkv_ = static_cast<float*>(scratch_.take(sizes[2]));
  q_ = static_cast<uint16_t*>(scratch_.take(sizes[3]));
  k_ = static_cast<uint16_t*>(scratch_.take(sizes[4]));
  v_ = static_cast<uint16_t*>(scratch_.take(sizes[5]));
  mid_ = static_cast<uint16_t*>(scratch_.take(sizes[6]));
  out_ = static_cast<float*>(scratch_.take(sizes[7]));
  angles_ = static_cast<float*>(scratch_.take(sizes[8]));
  tap_index_ = static_cast<int32_t*>(scratch_.take(sizes[9]));
  tap_weight_ = static_cast<float*>(scratch_.take(sizes[10]));
  scratch_patches_ = N;
}

// x [N, Dv] += one block (cpu/vision_encoder.cpp's vision_block).
void VisionPlan::run_block(const Block& b, int64_t N, int64_t frame_len) {
  const int64_t Dv = c_.hidden_size, Iv = c_.intermediate_size;
  const VisionAttnDims ad{.N = N, .frame_len = frame_len, .H = c_.num_heads, .dh = c_.head_dim()};
  vision_layernorm(x_, b.norm1_w, b.norm1_b, kLayerNormEps, N, Dv, h_, stream_);
  vision_gemm({.x = h_, .w = b.qkv, .bias = b.qkv_b, .M = N, .N = 3 * Dv, .K = Dv, .y_f32 = qkv_}, stream_);
  vision_attn_prepare(qkv_, angles_, ad, q_, k_, v_, stream_);
  vision_attention(q_, k_, v_, ad, 1.0f / std::sqrt(float(c_.head_dim())), h_, stream_);
  vision_gemm({.x = h_, .w = b.proj, .bias = b.proj_b, .M = N, .N = Dv, .K = Dv, .y_f32 = x_, .accumulate = true},
              stream_);
  vision_layernorm(x_, b.norm2_w, b.norm2_b, kLayerNormEps, N, Dv, h_, stream_);
  const VisionAct act = c_.hidden_act == "gelu" ? VisionAct::gelu_erf : VisionAct::gelu_tanh;
  vision_gemm({.x = h_, .w = b.fc1, .bias = b.fc1_b, .M = N, .N = Iv, .K = Dv, .act = act, .y_bf16 = mid_}, stream_);
  vision_gemm({.x = mid_, .w = b.fc2, .bias = b.fc2_b, .M = N, .N = Dv, .K = Iv, .y_f32 = x_, .accumulate = true},
              stream_);
}

ImageEmbeddings VisionPlan::encode(const ImagePixels& pixels) {
  const MropeGrid& g = pixels.grid;
  const int M = c_.spatial_merge_size;
  const std::vector<cpu::VisionGrid> grids = {{g.t, g.h, g.w}};
  const int64_t N = cpu::vision_patch_count(grids, M);  // checks the grid
  const int64_t pd = c_.patch_dim(), Dv = c_.hidden_size, Dm = c_.merged_dim(), out = c_.out_hidden_size;
  TERN_CHECK(pixels.patch_dim == pd && int64_t(pixels.values.size()) == N * pixels.patch_dim, "encode_image: ",
             pixels.values.size(), " pixel values of patch width ", pixels.patch_dim, " for a grid (", g.t, ", ", g.h,
             ", ", g.w, ") of patches of width ", pd);
  const int64_t tokens = mrope_grid_tokens(g, M);
  TERN_CHECK(tokens * M * M == N, "encode_image: grid (", g.t, ", ", g.h, ", ", g.w, ") and ", tokens, " tokens");

  // Host side: the position taps (checked against the table) and the rotary angles, as the CPU encoder makes them.
  const cpu::VisionPosTaps taps = cpu::vision_pos_taps(grids, M, c_.grid_per_side());
  for (const int32_t idx : taps.index)
    TERN_CHECK(idx >= 0 && idx < table_rows_, "vision: position tap ", idx, " outside the table");
  const std::vector<float> angles = cpu::vision_rope_angles(grids, M, c_.head_dim(), c_.rope_theta);

  ensure_scratch(N);
  // The pixels rounded to bf16 on the host's threads (as the CPU encoder rounds them), the taps and the angles,
  // gathered in pinned memory and copied at the link's speed (from pageable memory the 12.6 MB of a 1024² image's
  // bf16 pixels took milliseconds). Layout: pixels [N, pd] bf16 | tap index [N, 4] | tap weight [N, 4] | angles.
  uint16_t* const pix16 = mid_;     // [N, pd] bf16, until the first block
  const size_t pix_bytes = size_t(N * pd) * 2, index_bytes = taps.index.size() * 4,
               weight_bytes = taps.weight.size() * 4, angle_bytes = angles.size() * 4;
  uint8_t* const in = static_cast<uint8_t*>(
      pinned_in_.ensure(pix_bytes + index_bytes + weight_bytes + angle_bytes, "an image's pixels"));
  uint16_t* const in_pix = reinterpret_cast<uint16_t*>(in);
  thread_pool_global().parallel_for(N * pd, int64_t(1) << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) in_pix[i] = float_to_bf16(pixels.values[size_t(i)]);
  });
  std::memcpy(in + pix_bytes, taps.index.data(), index_bytes);
  std::memcpy(in + pix_bytes + index_bytes, taps.weight.data(), weight_bytes);
  std::memcpy(in + pix_bytes + index_bytes + weight_bytes, angles.data(), angle_bytes);
  TERN_CUDA(cudaMemcpyAsync(pix16, in, pix_bytes, cudaMemcpyHostToDevice, stream_));
  TERN_CUDA(cudaMemcpyAsync(tap_index_, in + pix_bytes, index_bytes, cudaMemcpyHostToDevice, stream_));
  TERN_CUDA(cudaMemcpyAsync(tap_weight_, in + pix_bytes + index_bytes, weight_bytes, cudaMemcpyHostToDevice, stream_));
  TERN_CUDA(cudaMemcpyAsync(angles_, in + pix_bytes + index_bytes + weight_bytes, angle_bytes, cudaMemcpyHostToDevice,
                            stream_));

  vision_gemm({.x = pix16, .w = patch_embed_, .bias = patch_embed_b_, .M = N, .N = Dv, .K = pd, .y_f32 = x_},
              stream_);
  vision_add_positions(x_, pos_table_, tap_index_, tap_weight_, N, Dv, stream_);
  for (const Block& b : blocks_) run_block(b, N, g.h * g.w);

  // Merger: LN per patch; M² consecutive patches are one row of [tokens, Dm].
  vision_layernorm(x_, merger_norm_w_, merger_norm_b_, kLayerNormEps, N, Dv, h_, stream_);
  vision_gemm({.x = h_, .w = merger_fc1_, .bias = merger_fc1_b_, .M = tokens, .N = Dm, .K = Dm,
               .act = VisionAct::gelu_erf, .y_bf16 = mid_},
              stream_);
  vision_gemm({.x = mid_, .w = merger_fc2_, .bias = merger_fc2_b_, .M = tokens, .N = out, .K = Dm, .y_f32 = out_},
              stream_);

  // Back through pinned memory too (8 MB for a 1024² image), then into the result on the host's threads.
  const size_t out_floats = size_t(tokens * out);
  float* const back = static_cast<float*>(pinned_out_.ensure(out_floats * 4, "an image's embeddings"));
  TERN_CUDA(cudaMemcpyAsync(back, out_, out_floats * 4, cudaMemcpyDeviceToHost, stream_));
  ImageEmbeddings e;
  e.grid = g;
  e.tokens = tokens;
  e.values.resize(out_floats);
  TERN_CUDA(cudaStreamSynchronize(stream_));
  thread_pool_global().parallel_for(int64_t(out_floats), int64_t(1) << 18, [&](int64_t begin, int64_t end) {
    std::memcpy(e.values.data() + begin, back + begin, size_t(end - begin) * 4);
  });
  return e;
}

// ---- CudaRunner's part -----------------------------------------------------------------------------------------

// A tower the GPU encoder cannot take (a shape its kernels refuse: tern::Error, not a device fault) turns images off
// and leaves the language model serving text; images_unavailable() then says why. A device fault still stops the
// runner.
void CudaRunner::build_vision_plan(const VisionWeights& w) {
  try {
    vision_ = std::make_unique<VisionPlan>(w, stream_);
  } catch (const InternalError&) {
    throw;
  } catch (const Error& e) {
    vision_.reset();
    vision_error_ = e.what();
    std::fprintf(stderr, "tern: images are off: the GPU vision encoder cannot take this model's vision tower (%s)\n",
                 e.what());
  }
}

// Works whenever the weights hold the vision tower, whatever images_unavailable() says of the rest of the image path
// (forward_images), so that the encoder can be used and tested on its own.
ImageEmbeddings CudaRunner::encode_image(const ImagePixels& pixels) {
  if (!vision_) throw Error(images_unavailable());
  return vision_->encode(pixels);
}

int64_t CudaRunner::image_memory_bytes(int64_t max_patches) const {
  return vision_ ? vision_->scratch_bytes_for(max_patches) : 0;
}

int64_t CudaRunner::reserve_image_memory(int64_t max_patches) {
  if (!vision_) return 0;
  TERN_CHECK(max_patches > 0, "reserve_image_memory: ", max_patches, " patches");
  vision_->reserve(max_patches);
  return vision_->scratch_bytes();
}

void CudaRunner::attach_synthetic_vision(const VisionConfig& config, uint64_t seed) {
  vision_ = std::make_unique<VisionPlan>(config, seed, stream_);
}

}  // namespace tern::cuda
