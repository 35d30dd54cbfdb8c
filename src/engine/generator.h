// The generation loop over one session: prefill the prompt, then decode one token per step until an end id, a
// stop string, max_tokens, the context limit or cancellation. Streams stop-safe, UTF-8-complete text. The loop's
// steps are a GenerationRun (generation_run.h), which a scheduler can also run many of at once.
//
// Session contract: the session may already hold a prefix of the prompt (multi-turn reuse): generate() feeds only
// prompt[session.position():]. The caller guarantees those held tokens equal the prompt's first ones; when the
// session holds as many tokens as the prompt or more, it is reset and the whole prompt is run. After generate()
// the session holds the prompt followed by every generated token except the last one (that one was never fed).
//
// Typical use (server, CLI):
//   Generator gen(runner, tokenizer);
//   auto session = runner.create_session(ctx);
//   GenerationResult r = gen.generate(*session, request, [&](const TokenEvent& e) { out << e.text; return true; });
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "engine/prompt_image.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "grammar/grammar.h"
#include "model/runner.h"

namespace tern {

class Tokenizer;

// How far a prompt's prefill has got (GenerationRequest::on_prompt_progress). Counts are prompt tokens.
struct PromptProgress {
  int64_t total = 0;      // the prompt's tokens
  int64_t cached = 0;     // held by the session before the prefill (reused from the prefix cache, not recomputed)
  int64_t processed = 0;  // held by the session now, the cached ones included: cached <= processed <= total
  double elapsed_s = 0;   // seconds since the run started (the prefill's start)
};

struct GenerationRequest {
  std::vector<int32_t> prompt;          // token ids; must not be empty
  // Images: each a run of <|image_pad|> tokens in the prompt (in order), encoded by the runner's vision encoder when
  // the prefill reaches it (not when the session already holds it). Needs a runner that takes images
  // (ModelRunner::images_unavailable() empty); otherwise the request is refused with that reason.
  std::vector<PromptImage> images;
  SamplingParams sampling;
  int64_t max_tokens = -1;              // -1: until an end id, a stop string or the context limit
  std::vector<std::string> stop;        // stop strings; the matched text never reaches the output
  bool ignore_eos = false;              // do not stop on end ids (they are still decoded as text, usually "")
  bool skip_special_tokens = true;      // special tokens (<|im_end|> ...) produce no text
  std::vector<int32_t> forced_tokens;   // debug: the model still runs, but step i emits forced_tokens[i]; after
                                        // the list ends, generation stops with FinishReason::stop
  // Constrained decoding (src/grammar): when set, every generated token is one the grammar allows (the others'
  // logits are -inf before sampling, after logit_bias and penalties; log-probabilities see the same) and an end id
  // only once the output is a whole sentence of the grammar; then generation stops (also with ignore_eos). When
  // max_tokens runs out first, the finish is `length` with the output as far as it got.
  grammar::GrammarPtr grammar;
  // With a grammar: the constraint starts after the output's raw bytes contain this text (e.g. "</think>": the
  // reasoning stays free); "": from the first token.
  std::string grammar_start_after;
  // The tokens that write grammar_start_after. When set, an end id sampled before the constraint starts (the model
  // ending inside its reasoning) is replaced by them, one per step, so that the answer the grammar shapes still
  // follows; they count as output tokens.
  std::vector<int32_t> grammar_start_tokens;
  // Reasoning budget: with thinking_budget >= 0, once that many tokens were generated inside the reasoning block the
  // prompt opened (starts_in_reasoning: the prompt ends inside <think>) and it is still open, the next tokens are
  // reasoning_close_tokens (a note and "</think>"; the model runs as usual, its choice is replaced), and the answer
  // follows. A "<think>" the output writes later is text. The close tokens count as output tokens, not as reasoning
  // (GenerationResult::reasoning_tokens). They take the place of forced_tokens (debug) at their steps.
  int64_t thinking_budget = -1;
  bool starts_in_reasoning = false;
  std::vector<int32_t> reasoning_close_tokens;
  const std::atomic<bool>* cancel = nullptr;  // optional: set to true to stop within one step
  // Prefix cache (src/engine/prefix_cache.h): the prefill's forward calls also end at every multiple of
  // checkpoint_every (absolute positions; 0: none), and on_checkpoint(session) runs there and once the whole
  // prompt is in (before the first token is sampled).
  // checkpoint_at: more such positions (e.g. where the chat template's generation prompt begins).
  // on_kept_checkpoint (optional): where the runner can keep a state inside a forward call
  // (ModelRunner::keeps_state_inside), a checkpoint_at position inside a prompt chunk does not cut the chunk: the
  // session keeps the states there (Session::keep_state_at) and on_kept_checkpoint(session) runs after the chunk, to
  // take them (Session::take_kept_snapshot). Without it, every checkpoint_at position ends a forward call.
  int64_t checkpoint_every = 0;
  std::vector<int64_t> checkpoint_at;
  std::function<void(Session&)> on_checkpoint;
  std::function<void(Session&)> on_kept_checkpoint;
  // Prefill progress (a status line, a client's "reading prompt N / M"): on_prompt_progress runs once before the
  // prefill's first forward call (processed == cached), then after each of its forward calls (a chunk of the
  // prompt, never a token), the last time with processed == total, before the first token is sampled.
  std::function<void(const PromptProgress&)> on_prompt_progress;
  // Speculative decoding (GeneratorOptions::speculative not off): the client's expected output, tokenised
  // (OpenAI's `prediction`), a draft source besides the conversation. Never changes the output, only its speed.
  std::vector<int32_t> prediction;
};

// What a spent thinking budget forces (callers tokenise it into reasoning_close_tokens): a note that tells the model
// why its reasoning stops, so that the answer builds on what it has (as the Qwen3 report's budget experiments do),
// rather than a bare </think> mid-sentence.
inline constexpr std::string_view kReasoningBudgetClose =
    "\n\nThe thinking budget is spent; time to answer with what I have.\n</think>\n\n";

// One generated token. Emitted for every generated id except an end id that stops generation.
struct TokenEvent {
  int32_t id = -1;              // -1 only for the final flush event (held-back text released at the end)
  std::string text;             // new output text: UTF-8-complete, never part of a stop string; may be empty
  bool has_logprobs = false;    // request.sampling.top_logprobs >= 0
  float logprob = 0.0f;         // of id, from the distribution the sampler used (after penalties, temperature)
  std::vector<TokenLogprob> top_logprobs;  // [top_logprobs] alternatives, most probable first
  int64_t index = 0;            // 0-based index of this token among the generated ones
};

enum class FinishReason {
  stop,       // end id, stop string, or the end of forced_tokens
  length,     // max_tokens reached
  context,    // the session is full (message says so)
  cancelled,  // the callback returned false or the cancel flag was set
};
const char* finish_reason_name(FinishReason r);  // "stop", "length", "context", "cancelled"

struct GenerationResult {
  FinishReason finish = FinishReason::stop;
  std::string message;                  // human-readable detail (e.g. the context limit reached)
  std::string stop_string;              // the stop string that matched, else ""
  int32_t stop_id = -1;                 // the end id that stopped generation, else -1
  std::vector<int32_t> tokens;          // every generated id (including a final end id)
  std::string text;                     // the whole output text (what the events carried)
  int64_t prompt_tokens = 0;            // request.prompt.size()
  int64_t cached_tokens = 0;            // prompt tokens the session already held (not recomputed)
  int64_t completion_tokens = 0;        // tokens.size()
  double prefill_s = 0.0;               // prompt forward until the first token is sampled (time to first token)
  double decode_s = 0.0;                // the remaining steps
  int64_t reasoning_tokens = 0;         // generated inside the prompt's open reasoning block (see thinking_budget)
  bool reasoning_cut = false;           // the budget closed the reasoning block
  uint64_t seed = 0;                    // the seed used (drawn at random when the request gave none)
  // Speculative decoding: drafted tokens verified, and those of them the model's own choice confirmed (emitted
  // without a step of their own); drafted - accepted were rejected.
  int64_t draft_tokens = 0;
  int64_t accepted_draft_tokens = 0;
  int64_t verify_steps = 0;             // forwards that verified drafts

