// POST /tokenize, POST /detokenize and GET /props, in the shapes llama.cpp's server gives them (tools and the
// chat page read them):
//
//   /tokenize   {"content": str, "add_special": false, "parse_special": true, "with_pieces": false}
//               -> {"tokens": [id, ...]}  or, with_pieces, {"tokens": [{"id": id, "piece": str | [bytes]}, ...]}
//               (its chat form, {"messages": [...]}, is openai_handlers' handle_tokenize_chat)
//   /detokenize {"tokens": [id, ...]} -> {"content": str}             (an id outside the vocabulary: 400)
//   /props      -> {"model", "aliases", "model_path", "n_ctx", "total_slots", "default_generation_settings",
//                   "chat_template", "random_weights", "build_info", "modalities": {"vision", "audio"}}
//
// add_special asks for the tokenizer's added BOS/EOS; Qwen's tokenizer adds none, so it changes nothing here.
// parse_special false tokenizes special-token texts (<|im_start|>, ...) as plain text.
#include "server/serving/util_handlers.h"

#include "core/check.h"
#include "server/serving/generation.h"
#include "server/serving/request_fields.h"
#include "server/serving/server_state.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tern::server {

namespace {

// The body as a JSON object once the model is ready; else nullopt with the 503 (loading) or 400 written to `res`.
std::optional<Json> ready_body_object(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  if (!model_ready(state, res)) return std::nullopt;
  if (json_nesting_depth(req.body, 64) > 64) {
    respond_error(res, api_error_invalid("", "The request body nests JSON deeper than 64 levels."));
    return std::nullopt;
  }
  Json j = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    respond_error(res, api_error_invalid("", "The request body must be one JSON object (valid UTF-8)."));
    return std::nullopt;
  }
  return j;
}

// An optional boolean field; false with a 400 written when it is something else.
bool read_flag(const Json& j, const char* key, bool& value, httplib::Response& res) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return true;
  if (!it->is_boolean()) {
    respond_error(res, api_error_invalid(key, std::string("'") + key + "' must be a boolean."));
    return false;
  }
  value = it->get<bool>();
  return true;
}

// A token's text for JSON: the string when it is valid UTF-8 on its own, else its bytes (as llama.cpp does).
Json piece_json(const std::string& bytes) {
  const Json s = bytes;
  try {
    (void)s.dump();
    return s;
  } catch (const Json::type_error&) {  // invalid UTF-8
    Json b = Json::array();
    for (unsigned char c : bytes) b.push_back(int(c));
    return b;
  }
}

}  // namespace

void handle_tokenize(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  request_log().route = "/tokenize";
  const std::optional<Json> j = ready_body_object(state, req, res);
  if (!j) return;
  auto content = j->find("content");
  if (content == j->end() || !content->is_string())
    return respond_error(res, api_error_invalid("content", "'content' is required: the text to tokenize (a string)."));
  bool add_special = false, parse_special = true, with_pieces = false;
  if (!read_flag(*j, "add_special", add_special, res) || !read_flag(*j, "parse_special", parse_special, res) ||
      !read_flag(*j, "with_pieces", with_pieces, res))
    return;
  const std::string& text = content->get_ref<const std::string&>();
  std::vector<int32_t> ids;
  try {
    ids = state.model.tokenizer->encode(text, /*special_as_text=*/!parse_special);
  } catch (const Error& e) {
    return respond_error(res, api_error_invalid("content", strip_error_location(e.what())));
  }
  Json tokens = Json::array();
  for (int32_t id : ids) {
    if (with_pieces) tokens.push_back(Json{{"id", id}, {"piece", piece_json(state.model.tokenizer->token_bytes(id))}});
    else tokens.push_back(id);
  }
  respond_json(res, Json{{"tokens", std::move(tokens)}});
}

void handle_detokenize(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  request_log().route = "/detokenize";
  const std::optional<Json> j = ready_body_object(state, req, res);
  if (!j) return;
  auto tokens = j->find("tokens");
  if (tokens == j->end() || !tokens->is_array())
    return respond_error(res, api_error_invalid("tokens", "'tokens' is required: an array of token ids."));
  const Tokenizer& tok = *state.model.tokenizer;
  std::vector<int32_t> ids;
  ids.reserve(tokens->size());
  for (size_t i = 0; i < tokens->size(); ++i) {
    const Json& t = (*tokens)[i];
    const bool integral = t.is_number_integer() || t.is_number_unsigned();
    const int64_t id = integral && !(t.is_number_unsigned() && t.get<uint64_t>() > uint64_t(INT32_MAX)) ? t.get<int64_t>() : -1;
    if (id < 0 || id >= tok.vocab_size() || !tok.contains(int32_t(id)))
      return respond_error(res, api_error_invalid("tokens", "'tokens[" + std::to_string(i) + "]' is " + t.dump() +
                                                                ": not a token id of this tokenizer (0 to " +
                                                                std::to_string(tok.vocab_size() - 1) + ")."));
    ids.push_back(int32_t(id));
  }
  respond_json(res, Json{{"content", tok.decode(ids)}});
}

void handle_props(ServerState& state, const httplib::Request&, httplib::Response& res) {
  request_log().route = "/props";
  if (!model_ready(state, res)) return;
  const ServerModel& m = state.model;
  const SamplingParams& d = m.defaults;
  Json settings = {{"temperature", d.temperature},
                   {"top_p", d.top_p},
                   {"top_k", d.top_k},
                   {"min_p", d.min_p},
                   {"presence_penalty", d.presence_penalty},
                   {"frequency_penalty", d.frequency_penalty},
                   {"repetition_penalty", d.repetition_penalty},
                   {"max_tokens", -1},  // -1: until the model stops or the context is full
                   {"thinking_budget", state.options.thinking_budget}};  // -1: no limit
  respond_json(res, Json{{"model", m.model_id},
                         {"aliases", m.aliases},
                         {"model_path", m.model_path},
                         {"n_ctx", m.context},
                         {"total_slots", 1},  // one generation at a time; others wait in the queue
                         {"prefix_cache_slots", state.options.prefix_cache.enabled ? state.options.prefix_cache.slots : 0},
                         {"max_queue", state.options.max_queue},
                         {"default_generation_settings", std::move(settings)},
                         {"chat_template", m.chat_template->source()},
                         {"random_weights", m.random_weights},
                         {"modalities", Json{{"vision", m.images.unavailable.empty()}, {"audio", false}}},
                         {"build_info", m.build_info}});
}

}  // namespace tern::server
