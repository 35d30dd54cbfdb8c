// The concrete TokenVocabulary: token bytes and a prefix trie laid out in depth-first order.
//
// Trie layout: nodes in pre-order; node i is reached from its parent (the nearest earlier node of depth-1) by
// `byte`; its subtree is nodes [i, skip). A mask walks the array once and, when the grammar rejects a node's byte,
// jumps to `skip`, so every shared prefix is matched once and a rejected prefix prunes its whole subtree.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "grammar/class_table.h"
#include "grammar/grammar.h"

namespace tern::grammar {

struct TrieNode {
  uint32_t skip;         // first node after this subtree
  int32_t token;         // the id whose bytes end here, or -1
  uint32_t extra_begin;  // further ids with the same bytes (rare): extra_tokens[extra_begin, +extra_count)
  uint16_t depth;        // 1 for a child of the root
  uint8_t byte;
  uint8_t extra_count;
};

class VocabularyImpl final : public TokenVocabulary {
 public:
  VocabularyImpl(std::vector<std::string> tokens, std::vector<bool> allowed, int64_t rows,
                 std::vector<int32_t> end_ids);
  int64_t size() const override { return rows_; }

  const std::vector<TrieNode>& nodes() const { return nodes_; }
  const std::vector<int32_t>& extra_tokens() const { return extra_tokens_; }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  int max_depth() const { return max_depth_; }
  bool is_end(int32_t id) const { return id >= 0 && id < rows_ && is_end_[static_cast<size_t>(id)]; }
  // Bytes of a token a grammar may allow; nullptr for ids that are never allowed (and for end ids).
  const std::string* bytes(int32_t id) const {
    if (id < 0 || id >= rows_ || static_cast<size_t>(id) >= tokens_.size() || !allowed_[static_cast<size_t>(id)])
      return nullptr;
    return &tokens_[static_cast<size_t>(id)];
  }
  // The class table of `cls` for this vocabulary, built on first use and kept for the next grammars (the
  // kMaxClassTables most recently used; thread-safe).
  std::shared_ptr<const ClassTable> class_table(const CharClass& cls) const;
  static constexpr size_t kMaxClassTables = 16;

 private:
  std::vector<std::string> tokens_;  // index = id (may be shorter than rows_)
  std::vector<bool> allowed_;
  std::vector<bool> is_end_;
  std::vector<int32_t> end_ids_;
  int64_t rows_;
  std::vector<TrieNode> nodes_;
  std::vector<int32_t> extra_tokens_;
  int max_depth_ = 0;
  mutable std::mutex class_mu_;
  mutable std::vector<std::shared_ptr<const ClassTable>> class_tables_;  // most recently used last
};

}  // namespace tern::grammar
