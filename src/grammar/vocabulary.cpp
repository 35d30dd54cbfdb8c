#include "grammar/vocabulary.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "text/tokenizer.h"

namespace tern::grammar {

namespace {
constexpr size_t kMaxTokenBytes = 65535;  // the trie's depth is a uint16
}

VocabularyImpl::VocabularyImpl(std::vector<std::string> tokens, std::vector<bool> allowed, int64_t rows,
                               std::vector<int32_t> end_ids)
    : tokens_(std::move(tokens)), allowed_(std::move(allowed)), end_ids_(std::move(end_ids)), rows_(rows) {
  TERN_CHECK(rows_ >= 0 && rows_ < INT32_MAX, "token vocabulary: bad row count ", rows_);
  TERN_CHECK(static_cast<int64_t>(tokens_.size()) <= rows_, "token vocabulary: ", tokens_.size(),
             " tokens do not fit in ", rows_, " rows");
  is_end_.assign(static_cast<size_t>(rows_), false);
  std::sort(end_ids_.begin(), end_ids_.end());
  end_ids_.erase(std::unique(end_ids_.begin(), end_ids_.end()), end_ids_.end());
  for (int32_t id : end_ids_) {
    TERN_CHECK(id >= 0 && id < rows_, "token vocabulary: end id ", id, " outside 0..", rows_ - 1);
    is_end_[static_cast<size_t>(id)] = true;
  }
  for (size_t i = 0; i < tokens_.size(); ++i)
    if (allowed_[i] && (tokens_[i].empty() || tokens_[i].size() > kMaxTokenBytes || is_end_[i])) allowed_[i] = false;

  // Sort the allowed ids by their bytes, then emit trie nodes in pre-order from the shared prefix lengths.
  std::vector<int32_t> order;
  for (size_t i = 0; i < tokens_.size(); ++i)
    if (allowed_[i]) order.push_back(static_cast<int32_t>(i));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const std::string &x = tokens_[static_cast<size_t>(a)], &y = tokens_[static_cast<size_t>(b)];
    return x != y ? x < y : a < b;
  });
  std::vector<uint32_t> path;  // node index per depth - 1 along the current token
  const std::string* prev = nullptr;
  auto close_to = [&](size_t depth) {
    while (path.size() > depth) {
      nodes_[path.back()].skip = static_cast<uint32_t>(nodes_.size());
      path.pop_back();
    }
  };
  for (size_t k = 0; k < order.size(); ++k) {
    const std::string& t = tokens_[static_cast<size_t>(order[k])];
    size_t lcp = 0;
    if (prev) {
      size_t m = std::min(prev->size(), t.size());
      while (lcp < m && (*prev)[lcp] == t[lcp]) ++lcp;
    }
    close_to(lcp);
    for (size_t d = lcp; d < t.size(); ++d) {
      path.push_back(static_cast<uint32_t>(nodes_.size()));
      nodes_.push_back({0, -1, 0, static_cast<uint16_t>(d + 1), static_cast<uint8_t>(t[d]), 0});
    }
    TrieNode& leaf = nodes_[path.back()];
    if (leaf.token < 0) {
      leaf.token = order[k];
    } else {  // ids sharing bytes are adjacent in `order`
      if (leaf.extra_count == 0) leaf.extra_begin = static_cast<uint32_t>(extra_tokens_.size());
      TERN_CHECK(leaf.extra_count < UINT8_MAX, "token vocabulary: too many ids with the same bytes");
      ++leaf.extra_count;
      extra_tokens_.push_back(order[k]);
    }
    max_depth_ = std::max(max_depth_, static_cast<int>(t.size()));
    prev = &t;
  }
  close_to(0);
}

std::shared_ptr<const ClassTable> VocabularyImpl::class_table(const CharClass& cls) const {
  {
    std::lock_guard lock(class_mu_);
    for (size_t i = 0; i < class_tables_.size(); ++i)
      if (class_tables_[i]->cls == cls) {
        auto t = class_tables_[i];
        class_tables_.erase(class_tables_.begin() + static_cast<std::ptrdiff_t>(i));
        class_tables_.push_back(t);
        return t;
      }
  }
  auto t = std::make_shared<const ClassTable>(build_class_table(*this, cls));  // outside the lock
  std::lock_guard lock(class_mu_);
  class_tables_.push_back(t);
  if (class_tables_.size() > kMaxClassTables) class_tables_.erase(class_tables_.begin());
  return t;
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokens(std::vector<std::string> tokens,
                                                                    const std::vector<int32_t>& end_ids) {
  std::vector<bool> allowed(tokens.size(), true);
  int64_t rows = static_cast<int64_t>(tokens.size());
  for (int32_t id : end_ids) rows = std::max<int64_t>(rows, static_cast<int64_t>(id) + 1);
  return std::make_shared<VocabularyImpl>(std::move(tokens), std::move(allowed), rows, end_ids);
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(const Tokenizer& tokenizer, int64_t vocab_rows,
                                                                       const std::vector<int32_t>& end_ids) {
  int64_t n = std::min<int64_t>(vocab_rows, tokenizer.vocab_size());
  std::vector<std::string> tokens(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::vector<bool> allowed(tokens.size(), false);
  for (int64_t i = 0; i < n; ++i) {
    int32_t id = static_cast<int32_t>(i);
    // Special added tokens (<|im_start|>, ...) are control tokens, never text. Other added tokens (<tool_call>,
    // <think>, ...) decode to their text, so a grammar may allow them as those bytes.
    if (!tokenizer.contains(id) || tokenizer.is_special(id)) continue;
    tokens[static_cast<size_t>(i)] = tokenizer.token_bytes(id);
    allowed[static_cast<size_t>(i)] = true;
  }
  auto v = std::make_shared<VocabularyImpl>(std::move(tokens), std::move(allowed), vocab_rows, end_ids);
  v->class_table(json_string_class());  // every JSON grammar's strings: ready before the first mask
  return v;
}

}  // namespace tern::grammar
