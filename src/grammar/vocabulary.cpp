#include "grammar/vocabulary.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "text/tokenizer.h"

namespace tern::grammar {

namespace {
constexpr size_t kMaxTokenBytes = 65535;  // the trie's depth is a uint16

// Whole, valid UTF-8 characters only (shortest forms, no surrogates, at most U+10FFFF).
bool whole_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    uint8_t c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    uint8_t c1 = static_cast<uint8_t>(s[i + 1]);
    if (c1 < lo || c1 > hi) return false;
    for (size_t k = 2; k < n; ++k)
      if ((static_cast<uint8_t>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}
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

  for (int32_t id : order) {
    const std::string& t = tokens_[static_cast<size_t>(id)];
    TokenShape sh{0, 0, id, 0, whole_utf8(t), false};
    size_t chars = 0;
    for (char ch : t) {
      uint8_t c = static_cast<uint8_t>(ch);
      if (c < 64) sh.ascii_lo |= 1ull << c;
      else if (c < 128) sh.ascii_hi |= 1ull << (c - 64);
      else sh.non_ascii = true;
      chars += (c & 0xC0) != 0x80;
    }
    sh.chars = static_cast<uint16_t>(std::min<size_t>(chars, UINT16_MAX));
    if (sh.whole_utf8) max_chars_ = std::max(max_chars_, static_cast<int>(sh.chars));
    shapes_.push_back(sh);
  }
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
  return std::make_shared<VocabularyImpl>(std::move(tokens), std::move(allowed), vocab_rows, end_ids);
}

}  // namespace tern::grammar
