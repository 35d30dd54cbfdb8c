// Drafts from the model's own multi-token-prediction head (runner.h, "The MTP draft head"; speculative.h drives it).
//
// The head pairs the main model's hidden h_t (after the final norm) with the token x_{t+1} at row t of its own KV
// cache and predicts x_{t+2}. A runner keeps the hidden states of the session's last forward only (and the previous
// forward's last row), so the head is fed after every forward, or they are lost:
//
//   catch_up():  the pairs (h_t, x_{t+1}) whose h_t the session has computed (t < position) and whose x_{t+1} is
//                known (the prompt's, the emitted tokens), from the first row not yet holding its true pair: after
//                each prompt chunk, each decode step without MTP drafts, and at the end;
//   draft(k):    with P = position and x_P the token the next forward feeds: the pairs up to (h_{P-1}, x_P) in one
//                forward_mtp call, whose last logits give d1 = argmax (greedy), then the chain (out, d1) at row P,
//                (out, d2) at P + 1, ... for d2..dk.
//
// Draft rows (P and later) hold guesses; the next catch_up or draft starts at the first row past the true pairs and
// overwrites them (forward_mtp rewrites rows from its pos0 on), so after Session::rollback the head's cache holds
// exactly what a run without drafts would have given it. A session whose head cache has a gap (fewer true rows than
// the hidden states it still has reach back to: a prefix copied from another session, a restore without the pending
// hidden) cannot be fed: the drafter then stays off for this sequence (usable() false).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/runner.h"

namespace tern {

class MtpDrafter {
 public:
  // `session` holds a prefix of `prompt` (the generation's contract); both must outlive the drafter. Needs
  // runner.supports_mtp().
  MtpDrafter(ModelRunner& runner, Session& session, std::span<const int32_t> prompt);

  // An emitted token, in order: the sequence's next position.
  void append(int32_t token) { tokens_.push_back(token); }
  // Feeds the head every pair whose hidden and token are known (see the top of this file).
  void catch_up();
  // Up to k greedy drafts for the tokens after the one the next forward feeds (the last appended, at the session's
  // position). Empty when k <= 0 (the pairs are still fed) or when the head cannot be fed (usable() false).
  std::vector<int32_t> draft(int64_t k);

  bool usable() const { return usable_; }
  // The logits the last draft was chosen from, [V] (bench and tests).
  std::span<const float> last_logits() const { return logits_; }

 private:
  // Feeds the pairs (h_t, tokens_[t + 1]) for t in [first true row, last], writes the logits of the last pair.
  // False (and usable_ false) when the hidden states do not reach back to the first row to feed.
  bool feed(int64_t last);
  int32_t argmax() const;

  ModelRunner& runner_;
  Session& session_;
  std::vector<int32_t> tokens_;     // the sequence: tokens_[t] at position t (the prompt, then the emitted tokens)
  int64_t true_rows_ = 0;           // the head's rows [0, true_rows_) hold the pairs of tokens_
  bool usable_ = true;
  std::vector<float> logits_, hidden_out_;
};

}  // namespace tern
