// tern_grammar_bench: the cost of constrained decoding on the CPU.
//
// Builds the token vocabulary of the real Qwen3 tokenizer (timed), then for three realistic schemas drives a fresh
// Matcher (one per request) along valid documents tokenized by that tokenizer, timing fill_mask before every token
// (as the sampler does) and accept after it. Prints per-token mask microseconds (p50, p90, p99, max) per schema:
// "cold" is the first request of a newly compiled schema (nothing cached), "all" every request, where later
// requests with the same schema reuse the compiled grammar's automaton and masks. "cold-cpu" is the cold row in
// the thread's CPU time: on a machine shared with other work, a wall-clock outlier of a few milliseconds is often
// the thread waiting for a core (preemption), which the CPU time leaves out.
//
//   tern_grammar_bench [tokenizer.json(.zst)] [repeats]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "text/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
using ojson = nlohmann::ordered_json;

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

struct Workload {
  const char* name;
  const char* schema;
  std::vector<std::string> documents;
};

std::vector<Workload> workloads() {
  return {
      {"weather tool args",
       R"({"type":"object","properties":{"location":{"type":"string","description":"City and country"},
          "unit":{"type":"string","enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":14},
          "include_hourly":{"type":"boolean"}},"required":["location","unit","days","include_hourly"],"additionalProperties":false})",
       {R"({"location": "Paris, France", "unit": "celsius", "days": 3, "include_hourly": false})",
        R"({"location": "San Francisco, CA, United States", "unit": "fahrenheit", "days": 14, "include_hourly": true})",
        R"({"location": "München", "unit": "celsius", "days": 1, "include_hourly": true})"}},
      {"person record",
       R"({"type":"object","properties":{
          "name":{"type":"string","minLength":1,"maxLength":80},"born":{"type":"string","format":"date"},
          "role":{"type":"string","enum":["admin","editor","viewer"]},"email":{"type":"string","format":"email"},
          "tags":{"type":"array","items":{"type":"string"},"maxItems":8},
          "address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},
             "zip":{"type":"string","pattern":"^[0-9]{5}$"},"country":{"type":["string","null"]}},
             "required":["street","city","zip","country"],"additionalProperties":false},
          "bio":{"type":"string"}},
          "required":["name","born","role","email","tags","address","bio"],"additionalProperties":false})",
       {R"({"name": "Ada Lovelace", "born": "1815-12-10", "role": "admin", "email": "ada@analytical.org", "tags": ["math", "poetry", "engines"], "address": {"street": "12 St James's Square", "city": "London", "zip": "10001", "country": "United Kingdom"}, "bio": "Wrote the first published algorithm intended for a machine, notes on Menabrea's memoir about the Analytical Engine, and speculated that such machines could compose music."})",
        R"({"name": "Grace Hopper", "born": "1906-12-09", "role": "editor", "email": "grace.hopper@navy.mil", "tags": [], "address": {"street": "1 Navy Yard", "city": "Arlington", "zip": "22202", "country": null}, "bio": "Rear admiral; pioneered compilers (A-0, FLOW-MATIC) and popularised the term \"debugging\" after a moth was found in the Mark II."})"}},
      {"recursive tree",
       R"({"$defs":{"node":{"type":"object","properties":{"name":{"type":"string"},"size":{"type":"integer","minimum":0},
          "children":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["name","size","children"],
          "additionalProperties":false}},"$ref":"#/$defs/node"})",
       {R"({"name": "src", "size": 4096, "children": [{"name": "grammar", "size": 1024, "children": [{"name": "matcher.cpp", "size": 180, "children": []}, {"name": "automaton.cpp", "size": 160, "children": []}]}, {"name": "text", "size": 2048, "children": [{"name": "tokenizer.cpp", "size": 502, "children": []}]}]})"}},
  };
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = argc > 1 ? argv[1] : std::string(TERN_SOURCE_DIR) + "/tests/data/tokenizers/qwen3-tokenizer.json.zst";
  int repeats = argc > 2 ? std::max(1, std::atoi(argv[2])) : 5;
  auto t0 = Clock::now();
  tern::Tokenizer tok = tern::Tokenizer::from_file(path);
  double load_ms = us_since(t0) / 1000;
  t0 = Clock::now();
  auto vocab = tern::grammar::TokenVocabulary::from_tokenizer(tok, 248320, {151645, 151643});
  double vocab_ms = us_since(t0) / 1000;
  std::printf("tokenizer load %.1f ms; vocabulary build %.1f ms (%d tokenizer ids, %lld model rows)\n", load_ms, vocab_ms,
              tok.vocab_size(), static_cast<long long>(vocab->size()));
  std::vector<uint32_t> mask(static_cast<size_t>(vocab->mask_words()));
  std::printf("%-18s %-8s %8s %7s %7s %7s %7s %8s %9s %8s\n", "schema", "runs", "compile", "tokens", "p50 us", "p90 us",
              "p99 us", "max us", "accept us", "first us");
  for (const Workload& w : workloads()) {
    t0 = Clock::now();
    tern::grammar::GrammarPtr g = tern::grammar::compile_json_schema(ojson::parse(w.schema));
    double compile_us = us_since(t0);
    std::vector<double> mask_us, accept_us, first_us, cold_us, cold_cpu_us;
    double slowest = 0;
    std::string slowest_at;  // the text before the slowest mask
    for (int r = 0; r < repeats; ++r) {
      for (const std::string& doc : w.documents) {
        std::vector<int32_t> ids = tok.encode(doc);
        ids.push_back(151645);
        tern::grammar::Matcher m(g, vocab);  // a fresh request: cold caches
        for (size_t i = 0; i < ids.size(); ++i) {
          double cpu0 = thread_cpu_us();
          auto t = Clock::now();
          m.fill_mask(mask);
          double us = us_since(t);
          double cpu = thread_cpu_us() - cpu0;
          mask_us.push_back(us);
          if (r == 0 && &doc == &w.documents[0]) {
            cold_us.push_back(us);
            cold_cpu_us.push_back(cpu);
          }
          if (us > 1000 && std::getenv("TERN_BENCH_VERBOSE"))
            std::printf("  %.0f us after ...%s\n", us, m.text().substr(m.text().size() > 50 ? m.text().size() - 50 : 0).c_str());
          if (us > slowest) {
            slowest = us;
            slowest_at = m.text().substr(m.text().size() > 40 ? m.text().size() - 40 : 0);
          }
          if (i == 0) first_us.push_back(us);
          if (!((mask[static_cast<size_t>(ids[i]) / 32] >> (ids[i] % 32)) & 1u)) {
            std::fprintf(stderr, "%s: token %d (%s) not allowed after: %s\n", w.name, ids[i], tok.token_bytes(ids[i]).c_str(),
                         m.text().c_str());
            return 1;
          }
          t = Clock::now();
          bool ok = m.accept(ids[i]);
          accept_us.push_back(us_since(t));
          if (!ok) {
            std::fprintf(stderr, "%s: accept refused token %d\n", w.name, ids[i]);
            return 1;
          }
        }
        if (!m.done()) {
          std::fprintf(stderr, "%s: not done at the end\n", w.name);
          return 1;
        }
      }
    }
    auto row = [&](const char* which, const std::vector<double>& v) {
      std::printf("%-18s %-8s %6.0fus %7zu %7.1f %7.1f %7.1f %8.1f %9.2f %8.0f\n", w.name, which, compile_us, v.size(),
                  percentile(v, 0.5), percentile(v, 0.9), percentile(v, 0.99), *std::max_element(v.begin(), v.end()),
                  percentile(accept_us, 0.5), percentile(first_us, 0.5));
    };
    row("cold", cold_us);
    row("cold-cpu", cold_cpu_us);
    row("all", mask_us);
    if (std::getenv("TERN_BENCH_VERBOSE")) std::printf("  slowest mask after ...%s\n", slowest_at.c_str());
  }
  return 0;
}
