// The byte-level recogniser on hand-written grammars: acceptance, rejection, byte-by-byte vs whole string,
// repetition bounds, recursion, UTF-8 classes, and grammars the builder must refuse.
#include <gtest/gtest.h>

#include <random>

#include "grammar/grammar_impl.h"
#include "grammar/regex.h"
#include "grammar_test_util.h"

namespace tern::grammar {
namespace {

using test::accepts;

// Balanced parentheses with letters: S = ( "(" S ")" | [a-c] )*
GrammarPtr balanced() {
  GrammarBuilder b;
  int s = b.new_rule();
  b.define(s, expr_repeat(expr_alt({expr_seq({expr_literal("("), expr_ref(s), expr_literal(")")}), expr_byte_range('a', 'c')}), 0, -1));
  return b.build(s, "balanced");
}

bool balanced_oracle(const std::string& t) {
  int depth = 0;
  for (char c : t) {
    if (c == '(') ++depth;
    else if (c == ')') {
      if (--depth < 0) return false;
    } else if (c < 'a' || c > 'c') {
      return false;
    }
  }
  return depth == 0;
}

TEST(Recogniser, BalancedParenthesesAgreeWithOracle) {
  GrammarPtr g = balanced();
  EXPECT_TRUE(accepts(g, ""));
  EXPECT_TRUE(accepts(g, "(a(b)c)()"));
  EXPECT_FALSE(accepts(g, "(()"));
  EXPECT_FALSE(accepts(g, "())("));
  EXPECT_FALSE(accepts(g, "(d)"));
  std::mt19937_64 rng(test::fresh_seed());
  const char alphabet[] = "()ab";
  for (int i = 0; i < 2000; ++i) {
    std::string t;
    size_t n = rng() % 12;
    for (size_t k = 0; k < n; ++k) t += alphabet[rng() % 4];
    ASSERT_EQ(accepts(g, t), balanced_oracle(t)) << t;
  }
}

TEST(Recogniser, ByteByByteEqualsWholeString) {
  GrammarPtr g = balanced();
  std::mt19937_64 rng(test::fresh_seed());
  for (int i = 0; i < 300; ++i) {
    std::string t;
    size_t n = rng() % 10;
    for (size_t k = 0; k < n; ++k) t += "()abx"[rng() % 5];
    Matcher whole(g, test::byte_vocab()), bytes(g, test::byte_vocab());
    bool ok_whole = whole.accept_bytes(t);
    bool ok_bytes = true;
    for (char c : t) ok_bytes = ok_bytes && bytes.accept(static_cast<uint8_t>(c));
    ASSERT_EQ(ok_whole, ok_bytes) << t;
    if (ok_whole) {
      ASSERT_EQ(whole.complete(), bytes.complete()) << t;
    }
  }
}

TEST(Recogniser, RejectedTokenLeavesStateUnchanged) {
  GrammarPtr g = balanced();
  Matcher m(g, test::byte_vocab());
  ASSERT_TRUE(m.accept_bytes("(a"));
  EXPECT_FALSE(m.accept_bytes("b)x"));
  EXPECT_EQ(m.text(), "(a");
  EXPECT_TRUE(m.accept_bytes(")"));
  EXPECT_TRUE(m.complete());
}

TEST(Recogniser, CountedRepetition) {
  GrammarBuilder b;
  int r = b.add_rule(expr_seq({expr_literal("x"), expr_repeat(expr_literal("ab"), 2, 4), expr_literal("y")}));
  GrammarPtr g = b.build(r, "rep");
  EXPECT_FALSE(accepts(g, "xaby"));
  EXPECT_TRUE(accepts(g, "xababy"));
  EXPECT_TRUE(accepts(g, "xabababy"));
  EXPECT_TRUE(accepts(g, "xababababy"));
  EXPECT_FALSE(accepts(g, "xabababababy"));
  EXPECT_FALSE(accepts(g, "xababa"));
}

TEST(Recogniser, Utf8ClassesMatchWholeCharacters) {
  GrammarBuilder b;
  // Greek and CJK and one emoji range, nothing else.
  CodepointClass c = cp_normalize({{0x391, 0x3C9}, {0x4E00, 0x9FFF}, {0x1F600, 0x1F64F}});
  int r = b.add_rule(expr_repeat(expr_utf8_class(c), 1, -1));
  GrammarPtr g = b.build(r, "utf8");
  EXPECT_TRUE(accepts(g, "αβγ"));
  EXPECT_TRUE(accepts(g, "中文😀"));
  EXPECT_FALSE(accepts(g, "a"));
  EXPECT_FALSE(accepts(g, "é"));
  EXPECT_FALSE(accepts(g, std::string("\xCE", 1)));      // a lead byte alone
  EXPECT_FALSE(accepts(g, std::string("\xED\xA0\x80")));  // an encoded surrogate
  // Every code point of the full range round-trips, and a sample outside the class is refused.
  GrammarBuilder b2;
  int r2 = b2.add_rule(expr_utf8_class(cp_all()));
  GrammarPtr all = b2.build(r2, "all");
  std::mt19937_64 rng(test::fresh_seed());
  for (int i = 0; i < 3000; ++i) {
    uint32_t cp = static_cast<uint32_t>(rng() % 0x110000);
    std::string s;
    append_utf8(s, cp);
    bool surrogate = cp >= 0xD800 && cp <= 0xDFFF;
    ASSERT_EQ(accepts(all, s), !surrogate) << std::hex << cp;
    ASSERT_EQ(accepts(g, s), cp_contains(c, cp)) << std::hex << cp;
  }
}

TEST(Recogniser, ByteSetsAndEmptyAlternatives) {
  GrammarBuilder b;
  int r = b.add_rule(expr_alt({expr_literal("a"), expr_seq({expr_literal("b"), expr_nothing()}), expr_empty()}));
  GrammarPtr g = b.build(r, "drop");
  EXPECT_TRUE(accepts(g, "a"));
  EXPECT_TRUE(accepts(g, ""));
  EXPECT_FALSE(accepts(g, "b"));  // the alternative that cannot complete was dropped
}

TEST(Recogniser, BuilderRefusesNothingAndLeftRecursion) {
  {
    GrammarBuilder b;
    int r = b.add_rule(expr_nothing());
    EXPECT_THROW(b.build(r, "nothing"), GrammarError);
  }
  {  // A = A "x" | "y": left recursion that grows the stack
    GrammarBuilder b;
    int a = b.new_rule();
    b.define(a, expr_alt({expr_seq({expr_ref(a), expr_literal("x")}), expr_literal("y")}));
    EXPECT_THROW(b.build(a, "left"), GrammarError);
  }
  {  // A = B; B = A | "z": a cycle in tail position only, fine
    GrammarBuilder b;
    int a = b.new_rule(), c = b.new_rule();
    b.define(a, expr_ref(c));
    b.define(c, expr_alt({expr_ref(a), expr_literal("z")}));
    GrammarPtr g = b.build(a, "tail");
    EXPECT_TRUE(accepts(g, "z"));
    EXPECT_FALSE(accepts(g, "zz"));
  }
  {  // repetition of a nullable item terminates
    GrammarBuilder b;
    int r = b.add_rule(expr_repeat(expr_repeat(expr_literal("a"), 0, -1), 0, -1));
    GrammarPtr g = b.build(r, "nullable star");
    EXPECT_TRUE(accepts(g, ""));
    EXPECT_TRUE(accepts(g, "aaaa"));
  }
}

TEST(Recogniser, RegexSubset) {
  auto compile = [](const std::string& re) {
    GrammarBuilder b;
    int r = b.add_rule(compile_regex(re, [](const CodepointClass& c) { return expr_utf8_class(c); }));
    return b.build(r, "regex");
  };
  struct Case {
    std::string re;
    std::vector<std::string> yes, no;
  };
  std::vector<Case> cases = {
      {"^[a-z]+\\d{2,3}$", {"ab12", "z999"}, {"ab1", "ab1234", "AB12", "12"}},
      {"(?:cat|dog)s?", {"cat", "dogs"}, {"cats!", "do"}},
      {"[^abc]x", {"dx", "éx"}, {"ax", "x"}},
      {"a.c", {"abc", "a-c", "aéc"}, {"a\nc", "ac"}},
      {"\\w+@\\w+\\.com", {"john_1@mail.com"}, {"john@mail.org"}},
      {"\\s*-?\\d+(\\.\\d+)?", {"  -12.5", "7"}, {"1.", "--1"}},
      {"x{3}y{1,}z{0,2}", {"xxxy", "xxxyyyzz"}, {"xxy", "xxxyzzz"}},
      {"\\u00e9\\x41[\\-.]", {"éA-", "éA."}, {"éA,"}},
      {"a|b|", {"a", "b", ""}, {"ab"}},
      {"[\\d\\s]+", {"1 2"}, {"a"}},
  };
  for (const auto& c : cases) {
    GrammarPtr g = compile(c.re);
    for (const auto& s : c.yes) EXPECT_TRUE(accepts(g, s)) << c.re << " should accept " << s;
    for (const auto& s : c.no) EXPECT_FALSE(accepts(g, s)) << c.re << " should reject " << s;
  }
  for (std::string bad : {"(a", "a)", "[a", "a{2,1}", "(?=a)", "\\1", "a\\b", "*a", "a**", "\\q", "a^b", "a$b", "[z-a]"})
    EXPECT_THROW(compile(bad), RegexError) << bad;
}

}  // namespace
}  // namespace tern::grammar
