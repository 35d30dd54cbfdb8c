#include "grammar/automaton.h"

#include <algorithm>
#include <unordered_set>

#include "core/check.h"

namespace tern::grammar {

namespace {
// Bounds that keep a pathological grammar from eating the machine. Grammars compiled from schemas are far below
// them (stack depth ~ 3 x JSON nesting); a stack that would exceed them is dropped (its continuations are lost).
constexpr size_t kMaxStackDepth = 2048;
constexpr size_t kMaxClosureStacks = 100000;

struct StackHash {
  size_t operator()(const std::vector<uint32_t>& s) const {
    uint64_t h = 1469598103934665603ull;
    for (uint32_t x : s) h = (h ^ x) * 1099511628211ull;
    return static_cast<size_t>(h ^ (h >> 29));
  }
};
}  // namespace

size_t Automaton::KeyHash::operator()(const std::vector<uint32_t>& k) const { return StackHash{}(k); }

Automaton::Automaton(const Grammar* grammar) : g_(grammar) {
  // Bytes that every byte set of the grammar treats alike share a column of the transition table.
  std::fill(std::begin(byte_class_), std::end(byte_class_), 0);
  n_classes_ = 1;
  for (const ByteSet& s : g_->sets) {
    std::vector<int> remap(2 * n_classes_, -1);
    uint32_t n = 0;
    uint8_t next_class[256];
    for (int b = 0; b < 256; ++b) {
      int key = byte_class_[b] * 2 + (s.test(static_cast<size_t>(b)) ? 1 : 0);
      if (remap[static_cast<size_t>(key)] < 0) remap[static_cast<size_t>(key)] = static_cast<int>(n++);
      next_class[b] = static_cast<uint8_t>(remap[static_cast<size_t>(key)]);
    }
    std::copy(std::begin(next_class), std::end(next_class), std::begin(byte_class_));
    n_classes_ = n;
  }
  // A representative byte per class, printable ASCII where the class has one (readable completions).
  class_rep_.assign(n_classes_, 0);
  for (int b = 255; b >= 0; --b) class_rep_[byte_class_[b]] = static_cast<uint8_t>(b);
  for (int b = 0x7E; b >= 0x20; --b) class_rep_[byte_class_[b]] = static_cast<uint8_t>(b);

  std::vector<std::vector<uint32_t>> work, out;
  for (uint32_t a : g_->rules[g_->start_rule]) {
    if (elem_kind(g_->elems[a]) == ElemKind::End)
      work.push_back({});
    else
      work.push_back({a});
  }
  closure(work, out);
  initial_ = intern(std::move(out));
}

// Expands references until every stack's top is a byte set (or the stack is empty: complete).
void Automaton::closure(std::vector<std::vector<uint32_t>>& work, std::vector<std::vector<uint32_t>>& out) const {
  const auto& elems = g_->elems;
  std::unordered_set<std::vector<uint32_t>, StackHash> seen;
  std::vector<std::vector<uint32_t>> todo;
  auto push = [&](std::vector<uint32_t>&& s) {
    if (s.size() > kMaxStackDepth || seen.size() >= kMaxClosureStacks) return;
    if (seen.insert(s).second) todo.push_back(std::move(s));
  };
  for (auto& s : work) push(std::move(s));
  work.clear();
  while (!todo.empty()) {
    std::vector<uint32_t> s = std::move(todo.back());
    todo.pop_back();
    if (s.empty() || elem_kind(elems[s.back()]) == ElemKind::Bytes) {
      out.push_back(std::move(s));
      continue;
    }
    // A reference: continue after it (or return, when it ends its alternative), entering each alternative.
    uint32_t rule = elem_payload(elems[s.back()]);
    uint32_t after = s.back() + 1;
    if (elem_kind(elems[after]) == ElemKind::End)
      s.pop_back();
    else
      s.back() = after;
    for (uint32_t a : g_->rules[rule]) {
      std::vector<uint32_t> t = s;
      if (elem_kind(elems[a]) != ElemKind::End) t.push_back(a);
      push(std::move(t));
    }
  }
}

int32_t Automaton::intern(std::vector<std::vector<uint32_t>> stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  State st;
  st.n_stacks = static_cast<uint32_t>(stacks.size());
  for (const auto& s : stacks) {
    if (s.empty()) st.complete = true;
    st.key.push_back(static_cast<uint32_t>(s.size()));
    st.key.insert(st.key.end(), s.begin(), s.end());
  }
  auto it = ids_.find(st.key);
  if (it != ids_.end()) return it->second;
  int32_t id = static_cast<int32_t>(states_.size());
  ids_.emplace(st.key, id);
  states_.push_back(std::move(st));
  trans_.resize(states_.size() * n_classes_, kUnknown);
  return id;
}

int32_t Automaton::compute(int32_t state, uint8_t b) {
  const auto& elems = g_->elems;
  std::vector<std::vector<uint32_t>> work, out;
  {
    const std::vector<uint32_t>& key = states_[static_cast<size_t>(state)].key;
    for (size_t i = 0; i < key.size();) {
      size_t len = key[i];
      if (len > 0) {
        uint32_t top = key[i + len];
        if (g_->sets[elem_payload(elems[top])].test(b)) {
          std::vector<uint32_t> s(key.begin() + static_cast<std::ptrdiff_t>(i + 1),
                                  key.begin() + static_cast<std::ptrdiff_t>(i + 1 + len));
          if (elem_kind(elems[top + 1]) == ElemKind::End)
            s.pop_back();
          else
            s.back() = top + 1;
          work.push_back(std::move(s));
        }
      }
      i += len + 1;
    }
  }
  int32_t result = kDead;
  if (!work.empty()) {
    closure(work, out);
    if (!out.empty()) result = intern(std::move(out));
  }
  trans_[static_cast<size_t>(state) * n_classes_ + byte_class_[b]] = result;
  return result;
}

std::optional<std::string> Automaton::shortest_completion(int32_t state, size_t max_states) {
  struct Visit {
    int32_t parent;
    uint8_t byte;
  };
  std::unordered_map<int32_t, Visit> seen{{state, {-1, 0}}};
  std::vector<int32_t> queue{state};
  for (size_t head = 0; head < queue.size() && seen.size() <= max_states; ++head) {
    int32_t s = queue[head];
    if (complete(s)) {
      std::string out;
      for (int32_t cur = s; cur != state; cur = seen[cur].parent) out += static_cast<char>(seen[cur].byte);
      std::reverse(out.begin(), out.end());
      return out;
    }
    for (uint32_t c = 0; c < n_classes_; ++c) {
      int32_t t = next(s, class_rep_[c]);
      if (t != kDead && seen.emplace(t, Visit{s, class_rep_[c]}).second) queue.push_back(t);
    }
  }
  return std::nullopt;
}

Automaton::Multibyte Automaton::multibyte_kind(int32_t state, int32_t target) {
  // Byte classes are exact (every byte of a class moves every state alike), so one byte per class and range
  // position covers all characters.
  auto reps_in = [&](uint8_t lo, uint8_t hi) {
    std::vector<uint8_t> reps;
    std::vector<bool> seen(n_classes_, false);
    for (int b = lo; b <= hi; ++b)
      if (!seen[byte_class_[b]]) {
        seen[byte_class_[b]] = true;
        reps.push_back(static_cast<uint8_t>(b));
      }
    return reps;
  };
  const std::vector<uint8_t> cont = reps_in(0x80, 0xBF);
  std::vector<std::pair<int32_t, int>> frontier;  // (state, continuation bytes still due)
  bool any_dead = false, any_target = false;
  auto outcome = [&](int32_t s) {
    if (s == kDead)
      any_dead = true;
    else if (s == target)
      any_target = true;
    else
      return false;
    return !(any_dead && any_target);
  };
  for (int lead = 0xC2; lead <= 0xF4; ++lead) {
    int n = lead <= 0xDF ? 1 : lead <= 0xEF ? 2 : 3;
    uint8_t lo = 0x80, hi = 0xBF;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
    int32_t s1 = next(state, static_cast<uint8_t>(lead));
    if (s1 == kDead) {
      if (!outcome(kDead)) return Multibyte::Mixed;
      continue;
    }
    for (uint8_t b2 : reps_in(lo, hi)) {
      frontier.assign(1, {next(s1, b2), n - 1});
      while (!frontier.empty()) {
        auto [s, left] = frontier.back();
        frontier.pop_back();
        if (s == kDead || left == 0) {
          if (!outcome(s)) return Multibyte::Mixed;
          continue;
        }
        for (uint8_t b : cont) frontier.push_back({next(s, b), left - 1});
      }
    }
  }
  return any_target ? Multibyte::ToTarget : Multibyte::Dead;
}

bool Automaton::shrink_if_above(size_t max_states, std::vector<int32_t*> keep) {
  if (states_.size() <= max_states) return false;
  std::vector<State> old = std::move(states_);
  states_.clear();
  ids_.clear();
  trans_.clear();
  auto reintern = [&](int32_t id) {
    std::vector<std::vector<uint32_t>> stacks;
    const auto& key = old[static_cast<size_t>(id)].key;
    for (size_t i = 0; i < key.size(); i += key[i] + 1)
      stacks.emplace_back(key.begin() + static_cast<std::ptrdiff_t>(i + 1),
                          key.begin() + static_cast<std::ptrdiff_t>(i + 1 + key[i]));
    return intern(std::move(stacks));
  };
  initial_ = reintern(initial_);
  for (int32_t* p : keep)
    if (*p >= 0) *p = reintern(*p);
  return true;
}

}  // namespace tern::grammar
