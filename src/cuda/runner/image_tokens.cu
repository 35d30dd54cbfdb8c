// Images in the language model on the CUDA runner (docs/architecture.md, "Images in the language model"), as the CPU
// runner takes them (cpu/image_tokens): forward_images is forward() where each chunk's image tokens take their rows
// from the images instead of the embedding table, and every token of the call rotates at its 3-axis M-RoPE position
// (mrope_chunk_positions) in the attention layers; the session's rope_delta then moves as the images move it. Calls
// without images are forward() itself, and every other step rotates at cache position + the session's delta
// (CudaSession::d_rope_delta, read on the device so that captured graphs follow it).
#include <algorithm>
#include <climits>
#include <vector>

#include "core/check.h"
#include "cuda/runner/cuda_runner_impl.cuh"
#include "model/image_input.h"

namespace tern::cuda {

// Images run when the weights hold a vision tower (its encoder is vision_plan.cu's, built with the runner).
std::string CudaRunner::images_unavailable() const {
  if (vision_) return "";
  if (!vision_error_.empty())
    return "images are not available on this server: the GPU vision encoder cannot take this model's vision tower (" +
           vision_error_ + ")";
  return "this model has no vision encoder: its checkpoint holds no vision weights, so it reads text only";
}

void CudaRunner::forward_images(Session& session, std::span<const int32_t> tokens, std::span<const ImageSpan> images,
                                bool all_logits, std::vector<float>& logits) {
  if (images.empty()) {
    forward(session, tokens, all_logits, logits);
    return;
  }
  CudaSession& s = own(session);
  const std::string why = images_unavailable();
  TERN_CHECK(why.empty(), why);
  const Config& c = w_->config;
  TERN_CHECK(c.vision.has_value(), "image tokens for a model without a vision_config");
  TERN_CHECK(c.mrope_interleaved && c.mrope_section.size() == 3,
             "image tokens need the interleaved M-RoPE of Qwen3.5/3.6 (rope_parameters.mrope_interleaved, three "
             "mrope_section entries)");
  // Everything is checked before anything runs: a refused call consumes nothing.
  TERN_CHECK(!s.holds_part_way(), "image tokens for a session that holds a prompt chunk part way");
  check_tokens(s, tokens);
  const int merge = c.vision->spatial_merge_size;
  const int64_t n = int64_t(tokens.size());
  image_spans_check(images, n, c.hidden_size, merge);
  const ChunkPositions p = mrope_chunk_positions(s.pos, s.rope_delta(), n, images, merge);
  std::vector<int> axes(size_t(3 * n));  // [n, 3] (t, h, w) per token
  for (int64_t t = 0; t < n; ++t)
    for (int a = 0; a < 3; ++a) {
      const int64_t v = p.axes[size_t(a)][size_t(t)];
      TERN_CHECK(v >= 0 && v <= INT_MAX, "M-RoPE position ", v, " of token ", t, " out of range");
      axes[size_t(3 * t + a)] = int(v);
    }
  DeviceArena axes_arena(axes.size() * sizeof(int), "M-RoPE positions");  // freed after forward's stream sync
  int* axes_dev = axes_arena.take_n<int>(axes.size());
  TERN_CUDA(cudaMemcpyAsync(axes_dev, axes.data(), axes.size() * sizeof(int), cudaMemcpyHostToDevice, stream_));
  const ImageCall call{.spans = images, .pos0 = s.pos, .axes = axes_dev};
  image_call_ = &call;
  try {
    forward(s, tokens, all_logits, logits);
  } catch (...) {
    image_call_ = nullptr;
    throw;
  }
  image_call_ = nullptr;
  s.set_rope_delta(p.delta_after, stream_);
  TERN_CUDA(cudaStreamSynchronize(stream_));
}

// The running chunk covers the call's tokens [c0, c0 + T): each span's part of it, rows [lo, hi) of the call.
void CudaRunner::insert_image_rows(const CudaSession& s, int64_t T) {
  if (!image_call_) return;
  const int64_t D = w_->config.hidden_size, c0 = s.pos - image_call_->pos0;
  for (const ImageSpan& span : image_call_->spans) {
    const int64_t lo = std::max(span.at, c0), hi = std::min(span.at + span.count, c0 + T);
    if (lo >= hi) continue;
    const float* rows = span.image->values.data() + (span.first + lo - span.at) * D;
    TERN_CUDA(cudaMemcpyAsync(hidden_ + (lo - c0) * D, rows, size_t((hi - lo) * D) * sizeof(float),
                              cudaMemcpyHostToDevice, stream_));
  }
}

AttnRope CudaRunner::attn_rope(const CudaSession& s) const {
  AttnRope rope;
  rope.delta = s.d_rope_delta;
  if (!image_call_) return rope;
  const std::vector<int>& section = w_->config.mrope_section;
  rope.axes = image_call_->axes + 3 * (s.pos - image_call_->pos0);  // the running chunk's first token
  rope.section[0] = section[0];
  rope.section[1] = section[1];
  rope.section[2] = section[2];
  return rope;
}

}  // namespace tern::cuda
