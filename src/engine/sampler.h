// Token sampling on the host over the full vocabulary (no full sort): logit bias, repetition / presence /
// frequency penalties, temperature, top-k, top-p, min-p, greedy, seeded draws, and log-probabilities.
//
// Order of operations (the one HF and vLLM use):
//   logits -> logit_bias -> repetition penalty (prompt + output) -> presence/frequency (output only)
//          -> allowed-token mask (constrained decoding: disallowed ids -> -inf)
//          -> [log-probabilities are read here, at temperature 1 when greedy]
//          -> / temperature -> top-k -> top-p (over the top-k mass) -> min-p -> draw
// Padded ids (>= vocab_real) and non-finite logits are never sampled.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/config.h"

namespace tern {

struct SamplingParams {
  float temperature = 1.0f;        // <= 0: greedy (argmax, lowest id on ties)
  float top_p = 1.0f;              // (0, 1]; 1: off
  float min_p = 0.0f;              // [0, 1]; 0: off. Drops tokens with p < min_p * p_max
  int top_k = 0;                   // 0 (or < 0): off; 1: greedy
  float presence_penalty = 0.0f;   // OpenAI: logit -= presence * [count > 0], over generated tokens
  float frequency_penalty = 0.0f;  // OpenAI: logit -= frequency * count, over generated tokens
  float repetition_penalty = 1.0f; // HF/vLLM: over prompt + generated; logit > 0 ? logit / p : logit * p
  std::unordered_map<int32_t, float> logit_bias;  // id -> added to the logit (-inf bans the id)
  std::optional<uint64_t> seed;    // same seed + same request -> same tokens on the same backend
  int top_logprobs = -1;           // -1: no log-probabilities; 0..20: chosen token's + that many alternatives

  bool greedy() const { return temperature <= 0.0f || top_k == 1; }
  // Throws tern::Error naming the parameter when a value is out of range (NaN, negative temperature, ...).
  void validate() const;
};

// The model's defaults (generation_config.json); unspecified values keep SamplingParams' defaults.
SamplingParams sampling_defaults(const Config& config);

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

// What a draw produced besides the id (filled only when top_logprobs >= 0).
struct SampleInfo {
  float logprob = 0.0f;                  // of the chosen id
  std::vector<TokenLogprob> top;         // [top_logprobs], most probable first
};

// Samples successive tokens of one sequence. Not thread-safe; one per generation.
class Sampler {
 public:
  // vocab_real: ids >= vocab_real are padding. prompt: seen by the repetition penalty.
  Sampler(const SamplingParams& params, int64_t vocab_real, std::span<const int32_t> prompt = {});

  // logits: [V >= vocab_real] float32, modified in place (penalties, temperature). Returns the chosen id and, when
  // params.top_logprobs >= 0 and info is given, its log-probability and the top alternatives.
  // allowed: an allowed-token bitmask (engine/token_mask.h; empty: every id allowed); masked ids are never chosen
  // and their log-probability is -inf. Throws tern::Error when no allowed id has a finite logit.
  int32_t sample(std::span<float> logits, SampleInfo* info = nullptr, std::span<const uint32_t> allowed = {});

  // Records a generated id (for the penalties). generate() calls it with each emitted id (sampled or forced).
  void accept(int32_t id);

  // Log-probability of any id under the distribution of the last sample() call; `logits` are the ones that call
  // processed in place. Used for forced tokens.
  float last_logprob(std::span<const float> logits, int32_t id) const;

  const SamplingParams& params() const { return params_; }
  uint64_t seed() const { return seed_; }

 private:
  void apply_penalties(std::span<float> logits) const;
  double next_uniform();  // [0, 1)
  // log Σ exp(l - last_max_) over the usable logits of the last sample() call (`logits`, as it left them), computed
  // at the first call after it: greedy and top-k draws without log-probabilities never need it.
  double last_log_z(std::span<const float> logits) const;

  SamplingParams params_;
  int64_t vocab_real_;
  uint64_t seed_;
  double last_max_ = 0.0;                            // of the last sample() call's distribution
  mutable double last_z_ = 0.0, last_log_z_ = 0.0;   // its normaliser and log, once log_z_known_ (last_log_z)
  mutable bool log_z_known_ = false;
  uint64_t rng_state_[4];
  std::unordered_map<int32_t, int> output_counts_;  // generated id -> count
  std::vector<int32_t> seen_;                        // prompt + generated ids, unique (repetition penalty)
  std::vector<uint8_t> seen_mask_;                   // [vocab_real] 1 when the id is in seen_
  std::vector<std::pair<float, int32_t>> scratch_;   // candidates
};

// Helpers shared with the tests and backends.
// The lowest id among the maxima of [0, vocab_real); -1 when no logit is finite.
int32_t sampler_argmax(std::span<const float> logits, int64_t vocab_real);
// Indices of the n largest finite logits among [0, vocab_real), largest first (ties: lower id first).
std::vector<int32_t> sampler_top_n(std::span<const float> logits, int64_t vocab_real, int64_t n);

}  // namespace tern
