// TextStream: stop strings never leak (also across tokens), UTF-8 is released only when complete, and a random
// comparison with the definition (check after each token; cut at the earliest stop occurrence).
#include <gtest/gtest.h>

#include <random>

#include "engine/text_stream.h"
#include "text/unicode.h"

namespace tern {
namespace {

std::string run(const std::vector<std::string>& pieces, const std::vector<std::string>& stops, bool* stopped = nullptr) {
  TextStream ts(stops);
  std::string out;
  bool st = false;
  for (const std::string& p : pieces) {
    std::string piece;
    st = ts.push(p, piece);
    // Nothing released may contain a stop string's start that later completes: checked by the callers.
    out += piece;
    if (st) break;
  }
  if (!st) ts.finish(out);
  if (stopped) *stopped = st;
  return out;
}

TEST(TextStream, StopStringAcrossTokensNeverLeaks) {
  TextStream ts({"STOP"});
  std::string a, b, c, d;
  EXPECT_FALSE(ts.push("Hel", a));
  EXPECT_FALSE(ts.push("lo S", b));
  EXPECT_FALSE(ts.push("TO", c));
  EXPECT_TRUE(ts.push("P and more", d));
  EXPECT_EQ(a, "Hel");
  EXPECT_EQ(b, "lo ");
  EXPECT_EQ(c, "");
  EXPECT_EQ(d, "");
  EXPECT_EQ(ts.matched_stop(), "STOP");
}

TEST(TextStream, PartialStopIsReleasedAtTheEnd) {
  bool stopped = true;
  EXPECT_EQ(run({"abc S", "T"}, {"STOP"}, &stopped), "abc ST");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(run({"abc S", "Tx"}, {"STOP"}), "abc STx");
}

TEST(TextStream, EarliestStopWins) {
  EXPECT_EQ(run({"xx", "abcd"}, {"abcd", "bc"}), "xx");       // both complete at once: "abcd" starts first
  EXPECT_EQ(run({"xx", "abc", "d"}, {"abcd", "bc"}), "xxa");  // "bc" completes first
  EXPECT_EQ(run({"1\n\n2"}, {"\n\n", "2"}), "1");
}

TEST(TextStream, Utf8IsReleasedWhole) {
  const std::string e = "\xc3\xa9", cjk = "\xe4\xb8\xad", emoji = "\xf0\x9f\x98\x80";
  TextStream ts;
  std::string o1, o2, o3, o4, o5;
  ts.push(e.substr(0, 1), o1);
  EXPECT_EQ(o1, "");
  ts.push(e.substr(1) + cjk.substr(0, 2), o2);
  EXPECT_EQ(o2, e);
  ts.push(cjk.substr(2) + emoji.substr(0, 1), o3);
  EXPECT_EQ(o3, cjk);
  ts.push(emoji.substr(1, 2), o4);
  EXPECT_EQ(o4, "");
  ts.push(emoji.substr(3), o5);
  EXPECT_EQ(o5, emoji);
}

TEST(TextStream, InvalidBytesBecomeReplacementCharacters) {
  EXPECT_EQ(run({"a\xff", "b"}, {}), "a\xef\xbf\xbd" "b");
  EXPECT_EQ(run({"a\xe4\xb8"}, {}), "a\xef\xbf\xbd");  // incomplete at the end: one maximal subpart
  EXPECT_EQ(utf8_lossy("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // a surrogate
  EXPECT_EQ(utf8_complete_prefix("ab\xe4\xb8"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xe4\xb8\xad"), 5u);
}

TEST(TextStream, RandomStreamsMatchTheDefinition) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const std::string alphabet = "ab \n";
  auto word = [&](size_t max_len) {
    std::string s;
    const size_t n = 1 + rng() % max_len;
    for (size_t i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
    return s;
  };
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::string> pieces, stops;
    for (size_t i = 0, n = 1 + rng() % 12; i < n; ++i) pieces.push_back(word(4));
    for (size_t i = 0, n = rng() % 4; i < n; ++i) stops.push_back(word(4));
    // Definition: after each piece, look for the earliest occurrence of any stop in the whole text.
    std::string text, want;
    bool want_stop = false;
    for (const std::string& p : pieces) {
      text += p;
      size_t best = std::string::npos;
      for (const std::string& s : stops) best = std::min(best, text.find(s));
      if (best != std::string::npos) {
        want = text.substr(0, best);
        want_stop = true;
        break;
      }
    }
    if (!want_stop) want = text;
    // Also check that every released piece is final: the concatenation of releases is a prefix of `want`.
    TextStream ts(stops);
    std::string got;
    bool stopped = false;
    for (const std::string& p : pieces) {
      std::string piece;
      stopped = ts.push(p, piece);
      got += piece;
      ASSERT_EQ(want.compare(0, got.size(), got), 0) << "released text that is not final, trial " << trial;
      if (stopped) break;
    }
    if (!stopped) ts.finish(got);
    ASSERT_EQ(got, want) << "trial " << trial;
    ASSERT_EQ(stopped, want_stop) << "trial " << trial;
  }
}

}  // namespace
}  // namespace tern
