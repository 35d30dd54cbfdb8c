// Loading a checkpoint directory into the internal layout (weights.h): layout detection (HF BF16 or MLX), the
// tensor manifest of every layer type, load-time transforms (1 + w norms, conv layout, expert split, quantisation
// of BF16 sources with MLX's algorithm), and the summary `tern inspect` prints.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "model/weights.h"

namespace tern {

struct LoadOptions {
  enum class Dtype { auto_, q4, bf16, stored } dtype = Dtype::auto_;  // auto_: MLX files as stored; HF BF16 -> 4-bit
                                                              // (MLX algorithm, group 64, 8-bit router and
                                                              // shared_expert_gate as mlx-lm does); bf16 keeps BF16;
                                                              // stored: every layout as stored (F32 stays f32,
                                                              // BF16 bf16, F16 widened to f32; the fp32 tests)
  bool progress = true;     // progress bar on stderr (plain lines when not a terminal), and the note on the MTP head
  // A safetensors file holding the MTP head's mtp.* tensors (tern extract-mtp), for a folder without them (MLX
  // conversions drop them); it replaces the folder's own when both are there. Empty: the folder's, if any.
  std::filesystem::path draft_weights;
};

// Parses "auto", "q4", "bf16" (the --dtype flag). Throws tern::Error on anything else.
LoadOptions::Dtype load_dtype_parse(const std::string& text);

// One internal matrix as the load will produce it.
struct PlannedMatrix {
  std::string name;     // internal name, e.g. "layers.3.q_proj"
  std::string kind;     // embed, lm_head, attention, linear_attention, router, experts, shared_expert
  WeightFormat format = WeightFormat::bf16;
  int64_t experts = 1, rows = 0, cols = 0;
  int group_size = 64;
  int64_t bytes = 0;
  bool zero_copy = false;  // points into the mapped file
};

// What a checkpoint holds and what loading it makes (headers only; no weight is read). `tern inspect`.
struct CheckpointSummary {
  std::string layout;        // "hf" or "mlx"
  std::string naming;        // key prefix found, e.g. "model.language_model."
  std::string experts_form;  // "fused", "per-expert", "stacked"
  int64_t files = 0, tensors = 0, source_bytes = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> skipped;  // prefix -> (tensors, bytes)
  Config config;
  int64_t vocab_real = 0;
  std::vector<PlannedMatrix> matrices;
  int64_t vector_bytes = 0;  // norms, conv, A_log, dt_bias as fp32
  std::string mtp;           // "DIR" or "FILE" the MTP head loads from; empty when it is absent
  std::string mtp_absent;    // why it is absent, in words
  // The vision encoder (model/vision_checkpoint.h): loaded when config.json has a vision_config and the files its
  // tensors; they are then not among `skipped`.
  bool vision = false;
  int64_t vision_tensors = 0, vision_bytes = 0;  // source tensors and their bytes
  int64_t weight_bytes() const;
};

CheckpointSummary checkpoint_summary(const std::filesystem::path& dir, const LoadOptions& options = {});

ModelWeights model_load(const std::filesystem::path& dir, const LoadOptions& options = {});

// The tokenizer's id count (max id + 1 over model.vocab and added_tokens of DIR/tokenizer.json), or 0 when there
// is no tokenizer.json. Throws tern::Error when the file is present but unreadable.
int64_t tokenizer_id_count(const std::filesystem::path& dir);

}  // namespace tern
