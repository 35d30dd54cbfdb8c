#include "engine/model_source.h"

#include <zstd.h>

#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "engine/demo_assets.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tern {

namespace {

std::string zstd_decompress(std::string_view in, const char* what) {
  const unsigned long long size = ZSTD_getFrameContentSize(in.data(), in.size());
  TERN_CHECK(size != ZSTD_CONTENTSIZE_ERROR && size != ZSTD_CONTENTSIZE_UNKNOWN && size < (1ull << 31), what,
             ": not a zstd frame with a known size");
  std::string out(size_t(size), '\0');
  const size_t got = ZSTD_decompress(out.data(), out.size(), in.data(), in.size());
  TERN_CHECK(!ZSTD_isError(got) && got == size, what, ": zstd: ", ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short");
  return out;
}

ModelSource open_demo(const ModelSourceOptions& o) {
  ModelSource src;
  src.tokenizer = demo_tokenizer();
  DemoModelOptions d = o.demo_options;
  d.vocab_real = src.tokenizer->vocab_size();
  src.weights = demo_model_build(d);
  src.chat_template = std::make_shared<const ChatTemplate>(ChatTemplate::from_source(demo_chat_template_source()));
  src.defaults = sampling_defaults(src.weights->config);
  src.name = model_source_name(o);
  src.demo = true;
  const Config& c = src.weights->config;
  src.banner = detail::concat("demo model '", src.name, "': Qwen3.6's architecture at a small size (", c.num_hidden_layers,
                              " layers, D=", c.hidden_size, ", ", c.num_experts,
                              " experts) with RANDOM weights, so its output is meaningless; load a real model with -m DIR");
  return src;
}

ModelSource open_synthetic(const ModelSourceOptions& o) {
  ModelSource src;
  src.tokenizer = demo_tokenizer();
  src.chat_template = std::make_shared<const ChatTemplate>(ChatTemplate::from_source(demo_chat_template_source()));
  src.synthetic = true;
  src.synthetic_config = config_parse(R"({"model_type": "qwen3_5_moe_text"})");  // the real model's defaults
  src.tokenizer->check_fits_embedding(src.synthetic_config.vocab_size);
  src.defaults = sampling_defaults(src.synthetic_config);
  src.name = model_source_name(o);
  const Config& c = src.synthetic_config;
  src.banner = detail::concat("synthetic model '", src.name, "': Qwen3.6-35B-A3B at full size (", c.num_hidden_layers,
                              " layers, ", c.num_experts, " experts, MLX 4-bit layout) with RANDOM weights generated on the "
                              "GPU and the demo's tokenizer and template: for speed checks, its output is meaningless");
  return src;
}

std::string read_small_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec) || std::filesystem::file_size(path, ec) > (1u << 20)) return "";
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool same_name(std::string a, std::string b) {
  auto lower = [](std::string& s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  };
  lower(a);
  lower(b);
  return a == b;
}

// "ORG/NAME" as Hugging Face spells repo ids (letters, digits, '-', '_', '.'; neither part starting with '.').
bool looks_like_repo_id(const std::string& s) {
  static const std::regex id(R"([A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9_-][A-Za-z0-9._-]*)");
  return s.size() <= 200 && std::regex_match(s, id);
}

}  // namespace

