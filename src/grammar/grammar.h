// Constrained decoding: grammars over bytes, compiled from JSON Schema (response_format) or from a set of tools
// (forced tool calls in the Qwen3.6 XML format), and a Matcher that turns a grammar into a per-step mask of the
// token ids allowed next.
//
// Use:
//   GrammarPtr g = compile_json_schema(schema);               // throws SchemaError naming the keyword
//   auto vocab = TokenVocabulary::from_tokenizer(tok, model_vocab_rows, end_ids);   // once per tokenizer
//   Matcher m(g, vocab);
//   loop: m.fill_mask(mask);  sample with mask;  m.accept(id);  stop when m.done() or id is an end id
//
// Grammar and TokenVocabulary are immutable and shared between requests and threads; a Matcher is one request's
// state and is not thread-safe. compile_* keep the last 16 compiled grammars by source, and all Matchers of one
// Grammar share its automaton and mask cache (behind a mutex), so a schema that repeats across requests starts warm.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace tern {
class Tokenizer;
}

namespace tern::grammar {

// A schema that is malformed or uses a keyword outside the supported subset. keyword(): the JSON Schema keyword
// at fault ("pattern", "type", "$ref", ...); what(): a message for the 400 answer that names it and its path.
class SchemaError : public std::runtime_error {
 public:
  SchemaError(std::string keyword, const std::string& message)
      : std::runtime_error(message), keyword_(std::move(keyword)) {}
  const std::string& keyword() const { return keyword_; }

 private:
  std::string keyword_;
};

class Grammar;  // immutable once compiled
using GrammarPtr = std::shared_ptr<const Grammar>;

// One JSON value valid for the schema (the subset of OpenAI's strict mode and common clients; see docs). Whitespace
// between JSON tokens is limited to what keeps output compact and parseable.
GrammarPtr compile_json_schema(const nlohmann::json& schema);
// The same, keeping the schema's property order (nlohmann::json sorts object keys; properties are generated in the
// order of the schema object given).
GrammarPtr compile_json_schema(const nlohmann::ordered_json& schema);
// Any JSON object (response_format json_object).
GrammarPtr compile_json_object();

// A tool the model may be forced to call: its name and its `parameters` JSON Schema (may be empty: any object).
struct ToolSpec {
  std::string name;
  nlohmann::json parameters;
  // When not null, used instead of `parameters`: the same schema with its key order kept, so parameters are
  // generated in the order the tool declares them.
  nlohmann::ordered_json ordered_parameters = nullptr;
};
// One tool call (or, with parallel, one or more calls separated by "\n") in the Qwen3.6 format that
// src/text/output_parser.cpp parses:
//   <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>
// with NAME one of the tools, every required parameter present, and each VALUE valid for its property's schema
// (strings raw, other types as JSON, as the output parser reads them).
GrammarPtr compile_tool_calls(const std::vector<ToolSpec>& tools, bool parallel);

// The byte strings of every token id of a tokenizer, organised for fast masks (a prefix trie). Ids without a
// token (padding rows of the model's vocabulary) and special tokens are never allowed by a grammar; end_ids
// (e.g. <|im_end|>, <|endoftext|>) are allowed exactly when the grammar is complete.
class TokenVocabulary {
 public:
  static std::shared_ptr<const TokenVocabulary> from_tokenizer(const Tokenizer& tokenizer, int64_t vocab_rows,
                                                               const std::vector<int32_t>& end_ids);
  // For tests: token i has bytes tokens[i]; empty strings are never allowed.
  static std::shared_ptr<const TokenVocabulary> from_tokens(std::vector<std::string> tokens,
                                                            const std::vector<int32_t>& end_ids);
  virtual ~TokenVocabulary() = default;
  virtual int64_t size() const = 0;  // ids 0..size()-1 (the model's vocabulary rows)
  int64_t mask_words() const { return (size() + 31) / 32; }
};

// One request's position in a grammar.
class Matcher {
 public:
  Matcher(GrammarPtr grammar, std::shared_ptr<const TokenVocabulary> vocab);
  ~Matcher();
  Matcher(Matcher&&) noexcept;
  Matcher& operator=(Matcher&&) noexcept;

  // Bit (id % 32) of mask[id / 32] set <=> id may come next. mask.size() == vocab->mask_words(). When nothing but
  // an end id can follow, only end ids are set.
  void fill_mask(std::span<uint32_t> mask);
  // Advances by one token. Returns false and leaves the state unchanged when the token is not allowed.
  // Accepting an end id when complete() is allowed and makes done() true.
  bool accept(int32_t id);
  // Advances by raw bytes (text forced into the output, tests). Returns false and leaves the state unchanged when
  // the bytes are not a valid continuation.
  bool accept_bytes(std::string_view bytes);
  // An independent copy of the current position (cheap: the automaton and mask cache are shared by the copies;
  // use the copies from one thread). Keeping a clone is also how to roll back.
  Matcher clone() const;
  // The shortest bytes that would make the text complete ("" when it is), e.g. to close a document when the token
  // budget runs out; nullopt if not found within a bounded search.
  std::optional<std::string> shortest_completion();
  bool complete() const;  // the bytes accepted so far form a whole sentence of the grammar
  bool done() const;      // an end id was accepted, or complete() and nothing else can follow
  const std::string& text() const;  // the bytes accepted so far

 private:
  Matcher() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tern::grammar
