// JSON field access and checks shared by the request parsers (each API's <api>_schema.cpp). A failed check throws
// BadRequest; the parser's entry point (parse_or_error) returns its ApiError, so nothing here throws to a handler.
// Every message names the field.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "server/http/errors.h"
#include "server/serving/chat_request.h"

namespace tern::server {

// `name` without Ollama's ":latest" tag ("qwen:latest" -> "qwen"); any other name as it is.
std::string_view without_latest_tag(std::string_view name);

// True when a request's "model" is one of the served model's names: its id or one of its aliases, as they are or
// with a ":latest" tag (or either is empty).
bool model_name_known(const ParseOptions& options, const std::string& name);

// True when a request naming `name` is served: any name (one model is served; the answer names its id), unless
// --strict-model-name, which serves only the known names (model_name_known).
bool model_name_served(const ParseOptions& options, const std::string& name);

// Nesting depth of a JSON text ([ and { outside strings); stops counting past `limit` (returns limit + 1).
int json_nesting_depth(std::string_view text, int limit);

}  // namespace tern::server

namespace tern::server::request_fields {

// Thrown by the checks; caught by parse_or_error.
struct BadRequest {
  ApiError error;
};

// Throws BadRequest with a 400 naming `param`.
[[noreturn]] void bad(const std::string& param, const std::string& message);

// What a JSON value is, for messages: "null", "a boolean", "a string", "an array", "an object", "a number",
// "an integer".
std::string json_kind(const Json& v);

// A number as messages write it (%g).
std::string number_text(double v);

// A missing field and an explicit null both mean "not given": nullptr.
const Json* field(const Json& object, const char* key);

// "'key' must be a number in [lo, hi], got <v>." ("(lo" with lo_open); `v` out of range or not a number.
[[noreturn]] void bad_number_range(const char* key, double lo, double hi, bool lo_open, const Json& v);
// "'key' must be an integer in [lo, hi], got <v>."
[[noreturn]] void bad_integer_range(const char* key, int64_t lo, int64_t hi, const Json& v);

// A number field in [lo, hi] ((lo, hi] with lo_open); nullopt when not given. Something other than a number:
// "'key' must be a number, got <kind>."
std::optional<double> get_number(const Json& o, const char* key, double lo, double hi, bool lo_open = false);
// An integer field in [lo, hi]; nullopt when not given. Something other than an integer: "..., got <kind>."
std::optional<int64_t> get_integer(const Json& o, const char* key, int64_t lo, int64_t hi);

// The request's "tools": nullptr when not given; an array of at most 1024 entries, else a 400 (with
// `not_array_message` when it is not an array).
const Json* tools_field(const Json& j, const std::string& not_array_message);

// OpenAI's tool_choice words: "auto", "none", "required"; another word is a 400 that also shows `object_form` (the
// API's object spelling of a named function).
ToolChoice tool_choice_word(const std::string& word, const std::string& object_form);

// The request's "tools" in OpenAI's chat shape ([{"type": "function", "function": {"name", "parameters"?, ...}}],
// also what Ollama takes), checked entry by entry (400s naming tools[i]...); an empty array when not given.
Json function_tools(const Json& j);

// After tool_choice is parsed: a forced call (required, named) needs tools ("'tool_choice' asks for a tool call but
// 'tools' is empty."); none keeps no tools; named keeps only the named one, and a name not among them is a 400 with
// `unknown_name_param` and `unknown_name_message`.
void keep_chosen_tools(ChatRequest& r, const std::string& unknown_name_param, const std::string& unknown_name_message);

// The body as a JSON object: not nested deeper than options.max_json_depth, valid JSON and UTF-8, an object.
Json parse_body(std::string_view body, const ParseOptions& options);

// Runs `parse` (which returns a Request and may throw BadRequest): its request, or the ApiError of a failed check.
// Any other exception (a JSON access the parser did not foresee) is still the client's body: a 400.
template <typename Request, typename Parse>
std::variant<Request, ApiError> parse_or_error(Parse&& parse) {
  try {
    return parse();
  } catch (const BadRequest& e) {
    return e.error;
  } catch (const std::exception& e) {
    return api_error_invalid("", std::string("The request body could not be read: ") + e.what());
  }
}

}  // namespace tern::server::request_fields
