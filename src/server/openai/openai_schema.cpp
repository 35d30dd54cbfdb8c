#include "server/openai/openai_schema.h"

#include <cmath>
#include <limits>

#include "core/check.h"
#include "server/serving/request_fields.h"
#include "server/serving/request_images.h"

namespace tern::server {

namespace {

using namespace request_fields;  // bad(), field(), get_integer(), ... shared with the other request parsers

std::optional<bool> get_bool(const Json& o, const char* key) {
  const Json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(key, std::string("'") + key + "' must be a boolean, got " + json_kind(*v) + ".");
  return v->get<bool>();
}

std::optional<std::string> get_string(const Json& o, const char* key) {
  const Json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad(key, std::string("'") + key + "' must be a string, got " + json_kind(*v) + ".");
  return v->get<std::string>();
}

void check_model(const Json& j, const ParseOptions& options, std::string& model) {
  model = get_string(j, "model").value_or(options.model_id);
  if (!model_name_served(options, model))
    throw BadRequest{api_error_not_found_model(model, options.model_id)};
  model = options.model_id;
}

void check_n(const Json& j) {
  if (auto n = get_integer(j, "n", 1, 1)) (void)n;
}

// stream, stream_options.include_usage
void parse_stream(const Json& j, bool& stream, bool& include_usage) {
  stream = get_bool(j, "stream").value_or(false);
  if (const Json* so = field(j, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object, got " + json_kind(*so) + ".");
    auto it = so->find("include_usage");
    if (it != so->end() && !it->is_null()) {
      if (!it->is_boolean()) bad("stream_options.include_usage", "'stream_options.include_usage' must be a boolean.");
      include_usage = it->get<bool>();
    }
  }
}

void parse_sampling(const Json& j, const ParseOptions& options, SamplingOverrides& s) {
  if (auto v = get_number(j, "temperature", 0.0, 2.0)) s.temperature = float(*v);
  if (auto v = get_number(j, "top_p", 0.0, 1.0, /*lo_open=*/true)) s.top_p = float(*v);
  if (auto v = get_number(j, "min_p", 0.0, 1.0)) s.min_p = float(*v);
  if (auto v = get_number(j, "presence_penalty", -2.0, 2.0)) s.presence_penalty = float(*v);
  if (auto v = get_number(j, "frequency_penalty", -2.0, 2.0)) s.frequency_penalty = float(*v);
  if (auto v = get_number(j, "repetition_penalty", 0.0, 10.0, /*lo_open=*/true)) s.repetition_penalty = float(*v);
  if (auto v = get_integer(j, "top_k", -1, 1000000)) s.top_k = int(*v);
  if (const Json* v = field(j, "seed")) {
    if (v->is_number_unsigned()) s.seed = v->get<uint64_t>();
    else if (v->is_number_integer()) s.seed = uint64_t(v->get<int64_t>());
    else bad("seed", "'seed' must be an integer, got " + json_kind(*v) + (v->is_number() ? " " + v->dump() : "") + ".");
  }
  if (const Json* v = field(j, "logit_bias")) {
    if (!v->is_object()) bad("logit_bias", "'logit_bias' must be an object mapping token ids to numbers in [-100, 100].");
    if (v->size() > 1024) bad("logit_bias", "'logit_bias' may hold at most 1024 entries.");
    for (const auto& [key, bias] : v->items()) {
      int64_t id = -1;
      if (!key.empty() && key.size() <= 10 && key.find_first_not_of("0123456789") == std::string::npos) id = std::stoll(key);
      if (id < 0 || (options.vocab_size > 0 && id >= options.vocab_size))
        bad("logit_bias", "'logit_bias' keys must be token ids in [0, " + std::to_string(options.vocab_size) +
                              "), got \"" + key + "\".");
      if (!bias.is_number() || !std::isfinite(bias.get<double>()) || bias.get<double>() < -100 || bias.get<double>() > 100)
        bad("logit_bias", "'logit_bias' values must be numbers in [-100, 100] (token " + key + ").");
      s.logit_bias[int32_t(id)] = bias.get<float>();
    }
  }
}

std::vector<std::string> parse_stop(const Json& j) {
  std::vector<std::string> out;
  const Json* v = field(j, "stop");
  if (!v) return out;
  if (v->is_string()) {
    if (!v->get<std::string>().empty()) out.push_back(v->get<std::string>());
    return out;
  }
  if (!v->is_array()) bad("stop", "'stop' must be a string or an array of up to 4 strings, got " + json_kind(*v) + ".");
  if (v->size() > 4) bad("stop", "'stop' may hold at most 4 strings, got " + std::to_string(v->size()) + ".");
  for (const Json& s : *v) {
    if (!s.is_string()) bad("stop", "'stop' must be a string or an array of up to 4 strings; an entry is " + json_kind(s) + ".");
    if (!s.get<std::string>().empty()) out.push_back(s.get<std::string>());
  }
  return out;
}

std::optional<Json> parse_content(const Json& content, const std::string& param, std::vector<RequestImage>* images);

// Predicted Outputs: {"type": "content", "content": a string or text parts}; null or absent: none.
std::optional<std::string> parse_prediction(const Json& j) {
  const Json* p = field(j, "prediction");
  if (!p || p->is_null()) return std::nullopt;
  if (!p->is_object())
    bad("prediction", "'prediction' must be an object like {\"type\": \"content\", \"content\": \"...\"}, got " +
                          json_kind(*p) + ".");
  const Json* type = field(*p, "type");
  if (!type || !type->is_string() || type->get<std::string>() != "content")
    bad("prediction.type", "'prediction.type' must be \"content\".");
  const Json* content = field(*p, "content");
  if (!content || content->is_null()) bad("prediction.content", "'prediction.content' is required.");
  return parse_content(*content, "prediction.content", nullptr)->get<std::string>();
}

std::optional<std::string> parse_forced_output(const Json& j, const ParseOptions& options) {
  auto forced = get_string(j, "tern_debug_forced_output");
  if (forced && !options.allow_forced_output)
    bad("tern_debug_forced_output",
        "'tern_debug_forced_output' is a test-only option; start the server with --debug-allow-forced-output to use it.");
  return forced;
}

// An image_url part's image: {"type": "image_url", "image_url": {"url": "data:...", "detail": ...}} (the url alone
// as a string is accepted too).
RequestImage parse_image_url_part(const Json& part, const std::string& p) {
  auto it = part.find("image_url");
  if (it == part.end()) bad(p + ".image_url", "'" + p + ".image_url' is required: {\"url\": \"data:image/png;base64,...\"}.");
  if (it->is_string()) return request_image_from_url(it->get<std::string>(), p + ".image_url");
  const Json* url = it->is_object() ? field(*it, "url") : nullptr;
  if (!url || !url->is_string())
    bad(p + ".image_url.url", "'" + p + ".image_url.url' must be a string: a data: URL (data:image/png;base64,...).");
  if (const Json* detail = field(*it, "detail"); detail && !detail->is_string())
    bad(p + ".image_url.detail", "'" + p + ".image_url.detail' must be a string (auto, low or high).");
  return request_image_from_url(url->get<std::string>(), p + ".image_url.url");
}

// A message's content: a string, null, or an array of {"type":"text","text":...} parts (joined as the template
// joins them: with nothing in between) and, where `images` takes them (user messages), image_url parts, appended
// to `images` and left in the content as {"type": "image"} parts (MessageContent).
std::optional<Json> parse_content(const Json& content, const std::string& param, std::vector<RequestImage>* images) {
  if (content.is_null()) return std::nullopt;
  if (content.is_string()) return content;
  if (!content.is_array()) bad(param, "'" + param + "' must be a string or an array of text parts, got " + json_kind(content) + ".");
  MessageContent out;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    const std::string p = param + "[" + std::to_string(i) + "]";
    if (!part.is_object()) bad(p, "'" + p + "' must be an object like {\"type\": \"text\", \"text\": \"...\"}.");
    const std::string type = part.contains("type") && part["type"].is_string() ? part["type"].get<std::string>() : "";
    if (type == "image_url" && images) {
      images->push_back(parse_image_url_part(part, p));
      out.add_image();
      continue;
    }
    if (type == "image_url" || type == "image" || type == "input_image")
      bad(p, "'" + p + "' is a " + type + " part: images are read in user messages, as image_url parts "
                                         "({\"type\": \"image_url\", \"image_url\": {\"url\": \"data:...\"}}).");
    if (type == "video" || type == "video_url" || type == "input_audio" || type == "audio" || type == "file")
      bad(p, "'" + p + "' is a " + type + " part: video, audio and files are not supported (text and images only).");
    if (type != "text") bad(p, "'" + p + "' has type '" + type + "'; only \"text\" and \"image_url\" parts are supported.");
    auto it = part.find("text");
    if (it == part.end() || !it->is_string()) bad(p + ".text", "'" + p + ".text' must be a string.");
    out.add_text(it->get<std::string>());
  }
  return out.json();
}

Json parse_tool_calls(const Json& calls, const std::string& param) {
  if (!calls.is_array()) bad(param, "'" + param + "' must be an array, got " + json_kind(calls) + ".");
  Json out = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    const Json& call = calls[i];
    if (!call.is_object()) bad(p, "'" + p + "' must be an object.");
    auto fn = call.find("function");
    if (fn == call.end() || !fn->is_object()) bad(p + ".function", "'" + p + ".function' must be an object with 'name' and 'arguments'.");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
      bad(p + ".function.name", "'" + p + ".function.name' must be a non-empty string.");
    Json arguments = Json::object();
    auto args = fn->find("arguments");
    if (args != fn->end() && !args->is_null()) {
      if (args->is_object()) {
        arguments = *args;
      } else if (args->is_string()) {  // the OpenAI form: a JSON text of an object
        const std::string& text = args->get_ref<const std::string&>();
        Json parsed = text.empty() ? Json::object() : Json::parse(text, nullptr, false);
        if (parsed.is_discarded() || !parsed.is_object())
          bad(p + ".function.arguments", "'" + p + ".function.arguments' must be a JSON object or a string holding one.");
        arguments = std::move(parsed);
      } else {
        bad(p + ".function.arguments", "'" + p + ".function.arguments' must be a JSON object or a string holding one.");
      }
    }
    Json c = Json::object();
    if (call.contains("id") && call["id"].is_string()) c["id"] = call["id"];
    c["type"] = "function";
    c["function"] = Json{{"name", *name}, {"arguments", std::move(arguments)}};
    out.push_back(std::move(c));
  }
  return out;
}

Json parse_messages(const Json& j, std::vector<RequestImage>& images) {
  const Json* messages = field(j, "messages");
  if (!messages) bad("messages", "'messages' is required: a non-empty array of {role, content} objects.");
  if (!messages->is_array() || messages->empty())
    bad("messages", "'messages' must be a non-empty array of {role, content} objects.");
  if (messages->size() > 100000) bad("messages", "'messages' holds too many entries (at most 100000).");
  Json out = Json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const std::string p = "messages[" + std::to_string(i) + "]";
    const Json& m = (*messages)[i];
    if (!m.is_object()) bad(p, "'" + p + "' must be an object with 'role' and 'content'.");
    auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string()) bad(p + ".role", "'" + p + ".role' must be one of system, developer, user, assistant, tool.");
    std::string role = role_it->get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      bad(p + ".role", "'" + p + ".role' is '" + role + "'; it must be one of system, developer, user, assistant, tool.");
    Json msg = Json::object();
    msg["role"] = role;
    auto content_it = m.find("content");
    std::optional<Json> content;
    if (content_it != m.end()) content = parse_content(*content_it, p + ".content", role == "user" ? &images : nullptr);
    if (role == "assistant") {
      msg["content"] = content.value_or(Json(""));
      for (const char* key : {"reasoning_content", "reasoning"}) {
        auto it = m.find(key);
        if (it == m.end() || it->is_null()) continue;
        if (!it->is_string()) bad(p + "." + key, "'" + p + "." + key + "' must be a string.");
        msg["reasoning_content"] = *it;
      }
      auto calls = m.find("tool_calls");
      if (calls != m.end() && !calls->is_null()) {
        Json parsed = parse_tool_calls(*calls, p + ".tool_calls");
        if (!parsed.empty()) msg["tool_calls"] = std::move(parsed);
      }
    } else {
      if (!content) bad(p + ".content", "'" + p + ".content' is required for role " + role + ": a string or an array of text parts.");
      msg["content"] = *content;
    }
    if (role == "tool") {
      auto id = m.find("tool_call_id");
      if (id != m.end() && id->is_string()) msg["tool_call_id"] = *id;
    }
    auto name = m.find("name");
    if (name != m.end() && name->is_string()) msg["name"] = *name;
    out.push_back(std::move(msg));
  }
  return out;
}

