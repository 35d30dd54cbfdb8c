#include "grammar/automaton.h"

#include <algorithm>

#include "core/check.h"

namespace tern::grammar {

namespace {
// Bounds that keep a pathological grammar from eating the machine. Grammars compiled from schemas are far below
// them (stack depth ~ 3 x JSON nesting); a stack that would exceed them is dropped (its continuations are lost).
constexpr size_t kMaxStackDepth = 2048;
constexpr size_t kMaxClosureStacks = 100000;
// What the states may hold in all (their stacks, kept twice: the state and its lookup key; and the signatures of
// the transitions computed). A grammar that needs more at some point of its output is refused there, with an error
// the request sees (a 400), rather than growing the process by gigabytes: schema patterns with many ambiguous
// continuations can ask for ~1 GB per mask otherwise. Grammars compiled from ordinary schemas use a few MB.
constexpr size_t kMaxStoredBytes = size_t(64) << 20;

size_t hash_positions(const uint32_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return static_cast<size_t>(h ^ (h >> 29));
}
}  // namespace

size_t Automaton::KeyHash::operator()(std::span<const uint32_t> k) const { return hash_positions(k.data(), k.size()); }

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

  arena_.clear();
  std::vector<uint32_t> work;
  for (uint32_t a : g_->rules[g_->start_rule]) {
    bool end = elem_kind(g_->elems[a]) == ElemKind::End;
    work.push_back(push_record(&a, end ? 0 : 1));
  }
  closure(work);
  initial_ = intern_closed();
}

uint32_t Automaton::push_record(const uint32_t* positions, uint32_t length) {
  uint32_t o = static_cast<uint32_t>(arena_.size());
  arena_.push_back(length);
  arena_.insert(arena_.end(), positions, positions + length);
  return o;
}

// Expands references until every stack's top is a byte set (or the stack is empty: complete). Records are
// deduplicated through `seen_`, an open-addressing table of offsets + 1 (0: empty).
void Automaton::closure(std::vector<uint32_t>& todo) {
  const auto& elems = g_->elems;
  closed_.clear();
  size_t count = 0;
  seen_.assign(64, 0u);
  auto insert = [&](uint32_t o) {  // false: a duplicate, or over the bounds
    if (arena_[o] > kMaxStackDepth || count >= kMaxClosureStacks) return false;
    if ((count + 1) * 2 > seen_.size()) {  // grow and rehash
      std::vector<uint32_t> old = std::move(seen_);
      seen_.assign(old.size() * 2, 0u);
      for (uint32_t x : old) {
        if (!x) continue;
        size_t i = hash_positions(&arena_[x], arena_[x - 1]) & (seen_.size() - 1);  // x - 1: the record
        while (seen_[i]) i = (i + 1) & (seen_.size() - 1);
        seen_[i] = x;
      }
    }
    const uint32_t* r = &arena_[o + 1];
    const uint32_t len = arena_[o];
    size_t i = hash_positions(r, len) & (seen_.size() - 1);
    for (; seen_[i]; i = (i + 1) & (seen_.size() - 1)) {
      uint32_t x = seen_[i] - 1;  // the record
      if (arena_[x] == len && std::equal(r, r + len, &arena_[x + 1])) return false;
    }
    seen_[i] = o + 1;
    ++count;
    return true;
  };
  size_t kept = 0;
  for (uint32_t o : todo)
    if (insert(o)) todo[kept++] = o;
  todo.resize(kept);
  while (!todo.empty()) {
    uint32_t o = todo.back();
    todo.pop_back();
    uint32_t len = arena_[o];
    if (len == 0 || elem_kind(elems[arena_[o + len]]) == ElemKind::Bytes) {
      closed_.push_back(o);
      continue;
    }
    // A reference: continue after it (or return, when it ends its alternative), entering each alternative.
    uint32_t top = arena_[o + len];
    uint32_t rule = elem_payload(elems[top]);
    uint32_t after = top + 1;
    bool pop = elem_kind(elems[after]) == ElemKind::End;
    uint32_t base = pop ? len - 1 : len;
    for (uint32_t a : g_->rules[rule]) {
      bool enter = elem_kind(elems[a]) != ElemKind::End;
      uint32_t n = base + (enter ? 1 : 0);
      uint32_t no = static_cast<uint32_t>(arena_.size());
      arena_.resize(no + 1 + n);
      uint32_t* d = arena_.data();
      d[no] = n;
      std::copy(d + o + 1, d + o + 1 + base, d + no + 1);
      if (!pop) d[no + len] = after;
      if (enter) d[no + 1 + base] = a;
      if (insert(no))
        todo.push_back(no);
      else
        arena_.resize(no);
    }
  }
}

