// A chat request's images turned into its prompt's image tokens, the same for every API: once the chat template's
// prompt is tokenized, each image is decoded (engine/image_prompt.h, src/vision) and its one <|image_pad|> expanded
// to its token count; for a generation the pixels are processed too (GenerationRequest::images), for a count
// (/tokenize, Anthropic's count_tokens) they are not. Every refusal is a 400 naming the image (its field in the body)
// and why: the model takes no images, a remote URL (refused, or with --allow-image-urls one that could not be
// fetched), a file that does not decode (corrupt, truncated, unsupported format, too many pixels), an aspect ratio
// over 200:1.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/prompt_image.h"
#include "server/http/errors.h"
#include "server/serving/chat_request.h"

namespace tern::server {

struct ServerState;

// The refusals known before the prompt is rendered: the model takes no images, or an image is an http(s) URL not
// fetched (without --allow-image-urls the server fetches none). nullopt when none.
std::optional<ApiError> request_images_refused(const ServerState& state, const std::vector<RequestImage>& images);

// request_images_refused, and with --allow-image-urls each http(s) URL image downloaded into its bytes first
// (serving/image_fetch.h: within --image-url-timeout for them all, at most 20 MiB each, 2xx answers only), on the
// calling HTTP handler's thread, before the request is queued. From there a fetched image is read as a data: URL's
// bytes would be. nullopt when all are fetched; else the 400 naming the first image that failed and why.
std::optional<ApiError> request_images_fetch(const ServerState& state, std::vector<RequestImage>& images);

// Expands `prompt`'s <|image_pad|> tokens for `images` (nothing without images). With `out`, also processes each
// image into *out (offsets in the expanded prompt); a prompt that the images make too long for the context is
// refused before any pixel is processed, unless `may_truncate` (truncate_prompt_tokens will cut it). nullopt when
// done; else the 400.
std::optional<ApiError> prompt_images_attach(const ServerState& state, const std::vector<RequestImage>& images,
                                             std::vector<int32_t>& prompt, std::vector<PromptImage>* out,
                                             bool may_truncate = false);

// truncate_prompt_tokens with images: keeps the prompt's last `keep` tokens (none: unchanged), the images before
// the cut dropped and the others' offsets moved. A cut through an image is a 400 (param truncate_prompt_tokens).
std::optional<ApiError> truncate_prompt_images(std::vector<int32_t>& prompt, std::vector<PromptImage>& images,
                                               const std::optional<int64_t>& keep);

}  // namespace tern::server
