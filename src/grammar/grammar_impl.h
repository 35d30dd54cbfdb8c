// Internal representation of grammars (not part of the public API in grammar.h).
//
// Two levels:
//   Expr      a tree the compilers build: byte sets, sequences, alternatives, counted repetition, rule references.
//   Grammar   the flat form the recogniser runs on (like llama.cpp's GBNF rules): every rule is a list of
//             alternatives, every alternative a run of elements (a byte set or a rule reference) ending in End.
//
// GrammarBuilder lowers Exprs into a Grammar: repetition becomes right-recursive rules (x* -> R = x R | ε,
// x{0,n} -> nested optionals), so the recogniser's stacks never grow on a tail reference. build() then drops
// alternatives that cannot derive any finite string (an empty byte set, `false` schemas) and rejects left recursion
// that would grow a stack without consuming a byte.
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"

namespace tern::grammar {

using ByteSet = std::bitset<256>;

// ---- Expr -------------------------------------------------------------------------------------------------------

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

enum class ExprKind { Bytes, Seq, Alt, Repeat, Ref };

struct Expr {
  ExprKind kind = ExprKind::Seq;
  ByteSet bytes;               // Bytes
  std::vector<ExprPtr> items;  // Seq, Alt; Repeat: items[0]
  int min = 0, max = 0;        // Repeat; max < 0: unbounded
  int rule = -1;               // Ref
};

ExprPtr expr_empty();                                // matches ""
ExprPtr expr_bytes(const ByteSet& set);              // one byte of the set
ExprPtr expr_byte_range(uint8_t lo, uint8_t hi);     // one byte in [lo, hi]
ExprPtr expr_literal(std::string_view bytes);        // exactly these bytes
ExprPtr expr_seq(std::vector<ExprPtr> items);
ExprPtr expr_alt(std::vector<ExprPtr> items);        // no items: matches nothing
ExprPtr expr_repeat(ExprPtr item, int min, int max);  // max < 0: unbounded
ExprPtr expr_optional(ExprPtr item);
ExprPtr expr_ref(int rule);
ExprPtr expr_nothing();                              // matches no string at all

// ---- Code point classes (sorted, disjoint, inclusive ranges) ----------------------------------------------------

struct CodepointRange {
  uint32_t lo, hi;
};
using CodepointClass = std::vector<CodepointRange>;

constexpr uint32_t kMaxCodepoint = 0x10FFFF;
CodepointClass cp_normalize(CodepointClass c);  // sort, merge, drop surrogates (U+D800..U+DFFF)
CodepointClass cp_complement(const CodepointClass& c);  // within all scalar values
CodepointClass cp_intersect(const CodepointClass& a, const CodepointClass& b);
CodepointClass cp_subtract(const CodepointClass& a, const CodepointClass& b);
CodepointClass cp_union(const CodepointClass& a, const CodepointClass& b);
bool cp_contains(const CodepointClass& c, uint32_t cp);
CodepointClass cp_all();  // every Unicode scalar value
// The UTF-8 encodings of the class as an Expr (alternatives of byte-range sequences).
ExprPtr expr_utf8_class(const CodepointClass& c);
void append_utf8(std::string& out, uint32_t cp);

// ---- Flat grammar ------------------------------------------------------------------------------------------------

// An element is one uint32: the kind in the top 2 bits, the payload (byte set index or rule index) below.
enum class ElemKind : uint32_t { End = 0, Bytes = 1, Ref = 2 };
constexpr uint32_t kElemPayloadMask = (1u << 30) - 1;
inline ElemKind elem_kind(uint32_t e) { return static_cast<ElemKind>(e >> 30); }
inline uint32_t elem_payload(uint32_t e) { return e & kElemPayloadMask; }
inline uint32_t make_elem(ElemKind k, uint32_t payload) { return (static_cast<uint32_t>(k) << 30) | payload; }

class Grammar {
 public:
  std::vector<uint32_t> elems;                 // all alternatives back to back, each ending in End
  std::vector<ByteSet> sets;                   // byte sets, deduplicated
  std::vector<std::vector<uint32_t>> rules;    // rule -> start positions of its alternatives in elems
  uint32_t start_rule = 0;
  std::string description;                     // for messages: "json schema", "tool calls", ...

  // The Matchers' shared automaton and mask cache for one vocabulary (a MatcherEngine), so that later requests
  // with the same compiled grammar start warm. A cache, hence mutable; guarded by engine_mu.
  mutable std::mutex engine_mu;
  mutable std::shared_ptr<void> engine;
  mutable const void* engine_vocab = nullptr;
};

// Limits that keep every input bounded (a schema is request data).
constexpr int kMaxRepeat = 10000;          // largest bound of a counted repetition
constexpr size_t kMaxGrammarElems = 4'000'000;

// Thrown by the builder for grammars it cannot accept; the schema compilers turn it into SchemaError.
class GrammarError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class GrammarBuilder {
 public:
  int new_rule();                          // a rule to define later (allows recursion)
  void define(int rule, ExprPtr body);
  int add_rule(ExprPtr body) {
    int r = new_rule();
    define(r, std::move(body));
    return r;
  }
  // Lowers every rule, drops unproductive alternatives, checks for stack-growing left recursion. Throws
  // GrammarError when the start rule derives no string or on left recursion.
  GrammarPtr build(int start_rule, std::string description);

 private:
  struct RawRule {
    std::vector<std::vector<uint32_t>> alts;  // elements without End
    bool defined = false;
  };
  uint32_t lower_to_elem(const ExprPtr& e);
  void lower_seq_into(const ExprPtr& e, std::vector<uint32_t>& out);
  void lower_rule(int rule, const ExprPtr& body);
  uint32_t set_index(const ByteSet& s);
  void count(size_t n);

  std::vector<RawRule> rules_;
  std::vector<ByteSet> sets_;
  std::unordered_map<ByteSet, uint32_t> set_ids_;
  size_t total_elems_ = 0;
};

}  // namespace tern::grammar
