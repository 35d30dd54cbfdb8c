#include "engine/generator.h"

#include <algorithm>
#include <optional>

#include "core/check.h"
#include "engine/generation_run.h"
#include "text/tokenizer.h"

namespace tern {

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
  GenerationRun run(*this, session, request, on_token);
  BatchEntry entry;
  while (!run.finished()) {
    if (!run.next_step(entry, INT64_MAX)) break;
    runner_.forward_batch(std::span<BatchEntry>(&entry, 1));
    run.step_done(entry);
  }
  return run.take_result();
}

}  // namespace tern
