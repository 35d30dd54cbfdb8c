// One request's generation as steps, so that a scheduler can run many at once (the server's engine loop) and
// Generator::generate can run one: each step asks for one forward (a chunk of the prompt, or the last sampled id),
// the caller runs it (alone or in a batch: ModelRunner::forward_batch) and hands the output back; the run samples,
// emits text and decides whether it goes on. The semantics are generate()'s (generator.h): the same checks, the
// same tokens and events whatever the batch.
//
//   GenerationRun run(generator, session, request, on_token);
//   while (!run.finished()) {
//     BatchEntry e;
//     if (run.next_step(e, budget)) { runner.forward_batch({&e, 1}); run.step_done(e); }
//   }
//   GenerationResult r = run.take_result();
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/constrained.h"
#include "engine/generator.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "engine/text_stream.h"
#include "model/runner.h"

namespace tern {

class GenerationRun {
 public:
  // Checks the request (throws tern::Error as generate() does, the session then untouched) and sets up the prefill
  // (a session holding the whole prompt or more is reset). `generator`, `session`, `request` and on_token must
  // outlive the run. drafter: the decode steps' drafts (a benchmark's; the runner must verify drafts); null: those of
  // the generator's speculative options.
  GenerationRun(Generator& generator, Session& session, const GenerationRequest& request,
                std::function<bool(const TokenEvent&)> on_token, std::unique_ptr<Drafter> drafter = nullptr);
  ~GenerationRun();
  GenerationRun(const GenerationRun&) = delete;
  GenerationRun& operator=(const GenerationRun&) = delete;

  bool finished() const { return finished_; }
  bool prefilling() const { return !rest_.empty(); }
  int64_t prompt_left() const { return int64_t(rest_.size()); }  // prompt tokens not yet fed
  Session& session() { return session_; }

  // The next forward: fills `entry` (session, tokens, output buffers) and returns true. A prompt chunk is at most
  // max_prompt_tokens (>= 1) of prompt work: tokens through every layer, so a longer chunk may run a share of its
  // layers (BatchEntry::layer_limit; the runner's chunk in pieces, see prompt_piece). False when the run ended
  // instead (cancelled before the step; a chunk part way is dropped, the session as before it): nothing to run.
  // may_start_pieces false: no new chunk in pieces this step (a chunk part way goes on; the runner may hold only one
  // chunk part way at a time, so a scheduler lets one run start pieces per step: see holds_chunk_part_way).
  bool next_step(BatchEntry& entry, int64_t max_prompt_tokens, bool may_start_pieces = true);
  // The prompt work of the last next_step's entry: its tokens x the layers it runs / all layers, rounded up (0 for a
  // decode step). What a scheduler's per-step prompt budget counts.
  int64_t step_work() const { return work_; }
  // The session holds this run's prompt chunk part way: a scheduler gives this run its prompt budget first, so that
  // the runner's one part-way slot is not held by a run that waits.
  bool holds_chunk_part_way() const { return piece_tokens_ > 0; }
  // The forward of the last next_step() ran (its output in `entry`): samples, emits, and ends the run or not.
  // Rethrows the entry's error (the run is then finished, its result unusable).
  void step_done(const BatchEntry& entry);

  // The result, once finished().
  GenerationResult take_result() { return std::move(result_); }
  const GenerationResult& result() const { return result_; }

 private:
  using Clock = std::chrono::steady_clock;
  class ReasoningBudget;

  bool cancelled() const;
  void report_prompt_progress() const;  // request.on_prompt_progress, when set
  void after_prompt_chunk(const BatchEntry& entry);  // the prompt chunk `entry` ran
  void choose_token(std::optional<int32_t> device_id);  // one step of the decode loop, then feed or finish
  DeviceSampling device_sampling_at(uint64_t step);
  void finish_decode();
  // Speculative decoding: the drafts for the next decode step (cut where they cannot help), and the outcome of a
  // verify step (each row through choose_token as a step of its own, then the session rolled back).
  std::vector<int32_t> next_drafts();
  void verify_done(const BatchEntry& entry);
  int64_t held_position() const { return verify_pos_ >= 0 ? verify_pos_ : session_.position(); }

  Generator& gen_;
  Session& session_;
  const GenerationRequest& request_;
  std::function<bool(const TokenEvent&)> on_token_;
  int64_t vocab_ = 0, chunk_ = 0;
  std::optional<OutputConstraint> constraint_;
  std::unique_ptr<ReasoningBudget> budget_;
  int marker_next_ = -1;  // >= 0: the index of the next grammar_start_tokens to force (the constraint still due)
  std::optional<Sampler> sampler_;
  std::optional<TextStream> text_;
  GenerationResult result_;
  Clock::time_point t0_, t_decode_;
  // The images of the next prompt chunk, and their embeddings (encoded when a chunk first reaches an image, freed
  // once the session holds all its tokens).
  void image_spans(int64_t pos, int64_t n);
  void release_fed_images();
  size_t cut_at_checkpoints(int64_t pos, size_t n);
  size_t whole_chunk(size_t n) const;
  bool holds_images(int64_t from, int64_t to) const;
  bool prompt_piece(BatchEntry& entry, int64_t budget, bool may_start);
  void last_prompt_sampling(BatchEntry& entry);

  std::span<const int32_t> rest_;  // prompt tokens still to feed
  std::vector<std::unique_ptr<ImageEmbeddings>> encoded_;  // [request.images.size()]
  std::vector<ImageSpan> spans_;   // the current prompt chunk's image tokens
  int64_t kept_at_ = -1;           // the checkpoint the current prompt chunk keeps inside (Session::keep_state_at)
  size_t piece_tokens_ = 0;        // the prompt chunk the session holds part way (its first tokens of rest_); 0: none
  int64_t work_ = 0;               // step_work()
  std::vector<float> logits_;      // [V] of the last fed token
  bool finished_ = false, first_ = true, want_logprobs_ = false, device_ok_ = false, callback_stopped_ = false;
  uint64_t step_ = 0, max_tokens_ = 0;
  int32_t fed_[1] = {0};           // the id the next decode step feeds
  DeviceSampling sampling_;        // for that step, when device_ok_
  std::unique_ptr<Drafter> drafter_;  // speculative decoding on; null: plain steps
  std::vector<int32_t> verify_;    // a verify step's tokens: fed_[0], then the drafts
  std::vector<float> verify_logits_;  // its logits [verify_.size(), V]
  std::vector<int32_t> verify_ids_;   // or the ids the device sampled for its rows (BatchEntry::sampled_rows)
  int64_t verify_pos_ = -1;        // while a verify step's rows are chosen: the position a plain run would hold
  int32_t chosen_ = -1;            // the id choose_token last emitted
};

}  // namespace tern
