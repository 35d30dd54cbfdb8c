// Per character class, how every token of a vocabulary starts: the class tables behind cheap cold masks inside
// counted strings and repetitions (see Matcher).
//
// A class is a set of ASCII bytes, plus optionally every whole multi-byte UTF-8 character. For each token, its
// "class prefix" is the number of leading characters in the class. A token made only of class characters is "full";
// any other token "exits" the class after its prefix (at a byte outside the class, or a partial or invalid UTF-8
// character). Inside a chain of automaton states S0 -> S1 -> ... where every class character moves Si to Si+1, a
// full token of c characters is accepted from S0 exactly when c is within the chain, and a token with class prefix
// p that exits is accepted exactly when its bytes after the prefix are accepted from Sp. Exits are trie subtrees
// grouped by (p, first byte), so a group whose first byte is dead from Sp is skipped without looking at its tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tern::grammar {

class VocabularyImpl;

struct CharClass {
  uint64_t ascii_lo = 0, ascii_hi = 0;  // bit b: byte b (0..63), byte 64 + b (64..127)
  bool multibyte = false;               // every whole multi-byte character is in the class
  bool operator==(const CharClass&) const = default;
  bool has_ascii(uint8_t b) const { return b < 64 ? (ascii_lo >> b) & 1 : b < 128 && ((ascii_hi >> (b - 64)) & 1); }
};

struct ClassTable {
  struct Full {
    int32_t id;
    uint16_t chars;
  };
  // Where tokens leave the class, as trie nodes [begin, end) to walk (a subtree, or a single node: a token that
  // ends inside a multi-byte class character), reached from the chain state at the class prefix by `partial`
  // (the bytes of a multi-byte character begun before `begin`; none at a character boundary).
  struct Exit {
    uint32_t begin, end;
    uint8_t n_partial;
    uint8_t partial[3];
  };
  struct Group {
    uint16_t prefix;  // class characters before the exit
    uint8_t byte;     // the first byte after them
    uint32_t begin, end;  // into exits
  };
  CharClass cls;
  std::vector<uint32_t> full_bits;   // mask words: the full tokens
  std::vector<Full> full_by_chars;   // the full tokens, most characters first
  std::vector<Exit> exits;           // ordered by (prefix, byte)
  std::vector<Group> groups;         // ordered by (prefix, byte)
  int max_prefix = 0;                // the longest class prefix of any token (full tokens: all their characters)
  int multibyte_depth = 0;           // 1 + index of the deepest multi-byte class character in any class prefix
};

// One pass over the vocabulary's trie, visiting the nodes whose path is in the class and their children.
ClassTable build_class_table(const VocabularyImpl& vocab, const CharClass& cls);

// The characters of a JSON string that need no escape (U+0020 and up, except '"' and '\\'): the class of every
// string in a JSON grammar, so its table is built with the vocabulary rather than on a first mask.
CharClass json_string_class();

}  // namespace tern::grammar
