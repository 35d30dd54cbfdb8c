#include "engine/prompt_image.h"

#include <cstring>

#include "core/check.h"

namespace tern {

uint64_t image_pixels_hash(const ImagePixels& pixels) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t word) { h = (h ^ word) * 1099511628211ull; };
  mix(uint64_t(pixels.grid.t));
  mix(uint64_t(pixels.grid.h));
  mix(uint64_t(pixels.grid.w));
  mix(uint64_t(pixels.patch_dim));
  const size_t n = pixels.values.size();
  size_t i = 0;
  for (; i + 2 <= n; i += 2) {  // two floats a word
    uint64_t word = 0;
    std::memcpy(&word, pixels.values.data() + i, sizeof word);
    mix(word);
  }
  if (i < n) {
    uint32_t last = 0;
    std::memcpy(&last, pixels.values.data() + i, sizeof last);
    mix(last);
  }
  return h;
}

PromptImage prompt_image_make(std::shared_ptr<const ImagePixels> pixels, int64_t offset, int merge) {
  TERN_CHECK(pixels != nullptr, "an image without pixels");
  PromptImage im;
  im.offset = offset;
  im.tokens = mrope_grid_tokens(pixels->grid, merge);
  im.hash = image_pixels_hash(*pixels);
  im.pixels = std::move(pixels);
  return im;
}

void prompt_images_check(std::span<const int32_t> prompt, std::span<const PromptImage> images, int32_t image_token_id,
                         int merge) {
  const int64_t n = int64_t(prompt.size());
  int64_t end = 0;  // where the previous image's tokens ended
  for (size_t i = 0; i < images.size(); ++i) {
    const PromptImage& im = images[i];
    TERN_CHECK(im.pixels != nullptr, "image ", i, " has no pixels");
    const MropeGrid& g = im.pixels->grid;
    TERN_CHECK(im.tokens == mrope_grid_tokens(g, merge), "image ", i, " has ", im.tokens, " tokens but its grid (",
               g.t, ", ", g.h, ", ", g.w, ") makes ", mrope_grid_tokens(g, merge));
    TERN_CHECK(int64_t(im.pixels->values.size()) == g.t * g.h * g.w * im.pixels->patch_dim, "image ", i, " has ",
               im.pixels->values.size(), " pixel values for its grid (", g.t, ", ", g.h, ", ", g.w, ") of patches of ",
               im.pixels->patch_dim);
    TERN_CHECK(im.offset >= end && im.offset + im.tokens <= n, "image ", i, "'s tokens [", im.offset, ", ",
               im.offset + im.tokens, ") are not inside the prompt of ", n, " tokens after the previous image's");
    for (int64_t p = im.offset; p < im.offset + im.tokens; ++p)
      TERN_CHECK(prompt[size_t(p)] == image_token_id, "image ", i, "'s token at prompt position ", p, " is ",
                 prompt[size_t(p)], ", not the image token ", image_token_id);
    end = im.offset + im.tokens;
  }
}

}  // namespace tern
