#include "server/ollama/ollama_schema.h"

#include <cmath>
#include <limits>

#include "core/check.h"
#include "grammar/grammar.h"
#include "server/serving/request_fields.h"
#include "server/serving/request_images.h"

namespace tern::server {

namespace {

using namespace request_fields;  // bad(), field(), json_kind(), parse_body(), ... shared with the other parsers

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

ApiError model_not_found(const std::string& name) {
  ApiError e = api_error_not_found("model '" + name + "' not found");
  e.param = "model";
  return e;
}

// The request's model: required (Ollama answers 400 without one), and served. The name answers echo: as the request
// wrote it when it is one of the model's names (as Ollama does), else the served id.
std::string parse_model(const Json& j, const ParseOptions& options, const char* key = "model") {
  const Json* v = field(j, key);
  if (!v) bad(key, std::string("'") + key + "' is required: the model's name (GET /api/tags lists them).");
  if (!v->is_string()) bad(key, std::string("'") + key + "' must be a string, got " + json_kind(*v) + ".");
  const std::string name = v->get<std::string>();
  if (name.empty()) bad(key, std::string("'") + key + "' must not be empty.");
  if (!model_name_served(options, name)) throw BadRequest{model_not_found(name)};
  return model_name_known(options, name) ? name : options.model_id;
}

std::optional<bool> get_bool(const Json& o, const char* key) {
  const Json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(key, std::string("'") + key + "' must be a boolean, got " + json_kind(*v) + ".");
  return v->get<bool>();
}

std::string get_string(const Json& o, const char* key) {
  const Json* v = field(o, key);
  if (!v) return "";
  if (!v->is_string()) bad(key, std::string("'") + key + "' must be a string, got " + json_kind(*v) + ".");
  return v->get<std::string>();
}

// `images` of a message or a generate request: base64 strings, appended to `out` (named p[i]). Their count.
size_t read_images(const Json& o, const std::string& p, std::vector<RequestImage>& out) {
  const Json* v = field(o, "images");
  if (!v) return 0;
  if (!v->is_array()) bad(p, "'" + p + "' must be an array of base64 images.");
  for (size_t i = 0; i < v->size(); ++i) {
    const std::string q = p + "[" + std::to_string(i) + "]";
    if (!(*v)[i].is_string()) bad(q, "'" + q + "' must be a string: an image's bytes in base64.");
    out.push_back(request_image_from_base64((*v)[i].get<std::string>(), q));
  }
  return v->size();
}

// A message's content with its images before the text (as Ollama places them).
Json with_images(size_t images, const std::string& text) {
  if (images == 0) return text;
  MessageContent content;
  for (size_t i = 0; i < images; ++i) content.add_image();
  content.add_text(text);
  return content.json();
}

// A tool call of an assistant message: {function: {name, arguments (an object; a string holding one is accepted)}}.
Json parse_tool_call(const Json& call, const std::string& p) {
  if (!call.is_object()) bad(p, "'" + p + "' must be an object like {\"function\": {\"name\": ..., \"arguments\": {...}}}.");
  const Json* fn = field(call, "function");
  if (!fn || !fn->is_object()) bad(p + ".function", "'" + p + ".function' must be an object with 'name' and 'arguments'.");
  const Json* name = field(*fn, "name");
  if (!name || !name->is_string() || name->get<std::string>().empty())
    bad(p + ".function.name", "'" + p + ".function.name' must be a non-empty string.");
  Json arguments = Json::object();
  if (const Json* a = field(*fn, "arguments")) {
    if (a->is_string()) arguments = Json::parse(a->get<std::string>(), nullptr, false);
    else arguments = *a;
    if (!arguments.is_object())
      bad(p + ".function.arguments", "'" + p + ".function.arguments' must be a JSON object (the call's arguments).");
  }
  Json out = Json::object();
  if (const Json* id = field(call, "id"); id && id->is_string()) out["id"] = *id;
  out["type"] = "function";
  out["function"] = Json{{"name", *name}, {"arguments", std::move(arguments)}};
  return out;
}

Json parse_messages(const Json& j, std::vector<RequestImage>& images) {
  const Json* messages = field(j, "messages");
  if (!messages) return Json::array();
  if (!messages->is_array()) bad("messages", "'messages' must be an array of {role, content} objects, got " + json_kind(*messages) + ".");
  if (messages->size() > 100000) bad("messages", "'messages' holds too many entries (at most 100000).");
  Json out = Json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const std::string p = "messages[" + std::to_string(i) + "]";
    const Json& m = (*messages)[i];
    if (!m.is_object()) bad(p, "'" + p + "' must be an object with 'role' and 'content'.");
    const Json* role_v = field(m, "role");
    const std::string role = role_v && role_v->is_string() ? role_v->get<std::string>() : "";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      bad(p + ".role", "'" + p + ".role' must be one of system, user, assistant, tool" +
                           (role.empty() ? std::string(".") : ", got \"" + role + "\"."));
    const Json* content = field(m, "content");
    if (content && !content->is_string())
      bad(p + ".content", "'" + p + ".content' must be a string, got " + json_kind(*content) + ".");
    const std::string text = content ? content->get<std::string>() : std::string();
    size_t n_images = 0;
    if (role == "user") {
      n_images = read_images(m, p + ".images", images);
    } else if (const Json* v = field(m, "images"); v && (!v->is_array() || !v->empty())) {
      bad(p + ".images", "'" + p + ".images': images are read in user messages only.");
    }
    Json msg = {{"role", role}, {"content", with_images(n_images, text)}};
    if (role == "assistant") {
      if (const Json* thinking = field(m, "thinking")) {
        if (!thinking->is_string()) bad(p + ".thinking", "'" + p + ".thinking' must be a string.");
        if (!thinking->get<std::string>().empty()) msg["reasoning_content"] = *thinking;
      }
      if (const Json* calls = field(m, "tool_calls")) {
        if (!calls->is_array()) bad(p + ".tool_calls", "'" + p + ".tool_calls' must be an array.");
        Json parsed = Json::array();
        for (size_t k = 0; k < calls->size(); ++k)
          parsed.push_back(parse_tool_call((*calls)[k], p + ".tool_calls[" + std::to_string(k) + "]"));
        if (!parsed.empty()) msg["tool_calls"] = std::move(parsed);
      }
    } else if (field(m, "tool_calls")) {
      bad(p + ".tool_calls", "'" + p + ".tool_calls' belongs in an assistant message.");
    }
    if (role == "tool") {
      const std::string tool_name = get_string(m, "tool_name");
      if (!tool_name.empty()) msg["name"] = tool_name;
      const std::string id = get_string(m, "tool_call_id");
      if (!id.empty()) msg["tool_call_id"] = id;
    }
    out.push_back(std::move(msg));
  }
  return out;  // a last assistant message is continued, as Ollama does (ChatRequest::continue_final_message)
}

// think: a boolean, or a level ("high", "medium", "low": gpt-oss style; this template has no levels, so any level
// means thinking on).
void parse_think(const Json& j, ChatRequest& r) {
  const Json* v = field(j, "think");
  if (!v) return;  // the template's default (Qwen3.6 thinks)
  if (v->is_boolean()) {
    r.chat_template_kwargs["enable_thinking"] = v->get<bool>();
    return;
  }
  if (v->is_string()) {
    const std::string level = v->get<std::string>();
    if (level == "high" || level == "medium" || level == "low") {
      r.chat_template_kwargs["enable_thinking"] = true;
      return;
    }
  }
  bad("think", "'think' must be a boolean (or \"high\", \"medium\", \"low\"), got " + v->dump() + ".");
}

// format: "json" -> any JSON value, an object -> that JSON Schema (constrained decoding, as response_format).
void parse_format(const Json& j, ChatRequest& r) {
  const Json* v = field(j, "format");
  if (!v) return;
  try {
    if (v->is_string()) {
      const std::string f = v->get<std::string>();
      if (f.empty()) return;
      if (f != "json") bad("format", "'format' must be \"json\" or a JSON Schema object, got \"" + f + "\".");
      r.response_format = ResponseFormat::json_object;
      r.grammar = grammar::compile_json_object();
      return;
    }
    if (!v->is_object()) bad("format", "'format' must be \"json\" or a JSON Schema object, got " + json_kind(*v) + ".");
    r.response_format = ResponseFormat::json_schema;
    r.grammar = grammar::compile_json_schema(*v);  // ordered: properties in the schema's order
  } catch (const grammar::SchemaError& e) {
    std::string message = std::string("'format' cannot be used as an output constraint: ") + e.what();
    if (!e.keyword().empty() && message.find(e.keyword()) == std::string::npos)
      message += " (keyword '" + e.keyword() + "')";
    bad("format", message);
  } catch (const Error& e) {
    bad("format", "'format' cannot be used as an output constraint: " + strip_error_location(e.what()));
  }
}

// One number of `options`, named "options.KEY" in messages; nullopt when not given.
std::optional<double> number_option(const Json& o, const char* key, double lo, double hi, bool lo_open = false) {
  const Json* v = field(o, key);
  if (!v) return std::nullopt;
  const std::string name = std::string("options.") + key;
  if (!v->is_number()) bad(name, "'" + name + "' must be a number, got " + json_kind(*v) + ".");
  const double x = v->get<double>();
  const bool below = lo_open ? !(x > lo) : !(x >= lo);
  if (!std::isfinite(x) || below || !(x <= hi))
    bad(name, "'" + name + "' must be a number in " + (lo_open ? "(" : "[") + number_text(lo) + ", " +
                  number_text(hi) + "], got " + v->dump() + ".");
  return x;
}

std::optional<int64_t> integer_option(const Json& o, const char* key, int64_t lo, int64_t hi) {
  const Json* v = field(o, key);
  if (!v) return std::nullopt;
  const std::string name = std::string("options.") + key;
  const bool integral = v->is_number_integer() || v->is_number_unsigned() ||
                        (v->is_number_float() && std::fabs(v->get<double>()) < 9.2e18 &&
                         v->get<double>() == double(int64_t(v->get<double>())));  // 128.0 as clients may send it
  if (!integral) bad(name, "'" + name + "' must be an integer, got " + (v->is_number() ? v->dump() : json_kind(*v)) + ".");
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(hi)) bad_integer_range(name.c_str(), lo, hi, *v);
  const int64_t x = v->is_number_float() ? int64_t(v->get<double>()) : v->get<int64_t>();
  if (x < lo || x > hi) bad(name, "'" + name + "' must be an integer in [" + std::to_string(lo) + ", " +
                                      std::to_string(hi) + "], got " + v->dump() + ".");
  return x;
}

