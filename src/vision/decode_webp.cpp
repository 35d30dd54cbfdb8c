// WebP through libwebp, as Pillow decodes it (its WebPAnimDecoder, straight RGBA): a still image decoded whole,
// an animation's first frame on its canvas (transparent where the frame does not reach). The file's ALPHA flag
// decides, as Pillow's mode does, whether alpha is composited onto white ("RGBA") or ignored ("RGBX").
// The EXIF and XMP chunks are collected for the orientation. libwebp reports errors by return codes.
#include <webp/decode.h>
#include <webp/demux.h>

#include <memory>

#include "vision/image_decoders.h"

namespace tern::vision_detail {
namespace {

[[noreturn]] void webp_fail(VP8StatusCode status, const char* stage) {
  switch (status) {
    case VP8_STATUS_NOT_ENOUGH_DATA:
      throw ImageError(ImageErrorKind::truncated, std::string("the WebP data ends early (") + stage + ")");
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      throw ImageError(ImageErrorKind::unsupported_format,
                       std::string("the WebP uses a feature libwebp does not support (") + stage + ")");
    case VP8_STATUS_OUT_OF_MEMORY: throw std::bad_alloc();
    default:
      throw ImageError(ImageErrorKind::corrupt, std::string("the WebP is corrupt (") + stage + ": libwebp status " +
                                                    std::to_string(int(status)) + ")");
  }
}

struct DemuxDeleter {
  void operator()(WebPDemuxer* d) const { WebPDemuxDelete(d); }
};
struct AnimDecoderDeleter {
  void operator()(WebPAnimDecoder* d) const { WebPAnimDecoderDelete(d); }
};

std::vector<uint8_t> webp_chunk(WebPDemuxer* demux, const char fourcc[4]) {
  WebPChunkIterator it;
  std::vector<uint8_t> out;
  if (WebPDemuxGetChunk(demux, fourcc, 1, &it)) {
    out.assign(it.chunk.bytes, it.chunk.bytes + it.chunk.size);
    WebPDemuxReleaseChunkIterator(&it);
  }
  return out;
}

void rgba_to_rgb(const uint8_t* in, RgbImage& out, bool use_alpha) {
  const size_t n = size_t(out.width) * size_t(out.height);
  uint8_t* o = out.pixels.data();
  for (size_t i = 0; i < n; ++i, in += 4, o += 3) {
    for (int c = 0; c < 3; ++c) o[c] = use_alpha ? composite_on_white(in[c], in[3]) : in[c];
  }
}

}  // namespace

RgbImage decode_webp(std::span<const uint8_t> bytes, const ImageLimits& limits, ImageMetadata& meta) {
  WebPBitstreamFeatures features;
  const VP8StatusCode status = WebPGetFeatures(bytes.data(), bytes.size(), &features);
  if (status != VP8_STATUS_OK) webp_fail(status, "header");
  check_image_size(features.width, features.height, limits);

  const WebPData data = {bytes.data(), bytes.size()};
  WebPDemuxState state = WEBP_DEMUX_PARSE_ERROR;
  std::unique_ptr<WebPDemuxer, DemuxDeleter> demux(WebPDemuxPartial(&data, &state));
  if (!demux || state != WEBP_DEMUX_DONE)
    webp_fail(state == WEBP_DEMUX_PARSE_ERROR || !demux ? VP8_STATUS_BITSTREAM_ERROR : VP8_STATUS_NOT_ENOUGH_DATA,
              "container");
  const int width = int(WebPDemuxGetI(demux.get(), WEBP_FF_CANVAS_WIDTH));
  const int height = int(WebPDemuxGetI(demux.get(), WEBP_FF_CANVAS_HEIGHT));
  const uint32_t flags = WebPDemuxGetI(demux.get(), WEBP_FF_FORMAT_FLAGS);
  check_image_size(width, height, limits, "canvas size");
  meta.exif = webp_chunk(demux.get(), "EXIF");
  meta.xmp = webp_chunk(demux.get(), "XMP ");
  const bool alpha = flags & ALPHA_FLAG;

  RgbImage out(width, height);
  if (flags & ANIMATION_FLAG) {
    WebPAnimDecoderOptions options;
    if (!WebPAnimDecoderOptionsInit(&options)) throw ImageError(ImageErrorKind::corrupt, "libwebp version mismatch");
    options.color_mode = MODE_RGBA;
    options.use_threads = 0;
    std::unique_ptr<WebPAnimDecoder, AnimDecoderDeleter> decoder(WebPAnimDecoderNew(&data, &options));
    if (!decoder) webp_fail(VP8_STATUS_BITSTREAM_ERROR, "animation");
    uint8_t* canvas = nullptr;
    int timestamp = 0;
    if (!WebPAnimDecoderGetNext(decoder.get(), &canvas, &timestamp))
      webp_fail(VP8_STATUS_BITSTREAM_ERROR, "first frame");
    rgba_to_rgb(canvas, out, alpha);
    return out;
  }

  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config)) throw ImageError(ImageErrorKind::corrupt, "libwebp version mismatch");
  std::vector<uint8_t> rgba;
  config.output.is_external_memory = 1;
  if (alpha) {
    rgba.resize(size_t(width) * size_t(height) * 4);
    config.output.colorspace = MODE_RGBA;
    config.output.u.RGBA = {rgba.data(), width * 4, rgba.size()};
  } else {
    config.output.colorspace = MODE_RGB;
    config.output.u.RGBA = {out.pixels.data(), width * 3, out.pixels.size()};
  }
  const VP8StatusCode decoded = WebPDecode(bytes.data(), bytes.size(), &config);
  WebPFreeDecBuffer(&config.output);
  if (decoded != VP8_STATUS_OK) webp_fail(decoded, "image data");
  if (alpha) rgba_to_rgb(rgba.data(), out, true);
  return out;
}

}  // namespace tern::vision_detail
