// Images as the language model takes them (docs/architecture.md, "Images in the language model"): the vision
// encoder's input (ImagePixels, the processor's patches), its output (ImageEmbeddings, one row per <|image_pad|>
// token), where a forward call's image tokens take their rows from (ImageSpan), and the 3-axis M-RoPE positions of a
// forward call's tokens continuing a session (mrope_chunk_positions): transformers' get_rope_index cut into calls.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "model/mrope.h"

namespace tern {

// One image's pixel_values as src/vision's image_process makes them: [grid.t · grid.h · grid.w, patch_dim], the
// patches in the encoder's order (merge blocks in raster order).
struct ImagePixels {
  MropeGrid grid;
  int64_t patch_dim = 0;
  std::vector<float> values;
};

// The vision encoder's output for one image: one row per <|image_pad|> token, in the tokens' order.
struct ImageEmbeddings {
  MropeGrid grid;
  int64_t tokens = 0;         // grid.t · grid.h · grid.w / M²
  std::vector<float> values;  // [tokens, D], D the language model's width
};

// Tokens [at, at + count) of a forward call are the image's tokens [first, first + count): their embeddings are
// the image's rows and their rotary positions the image's 3-axis ones. A prompt chunk may cut an image anywhere.
struct ImageSpan {
  const ImageEmbeddings* image = nullptr;
  int64_t at = 0;
  int64_t first = 0;
  int64_t count = 0;
};

// Where an image whose run of `tokens` tokens starts at token `offset` (of the whole prompt) meets a forward call's
// tokens [from, to): the span of that part (its image left for the caller to set), or nothing when they do not meet.
std::optional<ImageSpan> image_span_within(int64_t offset, int64_t tokens, int64_t from, int64_t to);

// Checks a forward call's spans before anything runs: each inside [0, T) and inside its image, in order and
// disjoint, its image's rows [tokens, D] and tokens its grid's. Throws tern::Error naming the span.
void image_spans_check(std::span<const ImageSpan> spans, int64_t T, int64_t D, int merge);

// The rotary positions of a forward call's T tokens at cache positions pos0.. of a session whose M-RoPE delta is
// `delta` (Session::rope_delta: a text token at cache position p sits at p + delta on every axis). An image token,
// token k of its image, sits at start + mrope_token_offsets(k), start being where the image's first token would sit
// as text; the text after an image's last token continues at start + mrope_grid_advance, so the delta grows by
// advance − tokens. Equal, call after call, to mrope_positions over the whole sequence.
struct ChunkPositions {
  std::array<std::vector<int64_t>, 3> axes;  // [3][T]: t, h, w
  int64_t delta_after = 0;                   // the session's delta once the call has run
};
ChunkPositions mrope_chunk_positions(int64_t pos0, int64_t delta, int64_t T, std::span<const ImageSpan> spans,
                                     int merge);

}  // namespace tern