void parse_options(const Json& j, OllamaRequest& r) {
  const Json* o = field(j, "options");
  if (!o) return;
  if (!o->is_object()) bad("options", "'options' must be an object like {\"temperature\": 0.7}, got " + json_kind(*o) + ".");
  SamplingOverrides& s = r.chat.sampling;
  if (auto v = number_option(*o, "temperature", 0.0, 2.0)) s.temperature = float(*v);
  if (auto v = number_option(*o, "top_p", 0.0, 1.0, /*lo_open=*/true)) s.top_p = float(*v);
  if (auto v = number_option(*o, "min_p", 0.0, 1.0)) s.min_p = float(*v);
  if (auto v = number_option(*o, "presence_penalty", -2.0, 2.0)) s.presence_penalty = float(*v);
  if (auto v = number_option(*o, "frequency_penalty", -2.0, 2.0)) s.frequency_penalty = float(*v);
  if (auto v = number_option(*o, "repeat_penalty", 0.0, 10.0, /*lo_open=*/true)) s.repetition_penalty = float(*v);
  if (auto v = integer_option(*o, "top_k", -1, 1000000)) s.top_k = int(*v);
  // Ollama's seed -1 (its default) means a random one.
  if (auto v = integer_option(*o, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
    if (*v >= 0) s.seed = uint64_t(*v);
  // num_predict: -1 (no limit) and -2 (until the context is full) are the same here: generation stops at the context.
  if (auto v = integer_option(*o, "num_predict", -2, kInt32Max)) {
    if (*v == 0) bad("options.num_predict", "'options.num_predict' must be -1 (no limit) or at least 1, got 0.");
    if (*v > 0) r.chat.max_tokens = *v;
  }
  r.num_ctx = integer_option(*o, "num_ctx", 1, kInt32Max);
  if (const Json* stop = field(*o, "stop")) {
    if (stop->is_string()) {
      if (!stop->get<std::string>().empty()) r.chat.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > 64) bad("options.stop", "'options.stop' may hold at most 64 strings.");
      for (const Json& e : *stop) {
        if (!e.is_string()) bad("options.stop", "'options.stop' must be an array of strings; an entry is " + json_kind(e) + ".");
        if (!e.get<std::string>().empty()) r.chat.stop.push_back(e.get<std::string>());
      }
    } else {
      bad("options.stop", "'options.stop' must be an array of strings, got " + json_kind(*stop) + ".");
    }
  }
}

void parse_common(const Json& j, const ParseOptions& options, OllamaRequest& r) {
  r.model_name = parse_model(j, options);
  r.chat.model = options.model_id;
  r.chat.stream = get_bool(j, "stream").value_or(true);  // Ollama streams unless told not to
  if (const Json* k = field(j, "keep_alive"); k && !k->is_string() && !k->is_number())
    bad("keep_alive", "'keep_alive' must be a duration string (\"5m\") or a number of seconds, got " + json_kind(*k) + ".");
  parse_think(j, r.chat);
  parse_format(j, r.chat);
  parse_options(j, r);
  if (const Json* forced = field(j, "tern_debug_forced_output")) {
    if (!options.allow_forced_output)
      bad("tern_debug_forced_output", "'tern_debug_forced_output' is a test-only option; start the server with "
                                      "--debug-allow-forced-output to use it.");
    if (!forced->is_string()) bad("tern_debug_forced_output", "'tern_debug_forced_output' must be a string.");
    r.chat.forced_output = forced->get<std::string>();
  }
}

}  // namespace

