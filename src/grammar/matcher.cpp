// Matcher: one request's position in a grammar, and the per-step token mask.
//
// fill_mask walks the vocabulary's pre-order trie with the automaton: a node's state is its parent's state advanced
// by the node's byte (one table lookup once warm); a dead state skips the subtree. Inside text (strings, counted
// strings and repetitions, formats) a state's mask comes instead from the class table of its character class
// (class_table.h): a precomputed bitset of the tokens made of class characters, corrected for the chain of states
// those characters walk (a counted repetition's end), plus walks of only the trie subtrees that leave the class.
// That keeps a cold mask (a state never seen, e.g. each position of an email's counted local part) cheap. Masks are
// cached per automaton state, because most steps of a JSON document repeat a state (inside a string, after a
// comma, ...), and the automaton and masks are shared by every Matcher of the same compiled grammar (clones, later
// requests).
#include <algorithm>
#include <bit>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/check.h"
#include "grammar/automaton.h"
#include "grammar/vocabulary.h"

namespace tern::grammar {

namespace {
constexpr size_t kMaxAutomatonStates = 20000;  // ~20000 x (byte classes) x 4 bytes of transitions at most
constexpr size_t kMaskCacheBytes = 8 << 20;    // per engine; a dense mask of 248K ids is 31 KB

// A cached mask: the allowed ids when fewer than the mask's words, else the words themselves.
struct CachedMask {
  bool dense;
  std::vector<uint32_t> data;
};
}  // namespace

// How a state moves on its most common ASCII successor.
struct Uniform {
  int32_t next = -1;        // the state most ASCII bytes lead to (-1: every ASCII byte is dead)
  int count = 0;            // how many ASCII bytes lead there
  uint64_t lo = 0, hi = 0;  // those bytes
};

// What the Matchers of one grammar and vocabulary share (clones, and later requests with the same compiled
// grammar): the automaton and the masks of its states. Every use holds `mu`.
struct MatcherEngine {
  std::mutex mu;
  int users = 0;  // live Matchers holding state ids of this automaton
  std::shared_ptr<const VocabularyImpl> vocab;
  Automaton automaton;
  std::unordered_map<int32_t, CachedMask> masks;             // automaton state -> mask
  size_t mask_bytes = 0;                                     // held by `masks`
  std::unordered_map<int32_t, Uniform> uniforms;             // automaton state -> its looping bytes
  std::unordered_map<int32_t, std::pair<int32_t, Automaton::Multibyte>> multibytes;  // state -> (target, where
                                                                                       // its characters go)
  std::unordered_map<int32_t, std::pair<CharClass, int32_t>> steps;  // automaton state -> class_step()
  std::vector<int32_t> walk_states;                           // per trie depth
  std::vector<int32_t> chain;                                 // fill_class: S0, S1, ...

  MatcherEngine(const Grammar* g, std::shared_ptr<const VocabularyImpl> v) : vocab(std::move(v)), automaton(g) {}

  void set_end_ids(std::span<uint32_t> mask) const {
    for (int32_t id : vocab->end_ids()) mask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  }
  void clear_caches() {
    masks.clear();
    mask_bytes = 0;
    uniforms.clear();
    multibytes.clear();
    steps.clear();
  }

  // Every token through the trie. The table pointer is re-read only after a transition had to be computed.
  void walk(int32_t from, std::span<uint32_t> mask) {
    walk_nodes(from, 0, static_cast<uint32_t>(vocab->nodes().size()), mask);
  }
  // The trie nodes [begin, end) (whole subtrees, or a single node), `from` being the state at begin's parent.
  void walk_nodes(int32_t from, uint32_t begin, uint32_t end, std::span<uint32_t> mask) {
    const TrieNode* nodes = vocab->nodes().data();
    const int32_t* extra = vocab->extra_tokens().data();
    walk_states.resize(static_cast<size_t>(vocab->max_depth()) + 1);
    int32_t* st = walk_states.data();
    st[nodes[begin].depth - 1] = from;
    uint32_t* m = mask.data();
    uint32_t sink = 0;
    const uint8_t* cls = automaton.byte_classes();
    const size_t nc = automaton.n_classes();
    const int32_t* table = automaton.table();
    for (uint32_t i = begin; i < end;) {
      const TrieNode& nd = nodes[i];
      int32_t parent = st[nd.depth - 1];
      int32_t to = table[static_cast<size_t>(parent) * nc + cls[nd.byte]];
      if (to < 0) [[unlikely]] {
        if (to == Automaton::kUnknown) {
          to = automaton.next(parent, nd.byte);
          table = automaton.table();
        }
        if (to == Automaton::kDead) {
          i = nd.skip;
          continue;
        }
      }
      st[nd.depth] = to;
      uint32_t id = static_cast<uint32_t>(nd.token);
      uint32_t* word = nd.token >= 0 ? &m[id >> 5] : &sink;
      *word |= 1u << (id & 31);
      for (uint32_t k = 0; k < nd.extra_count; ++k) {
        uint32_t x = static_cast<uint32_t>(extra[nd.extra_begin + k]);
        m[x >> 5] |= 1u << (x & 31);
      }
      ++i;
    }
  }