std::string model_id_from_folder(const std::filesystem::path& folder) {
  const std::filesystem::path dir = std::filesystem::absolute(folder).lexically_normal();
  std::string name = dir.filename().string();
  std::filesystem::path parent = dir.parent_path();
  if (name.empty()) {  // "dir/" normalizes to a trailing empty name
    name = parent.filename().string();
    parent = parent.parent_path();
  }
  // A hub cache snapshot: .../models--ORG--NAME/snapshots/HASH
  const std::string repo = parent.parent_path().filename().string();
  const std::string prefix = "models--";
  if (parent.filename() == "snapshots" && repo.rfind(prefix, 0) == 0) {
    const std::string rest = repo.substr(prefix.size());
    const size_t sep = rest.find("--");
    if (sep != std::string::npos) {
      const std::string id = rest.substr(0, sep) + "/" + rest.substr(sep + 2);
      if (looks_like_repo_id(id)) return id;
    }
  }
  // A name recorded in the folder, when its last part is the folder's name (a fine-tune saved elsewhere records
  // its base model instead: that is not this folder's id). config.json's _name_or_path (transformers), then a
  // README link to huggingface.co/ORG/NAME (the model cards of converted checkpoints, e.g. mlx-community's).
  auto matches_folder = [&](const std::string& id) {
    return looks_like_repo_id(id) && same_name(id.substr(id.find('/') + 1), name);
  };
  const nlohmann::json config = nlohmann::json::parse(read_small_file(dir / "config.json"), nullptr, false);
  if (config.is_object() && config.contains("_name_or_path") && config["_name_or_path"].is_string()) {
    const std::string id = config["_name_or_path"].get<std::string>();
    if (matches_folder(id)) return id;
  }
  const std::string readme = read_small_file(dir / "README.md");
  // Bounded repeats (hub names have at most 96 characters): libstdc++'s regex recurses once per matched character,
  // and an unbounded run of name characters in a README (up to 1 MiB) overflows the stack.
  static const std::regex link(R"(huggingface\.co/([A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9_-][A-Za-z0-9._-]{0,95}))");
  for (auto it = std::sregex_iterator(readme.begin(), readme.end(), link); it != std::sregex_iterator(); ++it) {
    const std::string id = (*it)[1].str();
    if (matches_folder(id)) return id;
  }
  return name;
}

std::shared_ptr<const Tokenizer> demo_tokenizer() {
  static const std::shared_ptr<const Tokenizer> tok = std::make_shared<const Tokenizer>(
      Tokenizer::from_json_text(zstd_decompress(demo_asset_tokenizer_zst(), "the embedded demo tokenizer")));
  return tok;
}

std::string demo_chat_template_source() { return std::string(demo_asset_chat_template()); }

std::string model_source_name(const ModelSourceOptions& o) {
  if (!o.name.empty()) return o.name;
  if (o.synthetic) return kSyntheticModelName;
  if (o.model_dir.empty()) return kDemoModelName;
  return model_id_from_folder(o.model_dir);
}

ModelSource model_source_open(const ModelSourceOptions& o) {
  if (o.synthetic) {
    TERN_CHECK(!o.demo && o.model_dir.empty(), "--synthetic cannot be combined with --demo or -m DIR; choose one");
    return open_synthetic(o);
  }
  if (o.model_dir.empty()) return open_demo(o);
  TERN_CHECK(!o.demo, "--demo and -m ", o.model_dir, " were both given; choose one");
  const std::filesystem::path dir(o.model_dir);
  TERN_CHECK(std::filesystem::is_directory(dir), "model folder ", o.model_dir, " does not exist or is not a folder");
  ModelSource src;
  src.tokenizer = std::make_shared<const Tokenizer>(Tokenizer::from_model_dir(dir));
  auto weights = std::make_shared<ModelWeights>(model_load(dir, o.load));
  src.tokenizer->check_fits_embedding(weights->config.vocab_size);
  if (weights->vocab_real <= 0 || weights->vocab_real > weights->config.vocab_size)
    weights->vocab_real = std::min<int64_t>(src.tokenizer->vocab_size(), weights->config.vocab_size);
  src.weights = weights;
  try {
    src.chat_template = std::make_shared<const ChatTemplate>(ChatTemplate::from_model_dir(dir));
  } catch (const Error&) {
    src.chat_template = nullptr;  // raw prompts still work; --chat reports the missing template
  }
  src.defaults = sampling_defaults(src.weights->config);
  src.name = model_source_name(o);
  const Config& c = src.weights->config;
  src.banner = detail::concat("model '", src.name, "' from ", o.model_dir, " (", src.weights->source_layout, ", ",
                              c.num_hidden_layers, " layers, ", src.weights->total_bytes() / (1 << 20), " MiB of weights)");
  return src;
}

}  // namespace tern
