#include "server/serving/prompt_images.h"

#include <cctype>
#include <chrono>

#include "core/check.h"
#include "engine/image_prompt.h"
#include "server/http/respond.h"
#include "server/serving/image_fetch.h"
#include "server/serving/server_state.h"
#include "vision/image_decode.h"

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
    if (im.url.empty() || !im.bytes.empty()) continue;  // inline, or a URL already fetched
    if (!state.options.allow_image_urls)
      return image_error(im, "'" + im.param + "' is an http(s) URL: this server does not fetch images on a client's "
                             "behalf (tern serve --allow-image-urls would allow it); send the image inline as a "
                             "data: URL (data:image/png;base64,...).");
    return image_error(im, "'" + im.param + "' is an http(s) URL that was not fetched.");  // request_images_fetch's
  }
  return std::nullopt;
}

namespace {

// A URL as an error message quotes it: long ones (a signed link) cut short.
std::string quoted_url(const std::string& url) {
  constexpr size_t kShown = 160;
  return "'" + (url.size() <= kShown ? url : url.substr(0, kShown) + "...") + "'";
}

// The fetched bytes that cannot be an image: no known image format's first bytes and a Content-Type that does not
// claim one (an HTML error page served with 200). Bytes that claim to be an image go to the decoder, which says
// what is wrong with them exactly as for a data: URL.
std::optional<std::string> not_an_image(const ImageFetchResult& fetched) {
  const auto* data = reinterpret_cast<const uint8_t*>(fetched.bytes.data());
  if (image_sniff_format({data, fetched.bytes.size()})) return std::nullopt;
  std::string type = fetched.content_type.substr(0, fetched.content_type.find(';'));
  for (char& c : type) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (type.rfind("image/", 0) == 0) return std::nullopt;
  return "what it answered is not an image (Content-Type '" + (type.empty() ? "none" : type) + "', " +
         std::to_string(fetched.bytes.size()) + " bytes)";
}

}  // namespace

std::optional<ApiError> request_images_fetch(const ServerState& state, std::vector<RequestImage>& images) {
  if (images.empty() || !state.model.images.unavailable.empty() || !state.options.allow_image_urls)
    return request_images_refused(state, images);
  ImageFetchLimits limits;  // one deadline for all the request's URLs: ten images take no longer than one may
  limits.timeout_s = state.options.image_url_timeout_s;
  limits.deadline = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(limits.timeout_s));
  limits.max_bytes = state.options.image_url_max_bytes;
  limits.allowed = state.options.image_url_allow;
  const auto start = std::chrono::steady_clock::now();
  int fetched_count = 0;
  for (RequestImage& im : images) {
    if (im.url.empty() || !im.bytes.empty()) continue;
    ImageFetchResult fetched = image_url_fetch(im.url, limits);
    ++fetched_count;
    // The request log line says how long the request spent fetching (its latency is not the engine's).
    request_log().fields["image_urls"] = fetched_count;
    request_log().fields["image_fetch_ms"] =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    std::optional<std::string> why = fetched.error.empty() ? not_an_image(fetched) : fetched.error;
    if (why) return image_error(im, "'" + im.param + "' could not be fetched from " + quoted_url(im.url) + ": " +
                                        *why + ".");
    im.bytes = std::move(fetched.bytes);
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
