// A suffix automaton over a growing token sequence (the n-gram drafter's index, draft_ngram.h): appending a token is
// amortised O(1), and after each append it tells the longest suffix of the sequence that also occurred earlier in it
// and where that earlier occurrence ends, so the tokens that followed it can be proposed as drafts. No weights.
//
// States are the classes of substrings that end at the same set of positions; a state's suffix link is the longest
// suffix in another class. After appending token n - 1, the new state's link is the class of the longest suffix
// that occurred before (its length is len(link)); each state records the end of its most recent occurrence as
// known when it was last on that path (an occurrence, possibly not the very latest: exact "latest" would cost a
// walk up the suffix links per token, quadratic on repetitive text).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace tern {

class TokenSuffixAutomaton {
 public:
  TokenSuffixAutomaton();

  // Extends the sequence by one token.
  void append(int32_t token);
  void append(std::span<const int32_t> tokens) {
    for (int32_t t : tokens) append(t);
  }

  // The longest suffix of the sequence (of at least one token) that also ends at an earlier position: its length
  // (0: none) and that earlier end (index of its last token, < size() - 1; -1 when length is 0).
  struct Match {
    int64_t length = 0;
    int64_t end = -1;
  };
  Match last_match() const { return match_; }

  // Walking a second sequence against this one (PredictionDrafter): the longest suffix of what was walked that
  // occurs in this sequence, as a state and its length. Start from Walk{} and step with each token.
  struct Walk {
    int32_t state = 0;
    int64_t length = 0;
  };
  Walk step(Walk w, int32_t token) const;
  // The end (index of its last token) of an occurrence of the walk's suffix in this sequence (its first
  // occurrence); -1 for the empty walk.
  int64_t first_end(const Walk& w) const { return w.length > 0 ? states_[size_t(w.state)].first_end : -1; }

  int64_t size() const { return int64_t(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  struct State {
    int64_t len = 0;        // the longest string of the class
    int32_t link = -1;      // suffix link (-1 for the root)
    int64_t first_end = -1; // end of its first occurrence
    int64_t last_end = -1;  // end of a recent occurrence (see above)
    std::vector<int32_t> keys;  // the tokens it has transitions on (targets in next_)
  };
  static uint64_t key(int32_t state, int32_t token) { return (uint64_t(uint32_t(state)) << 32) | uint32_t(token); }
  int32_t next(int32_t state, int32_t token) const {
    const auto it = next_.find(key(state, token));
    return it == next_.end() ? -1 : it->second;
  }

  std::vector<int32_t> tokens_;
  std::vector<State> states_;
  std::unordered_map<uint64_t, int32_t> next_;  // (state, token) -> state
  int32_t last_ = 0;                            // the state of the whole sequence
  Match match_;
};

}  // namespace tern