  double prefill_tok_s() const { return prefill_s > 0 ? double(prompt_tokens - cached_tokens) / prefill_s : 0.0; }
  double decode_tok_s() const {
    return decode_s > 0 && completion_tokens > 1 ? double(completion_tokens - 1) / decode_s : 0.0;
  }
};

// Turns one id into its raw bytes for the output ("" for a special token that is skipped). Lets tests run the
// loop without a real tokenizer.
struct TokenTextSource {
  std::function<std::string(int32_t id)> bytes;       // raw bytes of the token (byte-level BPE decoded)
  std::function<bool(int32_t id)> is_special;         // skipped when skip_special_tokens
};

struct GeneratorOptions {
  int64_t prefill_chunk = 0;            // prompt tokens per forward call (cancellation is checked between calls);
                                        // 0: the runner's preferred_prefill_chunk() (CUDA: its 4096-token chunk)
  std::vector<int32_t> extra_end_ids;   // added to the config's eos_token_ids
  bool use_device_sampling = true;      // use runner.forward_sample when the request allows it
  // The token vocabulary for constrained requests; null: built from the tokenizer on the first constrained request
  // (once per generator, i.e. per loaded model) and kept.
  std::shared_ptr<const grammar::TokenVocabulary> vocabulary;
  // Drafts verified in each decode step (engine/speculative.h); used only when the runner supports_verify().
  SpeculativeOptions speculative;
};

class Generator {
 public:
  // End ids: the config's eos_token_ids (config.json + generation_config.json), options.extra_end_ids, and with a
  // tokenizer also <|im_end|> and <|endoftext|> when it has them. `tokenizer` must outlive the generator.
  Generator(ModelRunner& runner, const Tokenizer& tokenizer, GeneratorOptions options = {});
  Generator(ModelRunner& runner, TokenTextSource text, GeneratorOptions options = {});

  // Runs one request. on_token returns false to cancel (generation stops before the next step). Throws
  // tern::Error for a bad request (empty prompt, prompt longer than the session, bad sampling values, an id out of
  // the vocabulary); the session is then left reset.
  GenerationResult generate(Session& session, const GenerationRequest& request,
                            const std::function<bool(const TokenEvent&)>& on_token = {});

  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  ModelRunner& runner() { return runner_; }
  const TokenTextSource& text_source() const { return text_; }
  const GeneratorOptions& options() const { return options_; }
  // The vocabulary constrained requests use (built on the first call; thread-safe). Throws tern::Error when the
  // generator has neither a tokenizer nor options.vocabulary.
  std::shared_ptr<const grammar::TokenVocabulary> vocabulary();

 private:
  ModelRunner& runner_;
  TokenTextSource text_;
  GeneratorOptions options_;
  std::vector<int32_t> end_ids_;
  const Tokenizer* tokenizer_ = nullptr;  // for the vocabulary (null with a TokenTextSource)
  std::mutex vocab_mutex_;
  std::shared_ptr<const grammar::TokenVocabulary> vocab_;
};

}  // namespace tern
