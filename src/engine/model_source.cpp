#include "engine/model_source.h"

#include <zstd.h>

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
  src.name = o.name.empty() ? kDemoModelName : o.name;
  src.demo = true;
  const Config& c = src.weights->config;
  src.banner = detail::concat("demo model '", src.name, "': Qwen3.6's architecture at a small size (", c.num_hidden_layers,
                              " layers, D=", c.hidden_size, ", ", c.num_experts,
                              " experts) with RANDOM weights, so its output is meaningless; load a real model with -m DIR");
  return src;
}

}  // namespace

std::shared_ptr<const Tokenizer> demo_tokenizer() {
  static const std::shared_ptr<const Tokenizer> tok = std::make_shared<const Tokenizer>(
      Tokenizer::from_json_text(zstd_decompress(demo_asset_tokenizer_zst(), "the embedded demo tokenizer")));
  return tok;
}

std::string demo_chat_template_source() { return std::string(demo_asset_chat_template()); }

ModelSource model_source_open(const ModelSourceOptions& o) {
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
  std::string name = std::filesystem::absolute(dir).lexically_normal().filename().string();
  if (name.empty()) name = std::filesystem::absolute(dir).lexically_normal().parent_path().filename().string();
  src.name = o.name.empty() ? name : o.name;
  const Config& c = src.weights->config;
  src.banner = detail::concat("model '", src.name, "' from ", o.model_dir, " (", src.weights->source_layout, ", ",
                              c.num_hidden_layers, " layers, ", src.weights->total_bytes() / (1 << 20), " MiB of weights)");
  return src;
}

}  // namespace tern
