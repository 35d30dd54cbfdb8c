#include "cpu/image_tokens.h"

#include <algorithm>

#include "core/check.h"
#include "cpu/ops_rope.h"

namespace tern::cpu {

void image_embeddings_insert(std::span<const ImageSpan> spans, int64_t D, float* x) {
  for (const ImageSpan& s : spans)
    std::copy_n(s.image->values.data() + s.first * D, size_t(s.count * D), x + s.at * D);
}

ImageTokenRope image_token_rope(const Config& c, int64_t pos0, int64_t delta, int64_t T,
                                std::span<const ImageSpan> spans) {
  TERN_CHECK(c.vision.has_value(), "image tokens for a model without a vision_config");
  TERN_CHECK(c.mrope_interleaved && c.mrope_section.size() == 3,
             "image tokens need the interleaved M-RoPE of Qwen3.5/3.6 (rope_parameters.mrope_interleaved, three "
             "mrope_section entries)");
  const ChunkPositions p = mrope_chunk_positions(pos0, delta, T, spans, c.vision->spatial_merge_size);
  const int rot = c.rotary_dims();
  const int section[3] = {c.mrope_section[0], c.mrope_section[1], c.mrope_section[2]};
  const int64_t* const axes[3] = {p.axes[0].data(), p.axes[1].data(), p.axes[2].data()};
  ImageTokenRope out;
  out.angles.resize(size_t(T * (rot / 2)));
  mrope_angles(axes, T, section, rot, c.rope_theta, out.angles.data());
  out.delta_after = p.delta_after;
  return out;
}

}  // namespace tern::cpu
