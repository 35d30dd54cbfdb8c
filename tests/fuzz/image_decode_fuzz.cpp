// libFuzzer target over the image decoders and the processor: any input must decode or throw ImageError, never
// crash, hang, leak or read outside the buffer (built with -fsanitize=fuzzer,address,undefined; run for a bounded
// time by tests/py/test_image_processor.py). The limits are small so that each input stays cheap.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "vision/image_decode.h"
#include "vision/image_processor.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Copy into an exactly-sized heap buffer so that ASan sees any read past the end.
  const std::vector<uint8_t> buf(data, data + size);
  tern::ImageLimits limits;
  limits.max_side = 4096;
  limits.max_pixels = 1 << 20;
  tern::ImageProcessorConfig config;
  config.min_pixels = 1024;
  config.max_pixels = 16384;
  try {
    const tern::DecodedImage d = tern::image_decode(buf, limits, "fuzz");
    const tern::ImagePatches p = tern::image_process(d.image, config, "fuzz");
    float sum = 0;
    for (float v : p.pixel_values) sum += v;
    (void)sum;
  } catch (const tern::Error&) {
  }
  return 0;
}
