// Streaming parser of Qwen3.6 output: reasoning, content and <tool_call> blocks.
//
// Feed the detokenized text piece by piece (pieces may split anywhere, even inside a tag); each push returns what
// became certain. The output grammar (model.md §5.2; vLLM's qwen3 reasoning and qwen3_coder tool parsers):
//
//   [reasoning] </think> \n\n content (<tool_call>\n<function=NAME>\n(<parameter=K>\nV\n</parameter>\n)*</function>\n</tool_call>)*
//
// - Reasoning: when the prompt already opened <think> (starts_in_reasoning), everything up to </think> is
//   reasoning (a leading "<think>" is dropped). The newlines right after </think> are dropped.
// - Content: everything else, except tool-call blocks. Whitespace right before a <tool_call>, between calls, and
//   after the last call at the end of generation is dropped.
// - Tool calls: each complete <tool_call>...</tool_call> block whose body is one <function=NAME> element with
//   <parameter=K> children becomes a ToolCall. Values lose one leading and one trailing newline and are typed by
//   the tool's JSON schema (function.parameters.properties[K], see tool_parameter_types): "string" among its types
//   (or no type at all, or no schema) -> a JSON string; integer, number, boolean, object, array, null -> the raw
//   text parsed as JSON (Python's True/False/None are accepted), falling back to a string when it does not parse.
// - Malformed blocks, and a block still open at finish(), become content verbatim: nothing is lost.
//
// For the server (OpenAI streaming): send `reasoning` as delta.reasoning_content and `content` as delta.content;
// for each ToolCall in tool_calls_completed send one delta
//   {"tool_calls":[{"index":call.index,"id":call.id,"type":"function",
//                   "function":{"name":call.name,"arguments":call.arguments_json}}]}
// (calls are emitted whole, once their closing tag arrives, so a call is never retracted). finish_reason is
// "tool_calls" when tool_call_count() > 0. Within one ParsedDelta, reasoning comes before content and content
// before the calls.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace tern {

struct ToolCall {
  std::string id;              // "call_" + 24 hex digits, unique per parser
  std::string name;
  std::string arguments_json;  // a JSON object, keys in the order the model wrote them
  int index = 0;               // 0, 1, ... in the order of the response
};

// The JSON types a tool parameter's schema gives its value, as OutputParser reads them (and as the tool-call grammar
// writes them, src/grammar/tool_calls.cpp): its "type" (a name or a list) and, recursively, those of its anyOf/oneOf
// members. When these name none, the first of: a local "$ref"'s target ("#/$defs/NAME", "#/definitions/NAME", any
// JSON pointer into `root`), the first allOf member that names some, the JSON types of "const" or the "enum" values,
// "object" for "properties", "array" for "items". root: the tool's parameters schema, which references point into.
// Empty: untyped.
std::vector<std::string> tool_parameter_types(const nlohmann::ordered_json& schema, const nlohmann::ordered_json& root);
// True when the parser keeps a value of this schema as raw text (a JSON string): untyped, or "string" among its types.
bool tool_parameter_is_text(const nlohmann::ordered_json& schema, const nlohmann::ordered_json& root);

struct ParsedDelta {  // what one push (or finish) produced
  std::string reasoning, content;
  std::vector<ToolCall> tool_calls_completed;  // calls completed by this push
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls_completed.empty(); }
};

class OutputParser {
 public:
  // tools: the request's tools array (OpenAI shape) or null; used to type argument values.
  // seed: for the tool-call ids; 0 draws one from std::random_device.
  OutputParser(bool starts_in_reasoning, nlohmann::ordered_json tools, uint64_t seed = 0);

  ParsedDelta push(std::string_view text);
  ParsedDelta finish();  // end of generation: unterminated things become content (or reasoning), nothing lost

  int tool_call_count() const { return n_calls_; }
  bool in_reasoning() const { return mode_ == Mode::Reasoning; }

 private:
  enum class Mode { Reasoning, Content, ToolCall };
  void process(ParsedDelta& out);
  void emit_content(ParsedDelta& out, std::string_view text);
  bool parse_call(std::string_view block, ToolCall& call) const;
  std::string typed_value(const std::string& function, const std::string& key, const std::string& raw) const;
  std::string new_id();

  Mode mode_;
  std::string buf_;            // text not yet classified
  std::string pending_ws_;     // trailing content whitespace, held until we know whether a call follows
  std::string ws_before_call_;  // whitespace before the open <tool_call>, restored if the block is not a call
  bool at_reasoning_start_ = true;
  bool strip_newlines_ = false;  // just after </think>
  int n_calls_ = 0;
  nlohmann::ordered_json tools_;
  std::mt19937_64 rng_;
};

}  // namespace tern
