// The one place the CLI and the server get a model from: a checkpoint folder (-m DIR) or the built-in demo model.
// Returns everything generation needs: weights, tokenizer, chat template and the sampling defaults.
//
//   ModelSource src = model_source_open({.model_dir = dir});   // or {.demo = true}, or {} (the demo)
//   auto runner = runner_create(src.weights, "auto");
//   Generator gen(*runner, *src.tokenizer);
#pragma once

#include <memory>
#include <string>

#include "engine/demo_model.h"
#include "engine/sampler.h"
#include "model/checkpoint.h"
#include "model/weights.h"

namespace tern {

class Tokenizer;
class ChatTemplate;

struct ModelSourceOptions {
  std::string model_dir;     // empty: the demo model
  bool demo = false;         // the demo model even when model_dir is given (an error then)
  std::string name;          // the model's name (/v1/models id); default: the folder's name, or the demo's name
  LoadOptions load;          // for model_dir
  DemoModelOptions demo_options;
};

struct ModelSource {
  std::shared_ptr<const ModelWeights> weights;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::shared_ptr<const ChatTemplate> chat_template;  // null when the folder has none (then --chat fails clearly)
  SamplingParams defaults;   // from generation_config.json
  std::string name;          // e.g. "Qwen3.6-35B-A3B-4bit", or kDemoModelName
  bool demo = false;
  std::string banner;        // one line describing what was loaded (the demo's says its weights are random)
};

inline constexpr const char* kDemoModelName = "tern-demo-random-weights";

// Throws tern::Error naming the folder or file on failure.
ModelSource model_source_open(const ModelSourceOptions& options);

// The demo's tokenizer (Qwen3's, embedded in the binary, zstd-compressed) and chat template source.
std::shared_ptr<const Tokenizer> demo_tokenizer();
std::string demo_chat_template_source();

}  // namespace tern
