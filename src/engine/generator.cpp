#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/check.h"
#include "engine/constrained.h"
#include "engine/text_stream.h"
#include "text/tokenizer.h"

namespace tern {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// GenerationRequest::thinking_budget: while the reasoning block the prompt opened (starts_in_reasoning) is open,
// counts its tokens and follows the output's raw bytes for "</think>" (it may straddle tokens); queues the close
// tokens once the budget is spent. Only that block: a "<think>" the output writes later (an answer quoting the tag,
// a JSON string holding it) is text, as the output parser reads it.
class ReasoningBudget {
 public:
  explicit ReasoningBudget(const GenerationRequest& r)
      : budget_(r.thinking_budget), close_(r.reasoning_close_tokens), open_(r.starts_in_reasoning) {
    if (open_ && budget_ == 0) next_ = 0;  // no reasoning at all: close at once
  }
  bool forcing() const { return next_ >= 0; }
  int32_t next_forced() { return close_[size_t(next_)]; }
  // Every emitted token's raw bytes, in order (a forced one included).
  void accept(const std::string& bytes) {
    if (forcing()) {  // this token is close_[next_]
      if (size_t(++next_) == close_.size()) {
        next_ = -1;
        open_ = false;
        cut_ = true;
      }
      return;
    }
    if (!open_) return;
    tail_ += bytes;
    if (tail_.find("</think>") != std::string::npos) {
      open_ = false;
      return;
    }
    ++tokens_;
    if (budget_ >= 0 && tokens_ >= budget_) next_ = 0;
    if (tail_.size() > 8) tail_.erase(0, tail_.size() - 8);  // enough for a marker split over tokens
  }
  int64_t reasoning_tokens() const { return tokens_; }
  bool cut() const { return cut_; }

 private:
  int64_t budget_;
  const std::vector<int32_t>& close_;
  bool open_, cut_ = false;
  int64_t tokens_ = 0;
  int next_ = -1;  // >= 0: the index in close_ of the next token to force
  std::string tail_;
};

bool device_sampling_allowed(const GenerationRequest& r) {
  const SamplingParams& s = r.sampling;
  return s.logit_bias.empty() && s.presence_penalty == 0.0f && s.frequency_penalty == 0.0f &&
         s.repetition_penalty == 1.0f && s.top_logprobs < 0 && r.forced_tokens.empty();
}

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::context: return "context";
    case FinishReason::cancelled: return "cancelled";
  }
  return "?";
}

Generator::Generator(ModelRunner& runner, const Tokenizer& tokenizer, GeneratorOptions options)
    : Generator(runner,
                TokenTextSource{
                    // Ids the tokenizer does not know (the model may have more rows than it) print as nothing.
                    .bytes = [&tokenizer](int32_t id) {
                      return tokenizer.contains(id) ? tokenizer.token_bytes(id) : std::string();
                    },
                    .is_special = [&tokenizer](int32_t id) { return tokenizer.contains(id) && tokenizer.is_special(id); }},
                std::move(options)) {
  tokenizer_ = &tokenizer;
  // Chat turns end with <|im_end|> even when a folder's config names only <|endoftext|> (mlx-vlm does the same).
  for (const char* t : {"<|im_end|>", "<|endoftext|>"})
    if (const std::optional<int32_t> id = tokenizer.token_id(t); id && *id < runner.vocab_real()) end_ids_.push_back(*id);
  std::sort(end_ids_.begin(), end_ids_.end());
  end_ids_.erase(std::unique(end_ids_.begin(), end_ids_.end()), end_ids_.end());
}

Generator::Generator(ModelRunner& runner, TokenTextSource text, GeneratorOptions options)
    : runner_(runner), text_(std::move(text)), options_(std::move(options)) {
  TERN_CHECK(bool(text_.bytes), "generator: the token text source has no bytes function");
  if (!text_.is_special) text_.is_special = [](int32_t) { return false; };
  end_ids_ = runner_.config().eos_token_ids;
  for (int32_t id : options_.extra_end_ids) end_ids_.push_back(id);
  std::sort(end_ids_.begin(), end_ids_.end());
  end_ids_.erase(std::unique(end_ids_.begin(), end_ids_.end()), end_ids_.end());
  TERN_CHECK(options_.prefill_chunk >= 0, "generator: prefill_chunk must be >= 0, got ", options_.prefill_chunk);
  vocab_ = options_.vocabulary;
}

std::shared_ptr<const grammar::TokenVocabulary> Generator::vocabulary() {
  std::lock_guard lock(vocab_mutex_);
  if (!vocab_) {
    TERN_INTERNAL_CHECK(tokenizer_ != nullptr,
                        "constrained decoding needs a tokenizer (or GeneratorOptions::vocabulary)");
    vocab_ = grammar::TokenVocabulary::from_tokenizer(*tokenizer_, runner_.vocab_real(), end_ids_);
  }
  return vocab_;
}

