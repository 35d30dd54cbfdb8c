#include "engine/generation_run.h"

#include <algorithm>
#include <utility>

#include "core/check.h"

namespace tern {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

bool device_sampling_allowed(const GenerationRequest& r) {
  const SamplingParams& s = r.sampling;
  return s.logit_bias.empty() && s.presence_penalty == 0.0f && s.frequency_penalty == 0.0f &&
         s.repetition_penalty == 1.0f && s.top_logprobs < 0 && r.forced_tokens.empty();
}

}  // namespace

// GenerationRequest::thinking_budget: while the reasoning block the prompt opened (starts_in_reasoning) is open,
// counts its tokens and follows the output's raw bytes for "</think>" (it may straddle tokens); queues the close
// tokens once the budget is spent. Only that block: a "<think>" the output writes later (an answer quoting the tag,
// a JSON string holding it) is text, as the output parser reads it.
class GenerationRun::ReasoningBudget {
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

GenerationRun::GenerationRun(Generator& generator, Session& session, const GenerationRequest& request,
                             std::function<bool(const TokenEvent&)> on_token, std::unique_ptr<Drafter> drafter)
    : gen_(generator), session_(session), request_(request), on_token_(std::move(on_token)) {
  ModelRunner& runner = gen_.runner();
  vocab_ = runner.vocab_real();
  const int64_t n_prompt = int64_t(request.prompt.size());
  TERN_CHECK(n_prompt > 0, "the prompt is empty; at least one token is needed");
  for (int32_t id : request.prompt)
    TERN_CHECK(id >= 0 && id < vocab_, "prompt token ", id, " is outside the vocabulary [0, ", vocab_, ")");
  for (int32_t id : request.forced_tokens)
    TERN_CHECK(id >= 0 && id < vocab_, "forced token ", id, " is outside the vocabulary [0, ", vocab_, ")");
  TERN_CHECK(request.max_tokens >= -1, "max_tokens must be >= 0 (or -1 for no limit), got ", request.max_tokens);
  for (const std::string& s : request.stop) TERN_CHECK(!s.empty(), "a stop string is empty");
  TERN_CHECK(n_prompt <= session.capacity(), "the prompt has ", n_prompt, " tokens but the context holds only ",
             session.capacity());
  for (int32_t id : request.reasoning_close_tokens)
    TERN_CHECK(id >= 0 && id < vocab_, "reasoning close token ", id, " is outside the vocabulary [0, ", vocab_, ")");
  TERN_CHECK(request.thinking_budget < 0 || !request.reasoning_close_tokens.empty(),
             "a thinking budget needs the tokens that close the reasoning");
  if (!request.images.empty()) {
    const std::string why = runner.images_unavailable();
    TERN_CHECK(why.empty(), why);
    const Config& c = runner.config();
    TERN_CHECK(c.vision.has_value(), "the model's config has no vision_config");
    prompt_images_check(request.prompt, request.images, c.image_token_id, c.vision->spatial_merge_size);
    encoded_.resize(request.images.size());
  }

  if (request.grammar) constraint_.emplace(request.grammar, gen_.vocabulary(), request.grammar_start_after);
  budget_ = std::make_unique<ReasoningBudget>(request);
  result_.prompt_tokens = n_prompt;
  sampler_.emplace(request.sampling, vocab_, request.prompt);
  result_.seed = sampler_->seed();
  want_logprobs_ = request.sampling.top_logprobs >= 0;
  max_tokens_ = request.max_tokens < 0 ? UINT64_MAX : uint64_t(request.max_tokens);
  chunk_ = gen_.options().prefill_chunk > 0 ? gen_.options().prefill_chunk
                                            : std::max<int64_t>(1, runner.preferred_prefill_chunk());

  // The prefill feeds the part of the prompt the session does not hold yet.
  t0_ = Clock::now();
  if (session.position() >= n_prompt) session.reset();
  result_.cached_tokens = session.position();
  rest_ = std::span<const int32_t>(request.prompt.data() + session.position(), size_t(n_prompt - session.position()));

  // Speculative decoding: the drafter follows the prefill too (the MTP head is fed after each chunk).
  if (drafter) {
    TERN_CHECK(runner.supports_verify(), "the ", runner.backend_name(), " backend cannot verify drafts");
    drafter_ = std::move(drafter);
  } else if (const SpeculativeOptions& spec = gen_.options().speculative; spec.max_drafts > 0) {
    const SpeculativeMode mode = speculative_effective_mode(spec.mode, runner);
    if (mode != SpeculativeMode::off)
      drafter_ = std::make_unique<SequenceDrafter>(
          spec, mode, request.prompt, request.prediction,
          mode == SpeculativeMode::mtp ? std::make_unique<MtpDrafter>(runner, session, request.prompt) : nullptr);
  }
  report_prompt_progress();  // the prefill starts: processed == cached
}

// A run dropped with a chunk part way (the engine stopping, a failed piece) leaves its session as before that chunk
// (a no-op when the session holds none).
GenerationRun::~GenerationRun() {
  try {
    session_.drop_pending_layers();
  } catch (...) {
  }
}

void GenerationRun::report_prompt_progress() const {
  if (!request_.on_prompt_progress) return;
  const int64_t total = int64_t(request_.prompt.size());
  request_.on_prompt_progress(PromptProgress{.total = total,
                                             .cached = result_.cached_tokens,
                                             .processed = total - int64_t(rest_.size()),
                                             .elapsed_s = seconds_since(t0_)});
}

bool GenerationRun::cancelled() const {
  return request_.cancel && request_.cancel->load(std::memory_order_relaxed);
}

bool GenerationRun::next_step(BatchEntry& entry, int64_t max_prompt_tokens, bool may_start_pieces) {
  TERN_INTERNAL_CHECK(!finished_, "generation: a step after the end");
  entry = BatchEntry{};
  entry.session = &session_;
  entry.logits = &logits_;
  work_ = 0;
  if (!rest_.empty()) {
    if (cancelled()) {
      if (std::exchange(piece_tokens_, 0) > 0) session_.drop_pending_layers();  // back to before the chunk
      result_.finish = FinishReason::cancelled;
      result_.prefill_s = seconds_since(t0_);
      finished_ = true;
      return false;
    }
    const int64_t budget = std::max<int64_t>(1, max_prompt_tokens);
    if (prompt_piece(entry, budget, may_start_pieces)) return true;
    size_t n = std::min<size_t>(rest_.size(), size_t(std::min(chunk_, budget)));
    n = cut_at_checkpoints(session_.position(), whole_chunk(n));
    entry.tokens = rest_.first(n);
    work_ = int64_t(n);
    image_spans(session_.position(), int64_t(n));
    entry.images = spans_;
    last_prompt_sampling(entry);
    return true;
  }
  entry.tokens = std::span<const int32_t>(fed_, 1);
  if (drafter_) {
    const std::vector<int32_t> drafts = next_drafts();
    if (!drafts.empty()) {
      verify_.assign(1, fed_[0]);
      verify_.insert(verify_.end(), drafts.begin(), drafts.end());
      entry.tokens = verify_;
      entry.all_logits = true;
      entry.keep_states = true;
      entry.logits = &verify_logits_;
      if (device_ok_ && !sampling_.mask) {  // the rows' ids sampled on the device where the backend can
        entry.sampling = &sampling_;
        entry.sampled_rows = &verify_ids_;
      }
      return true;
    }
  }
  if (device_ok_) entry.sampling = &sampling_;
  return true;
}

// The prompt's last chunk: its first token drawn on the device where the request allows, as the decode steps' are,
// so that neither a copy of the logits nor the host's passes over the vocabulary come before it.
void GenerationRun::last_prompt_sampling(BatchEntry& entry) {
  if (entry.tokens.size() == rest_.size() && spans_.empty() && gen_.options().use_device_sampling &&
      device_sampling_allowed(request_)) {
    sampling_ = device_sampling_at(step_);
    entry.sampling = &sampling_;
  }
}

// Whether prompt positions [from, to) hold any image token.
bool GenerationRun::holds_images(int64_t from, int64_t to) const {
  return std::any_of(request_.images.begin(), request_.images.end(),
                     [&](const PromptImage& im) { return im.offset < to && im.offset + im.tokens > from; });
}

// At most n of the prompt's next tokens, ending at the next multiple of checkpoint_every.
size_t GenerationRun::whole_chunk(size_t n) const {
  const int64_t every = request_.checkpoint_every, pos = session_.position();
  n = std::min(n, rest_.size());
  return every > 0 ? std::min<size_t>(n, size_t(every - pos % every)) : n;
}

// A prompt chunk in pieces of layers (BatchEntry::layer_limit): when the budget (prompt tokens through every layer)
// is less than the runner's chunk, the chunk runs whole and a budget's share of its layers each step, rather than
// shrinking (a shorter chunk costs more per token: each layer's fixed cost comes with every chunk); it shrinks only
// to the budget's tokens through every layer, so that one layer of it fits the budget, and ends at the first
// checkpoint inside it. Only a text chunk, on a runner that runs it so. The piece that reaches the last layer is the
// chunk's forward call and gives its output; until then the chunk stays part way (piece_tokens_). False: the chunk
// is not in pieces (next_step cuts it as usual).
bool GenerationRun::prompt_piece(BatchEntry& entry, int64_t budget, bool may_start) {
  const int L = gen_.runner().config().num_hidden_layers;
  size_t n = piece_tokens_;
  if (n == 0) {
    if (!may_start) return false;
    // The runner's chunk, or one that a single layer of fits the budget (a model of few layers).
    n = whole_chunk(size_t(std::min<int64_t>(chunk_, budget > INT64_MAX / L ? INT64_MAX : budget * L)));
    const int64_t pos = session_.position();
    for (int64_t at : request_.checkpoint_at)  // cut at the first checkpoint inside: a snapshot is taken there
      if (at > pos && at < pos + int64_t(n)) n = size_t(at - pos);
    if (budget >= int64_t(n) || L < 2 || holds_images(pos, pos + int64_t(n)) ||
        !gen_.runner().runs_layers_apart(session_, int64_t(n)))
      return false;
  }
  const int left = piece_tokens_ ? session_.layers_pending() : L;
  TERN_INTERNAL_CHECK(left > 0, "generation: the chunk part way has no layers left");
  const int layers = budget >= int64_t(n) ? L : int(std::max<int64_t>(1, budget * L / int64_t(n)));
  entry.tokens = rest_.first(n);
  if (layers < left) {
    entry.layer_limit = layers;
    work_ = (int64_t(n) * layers + L - 1) / L;
    return true;
  }
  work_ = (int64_t(n) * left + L - 1) / L;  // the last piece: the chunk's forward call (text only: no spans)
  spans_.clear();
  last_prompt_sampling(entry);
  return true;
}

// The prompt chunk from `pos` of at most n tokens, cut at the checkpoint_at positions inside it: at the first one, or
// (where the runner keeps a state inside a call of the chunk's tokens, and on_kept_checkpoint takes it) at the
// second, the first kept by the session (Session::keep_state_at) for after_prompt_chunk. A chunk that holds image
// tokens is always cut.
size_t GenerationRun::cut_at_checkpoints(int64_t pos, size_t n) {
  const int64_t n_prompt = int64_t(request_.prompt.size());
  std::vector<int64_t> inside;  // checkpoints strictly inside the chunk, in order
  for (int64_t at : request_.checkpoint_at)
    if (at > pos && at < pos + int64_t(n) && at < n_prompt) inside.push_back(at);
  if (inside.empty()) return n;
  std::sort(inside.begin(), inside.end());
  inside.erase(std::unique(inside.begin(), inside.end()), inside.end());
  const size_t kept_n = inside.size() > 1 ? size_t(inside[1] - pos) : n;  // the chunk when the first is kept
  if (request_.on_kept_checkpoint && gen_.runner().keeps_state_inside(int64_t(kept_n)) &&
      !holds_images(pos, pos + int64_t(kept_n))) {
    session_.keep_state_at(inside[0]);
    kept_at_ = inside[0];
    return kept_n;
  }
  return size_t(inside[0] - pos);
}

// At most as many drafts as the step could use: draft i guesses the token i places after the fed one (whose index
// is step_), so max_tokens leaves max_tokens - step_ - 1 of them, the session has room for its capacity -
// position - 1 and the backend verifies max_verify_tokens() - 1; cut after an end id that would end the output
// (nothing follows it; under ignore_eos only one a grammar accepts can) and before the first token the output
// constraint refuses (the mask would reject it: a sure loss).
std::vector<int32_t> GenerationRun::next_drafts() {
  const uint64_t left = max_tokens_ - std::min(max_tokens_, step_ + 1);
  const int64_t room = session_.capacity() - session_.position() - 1;
  const int64_t limit = std::min({room, int64_t(std::min<uint64_t>(left, uint64_t(INT64_MAX))),
                                   gen_.runner().max_verify_tokens() - 1});
  std::vector<int32_t> d = drafter_->draft(std::max<int64_t>(0, limit));  // also at 0: the step comes all the same
  if (limit <= 0) return {};
  std::optional<OutputConstraint> trial;
  if (constraint_) trial.emplace(constraint_->fork());
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] < 0 || d[i] >= vocab_ ||
        (trial && !trial->accept(d[i], gen_.text_source().bytes(d[i])))) {
      d.resize(i);
      break;
    }
    if ((!request_.ignore_eos || constraint_) &&
        std::binary_search(gen_.end_ids().begin(), gen_.end_ids().end(), d[i])) {
      d.resize(i + 1);
      break;
    }
  }
  return d;
}