  // Inside free text (a JSON string, raw tool-call text, a counted string, an email's local part) most ASCII
  // bytes, and often every multi-byte character, move a state to one common next state: to itself in a free
  // string, to the next position in a counted one. Those bytes are a character class (class_table.h), and along
  // the chain S0 -> S1 -> ... that its characters walk, the precomputed class table decides most tokens at once.
  const Uniform& uniform(int32_t state) {
    auto it = uniforms.find(state);
    if (it != uniforms.end()) return it->second;
    Uniform u;
    int32_t succ[128];
    std::unordered_map<int32_t, int> votes;
    for (int b = 0; b < 128; ++b) {
      succ[b] = automaton.next(state, static_cast<uint8_t>(b));
      if (succ[b] != Automaton::kDead) ++votes[succ[b]];
    }
    for (const auto& [t, n] : votes)
      if (n > u.count) u.next = t, u.count = n;
    if (u.next >= 0)
      for (int b = 0; b < 128; ++b)
        if (succ[b] == u.next) (b < 64 ? u.lo : u.hi) |= 1ull << (b & 63);
    return uniforms.emplace(state, u).first->second;  // (unordered_map references survive rehashing)
  }
  // The state every ASCII byte of the class leads to from `state`, or -1 when they do not all lead to one state.
  // Only the class's bytes are tried (one per byte class of the automaton): the chain's other transitions (a quote,
  // a backslash) are computed when a token needs them.
  int32_t class_step(int32_t state, const CharClass& c) {
    auto it = steps.find(state);
    if (it != steps.end() && it->second.first == c) return it->second.second;
    int32_t target = Automaton::kUnknown;
    bool seen[256] = {};
    const uint8_t* byte_class = automaton.byte_classes();
    for (int b = 0; b < 128 && target != Automaton::kDead; ++b) {
      if (!c.has_ascii(static_cast<uint8_t>(b)) || seen[byte_class[b]]) continue;
      seen[byte_class[b]] = true;
      int32_t s = automaton.next(state, static_cast<uint8_t>(b));
      target = target == Automaton::kUnknown || s == target ? s : Automaton::kDead;
    }
    if (target < 0) target = -1;
    steps[state] = {c, target};
    return target;
  }
  // Where the whole multi-byte characters lead from `state`, relative to its uniform successor. Costs a few dozen
  // transitions, so it is asked only where a token needs it.
  Automaton::Multibyte multibyte(int32_t state, int32_t target) {
    auto it = multibytes.find(state);
    if (it != multibytes.end() && it->second.first == target) return it->second.second;
    Automaton::Multibyte kind = automaton.multibyte_kind(state, target);
    multibytes[state] = {target, kind};
    return kind;
  }

  static constexpr int kMinUniformAscii = 48;  // fewer uniform bytes: the trie prunes well enough

  // The state after `bytes` from `s`, or kDead.
  int32_t run(int32_t s, const uint8_t* bytes, size_t n) {
    for (size_t i = 0; i < n && s != Automaton::kDead; ++i) s = automaton.next(s, bytes[i]);
    return s;
  }
  // No character of the class can follow `state`.
  bool refuses_class(int32_t state, const CharClass& c) {
    for (int b = 0; b < 128; ++b)
      if (c.has_ascii(static_cast<uint8_t>(b)) && automaton.next(state, static_cast<uint8_t>(b)) != Automaton::kDead)
        return false;
    if (c.multibyte)
      for (int lead = 0xC2; lead <= 0xF4; ++lead)
        if (automaton.next(state, static_cast<uint8_t>(lead)) != Automaton::kDead) return false;
    return true;
  }

