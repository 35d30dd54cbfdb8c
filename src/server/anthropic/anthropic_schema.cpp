#include "server/anthropic/anthropic_schema.h"

#include <limits>

#include "core/check.h"
#include "grammar/grammar.h"
#include "server/serving/request_fields.h"
#include "server/serving/request_images.h"

namespace tern::server {

namespace {

using namespace request_fields;  // bad(), field(), parse_body(), ... shared with the other request parsers

std::string str_field(const Json& object, const char* key) {
  const Json* v = field(object, key);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

// Anthropic's wording: a value that is not a number (or not an integer) is told with the range too.
std::optional<double> number_in(const Json& o, const char* key, double lo, double hi, bool lo_open) {
  if (const Json* v = field(o, key); v && !v->is_number()) bad_number_range(key, lo, hi, lo_open, *v);
  return get_number(o, key, lo, hi, lo_open);
}

std::optional<int64_t> integer_in(const Json& o, const char* key, int64_t lo, int64_t hi) {
  if (const Json* v = field(o, key); v && !v->is_number_integer() && !v->is_number_unsigned())
    bad_integer_range(key, lo, hi, *v);
  return get_integer(o, key, lo, hi);
}

// The text of a "text" block; images and documents are refused by name.
std::string block_text(const Json& block, const std::string& p) {
  auto text = block.find("text");
  if (text == block.end() || !text->is_string()) bad(p + ".text", "'" + p + ".text' must be a string.");
  return text->get<std::string>();
}

[[noreturn]] void unsupported_block(const std::string& type, const std::string& p) {
  if (type == "image") bad(p, "'" + p + "' is an image block: images are read in user messages and tool results.");
  if (type == "document" || type == "search_result" || type == "container_upload")
    bad(p, "'" + p + "' is a " + type + " block: only text, tool_use, tool_result and thinking blocks are supported.");
  bad(p, "'" + p + "' has type '" + type + "'; supported blocks are text, tool_use, tool_result, thinking.");
}

// A block's "type", checked to be an object with a string type.
std::string block_type(const Json& block, const std::string& p) {
  if (!block.is_object()) bad(p, "'" + p + "' must be a content block object like {\"type\": \"text\", \"text\": \"...\"}.");
  const std::string type = str_field(block, "type");
  if (type.empty()) bad(p + ".type", "'" + p + ".type' must be a string such as \"text\".");
  return type;
}

// system: a string or an array of text blocks (joined with newlines, as Anthropic concatenates them).
std::optional<std::string> parse_system(const Json& j) {
  const Json* v = field(j, "system");
  if (!v) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  if (!v->is_array()) bad("system", "'system' must be a string or an array of text blocks, got " + json_kind(*v) + ".");
  std::string text;
  for (size_t i = 0; i < v->size(); ++i) {
    const std::string p = "system[" + std::to_string(i) + "]";
    if (block_type((*v)[i], p) != "text") unsupported_block(str_field((*v)[i], "type"), p);
    text += (i ? "\n" : "") + block_text((*v)[i], p);
  }
  return text;
}

// An image block's image: source {"type": "base64", "media_type": "image/png", "data": "..."} or
// {"type": "url", "url": "https://..."}.
RequestImage image_block(const Json& block, const std::string& p) {
  const Json* source = field(block, "source");
  if (!source || !source->is_object())
    bad(p + ".source", "'" + p + ".source' must be an object like {\"type\": \"base64\", \"media_type\": "
                                 "\"image/png\", \"data\": \"...\"}.");
  const std::string type = str_field(*source, "type");
  const std::string q = p + ".source";
  if (type == "url") {
    const Json* url = field(*source, "url");
    if (!url || !url->is_string()) bad(q + ".url", "'" + q + ".url' must be a string.");
    return request_image_from_url(url->get<std::string>(), q + ".url");
  }
  if (type != "base64")
    bad(q + ".type", "'" + q + ".type' must be \"base64\" (or \"url\"), got \"" + type + "\"" +
                         (type == "file" ? ": this server stores no files." : "."));
  const std::string media = str_field(*source, "media_type");
  if (!media.empty() && media.rfind("image/", 0) != 0)
    bad(q + ".media_type", "'" + q + ".media_type' is '" + media + "', not an image type.");
  const Json* data = field(*source, "data");
  if (!data || !data->is_string()) bad(q + ".data", "'" + q + ".data' must be a string: the image's bytes in base64.");
  return request_image_from_base64(data->get<std::string>(), q + ".data");
}

// A tool_result block's content: a string, or text and image blocks (images appended to `images`, left in the
// content as {"type": "image"} parts).
Json tool_result_content(const Json& block, const std::string& p, std::vector<RequestImage>& images) {
  const Json* content = field(block, "content");
  if (!content) return "";
  if (content->is_string()) return *content;
  if (!content->is_array()) bad(p + ".content", "'" + p + ".content' must be a string or an array of text blocks.");
  MessageContent out;
  for (size_t i = 0; i < content->size(); ++i) {
    const std::string q = p + ".content[" + std::to_string(i) + "]";
    const std::string type = block_type((*content)[i], q);
    if (type == "image") {
      images.push_back(image_block((*content)[i], q));
      out.add_image();
      continue;
    }
    if (type != "text") unsupported_block(type, q);
    out.add_text(block_text((*content)[i], q));
  }
  return out.json();
}

// Appends the internal messages of one Anthropic message, and its images to `images` in the order they render (the
// tool results' first: their messages come before the user's text).
void translate_message(const Json& m, const std::string& p, Json& out, std::vector<RequestImage>& images) {
  if (!m.is_object()) bad(p, "'" + p + "' must be an object with 'role' and 'content'.");
  const std::string role = str_field(m, "role");
  if (role != "user" && role != "assistant")
    bad(p + ".role", "'" + p + ".role' must be \"user\" or \"assistant\"" +
                         (role.empty() ? std::string(".") : ", got \"" + role + "\" (system goes in 'system')."));
  const Json* content = field(m, "content");
  if (!content) bad(p + ".content", "'" + p + ".content' is required: a string or an array of content blocks.");
  if (content->is_string()) {
    out.push_back(Json{{"role", role}, {"content", *content}});
    return;
  }
  if (!content->is_array()) bad(p + ".content", "'" + p + ".content' must be a string or an array of content blocks.");
  std::string reasoning;
  MessageContent text;
  std::vector<RequestImage> text_images;  // the user message's own, after the tool results'
  Json calls = Json::array();
  for (size_t i = 0; i < content->size(); ++i) {
    const std::string q = p + ".content[" + std::to_string(i) + "]";
    const Json& block = (*content)[i];
    const std::string type = block_type(block, q);
    if (type == "text") {
      text.add_text(block_text(block, q));
    } else if (type == "image" && role == "user") {
      text_images.push_back(image_block(block, q));
      text.add_image();
    } else if (type == "tool_result" && role == "user") {
      const std::string id = str_field(block, "tool_use_id");
      if (id.empty()) bad(q + ".tool_use_id", "'" + q + ".tool_use_id' must be the id of the tool_use it answers.");
      Json result = tool_result_content(block, q, images);
      const Json* is_error = field(block, "is_error");
      if (is_error && !is_error->is_boolean()) bad(q + ".is_error", "'" + q + ".is_error' must be a boolean.");
      if (is_error && is_error->get<bool>()) {
        if (result.is_string()) result = "Error: " + result.get<std::string>();
        else result.insert(result.begin(), Json{{"type", "text"}, {"text", "Error: "}});
      }
      out.push_back(Json{{"role", "tool"}, {"tool_call_id", id}, {"content", std::move(result)}});
    } else if (type == "tool_use" && role == "assistant") {
      const std::string name = str_field(block, "name");
      if (name.empty()) bad(q + ".name", "'" + q + ".name' must be a non-empty string.");
      const Json* input = field(block, "input");
      if (input && !input->is_object()) bad(q + ".input", "'" + q + ".input' must be an object.");
      calls.push_back(Json{{"id", str_field(block, "id")},
                           {"type", "function"},
                           {"function", Json{{"name", name}, {"arguments", input ? *input : Json::object()}}}});
    } else if (type == "thinking" && role == "assistant") {
      const Json* thinking = field(block, "thinking");
      if (!thinking || !thinking->is_string()) bad(q + ".thinking", "'" + q + ".thinking' must be a string.");
      reasoning += thinking->get<std::string>();
    } else if (type == "redacted_thinking" && role == "assistant") {
      continue;  // opaque to us; nothing to render
    } else if (type == "tool_result" || type == "tool_use" || type == "thinking" || type == "redacted_thinking") {
      bad(q, "'" + q + "' is a " + type + " block, which belongs in " +
                 (type == "tool_result" ? "a user" : "an assistant") + " message.");
    } else {
      unsupported_block(type, q);
    }
  }
  if (role == "user") {
    // Tool results were appended above, before the user's text: the template renders them in one user turn.
    if (!text.text().empty() || text.has_images() || out.empty() || out.back()["role"] != "tool")
      out.push_back(Json{{"role", "user"}, {"content", text.json()}});
    images.insert(images.end(), text_images.begin(), text_images.end());
    return;
  }
  Json msg = {{"role", "assistant"}, {"content", text.text()}};
  if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
  if (!calls.empty()) msg["tool_calls"] = std::move(calls);
  out.push_back(std::move(msg));
}

Json parse_messages(const Json& j, const std::optional<std::string>& system, std::vector<RequestImage>& images) {
  const Json* messages = field(j, "messages");
  if (!messages || !messages->is_array() || messages->empty())
    bad("messages", "'messages' is required: a non-empty array of {role, content} objects.");
  if (messages->size() > 100000) bad("messages", "'messages' holds too many entries (at most 100000).");
  Json out = Json::array();
  if (system) out.push_back(Json{{"role", "system"}, {"content", *system}});
  for (size_t i = 0; i < messages->size(); ++i)
    translate_message((*messages)[i], "messages[" + std::to_string(i) + "]", out, images);
  return out;  // a last assistant message is a prefill: the reply continues it (ChatRequest::continue_final_message)
}

Json parse_tools(const Json& j) {
  const Json* tools = tools_field(j, "'tools' must be an array of {name, description, input_schema} objects.");
  if (!tools) return Json::array();
  Json out = Json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string p = "tools[" + std::to_string(i) + "]";
    const Json& t = (*tools)[i];
    if (!t.is_object()) bad(p, "'" + p + "' must be an object with 'name' and 'input_schema'.");
    const std::string type = str_field(t, "type");
    if (!type.empty() && type != "custom")
      bad(p + ".type", "'" + p + ".type' is '" + type + "': server tools are not supported; give client tools "
                                                         "({name, description, input_schema}).");
    const std::string name = str_field(t, "name");
    if (name.empty()) bad(p + ".name", "'" + p + ".name' must be a non-empty string.");
    const Json* schema = field(t, "input_schema");
    if (!schema || !schema->is_object()) bad(p + ".input_schema", "'" + p + ".input_schema' must be a JSON schema object.");
    Json function = {{"name", name}};
    if (const Json* d = field(t, "description")) {
      if (!d->is_string()) bad(p + ".description", "'" + p + ".description' must be a string.");
      function["description"] = *d;
    }
    function["parameters"] = *schema;
    out.push_back(Json{{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

void parse_tool_choice(const Json& j, ChatRequest& r) {
  const Json* v = field(j, "tool_choice");
  if (v) {
    if (!v->is_object()) bad("tool_choice", "'tool_choice' must be an object like {\"type\": \"auto\"}.");
    const std::string type = str_field(*v, "type");
    if (type == "auto") r.tool_choice = ToolChoice::tool_choice_auto;
    else if (type == "any") r.tool_choice = ToolChoice::tool_choice_required;
    else if (type == "none") r.tool_choice = ToolChoice::tool_choice_none;
    else if (type == "tool") {
      r.tool_choice = ToolChoice::tool_choice_named;
      r.tool_choice_name = str_field(*v, "name");
      if (r.tool_choice_name.empty()) bad("tool_choice.name", "'tool_choice.name' is required with type \"tool\".");
    } else {
      bad("tool_choice.type", "'tool_choice.type' must be one of auto, any, tool, none, got " +
                                  (type.empty() ? json_kind(v->value("type", Json())) : "\"" + type + "\"") + ".");
    }
    if (const Json* d = field(*v, "disable_parallel_tool_use")) {
      if (!d->is_boolean()) bad("tool_choice.disable_parallel_tool_use", "'tool_choice.disable_parallel_tool_use' must be a boolean.");
      r.parallel_tool_calls = !d->get<bool>();
    }
  }
  keep_chosen_tools(r, "tool_choice.name", "'tool_choice.name' is '" + r.tool_choice_name + "', which is not in 'tools'.");
}

void parse_thinking(const Json& j, AnthropicRequest& r) {
  const Json* v = field(j, "thinking");
  if (!v) {  // Anthropic's API thinks only when asked (its clients never read a thought they did not ask for)
    r.chat.chat_template_kwargs["enable_thinking"] = false;
    return;
  }
  if (!v->is_object()) bad("thinking", "'thinking' must be an object like {\"type\": \"enabled\", \"budget_tokens\": 2048}.");
  const std::string type = str_field(*v, "type");
  if (type == "enabled" || type == "adaptive") {
    r.chat.chat_template_kwargs["enable_thinking"] = true;
    if (type == "enabled") {
      r.thinking_budget = integer_in(*v, "budget_tokens", 1, std::numeric_limits<int32_t>::max());
      if (!r.thinking_budget) bad("thinking.budget_tokens", "'thinking.budget_tokens' is required with type \"enabled\".");
      if (r.max_tokens > 0 && *r.thinking_budget >= r.max_tokens)
        bad("thinking.budget_tokens", "'thinking.budget_tokens' must be less than 'max_tokens'.");
    }
  } else if (type == "disabled") {
    r.chat.chat_template_kwargs["enable_thinking"] = false;
  } else {
    bad("thinking.type", "'thinking.type' must be \"enabled\", \"adaptive\" or \"disabled\".");
  }
}

// tool_choice any / tool: the reply must be tool calls valid for the tools' input_schema, by constrained decoding
// (src/grammar), as tool_choice required / named is on /v1/chat/completions. One call with disable_parallel_tool_use.
void compile_forced_tool_call(ChatRequest& r) {
  if (r.tool_choice != ToolChoice::tool_choice_required && r.tool_choice != ToolChoice::tool_choice_named) return;
  std::vector<grammar::ToolSpec> specs;
  for (const Json& t : r.tools) {
    const Json& parameters = t["function"]["parameters"];
    specs.push_back({t["function"]["name"].get<std::string>(), nlohmann::json(parameters), parameters});
  }
  try {
    r.grammar = grammar::compile_tool_calls(specs, r.parallel_tool_calls);
  } catch (const grammar::SchemaError& e) {
    bad("tools", std::string("A tool's 'input_schema' cannot constrain a forced tool call: ") + e.what() +
                     " (keyword '" + e.keyword() + "').");
  } catch (const Error& e) {
    bad("tools", "'tools' cannot be used to force a tool call: " + strip_error_location(e.what()));
  }
}

std::vector<std::string> parse_stop_sequences(const Json& j) {
  std::vector<std::string> out;
  const Json* v = field(j, "stop_sequences");
  if (!v) return out;
  if (!v->is_array()) bad("stop_sequences", "'stop_sequences' must be an array of strings, got " + json_kind(*v) + ".");
  if (v->size() > 64) bad("stop_sequences", "'stop_sequences' may hold at most 64 strings.");
  for (const Json& s : *v) {
    if (!s.is_string() || s.get<std::string>().empty())
      bad("stop_sequences", "'stop_sequences' entries must be non-empty strings.");
    out.push_back(s.get<std::string>());
  }
  return out;
}

}  // namespace

std::variant<AnthropicRequest, ApiError> parse_anthropic_request(std::string_view body, const ParseOptions& options,
                                                                 AnthropicEndpoint endpoint) {
  return request_fields::parse_or_error<AnthropicRequest>([&] {
    const Json j = parse_body(body, options);
    AnthropicRequest r;
    ChatRequest& c = r.chat;
    const Json* model = field(j, "model");
    if (model && !model->is_string()) bad("model", "'model' must be a string.");
    if (model && !model_name_served(options, model->get<std::string>()))
      throw BadRequest{api_error_not_found_model(model->get<std::string>(), options.model_id)};
    c.model = options.model_id;
    if (endpoint == AnthropicEndpoint::messages) {
      if (!field(j, "max_tokens")) bad("max_tokens", "'max_tokens' is required: the most tokens to generate (>= 1).");
      r.max_tokens = *integer_in(j, "max_tokens", 1, std::numeric_limits<int32_t>::max());
      c.max_tokens = r.max_tokens;
    }
    c.messages = parse_messages(j, parse_system(j), c.images);
    c.continue_final_message = true;
    c.tools = parse_tools(j);
    parse_tool_choice(j, c);
    if (endpoint == AnthropicEndpoint::messages) compile_forced_tool_call(c);
    parse_thinking(j, r);
    if (const Json* s = field(j, "stream")) {
      if (!s->is_boolean()) bad("stream", "'stream' must be a boolean.");
      c.stream = s->get<bool>();
    }
    if (auto v = number_in(j, "temperature", 0.0, 1.0, false)) c.sampling.temperature = float(*v);
    if (auto v = number_in(j, "top_p", 0.0, 1.0, true)) c.sampling.top_p = float(*v);
    if (auto v = integer_in(j, "top_k", 0, 1000000)) c.sampling.top_k = int(*v);
    c.stop = parse_stop_sequences(j);
    if (const Json* m = field(j, "metadata"); m && !m->is_object()) bad("metadata", "'metadata' must be an object.");
    if (const Json* forced = field(j, "tern_debug_forced_output")) {
      if (!options.allow_forced_output)
        bad("tern_debug_forced_output", "'tern_debug_forced_output' is a test-only option; start the server with "
                                        "--debug-allow-forced-output to use it.");
      if (!forced->is_string()) bad("tern_debug_forced_output", "'tern_debug_forced_output' must be a string.");
      c.forced_output = forced->get<std::string>();
    }
    return r;
  });
}

}  // namespace tern::server
