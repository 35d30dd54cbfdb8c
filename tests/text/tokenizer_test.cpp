// Tokenizer unit tests: UTF-8 helpers, a real Qwen3 vocabulary (tests/data), errors, and threads.
// The exhaustive agreement with Hugging Face is tests/py/test_tokenizer.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <thread>

#include "core/check.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace tern {
namespace {

std::filesystem::path data_dir() { return std::filesystem::path(__FILE__).parent_path() / "../data/tokenizers"; }

const Tokenizer& qwen3() {
  static const Tokenizer tok = Tokenizer::from_file(data_dir() / "qwen3-tokenizer.json.zst");
  return tok;
}

uint64_t fresh_seed() {
  uint64_t s = std::random_device{}();
  std::printf("seed=%llu\n", static_cast<unsigned long long>(s));
  return s;
}

TEST(Utf8, LossyReplacesMaximalSubparts) {
  EXPECT_EQ(utf8_lossy("abc"), "abc");
  EXPECT_EQ(utf8_lossy("\xe0\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: 3 subparts
  EXPECT_EQ(utf8_lossy("\xf0\x9f\x98"), "\xEF\xBF\xBD");                          // truncated: 1
  EXPECT_EQ(utf8_lossy("\xed\xa0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(utf8_lossy("\xc2\x41"), "\xEF\xBF\xBD" "A");
  EXPECT_EQ(utf8_lossy("\xf4\x90\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(utf8_is_valid("\xf0\x9f\x98\x80 \xe4\xb8\x96"));
  EXPECT_FALSE(utf8_is_valid("\xc0\xaf"));
}

TEST(Utf8, CompletePrefixHoldsOnlyAnUnfinishedCharacter) {
  EXPECT_EQ(utf8_complete_prefix("ab"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xf0\x9f\x98"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xf0\x9f\x98\x80"), 6u);
  EXPECT_EQ(utf8_complete_prefix("ab\xe0\x80"), 4u);  // ill-formed already: emitted (as U+FFFD)
  EXPECT_EQ(utf8_complete_prefix("\xc3"), 0u);
  EXPECT_EQ(utf8_complete_prefix("\x80"), 1u);
}

TEST(Utf8, Nfc) {
  EXPECT_EQ(utf8_nfc("cafe\xcc\x81"), "caf\xc3\xa9");
  EXPECT_EQ(utf8_nfc("\xe1\x84\x80\xe1\x85\xa1"), "\xea\xb0\x80");  // Hangul jamo -> syllable
  EXPECT_EQ(utf8_nfc("plain"), "plain");
}

TEST(Qwen3Tokenizer, KnownIds) {
  const Tokenizer& t = qwen3();
  EXPECT_EQ(t.vocab_size(), 151669);
  EXPECT_EQ(t.encode("Hello world"), (std::vector<int32_t>{9707, 1879}));
  EXPECT_EQ(t.encode("<|im_start|>user\n"), (std::vector<int32_t>{151644, 872, 198}));
  EXPECT_EQ(t.token_id("<|im_end|>"), 151645);
  EXPECT_EQ(t.token_id("<think>"), 151667);
  EXPECT_EQ(t.token_id("Ġworld"), 1879);
  EXPECT_FALSE(t.token_id("no such token anywhere").has_value());
  EXPECT_TRUE(t.is_special(151645));
  EXPECT_FALSE(t.is_special(151667));  // <think> is added but not special
  EXPECT_TRUE(t.is_added(151667));
  EXPECT_EQ(t.token_bytes(1879), " world");
  EXPECT_EQ(t.token_bytes(151645), "<|im_end|>");
  EXPECT_TRUE(t.encode("").empty());
}

TEST(Qwen3Tokenizer, DecodeAndSkipSpecial) {
  const Tokenizer& t = qwen3();
  std::string text = "<|im_start|>assistant\n<think>\nx</think>\n\xe4\xb8\x96\xe7\x95\x8c<|im_end|>";
  auto ids = t.encode(text);
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_EQ(t.decode(ids, true), "assistant\n<think>\nx</think>\n\xe4\xb8\x96\xe7\x95\x8c");
  std::vector<int32_t> bad{1, 999999};
  EXPECT_THROW(t.decode(bad), Error);
  EXPECT_THROW(t.token_bytes(-1), Error);
}

TEST(Qwen3Tokenizer, InvalidUtf8EncodesAsReplacement) {
  const Tokenizer& t = qwen3();
  EXPECT_EQ(t.encode("a\xff" "b"), t.encode("a\xEF\xBF\xBD" "b"));
}

TEST(Qwen3Tokenizer, EmbeddingCheck) {
  EXPECT_NO_THROW(qwen3().check_fits_embedding(151936));
  try {
    qwen3().check_fits_embedding(151000);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("151000"), std::string::npos) << e.what();
  }
}

TEST(Qwen3Tokenizer, RoundTripRandomTextOnManyThreads) {
  const Tokenizer& t = qwen3();
  std::mt19937_64 rng(fresh_seed());
  const char* pieces[] = {"the", " ", "  ", "\n", "\t", "\xe4\xb8\x96", "\xf0\x9f\x98\x80", "e\xcc\x81", "123", "'s",
                          "<|im_end|>", "<think>", "\xd8\xa7\xd9\x8b", "!!", "\xe0\xb8\x81\xe0\xb8\xb1", "x"};
  std::vector<std::string> texts(400);
  for (auto& s : texts) {
    int n = int(rng() % 200);
    for (int i = 0; i < n; ++i) s += pieces[rng() % std::size(pieces)];
    if (rng() % 8 == 0) s += std::string(300 + rng() % 2000, char('a' + rng() % 3));  // long words
  }
  std::vector<std::vector<int32_t>> serial;
  for (const auto& s : texts) serial.push_back(t.encode(s));
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(t.decode(serial[i]), utf8_nfc(texts[i])) << i;
  std::vector<std::thread> threads;
  std::vector<int> failures(8, 0);
  for (int k = 0; k < 8; ++k)
    threads.emplace_back([&, k] {
      for (size_t i = k; i < texts.size() * 4; i += 8)
        if (t.encode(texts[i % texts.size()]) != serial[i % texts.size()]) ++failures[k];
    });
  for (auto& th : threads) th.join();
  for (int k = 0; k < 8; ++k) EXPECT_EQ(failures[k], 0) << "thread " << k;
}

// A tiny byte-level tokenizer written by hand: bytes 0..255, merges a+b, ab+c.
std::string tiny_json(const std::string& extra_model = "", const std::string& pre = "") {
  std::string vocab;
  const ByteLevelAlphabet& a = byte_level_alphabet();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8_append(s, a.byte_to_cp[b]);
    if (s == "\"" || s == "\\") s = "\\" + s;
    vocab += "\"" + s + "\":" + std::to_string(b) + ",";
  }
  vocab += "\"ab\":256,\"abc\":257";
  std::string pt = pre.empty() ? R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":true})" : pre;
  return R"({"added_tokens":[{"id":258,"content":"<s>","special":true}],"normalizer":null,"pre_tokenizer":)" + pt +
         R"(,"decoder":{"type":"ByteLevel"},"model":{"type":"BPE",)" + extra_model + R"("vocab":{)" + vocab +
         R"(},"merges":["a b",["ab","c"]]}})";
}

TEST(TinyTokenizer, MergesAndAddedTokens) {
  Tokenizer t = Tokenizer::from_json_text(tiny_json());
  EXPECT_EQ(t.encode("abc"), (std::vector<int32_t>{257}));
  EXPECT_EQ(t.encode("abcab<s>ca"), (std::vector<int32_t>{257, 256, 258, 'c', 'a'}));
  EXPECT_EQ(t.encode("ab abc"), (std::vector<int32_t>{256, ' ', 257}));  // " abc" has no merge with the space
  EXPECT_EQ(t.vocab_size(), 259);
  std::string long_word;
  for (int i = 0; i < 500; ++i) long_word += "abc";
  EXPECT_EQ(t.encode(long_word), std::vector<int32_t>(500, 257));  // the heap path for long pieces
}

TEST(TinyTokenizer, ErrorsNameTheProblem) {
  auto expect_error = [](const std::string& json, const std::string& needle) {
    try {
      Tokenizer::from_json_text(json);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("{not json", "not valid JSON");
  expect_error(R"({"model":{"type":"WordPiece"}})", "WordPiece");
  expect_error(tiny_json(R"("byte_fallback":true,)"), "byte_fallback");
  expect_error(tiny_json("", R"({"type":"Whitespace"})"), "Whitespace");
  std::string bad_merge = tiny_json();
  bad_merge.replace(bad_merge.find("\"a b\""), 5, "\"a q\"");
  expect_error(bad_merge, "not in the vocabulary");
  std::string bad_regex = tiny_json("", R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(unclosed"},"behavior":"Isolated","invert":false},{"type":"ByteLevel"}]})");
  expect_error(bad_regex, "regex");
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), Error);
  EXPECT_THROW(Tokenizer::from_model_dir("/nonexistent"), Error);
}

TEST(TinyTokenizer, DamagedJsonIsAnErrorNeverACrash) {
  std::mt19937_64 rng(fresh_seed());
  const std::string good = tiny_json();
  for (int trial = 0; trial < 300; ++trial) {
    std::string j = good;
    if (trial % 2) {
      j.resize(rng() % j.size());  // truncated
    } else {
      for (int k = 0; k < 3; ++k) j[rng() % j.size()] = "{}[]\",:0a-"[rng() % 12];  // damaged bytes
    }
    try {
      Tokenizer t = Tokenizer::from_json_text(j);
      (void)t.encode("abc <s> x");  // a damage that still parses must still work
    } catch (const Error&) {
    }
  }
}

TEST(Qwen3Tokenizer, RandomBytesRoundTripThroughLossyUtf8) {
  const Tokenizer& t = qwen3();
  std::mt19937_64 rng(fresh_seed());
  for (int trial = 0; trial < 500; ++trial) {
    std::string s(rng() % 64, '\0');
    for (auto& c : s) c = char(rng() % 4 ? 0x20 + rng() % 0x60 : rng() % 256);  // '<' never starts a token here
    for (auto& c : s)
      if (c == '<') c = '(';
    std::string text = t.decode(t.encode(s));
    EXPECT_TRUE(utf8_is_valid(text));
    EXPECT_EQ(text, utf8_nfc(utf8_lossy(s)));
  }
}

}  // namespace
}  // namespace tern
