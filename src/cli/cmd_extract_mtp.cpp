// tern extract-mtp -m DIR -o FILE.safetensors: copies the MTP draft head (every mtp.* tensor, bytes as stored) of a
// checkpoint into one file, for `--draft-weights FILE` with a folder that lacks it (MLX conversions drop it). The
// file records the checkpoint's quantisation of those tensors (metadata "quantization", config.json's form).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/check.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"

namespace tern::cli {
namespace {

// The quantization section of `c` reduced to what the mtp.* modules need (empty when not quantised).
std::string mtp_quantization_json(const Config& c) {
  if (c.quant_default.bits == 0 && c.quant_overrides.empty()) return "";
  nlohmann::json q = {{"bits", c.quant_default.bits}, {"group_size", c.quant_default.group_size}, {"mode", "affine"}};
  for (const auto& [module, spec] : c.quant_overrides)
    if (module.rfind("mtp.", 0) == 0) q[module] = {{"bits", spec.bits}, {"group_size", spec.group_size}};
  return q.dump();
}

void extract_mtp(const std::string& dir, const std::string& out) {
  LoadOptions o;
  o.progress = false;
  const CheckpointSummary s = checkpoint_summary(dir, o);  // the head must plan: names, shapes, dtypes
  TERN_CHECK(!s.mtp.empty(), dir, " has no MTP draft head to extract: ", s.mtp_absent);
  const SafetensorsSet set(dir);
  std::vector<TensorOut> tensors;
  uint64_t bytes = 0;
  for (const std::string& name : set.names()) {
    if (name.rfind("mtp.", 0) != 0) continue;
    const TensorRef& t = *set.find(name);
    tensors.push_back(TensorOut{name, t.info->dtype, t.info->shape, {{t.data(), size_t(t.bytes())}}});
    bytes += t.bytes();
  }
  std::map<std::string, std::string> meta = {{"format", "tern-mtp"}, {"layout", s.layout}};
  if (const std::string q = mtp_quantization_json(s.config); !q.empty()) meta["quantization"] = q;
  safetensors_write(out, tensors, meta);
  std::fprintf(stderr, "tern extract-mtp: %zu mtp.* tensors (%.1f MB, %s layout) -> %s\n", tensors.size(),
               double(bytes) / 1e6, s.layout.c_str(), out.c_str());
}

}  // namespace

void command_extract_mtp(CLI::App& app) {
  struct Args {
    std::string model_dir, out;
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand("extract-mtp",
                                 "Copy a checkpoint's MTP draft head (mtp.*) into one file, for --draft-weights");
  sub->add_option("-m,--model", args->model_dir, "Checkpoint directory holding mtp.* (the HF BF16 one)")->required();
  sub->add_option("-o,--out", args->out, "Output .safetensors file")->required();
  sub->callback([args] { extract_mtp(args->model_dir, args->out); });
}

}  // namespace tern::cli
