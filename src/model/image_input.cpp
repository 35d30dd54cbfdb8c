#include "model/image_input.h"

#include <algorithm>

#include "core/check.h"

namespace tern {

std::optional<ImageSpan> image_span_within(int64_t offset, int64_t tokens, int64_t from, int64_t to) {
  const int64_t lo = std::max(offset, from), hi = std::min(offset + tokens, to);
  if (lo >= hi) return std::nullopt;
  return ImageSpan{.image = nullptr, .at = lo - from, .first = lo - offset, .count = hi - lo};
}

void image_spans_check(std::span<const ImageSpan> spans, int64_t T, int64_t D, int merge) {
  int64_t end = 0;  // where the previous span ended
  for (size_t i = 0; i < spans.size(); ++i) {
    const ImageSpan& s = spans[i];
    TERN_CHECK(s.image != nullptr, "image span ", i, " has no image");
    const ImageEmbeddings& im = *s.image;
    TERN_CHECK(im.tokens == mrope_grid_tokens(im.grid, merge), "image span ", i, ": the image holds ", im.tokens,
               " tokens but its grid (", im.grid.t, ", ", im.grid.h, ", ", im.grid.w, ") makes ",
               mrope_grid_tokens(im.grid, merge));
    TERN_CHECK(int64_t(im.values.size()) == im.tokens * D, "image span ", i, ": the image has ", im.values.size(),
               " values for ", im.tokens, " tokens of width ", D);
    TERN_CHECK(s.count > 0 && s.at >= end && s.at + s.count <= T, "image span ", i, " covers tokens [", s.at, ", ",
               s.at + s.count, ") of a call of ", T, " (after ", end, ")");
    TERN_CHECK(s.first >= 0 && s.first + s.count <= im.tokens, "image span ", i, " takes the image's tokens [",
               s.first, ", ", s.first + s.count, ") of ", im.tokens);
    end = s.at + s.count;
  }
}

ChunkPositions mrope_chunk_positions(int64_t pos0, int64_t delta, int64_t T, std::span<const ImageSpan> spans,
                                     int merge) {
  ChunkPositions out;
  for (auto& a : out.axes) a.resize(size_t(T));
  size_t next = 0;  // the next span
  for (int64_t i = 0; i < T;) {
    if (next < spans.size() && spans[next].at == i) {
      const ImageSpan& s = spans[next++];
      const MropeGrid& g = s.image->grid;
      const int64_t start = pos0 + s.at - s.first + delta;  // the image's first token's position as text
      for (int64_t j = 0; j < s.count; ++j) {
        const std::array<int64_t, 3> o = mrope_token_offsets(g, merge, s.first + j);
        for (int a = 0; a < 3; ++a) out.axes[size_t(a)][size_t(i + j)] = start + o[size_t(a)];
      }
      if (s.first + s.count == s.image->tokens) delta += mrope_grid_advance(g, merge) - s.image->tokens;
      i += s.count;
      continue;
    }
    for (auto& a : out.axes) a[size_t(i)] = pos0 + i + delta;
    ++i;
  }
  out.delta_after = delta;
  return out;
}

}  // namespace tern
