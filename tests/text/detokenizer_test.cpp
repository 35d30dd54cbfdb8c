// Streaming detokenizer and stop-string matcher.
#include <gtest/gtest.h>

#include <filesystem>
#include <cstdlib>
#include <random>

#include "core/check.h"
#include "text/detokenizer.h"
#include "text/stop_matcher.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace tern {
namespace {

const Tokenizer& qwen3() {
  static const Tokenizer tok = Tokenizer::from_file(std::filesystem::path(__FILE__).parent_path() /
                                                    "../data/tokenizers/qwen3-tokenizer.json.zst");
  return tok;
}

uint64_t fresh_seed() {  // TERN_TEST_SEED repeats a run
  const char* env = std::getenv("TERN_TEST_SEED");
  uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::printf("seed=%llu\n", static_cast<unsigned long long>(s));
  return s;
}

TEST(StreamingDetokenizer, HoldsBackOnlyUnfinishedCharacters) {
  const Tokenizer& t = qwen3();
  // 😀 = F0 9F 98 80 as four single-byte tokens.
  std::vector<int32_t> bytes;
  for (unsigned char b : std::string("\xf0\x9f\x98\x80")) bytes.push_back(*t.token_id(std::string(
      [&] { std::string s; utf8_append(s, byte_level_alphabet().byte_to_cp[b]); return s; }())));
  StreamingDetokenizer d(t);
  EXPECT_EQ(d.push(bytes[0]), "");
  EXPECT_EQ(d.push(bytes[1]), "");
  EXPECT_EQ(d.push(bytes[2]), "");
  EXPECT_EQ(d.push(bytes[3]), "\xf0\x9f\x98\x80");
  EXPECT_EQ(d.push(bytes[0]), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");  // an unfinished character at the end
  EXPECT_EQ(d.flush(), "");
  EXPECT_THROW(d.push(-3), Error);
}

TEST(StreamingDetokenizer, RandomIdsConcatenateToDecode) {
  const Tokenizer& t = qwen3();
  std::mt19937_64 rng(fresh_seed());
  for (int trial = 0; trial < 300; ++trial) {
    bool skip = trial % 2;
    std::vector<int32_t> ids;
    int n = int(rng() % 40);
    for (int i = 0; i < n; ++i) {
      uint64_t k = rng() % 10;
      ids.push_back(k < 4 ? int32_t(rng() % 256) : k < 9 ? int32_t(rng() % 151643) : int32_t(151643 + rng() % 26));
    }
    StreamingDetokenizer d(t, skip);
    std::string streamed, raw;
    for (int32_t id : ids) {
      std::string piece = d.push(id);
      EXPECT_TRUE(utf8_is_valid(piece));
      streamed += piece;
      if (!(skip && t.is_special(id))) raw += t.token_bytes(id);
      // Everything but an unfinished last character is out already.
      EXPECT_EQ(streamed, utf8_lossy(raw.substr(0, utf8_complete_prefix(raw))));
      EXPECT_LE(d.pending_bytes(), 3u);
    }
    streamed += d.flush();
    EXPECT_EQ(streamed, t.decode(ids, skip));
  }
}

// Reference: the text before the earliest stop string (the longest at a tie), and whether one occurs. The matcher
// is checked after every push, as a generator checks after every token: the reference is applied to the text fed
// so far after each chunk, and the first chunk after which a stop occurs decides (as vLLM does).
std::pair<std::string, bool> stop_reference(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = std::string::npos;
  for (const auto& s : stops)
    if (!s.empty()) best = std::min(best, text.find(s));
  if (best == std::string::npos) return {text, false};
  return {text.substr(0, best), true};
}

TEST(StopMatcher, RandomChunksMatchTheReference) {
  std::mt19937_64 rng(fresh_seed());
  const std::string alphabet = "ab<|>\xe4\xb8\x96";
  auto random_string = [&](size_t max) {
    std::string s;
    size_t n = rng() % (max + 1);
    for (size_t i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
    return s;
  };
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::string> stops;
    for (int k = int(rng() % 4); k > 0; --k) stops.push_back(random_string(4));
    const std::string text = random_string(40);
    std::vector<std::string> chunks;
    for (size_t pos = 0; pos < text.size();) {
      chunks.push_back(text.substr(pos, 1 + rng() % 5));
      pos += chunks.back().size();
    }
    std::string want = text;
    bool want_stop = false;
    std::string so_far;
    for (const auto& chunk : chunks) {
      so_far += chunk;
      auto [prefix, found] = stop_reference(so_far, stops);
      if (found) {
        want = prefix;
        want_stop = true;
        break;
      }
    }
    StopMatcher m(stops);
    std::string got, fed;
    bool stopped = false;
    for (size_t c = 0; c < chunks.size() && !stopped; ++c) {
      const std::string& chunk = chunks[c];
      fed += chunk;
      auto r = m.push(chunk);
      got += r.text;
      stopped = r.stopped;
      if (!stopped) {
        // What is out is final, and only a tail that could still start a stop string is held back.
        auto [ref_prefix, ref_stop] = stop_reference(fed, stops);
        EXPECT_FALSE(ref_stop);
        EXPECT_EQ(fed.compare(0, got.size(), got), 0);
        std::string held = fed.substr(got.size());
        bool could_start = held.empty();
        for (const auto& s : stops)
          if (!s.empty() && s.size() > held.size() && s.compare(0, held.size(), held) == 0) could_start = true;
        EXPECT_TRUE(could_start) << "held back '" << held << "' needlessly";
      }
    }
    if (!stopped) got += m.flush();
    EXPECT_EQ(stopped, want_stop) << text;
    EXPECT_EQ(got, want) << text << " stops: " << [&] { std::string all; for (auto& s : stops) all += "[" + s + "]"; return all; }();
  }
}

TEST(StopMatcher, StopSplitAcrossPushesNeverLeaks) {
  StopMatcher m({"</stop>", "\n\n"});
  EXPECT_EQ(m.push("hello </s").text, "hello ");
  EXPECT_EQ(m.push("to").text, "");
  auto r = m.push("p> more");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(m.matched_stop(), "</stop>");
  EXPECT_TRUE(m.push("x").stopped);
  EXPECT_EQ(m.flush(), "");
  StopMatcher n({"</stop>"});
  EXPECT_EQ(n.push("a </st").text, "a ");
  EXPECT_EQ(n.push("x").text, "</stx");
  EXPECT_EQ(n.push("</").text, "");
  EXPECT_EQ(n.flush(), "</");
  StopMatcher none({});
  EXPECT_EQ(none.push("anything").text, "anything");
}

}  // namespace
}  // namespace tern
