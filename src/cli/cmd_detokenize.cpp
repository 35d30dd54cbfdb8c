// tern detokenize -m DIR: a JSON array of ids (stdin or --file) -> the text on stdout.
// --skip-special drops special tokens; --stream prints the StreamingDetokenizer's pieces, one per id plus the
// final flush, as a JSON array of strings; --lines reads one JSON array per line and prints one JSON string each.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/check.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace tern::cli {

Tokenizer load_tokenizer_arg(const std::string& path);  // cmd_tokenize.cpp

namespace {

std::vector<int32_t> parse_ids(const std::string& text, size_t line) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    TERN_FAIL("input ", line ? "line " + std::to_string(line) + " " : std::string(), "is not a JSON array of ids");
  }
  TERN_CHECK(j.is_array(), "input is not a JSON array of ids");
  std::vector<int32_t> ids;
  for (const auto& v : j) {
    TERN_CHECK(v.is_number_integer(), "input has a non-integer id: ", v.dump());
    int64_t id = v.get<int64_t>();
    TERN_CHECK(id >= 0 && id <= INT32_MAX, "token id ", id, " is out of range");
    ids.push_back(int32_t(id));
  }
  return ids;
}

std::string json_string(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

void command_detokenize(CLI::App& app) {
  auto* sub = app.add_subcommand("detokenize", "Token ids (a JSON array) to text");
  auto model = std::make_shared<std::string>();
  auto file = std::make_shared<std::string>();
  auto skip = std::make_shared<bool>(false);
  auto stream = std::make_shared<bool>(false);
  auto lines = std::make_shared<bool>(false);
  sub->add_option("-m,--model", *model, "Model folder (its tokenizer.json) or a tokenizer.json(.zst) file")->required();
  sub->add_option("--file", *file, "Read the ids from this file instead of stdin");
  sub->add_flag("--skip-special", *skip, "Leave out special tokens");
  sub->add_flag("--stream", *stream, "Print the streamed pieces as a JSON array of strings");
  sub->add_flag("--lines", *lines, "One JSON array per input line; one JSON string per output line");
  sub->callback([=] {
    Tokenizer tok = load_tokenizer_arg(*model);
    std::string input;
    if (file->empty() || *file == "-") {
      input.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    } else {
      std::ifstream f(*file, std::ios::binary);
      TERN_CHECK(f, "cannot open ", *file);
      std::ostringstream ss;
      ss << f.rdbuf();
      input = ss.str();
    }
    std::string out;
    auto one = [&](const std::vector<int32_t>& ids, bool as_json) {
      if (*stream) {
        StreamingDetokenizer d(tok, *skip);
        nlohmann::json pieces = nlohmann::json::array();
        for (int32_t id : ids) pieces.push_back(d.push(id));
        pieces.push_back(d.flush());
        out += pieces.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        out += '\n';
      } else if (as_json) {
        out += json_string(tok.decode(ids, *skip));
        out += '\n';
      } else {
        out += tok.decode(ids, *skip);
      }
    };
    if (*lines) {
      size_t pos = 0, line = 1;
      while (pos < input.size()) {
        size_t e = input.find('\n', pos);
        if (e == std::string::npos) e = input.size();
        if (e > pos) one(parse_ids(input.substr(pos, e - pos), line), true);
        ++line;
        pos = e + 1;
      }
    } else {
      one(parse_ids(input, 0), false);
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
  });
}

}  // namespace tern::cli
