// An image in a generation request's prompt (GenerationRequest::images): where its <|image_pad|> tokens are, what the
// vision encoder reads (the processor's pixels; GenerationRun encodes it when the prefill reaches it), and the hash
// of its pixels that the prefix cache keys it by (two images of one size make the same tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/image_input.h"

namespace tern {

struct PromptImage {
  int64_t offset = 0;   // prompt index of its first <|image_pad|> token
  int64_t tokens = 0;   // its <|image_pad|> tokens: mrope_grid_tokens(pixels->grid)
  uint64_t hash = 0;    // image_pixels_hash(*pixels)
  std::shared_ptr<const ImagePixels> pixels;
};

// A 64-bit hash of the grid and the pixel values' bytes (FNV-1a over 64-bit words): what the model sees of an image.
uint64_t image_pixels_hash(const ImagePixels& pixels);

// A PromptImage for `pixels` at `offset` (tokens and hash filled in). Throws tern::Error when the grid is not made of
// whole merge blocks.
PromptImage prompt_image_make(std::shared_ptr<const ImagePixels> pixels, int64_t offset, int merge);

// The request's images against its prompt: in order, disjoint, inside the prompt, each run all <|image_pad|>
// (image_token_id) and as long as its grid makes, pixels matching the grid. Throws tern::Error naming the image.
void prompt_images_check(std::span<const int32_t> prompt, std::span<const PromptImage> images, int32_t image_token_id,
                         int merge);

}  // namespace tern
