// The n-gram drafter's suffix automaton against brute force on random sequences (the longest earlier suffix match
// after every append; the longest match of a second sequence), the drafters' proposals (a copied passage, a
// repeating period, a client's prediction followed, lost and found again) and the draft-length policy.
#include <gtest/gtest.h>

#include <random>

#include "engine/draft_ngram.h"
#include "engine/speculative.h"
#include "test_seed.h"

namespace tern {
namespace {

// The longest L >= 1 such that the last L tokens of s also end at some position < n - 1 (0 when none).
int64_t brute_longest_earlier(const std::vector<int32_t>& s) {
  const int64_t n = int64_t(s.size());
  int64_t best = 0;
  for (int64_t e = 0; e + 1 < n; ++e) {
    int64_t l = 0;
    while (l <= e && s[size_t(e - l)] == s[size_t(n - 1 - l)]) ++l;
    best = std::max(best, l);
  }
  return best;
}

bool occurs_ending_at(const std::vector<int32_t>& hay, int64_t end, const std::vector<int32_t>& needle_tail,
                      int64_t len) {
  if (end < len - 1 || end >= int64_t(hay.size())) return false;
  for (int64_t i = 0; i < len; ++i)
    if (hay[size_t(end - i)] != needle_tail[needle_tail.size() - 1 - size_t(i)]) return false;
  return true;
}

TEST(SuffixAutomaton, LongestEarlierMatchAgreesWithBruteForce) {
  const uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  for (int alphabet : {2, 3, 5, 40}) {
    TokenSuffixAutomaton sam;
    std::vector<int32_t> s;
    for (int i = 0; i < 400; ++i) {
      const int32_t t = int32_t(rng() % uint64_t(alphabet));
      s.push_back(t);
      sam.append(t);
      const TokenSuffixAutomaton::Match m = sam.last_match();
      ASSERT_EQ(m.length, brute_longest_earlier(s)) << "alphabet " << alphabet << " at " << i;
      if (m.length > 0) {
        EXPECT_LT(m.end, int64_t(s.size()) - 1);
        EXPECT_TRUE(occurs_ending_at(s, m.end, s, m.length)) << "alphabet " << alphabet << " at " << i;
      }
    }
  }
}

TEST(SuffixAutomaton, WalkFindsTheLongestMatchInTheIndexedSequence) {
  const uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  std::vector<int32_t> text(300);
  for (auto& t : text) t = int32_t(rng() % 4);
  TokenSuffixAutomaton sam;
  sam.append(text);
  std::vector<int32_t> other;
  TokenSuffixAutomaton::Walk w;
  for (int i = 0; i < 300; ++i) {
    const int32_t t = int32_t(rng() % 4);
    other.push_back(t);
    w = sam.step(w, t);
    int64_t best = 0;  // the longest suffix of `other` that occurs in `text`
    for (int64_t e = 0; e < int64_t(text.size()); ++e) {
      int64_t l = 0;
      while (l <= e && l < int64_t(other.size()) && text[size_t(e - l)] == other[other.size() - 1 - size_t(l)]) ++l;
      best = std::max(best, l);
    }
    ASSERT_EQ(w.length, best) << i;
    if (w.length > 0) {
      EXPECT_TRUE(occurs_ending_at(text, sam.first_end(w), other, w.length));
    }
  }
}

TEST(NgramDrafter, ProposesWhatFollowedTheEarlierOccurrence) {
  NgramDrafter d(2);
  const std::vector<int32_t> passage = {10, 11, 12, 13, 14, 15, 16, 17};
  d.append(passage);
  d.append(std::vector<int32_t>{90, 91, 92});
  EXPECT_TRUE(d.draft(4).empty()) << "nothing repeats yet";
  d.append(10);
  EXPECT_TRUE(d.draft(4).empty()) << "a one-token match is below min_match";
  d.append(11);
  EXPECT_EQ(d.draft(4), (std::vector<int32_t>{12, 13, 14, 15}));
  EXPECT_EQ(d.draft(10), (std::vector<int32_t>{12, 13, 14, 15, 16, 17, 90, 91, 92, 10}));
  EXPECT_TRUE(d.draft(0).empty());
}

TEST(NgramDrafter, DraftsARepeatingPatternThroughItsPeriod) {
  NgramDrafter d(2);
  d.append(std::vector<int32_t>{1, 2, 3, 1, 2});
  EXPECT_EQ(d.draft(7), (std::vector<int32_t>{3, 1, 2, 3, 1, 2, 3}));
  NgramDrafter same(2);
  same.append(std::vector<int32_t>{5, 5, 5});
  EXPECT_EQ(same.draft(3), (std::vector<int32_t>{5, 5, 5}));
}

TEST(NgramDrafter, PrefersARecentOccurrence) {
  NgramDrafter d(2);
  d.append(std::vector<int32_t>{1, 2, 3, 9, 1, 2, 4, 9, 1, 2});
  EXPECT_EQ(d.draft(2), (std::vector<int32_t>{4, 9})) << "the continuation of the latest '1 2'";
}

TEST(PredictionDrafter, FollowsLosesAndFindsThePredictionAgain) {
  const std::vector<int32_t> p = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  PredictionDrafter d(p, 3);
  EXPECT_EQ(d.draft(3), (std::vector<int32_t>{1, 2, 3})) << "the output is expected to start with it";
  for (int32_t t : {1, 2, 3}) d.append(t);
  EXPECT_EQ(d.draft(2), (std::vector<int32_t>{4, 5}));
  d.append(40);  // the output departs
  EXPECT_TRUE(d.draft(4).empty());
  for (int32_t t : {6, 7}) d.append(t);
  EXPECT_TRUE(d.draft(4).empty()) << "two tokens are below resync_match";
  d.append(8);
  EXPECT_EQ(d.draft(4), (std::vector<int32_t>{9, 10, 11, 12}));
  EXPECT_EQ(d.draft(9), (std::vector<int32_t>{9, 10, 11, 12})) << "no more than it has";
  for (int32_t t : {9, 10, 11, 12}) d.append(t);
  EXPECT_TRUE(d.draft(4).empty()) << "at its end";
}

TEST(DraftPolicy, GrowsOnAcceptanceShrinksOnRejectionAndPausesWhenDraftsRarelyPass) {
  DraftPolicy p(8);
  const int k0 = p.next();
  EXPECT_GT(k0, 0);
  p.record(k0, k0);
  EXPECT_GT(p.next(), k0);
  for (int i = 0; i < 5; ++i) p.record(p.next(), p.next());
  EXPECT_EQ(p.next(), 8);
  p.record(8, 2);
  EXPECT_EQ(p.next(), 3);
  int steps = 0;
  while (p.next() > 0 && steps < 100) {
    p.record(p.next(), 0);
    ++steps;
  }
  ASSERT_EQ(p.next(), 0) << "pauses after repeated rejections";
  int paused = 0;
  while (p.next() == 0 && paused < 1000) {
    p.skip_step();
    ++paused;
  }
  EXPECT_GE(paused, 8);
  EXPECT_GT(p.next(), 0) << "and tries again";
  DraftPolicy none(0);
  EXPECT_EQ(none.next(), 0);
}

TEST(SpeculativeMode, Names) {
  EXPECT_EQ(parse_speculative_mode("off"), SpeculativeMode::off);
  EXPECT_EQ(parse_speculative_mode("ngram"), SpeculativeMode::ngram);
  EXPECT_EQ(parse_speculative_mode("auto"), SpeculativeMode::auto_);
  EXPECT_EQ(parse_speculative_mode("mtp"), SpeculativeMode::mtp);
  EXPECT_FALSE(parse_speculative_mode("eagle").has_value());
  EXPECT_STREQ(speculative_mode_name(SpeculativeMode::auto_), "auto");
  EXPECT_STREQ(speculative_mode_name(SpeculativeMode::mtp), "mtp");
}

}  // namespace
}  // namespace tern