  // The mask from the class table of `state`'s uniform bytes. Exact: a full token of c characters is accepted
  // exactly when c is within the verified chain (every class character moves Si to Si+1), and every other token
  // runs through the automaton (its bytes after its class prefix p, from Sp; a group of them is skipped at once
  // when its first byte is dead there). Tokens with more class characters than the chain holds are refused when
  // the chain's last state takes no class character (the end of a counted repetition); when it does take one
  // (rare: a narrower class or other multi-byte rules follow), this returns false with the mask untouched and
  // the whole-trie walk gives the answer.
  bool fill_class(int32_t state, const ClassTable& t, std::span<uint32_t> mask) {
    const CharClass& c = t.cls;
    chain.assign(1, state);
    bool loops = false;  // the last chain state moves to itself: the chain never ends
    while (static_cast<int>(chain.size()) - 1 < t.max_prefix) {
      int32_t cur = chain.back();
      int32_t next = class_step(cur, c);
      if (next < 0) break;
      if (c.multibyte && static_cast<int>(chain.size()) - 1 < t.multibyte_depth &&
          multibyte(cur, next) != Automaton::Multibyte::ToTarget)
        break;
      if (next == cur) {
        loops = true;
        break;
      }
      chain.push_back(next);
    }
    const int depth = loops ? INT32_MAX : static_cast<int>(chain.size()) - 1;
    const int32_t last = chain.back();
    const bool refused_beyond = !loops && depth < t.max_prefix && refuses_class(last, c);
    size_t beyond = 0;  // full tokens with more characters than the chain holds
    while (beyond < t.full_by_chars.size() && t.full_by_chars[beyond].chars > depth) ++beyond;
    if (!refused_beyond && (beyond > 0 || (!t.groups.empty() && t.groups.back().prefix > depth))) return false;
    uint32_t* m = mask.data();
    const uint32_t* full = t.full_bits.data();
    for (size_t w = 0; w < mask.size(); ++w) m[w] |= full[w];
    for (size_t k = 0; k < beyond; ++k) {  // refused
      const uint32_t id = static_cast<uint32_t>(t.full_by_chars[k].id);
      m[id >> 5] &= ~(1u << (id & 31));
    }
    for (const ClassTable::Group& g : t.groups) {
      if (g.prefix > depth) break;  // refused (groups are ordered by prefix)
      const int32_t at = chain[std::min(static_cast<size_t>(g.prefix), chain.size() - 1)];
      if (automaton.next(at, g.byte) == Automaton::kDead) continue;
      for (uint32_t k = g.begin; k < g.end; ++k) {
        const ClassTable::Exit& e = t.exits[k];
        int32_t from = run(at, e.partial, e.n_partial);
        if (from != Automaton::kDead) walk_nodes(from, e.begin, e.end, mask);
      }
    }
    return true;
  }

  void fill(int32_t state, std::span<uint32_t> mask) {
    const Uniform& u = uniform(state);
    if (u.count >= kMinUniformAscii) {
      CharClass c{u.lo, u.hi, multibyte(state, u.next) == Automaton::Multibyte::ToTarget};
      std::shared_ptr<const ClassTable> t = vocab->class_table(c);
      if (fill_class(state, *t, mask)) return;
    }
    walk(state, mask);
  }
};

struct Matcher::Impl {
  GrammarPtr grammar;  // keeps the grammar the automaton reads alive
  std::shared_ptr<MatcherEngine> engine;
  int32_t state = 0;
  bool ended = false;  // an end id was accepted
  std::string text;

  Impl() = default;
  Impl(const Impl& o) : grammar(o.grammar), engine(o.engine), state(o.state), ended(o.ended), text(o.text) {
    std::lock_guard lock(engine->mu);
    ++engine->users;
  }
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    if (!engine) return;
    std::lock_guard lock(engine->mu);
    --engine->users;
  }

  // The automaton is rebuilt small when it grew too large, unless other Matchers hold ids into it.
  void maybe_shrink() {
    if (engine->users == 1 && engine->automaton.shrink_if_above(kMaxAutomatonStates, {&state})) engine->clear_caches();
  }
  bool advance(std::string_view bytes) {
    Automaton& a = engine->automaton;
    int32_t st = state;
    for (char c : bytes) {
      st = a.next(st, static_cast<uint8_t>(c));
      if (st == Automaton::kDead) return false;
    }
    state = st;
    text.append(bytes);
    return true;
  }
};