// Row j of the logits is what a plain step after feeding verify_[0..j] gets: each row is chosen as that step
// would choose (the same sampler draw, mask, penalties, events and checks), and the rows go on while the choice
// equals the next draft. Under temperature > 0 this is the exact rule for a deterministic drafter: the draft x is
// kept with probability p(x), and otherwise the token is drawn from p without x, renormalised; seeded requests
// draw the very tokens they would without drafts. The session then goes back to the last fed token that was used.
void GenerationRun::verify_done(const BatchEntry& entry) {
  const int64_t T = int64_t(verify_.size());
  const bool sampled = entry.sampled_rows && !verify_ids_.empty();
  size_t V = 0;
  if (sampled) {
    TERN_INTERNAL_CHECK(int64_t(entry.tokens.size()) == T && T >= 2 && int64_t(verify_ids_.size()) == T,
                        "the verify step sampled ", verify_ids_.size(), " ids for ", T, " tokens");
    for (int32_t id : verify_ids_)
      TERN_INTERNAL_CHECK(id >= 0 && id < vocab_, "the backend sampled token ", id, ", outside the vocabulary [0, ",
                          vocab_, ")");
  } else {
    TERN_INTERNAL_CHECK(int64_t(entry.tokens.size()) == T && T >= 2 && verify_logits_.size() % size_t(T) == 0,
                        "the verify step returned ", verify_logits_.size(), " logits for ", T, " tokens");
    V = verify_logits_.size() / size_t(T);
    TERN_INTERNAL_CHECK(int64_t(V) >= vocab_, "the backend returned ", V, " logits for a vocabulary of ", vocab_);
  }
  const int64_t pos0 = session_.position() - T;
  int accepted = 0;
  int64_t j = 0;
  for (; j < T; ++j) {
    if (!sampled)
      logits_.assign(verify_logits_.begin() + ptrdiff_t(size_t(j) * V),
                     verify_logits_.begin() + ptrdiff_t(size_t(j + 1) * V));
    ++step_;
    verify_pos_ = pos0 + j + 1;
    chosen_ = -1;
    choose_token(sampled ? std::optional<int32_t>(verify_ids_[size_t(j)]) : std::nullopt);
    const bool match = j + 1 < T && chosen_ == verify_[size_t(j + 1)];
    if (match) ++accepted;
    if (finished_ || !match) break;
  }
  verify_pos_ = -1;
  const int64_t keep = pos0 + std::min(j + 1, T);
  // Also at the end of the request with every token kept (a rollback to the position copies nothing): the session
  // then waits in the prefix cache, and the verify's kept states (on CUDA a buffer of the runner's pool, ~66 MB per
  // token) are released now rather than at its next forward, so that only running sequences hold them.
  if (keep < session_.position() || finished_) session_.rollback(keep);
  result_.draft_tokens += T - 1;
  result_.accepted_draft_tokens += accepted;
  ++result_.verify_steps;
  drafter_->record(int(T - 1), accepted);
}

