// Draft sources without weights for speculative decoding (speculative.h):
//   NgramDrafter: the tokens that followed the longest earlier match of the conversation's recent tokens (prompt
//     and output so far) in the conversation itself: code edits, quoted documents, agents' repeated tool calls.
//   PredictionDrafter: the client's own guess of the output (OpenAI's `prediction`, tokenised): followed token by
//     token while the output agrees with it, and found again (the longest match of the output's recent tokens in
//     it) after the output departs from it.
// Both only propose: every draft is verified by the model (generation_run), so a bad draft costs time, never output.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/suffix_automaton.h"

namespace tern {

class NgramDrafter {
 public:
  // min_match: the shortest match (in tokens) whose continuation is proposed.
  explicit NgramDrafter(int64_t min_match = 2) : min_match_(min_match) {}
  void append(int32_t token) { index_.append(token); }
  void append(std::span<const int32_t> tokens) { index_.append(tokens); }
  // Up to k tokens: what followed the earlier occurrence of the longest suffix that occurred before, copied on
  // from there (so a repeating pattern is drafted through its period); empty when no match of min_match tokens.
  std::vector<int32_t> draft(int64_t k) const;
  int64_t match_length() const { return index_.last_match().length; }

 private:
  int64_t min_match_;
  TokenSuffixAutomaton index_;
};

class PredictionDrafter {
 public:
  // resync_match: after the output left the prediction, the match of its recent tokens needed to follow it again.
  explicit PredictionDrafter(std::vector<int32_t> prediction, int64_t resync_match = 3);
  bool empty() const { return index_.size() == 0; }
  // An output token.
  void append(int32_t token);
  // Up to k tokens of the prediction from where the output is in it; empty when it is lost or at the end.
  std::vector<int32_t> draft(int64_t k) const;

 private:
  TokenSuffixAutomaton index_;  // over the prediction
  TokenSuffixAutomaton::Walk walk_;
  int64_t resync_match_;
  int64_t cursor_ = 0;          // index of the next predicted token; -1: lost
};

}  // namespace tern
