#include "grammar_test_util.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <regex>

#include "text/tokenizer.h"

namespace tern::grammar::test {

const Tokenizer& qwen3() {
  static const Tokenizer tok = Tokenizer::from_file(std::filesystem::path(__FILE__).parent_path() /
                                                    "../data/tokenizers/qwen3-tokenizer.json.zst");
  return tok;
}

std::shared_ptr<const TokenVocabulary> qwen3_vocab() {
  static const auto v = TokenVocabulary::from_tokenizer(qwen3(), 151936, {kImEnd, kEndOfText});
  return v;
}

std::shared_ptr<const TokenVocabulary> byte_vocab() {
  static const auto v = [] {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b) t.push_back(std::string(1, static_cast<char>(b)));
    return TokenVocabulary::from_tokens(t, {kByteEnd});
  }();
  return v;
}

uint64_t fresh_seed() {
  const char* env = std::getenv("TERN_TEST_SEED");
  uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::printf("seed=%llu\n", static_cast<unsigned long long>(s));
  return s;
}

bool accepts(const GrammarPtr& g, const std::string& text) {
  Matcher m(g, byte_vocab());
  return m.accept_bytes(text) && m.complete();
}

std::vector<int32_t> mask_ids(const std::vector<uint32_t>& mask) {
  std::vector<int32_t> ids;
  for (size_t w = 0; w < mask.size(); ++w)
    for (uint32_t bits = mask[w]; bits; bits &= bits - 1)
      ids.push_back(static_cast<int32_t>(w * 32 + static_cast<size_t>(__builtin_ctz(bits))));
  return ids;
}

WalkResult random_walk(const GrammarPtr& g, const std::shared_ptr<const TokenVocabulary>& vocab, std::mt19937_64& rng,
                       int max_steps, int random_steps) {
  WalkResult r;
  Matcher m(g, vocab);
  std::vector<uint32_t> mask(static_cast<size_t>(vocab->mask_words()));
  const Tokenizer* tok = vocab->size() > 1000 ? &qwen3() : nullptr;
  auto bytes_of = [&](int32_t id) {
    if (!tok) return std::string(1, static_cast<char>(id));
    return id < tok->vocab_size() && tok->contains(id) ? tok->token_bytes(id) : std::string();
  };
  for (; r.steps < max_steps; ++r.steps) {
    if (m.done()) {
      r.ended = true;
      break;
    }
    m.fill_mask(mask);
    std::vector<int32_t> ids = mask_ids(mask);
    if (ids.empty()) {
      r.dead_end = true;
      break;
    }
    int32_t id = -1;
    if (r.steps >= random_steps) {
      // Finishing: the allowed token that covers the longest prefix of the shortest completion (an end id when
      // complete).
      std::optional<std::string> rest = m.shortest_completion();
      if (!rest) {
        r.dead_end = true;
        break;
      }
      size_t best = 0;
      for (int32_t cand : ids) {
        if (rest->empty()) {
          bool is_end = tok ? (cand == kImEnd || cand == kEndOfText) : cand == kByteEnd;
          if (!is_end) continue;
          id = cand;
          break;
        }
        std::string b = bytes_of(cand);
        if (!b.empty() && b.size() > best && rest->compare(0, b.size(), b) == 0) {
          best = b.size();
          id = cand;
        }
      }
    }
    if (id < 0) {
      std::vector<int32_t> short_ids;
      if (rng() % 2 == 0)
        for (int32_t cand : ids)
          if (bytes_of(cand).size() == 1) short_ids.push_back(cand);
      const auto& pool = short_ids.empty() ? ids : short_ids;
      id = pool[rng() % pool.size()];
    }
    if (!m.accept(id)) {  // the mask said it was allowed
      r.dead_end = true;
      break;
    }
    if (m.done()) {
      r.ended = true;
      ++r.steps;
      break;
    }
  }
  r.text = m.text();
  return r;
}

// ---- validator ----------------------------------------------------------------------------------------------

