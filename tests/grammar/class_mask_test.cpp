// The class-table mask path (counted strings and repetitions, formats, patterns with {m,n}) against brute force:
// at every step of random walks, fill_mask must allow exactly the ids whose bytes a clone of the Matcher accepts,
// over the WHOLE vocabulary. Vocabularies are chosen to hit the path's corners: tokens with more class characters
// than a counted repetition has left (refused at once, or walked), tokens that leave the class after a prefix,
// partial and whole multi-byte characters, duplicate ids. Seeds are fresh each run (printed; TERN_TEST_SEED
// repeats one).
#include <gtest/gtest.h>

#include <random>

#include "grammar_test_util.h"
#include "text/tokenizer.h"

namespace tern::grammar {
namespace {

using ojson = nlohmann::ordered_json;

// Schemas whose strings are counted or formatted, so that masks inside them take the class path.
const std::vector<std::string>& class_schemas() {
  static const std::vector<std::string> s = {
      R"({"type":"object","properties":{"a":{"type":"string","minLength":3,"maxLength":70},
          "b":{"type":"string","maxLength":5},"c":{"type":"string","minLength":40}},
          "required":["a","b","c"],"additionalProperties":false})",
      R"({"type":"object","properties":{"email":{"type":"string","format":"email"},
          "born":{"type":"string","format":"date"},"id":{"type":"string","format":"uuid"},
          "at":{"type":"string","format":"date-time"}},"required":["email","born","id","at"],
          "additionalProperties":false})",
      R"({"type":"array","items":{"type":"string","pattern":"^[a-z0-9_-]{2,90}$"},"minItems":1,"maxItems":3})",
      R"({"type":"object","properties":{"p":{"type":"string","pattern":"^(ab|[0-9]{3,}){1,4}x{0,50}$"},
          "q":{"type":"string","pattern":"^[^,]{1,100}$"},"r":{"type":"string","pattern":"^[A-Z]{2}-\\d{3,5}$"}},
          "required":["p","q","r"],"additionalProperties":false})",
      // The same ASCII characters all along, but multi-byte ones only in the first three positions.
      R"({"type":"array","items":{"type":"string","pattern":"^[^,]{1,3}[\\x00-+\\--\\x7f]{0,50}$"},"minItems":1})",
      R"({"type":"object","properties":{"name":{"type":"string","minLength":1,"maxLength":80},
          "email":{"type":"string","format":"email"},"tags":{"type":"array","items":{"type":"string","maxLength":12}}},
          "required":["name","email","tags"],"additionalProperties":false})",
  };
  return s;
}

