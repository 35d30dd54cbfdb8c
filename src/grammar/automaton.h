// The incremental recogniser: a pushdown automaton over a Grammar, determinised lazily.
//
// A parse position is a stack of element positions (top = the element to match next, below it where to return).
// A recogniser state is the set of all such stacks after closure: every top is a byte-set element, and the empty
// stack means "complete". States are interned (same set of stacks -> same id) and transitions are cached in a table
// indexed by (state, byte class), so after warm-up advancing by one byte is one array lookup: this is what makes
// mask computation over a token trie fast, and a clone or a rollback is just a state id.
//
// An Automaton grows as it is used and is not thread-safe: the Matchers that share one (see matcher.cpp) hold
// their engine's mutex around every use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/grammar_impl.h"

namespace tern::grammar {

class Automaton {
 public:
  static constexpr int32_t kDead = -1;
  static constexpr int32_t kUnknown = -2;

  explicit Automaton(const Grammar* grammar);  // the grammar must outlive the automaton

  int32_t initial() const { return initial_; }
  // The state after byte b, or kDead.
  int32_t next(int32_t state, uint8_t b) {
    int32_t t = trans_[static_cast<size_t>(state) * n_classes_ + byte_class_[b]];
    return t != kUnknown ? t : compute(state, b);
  }
  bool complete(int32_t state) const { return states_[static_cast<size_t>(state)].complete; }
  // Complete and no byte can follow.
  bool finished(int32_t state) const { return states_[static_cast<size_t>(state)].complete && states_[static_cast<size_t>(state)].n_stacks == 1; }
  size_t state_count() const { return states_.size(); }
  // Bytes the states hold (stacks and transition signatures); computing a state that would take it past a bound
  // throws tern::Error (automaton.cpp: kMaxStoredBytes).
  size_t stored_bytes() const { return stored_bytes_; }
  // The shortest byte string that leads from `state` to a complete state (breadth first over byte classes,
  // visiting at most max_states states); nullopt when none was found within that bound.
  std::optional<std::string> shortest_completion(int32_t state, size_t max_states);
  // Drops every state except `keep` (remapped in place) when more than max_states exist; returns whether it did.
  bool shrink_if_above(size_t max_states, std::vector<int32_t*> keep);

 // For the mask walk's inner loop: the raw table (valid until the next call that computes a transition).
  const int32_t* table() const { return trans_.data(); }
  const uint8_t* byte_classes() const { return byte_class_; }
  uint32_t n_classes() const { return n_classes_; }
  // Where the whole UTF-8 characters of 2 to 4 bytes lead from `state`: all to `target`, all nowhere, or mixed.
  enum class Multibyte { ToTarget, Dead, Mixed };
  Multibyte multibyte_kind(int32_t state, int32_t target);

 private:
  struct State {
    std::vector<uint32_t> key;  // the sorted stacks, each as [length, positions bottom..top]
    bool complete = false;
    uint32_t n_stacks = 0;
    // Targets computed so far, by signature (which stacks' tops accept the byte): bytes of different classes that
    // the same stacks accept lead to the same state, so only the first of them pays for a closure.
    std::vector<std::pair<std::vector<uint64_t>, int32_t>> by_signature;
  };
  int32_t compute(int32_t state, uint8_t b);
  // Stacks live in `arena_` as records [length, positions bottom..top], named by their offset. closure() expands
  // the records `work` until every top is a byte set (or the stack is empty: complete) into `closed_`; intern()
  // names the set of records in `closed_` (the same set -> the same id).
  uint32_t push_record(const uint32_t* positions, uint32_t length);
  void closure(std::vector<uint32_t>& work);
  int32_t intern_closed();

  const Grammar* g_;
  uint8_t byte_class_[256];
  uint32_t n_classes_ = 1;
  std::vector<uint8_t> class_rep_;  // a byte of each class
  std::vector<State> states_;
  std::vector<int32_t> trans_;  // [state][class]
  struct KeyHash {
    using is_transparent = void;
    size_t operator()(std::span<const uint32_t> k) const;
    size_t operator()(const std::vector<uint32_t>& k) const { return (*this)(std::span<const uint32_t>(k)); }
  };
  struct KeyEq {
    using is_transparent = void;
    bool operator()(std::span<const uint32_t> a, std::span<const uint32_t> b) const {
      return std::equal(a.begin(), a.end(), b.begin(), b.end());
    }
  };
  std::unordered_map<std::vector<uint32_t>, int32_t, KeyHash, KeyEq> ids_;
  // Scratch of compute(), kept between calls so that a transition allocates nothing once warm.
  std::vector<uint32_t> arena_, closed_, seen_, key_, work_;
  std::vector<uint64_t> signature_;
  // multibyte_kind(): the distinct lead bytes (by class and continuation ranges), and the continuation bytes.
  struct LeadPlan {
    uint8_t lead;
    int due;                      // continuation bytes after the lead
    std::vector<uint8_t> second;  // one byte per class of the allowed second byte
  };
  std::vector<LeadPlan> lead_plan_;
  std::vector<uint8_t> cont_reps_;
  int32_t initial_ = 0;
  size_t stored_bytes_ = 0;
};

}  // namespace tern::grammar
