// The one internal weight layout every backend reads. Loaders (HF BF16, MLX 4/8-bit, the demo model) turn their
// source into this; the forward pass never branches on the checkpoint format.
//
// Conventions:
//   * Matrices are [rows = out, cols = in]; y = x · Wᵀ.
//   * Norm multipliers are stored as the final fp32 multiplier: HF's zero-centred norms become (1 + w) at load,
//     MLX's are taken as stored (already shifted); linear_attn.norm is never shifted.
//   * Stacked expert matrices carry a leading expert axis: expert e is Matrix::expert(e).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"

namespace tern {

enum class WeightFormat : uint8_t {
  f32,      // float [rows, cols]
  bf16,     // bf16 bits [rows, cols]
  affine4,  // MLX affine 4-bit: uint32 [rows, cols/8] (LSB-first nibbles) + bf16 scales/biases [rows, cols/group]
  affine8,  // MLX affine 8-bit: uint32 [rows, cols/4] (LSB-first bytes)   + bf16 scales/biases [rows, cols/group]
};

const char* weight_format_name(WeightFormat f);
int weight_format_bits(WeightFormat f);  // 32, 16, 4, 8

// A (possibly stacked) weight matrix. Non-owning: the pointers live in ModelWeights' storage (mmap or heap).
struct Matrix {
  WeightFormat format = WeightFormat::f32;
  int64_t experts = 1;      // leading axis; 1 for a plain matrix
  int64_t rows = 0;         // out
  int64_t cols = 0;         // in
  int group_size = 64;      // affine only
  const void* data = nullptr;          // see WeightFormat
  const uint16_t* scales = nullptr;    // bf16 [experts, rows, cols/group_size], affine only
  const uint16_t* biases = nullptr;    // bf16 [experts, rows, cols/group_size], affine only
  // Distance between consecutive experts, in elements of data's storage type (float, uint16 or uint32 words) and
  // of scales/biases; 0 means densely packed (rows * row_words). Lets HF's fused gate_up be split without a copy.
  int64_t expert_stride_data = 0;
  int64_t expert_stride_groups = 0;

  bool empty() const { return data == nullptr; }
  bool quantized() const { return format == WeightFormat::affine4 || format == WeightFormat::affine8; }
  int64_t groups_per_row() const { return quantized() ? cols / group_size : 0; }
  // Storage elements per row: cols (f32/bf16) or uint32 words (affine).
  int64_t row_words() const;
  int64_t data_stride() const { return expert_stride_data ? expert_stride_data : rows * row_words(); }
  int64_t group_stride() const { return expert_stride_groups ? expert_stride_groups : rows * groups_per_row(); }
  Matrix expert(int64_t e) const;  // one expert as a plain [rows, cols] matrix
  // Bytes this matrix occupies (data + scales + biases), for inspect and the roofline.
  int64_t bytes() const;
};

// Dequantises row r of a plain (non-stacked) matrix into out[cols] (fp32). The reference for every kernel.
void matrix_row_to_f32(const Matrix& m, int64_t r, float* out);

struct LayerWeights {
  LayerType type = LayerType::linear_attention;
  std::vector<float> input_norm;       // [D] multiplier
  std::vector<float> post_attn_norm;   // [D] multiplier

  // ---- Gated DeltaNet (linear_attention) ----
  Matrix in_proj_qkv;                  // [C = 2*Hk*dk + Hv*dv, D]
  Matrix in_proj_z;                    // [Hv*dv, D]
  Matrix in_proj_b;                    // [Hv, D]
  Matrix in_proj_a;                    // [Hv, D]
  std::vector<float> conv1d;           // [C, Ck]; tap Ck-1 multiplies the current token
  std::vector<float> A_log;            // [Hv]
  std::vector<float> dt_bias;          // [Hv]
  std::vector<float> gdn_norm;         // [dv], used as is (never shifted)
  Matrix out_proj;                     // [D, Hv*dv]

  // ---- gated attention (full_attention) ----
  Matrix q_proj;                       // [Hq*2*dh, D]; per head [query dh | gate dh]
  Matrix k_proj;                       // [Hkv*dh, D]
  Matrix v_proj;                       // [Hkv*dh, D]
  Matrix o_proj;                       // [D, Hq*dh]
  std::vector<float> q_norm;           // [dh] multiplier
  std::vector<float> k_norm;           // [dh] multiplier

  // ---- sparse MoE (every layer) ----
  Matrix router;                       // [E, D]
  Matrix expert_gate;                  // [E][F, D]
  Matrix expert_up;                    // [E][F, D]
  Matrix expert_down;                  // [E][D, F]
  Matrix shared_gate;                  // [Fs, D]
  Matrix shared_up;                    // [Fs, D]
  Matrix shared_down;                  // [D, Fs]
  Matrix shared_expert_gate;           // [1, D]
};

// The multi-token-prediction draft head (HF `mtp.*`, docs/model.md §2.8): from the main model's hidden h_t after
// the final norm and the embedding of token t+1, x = fc([norm_e(embed(x_{t+1})) ; norm_h(h_t)]), one full-attention
// decoder layer over x at position t (its own KV cache), then `norm` and the shared LM head: logits for token t+2.
struct MtpWeights {
  std::vector<float> pre_fc_norm_embedding;  // [D] multiplier
  std::vector<float> pre_fc_norm_hidden;     // [D] multiplier
  Matrix fc;                                 // [D, 2D]; columns [embedding (D) | hidden (D)]
  LayerWeights layer;                        // type full_attention
  std::vector<float> norm;                   // [D] multiplier
};

// Backing memory for weights: mmap'd files and heap buffers created by load-time transforms.
struct WeightStorage {
  virtual ~WeightStorage() = default;
};

struct VisionWeights;  // model/vision_weights.h

struct ModelWeights {
  Config config;
  Matrix embed;                        // [V, D]
  Matrix lm_head;                      // [V, D]
  std::vector<float> final_norm;       // [D] multiplier
  std::vector<LayerWeights> layers;    // [L]
  std::vector<std::shared_ptr<WeightStorage>> storage;  // keeps data alive
  std::string source_layout;           // "hf", "mlx", "demo"
  int64_t vocab_real = 0;              // ids >= vocab_real are padding (masked); from the tokenizer, else V
  // The MTP draft head when the checkpoint (or --draft-weights) holds it; otherwise mtp_absent says why, in words.
  std::optional<MtpWeights> mtp;
  std::string mtp_absent;
  std::string mtp_source;              // where mtp came from: the model folder or the --draft-weights file
  // The vision encoder, when config.json has a vision_config and the checkpoint its tensors (model.visual.* or
  // vision_tower.*); null for text-only checkpoints: images are unavailable. Not part of all_matrices().
  std::shared_ptr<const VisionWeights> vision;
  bool has_vision() const { return vision != nullptr; }

  // Every matrix of the model with its name (for inspect, upload, tests).
  std::vector<std::pair<std::string, const Matrix*>> all_matrices() const;
  int64_t total_bytes() const;
};

}  // namespace tern
