// The one place the CLI and the server get a model from: a checkpoint folder (-m DIR) or the built-in demo model.
// Returns everything generation needs: weights, tokenizer, chat template and the sampling defaults.
//
//   ModelSource src = model_source_open({.model_dir = dir});   // or {.demo = true}, or {} (the demo)
//   auto runner = runner_create(src.weights, "auto");
//   Generator gen(*runner, *src.tokenizer);
#pragma once

#include <filesystem>
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
  bool synthetic = false;    // full-size random weights that the CUDA runner generates (runner_create_synthetic)
  std::string name;          // the model's name (/v1/models id); default: model_id_from_folder, or the demo's name
  LoadOptions load;          // for model_dir
  DemoModelOptions demo_options;
};

struct ModelSource {
  std::shared_ptr<const ModelWeights> weights;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::shared_ptr<const ChatTemplate> chat_template;  // null when the folder has none (then --chat fails clearly)
  SamplingParams defaults;   // from generation_config.json
  std::string name;          // e.g. "mlx-community/Qwen3.6-35B-A3B-4bit", "Qwen3.6-35B-A3B-4bit", or kDemoModelName
  bool demo = false;
  // Synthetic: Qwen3.6-35B-A3B's full size with random weights that the runner generates on the GPU (weights is
  // null; the runner is made from synthetic_config), with the demo's tokenizer and chat template. For speed checks
  // of the whole product (server, CLI) without a download; the output is meaningless, as the demo's.
  bool synthetic = false;
  Config synthetic_config;
  std::string banner;        // one line describing what was loaded (the demo's says its weights are random)
  bool random_weights() const { return demo || synthetic; }
};

inline constexpr const char* kSyntheticModelName = "tern-synthetic-random-weights";

inline constexpr const char* kDemoModelName = "tern-demo-random-weights";

// Throws tern::Error naming the folder or file on failure.
ModelSource model_source_open(const ModelSourceOptions& options);

// The name model_source_open will give the model (ModelSource::name), found without loading anything: a server
// lists it while the model loads. Reads at most the folder's config.json and README.md.
std::string model_source_name(const ModelSourceOptions& options);

// The model's id for a folder: "ORG/NAME" for a Hugging Face hub cache snapshot (.../models--ORG--NAME/snapshots/
// HASH), or when the folder records that repo id (config.json's _name_or_path, or a huggingface.co/ORG/NAME link
// in README.md) and NAME is the folder's own name; otherwise the folder's name.
std::string model_id_from_folder(const std::filesystem::path& folder);

// The demo's tokenizer (Qwen3's, embedded in the binary, zstd-compressed) and chat template source.
std::shared_ptr<const Tokenizer> demo_tokenizer();
std::string demo_chat_template_source();

}  // namespace tern
