// tern_image_probe: runs image files through src/vision for tests/py/test_image_processor.py, which compares the
// results with transformers' processor (a test tool, not part of tern).
//
//   tern_image_probe [--min-pixels N] [--max-pixels N] [--max-side N] [--max-image-pixels N] [--resize W H]
//                    OUT_DIR FILE...
//
// For the i-th FILE (from 0): one JSON line on stdout, {"file", "format", "orientation", "decoded": [h, w],
// "resized": [h, w], "grid_thw": [1, gh, gw], "tokens"} or {"file", "error", "kind"}; and in OUT_DIR i.decoded.npy
// and i.resized.npy (int32 [h, w, 3]), i.pixels.npy (float32 [patches, patch_dim]). With --resize, the decoded
// image is resized to W x H instead of the processor's size, and no pixels.npy is written.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/npy.h"
#include "vision/image_decode.h"
#include "vision/image_processor.h"
#include "vision/image_resize.h"

namespace {

const char* kind_name(tern::ImageErrorKind k) {
  switch (k) {
    case tern::ImageErrorKind::empty: return "empty";
    case tern::ImageErrorKind::unsupported_format: return "unsupported_format";
    case tern::ImageErrorKind::corrupt: return "corrupt";
    case tern::ImageErrorKind::truncated: return "truncated";
    case tern::ImageErrorKind::too_large: return "too_large";
    case tern::ImageErrorKind::aspect_ratio: return "aspect_ratio";
  }
  return "?";
}

void write_image(const std::filesystem::path& path, const tern::RgbImage& image) {
  const std::vector<int32_t> values(image.pixels.begin(), image.pixels.end());
  tern::npy_write_i32(path, values.data(), {image.height, image.width, 3});
}

int usage() {
  std::fprintf(stderr,
               "usage: tern_image_probe [--min-pixels N] [--max-pixels N] [--max-side N] [--max-image-pixels N] "
               "OUT_DIR FILE...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  tern::ImageProcessorConfig config;
  tern::ImageLimits limits;
  int resize_width = 0, resize_height = 0;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--resize") {
      if (i + 2 >= argc) return usage();
      resize_width = std::atoi(argv[++i]);
      resize_height = std::atoi(argv[++i]);
    } else if (a.rfind("--", 0) == 0) {
      if (i + 1 >= argc) return usage();
      const long long v = std::atoll(argv[++i]);
      if (a == "--min-pixels") {
        config.min_pixels = v;
      } else if (a == "--max-pixels") {
        config.max_pixels = v;
      } else if (a == "--max-side") {
        limits.max_side = int(v);
      } else if (a == "--max-image-pixels") {
        limits.max_pixels = v;
      } else {
        return usage();
      }
    } else {
      args.push_back(a);
    }
  }
  if (args.size() < 2) return usage();
  const std::filesystem::path out_dir = args[0];
  for (size_t i = 1; i < args.size(); ++i) {
    nlohmann::json line = {{"file", args[i]}};
    std::ifstream f(args[i], std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const std::string stem = std::to_string(i - 1);
    try {
      const tern::DecodedImage d = tern::image_decode(bytes, limits, "image " + stem);
      line["format"] = tern::image_format_name(d.format);
      line["orientation"] = d.orientation;
      line["decoded"] = {d.image.height, d.image.width};
      write_image(out_dir / (stem + ".decoded.npy"), d.image);
      if (resize_width > 0) {
        write_image(out_dir / (stem + ".resized.npy"),
                    tern::image_resize_bicubic(d.image, resize_width, resize_height));
        std::cout << line.dump() << "\n";
        continue;
      }
      const tern::RgbImage resized = tern::image_process_resized(d.image, config, "image " + stem);
      const tern::ImagePatches p = tern::image_process(d.image, config, "image " + stem);
      write_image(out_dir / (stem + ".resized.npy"), resized);
      tern::npy_write_f32(out_dir / (stem + ".pixels.npy"), p.pixel_values.data(), {p.grid_h * p.grid_w, p.patch_dim});
      line["resized"] = {p.resized_height, p.resized_width};
      line["grid_thw"] = {p.grid_t, p.grid_h, p.grid_w};
      line["tokens"] = p.num_tokens;
      line["token_count"] = tern::image_token_count(d.image.height, d.image.width, config, "image " + stem);
    } catch (const tern::ImageError& e) {
      line["error"] = e.what();
      line["kind"] = kind_name(e.kind());
    } catch (const tern::Error& e) {
      line["error"] = e.what();
      line["kind"] = "error";
    }
    std::cout << line.dump() << "\n";
  }
  return 0;
}
