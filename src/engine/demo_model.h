// The built-in demo model: Qwen3.6's real architecture (Gated DeltaNet + gated attention layers, routed experts and
// a shared expert, the MTP draft head) at a small size, with deterministic random weights built in memory at
// start-up, in MLX affine 4-bit (router and shared-expert gate 8-bit, as MLX quantises them). Its output is
// meaningless text: the weights are random. It lets every command run on a fresh machine with no download.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/weights.h"

namespace tern {

struct DemoModelOptions {
  int64_t vocab_real = 151669;  // the shipped tokenizer's size; rows are padded to a multiple of 64
  uint64_t seed = 0x7e4e;       // same seed -> same weights, bit for bit
  int layers = 4;               // [lin, lin, lin, full] repeated
  std::string eos_json = "[151645, 151643]";  // <|im_end|>, <|endoftext|> of the Qwen3 tokenizer
  bool full_size = false;       // the real model's widths (D 2048, 256 experts, ...): the synthetic checkpoint
                                // of `tern quantize --synthetic` (with layers = 40, vocab_real = 248077)
  bool mtp = true;               // also the MTP draft head (ModelWeights::mtp), drawn after every other tensor so
                                // that the rest is the same bit for bit without it
  bool vision = true;           // a small vision encoder too (demo_vision.h), when the vocabulary holds the image
                                // tokens (vocab_real > 151656) and not full_size
};

// True when demo_model_build gives the model its vision encoder.
bool demo_has_vision(const DemoModelOptions& options);

// The config.json text of the demo model: qwen3_5_moe_text at a small size, or, with its vision encoder, a
// qwen3_5_moe config holding it as text_config beside the vision_config and the image token ids.
std::string demo_config_json(const DemoModelOptions& options);
// Its generation_config.json text.
std::string demo_generation_config_json(const DemoModelOptions& options);

// Builds the weights (a fraction of a second on one core; parallel over the global thread pool).
std::shared_ptr<const ModelWeights> demo_model_build(const DemoModelOptions& options = {});

}  // namespace tern
