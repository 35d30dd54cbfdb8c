// MLX's affine quantiser (byte-exact with mx.quantize) and the writer of MLX-layout checkpoints (tern quantize).
#pragma once

#include <cstdint>
#include <filesystem>

#include "model/weights.h"

namespace tern {

// MLX's affine quantiser, byte-exact with mx.quantize: w [rows, cols] fp32 -> packed uint32 [rows, cols*bits/32]
// (LSB-first), bf16 scales/biases [rows, cols/group]. bits 4 or 8; group_size 32, 64 or 128 dividing cols.
// Per group: scale = max((max - min) / (2^bits - 1), 1e-7), signed towards the edge of larger magnitude; the edge
// value becomes the bias when it rounds to a non-zero level (scale re-derived so the edge maps exactly);
// q = clamp(rint((w - bias) / scale), 0, 2^bits - 1).
void quantize_affine(const float* w, int64_t rows, int64_t cols, int bits, int group_size, uint32_t* packed,
                     uint16_t* scales, uint16_t* biases);

// Writes `weights` as an MLX-layout checkpoint into out_dir (which must not exist or be empty): shards of at most
// max_shard_bytes with model.safetensors.index.json, config.json (text_config, quantization section naming the
// 8-bit modules), and the tokenizer/generation files copied from source_dir. Every matrix must be affine or bf16.
void checkpoint_write_mlx(const ModelWeights& weights, const std::filesystem::path& source_dir,
                          const std::filesystem::path& out_dir, int64_t max_shard_bytes = int64_t(5) << 30,
                          bool progress = true);

// Writes the internal weights as they are (debug and tests: `tern inspect --dump-weights FILE`): each matrix as
// NAME.weight (U32 for affine, BF16 or F32) plus NAME.scales / NAME.biases (BF16) when affine, stacked experts with
// a leading axis; each vector (norm multipliers, conv [C, Ck], A_log, dt_bias) as F32.
void weights_dump(const ModelWeights& weights, const std::filesystem::path& file);

}  // namespace tern