void GenerationRun::step_done(const BatchEntry& entry) {
  TERN_INTERNAL_CHECK(!finished_, "generation: a step after the end");
  if (entry.error) {
    finished_ = true;
    std::rethrow_exception(entry.error);
  }
  if (!rest_.empty()) {
    piece_tokens_ = entry.layers_left > 0 ? entry.tokens.size() : 0;
    if (piece_tokens_ == 0) after_prompt_chunk(entry);  // else the chunk is part way: nothing out yet
    return;
  }
  if (entry.keep_states) return verify_done(entry);
  std::optional<int32_t> device_id = entry.sampled;
  if (device_id) {
    TERN_INTERNAL_CHECK(*device_id >= 0 && *device_id < vocab_, "the backend sampled token ", *device_id,
                        ", outside the vocabulary [0, ", vocab_, ")");
  } else if (entry.sampling) {
    device_ok_ = false;  // this backend has no device sampler: use the host one from now on
  }
  ++step_;
  choose_token(device_id);
}

// The spans of the images that the chunk [pos, pos + n) holds, each image encoded when a chunk first reaches it.
void GenerationRun::image_spans(int64_t pos, int64_t n) {
  spans_.clear();
  for (size_t i = 0; i < request_.images.size(); ++i) {
    const PromptImage& im = request_.images[i];
    std::optional<ImageSpan> span = image_span_within(im.offset, im.tokens, pos, pos + n);
    if (!span) continue;
    if (!encoded_[i]) encoded_[i] = std::make_unique<ImageEmbeddings>(gen_.runner().encode_image(*im.pixels));
    span->image = encoded_[i].get();
    spans_.push_back(*span);
  }
}