void parse_tool_choice(const Json& j, ChatRequest& r) {
  const Json* v = field(j, "tool_choice");
  if (v) {
    if (v->is_string()) {
      r.tool_choice = tool_choice_word(v->get<std::string>(), "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    } else if (v->is_object()) {
      auto fn = v->find("function");
      auto name = fn != v->end() && fn->is_object() ? fn->find("name") : v->end();
      if (fn == v->end() || !fn->is_object() || name == fn->end() || !name->is_string())
        bad("tool_choice", "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}.");
      r.tool_choice = ToolChoice::tool_choice_named;
      r.tool_choice_name = name->get<std::string>();
    } else {
      bad("tool_choice", "'tool_choice' must be a string or an object, got " + json_kind(*v) + ".");
    }
  }
  keep_chosen_tools(r, "tool_choice", "'tool_choice' names the function '" + r.tool_choice_name + "', which is not in 'tools'.");
  r.parallel_tool_calls = get_bool(j, "parallel_tool_calls").value_or(true);
}

// A schema the grammar compiler refused: 400 naming the keyword, with `param` the request field it came from.
[[noreturn]] void bad_schema(const std::string& param, const std::string& where, const grammar::SchemaError& e) {
  std::string message = "'" + where + "' cannot be used as an output constraint: " + e.what();
  if (!e.keyword().empty() && message.find(e.keyword()) == std::string::npos)
    message += " (keyword '" + e.keyword() + "')";
  bad(param, message);
}

void parse_response_format(const Json& j, ChatRequest& r) {
  const Json* v = field(j, "response_format");
  if (!v) return;
  if (!v->is_object() || !v->contains("type") || !(*v)["type"].is_string())
    bad("response_format", "'response_format' must be an object like {\"type\": \"text\"}, {\"type\": \"json_object\"} "
                           "or {\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}.");
  const std::string type = (*v)["type"].get<std::string>();
  if (type == "text") return;
  if (type == "json_object") {
    r.response_format = ResponseFormat::json_object;
    return;
  }
  if (type != "json_schema")
    bad("response_format", "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got '" + type + "'.");
  r.response_format = ResponseFormat::json_schema;
  auto js = v->find("json_schema");
  if (js == v->end() || !js->is_object())
    bad("response_format", "'response_format.json_schema' must be an object with 'name' and 'schema'.");
  auto name = js->find("name");
  if (name != js->end() && !name->is_null()) {
    if (!name->is_string() || name->get<std::string>().empty() || name->get<std::string>().size() > 64)
      bad("response_format", "'response_format.json_schema.name' must be a non-empty string of at most 64 characters.");
    r.response_schema_name = name->get<std::string>();
  }
  auto strict = js->find("strict");
  if (strict != js->end() && !strict->is_null() && !strict->is_boolean())
    bad("response_format", "'response_format.json_schema.strict' must be a boolean.");
  auto schema = js->find("schema");
  if (schema == js->end() || schema->is_null())
    bad("response_format", "'response_format.json_schema.schema' is required: a JSON Schema object.");
  if (!schema->is_object() && !schema->is_boolean())
    bad("response_format", "'response_format.json_schema.schema' must be a JSON Schema object, got " + json_kind(*schema) + ".");
}

// The output constraint of the request (see ChatRequest::grammar). Run after the tools, tool_choice and
// response_format are parsed.
void compile_constraint(ChatRequest& r, const Json& j) {
  const bool forced_call =
      r.tool_choice == ToolChoice::tool_choice_required || r.tool_choice == ToolChoice::tool_choice_named;
  if (forced_call) {
    std::vector<grammar::ToolSpec> specs;
    for (const Json& t : r.tools) {
      const Json& fn = t["function"];
      auto params = fn.find("parameters");
      const bool has = params != fn.end() && !params->is_null();
      // ordered_parameters: the properties are generated in the schema's order (nlohmann::json sorts keys)
      specs.push_back({fn["name"].get<std::string>(), has ? nlohmann::json(*params) : nlohmann::json::object(),
                       has ? Json(*params) : Json::object()});
    }
    try {
      r.grammar = grammar::compile_tool_calls(specs, r.parallel_tool_calls);
    } catch (const grammar::SchemaError& e) {
      bad_schema("tools", "tools[].function.parameters", e);
    } catch (const Error& e) {
      bad("tools", "'tools' cannot be used to force a tool call: " + strip_error_location(e.what()));
    }
    return;
  }
  if (r.response_format == ResponseFormat::text) return;
  try {
    if (r.response_format == ResponseFormat::json_object) {
      r.grammar = grammar::compile_json_object();
    } else {
      r.grammar = grammar::compile_json_schema(j["response_format"]["json_schema"]["schema"]);  // ordered: schema order
    }
  } catch (const grammar::SchemaError& e) {
    bad_schema("response_format", "response_format.json_schema.schema", e);
  } catch (const Error& e) {
    bad("response_format", "'response_format' cannot be used as an output constraint: " + strip_error_location(e.what()));
  }
}

void parse_template_kwargs(const Json& j, ChatRequest& r) {
  if (const Json* v = field(j, "chat_template_kwargs")) {
    if (!v->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object, e.g. {\"enable_thinking\": false}.");
    r.chat_template_kwargs = *v;
    for (const char* key : {"enable_thinking", "preserve_thinking"}) {
      auto it = v->find(key);
      if (it != v->end() && !it->is_null() && !it->is_boolean())
        bad(std::string("chat_template_kwargs.") + key, std::string("'chat_template_kwargs.") + key + "' must be a boolean.");
    }
  }
  if (auto effort = get_string(j, "reasoning_effort")) {
    if (*effort != "none" && *effort != "minimal" && *effort != "low" && *effort != "medium" && *effort != "high")
      bad("reasoning_effort", "'reasoning_effort' must be one of none, minimal, low, medium, high, got '" + *effort + "'.");
    r.chat_template_kwargs["reasoning_effort"] = *effort;
    // The template has no effort levels: "none" turns thinking off unless the request said otherwise.
    if (*effort == "none" && !r.chat_template_kwargs.contains("enable_thinking"))
      r.chat_template_kwargs["enable_thinking"] = false;
  }
  r.thinking_budget = get_integer(j, "thinking_budget", 0, std::numeric_limits<int32_t>::max());
}

}  // namespace

std::variant<ChatRequest, ApiError> parse_chat_request(std::string_view body, const ParseOptions& options) {
  return request_fields::parse_or_error<ChatRequest>([&] {
    const Json j = parse_body(body, options);
    ChatRequest r;
    check_model(j, options, r.model);
    check_n(j);
    r.messages = parse_messages(j, r.images);
    r.continue_final_message = true;  // a last assistant message is a prefill, as llama.cpp and Anthropic read it
    r.tools = function_tools(j);
    parse_tool_choice(j, r);
    parse_stream(j, r.stream, r.include_usage);
    r.return_progress = get_bool(j, "return_progress").value_or(false);
    auto max_completion = get_integer(j, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max());
    auto max_tokens = get_integer(j, "max_tokens", 1, std::numeric_limits<int32_t>::max());
    r.max_tokens = max_completion ? max_completion : max_tokens;
    parse_sampling(j, options, r.sampling);
    r.stop = parse_stop(j);
    r.logprobs = get_bool(j, "logprobs").value_or(false);
    if (auto top = get_integer(j, "top_logprobs", 0, 20)) {
      if (!r.logprobs && *top > 0) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true.");
      r.top_logprobs = int(*top);
    }
    parse_response_format(j, r);
    parse_template_kwargs(j, r);
    r.truncate_prompt_tokens = get_integer(j, "truncate_prompt_tokens", 1, std::numeric_limits<int32_t>::max());
    r.forced_output = parse_forced_output(j, options);
    r.prediction = parse_prediction(j);
    compile_constraint(r, j);
    return r;
  });
}

std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body, const ParseOptions& options) {
  return request_fields::parse_or_error<CompletionRequest>([&] {
    const Json j = parse_body(body, options);
    CompletionRequest r;
    check_model(j, options, r.model);
    check_n(j);
    if (auto best_of = get_integer(j, "best_of", 1, 1)) (void)best_of;
    if (field(j, "suffix")) bad("suffix", "'suffix' is not supported.");
    const Json* prompt = field(j, "prompt");
    if (!prompt) bad("prompt", "'prompt' is required: a string, or an array of token ids.");
    const Json* p = prompt;
    if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
    if (p->is_string()) {
      r.prompt_text = p->get<std::string>();
      if (r.prompt_text.empty()) bad("prompt", "'prompt' must not be empty.");
    } else if (p->is_array()) {
      if (p->empty()) bad("prompt", "'prompt' must not be empty.");
      for (const Json& id : *p) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || (options.vocab_size > 0 && id.get<int64_t>() >= options.vocab_size))
          bad("prompt", "'prompt' as an array must hold one string or token ids in [0, " + std::to_string(options.vocab_size) + ").");
        r.prompt_ids.push_back(int32_t(id.get<int64_t>()));
      }
      r.prompt_is_ids = true;
    } else {
      bad("prompt", "'prompt' must be a string or an array of token ids (one prompt per request), got " + json_kind(*p) + ".");
    }
    parse_stream(j, r.stream, r.include_usage);
    r.return_progress = get_bool(j, "return_progress").value_or(false);
    r.max_tokens = get_integer(j, "max_tokens", 1, std::numeric_limits<int32_t>::max()).value_or(16);
    parse_sampling(j, options, r.sampling);
    r.stop = parse_stop(j);
    if (auto lp = get_integer(j, "logprobs", 0, 20)) r.logprobs = int(*lp);
    r.echo = get_bool(j, "echo").value_or(false);
    r.truncate_prompt_tokens = get_integer(j, "truncate_prompt_tokens", 1, std::numeric_limits<int32_t>::max());
    r.forced_output = parse_forced_output(j, options);
    return r;
  });
}

}  // namespace tern::server
