// tern tokenize -m DIR [--file F]: text (stdin or a file) -> JSON array of ids.
// --lines: every input line is the base64 of one text's raw bytes -> one JSON array per line, encoded on all
// threads (--threads) in input order; --time prints the encoding time (not the I/O) on stderr.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/check.h"
#include "core/thread_pool.h"
#include "model/config.h"
#include "text/tokenizer.h"

namespace tern::cli {
namespace {

std::string read_input(const std::string& file) {
  if (file.empty() || file == "-") {
    std::ios::sync_with_stdio(false);
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  std::ifstream f(file, std::ios::binary);
  TERN_CHECK(f, "cannot open ", file);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string base64_decode(std::string_view s, size_t line) {
  static const auto table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(a[i])] = int8_t(i);
    return t;
  }();
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    if (c == '=' || c == '\r') continue;
    int v = table[static_cast<unsigned char>(c)];
    TERN_CHECK(v >= 0, "line ", line, " is not base64 (character '", c, "')");
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((acc >> bits) & 0xFF);
    }
  }
  return out;
}

void append_ids_json(std::string& out, const std::vector<int32_t>& ids) {
  out += '[';
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  out += "]\n";
}

}  // namespace

// -m accepts a model folder or a tokenizer.json(.zst) file. A folder with a config.json is checked: the
// tokenizer's ids must fit the model's embedding rows.
Tokenizer load_tokenizer_arg(const std::string& path) {
  if (std::filesystem::is_regular_file(path)) return Tokenizer::from_file(path);
  Tokenizer tok = Tokenizer::from_model_dir(path);
  if (std::filesystem::exists(std::filesystem::path(path) / "config.json"))
    tok.check_fits_embedding(config_load(path).vocab_size);
  return tok;
}

void command_tokenize(CLI::App& app) {
  auto* sub = app.add_subcommand("tokenize", "Text to token ids (a JSON array)");
  auto model = std::make_shared<std::string>();
  auto file = std::make_shared<std::string>();
  auto lines = std::make_shared<bool>(false);
  auto timing = std::make_shared<bool>(false);
  auto threads = std::make_shared<int>(0);
  auto repeat = std::make_shared<int>(1);
  sub->add_option("-m,--model", *model, "Model folder (its tokenizer.json) or a tokenizer.json(.zst) file")->required();
  sub->add_option("--file", *file, "Read the text from this file instead of stdin");
  sub->add_flag("--lines", *lines, "Each input line is base64 of one text; print one JSON array per line");
  sub->add_option("--threads", *threads, "Threads for --lines (0: all)");
  sub->add_flag("--time", *timing, "Print the encoding time on stderr");
  sub->add_option("--repeat", *repeat, "Encode the input this many times (benchmarks; output once)");
  sub->callback([=] {
    TERN_CHECK(*repeat >= 1, "--repeat must be at least 1");
    TERN_CHECK(*threads >= 0, "--threads must be 0 or more");
    Tokenizer tok = load_tokenizer_arg(*model);
    std::string input = read_input(*file);
    std::vector<std::string> texts;
    if (*lines) {
      size_t pos = 0, line = 1;
      while (pos < input.size()) {
        size_t e = input.find('\n', pos);
        if (e == std::string::npos) e = input.size();
        texts.push_back(base64_decode(std::string_view(input).substr(pos, e - pos), line++));
        pos = e + 1;
      }
    } else {
      texts.push_back(std::move(input));
    }
    std::vector<std::vector<int32_t>> ids(texts.size());
    std::unique_ptr<ThreadPool> own_pool;
    if (*threads > 0) own_pool = std::make_unique<ThreadPool>(*threads);
    ThreadPool& pool = own_pool ? *own_pool : thread_pool_global();
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < *repeat; ++r) {
      pool.parallel_for(int64_t(texts.size()), 16, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) ids[i] = tok.encode(texts[i]);
      });
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string out;
    size_t bytes = 0, tokens = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      append_ids_json(out, ids[i]);
      bytes += texts[i].size();
      tokens += ids[i].size();
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    if (*timing)
      std::fprintf(stderr, "tokenize: %zu texts, %zu bytes, %zu tokens, x%d, %d threads: %.4f s, %.2f MB/s\n",
                   texts.size(), bytes, tokens, *repeat, pool.size(), s, double(bytes) * *repeat / s / 1e6);
  });
}

}  // namespace tern::cli