int32_t Automaton::intern_closed() {
  const uint32_t* d = arena_.data();
  std::sort(closed_.begin(), closed_.end(), [d](uint32_t x, uint32_t y) {
    return std::lexicographical_compare(d + x + 1, d + x + 1 + d[x], d + y + 1, d + y + 1 + d[y]);
  });
  key_.clear();
  bool complete = false;
  for (uint32_t o : closed_) {
    if (d[o] == 0) complete = true;
    key_.insert(key_.end(), d + o, d + o + 1 + d[o]);
  }
  auto it = ids_.find(std::span<const uint32_t>(key_));
  if (it != ids_.end()) return it->second;
  stored_bytes_ += 2 * key_.size() * sizeof(uint32_t);
  TERN_CHECK(stored_bytes_ <= kMaxStoredBytes, "the output constraint is too complex at this point of the output: its "
             "recogniser would hold more than ", kMaxStoredBytes >> 20, " MB of parse states (", closed_.size(),
             " ambiguous continuations); simplify the schema (e.g. a pattern with nested or overlapping repetitions)");
  State st;
  st.n_stacks = static_cast<uint32_t>(closed_.size());
  st.complete = complete;
  st.key = key_;
  int32_t id = static_cast<int32_t>(states_.size());
  ids_.emplace(st.key, id);
  states_.push_back(std::move(st));
  trans_.resize(states_.size() * n_classes_, kUnknown);
  return id;
}

int32_t Automaton::compute(int32_t state, uint8_t b) {
  const auto& elems = g_->elems;
  const size_t column = static_cast<size_t>(state) * n_classes_ + byte_class_[b];
  const std::vector<uint32_t>& key = states_[static_cast<size_t>(state)].key;
  std::vector<uint64_t>& signature = signature_;
  signature.assign((states_[static_cast<size_t>(state)].n_stacks + 63) / 64, 0);
  {
    size_t k = 0;
    for (size_t i = 0; i < key.size(); i += key[i] + 1, ++k)
      if (key[i] > 0 && g_->sets[elem_payload(elems[key[i + key[i]]])].test(b)) signature[k / 64] |= 1ull << (k % 64);
    for (const auto& [sig, target] : states_[static_cast<size_t>(state)].by_signature)
      if (sig == signature) return trans_[column] = target;
  }
  arena_.clear();
  std::vector<uint32_t>& work = work_;
  work.clear();
  for (size_t i = 0; i < key.size(); i += key[i] + 1) {
    uint32_t len = key[i];
    if (len == 0) continue;
    uint32_t top = key[i + len];
    if (!g_->sets[elem_payload(elems[top])].test(b)) continue;
    // Past the byte: the next element of the alternative, or return when it ends.
    bool pop = elem_kind(elems[top + 1]) == ElemKind::End;
    uint32_t o = push_record(&key[i + 1], pop ? len - 1 : len);
    if (!pop) arena_[o + len] = top + 1;
    work.push_back(o);
  }
  int32_t result = kDead;
  if (!work.empty()) {
    closure(work);
    if (!closed_.empty()) result = intern_closed();  // (may grow states_: `key` is not used after this)
  }
  trans_[column] = result;
  states_[static_cast<size_t>(state)].by_signature.emplace_back(signature, result);
  stored_bytes_ += signature.size() * sizeof(uint64_t);
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
  // position covers all characters, and leads of one class with the same continuation ranges behave alike.
  if (lead_plan_.empty()) {
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
    cont_reps_ = reps_in(0x80, 0xBF);
    for (int lead = 0xC2; lead <= 0xF4; ++lead) {
      LeadPlan p;
      p.lead = static_cast<uint8_t>(lead);
      p.due = lead <= 0xDF ? 1 : lead <= 0xEF ? 2 : 3;
      uint8_t lo = 0x80, hi = 0xBF;
      if (lead == 0xE0) lo = 0xA0;
      if (lead == 0xED) hi = 0x9F;
      if (lead == 0xF0) lo = 0x90;
      if (lead == 0xF4) hi = 0x8F;
      p.second = reps_in(lo, hi);
      bool same = false;
      for (const LeadPlan& q : lead_plan_)
        same = same || (byte_class_[q.lead] == byte_class_[p.lead] && q.due == p.due && q.second == p.second);
      if (!same) lead_plan_.push_back(std::move(p));
    }
  }
  std::vector<std::pair<int32_t, int>> frontier, visited;  // (state, continuation bytes still due)
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
  for (const LeadPlan& p : lead_plan_) {
    int32_t s1 = next(state, p.lead);
    if (s1 == kDead) {
      if (!outcome(kDead)) return Multibyte::Mixed;
      continue;
    }
    for (uint8_t b2 : p.second) frontier.push_back({next(s1, b2), p.due - 1});
    while (!frontier.empty()) {
      std::pair<int32_t, int> at = frontier.back();
      frontier.pop_back();
      if (at.first == kDead || at.second == 0) {
        if (!outcome(at.first)) return Multibyte::Mixed;
        continue;
      }
      if (std::find(visited.begin(), visited.end(), at) != visited.end()) continue;
      visited.push_back(at);
      for (uint8_t b : cont_reps_) frontier.push_back({next(at.first, b), at.second - 1});
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
  stored_bytes_ = 0;
  auto reintern = [&](int32_t id) {  // its stacks are closed already
    const auto& key = old[static_cast<size_t>(id)].key;
    arena_.clear();
    closed_.clear();
    for (size_t i = 0; i < key.size(); i += key[i] + 1) closed_.push_back(push_record(&key[i + 1], key[i]));
    return intern_closed();
  };
  initial_ = reintern(initial_);
  for (int32_t* p : keep)
    if (*p >= 0) *p = reintern(*p);
  return true;
}

}  // namespace tern::grammar
