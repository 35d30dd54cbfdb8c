// Matcher: masks equal brute force, random walks over the real Qwen3 vocabulary end in valid documents, end ids,
// special tokens and padding rows.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "grammar_test_util.h"
#include "text/tokenizer.h"

namespace tern::grammar {
namespace {

using ojson = nlohmann::ordered_json;

const char* kWeather = R"({"type":"object","properties":{"location":{"type":"string","description":"City"},
  "unit":{"type":"string","enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":14}},
  "required":["location","unit"],"additionalProperties":false})";

const char* kPerson = R"({"type":"object","properties":{
  "name":{"type":"string","minLength":1,"maxLength":40},
  "born":{"type":"string","format":"date"},
  "role":{"enum":["admin","user","guest"]},
  "tags":{"type":"array","items":{"type":"string","maxLength":12},"maxItems":4},
  "address":{"type":"object","properties":{"street":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"},
             "country":{"type":["string","null"]}},"required":["street","zip"],"additionalProperties":false},
  "score":{"type":"number","minimum":-5,"exclusiveMaximum":100},"active":{"type":"boolean"}},
  "required":["name","born","role","address"],"additionalProperties":false})";

const char* kTree = R"({"$defs":{"node":{"type":"object","properties":{"label":{"type":"string","maxLength":8},
  "kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":3}},"required":["label"],"additionalProperties":false}},
  "$ref":"#/$defs/node"})";

const char* kProducts = R"({"type":"array","minItems":1,"maxItems":5,"items":{"type":"object","properties":{
  "sku":{"type":"string","pattern":"^[A-Z]{2}-\\d{3,5}$"},"price":{"type":"number"},"qty":{"type":"integer","minimum":0},
  "id":{"type":"string","format":"uuid"}},"required":["sku","price","qty"],"additionalProperties":false}})";

std::vector<std::pair<const char*, GrammarPtr>> walk_grammars() {
  std::vector<std::pair<const char*, GrammarPtr>> out;
  for (const char* s : {kWeather, kPerson, kTree, kProducts}) out.emplace_back(s, compile_json_schema(ojson::parse(s)));
  out.emplace_back(R"({"type":"object"})", compile_json_object());
  return out;
}

void check_walk_text(const test::WalkResult& w, const char* schema_text) {
  ojson doc = ojson::parse(w.text, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << "not JSON: " << w.text;
  ojson schema = ojson::parse(schema_text);
  std::string why;
  ASSERT_TRUE(test::validate(doc, schema, schema, &why)) << why << "\n" << w.text;
}

TEST(Matcher, RandomWalksOverQwen3EndInValidDocuments) {
  auto vocab = test::qwen3_vocab();
  uint64_t seed = test::fresh_seed();
  for (const auto& [schema, g] : walk_grammars()) {
    for (int i = 0; i < 10; ++i) {
      std::mt19937_64 rng(seed + static_cast<uint64_t>(i));
      test::WalkResult w = test::random_walk(g, vocab, rng, 2000, 50 + static_cast<int>(rng() % 250));
      ASSERT_FALSE(w.dead_end) << schema << "\ndead end after: " << w.text;
      ASSERT_TRUE(w.ended) << schema << "\nnot finished: " << w.text;
      check_walk_text(w, schema);
    }
  }
}

// A small vocabulary of JSON-ish pieces: every single byte plus random strings over the JSON alphabet.
std::shared_ptr<const TokenVocabulary> small_vocab(std::mt19937_64& rng, std::vector<std::string>* tokens_out) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  const std::string alphabet = "{}[]\",: 0123456789-.eatrufnlsxyz\\\n";
  for (int i = 0; i < 1500; ++i) {
    std::string t;
    for (size_t n = 1 + rng() % 5; n > 0; --n) t += alphabet[rng() % alphabet.size()];
    tokens.push_back(t);
  }
  tokens.push_back("\xC3\xA9");  // é
  tokens.push_back("\xC3");      // half of it
  tokens.push_back("");          // never allowed
  *tokens_out = tokens;
  int32_t end = static_cast<int32_t>(tokens.size()) + 3;  // padding rows in between
  return TokenVocabulary::from_tokens(tokens, {end});
}

