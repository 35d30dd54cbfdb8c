// libFuzzer target over the safetensors header parser: any input must parse or throw tern::Error, never crash,
// hang or read outside the buffer (built with -fsanitize=fuzzer,address; run by tests/py/test_checkpoint.py).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/check.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Copy into an exactly-sized heap buffer so that ASan sees any read past the end.
  std::vector<uint8_t> buf(data, data + size);
  try {
    const tern::SafetensorsHeader h = tern::safetensors_parse(buf.data(), buf.size(), "fuzz.safetensors");
    // Touch every tensor's bytes: valid offsets must stay inside the buffer.
    unsigned sum = 0;
    for (const tern::TensorInfo& t : h.tensors)
      for (uint64_t i = t.begin; i < t.end && i < t.begin + 64; ++i) sum += buf[h.data_offset + i];
    (void)sum;
  } catch (const tern::Error&) {
  }
  return 0;
}