namespace {

size_t codepoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

const ojson* resolve(const ojson& root, const std::string& ref) {
  if (ref.empty() || ref[0] != '#') return nullptr;
  try {
    return &root.at(ojson::json_pointer(ref.substr(1)));
  } catch (const std::exception&) {
    return nullptr;
  }
}

bool format_ok(const std::string& f, const std::string& s) {
  static const std::string d = "\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])";
  static const std::string t = "([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d+)?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)";
  std::string re = f == "date" ? d : f == "time" ? t : f == "date-time" ? d + "T" + t
                 : f == "uuid" ? "[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"
                 : f == "email" ? "[^@\\s]+@[^@\\s]+\\.[A-Za-z]{2,}" : "";
  if (re.empty()) return false;
  if (!std::regex_match(s, std::regex(re))) return false;
  if (f == "date" || f == "date-time") {  // day within the month (February: up to 29)
    int month = std::stoi(s.substr(5, 2)), day = std::stoi(s.substr(8, 2));
    static const int kDays[13] = {0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (day > kDays[month]) return false;
  }
  return true;
}

bool type_ok(const ojson& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>())));
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  return false;
}

}  // namespace

bool validate(const ojson& v, const ojson& s, const ojson& root, std::string* why) {
  auto no = [&](const std::string& msg) {
    if (why) *why = msg + " for " + v.dump();
    return false;
  };
  if (s.is_boolean()) return s.get<bool>() ? true : no("false schema");
  if (s.value("nullable", false) && v.is_null()) return true;
  if (s.contains("$ref")) {
    const ojson* t = resolve(root, s["$ref"].get<std::string>());
    if (!t) return no("dangling $ref");
    return validate(v, *t, root, why);
  }
  for (const char* k : {"anyOf", "oneOf"})
    if (s.contains(k)) {
      for (const auto& sub : s[k])
        if (validate(v, sub, root, nullptr)) return true;
      return no(std::string("no ") + k + " member matches");
    }
  if (s.contains("allOf"))
    for (const auto& sub : s["allOf"])
      if (!validate(v, sub, root, why)) return false;
  if (s.contains("const") && v != s["const"]) return no("const");
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) return no("enum");
  if (s.contains("type")) {
    bool ok = false;
    if (s["type"].is_string()) ok = type_ok(v, s["type"]);
    else
      for (const auto& t : s["type"]) ok = ok || type_ok(v, t);
    if (!ok) return no("type " + s["type"].dump());
  }
  if (v.is_object()) {
    const ojson props = s.value("properties", ojson::object());
    for (const auto& r : s.value("required", ojson::array()))
      if (!v.contains(r.get<std::string>())) return no("missing required " + r.dump());
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (props.contains(it.key())) {
        if (!validate(it.value(), props[it.key()], root, why)) return false;
      } else if (s.contains("additionalProperties")) {
        if (!validate(it.value(), s["additionalProperties"], root, why)) return false;
      }
    }
  }
  if (v.is_array()) {
    size_t n = v.size();
    if (s.contains("minItems") && n < s["minItems"].get<size_t>()) return no("minItems");
    if (s.contains("maxItems") && n > s["maxItems"].get<size_t>()) return no("maxItems");
    size_t k = 0;
    if (s.contains("prefixItems"))
      for (; k < s["prefixItems"].size() && k < n; ++k)
        if (!validate(v[k], s["prefixItems"][k], root, why)) return false;
    if (s.contains("items"))
      for (; k < n; ++k)
        if (!validate(v[k], s["items"], root, why)) return false;
  }
  if (v.is_string()) {
    std::string str = v.get<std::string>();
    size_t n = codepoints(str);
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return no("minLength");
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return no("maxLength");
    if (s.contains("pattern") && !std::regex_match(str, std::regex(s["pattern"].get<std::string>(), std::regex::ECMAScript)))
      return no("pattern " + s["pattern"].dump());
    if (s.contains("format") && !format_ok(s["format"].get<std::string>(), str)) return no("format " + s["format"].dump());
  }
  if (v.is_number()) {
    double x = v.get<double>();
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return no("minimum");
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return no("maximum");
    if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_number() && x <= s["exclusiveMinimum"].get<double>()) return no("exclusiveMinimum");
    if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_number() && x >= s["exclusiveMaximum"].get<double>()) return no("exclusiveMaximum");
  }
  return true;
}

}  // namespace tern::grammar::test
