// The element type of a runner's KV cache (`--kv-dtype`, CudaRunnerOptions::kv): what one cached value costs and
// how it rounds. The CUDA runner takes all three (docs/architecture.md, "Numerics and the fidelity oracle"); the CPU
// runner keeps its cache in fp32 and takes only the default.
#pragma once

#include <cstdint>
#include <string>

namespace tern {

enum class KvDtype {
  f16,   // IEEE fp16 (11 significant bits; past ±65504 saturates): the CUDA runner's default
  bf16,  // bfloat16 (8 significant bits, fp32's range): TERN_KV_BF16=1
  fp8,   // e4m3fn (4 significant bits, ±448) times an fp32 scale per (token, KV head) row: half the bytes of f16
  i16,   // 16-bit integers times an fp32 scale per row, max|row| / 32767 (a 65534th of the row's largest value): f16's
         // bytes (and a scale a row); the attention's q, K, softmax weights and V then run as fp16 hi + lo (issue 29)
};

// "f16", "bf16", "fp8", "i16": the flag's spelling.
const char* kv_dtype_name(KvDtype t);
// The flag's spelling back; throws tern::Error naming the value otherwise.
KvDtype kv_dtype_parse(const std::string& text);

// Bytes of one cached row, one token's K (or V) of one KV head of `head_dim` values: 2 per value for the 16-bit
// types, 1 per value and the row's fp32 scale for fp8, 2 per value and the row's fp32 scale for i16.
int64_t kv_row_bytes(KvDtype t, int64_t head_dim);
// Bytes of one cached value (1 for fp8, else 2), and whether the rows carry an fp32 scale each (fp8, i16).
// constexpr: the CUDA kernels use them at compile time.
constexpr int64_t kv_value_bytes(KvDtype t) { return t == KvDtype::fp8 ? 1 : 2; }
constexpr bool kv_row_scaled(KvDtype t) { return t == KvDtype::fp8 || t == KvDtype::i16; }

// Bytes per token of context of a model's KV cache: K and V of every attention layer, kv_heads rows each.
inline int64_t kv_token_bytes(KvDtype t, int64_t attention_layers, int64_t kv_heads, int64_t head_dim) {
  return 2 * attention_layers * kv_heads * kv_row_bytes(t, head_dim);
}

}  // namespace tern