void GenerationRun::release_fed_images() {
  for (size_t i = 0; i < encoded_.size(); ++i) {
    const PromptImage& im = request_.images[i];
    if (encoded_[i] && im.offset + im.tokens <= session_.position()) encoded_[i].reset();
  }
}

void GenerationRun::after_prompt_chunk(const BatchEntry& entry) {
  rest_ = rest_.subspan(entry.tokens.size());
  if (drafter_ && !rest_.empty()) drafter_->after_prompt_chunk();  // the last chunk's: after its first token, below
  spans_.clear();
  release_fed_images();
  report_prompt_progress();
  const int64_t pos = session_.position(), every = request_.checkpoint_every;
  const bool checkpoint =
      request_.on_checkpoint &&
      (rest_.empty() || (every > 0 && pos % every == 0) ||
       std::find(request_.checkpoint_at.begin(), request_.checkpoint_at.end(), pos) != request_.checkpoint_at.end());
  // The checkpoint the session kept inside this chunk (cut_at_checkpoints), if the runner kept it.
  const bool kept = std::exchange(kept_at_, -1) >= 0;
  if (!rest_.empty()) {
    if (kept) request_.on_kept_checkpoint(session_);
    if (checkpoint) request_.on_checkpoint(session_);
    return;
  }
  // The first token: the device's draw (next_step asked for it), else from the logits.
  const std::optional<int32_t> device_id = entry.sampled;
  if (device_id)
    TERN_INTERNAL_CHECK(*device_id >= 0 && *device_id < vocab_, "the backend sampled token ", *device_id,
                        ", outside the vocabulary [0, ", vocab_, ")");
  else
    TERN_INTERNAL_CHECK(int64_t(logits_.size()) >= vocab_, "the backend returned ", logits_.size(),
                        " logits for a vocabulary of ", vocab_);
  // The decode loop starts: text output, device sampling when the request allows it (and the backend has it). The
  // first token goes out before the prompt-end snapshot is taken (the session is still at the prompt's end: nothing is
  // fed until the next step), so that the client does not wait for the copy.
  text_.emplace(request_.stop);
  device_ok_ = gen_.options().use_device_sampling && device_sampling_allowed(request_) &&
               !(entry.sampling && !device_id);
  t_decode_ = Clock::now();
  choose_token(device_id);
  // The drafter follows the prompt's last chunk (the MTP head over its positions) once the first token is out: not in
  // the time to first token. finish_decode has done it when the run ended at that token.
  if (drafter_ && !finished_) drafter_->after_prompt_chunk();
  if (kept) request_.on_kept_checkpoint(session_);
  if (checkpoint) request_.on_checkpoint(session_);
}

