// OpenAI Responses request bodies -> the internal chat request (see responses_schema.h).
#include "server/responses/responses_schema.h"

#include <limits>
#include <set>

#include "core/check.h"
#include "grammar/grammar.h"
#include "server/serving/request_fields.h"
#include "server/serving/request_images.h"

namespace tern::server {

namespace {

using namespace request_fields;  // bad(), field(), get_number(), ... shared with the other request parsers

// Every top-level field this endpoint takes. Implemented: the Responses API's generation fields; tern's sampling
// extensions (as vLLM takes them); fields that are accepted and have no effect here (include, prompt caching
// hints, service_tier, truncation, ...). The stateless ones are refused with their own message below.
const std::set<std::string>& known_fields() {
  static const std::set<std::string> kFields = {
      "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
      "temperature", "top_p", "stream", "text", "reasoning", "metadata", "user", "store",
      // tern / vLLM sampling extensions
      "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "chat_template_kwargs",
      "tern_debug_forced_output",
      // accepted, no effect
      "include", "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "service_tier", "truncation",
      "stream_options", "max_tool_calls", "top_logprobs", "background",
      // refused below (stateless server)
      "previous_response_id", "conversation", "prompt"};
  return kFields;
}

std::string str_field(const Json& object, const char* key) {
  const Json* v = field(object, key);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

std::string index_path(const std::string& base, size_t i) { return base + "[" + std::to_string(i) + "]"; }

std::optional<bool> get_bool(const Json& o, const char* key, const std::string& param) {
  const Json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(param, "'" + param + "' must be a boolean, got " + json_kind(*v) + ".");
  return v->get<bool>();
}

std::optional<std::string> get_string(const Json& o, const char* key, const std::string& param) {
  const Json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad(param, "'" + param + "' must be a string, got " + json_kind(*v) + ".");
  return v->get<std::string>();
}

// One of `allowed` (a string field), or nullopt when not given.
std::optional<std::string> get_choice(const Json& o, const char* key, const std::string& param,
                                      std::initializer_list<const char*> allowed) {
  auto s = get_string(o, key, param);
  if (!s) return s;
  std::string list;
  for (const char* a : allowed) {
    if (*s == a) return s;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  bad(param, "'" + param + "' must be one of " + list + ", got \"" + *s + "\".");
}

void check_no_other_keys(const Json& object, const std::string& param, std::initializer_list<const char*> keys) {
  for (const auto& [key, value] : object.items()) {
    bool known = false;
    for (const char* k : keys) known = known || key == k;
    if (!known) bad(param + "." + key, "Unknown parameter: '" + param + "." + key + "'.");
  }
}

[[noreturn]] void unsupported_part(const std::string& type, const std::string& p) {
  if (type == "input_image" || type == "image_url")
    bad(p, "'" + p + "' is an " + type + " part: images are read in user messages, as input_image parts.");
  if (type == "input_file" || type == "input_audio")
    bad(p, "'" + p + "' is an " + type + " part: files and audio are not supported (text and images only).");
  bad(p, "'" + p + "' has type '" + type + "'; supported content parts are input_text, output_text and input_image.");
}

// An input_image part: {"type": "input_image", "image_url": "data:image/png;base64,...", "detail": ...}.
RequestImage input_image(const Json& part, const std::string& q) {
  if (field(part, "file_id"))
    bad(q + ".file_id", "'" + q + ".file_id': this server stores no files; send the image as image_url, a data: URL.");
  const Json* url = field(part, "image_url");
  if (!url || !url->is_string())
    bad(q + ".image_url", "'" + q + ".image_url' must be a string: a data: URL (data:image/png;base64,...).");
  if (const Json* detail = field(part, "detail"); detail && !detail->is_string())
    bad(q + ".detail", "'" + q + ".detail' must be a string (auto, low or high).");
  return request_image_from_url(url->get<std::string>(), q + ".image_url");
}

// A message's (or a tool output's) content: a string, or text parts joined as the template joins them; where
// `images` takes them (user messages), input_image parts too, appended there and left as {"type": "image"} parts.
Json content_parts(const Json& content, const std::string& p, std::vector<RequestImage>* images) {
  if (content.is_string()) return content;
  if (!content.is_array()) bad(p, "'" + p + "' must be a string or an array of input_text parts, got " + json_kind(content) + ".");
  MessageContent out;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string q = index_path(p, i);
    const Json& part = content[i];
    if (!part.is_object()) bad(q, "'" + q + "' must be an object like {\"type\": \"input_text\", \"text\": \"...\"}.");
    const std::string type = str_field(part, "type");
    if (type == "input_image" && images) {
      images->push_back(input_image(part, q));
      out.add_image();
      continue;
    }
    const char* key = type == "refusal" ? "refusal" : "text";
    if (type != "input_text" && type != "output_text" && type != "text" && type != "refusal") unsupported_part(type, q);
    const Json* t = field(part, key);
    if (!t || !t->is_string()) bad(q + "." + key, "'" + q + "." + key + "' must be a string.");
    out.add_text(t->get<std::string>());
  }
  return out.json();
}

std::string content_text(const Json& content, const std::string& p) {
  return content_parts(content, p, nullptr).get<std::string>();
}

// Builds the internal messages from the input items; consecutive assistant-side items (reasoning, an assistant
// message, function calls) form one assistant turn, as the model wrote them.
class InputTranslator {
 public:
  Json messages = Json::array();
  std::vector<RequestImage> images;  // the user messages' input_image parts, in order

  void item(const Json& it, const std::string& p) {
    if (!it.is_object()) bad(p, "'" + p + "' must be an input item object (a message, function_call, ...).");
    std::string type = str_field(it, "type");
    if (type.empty() && field(it, "role")) type = "message";  // the short form {role, content}
    if (type == "message") return message(it, p);
    if (type == "reasoning") return reasoning(it, p);
    if (type == "function_call") return function_call(it, p);
    if (type == "function_call_output") return function_call_output(it, p);
    if (type == "item_reference")
      bad(p, "'" + p + "' is an item_reference: this server is stateless and stores no items; send the item itself.");
    if (type.empty()) bad(p + ".type", "'" + p + ".type' is required: message, reasoning, function_call or function_call_output.");
    bad(p + ".type", "'" + p + ".type' is '" + type + "'; supported input items are message, reasoning, function_call "
                                                    "and function_call_output.");
  }

 private:
  long open_ = -1;  // index of the assistant turn still being built, or -1

  Json& open_assistant() {
    if (open_ < 0) {
      messages.push_back(Json{{"role", "assistant"}, {"content", ""}});
      open_ = long(messages.size()) - 1;
    }
    return messages[size_t(open_)];
  }

  void message(const Json& it, const std::string& p) {
    std::string role = str_field(it, "role");
    if (role != "user" && role != "assistant" && role != "system" && role != "developer")
      bad(p + ".role", "'" + p + ".role' must be one of user, assistant, system, developer" +
                           (role.empty() ? std::string(".") : ", got \"" + role + "\"."));
    const Json* content = field(it, "content");
    if (!content) bad(p + ".content", "'" + p + ".content' is required: a string or an array of input_text parts.");
    if (role == "user") {
      open_ = -1;
      messages.push_back(Json{{"role", "user"}, {"content", content_parts(*content, p + ".content", &images)}});
      return;
    }
    std::string text = content_text(*content, p + ".content");
    if (role == "assistant") {
      if (open_ >= 0 && messages[size_t(open_)].contains("tool_calls")) open_ = -1;  // text after calls: a new turn
      Json& m = open_assistant();
      m["content"] = m["content"].get<std::string>() + text;
      return;
    }
    open_ = -1;
    messages.push_back(Json{{"role", role == "developer" ? "system" : role}, {"content", std::move(text)}});
  }

  void reasoning(const Json& it, const std::string& p) {
    // The model's own reasoning of an earlier turn: the template renders it where it keeps reasoning (the turns
    // after the last user message). Content (reasoning_text) if given, else the summary; encrypted_content is
    // opaque and ignored.
    std::string text;
    for (const char* key : {"content", "summary"}) {
      const Json* parts = field(it, key);
      if (!parts) continue;
      const std::string q = p + "." + key;
      if (!parts->is_array()) bad(q, "'" + q + "' must be an array of {type, text} parts.");
      for (size_t i = 0; i < parts->size(); ++i) {
        const Json& part = (*parts)[i];
        const Json* t = part.is_object() ? field(part, "text") : nullptr;
        if (!t || !t->is_string()) bad(index_path(q, i) + ".text", "'" + index_path(q, i) + ".text' must be a string.");
        text += (text.empty() || i == 0 ? "" : "\n\n") + t->get<std::string>();
      }
      if (!text.empty()) break;
    }
    if (open_ >= 0 && (messages[size_t(open_)].contains("tool_calls") ||
                       !messages[size_t(open_)]["content"].get<std::string>().empty()))
      open_ = -1;  // reasoning after text or calls starts the next assistant turn
    Json& m = open_assistant();
    if (!text.empty()) m["reasoning_content"] = m.value("reasoning_content", std::string()) + text;
  }

  void function_call(const Json& it, const std::string& p) {
    const std::string call_id = str_field(it, "call_id");
    if (call_id.empty()) bad(p + ".call_id", "'" + p + ".call_id' must be a non-empty string.");
    const std::string name = str_field(it, "name");
    if (name.empty()) bad(p + ".name", "'" + p + ".name' must be a non-empty string.");
    Json arguments = Json::object();
    if (const Json* a = field(it, "arguments")) {
      if (a->is_string()) {
        const std::string& s = a->get_ref<const std::string&>();
        arguments = s.empty() ? Json::object() : Json::parse(s, nullptr, false);
      } else {
        arguments = *a;
      }
      if (arguments.is_discarded() || !arguments.is_object())
        bad(p + ".arguments", "'" + p + ".arguments' must be a string holding a JSON object.");
    }
    Json& m = open_assistant();
    if (!m.contains("tool_calls")) m["tool_calls"] = Json::array();
    m["tool_calls"].push_back(Json{{"id", call_id},
                                   {"type", "function"},
                                   {"function", Json{{"name", name}, {"arguments", std::move(arguments)}}}});
  }

  void function_call_output(const Json& it, const std::string& p) {
    const std::string call_id = str_field(it, "call_id");
    if (call_id.empty()) bad(p + ".call_id", "'" + p + ".call_id' must be the call_id of the function_call it answers.");
    const Json* output = field(it, "output");
    if (!output) bad(p + ".output", "'" + p + ".output' is required: a string or an array of input_text parts.");
    open_ = -1;
    messages.push_back(Json{{"role", "tool"}, {"tool_call_id", call_id}, {"content", content_text(*output, p + ".output")}});
  }
};

// input (+ instructions) -> messages. Instructions and the system/developer messages become one system message, in
// their order: the template takes a system message only at the start, while the Responses API allows developer
// items anywhere (agents add some mid-conversation).
Json parse_input(const Json& j, ResponsesRequest& r) {
  const Json* input = field(j, "input");
  if (!input) bad("input", "'input' is required: a string or an array of input items.");
  InputTranslator t;
  if (input->is_string()) {
    t.messages.push_back(Json{{"role", "user"}, {"content", *input}});
  } else if (input->is_array()) {
    if (input->empty()) bad("input", "'input' must not be an empty array.");
    if (input->size() > 100000) bad("input", "'input' holds too many items (at most 100000).");
    for (size_t i = 0; i < input->size(); ++i) t.item((*input)[i], index_path("input", i));
  } else {
    bad("input", "'input' must be a string or an array of input items, got " + json_kind(*input) + ".");
  }
  std::string system;
  if (auto instructions = get_string(j, "instructions", "instructions")) {
    system = *instructions;
    r.instructions = *instructions;
  }
  Json out = Json::array();
  for (const Json& m : t.messages)
    if (m["role"] == "system") system += (system.empty() ? "" : "\n\n") + m["content"].get<std::string>();
  if (!system.empty()) out.push_back(Json{{"role", "system"}, {"content", system}});
  for (Json& m : t.messages)
    if (m["role"] != "system") out.push_back(std::move(m));
  r.chat.images = std::move(t.images);
  return out;
}

void parse_tools(const Json& j, ResponsesRequest& r) {
  const Json* tools = tools_field(j, "'tools' must be an array of {\"type\": \"function\", \"name\", \"parameters\"} objects.");
  if (!tools) return;
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string p = index_path("tools", i);
    const Json& t = (*tools)[i];
    if (!t.is_object()) bad(p, "'" + p + "' must be an object like {\"type\": \"function\", \"name\": ..., \"parameters\": {...}}.");
    const std::string type = str_field(t, "type");
    if (type != "function")
      bad(p + ".type", "'" + p + ".type' is " + (type.empty() ? std::string("missing") : "'" + type + "'") +
                           ": only function tools ({\"type\": \"function\", ...}) are supported; this server runs no "
                           "built-in tools.");
    const std::string name = str_field(t, "name");
    if (name.empty()) bad(p + ".name", "'" + p + ".name' must be a non-empty string.");
    Json function = {{"name", name}};
    if (auto d = get_string(t, "description", p + ".description")) function["description"] = *d;
    if (const Json* params = field(t, "parameters")) {
      if (!params->is_object()) bad(p + ".parameters", "'" + p + ".parameters' must be a JSON schema object.");
      function["parameters"] = *params;
    }
    get_bool(t, "strict", p + ".strict");
    r.chat.tools.push_back(Json{{"type", "function"}, {"function", std::move(function)}});
    r.tools.push_back(t);
  }
}

void parse_tool_choice(const Json& j, ResponsesRequest& r) {
  ChatRequest& c = r.chat;
  if (const Json* v = field(j, "tool_choice")) {
    r.tool_choice = *v;
    if (v->is_string()) {
      c.tool_choice = tool_choice_word(v->get<std::string>(), "{\"type\": \"function\", \"name\": ...}");
    } else if (v->is_object()) {
      const std::string type = str_field(*v, "type");
      if (type != "function")
        bad("tool_choice.type", "'tool_choice.type' must be \"function\" (only function tools are supported), got " +
                                    (type.empty() ? std::string("none") : "\"" + type + "\"") + ".");
      c.tool_choice = ToolChoice::tool_choice_named;
      c.tool_choice_name = str_field(*v, "name");
      if (c.tool_choice_name.empty()) bad("tool_choice.name", "'tool_choice.name' is required with type \"function\".");
    } else {
      bad("tool_choice", "'tool_choice' must be a string or an object, got " + json_kind(*v) + ".");
    }
  }
  keep_chosen_tools(c, "tool_choice.name", "'tool_choice.name' is '" + c.tool_choice_name + "', which is not in 'tools'.");
  c.parallel_tool_calls = get_bool(j, "parallel_tool_calls", "parallel_tool_calls").value_or(true);
}

// text: {format: {type: text | json_object | json_schema, ...}, verbosity}
void parse_text(const Json& j, ResponsesRequest& r) {
  const Json* text = field(j, "text");
  if (!text) return;
  if (!text->is_object()) bad("text", "'text' must be an object like {\"format\": {\"type\": \"text\"}}.");
  check_no_other_keys(*text, "text", {"format", "verbosity"});
  get_choice(*text, "verbosity", "text.verbosity", {"low", "medium", "high"});
  const Json* format = field(*text, "format");
  if (!format) return;
  if (!format->is_object()) bad("text.format", "'text.format' must be an object like {\"type\": \"json_schema\", ...}.");
  const auto type = get_choice(*format, "type", "text.format.type", {"text", "json_object", "json_schema"});
  if (!type) bad("text.format.type", "'text.format.type' is required: text, json_object or json_schema.");
  r.text_format = *format;
  if (*type == "text") return;
  if (*type == "json_object") {
    r.chat.response_format = ResponseFormat::json_object;
    return;
  }
  r.chat.response_format = ResponseFormat::json_schema;
  check_no_other_keys(*format, "text.format", {"type", "name", "schema", "strict", "description"});
  if (auto name = get_string(*format, "name", "text.format.name")) {
    if (name->empty() || name->size() > 64)
      bad("text.format.name", "'text.format.name' must be a non-empty string of at most 64 characters.");
    r.chat.response_schema_name = *name;
  }
  get_bool(*format, "strict", "text.format.strict");
  get_string(*format, "description", "text.format.description");
  const Json* schema = field(*format, "schema");
  if (!schema) bad("text.format.schema", "'text.format.schema' is required with type json_schema: a JSON Schema object.");
  if (!schema->is_object() && !schema->is_boolean())
    bad("text.format.schema", "'text.format.schema' must be a JSON Schema object, got " + json_kind(*schema) + ".");
}

// reasoning: {effort, summary}. The template has no effort levels: none / minimal turn thinking off, the other
// levels on (unless chat_template_kwargs.enable_thinking says otherwise); without it the template's default holds.
void parse_reasoning(const Json& j, ResponsesRequest& r) {
  const Json* v = field(j, "reasoning");
  if (!v) return;
  if (!v->is_object()) bad("reasoning", "'reasoning' must be an object like {\"effort\": \"low\"}.");
  check_no_other_keys(*v, "reasoning", {"effort", "summary", "generate_summary", "context", "mode"});
  const auto effort = get_choice(*v, "effort", "reasoning.effort",
                                 {"none", "minimal", "low", "medium", "high", "xhigh", "max"});
  const auto summary = get_choice(*v, "summary", "reasoning.summary", {"auto", "concise", "detailed"});
  get_choice(*v, "generate_summary", "reasoning.generate_summary", {"auto", "concise", "detailed"});
  get_string(*v, "context", "reasoning.context");
  get_string(*v, "mode", "reasoning.mode");
  r.reasoning = Json{{"effort", effort ? Json(*effort) : Json(nullptr)}, {"summary", summary ? Json(*summary) : Json(nullptr)}};
  if (!effort) return;
  Json& kwargs = r.chat.chat_template_kwargs;
  kwargs["reasoning_effort"] = *effort;
  if (!kwargs.contains("enable_thinking")) kwargs["enable_thinking"] = *effort != "none" && *effort != "minimal";
}

void parse_sampling(const Json& j, SamplingOverrides& s) {
  if (auto v = get_number(j, "temperature", 0.0, 2.0)) s.temperature = float(*v);
  if (auto v = get_number(j, "top_p", 0.0, 1.0, /*lo_open=*/true)) s.top_p = float(*v);
  if (auto v = get_number(j, "min_p", 0.0, 1.0)) s.min_p = float(*v);
  if (auto v = get_number(j, "presence_penalty", -2.0, 2.0)) s.presence_penalty = float(*v);
  if (auto v = get_number(j, "frequency_penalty", -2.0, 2.0)) s.frequency_penalty = float(*v);
  if (auto v = get_number(j, "repetition_penalty", 0.0, 10.0, /*lo_open=*/true)) s.repetition_penalty = float(*v);
  if (auto v = get_integer(j, "top_k", -1, 1000000)) s.top_k = int(*v);
  if (auto v = get_integer(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
    s.seed = uint64_t(*v);
}

// Fields that have no effect on a stateless single-model server: checked for their type, then ignored.
void check_accepted_fields(const Json& j) {
  if (const Json* v = field(j, "include")) {
    if (!v->is_array()) bad("include", "'include' must be an array of strings.");
    for (const Json& s : *v)
      if (!s.is_string()) bad("include", "'include' must be an array of strings.");
  }
  for (const char* key : {"prompt_cache_key", "prompt_cache_retention", "safety_identifier", "service_tier"})
    get_string(j, key, key);
  get_choice(j, "truncation", "truncation", {"auto", "disabled"});
  if (const Json* v = field(j, "stream_options"); v && !v->is_object())
    bad("stream_options", "'stream_options' must be an object.");
  get_integer(j, "max_tool_calls", 1, std::numeric_limits<int32_t>::max());
  if (auto n = get_integer(j, "top_logprobs", 0, 20); n && *n > 0)
    bad("top_logprobs", "'top_logprobs' is not supported on /v1/responses (use /v1/chat/completions with logprobs).");
  if (get_bool(j, "background", "background").value_or(false))
    bad("background", "'background' mode is not supported: this server is stateless and keeps no responses to poll.");
}

void refuse_stateful_fields(const Json& j) {
  if (field(j, "previous_response_id"))
    bad("previous_response_id", "'previous_response_id' is not supported: this server is stateless and stores no "
                                "responses; send the whole conversation in 'input' instead.");
  if (field(j, "conversation"))
    bad("conversation", "'conversation' is not supported: this server is stateless and stores no conversations; send "
                        "the whole conversation in 'input' instead.");
  if (field(j, "prompt"))
    bad("prompt", "'prompt' (a stored prompt template) is not supported: this server stores no prompts; send "
                  "'instructions' and 'input' instead.");
}

void parse_template_kwargs(const Json& j, ChatRequest& r) {
  const Json* v = field(j, "chat_template_kwargs");
  if (!v) return;
  if (!v->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object, e.g. {\"enable_thinking\": false}.");
  for (const char* key : {"enable_thinking", "preserve_thinking"})
    get_bool(*v, key, std::string("chat_template_kwargs.") + key);
  r.chat_template_kwargs = *v;
}

// The output constraint: a forced tool call (tool_choice required / named) or the text.format schema.
void compile_constraint(ResponsesRequest& r) {
  ChatRequest& c = r.chat;
  if (c.tool_choice == ToolChoice::tool_choice_required || c.tool_choice == ToolChoice::tool_choice_named) {
    std::vector<grammar::ToolSpec> specs;
    for (const Json& t : c.tools) {
      const Json& fn = t["function"];
      const Json parameters = fn.contains("parameters") ? fn["parameters"] : Json::object();
      specs.push_back({fn["name"].get<std::string>(), nlohmann::json(parameters), parameters});
    }
    try {
      c.grammar = grammar::compile_tool_calls(specs, c.parallel_tool_calls);
    } catch (const grammar::SchemaError& e) {
      bad("tools", std::string("A tool's 'parameters' cannot constrain a forced tool call: ") + e.what() +
                       " (keyword '" + e.keyword() + "').");
    } catch (const Error& e) {
      bad("tools", "'tools' cannot be used to force a tool call: " + strip_error_location(e.what()));
    }
    return;
  }
  try {
    if (c.response_format == ResponseFormat::json_object) c.grammar = grammar::compile_json_object();
    if (c.response_format == ResponseFormat::json_schema) c.grammar = grammar::compile_json_schema(r.text_format["schema"]);
  } catch (const grammar::SchemaError& e) {
    bad("text.format.schema", std::string("'text.format.schema' cannot be used as an output constraint: ") + e.what() +
                                  " (keyword '" + e.keyword() + "').");
  } catch (const Error& e) {
    bad("text.format", "'text.format' cannot be used as an output constraint: " + strip_error_location(e.what()));
  }
}

}  // namespace

std::variant<ResponsesRequest, ApiError> parse_responses_request(std::string_view body, const ParseOptions& options) {
  return request_fields::parse_or_error<ResponsesRequest>([&] {
    const Json j = parse_body(body, options);
    for (const auto& [key, value] : j.items())
      if (!known_fields().count(key))
        bad(key, "Unknown parameter: '" + key + "'." +
                     (key == "max_tokens" || key == "max_completion_tokens" ? " Use 'max_output_tokens'." : "") +
                     (key == "messages" ? " Use 'input'." : "") + (key == "response_format" ? " Use 'text.format'." : ""));
    refuse_stateful_fields(j);
    ResponsesRequest r;
    ChatRequest& c = r.chat;
    if (auto model = get_string(j, "model", "model")) {
      if (!model_name_served(options, *model)) throw BadRequest{api_error_not_found_model(*model, options.model_id)};
    }
    c.model = options.model_id;
    parse_template_kwargs(j, c);  // before reasoning: an explicit enable_thinking wins over reasoning.effort
    c.messages = parse_input(j, r);
    parse_tools(j, r);
    parse_tool_choice(j, r);
    parse_text(j, r);
    parse_reasoning(j, r);
    r.max_output_tokens = get_integer(j, "max_output_tokens", 1, std::numeric_limits<int32_t>::max());
    c.max_tokens = r.max_output_tokens;
    parse_sampling(j, c.sampling);
    c.stream = get_bool(j, "stream", "stream").value_or(false);
    if (const Json* m = field(j, "metadata")) {
      if (!m->is_object()) bad("metadata", "'metadata' must be an object of string values.");
      if (m->size() > 16) bad("metadata", "'metadata' may hold at most 16 keys.");
      for (const auto& [key, value] : m->items())
        if (!value.is_string()) bad("metadata", "'metadata." + key + "' must be a string.");
      r.metadata = *m;
    }
    if (auto user = get_string(j, "user", "user")) r.user = *user;
    get_bool(j, "store", "store");  // accepted; nothing is stored, the echo says false
    check_accepted_fields(j);
    if (auto forced = get_string(j, "tern_debug_forced_output", "tern_debug_forced_output")) {
      if (!options.allow_forced_output)
        bad("tern_debug_forced_output", "'tern_debug_forced_output' is a test-only option; start the server with "
                                        "--debug-allow-forced-output to use it.");
      c.forced_output = *forced;
    }
    compile_constraint(r);
    return r;
  });
}

}  // namespace tern::server