GenerationResult Generator::generate(Session& session, const GenerationRequest& request,
                                     const std::function<bool(const TokenEvent&)>& on_token) {
  const int64_t vocab = runner_.vocab_real();
  const int64_t n_prompt = int64_t(request.prompt.size());
  TERN_CHECK(n_prompt > 0, "the prompt is empty; at least one token is needed");
  for (int32_t id : request.prompt)
    TERN_CHECK(id >= 0 && id < vocab, "prompt token ", id, " is outside the vocabulary [0, ", vocab, ")");
  for (int32_t id : request.forced_tokens)
    TERN_CHECK(id >= 0 && id < vocab, "forced token ", id, " is outside the vocabulary [0, ", vocab, ")");
  TERN_CHECK(request.max_tokens >= -1, "max_tokens must be >= 0 (or -1 for no limit), got ", request.max_tokens);
  for (const std::string& s : request.stop) TERN_CHECK(!s.empty(), "a stop string is empty");
  TERN_CHECK(n_prompt <= session.capacity(), "the prompt has ", n_prompt, " tokens but the context holds only ",
             session.capacity());

  for (int32_t id : request.reasoning_close_tokens)
    TERN_CHECK(id >= 0 && id < vocab, "reasoning close token ", id, " is outside the vocabulary [0, ", vocab, ")");
  TERN_CHECK(request.thinking_budget < 0 || !request.reasoning_close_tokens.empty(),
             "a thinking budget needs the tokens that close the reasoning");

  std::optional<OutputConstraint> constraint;
  if (request.grammar) constraint.emplace(request.grammar, vocabulary(), request.grammar_start_after);
  ReasoningBudget budget(request);

  GenerationResult result;
  result.prompt_tokens = n_prompt;
  Sampler sampler(request.sampling, vocab, request.prompt);
  result.seed = sampler.seed();
  const auto is_end = [&](int32_t id) {
    return !request.ignore_eos && std::binary_search(end_ids_.begin(), end_ids_.end(), id);
  };
  const auto cancelled = [&] { return request.cancel && request.cancel->load(std::memory_order_relaxed); };

  // ---- prefill: feed the part of the prompt the session does not hold yet ----
  const auto t0 = Clock::now();
  if (session.position() >= n_prompt) session.reset();
  result.cached_tokens = session.position();
  std::vector<float> logits;  // [V] of the last fed token
  std::span<const int32_t> rest(request.prompt.data() + session.position(), size_t(n_prompt - session.position()));
  const int64_t chunk = options_.prefill_chunk > 0 ? options_.prefill_chunk
                                                  : std::max<int64_t>(1, runner_.preferred_prefill_chunk());
  while (!rest.empty()) {
    if (cancelled()) {
      result.finish = FinishReason::cancelled;
      result.prefill_s = seconds_since(t0);
      return result;
    }
    size_t n = std::min<size_t>(rest.size(), size_t(chunk));
    const int64_t every = request.checkpoint_every;
    if (every > 0) n = std::min<size_t>(n, size_t(every - session.position() % every));
    for (int64_t at : request.checkpoint_at)
      if (at > session.position() && at < n_prompt) n = std::min<size_t>(n, size_t(at - session.position()));
    runner_.forward(session, rest.first(n), false, logits);
    rest = rest.subspan(n);
    const int64_t pos = session.position();
    if (request.on_checkpoint &&
        (rest.empty() || (every > 0 && pos % every == 0) ||
         std::find(request.checkpoint_at.begin(), request.checkpoint_at.end(), pos) != request.checkpoint_at.end()))
      request.on_checkpoint(session);
  }
  TERN_INTERNAL_CHECK(int64_t(logits.size()) >= vocab, "the backend returned ", logits.size(),
                      " logits for a vocabulary of ", vocab);

  // ---- decode ----
  TextStream text(request.stop);
  const bool want_logprobs = request.sampling.top_logprobs >= 0;
  bool device_ok = options_.use_device_sampling && device_sampling_allowed(request);
  const uint64_t max_tokens = request.max_tokens < 0 ? UINT64_MAX : uint64_t(request.max_tokens);
  bool callback_stopped = false;
  Clock::time_point t_decode = Clock::now();
  bool first = true;
  int32_t pending_device_id = -1;  // >= 0: a token already sampled on the device for this step

  const auto emit = [&](TokenEvent& ev) -> bool {
    result.text += ev.text;
    if (!on_token) return true;
    if (!on_token(ev)) {
      callback_stopped = true;
      return false;
    }
    return true;
  };

  for (uint64_t step = 0;; ++step) {
    if (step >= max_tokens) {
      result.finish = FinishReason::length;
      break;
    }
    // Choose the next id from the logits of the last fed token.
    SampleInfo info;
    int32_t id = pending_device_id;
    pending_device_id = -1;
    if (id < 0) {
      id = sampler.sample(logits, want_logprobs ? &info : nullptr,
                          constraint ? constraint->fill() : std::span<const uint32_t>());
    }
    const bool forced = budget.forcing() || step < request.forced_tokens.size();
    if (forced) {
      id = budget.forcing() ? budget.next_forced() : request.forced_tokens[step];
      if (want_logprobs) info.logprob = sampler.last_logprob(logits, id);
    }
    budget.accept(text_.bytes(id));
    bool grammar_ended = false;  // an end id the grammar accepted ends the output even with ignore_eos
    if (constraint) {
      const bool was_active = constraint->active();
      // A forced token the grammar refuses is the request's (its forced output); a sampled one is the backend's fault.
      const bool accepted = constraint->accept(id, text_.bytes(id));
      TERN_CHECK(accepted || !forced, "forced token ", id, ", which the output constraint does not allow");
      TERN_INTERNAL_CHECK(accepted, "the backend sampled token ", id,
                          ", which the output constraint does not allow (its sampler ignored the mask)");
      grammar_ended = was_active && constraint->done() && std::binary_search(end_ids_.begin(), end_ids_.end(), id);
    }
    if (first) {
      result.prefill_s = seconds_since(t0);
      t_decode = Clock::now();
      first = false;
    }
    sampler.accept(id);
    result.tokens.push_back(id);

    if (is_end(id) || grammar_ended) {
      result.stop_id = id;
      result.finish = FinishReason::stop;
      break;
    }
    TokenEvent ev;
    ev.id = id;
    ev.index = int64_t(step);
    ev.has_logprobs = want_logprobs;
    ev.logprob = info.logprob;
    ev.top_logprobs = std::move(info.top);
    const bool skip = request.skip_special_tokens && text_.is_special(id);
    const bool stopped = text.push(skip ? std::string() : text_.bytes(id), ev.text);
    if (!emit(ev)) {
      result.finish = FinishReason::cancelled;
      break;
    }
    if (stopped) {
      result.stop_string = text.matched_stop();
      result.finish = FinishReason::stop;
      break;
    }
    if (!request.forced_tokens.empty() && step + 1 == request.forced_tokens.size()) {
      result.finish = FinishReason::stop;
      result.message = "the forced tokens ended";
      break;
    }
    if (step + 1 >= max_tokens) {
      result.finish = FinishReason::length;
      break;
    }
    if (cancelled()) {
      result.finish = FinishReason::cancelled;
      break;
    }
    if (session.position() + 1 > session.capacity()) {
      result.finish = FinishReason::context;
      result.message = detail::concat("the context limit of ", session.capacity(), " tokens was reached");
      break;
    }
    // Feed the id; get the next logits (or the next id straight from the device).
    const int32_t fed[1] = {id};
    if (device_ok) {
      DeviceSampling ds{.temperature = request.sampling.greedy() ? 0.0f : request.sampling.temperature,
                        .top_k = std::max(0, request.sampling.top_k),
                        .top_p = request.sampling.top_p,
                        .min_p = request.sampling.min_p,
                        .seed = sampler.seed(),
                        .step = step + 1,
                        .mask = constraint && constraint->active() ? &*constraint : nullptr};
      const std::optional<int32_t> device_id = runner_.forward_sample(session, fed, ds);
      if (device_id) {
        TERN_INTERNAL_CHECK(*device_id >= 0 && *device_id < vocab, "the backend sampled token ", *device_id,
                            ", outside the vocabulary [0, ", vocab, ")");
        pending_device_id = *device_id;
        continue;
      }
      device_ok = false;  // this backend has no device sampler: use the host one from now on
    }
    runner_.forward(session, fed, false, logits);
  }
  if (first) result.prefill_s = seconds_since(t0);
  else result.decode_s = seconds_since(t_decode);

  // Release held-back text (a partial stop string that never completed, an incomplete UTF-8 tail).
  if (!callback_stopped && result.stop_string.empty()) {
    TokenEvent ev;
    ev.id = -1;
    ev.index = int64_t(result.tokens.size());
    text.finish(ev.text);
    if (!ev.text.empty()) emit(ev);
  }
  result.completion_tokens = int64_t(result.tokens.size());
  result.reasoning_tokens = budget.reasoning_tokens();
  result.reasoning_cut = budget.cut();
  return result;
}

}  // namespace tern