std::vector<GrammarPtr> class_grammars() {
  std::vector<GrammarPtr> out;
  for (const std::string& s : class_schemas()) out.push_back(compile_json_schema(ojson::parse(s)));
  // Raw tool-call text with a length limit (a different class: no '<').
  out.push_back(compile_tool_calls({{"note", nlohmann::json::parse(R"({"type":"object","properties":{
      "text":{"type":"string","minLength":2,"maxLength":60}},"required":["text"]})")}}, false));
  return out;
}

// Every byte, runs of one character (up to 130 of them: longer than any counted bound above), class runs that end
// in a character outside the class, multi-byte characters whole and cut, and a few duplicates.
std::vector<std::string> corner_tokens(std::mt19937_64& rng) {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.push_back(std::string(1, static_cast<char>(b)));
  const std::vector<std::string> chars = {"a", "Z", "7", "-", "_", ".", "@", " ", ",", "x", "\"", "\\", "<",
                                          "\xC3\xA9" /* é */, "\xE4\xB8\xAD" /* 中 */, "\xF0\x9F\x98\x80" /* 😀 */};
  for (const std::string& c : chars)
    for (int n : {2, 3, 4, 5, 8, 12, 16, 31, 32, 33, 40, 63, 64, 65, 70, 80, 90, 100, 128, 130}) {
      std::string s;
      for (int i = 0; i < n; ++i) s += c;
      t.push_back(s);
    }
  const std::string alphabet = "abcxyzAZ0129-_.@%+ ,:\"\\{}[]<>";
  for (int i = 0; i < 3000; ++i) {
    std::string s;
    size_t run = 1 + rng() % (rng() % 4 == 0 ? 100 : 10);
    for (size_t k = 0; k < run; ++k) s += alphabet[rng() % 16];  // class-ish characters first
    if (rng() % 2) s += alphabet[rng() % alphabet.size()];       // then maybe anything
    if (rng() % 8 == 0) s += chars[13 + rng() % 3];             // a multi-byte character
    if (rng() % 16 == 0) s += "\xE4\xB8";                       // a cut one
    t.push_back(s);
  }
  for (const char* s : {"\xC3", "\xE4", "\xE4\xB8", "\xF0\x9F\x98", "ab\xC3", "\x80", "\xFF", "a\xC3\xA9z"})
    t.push_back(s);
  t.push_back(t[300]);  // duplicates: ids with the same bytes
  t.push_back(t[1000]);
  return t;
}

// fill_mask equals "a clone accepts the id" for every id of the vocabulary.
void expect_mask_is_brute_force(Matcher& m, const TokenVocabulary& vocab, std::vector<uint32_t>& mask) {
  m.fill_mask(mask);
  for (int32_t id = 0; id < vocab.size(); ++id) {
    bool bit = (mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u;
    Matcher c = m.clone();
    ASSERT_EQ(bit, c.accept(id)) << "id " << id << " after " << m.text();
  }
}

// A random walk that lingers in strings: half the steps take a one-character token.
void walk_against_brute_force(const GrammarPtr& g, const std::shared_ptr<const TokenVocabulary>& vocab,
                              std::mt19937_64& rng, int steps, const std::vector<int32_t>& single) {
  Matcher m(g, vocab);
  std::vector<uint32_t> mask(static_cast<size_t>(vocab->mask_words()));
  for (int step = 0; step < steps && !m.done(); ++step) {
    expect_mask_is_brute_force(m, *vocab, mask);
    if (::testing::Test::HasFatalFailure()) return;
    std::vector<int32_t> ids = test::mask_ids(mask);
    ASSERT_FALSE(ids.empty()) << "empty mask after " << m.text();
    std::vector<int32_t> short_ids;
    if (rng() % 2)
      for (int32_t id : single)
        if ((mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u) short_ids.push_back(id);
    const std::vector<int32_t>& from = short_ids.empty() ? ids : short_ids;
    ASSERT_TRUE(m.accept(from[rng() % from.size()]));
  }
}

TEST(ClassMask, EqualsBruteForceOnCornerVocabulary) {
  uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  std::vector<std::string> tokens = corner_tokens(rng);
  int32_t end = static_cast<int32_t>(tokens.size()) + 2;
  auto vocab = TokenVocabulary::from_tokens(tokens, {end});
  std::vector<int32_t> single;
  for (int32_t id = 0; id < 128; ++id) single.push_back(id);
  for (int32_t id = 256; id < static_cast<int32_t>(tokens.size()); ++id)
    if (tokens[static_cast<size_t>(id)].size() <= 4 && (static_cast<uint8_t>(tokens[static_cast<size_t>(id)][0]) >= 0xC2))
      single.push_back(id);  // whole multi-byte characters
  std::vector<GrammarPtr> grammars = class_grammars();
  for (size_t k = 0; k < grammars.size(); ++k)
    for (int walk = 0; walk < 4; ++walk) {
      SCOPED_TRACE("grammar " + std::to_string(k) + " walk " + std::to_string(walk));
      walk_against_brute_force(grammars[k], vocab, rng, 150, single);
      if (HasFatalFailure()) return;
    }
}

// The same on the real Qwen3 vocabulary (151,936 ids per mask), fewer steps; the walks start inside the counted
// strings and formats so that their first, cold positions are checked.
TEST(ClassMask, EqualsBruteForceOnQwen3) {
  auto vocab = test::qwen3_vocab();
  std::mt19937_64 rng(test::fresh_seed());
  std::vector<int32_t> single;
  for (int32_t id = 0; id < 151643; ++id)
    if (test::qwen3().token_bytes(id).size() == 1) single.push_back(id);
  struct Start {
    size_t grammar;
    const char* prefix;
  };
  std::vector<GrammarPtr> grammars = class_grammars();
  for (const Start& s : std::vector<Start>{{0, "{\"a\": \""},
                                          {0, "{\"a\": \"abc\", \"b\": \"x\", \"c\": \""},
                                          {1, "{\"email\": \""},
                                          {1, "{\"email\": \"ada@example.com\", \"born\": \""},
                                          {1, "{\"email\": \"a@b.co\", \"born\": \"2020-01-31\", \"id\": \""},
                                          {2, "[\""},
                                          {3, "{\"p\": \""},
                                          {4, "[\""},
                                          {4, "[\"ab"},
                                          {5, "{\"name\": \""},
                                          {5, "{\"name\": \"Ada\", \"email\": \"ada.lovelace@"}}) {
    SCOPED_TRACE(s.prefix);
    Matcher m(grammars[s.grammar], vocab);
    ASSERT_TRUE(m.accept_bytes(s.prefix));
    std::vector<uint32_t> mask(static_cast<size_t>(vocab->mask_words()));
    for (int step = 0; step < 6 && !m.done(); ++step) {
      expect_mask_is_brute_force(m, *vocab, mask);
      if (HasFatalFailure()) return;
      std::vector<int32_t> ids = test::mask_ids(mask);
      ASSERT_FALSE(ids.empty());
      std::vector<int32_t> short_ids;
      for (int32_t id : single)
        if (rng() % 2 && ((mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u)) short_ids.push_back(id);
      const std::vector<int32_t>& from = short_ids.empty() ? ids : short_ids;
      ASSERT_TRUE(m.accept(from[rng() % from.size()]));
    }
  }
}

}  // namespace
}  // namespace tern::grammar
