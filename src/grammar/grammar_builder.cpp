// Expr constructors and the lowering of Exprs into the flat Grammar (see grammar_impl.h).
#include <algorithm>
#include <functional>
#include <unordered_map>

#include "grammar/grammar_impl.h"

namespace tern::grammar {

// ---- Expr constructors -------------------------------------------------------------------------------------------

ExprPtr expr_empty() {
  static const ExprPtr e = std::make_shared<Expr>();
  return e;
}

ExprPtr expr_bytes(const ByteSet& set) {
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::Bytes;
  e->bytes = set;
  return e;
}

ExprPtr expr_byte_range(uint8_t lo, uint8_t hi) {
  ByteSet s;
  for (int b = lo; b <= hi; ++b) s.set(static_cast<size_t>(b));
  return expr_bytes(s);
}

ExprPtr expr_literal(std::string_view bytes) {
  std::vector<ExprPtr> items;
  items.reserve(bytes.size());
  for (char c : bytes) {
    uint8_t b = static_cast<uint8_t>(c);
    items.push_back(expr_byte_range(b, b));
  }
  return expr_seq(std::move(items));
}

ExprPtr expr_seq(std::vector<ExprPtr> items) {
  if (items.size() == 1) return items[0];
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::Seq;
  e->items = std::move(items);
  return e;
}

ExprPtr expr_alt(std::vector<ExprPtr> items) {
  if (items.size() == 1) return items[0];
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::Alt;
  e->items = std::move(items);
  return e;
}

ExprPtr expr_nothing() { return expr_alt({}); }

ExprPtr expr_repeat(ExprPtr item, int min, int max) {
  if (max == 0) return expr_empty();
  if (min == 1 && max == 1) return item;
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::Repeat;
  e->items = {std::move(item)};
  e->min = min;
  e->max = max;
  return e;
}

ExprPtr expr_optional(ExprPtr item) { return expr_repeat(std::move(item), 0, 1); }

ExprPtr expr_ref(int rule) {
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::Ref;
  e->rule = rule;
  return e;
}

// ---- Lowering ----------------------------------------------------------------------------------------------------

int GrammarBuilder::new_rule() {
  if (rules_.size() >= kElemPayloadMask) throw GrammarError("the grammar has too many rules");
  rules_.emplace_back();
  return static_cast<int>(rules_.size() - 1);
}

void GrammarBuilder::count(size_t n) {
  total_elems_ += n;
  if (total_elems_ > kMaxGrammarElems)
    throw GrammarError("the grammar is too large (more than " + std::to_string(kMaxGrammarElems) + " elements)");
}

uint32_t GrammarBuilder::set_index(const ByteSet& s) {
  auto [it, inserted] = set_ids_.try_emplace(s, static_cast<uint32_t>(sets_.size()));
  if (inserted) sets_.push_back(s);
  return it->second;
}

void GrammarBuilder::define(int rule, ExprPtr body) {
  if (rule < 0 || static_cast<size_t>(rule) >= rules_.size()) throw GrammarError("define: no such rule");
  if (rules_[static_cast<size_t>(rule)].defined) throw GrammarError("define: rule defined twice");
  rules_[static_cast<size_t>(rule)].defined = true;
  lower_rule(rule, body);
}

void GrammarBuilder::lower_rule(int rule, const ExprPtr& body) {
  std::vector<std::vector<uint32_t>> alts;
  if (body->kind == ExprKind::Alt) {
    for (const auto& item : body->items) {
      std::vector<uint32_t> seq;
      lower_seq_into(item, seq);
      alts.push_back(std::move(seq));
    }
  } else {
    std::vector<uint32_t> seq;
    lower_seq_into(body, seq);
    alts.push_back(std::move(seq));
  }
  for (const auto& a : alts) count(a.size() + 1);
  rules_[static_cast<size_t>(rule)].alts = std::move(alts);
}

uint32_t GrammarBuilder::lower_to_elem(const ExprPtr& e) {
  switch (e->kind) {
    case ExprKind::Bytes:
      return make_elem(ElemKind::Bytes, set_index(e->bytes));
    case ExprKind::Ref:
      return make_elem(ElemKind::Ref, static_cast<uint32_t>(e->rule));
    case ExprKind::Seq:
      if (e->items.size() == 1) return lower_to_elem(e->items[0]);
      break;
    default:
      break;
  }
  int r = new_rule();
  rules_[static_cast<size_t>(r)].defined = true;
  lower_rule(r, e);
  return make_elem(ElemKind::Ref, static_cast<uint32_t>(r));
}

void GrammarBuilder::lower_seq_into(const ExprPtr& e, std::vector<uint32_t>& out) {
  switch (e->kind) {
    case ExprKind::Bytes:
    case ExprKind::Ref:
      out.push_back(lower_to_elem(e));
      return;
    case ExprKind::Seq:
      for (const auto& item : e->items) lower_seq_into(item, out);
      return;
    case ExprKind::Alt:
      if (e->items.size() == 1) {
        lower_seq_into(e->items[0], out);
        return;
      }
      out.push_back(lower_to_elem(e));
      return;
    case ExprKind::Repeat: {
      if (e->min < 0 || e->min > kMaxRepeat || e->max > kMaxRepeat || (e->max >= 0 && e->max < e->min))
        throw GrammarError("repetition bounds {" + std::to_string(e->min) + "," + std::to_string(e->max) +
                           "} outside 0.." + std::to_string(kMaxRepeat));
      uint32_t x = lower_to_elem(e->items[0]);
      count(static_cast<size_t>(e->min));
      for (int i = 0; i < e->min; ++i) out.push_back(x);
      if (e->max < 0) {  // R = x R | ε
        int r = new_rule();
        auto& rr = rules_[static_cast<size_t>(r)];
        rr.defined = true;
        rr.alts = {{x, make_elem(ElemKind::Ref, static_cast<uint32_t>(r))}, {}};
        count(5);
        out.push_back(make_elem(ElemKind::Ref, static_cast<uint32_t>(r)));
      } else if (e->max > e->min) {  // R1 = x | ε, Rk = x R(k-1) | ε
        int prev = -1;
        for (int k = 1; k <= e->max - e->min; ++k) {
          int r = new_rule();
          auto& rr = rules_[static_cast<size_t>(r)];
          rr.defined = true;
          if (prev < 0)
            rr.alts = {{x}, {}};
          else
            rr.alts = {{x, make_elem(ElemKind::Ref, static_cast<uint32_t>(prev))}, {}};
          count(5);
          prev = r;
        }
        out.push_back(make_elem(ElemKind::Ref, static_cast<uint32_t>(prev)));
      }
      return;
    }
  }
}

// ---- Checks and layout -------------------------------------------------------------------------------------------

namespace {

// Rules that derive some string, or derive the empty string, by a worklist over alternatives: an alternative is
// "done" once every reference in it points to a rule already known to qualify.
std::vector<bool> rules_satisfying(const std::vector<std::vector<std::vector<uint32_t>>>& alts,
                                   const std::vector<ByteSet>& sets, bool nullable) {
  size_t n = alts.size();
  std::vector<bool> ok(n, false);
  struct AltRef {
    uint32_t rule, alt;
  };
  std::vector<std::vector<AltRef>> users(n);  // rule -> alternatives that reference it (once per occurrence)
  std::vector<std::vector<uint32_t>> pending(n);
  std::vector<uint32_t> queue;
  for (uint32_t r = 0; r < n; ++r) {
    pending[r].resize(alts[r].size());
    for (uint32_t a = 0; a < alts[r].size(); ++a) {
      bool dead = false;
      uint32_t refs = 0;
      for (uint32_t e : alts[r][a]) {
        if (elem_kind(e) == ElemKind::Bytes) {
          if (nullable || sets[elem_payload(e)].none()) dead = true;
        } else {
          ++refs;
        }
      }
      if (dead) {
        pending[r][a] = UINT32_MAX;
        continue;
      }
      pending[r][a] = refs;
      for (uint32_t e : alts[r][a])
        if (elem_kind(e) == ElemKind::Ref) users[elem_payload(e)].push_back({r, a});
      if (refs == 0 && !ok[r]) {
        ok[r] = true;
        queue.push_back(r);
      }
    }
  }
  while (!queue.empty()) {
    uint32_t r = queue.back();
    queue.pop_back();
    for (const AltRef& u : users[r]) {
      uint32_t& p = pending[u.rule][u.alt];
      if (p == UINT32_MAX || p == 0) continue;
      if (--p == 0 && !ok[u.rule]) {
        ok[u.rule] = true;
        queue.push_back(u.rule);
      }
    }
  }
  return ok;
}

// Strongly connected components (iterative Tarjan) of a graph given as adjacency lists.
std::vector<uint32_t> scc_ids(const std::vector<std::vector<uint32_t>>& adj) {
  size_t n = adj.size();
  const uint32_t kUnvisited = UINT32_MAX;
  std::vector<uint32_t> index(n, kUnvisited), low(n, 0), comp(n, kUnvisited);
  std::vector<bool> on_stack(n, false);
  std::vector<uint32_t> stack;
  struct Frame {
    uint32_t v;
    size_t next;
  };
  std::vector<Frame> call;
  uint32_t counter = 0, n_comp = 0;
  for (uint32_t s = 0; s < n; ++s) {
    if (index[s] != kUnvisited) continue;
    call.push_back({s, 0});
    index[s] = low[s] = counter++;
    stack.push_back(s);
    on_stack[s] = true;
    while (!call.empty()) {
      Frame& f = call.back();
      uint32_t v = f.v;
      if (f.next < adj[v].size()) {
        uint32_t w = adj[v][f.next++];
        if (index[w] == kUnvisited) {
          index[w] = low[w] = counter++;
          stack.push_back(w);
          on_stack[w] = true;
          call.push_back({w, 0});
        } else if (on_stack[w]) {
          low[v] = std::min(low[v], index[w]);
        }
        continue;
      }
      if (low[v] == index[v]) {
        for (;;) {
          uint32_t w = stack.back();
          stack.pop_back();
          on_stack[w] = false;
          comp[w] = n_comp;
          if (w == v) break;
        }
        ++n_comp;
      }
      call.pop_back();
      if (!call.empty()) low[call.back().v] = std::min(low[call.back().v], low[v]);
    }
  }
  return comp;
}

}  // namespace

GrammarPtr GrammarBuilder::build(int start_rule, std::string description) {
  size_t n = rules_.size();
  for (size_t r = 0; r < n; ++r)
    if (!rules_[r].defined) throw GrammarError("rule " + std::to_string(r) + " is referenced but never defined");
  std::vector<std::vector<std::vector<uint32_t>>> alts(n);
  for (size_t r = 0; r < n; ++r) alts[r] = std::move(rules_[r].alts);

  // Keep only alternatives that derive a finite string: then every state of the recogniser can still complete.
  std::vector<bool> productive = rules_satisfying(alts, sets_, false);
  if (!productive[static_cast<size_t>(start_rule)]) throw GrammarError("the grammar accepts no string");
  for (size_t r = 0; r < n; ++r) {
    auto& as = alts[r];
    as.erase(std::remove_if(as.begin(), as.end(),
                            [&](const std::vector<uint32_t>& a) {
                              for (uint32_t e : a) {
                                if (elem_kind(e) == ElemKind::Bytes && sets_[elem_payload(e)].none()) return true;
                                if (elem_kind(e) == ElemKind::Ref && !productive[elem_payload(e)]) return true;
                              }
                              return false;
                            }),
             as.end());
  }

  // Left recursion that grows the stack (a reference reachable again without consuming a byte, not in tail
  // position) would make the closure of a state infinite.
  std::vector<bool> nullable = rules_satisfying(alts, sets_, true);
  std::vector<std::vector<uint32_t>> adj(n);
  struct Edge {
    uint32_t from, to;
  };
  std::vector<Edge> growing;
  for (uint32_t r = 0; r < n; ++r)
    for (const auto& a : alts[r])
      for (size_t i = 0; i < a.size(); ++i) {
        uint32_t e = a[i];
        if (elem_kind(e) != ElemKind::Ref) break;
        uint32_t t = elem_payload(e);
        adj[r].push_back(t);
        if (i + 1 < a.size()) growing.push_back({r, t});
        if (!nullable[t]) break;
      }
  std::vector<uint32_t> comp = scc_ids(adj);
  for (const Edge& e : growing)
    if (comp[e.from] == comp[e.to]) throw GrammarError("the grammar is left-recursive (a reference cycle that consumes no input)");

  auto g = std::make_shared<Grammar>();
  g->sets = std::move(sets_);
  g->rules.resize(n);
  size_t total = 0;
  for (const auto& as : alts)
    for (const auto& a : as) total += a.size() + 1;
  g->elems.reserve(total);
  for (size_t r = 0; r < n; ++r)
    for (const auto& a : alts[r]) {
      g->rules[r].push_back(static_cast<uint32_t>(g->elems.size()));
      g->elems.insert(g->elems.end(), a.begin(), a.end());
      g->elems.push_back(make_elem(ElemKind::End, 0));
    }
  g->start_rule = static_cast<uint32_t>(start_rule);
  g->description = std::move(description);
  rules_.clear();
  sets_.clear();
  set_ids_.clear();
  return g;
}

}  // namespace tern::grammar
