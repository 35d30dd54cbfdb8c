// tern eval: teacher-forced evaluation of a token sequence on a runner, against reference logits or alone.
//
// The tokens are split into windows of `context` tokens (0: one window holding them all); each window runs from a
// fresh session, in forward calls of `batch` tokens with the logits of every position. Position i's logits are
// scored against tokens[i + 1] when that token lies in the same window (perplexity), and against reference row i
// (KL, top-1) when reference logits are given; those need one window, since the reference saw the whole sequence.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/eval_metrics.h"
#include "model/runner.h"

namespace tern {

// Reference logits [rows, cols] float32, row-major (a view; the caller owns the memory).
struct ReferenceLogits {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

struct EvalOptions {
  int64_t context = 0;   // tokens per window; 0: all tokens in one window
  int64_t batch = 128;   // tokens per forward call (logits of a call: batch x V floats)
  std::function<void(int64_t done, int64_t total)> progress;  // after every forward call; may be empty
  std::vector<EvalPosition>* positions = nullptr;  // set: receives the per-position records (with a reference)
};

// Runs the evaluation. Throws tern::Error on bad input (no tokens, ids out of range, a reference whose shape does
// not match the tokens or the vocabulary, windows with a reference).
EvalSummary eval_run(ModelRunner& runner, std::span<const int32_t> tokens, const ReferenceLogits* reference,
                     const EvalOptions& options);

// Reads a token file: .npy (int32, int64 or uint32, any shape, flattened), else text holding integers separated
// by white space, commas or brackets (so a JSON array works too). Throws tern::Error naming the file.
std::vector<int32_t> eval_tokens_read(const std::filesystem::path& path);

// The summary as one JSON object (text), and as lines a person reads.
std::string eval_summary_json(const EvalSummary& s);
std::string eval_summary_text(const EvalSummary& s);

}  // namespace tern