// One iteration of the decode loop at step_: the next id from the last logits (or the device's), the checks, the
// event; then either the run ends or fed_ is what the next step feeds.
void GenerationRun::choose_token(std::optional<int32_t> device_id) {
  const GenerationRequest& request = request_;
  const uint64_t step = step_;
  const auto is_end = [&](int32_t id) {
    return !request.ignore_eos && std::binary_search(gen_.end_ids().begin(), gen_.end_ids().end(), id);
  };
  if (step >= max_tokens_) {
    result_.finish = FinishReason::length;
    return finish_decode();
  }
  SampleInfo info;
  int32_t id = device_id ? *device_id : -1;
  if (id < 0) {
    id = sampler_->sample(logits_, want_logprobs_ ? &info : nullptr,
                          constraint_ ? constraint_->fill() : std::span<const uint32_t>());
  }
  bool forced = budget_->forcing() || step < request.forced_tokens.size();
  if (forced) {
    id = budget_->forcing() ? budget_->next_forced() : request.forced_tokens[step];
    if (want_logprobs_) info.logprob = sampler_->last_logprob(logits_, id);
  } else if (marker_next_ >= 0 || (constraint_ && !constraint_->active() && is_end(id) &&
                                   !request.grammar_start_tokens.empty())) {
    // The model ends inside its reasoning while the constrained answer is still due: the marker that starts the
    // constraint takes the end id's place (and the next steps', for a marker of several tokens).
    if (marker_next_ < 0) marker_next_ = 0;
    id = request.grammar_start_tokens[size_t(marker_next_)];
    if (size_t(++marker_next_) == request.grammar_start_tokens.size()) marker_next_ = -1;
    forced = true;
    if (want_logprobs_) info.logprob = sampler_->last_logprob(logits_, id);
  }
  const TokenTextSource& text_source = gen_.text_source();
  budget_->accept(text_source.bytes(id));
  bool grammar_ended = false;  // an end id the grammar accepted ends the output even with ignore_eos
  if (constraint_) {
    const bool was_active = constraint_->active();
    // A forced token the grammar refuses is the request's (its forced output); a sampled one is the backend's fault.
    const bool accepted = constraint_->accept(id, text_source.bytes(id));
    TERN_CHECK(accepted || !forced, "forced token ", id, ", which the output constraint does not allow");
    TERN_INTERNAL_CHECK(accepted, "the backend sampled token ", id,
                        ", which the output constraint does not allow (its sampler ignored the mask)");
    grammar_ended = was_active && constraint_->done() &&
                    std::binary_search(gen_.end_ids().begin(), gen_.end_ids().end(), id);
  }
  if (first_) {
    result_.prefill_s = seconds_since(t0_);
    t_decode_ = Clock::now();
    first_ = false;
  }
  sampler_->accept(id);
  result_.tokens.push_back(id);
  chosen_ = id;
  if (drafter_) drafter_->append(id);

  if (is_end(id) || grammar_ended) {
    result_.stop_id = id;
    result_.finish = FinishReason::stop;
    return finish_decode();
  }
  TokenEvent ev;
  ev.id = id;
  ev.index = int64_t(step);
  ev.has_logprobs = want_logprobs_;
  ev.logprob = info.logprob;
  ev.top_logprobs = std::move(info.top);
  const bool skip = request.skip_special_tokens && text_source.is_special(id);
  const bool stopped = text_->push(skip ? std::string() : text_source.bytes(id), ev.text);
  result_.text += ev.text;
  if (on_token_ && !on_token_(ev)) {
    callback_stopped_ = true;
    result_.finish = FinishReason::cancelled;
    return finish_decode();
  }
  if (stopped) {
    result_.stop_string = text_->matched_stop();
    result_.finish = FinishReason::stop;
    return finish_decode();
  }
  if (!request.forced_tokens.empty() && step + 1 == request.forced_tokens.size()) {
    result_.finish = FinishReason::stop;
    result_.message = "the forced tokens ended";
    return finish_decode();
  }
  if (step + 1 >= max_tokens_) {
    result_.finish = FinishReason::length;
    return finish_decode();
  }
  if (cancelled()) {
    result_.finish = FinishReason::cancelled;
    return finish_decode();
  }
  if (held_position() + 1 > session_.capacity()) {
    result_.finish = FinishReason::context;
    result_.message = detail::concat("the context limit of ", session_.capacity(), " tokens was reached");
    return finish_decode();
  }
  // The next step feeds the id and gets the next logits (or the next id straight from the device).
  fed_[0] = id;
  if (device_ok_) sampling_ = device_sampling_at(step + 1);
}