// fill_mask against trying every id on a clone.
void expect_mask_is_brute_force(Matcher& m, const TokenVocabulary& vocab, const std::vector<int32_t>& ids_to_check) {
  std::vector<uint32_t> mask(static_cast<size_t>(vocab.mask_words()));
  m.fill_mask(mask);
  bool any = false;
  for (int32_t id : ids_to_check) {
    Matcher c = m.clone();
    bool ok = c.accept(id);
    bool bit = (mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u;
    ASSERT_EQ(bit, ok) << "id " << id << " after " << m.text();
    any = any || bit;
  }
  for (int64_t id = 0; id < vocab.size(); ++id)
    if ((mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u) any = true;
  ASSERT_TRUE(any) << "empty mask after " << m.text();
}

TEST(Matcher, MaskEqualsBruteForceOnSmallVocabulary) {
  std::mt19937_64 rng(test::fresh_seed());
  std::vector<std::string> tokens;
  auto vocab = small_vocab(rng, &tokens);
  std::vector<int32_t> all;
  for (int32_t id = 0; id < vocab->size(); ++id) all.push_back(id);
  for (const auto& [schema, g] : walk_grammars()) {
    for (int walk = 0; walk < 6; ++walk) {
      Matcher m(g, vocab);
      std::vector<uint32_t> mask(static_cast<size_t>(vocab->mask_words()));
      for (int step = 0; step < 60 && !m.done(); ++step) {
        expect_mask_is_brute_force(m, *vocab, all);
        m.fill_mask(mask);
        std::vector<int32_t> ids = test::mask_ids(mask);
        ASSERT_FALSE(ids.empty());
        int32_t id = ids[rng() % ids.size()];
        ASSERT_TRUE(m.accept(id)) << schema;
      }
    }
  }
}

TEST(Matcher, MaskEqualsBruteForceOnQwen3Sample) {
  auto vocab = test::qwen3_vocab();
  std::mt19937_64 rng(test::fresh_seed());
  std::vector<int32_t> sample;
  for (int i = 0; i < 4000; ++i) sample.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab->size())));
  for (int32_t id : {test::kImEnd, test::kEndOfText, 151644 /* <|im_start|> */, 151657 /* <tool_call> */, 151935 /* padding */})
    sample.push_back(id);
  for (const auto& [schema, g] : walk_grammars()) {
    Matcher m(g, vocab);
    std::vector<uint32_t> mask(static_cast<size_t>(vocab->mask_words()));
    for (int step = 0; step < 25 && !m.done(); ++step) {
      std::vector<int32_t> ids = sample;
      m.fill_mask(mask);
      std::vector<int32_t> allowed = test::mask_ids(mask);
      for (size_t k = 0; k < 200 && k < allowed.size(); ++k) ids.push_back(allowed[rng() % allowed.size()]);
      expect_mask_is_brute_force(m, *vocab, ids);
      ASSERT_TRUE(m.accept(allowed[rng() % allowed.size()])) << schema;
    }
  }
}

TEST(Matcher, EndIdsExactlyWhenComplete) {
  auto vocab = test::qwen3_vocab();
  GrammarPtr g = compile_json_schema(ojson::parse(R"({"type":"integer"})"));
  Matcher m(g, vocab);
  std::vector<uint32_t> mask(static_cast<size_t>(vocab->mask_words()));
  auto has = [&](int32_t id) { return ((mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u) != 0; };
  m.fill_mask(mask);
  EXPECT_FALSE(has(test::kImEnd));
  EXPECT_FALSE(m.accept(test::kImEnd));
  ASSERT_TRUE(m.accept(*test::qwen3().token_id("4")));
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.done());  // more digits may follow
  m.fill_mask(mask);
  EXPECT_TRUE(has(test::kImEnd));
  EXPECT_TRUE(has(test::kEndOfText));
  EXPECT_TRUE(has(*test::qwen3().token_id("2")));
  EXPECT_FALSE(has(*test::qwen3().token_id("a")));
  ASSERT_TRUE(m.accept(test::kImEnd));
  EXPECT_TRUE(m.done());
  EXPECT_EQ(m.text(), "4");
  EXPECT_FALSE(m.accept(*test::qwen3().token_id("2")));

  // When nothing can follow, only the end ids are set.
  Matcher b(compile_json_schema(ojson::parse(R"({"type":"boolean"})")), vocab);
  ASSERT_TRUE(b.accept_bytes("true"));
  EXPECT_TRUE(b.done());
  b.fill_mask(mask);
  EXPECT_EQ(test::mask_ids(mask), (std::vector<int32_t>{test::kEndOfText, test::kImEnd}));
}