std::variant<OllamaRequest, ApiError> parse_ollama_request(std::string_view body, const ParseOptions& options,
                                                           OllamaEndpoint endpoint) {
  return request_fields::parse_or_error<OllamaRequest>([&] {
    const Json j = parse_body(body, options);
    OllamaRequest r;
    r.endpoint = endpoint;
    parse_common(j, options, r);
    if (endpoint == OllamaEndpoint::chat) {
      r.chat.messages = parse_messages(j, r.chat.images);
      r.chat.continue_final_message = true;
      r.chat.tools = function_tools(j);
      r.load_only = r.chat.messages.empty();
      return r;
    }
    if (field(j, "suffix") && !get_string(j, "suffix").empty())
      bad("suffix", "'suffix' (fill-in-the-middle) is not supported.");
    if (field(j, "context")) bad("context", "'context' (the token context of an earlier response) is not supported; "
                                            "send the conversation to /api/chat instead.");
    const size_t n_images = read_images(j, "images", r.chat.images);
    if (field(j, "template")) bad("template", "'template' is not supported: the model's own chat template is used.");
    r.raw = get_bool(j, "raw").value_or(false);
    r.prompt = get_string(j, "prompt");
    const std::string system = get_string(j, "system");
    if (r.raw && !system.empty()) bad("system", "'system' cannot be used with 'raw': true (no template is applied).");
    if (r.raw && n_images > 0)
      bad("images", "'images' cannot be used with 'raw': true (no template places the image tokens).");
    r.load_only = r.prompt.empty() && n_images == 0;
    if (!r.raw && !r.load_only) {
      if (!system.empty()) r.chat.messages.push_back(Json{{"role", "system"}, {"content", system}});
      r.chat.messages.push_back(Json{{"role", "user"}, {"content", with_images(n_images, r.prompt)}});
    }
    return r;
  });
}

std::variant<std::string, ApiError> parse_ollama_show_request(std::string_view body, const ParseOptions& options) {
  return request_fields::parse_or_error<std::string>([&] {
    const Json j = parse_body(body, options);
    return parse_model(j, options, field(j, "model") || !field(j, "name") ? "model" : "name");
  });
}

}  // namespace tern::server