Matcher::Matcher(GrammarPtr grammar, std::shared_ptr<const TokenVocabulary> vocab) {
  TERN_CHECK(grammar != nullptr, "Matcher: no grammar");
  auto v = std::dynamic_pointer_cast<const VocabularyImpl>(vocab);
  TERN_CHECK(v != nullptr, "Matcher: the vocabulary was not made by TokenVocabulary::from_*");
  impl_ = std::make_unique<Impl>();
  impl_->grammar = grammar;
  // Join the grammar's engine when it serves this vocabulary and has room; else start one and publish it.
  std::lock_guard slot(grammar->engine_mu);
  std::shared_ptr<MatcherEngine> e;
  if (grammar->engine && grammar->engine_vocab == v.get()) {
    e = std::static_pointer_cast<MatcherEngine>(grammar->engine);
    bool full;
    {
      std::lock_guard lock(e->mu);
      full = e->automaton.state_count() > kMaxAutomatonStates / 2;
    }
    if (full) e.reset();
  }
  if (!e) {
    e = std::make_shared<MatcherEngine>(grammar.get(), v);
    grammar->engine = e;
    grammar->engine_vocab = v.get();
  }
  std::lock_guard lock(e->mu);
  ++e->users;
  impl_->engine = e;
  impl_->state = e->automaton.initial();
}
Matcher::~Matcher() = default;
Matcher::Matcher(Matcher&&) noexcept = default;
Matcher& Matcher::operator=(Matcher&&) noexcept = default;

Matcher Matcher::clone() const {
  Matcher m;
  m.impl_ = std::make_unique<Impl>(*impl_);
  return m;
}

void Matcher::fill_mask(std::span<uint32_t> mask) {
  Impl& s = *impl_;
  MatcherEngine& e = *s.engine;
  std::lock_guard lock(e.mu);
  TERN_CHECK(static_cast<int64_t>(mask.size()) == e.vocab->mask_words(), "fill_mask: mask has ", mask.size(),
             " words, the vocabulary needs ", e.vocab->mask_words());
  std::fill(mask.begin(), mask.end(), 0u);
  if (s.ended || e.automaton.finished(s.state)) {
    e.set_end_ids(mask);
    return;
  }
  auto it = e.masks.find(s.state);
  if (it != e.masks.end()) {
    const CachedMask& c = it->second;
    if (c.dense) {
      std::memcpy(mask.data(), c.data.data(), mask.size() * sizeof(uint32_t));
    } else {
      for (uint32_t id : c.data) mask[id >> 5] |= 1u << (id & 31);
    }
    return;
  }
  s.maybe_shrink();
  e.fill(s.state, mask);
  if (e.automaton.complete(s.state)) e.set_end_ids(mask);
  CachedMask c;
  size_t set = 0;
  for (uint32_t w : mask) set += static_cast<size_t>(std::popcount(w));
  c.dense = set >= mask.size();
  if (c.dense) {
    c.data.assign(mask.begin(), mask.end());
  } else {
    c.data.reserve(set);
    for (size_t w = 0; w < mask.size(); ++w)
      for (uint32_t bits = mask[w]; bits; bits &= bits - 1)
        c.data.push_back(static_cast<uint32_t>(w * 32 + static_cast<size_t>(std::countr_zero(bits))));
  }
  size_t bytes = c.data.size() * sizeof(uint32_t) + 64;
  if (e.mask_bytes + bytes > kMaskCacheBytes) {
    e.masks.clear();
    e.mask_bytes = 0;
  }
  e.mask_bytes += bytes;
  e.masks.emplace(s.state, std::move(c));
}

bool Matcher::accept(int32_t id) {
  Impl& s = *impl_;
  if (s.ended) return false;
  std::lock_guard lock(s.engine->mu);
  const VocabularyImpl& v = *s.engine->vocab;
  if (v.is_end(id)) {
    if (!s.engine->automaton.complete(s.state)) return false;
    s.ended = true;
    return true;
  }
  const std::string* bytes = v.bytes(id);
  if (!bytes) return false;
  s.maybe_shrink();
  return s.advance(*bytes);
}

bool Matcher::accept_bytes(std::string_view bytes) {
  Impl& s = *impl_;
  if (s.ended) return false;
  std::lock_guard lock(s.engine->mu);
  s.maybe_shrink();
  return s.advance(bytes);
}

std::optional<std::string> Matcher::shortest_completion() {
  if (impl_->ended) return std::string();
  std::lock_guard lock(impl_->engine->mu);
  return impl_->engine->automaton.shortest_completion(impl_->state, 20000);
}

bool Matcher::complete() const {
  std::lock_guard lock(impl_->engine->mu);
  return impl_->engine->automaton.complete(impl_->state);
}
bool Matcher::done() const {
  if (impl_->ended) return true;
  std::lock_guard lock(impl_->engine->mu);
  return impl_->engine->automaton.finished(impl_->state);
}
const std::string& Matcher::text() const { return impl_->text; }

}  // namespace tern::grammar
