#include "server/openai/openai_response.h"

#include "text/tokenizer.h"

namespace tern::server {

Json prompt_progress_json(const TaskProgress& progress) {
  const PromptProgress& p = progress.prompt;
  Json j = {{"total", p.total},
            {"cache", p.cached},
            {"processed", p.processed},
            {"time_ms", int64_t(p.elapsed_s * 1000)}};
  if (progress.queued) {
    j["queued"] = true;
    j["queued_ahead"] = progress.queued_ahead;
  }
  return j;
}

Json usage_json(const GenerationResult& r) {
  Json u = {{"prompt_tokens", r.prompt_tokens},
            {"completion_tokens", r.completion_tokens},
            {"total_tokens", r.prompt_tokens + r.completion_tokens}};
  u["prompt_tokens_details"] = Json{{"cached_tokens", r.cached_tokens}};
  // Speculative decoding's drafts (the request's `prediction` and the server's own, --speculative): those the
  // model confirmed, and those it did not (work thrown away; not part of completion_tokens here).
  u["completion_tokens_details"] = Json{{"reasoning_tokens", r.reasoning_tokens},
                                        {"accepted_prediction_tokens", r.accepted_draft_tokens},
                                        {"rejected_prediction_tokens", r.draft_tokens - r.accepted_draft_tokens}};
  return u;
}

const char* finish_reason_text(FinishReason reason) {
  switch (reason) {
    case FinishReason::length:
    case FinishReason::context: return "length";
    default: return "stop";
  }
}

std::string token_text(const Tokenizer& tokenizer, int32_t id) {
  try {
    return tokenizer.token_bytes(id);
  } catch (const std::exception&) {
    return "";
  }
}

namespace {
Json bytes_json(const std::string& s) {
  Json b = Json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}
}  // namespace

Json chat_logprob_entry(const Tokenizer& tokenizer, const TokenEvent& event) {
  const std::string text = token_text(tokenizer, event.id);
  Json top = Json::array();
  for (const TokenLogprob& t : event.top_logprobs) {
    const std::string alt = token_text(tokenizer, t.id);
    top.push_back(Json{{"token", alt}, {"logprob", t.logprob}, {"bytes", bytes_json(alt)}});
  }
  return Json{{"token", text}, {"logprob", event.logprob}, {"bytes", bytes_json(text)}, {"top_logprobs", top}};
}

CompletionOutput::CompletionOutput(const CompletionRequest& request, const Tokenizer& tokenizer, ResponseMeta meta,
                                   std::string echo_text)
    : request_(request), tokenizer_(tokenizer), meta_(std::move(meta)), echo_text_(std::move(echo_text)) {}

Json CompletionOutput::chunk(const std::string& text, const Json& logprobs, const Json& finish_reason) const {
  Json choice = {{"index", 0}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish_reason}};
  Json c = {{"id", meta_.id},
            {"object", "text_completion"},
            {"created", meta_.created},
            {"model", meta_.model},
            {"choices", Json::array({choice})}};
  if (request_.include_usage) c["usage"] = nullptr;
  return c;
}

std::vector<Json> CompletionOutput::progress_chunks(const TaskProgress& progress) const {
  if (!request_.return_progress) return {};
  Json c = chunk("", nullptr, nullptr);
  c["prompt_progress"] = prompt_progress_json(progress);
  return {c};
}

// The legacy completions format: {"tokens","token_logprobs","top_logprobs":[{token: logprob}],"text_offset"}.
Json CompletionOutput::logprobs_of(const std::vector<TokenEvent>& events, size_t text_offset) const {
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(), offsets = Json::array();
  size_t offset = text_offset;
  for (const TokenEvent& e : events) {
    if (e.id < 0 || !e.has_logprobs) continue;
    tokens.push_back(token_text(tokenizer_, e.id));
    token_logprobs.push_back(e.logprob);
    Json alternatives = Json::object();
    for (const TokenLogprob& t : e.top_logprobs) alternatives[token_text(tokenizer_, t.id)] = t.logprob;
    top.push_back(alternatives);
    offsets.push_back(offset);
    offset += e.text.size();
  }
  return Json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

std::vector<Json> CompletionOutput::on_token(const TokenEvent& event) {
  std::vector<Json> out;
  const size_t offset = echo_text_.size() + text_.size();
  text_ += event.text;
  if (request_.logprobs >= 0) events_.push_back(event);
  std::string text = event.text;
  if (request_.echo && !echo_sent_) {
    text = echo_text_ + text;
    echo_sent_ = true;
  }
  const bool has_lp = request_.logprobs >= 0 && event.has_logprobs && event.id >= 0;
  if (text.empty() && !has_lp) return out;
  out.push_back(chunk(text, has_lp ? logprobs_of({event}, offset) : Json(nullptr), nullptr));
  return out;
}

std::vector<Json> CompletionOutput::finish_chunks(const GenerationResult& result) {
  std::vector<Json> out;
  std::string text;
  if (request_.echo && !echo_sent_) {
    text = echo_text_;
    echo_sent_ = true;
  }
  out.push_back(chunk(text, nullptr, finish_reason_text(result.finish)));
  if (request_.include_usage) {
    Json u = {{"id", meta_.id},   {"object", "text_completion"}, {"created", meta_.created},
              {"model", meta_.model}, {"choices", Json::array()}};
    u["usage"] = usage_json(result);
    out.push_back(std::move(u));
  }
  return out;
}

Json CompletionOutput::response(const GenerationResult& result) const {
  const std::string text = (request_.echo ? echo_text_ : std::string()) + text_;
  Json choice = {{"index", 0},
                 {"text", text},
                 {"logprobs", request_.logprobs >= 0 ? logprobs_of(events_, request_.echo ? echo_text_.size() : 0) : Json(nullptr)},
                 {"finish_reason", finish_reason_text(result.finish)}};
  return Json{{"id", meta_.id},
              {"object", "text_completion"},
              {"created", meta_.created},
              {"model", meta_.model},
              {"choices", Json::array({choice})},
              {"usage", usage_json(result)}};
}

}  // namespace tern::server
