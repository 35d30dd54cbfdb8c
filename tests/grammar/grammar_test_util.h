// Shared helpers of the grammar tests: the real Qwen3 tokenizer, seeds, a byte vocabulary, a JSON Schema
// validator written independently of the compiler (the oracle of the random walks), and a random-walk driver.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"

namespace tern {
class Tokenizer;
}

namespace tern::grammar::test {

using ojson = nlohmann::ordered_json;

const Tokenizer& qwen3();
// The Qwen3 vocabulary as a TokenVocabulary (model rows 151,936 as the real checkpoint; end ids <|im_end|>,
// <|endoftext|>).
std::shared_ptr<const TokenVocabulary> qwen3_vocab();
constexpr int32_t kImEnd = 151645, kEndOfText = 151643;

// Every single byte as a token (ids 0..255), end id 256.
std::shared_ptr<const TokenVocabulary> byte_vocab();
constexpr int32_t kByteEnd = 256;

uint64_t fresh_seed();  // TERN_TEST_SEED repeats a run

// Whole-string acceptance, byte by byte through a Matcher.
bool accepts(const GrammarPtr& g, const std::string& text);

// Validates `v` against `schema` (the subset the compiler supports; oneOf read as anyOf). `why` says what failed.
bool validate(const ojson& v, const ojson& schema, const ojson& root, std::string* why);

// Ids set in a mask.
std::vector<int32_t> mask_ids(const std::vector<uint32_t>& mask);

struct WalkResult {
  std::string text;
  bool ended = false;      // an end id was sampled (or done())
  bool dead_end = false;   // a mask with no id at all
  int steps = 0;
};
// Samples allowed tokens at random (half the time among single-byte tokens) for random_steps, then finishes along
// Matcher::shortest_completion, until an end id or max_steps.
WalkResult random_walk(const GrammarPtr& g, const std::shared_ptr<const TokenVocabulary>& vocab, std::mt19937_64& rng,
                       int max_steps, int random_steps);

}  // namespace tern::grammar::test
