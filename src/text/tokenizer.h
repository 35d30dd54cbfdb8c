// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (Qwen2/Qwen3/Qwen3.6 family).
//
// encode(text):
//   1. invalid UTF-8 -> U+FFFD per maximal subpart (what Python's errors="replace" gives HF tokenizers);
//   2. added tokens (special or not) are matched in the raw text first, leftmost-longest;
//   3. every stretch between them: NFC -> split regex from the file (PCRE2) -> byte-level BPE by merge rank.
// decode(ids): the tokens' bytes concatenated (added tokens as their text), invalid UTF-8 -> U+FFFD.
//
// A Tokenizer is immutable after loading; every const method is safe to call from many threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tern {

class Tokenizer {
 public:
  static Tokenizer from_file(const std::filesystem::path& tokenizer_json);  // also accepts *.json.zst
  static Tokenizer from_model_dir(const std::filesystem::path& dir);         // dir/tokenizer.json(.zst)
  static Tokenizer from_json_text(const std::string& json);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // special_as_text: added tokens marked special (<|im_start|>, ...) are not matched: their text is encoded as
  // ordinary text (for text a user typed, which must not become control tokens). Other added tokens still match.
  std::vector<int32_t> encode(std::string_view text, bool special_as_text = false) const;  // added tokens first
  void encode_append(std::string_view text, std::vector<int32_t>& out, bool special_as_text = false) const;
  // Throws tern::Error on an id that is not in the vocabulary.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  std::string token_bytes(int32_t id) const;  // raw bytes of one token (byte-level decoded), added tokens as text
  std::optional<int32_t> token_id(std::string_view token) const;  // added token text or vocab entry ("Ġthe")
  bool is_special(int32_t id) const;  // a special added token (skipped by decode(skip_special))
  bool is_added(int32_t id) const;    // any added token (special or not)
  bool contains(int32_t id) const;    // id has a token
  int32_t vocab_size() const;         // max id + 1

  // Throws tern::Error when the tokenizer has ids beyond the model's embedding rows.
  void check_fits_embedding(int64_t embedding_rows) const;

  const std::string& split_pattern() const;  // the pre-tokenizer regex as written in the file

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Reads a file, decompressing it when its name ends in .zst. Throws tern::Error naming the path.
std::string read_maybe_zstd(const std::filesystem::path& path);

}  // namespace tern
