#include "server/serving/prompt_images.h"

#include "core/check.h"
#include "engine/image_prompt.h"
#include "server/serving/server_state.h"

namespace tern::server {

namespace {

ApiError image_error(const RequestImage& image, const std::string& message) {
  return api_error_invalid(image.param, message);
}

}  // namespace

std::optional<ApiError> request_images_refused(const ServerState& state, const std::vector<RequestImage>& images) {
  if (images.empty()) return std::nullopt;
  const ImageSettings& settings = state.model.images;
  if (!settings.unavailable.empty())
    return image_error(images[0], "'" + images[0].param + "' is an image, but " + settings.unavailable + ".");
  for (const RequestImage& im : images) {
    if (im.url.empty()) continue;
    if (!state.options.allow_image_urls)
      return image_error(im, "'" + im.param + "' is an http(s) URL: this server does not fetch images on a client's "
                             "behalf (tern serve --allow-image-urls would allow it); send the image inline as a "
                             "data: URL (data:image/png;base64,...).");
    return image_error(im, "'" + im.param + "' is an http(s) URL: remote image URLs are not fetched by this server; "
                           "send the image inline as a data: URL (data:image/png;base64,...).");
  }
  return std::nullopt;
}

std::optional<ApiError> prompt_images_attach(const ServerState& state, const std::vector<RequestImage>& images,
                                             std::vector<int32_t>& prompt, std::vector<PromptImage>* out,
                                             bool may_truncate) {
  if (images.empty()) return std::nullopt;
  if (auto e = request_images_refused(state, images)) return e;
  const ImageSettings& settings = state.model.images;
  std::vector<PreparedImage> prepared;
  std::vector<int64_t> counts;
  for (const RequestImage& im : images) {
    try {
      const auto* data = reinterpret_cast<const uint8_t*>(im.bytes.data());
      prepared.push_back(image_prompt_decode({data, im.bytes.size()}, settings, im.param));
    } catch (const Error& e) {  // ImageError: its message starts with the image's field
      return image_error(im, strip_error_location(e.what()));
    }
    counts.push_back(prepared.back().tokens);
  }
  std::vector<int64_t> offsets;
  try {
    offsets = image_pads_expand(prompt, counts, settings.image_token_id);
  } catch (const Error& e) {
    return image_error(images[0], strip_error_location(e.what()));
  }
  if (!out) return std::nullopt;
  if (!may_truncate && int64_t(prompt.size()) >= state.model.context)  // the pixels would be processed for nothing
    return api_error_context(int64_t(prompt.size()), state.model.context);
  out->clear();
  for (size_t i = 0; i < prepared.size(); ++i) {
    try {
      out->push_back(image_prompt_process(prepared[i], offsets[i], settings));
    } catch (const Error& e) {
      return image_error(images[i], strip_error_location(e.what()));
    }
  }
  return std::nullopt;
}

std::optional<ApiError> truncate_prompt_images(std::vector<int32_t>& prompt, std::vector<PromptImage>& images,
                                               const std::optional<int64_t>& keep) {
  if (!keep || int64_t(prompt.size()) <= *keep) return std::nullopt;
  const int64_t cut = int64_t(prompt.size()) - *keep;  // tokens dropped from the front
  std::vector<PromptImage> kept;
  for (size_t i = 0; i < images.size(); ++i) {
    PromptImage im = images[i];
    if (im.offset + im.tokens <= cut) continue;
    if (im.offset < cut)
      return api_error_invalid("truncate_prompt_tokens", "'truncate_prompt_tokens' (" + std::to_string(*keep) +
                                                             ") would cut image " + std::to_string(i + 1) +
                                                             " of the prompt in two; keep more tokens or fewer images.");
    im.offset -= cut;
    kept.push_back(std::move(im));
  }
  prompt.erase(prompt.begin(), prompt.begin() + cut);
  images = std::move(kept);
  return std::nullopt;
}

}  // namespace tern::server
