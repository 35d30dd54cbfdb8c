#include "text/tokenizer.h"

#include <zstd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "core/check.h"
#include "text/pretokenize.h"
#include "text/unicode.h"

namespace tern {
namespace {

using json = nlohmann::json;

// GPT-2's regex: what a ByteLevel pre-tokenizer with use_regex true splits with.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Ids are dense indices into per-token tables; real vocabularies have < 300K. A larger id is a damaged file.
constexpr int64_t kMaxTokenId = int64_t(1) << 22;

enum class TokenKind : uint8_t { none, vocab, added, special };

// (left id, right id) -> (merge rank, merged id), open addressing.
class MergeTable {
 public:
  void build(const std::vector<std::pair<uint64_t, std::pair<uint32_t, int32_t>>>& entries) {
    size_t cap = 16;
    while (cap < entries.size() * 2) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, {});
    mask_ = cap - 1;
    for (const auto& [k, v] : entries) {
      size_t h = hash(k);
      while (keys_[h] != kEmpty && keys_[h] != k) h = (h + 1) & mask_;
      keys_[h] = k;
      vals_[h] = v;  // a repeated pair keeps its last rank, as Hugging Face does
    }
  }
  // Rank of merging (a, b), or UINT32_MAX; sets id to the merged token.
  uint32_t find(int32_t a, int32_t b, int32_t& id) const {
    uint64_t k = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    size_t h = hash(k);
    while (true) {
      uint64_t kk = keys_[h];
      if (kk == k) { id = vals_[h].second; return vals_[h].first; }
      if (kk == kEmpty) return UINT32_MAX;
      h = (h + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  size_t hash(uint64_t k) const { return size_t((k * 0x9E3779B97F4A7C15ull) >> 29) & mask_; }
  std::vector<uint64_t> keys_;
  std::vector<std::pair<uint32_t, int32_t>> vals_;
  size_t mask_ = 0;
};

// Lets the maps below be searched with a string_view (no temporary string per lookup).
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct AddedToken {
  std::string content;
  int32_t id;
};

}  // namespace

struct Tokenizer::Impl {
  std::vector<std::string> bytes;            // [vocab_size] raw bytes of each token (added: content)
  std::vector<TokenKind> kind;               // [vocab_size]
  StringMap vocab_by_bytes;                  // model vocabulary, raw bytes -> id
  std::array<int32_t, 256> byte_id{};        // single-byte tokens
  MergeTable merges;
  bool ignore_merges = false;
  std::unique_ptr<SplitRegex> split;
  bool nfc = false;
  std::vector<AddedToken> added;             // every added token
  std::array<std::vector<int>, 256> added_by_first;  // indices into added, longest first
  StringMap added_by_content;

  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe_long(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;  // no added tokens inside
};

// ---- byte-pair encoding of one pre-token ----------------------------------------------------------------------

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_id[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (ignore_merges) {
    auto it = vocab_by_bytes.find(piece);
    if (it != vocab_by_bytes.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() > 96) {
    bpe_long(piece, out);
    return;
  }
  // Short pieces: symbols in an array, ranks[i] for the pair (i, i+1); merge the lowest rank, leftmost first.
  int32_t sym[96], merged[96];
  uint32_t rank[96];
  size_t n = piece.size();
  for (size_t i = 0; i < n; ++i) sym[i] = byte_id[static_cast<unsigned char>(piece[i])];
  for (size_t i = 0; i + 1 < n; ++i) rank[i] = merges.find(sym[i], sym[i + 1], merged[i]);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == UINT32_MAX) break;
    sym[best] = merged[best];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      sym[i] = sym[i + 1];
      rank[i] = rank[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) rank[best - 1] = merges.find(sym[best - 1], sym[best], merged[best - 1]);
    if (best + 1 < n) rank[best] = merges.find(sym[best], sym[best + 1], merged[best]);
  }
  out.insert(out.end(), sym, sym + n);
}

void Tokenizer::Impl::bpe_long(std::string_view piece, std::vector<int32_t>& out) const {
  // Long pieces: a linked list of symbols and a min-heap of candidate merges ordered by (rank, position);
  // stale entries are recognised by the ids they were made from.
  struct Entry {
    uint32_t rank;
    int32_t pos, left, right;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const int32_t n = int32_t(piece.size());
  std::vector<int32_t> id(n), next(n), prev(n);
  for (int32_t i = 0; i < n; ++i) {
    id[i] = byte_id[static_cast<unsigned char>(piece[i])];
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](int32_t i) {
    int32_t j = next[i], m = -1;
    if (j < 0) return;
    uint32_t r = merges.find(id[i], id[j], m);
    if (r != UINT32_MAX) heap.push({r, i, id[i], id[j]});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Entry e = heap.top();
    heap.pop();
    int32_t i = e.pos, j = next[i];
    if (id[i] != e.left || j < 0 || id[j] != e.right) continue;  // stale
    int32_t m = -1;
    merges.find(id[i], id[j], m);
    id[i] = m;
    id[j] = -1;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    if (prev[i] >= 0) push(prev[i]);
    push(i);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
}

// ---- encode / decode ------------------------------------------------------------------------------------------

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normalized;
  if (nfc) {
    normalized = utf8_nfc(text);
    text = normalized;
  }
  if (split) split->split(text, [&](std::string_view piece) { bpe(piece, out); });
  else bpe(text, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool special_as_text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode_append(text, out, special_as_text);
  return out;
}

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out, bool special_as_text) const {
  std::string clean;
  if (!utf8_is_valid(text)) {
    clean = utf8_lossy(text);
    text = clean;
  }
  const Impl& m = *impl_;
  size_t start = 0;  // beginning of the stretch not yet encoded
  for (size_t i = 0; i < text.size(); ++i) {
    const auto& cands = m.added_by_first[static_cast<unsigned char>(text[i])];
    if (cands.empty()) continue;
    for (int c : cands) {
      if (special_as_text && m.kind[size_t(m.added[c].id)] == TokenKind::special) continue;
      const std::string& s = m.added[c].content;
      if (text.compare(i, s.size(), s) == 0) {
        m.encode_plain(text.substr(start, i - start), out);
        out.push_back(m.added[c].id);
        i += s.size() - 1;
        start = i + 1;
        break;
      }
    }
  }
  m.encode_plain(text.substr(start), out);
}

std::string Tokenizer::token_bytes(int32_t id) const {
  TERN_CHECK(contains(id), "token id ", id, " is not in the tokenizer's vocabulary (", vocab_size(), " ids)");
  return impl_->bytes[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string raw;
  for (int32_t id : ids) {
    TERN_CHECK(contains(id), "token id ", id, " is not in the tokenizer's vocabulary (", vocab_size(), " ids)");
    if (skip_special && impl_->kind[id] == TokenKind::special) continue;
    raw += impl_->bytes[id];
  }
  return utf8_lossy(raw);
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  auto a = impl_->added_by_content.find(token);
  if (a != impl_->added_by_content.end()) return a->second;
  std::string raw;
  if (!byte_level_alphabet().decode(token, raw)) return std::nullopt;
  auto v = impl_->vocab_by_bytes.find(raw);
  if (v == impl_->vocab_by_bytes.end()) return std::nullopt;
  return v->second;
}

bool Tokenizer::contains(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->kind[id] != TokenKind::none;
}
bool Tokenizer::is_special(int32_t id) const { return contains(id) && impl_->kind[id] == TokenKind::special; }
bool Tokenizer::is_added(int32_t id) const {
  return contains(id) && (impl_->kind[id] == TokenKind::special || impl_->kind[id] == TokenKind::added);
}
int32_t Tokenizer::vocab_size() const { return int32_t(impl_->kind.size()); }
const std::string& Tokenizer::split_pattern() const {
  static const std::string none;
  return impl_->split ? impl_->split->pattern() : none;
}

void Tokenizer::check_fits_embedding(int64_t embedding_rows) const {
  TERN_CHECK(vocab_size() <= embedding_rows, "the tokenizer has ids up to ", vocab_size() - 1,
             " but the model's embedding has only ", embedding_rows,
             " rows: tokenizer.json does not belong to this checkpoint");
}

// ---- loading --------------------------------------------------------------------------------------------------

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::string read_maybe_zstd(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  TERN_CHECK(f, "cannot open ", path.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  std::string data = ss.str();
  if (path.extension() != ".zst") return data;
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> ctx(ZSTD_createDCtx(), &ZSTD_freeDCtx);
  TERN_CHECK(ctx, "out of memory decompressing ", path.string());
  std::string out;
  std::vector<char> buf(ZSTD_DStreamOutSize());
  ZSTD_inBuffer in{data.data(), data.size(), 0};
  size_t last = 0;
  while (in.pos < in.size) {
    ZSTD_outBuffer o{buf.data(), buf.size(), 0};
    last = ZSTD_decompressStream(ctx.get(), &o, &in);
    TERN_CHECK(!ZSTD_isError(last), "corrupt zstd file ", path.string(), ": ", ZSTD_getErrorName(last));
    out.append(buf.data(), o.pos);
  }
  TERN_CHECK(last == 0, "truncated zstd file ", path.string());
  return out;
}

Tokenizer Tokenizer::from_file(const std::filesystem::path& tokenizer_json) {
  try {
    return from_json_text(read_maybe_zstd(tokenizer_json));
  } catch (const Error& e) {
    throw Error(tokenizer_json.string() + ": " + e.what());
  }
}

Tokenizer Tokenizer::from_model_dir(const std::filesystem::path& dir) {
  auto plain = dir / "tokenizer.json", packed = dir / "tokenizer.json.zst";
  if (!std::filesystem::exists(plain) && std::filesystem::exists(packed)) return from_file(packed);
  TERN_CHECK(std::filesystem::exists(plain), "no tokenizer.json in the model folder ", dir.string());
  return from_file(plain);
}

namespace {

std::string byte_level_to_bytes(const std::string& token) {
  std::string raw;
  if (!byte_level_alphabet().decode(token, raw)) return token;  // not byte-level text: its UTF-8 as is
  return raw;
}

bool json_false(const json& j, const char* key) { return !j.contains(key) || j[key].is_null() || !j[key].get<bool>(); }

std::string json_string_or_empty(const json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

// Reads the pre-tokenizer: Sequence[Split(regex, Isolated), ByteLevel(use_regex false)] or ByteLevel(use_regex).
// Returns the split pattern ("" for none). Throws on anything else.
std::string parse_pre_tokenizer(const json& pt) {
  TERN_CHECK(pt.is_object(), "pre_tokenizer is missing: only byte-level BPE tokenizers are supported");
  std::string type = json_string_or_empty(pt, "type");
  std::vector<json> steps;
  if (type == "Sequence") {
    for (const auto& s : pt.at("pretokenizers")) steps.push_back(s);
  } else {
    steps.push_back(pt);
  }
  std::string pattern;
  bool byte_level = false;
  for (const auto& s : steps) {
    std::string t = json_string_or_empty(s, "type");
    if (t == "Split") {
      TERN_CHECK(pattern.empty(), "pre_tokenizer has two Split steps (not supported)");
      TERN_CHECK(!byte_level, "pre_tokenizer has Split after ByteLevel (not supported)");
      const json& p = s.at("pattern");
      TERN_CHECK(p.contains("Regex"), "pre_tokenizer Split with a String pattern is not supported");
      pattern = p["Regex"].get<std::string>();
      TERN_CHECK(json_string_or_empty(s, "behavior") == "Isolated",
                 "pre_tokenizer Split behavior '", json_string_or_empty(s, "behavior"), "' is not supported (Isolated is)");
      TERN_CHECK(json_false(s, "invert"), "pre_tokenizer Split with invert is not supported");
    } else if (t == "ByteLevel") {
      TERN_CHECK(json_false(s, "add_prefix_space"), "ByteLevel add_prefix_space is not supported");
      if (s.contains("use_regex") && s["use_regex"].get<bool>()) {
        TERN_CHECK(pattern.empty(), "pre_tokenizer has Split and a ByteLevel regex (not supported)");
        pattern = kGpt2Pattern;
      }
      byte_level = true;
    } else {
      TERN_FAIL("pre_tokenizer type '", t, "' is not supported (Split and ByteLevel are)");
    }
  }
  TERN_CHECK(byte_level, "the pre_tokenizer has no ByteLevel step: only byte-level BPE tokenizers are supported");
  TERN_CHECK(!pattern.empty(), "the pre_tokenizer has no split regex");
  return pattern;
}

bool parse_normalizer(const json& n) {
  if (n.is_null()) return false;
  std::string type = json_string_or_empty(n, "type");
  if (type == "NFC") return true;
  if (type == "Sequence" && n.contains("normalizers")) {
    bool nfc = false;
    for (const auto& s : n["normalizers"]) nfc = parse_normalizer(s) || nfc;
    return nfc;
  }
  TERN_FAIL("normalizer type '", type, "' is not supported (NFC is)");
}

}  // namespace

Tokenizer Tokenizer::from_json_text(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    TERN_FAIL("tokenizer.json is not valid JSON: ", e.what());
  }
  auto impl = std::make_unique<Impl>();
  try {
    TERN_CHECK(j.is_object() && j.contains("model"), "tokenizer.json has no \"model\"");
    const json& model = j["model"];
    TERN_CHECK(json_string_or_empty(model, "type") == "BPE", "tokenizer model type '",
               json_string_or_empty(model, "type"), "' is not supported (BPE is)");
    TERN_CHECK(json_false(model, "byte_fallback"), "BPE byte_fallback is not supported");
    TERN_CHECK(!model.contains("dropout") || model["dropout"].is_null(), "BPE dropout is not supported");
    TERN_CHECK(json_string_or_empty(model, "continuing_subword_prefix").empty() &&
                   json_string_or_empty(model, "end_of_word_suffix").empty(),
               "BPE continuing_subword_prefix / end_of_word_suffix are not supported");
    impl->ignore_merges = model.contains("ignore_merges") && model["ignore_merges"].is_boolean() &&
                          model["ignore_merges"].get<bool>();
    impl->nfc = parse_normalizer(j.value("normalizer", json()));
    impl->split = std::make_unique<SplitRegex>(parse_pre_tokenizer(j.value("pre_tokenizer", json())));
    if (j.contains("decoder") && !j["decoder"].is_null())
      TERN_CHECK(json_string_or_empty(j["decoder"], "type") == "ByteLevel", "decoder type '",
                 json_string_or_empty(j["decoder"], "type"), "' is not supported (ByteLevel is)");

    // Vocabulary.
    const json& vocab = model.at("vocab");
    TERN_CHECK(vocab.is_object(), "model.vocab is not an object");
    int64_t max_id = -1;
    std::vector<std::pair<std::string, int32_t>> entries;
    entries.reserve(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      TERN_CHECK(it.value().is_number_integer(), "vocab entry '", it.key(), "' has no integer id");
      int64_t id = it.value().get<int64_t>();
      TERN_CHECK(id >= 0 && id < kMaxTokenId, "vocab entry '", it.key(), "' has id ", id, " out of range");
      entries.emplace_back(byte_level_to_bytes(it.key()), int32_t(id));
      max_id = std::max(max_id, id);
    }
    std::vector<AddedToken> added;
    std::vector<bool> added_special;
    if (j.contains("added_tokens")) {
      for (const auto& a : j["added_tokens"]) {
        int64_t id = a.at("id").get<int64_t>();
        std::string content = a.at("content").get<std::string>();
        TERN_CHECK(id >= 0 && id < kMaxTokenId, "added token '", content, "' has id ", id, " out of range");
        TERN_CHECK(!content.empty(), "added token ", id, " is empty");
        TERN_CHECK(json_false(a, "lstrip") && json_false(a, "rstrip") && json_false(a, "single_word"),
                   "added token '", content, "': lstrip, rstrip and single_word are not supported");
        added.push_back({content, int32_t(id)});
        added_special.push_back(a.value("special", false));
        max_id = std::max(max_id, id);
      }
    }
    TERN_CHECK(max_id >= 0, "the tokenizer's vocabulary is empty");
    impl->bytes.assign(size_t(max_id + 1), {});
    impl->kind.assign(size_t(max_id + 1), TokenKind::none);
    impl->vocab_by_bytes.reserve(entries.size());
    for (auto& [bytes, id] : entries) {
      impl->vocab_by_bytes[bytes] = id;
      impl->bytes[id] = bytes;
      impl->kind[id] = TokenKind::vocab;
    }
    for (int b = 0; b < 256; ++b) {
      auto it = impl->vocab_by_bytes.find(std::string(1, char(b)));
      TERN_CHECK(it != impl->vocab_by_bytes.end(), "the vocabulary has no token for byte ", b,
                 ": not a byte-level BPE vocabulary");
      impl->byte_id[b] = it->second;
    }
    for (size_t i = 0; i < added.size(); ++i) {
      int32_t id = added[i].id;
      impl->bytes[id] = added[i].content;
      impl->kind[id] = added_special[i] ? TokenKind::special : TokenKind::added;
      impl->added_by_content[added[i].content] = id;
    }
    // Added tokens: one per content (the last definition wins), matched longest first.
    for (const auto& [content, id] : impl->added_by_content) impl->added.push_back({content, id});
    std::sort(impl->added.begin(), impl->added.end(), [](const AddedToken& a, const AddedToken& b) {
      return a.content.size() != b.content.size() ? a.content.size() > b.content.size() : a.content < b.content;
    });
    for (size_t i = 0; i < impl->added.size(); ++i)
      impl->added_by_first[static_cast<unsigned char>(impl->added[i].content[0])].push_back(int(i));

    // Merges: "a b" strings or ["a", "b"] pairs, rank = position.
    const json& merges = model.at("merges");
    TERN_CHECK(merges.is_array(), "model.merges is not an array");
    std::vector<std::pair<uint64_t, std::pair<uint32_t, int32_t>>> table;
    table.reserve(merges.size());
    uint32_t rank = 0;
    for (const auto& mj : merges) {
      std::string a, b;
      if (mj.is_string()) {
        const std::string& s = mj.get_ref<const std::string&>();
        size_t sp = s.find(' ', 1);
        TERN_CHECK(sp != std::string::npos, "merge '", s, "' has no space");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {
        TERN_CHECK(mj.is_array() && mj.size() == 2, "merge ", rank, " is not a pair");
        a = mj[0].get<std::string>();
        b = mj[1].get<std::string>();
      }
      std::string ra = byte_level_to_bytes(a), rb = byte_level_to_bytes(b);
      auto ia = impl->vocab_by_bytes.find(ra), ib = impl->vocab_by_bytes.find(rb),
           ic = impl->vocab_by_bytes.find(ra + rb);
      TERN_CHECK(ia != impl->vocab_by_bytes.end() && ib != impl->vocab_by_bytes.end(), "merge ", rank, " ('", a,
                 "' '", b, "') uses a token that is not in the vocabulary");
      TERN_CHECK(ic != impl->vocab_by_bytes.end(), "merge ", rank, " ('", a, "' '", b,
                 "') makes a token that is not in the vocabulary");
      table.push_back({(uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second), {rank, ic->second}});
      ++rank;
    }
    impl->merges.build(table);
  } catch (const json::exception& e) {
    TERN_FAIL("tokenizer.json has an unexpected shape: ", e.what());
  }
  return Tokenizer(std::move(impl));
}

}  // namespace tern