// The device's draw of output token `step` (ModelRunner::forward_sample): the request's parameters and seed, the
// output constraint's mask while it is active.
DeviceSampling GenerationRun::device_sampling_at(uint64_t step) {
  const SamplingParams& p = request_.sampling;
  return DeviceSampling{.temperature = p.greedy() ? 0.0f : p.temperature,
                        .top_k = std::max(0, p.top_k),
                        .top_p = p.top_p,
                        .min_p = p.min_p,
                        .seed = sampler_->seed(),
                        .step = step,
                        .mask = constraint_ && constraint_->active() ? &*constraint_ : nullptr};
}

void GenerationRun::finish_decode() {
  finished_ = true;
  if (drafter_) drafter_->finish();
  if (first_) result_.prefill_s = seconds_since(t0_);
  else result_.decode_s = seconds_since(t_decode_);
  // Release held-back text (a partial stop string that never completed, an incomplete UTF-8 tail).
  if (!callback_stopped_ && result_.stop_string.empty()) {
    TokenEvent ev;
    ev.id = -1;
    ev.index = int64_t(result_.tokens.size());
    text_->finish(ev.text);
    if (!ev.text.empty()) {
      result_.text += ev.text;
      if (on_token_) on_token_(ev);
    }
  }
  result_.completion_tokens = int64_t(result_.tokens.size());
  result_.reasoning_tokens = budget_->reasoning_tokens();
  result_.reasoning_cut = budget_->cut();
}

}  // namespace tern
