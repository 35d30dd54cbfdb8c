#include "grammar/class_table.h"

#include <algorithm>

#include "grammar/vocabulary.h"

namespace tern::grammar {

CharClass json_string_class() {
  CharClass c;
  c.multibyte = true;
  for (int b = 0x20; b < 0x80; ++b)
    if (b != '"' && b != '\\') (b < 64 ? c.ascii_lo : c.ascii_hi) |= 1ull << (b & 63);
  return c;
}

ClassTable build_class_table(const VocabularyImpl& vocab, const CharClass& cls) {
  ClassTable t;
  t.cls = cls;
  t.full_bits.assign(static_cast<size_t>(vocab.mask_words()), 0u);
  const std::vector<TrieNode>& nodes = vocab.nodes();
  const std::vector<int32_t>& extra = vocab.extra_tokens();
  // Along the current trie path, per depth: class characters so far, continuation bytes still due in the current
  // multi-byte character, the allowed range of the next one, and the bytes of that character so far.
  struct At {
    uint16_t chars;
    uint8_t due, lo, hi;
    uint8_t n_partial;
    uint8_t partial[3];
  };
  std::vector<At> path(static_cast<size_t>(vocab.max_depth()) + 1);
  path[0] = At{0, 0, 0, 0, 0, {0, 0, 0}};
  struct Keyed {
    uint32_t key;  // prefix * 256 + first byte
    ClassTable::Exit e;
  };
  std::vector<Keyed> exits;
  std::vector<ClassTable::Full> full;
  auto add_full = [&](int32_t id, uint16_t chars) {
    full.push_back({id, chars});
    t.full_bits[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
  };
  auto add_exit = [&](const At& at, uint32_t begin, uint32_t end, uint8_t byte) {
    ClassTable::Exit e{begin, end, at.n_partial, {at.partial[0], at.partial[1], at.partial[2]}};
    uint8_t first = at.n_partial > 0 ? at.partial[0] : byte;
    exits.push_back({at.chars * 256u + first, e});
  };
  for (uint32_t i = 0; i < nodes.size();) {
    const TrieNode& nd = nodes[i];
    const At& up = path[nd.depth - 1];
    At& at = path[nd.depth];
    const uint8_t b = nd.byte;
    bool in = false;        // the node's path is still in the class
    bool boundary = false;  // ... and ends at a character boundary
    if (up.due == 0) {
      if (b < 0x80) {
        in = boundary = cls.has_ascii(b);
        at = At{static_cast<uint16_t>(up.chars + 1), 0, 0, 0, 0, {0, 0, 0}};
      } else if (cls.multibyte && b >= 0xC2 && b <= 0xF4) {
        in = true;
        uint8_t due = b <= 0xDF ? 1 : b <= 0xEF ? 2 : 3;
        uint8_t lo = b == 0xE0 ? 0xA0 : b == 0xF0 ? 0x90 : 0x80, hi = b == 0xED ? 0x9F : b == 0xF4 ? 0x8F : 0xBF;
        at = At{up.chars, due, lo, hi, 1, {b, 0, 0}};
      }
    } else if (b >= up.lo && b <= up.hi) {
      in = true;
      if (up.due == 1) {
        boundary = true;
        t.multibyte_depth = std::max(t.multibyte_depth, up.chars + 1);
        at = At{static_cast<uint16_t>(up.chars + 1), 0, 0, 0, 0, {0, 0, 0}};
      } else {
        at = At{up.chars, static_cast<uint8_t>(up.due - 1), 0x80, 0xBF, static_cast<uint8_t>(up.n_partial + 1),
                {up.partial[0], up.partial[1], up.partial[2]}};
        at.partial[up.n_partial] = b;
      }
    }
    if (!in) {  // the whole subtree leaves the class here
      add_exit(up, i, nd.skip, b);
      i = nd.skip;
      continue;
    }
    if (nd.token >= 0) {
      if (boundary) {
        add_full(nd.token, at.chars);
        for (uint32_t k = 0; k < nd.extra_count; ++k) add_full(extra[nd.extra_begin + k], at.chars);
      } else {
        add_exit(up, i, i + 1, b);  // ends inside a character: this node alone
      }
    }
    t.max_prefix = std::max(t.max_prefix, static_cast<int>(at.chars));
    ++i;
  }
  // Full tokens by characters, most first (a counting sort: at most max_prefix + 1 keys); exits by (prefix, first
  // byte), stable so that each group keeps trie order.
  std::vector<uint32_t> full_start(static_cast<size_t>(t.max_prefix) + 2, 0);
  for (const ClassTable::Full& f : full) ++full_start[static_cast<size_t>(t.max_prefix - f.chars) + 1];
  for (size_t k = 1; k < full_start.size(); ++k) full_start[k] += full_start[k - 1];
  t.full_by_chars.resize(full.size());
  for (const ClassTable::Full& f : full) t.full_by_chars[full_start[static_cast<size_t>(t.max_prefix - f.chars)]++] = f;
  std::stable_sort(exits.begin(), exits.end(), [](const Keyed& a, const Keyed& b) { return a.key < b.key; });
  t.exits.reserve(exits.size());
  for (size_t i = 0; i < exits.size(); ++i) {
    if (i == 0 || exits[i].key != exits[i - 1].key)
      t.groups.push_back({static_cast<uint16_t>(exits[i].key >> 8), static_cast<uint8_t>(exits[i].key & 255),
                          static_cast<uint32_t>(i), static_cast<uint32_t>(i)});
    t.exits.push_back(exits[i].e);
    t.groups.back().end = static_cast<uint32_t>(i + 1);
  }
  return t;
}

}  // namespace tern::grammar
