// What a forward call's image tokens change in the CPU forward (ModelRunner::forward_images): their embeddings (the
// vision encoder's rows in place of the token ids') and the attention layers' rotary angles (interleaved M-RoPE of
// the 3-axis positions, mrope_chunk_positions).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/config.h"
#include "model/image_input.h"

namespace tern::cpu {

// Overwrites the rows of x [T, D] that the spans cover with their images' rows (spans checked by image_spans_check).
void image_embeddings_insert(std::span<const ImageSpan> spans, int64_t D, float* x);

struct ImageTokenRope {
  std::vector<float> angles;  // [T, rot/2]: what rope_apply_angles takes for every attention layer
  int64_t delta_after = 0;    // the session's M-RoPE delta once the call has run
};
// The call's T tokens at cache positions pos0.. of a session with M-RoPE delta `delta`. Throws tern::Error when the
// config has no vision_config (no merge size) or an M-RoPE layout other than the interleaved one of Qwen3.5/3.6.
ImageTokenRope image_token_rope(const Config& c, int64_t pos0, int64_t delta, int64_t T,
                                std::span<const ImageSpan> spans);

}  // namespace tern::cpu
