// One request's constrained decoding state, as the generator drives it: a grammar Matcher (src/grammar), the
// allowed-token mask of the next step, and an optional start marker (e.g. "</think>": the reasoning stays free
// and the constraint applies from the token after the one that completes the marker).
//
// It is also the TokenMaskSource the device sampling path calls (model/runner.h): fill() computes the mask on
// the host while the device runs the step's forward.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"
#include "model/runner.h"

namespace tern {

class OutputConstraint final : public TokenMaskSource {
 public:
  // start_after: the constraint begins once the output's raw bytes contain this text ("": from the first token).
  OutputConstraint(grammar::GrammarPtr grammar, std::shared_ptr<const grammar::TokenVocabulary> vocab,
                   std::string start_after = {});

  // True when the next token is constrained (the start marker has been seen).
  bool active() const { return active_; }
  // The next token's allowed-token mask when active(), else an empty span (no mask).
  std::span<const uint32_t> fill() override;
  // Records an emitted token and its raw bytes. While active, advances the grammar and returns false (state
  // unchanged) when the grammar does not allow the token; before the marker, always true.
  bool accept(int32_t id, std::string_view bytes);
  // An end id was accepted by the grammar (or it is complete and nothing else can follow).
  bool done() const { return active_ && matcher_.done(); }
  bool complete() const { return active_ && matcher_.complete(); }
  // The constrained part of the output so far (the bytes the grammar accepted).
  const std::string& text() const { return matcher_.text(); }
  // An independent copy of the current state (speculative decoding tries drafts on it). Cheap: the grammar's
  // automaton is shared; the copy's mask buffer is allocated on its first fill().
  OutputConstraint fork() const;

 private:
  OutputConstraint(grammar::Matcher matcher, std::string start_after, std::string tail, bool active, size_t words);
  grammar::Matcher matcher_;
  std::vector<uint32_t> mask_;
  std::string start_after_;
  std::string tail_;  // the last start_after_.size() - 1 bytes of the output (the marker may straddle tokens)
  bool active_ = false;
  size_t mask_words_ = 0;
};

}  // namespace tern
