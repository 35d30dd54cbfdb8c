#include "engine/suffix_automaton.h"

namespace tern {

TokenSuffixAutomaton::TokenSuffixAutomaton() { states_.emplace_back(); }

void TokenSuffixAutomaton::append(int32_t token) {
  const int64_t pos = int64_t(tokens_.size());
  tokens_.push_back(token);
  const int32_t cur = int32_t(states_.size());
  states_.push_back(State{.len = states_[size_t(last_)].len + 1, .link = 0, .first_end = pos, .last_end = pos, .keys = {}});
  int32_t p = last_;
  while (p >= 0 && next(p, token) < 0) {
    next_.emplace(key(p, token), cur);
    states_[size_t(p)].keys.push_back(token);
    p = states_[size_t(p)].link;
  }
  int32_t link = 0;
  if (p >= 0) {
    const int32_t q = next(p, token);
    if (states_[size_t(p)].len + 1 == states_[size_t(q)].len) {
      link = q;
    } else {  // split q: the clone is the class of the shorter strings, which now also end at pos
      const int32_t clone = int32_t(states_.size());
      State c{.len = states_[size_t(p)].len + 1, .link = states_[size_t(q)].link,
              .first_end = states_[size_t(q)].first_end, .last_end = states_[size_t(q)].last_end,
              .keys = states_[size_t(q)].keys};
      states_.push_back(std::move(c));
      for (int32_t t : states_[size_t(clone)].keys) next_[key(clone, t)] = next(q, t);
      while (p >= 0) {
        const auto it = next_.find(key(p, token));
        if (it == next_.end() || it->second != q) break;
        it->second = clone;
        p = states_[size_t(p)].link;
      }
      states_[size_t(q)].link = clone;
      link = clone;
    }
  }
  states_[size_t(cur)].link = link;
  last_ = cur;
  if (link == 0) {
    match_ = Match{};
  } else {  // the longest earlier suffix: its class's recent occurrence before pos, then pos is the recent one
    State& l = states_[size_t(link)];
    match_ = Match{.length = l.len, .end = l.last_end};
    l.last_end = pos;
  }
}

TokenSuffixAutomaton::Walk TokenSuffixAutomaton::step(Walk w, int32_t token) const {
  for (;;) {
    const int32_t to = next(w.state, token);
    if (to >= 0) return Walk{.state = to, .length = w.length + 1};
    if (w.state == 0) return Walk{};
    w.state = states_[size_t(w.state)].link;
    w.length = states_[size_t(w.state)].len;
  }
}

}  // namespace tern
