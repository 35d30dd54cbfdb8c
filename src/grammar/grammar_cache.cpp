// A small cache of compiled grammars keyed by their source (the schema text, the tools), so that requests that
// repeat a schema reuse one Grammar, and with it the warm automaton and masks its Matchers share.
#include <list>
#include <mutex>

#include "grammar/schema_compiler.h"

namespace tern::grammar {

namespace {
constexpr size_t kCachedGrammars = 16;
}

GrammarPtr cached_grammar(const std::string& key, const std::function<GrammarPtr()>& build) {
  static std::mutex mu;
  static std::list<std::pair<std::string, GrammarPtr>> lru;  // most recent first
  {
    std::lock_guard lock(mu);
    for (auto it = lru.begin(); it != lru.end(); ++it)
      if (it->first == key) {
        lru.splice(lru.begin(), lru, it);
        return it->second;
      }
  }
  GrammarPtr g = build();  // outside the lock: compiling may take a while; a racing duplicate is harmless
  std::lock_guard lock(mu);
  lru.emplace_front(key, g);
  if (lru.size() > kCachedGrammars) lru.pop_back();
  return g;
}

}  // namespace tern::grammar