TEST(Matcher, SpecialTokensAndPaddingRowsAreNeverAllowed) {
  auto vocab = test::qwen3_vocab();
  EXPECT_EQ(vocab->size(), 151936);
  EXPECT_EQ(vocab->mask_words(), 151936 / 32);
  // Any JSON object allows almost everything inside a string; special tokens and padding rows stay off.
  Matcher m(compile_json_object(), vocab);
  ASSERT_TRUE(m.accept_bytes("{\"k\": \"v"));
  std::vector<uint32_t> mask(static_cast<size_t>(vocab->mask_words()));
  m.fill_mask(mask);
  std::vector<int32_t> ids = test::mask_ids(mask);
  EXPECT_GT(ids.size(), 100000u);
  for (int32_t id : ids) {
    ASSERT_LT(id, test::qwen3().vocab_size());
    ASSERT_FALSE(test::qwen3().is_special(id)) << id;
  }
  // A vocabulary with more model rows than tokenizer ids (the real model: 248,320 rows).
  auto big = TokenVocabulary::from_tokenizer(test::qwen3(), 248320, {test::kImEnd});
  EXPECT_EQ(big->mask_words(), 248320 / 32);
  Matcher mb(compile_json_object(), big);
  EXPECT_FALSE(mb.accept(200000));
  std::vector<uint32_t> big_mask(static_cast<size_t>(big->mask_words()));
  mb.fill_mask(big_mask);
  for (int32_t id : test::mask_ids(big_mask)) ASSERT_LT(id, test::qwen3().vocab_size());
}

TEST(Matcher, ShortestCompletionClosesTheDocument) {
  Matcher m(compile_json_schema(ojson::parse(kWeather)), test::byte_vocab());
  ASSERT_TRUE(m.accept_bytes("{\"location\": \"Pa"));
  std::optional<std::string> rest = m.shortest_completion();
  ASSERT_TRUE(rest.has_value());
  EXPECT_EQ(*rest, "\",\"unit\":\"celsius\"}");
  ASSERT_TRUE(m.accept_bytes(*rest));
  EXPECT_TRUE(m.done());
  EXPECT_EQ(m.shortest_completion(), std::optional<std::string>(""));
}

// Matchers of one grammar share its automaton and masks (guarded by a mutex): requests on several threads must
// still each see a consistent state.
TEST(Matcher, MatchersOfOneGrammarWorkFromManyThreads) {
  GrammarPtr g = compile_json_schema(ojson::parse(kPerson));
  uint64_t seed = test::fresh_seed();
  std::vector<std::string> failures(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 8; ++i) {
        std::mt19937_64 rng(seed + static_cast<uint64_t>(t * 100 + i));
        test::WalkResult w = test::random_walk(g, test::byte_vocab(), rng, 3000, 100 + static_cast<int>(rng() % 300));
        ojson doc = ojson::parse(w.text, nullptr, false);
        ojson schema = ojson::parse(kPerson);
        std::string why;
        if (w.dead_end || !w.ended || doc.is_discarded() || !test::validate(doc, schema, schema, &why)) {
          failures[static_cast<size_t>(t)] = "thread " + std::to_string(t) + ": " + why + " " + w.text;
          return;
        }
      }
    });
  for (auto& th : threads) th.join();
  for (const auto& f : failures) EXPECT_TRUE(f.empty()) << f;
}

TEST(Matcher, CloneIsIndependent) {
  auto vocab = test::byte_vocab();
  Matcher m(compile_json_schema(ojson::parse(kWeather)), vocab);
  ASSERT_TRUE(m.accept_bytes("{\"location\": \"Par"));
  Matcher c = m.clone();
  ASSERT_TRUE(c.accept_bytes("is\", \"unit\": \"celsius\"}"));
  EXPECT_TRUE(c.done());
  EXPECT_FALSE(m.complete());
  EXPECT_EQ(m.text(), "{\"location\": \"Par");
  EXPECT_FALSE(m.accept_bytes("is\", \"unit\": \"kelvin\"}"));
  EXPECT_TRUE(m.accept_bytes("is\", \"unit\": \"fahrenheit\"}"));
}

}  // namespace
}  // namespace tern::grammar
