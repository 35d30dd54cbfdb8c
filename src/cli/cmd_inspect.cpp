// tern inspect -m DIR: what a checkpoint holds (layout, config, tensors, skipped parts) and the memory the model
// takes once loaded. Reads only headers unless --dump-weights asks for a full load.
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "model/checkpoint.h"
#include "model/quantize.h"

namespace tern::cli {

namespace {

struct InspectArgs {
  std::string model_dir;
  std::string dtype = "auto";
  bool json = false;
  bool no_progress = false;
  std::string dump_weights;
  std::string draft_weights;
};

const char* layer_type_name(LayerType t) {
  return t == LayerType::full_attention ? "full_attention" : "linear_attention";
}

std::string gb(int64_t bytes) {
  char s[32];
  if (bytes < 1000000) std::snprintf(s, sizeof s, "%.1f KB", double(bytes) / 1e3);
  else if (bytes < 1000000000) std::snprintf(s, sizeof s, "%.2f MB", double(bytes) / 1e6);
  else std::snprintf(s, sizeof s, "%.2f GB", double(bytes) / 1e9);
  return s;
}

struct KindTotals {
  int64_t count = 0, bytes = 0;
  std::map<std::string, int64_t> formats;
};

nlohmann::json summary_json(const CheckpointSummary& s, const std::string& dtype) {
  using nlohmann::json;
  const Config& c = s.config;
  json skipped = json::object();
  for (const auto& [prefix, cb] : s.skipped) skipped[prefix] = {{"tensors", cb.first}, {"bytes", cb.second}};
  std::vector<int32_t> eos = c.eos_token_ids;
  std::sort(eos.begin(), eos.end());
  std::vector<std::string> types;
  for (LayerType t : c.layer_types) types.push_back(layer_type_name(t));
  json config = {
      {"hidden_size", c.hidden_size}, {"num_hidden_layers", c.num_hidden_layers}, {"layer_types", types},
      {"vocab_size", c.vocab_size}, {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads}, {"head_dim", c.head_dim}, {"rotary_dims", c.rotary_dims()},
      {"rope_theta", c.rope_theta}, {"linear_num_key_heads", c.linear_num_key_heads},
      {"linear_num_value_heads", c.linear_num_value_heads}, {"linear_key_head_dim", c.linear_key_head_dim},
      {"linear_value_head_dim", c.linear_value_head_dim}, {"linear_conv_kernel_dim", c.linear_conv_kernel_dim},
      {"num_experts", c.num_experts}, {"num_experts_per_tok", c.num_experts_per_tok},
      {"moe_intermediate_size", c.moe_intermediate_size},
      {"shared_expert_intermediate_size", c.shared_expert_intermediate_size}, {"rms_norm_eps", c.rms_norm_eps},
      {"tie_word_embeddings", c.tie_word_embeddings}, {"max_position_embeddings", c.max_position_embeddings},
      {"eos_token_ids", eos}, {"bos_token_id", c.bos_token_id ? json(*c.bos_token_id) : json(nullptr)}};
  std::map<std::string, KindTotals> kinds;
  for (const PlannedMatrix& m : s.matrices) {
    KindTotals& k = kinds[m.kind];
    ++k.count;
    k.bytes += m.bytes;
    ++k.formats[weight_format_name(m.format)];
  }
  json by_kind = json::object();
  for (const auto& [kind, k] : kinds) by_kind[kind] = {{"matrices", k.count}, {"bytes", k.bytes}, {"formats", k.formats}};
  int64_t mapped = 0;
  for (const PlannedMatrix& m : s.matrices)
    if (m.zero_copy) mapped += m.bytes;
  const int64_t kv_per_token = int64_t(c.num_full_attention_layers()) * 2 * c.num_key_value_heads * c.head_dim * 2;
  const int64_t gdn_state = int64_t(c.num_linear_attention_layers()) *
                            (int64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim * 4 +
                             (c.linear_conv_kernel_dim - 1) * c.conv_channels() * 4);
  return {
      {"source",
       {{"layout", s.layout}, {"key_prefix", s.naming}, {"experts", s.experts_form}, {"files", s.files},
        {"tensors", s.tensors}, {"bytes", s.source_bytes}, {"skipped", skipped},
        {"mtp", s.mtp.empty() ? json(nullptr) : json(s.mtp)},
        {"mtp_absent", s.mtp_absent.empty() ? json(nullptr) : json(s.mtp_absent)},
        {"vision", {{"loaded", s.vision}, {"tensors", s.vision_tensors}, {"bytes", s.vision_bytes}}}}},
      {"model",
       {{"model_type", "qwen3_5_moe"}, {"config", config}, {"vocab_real", s.vocab_real}, {"dtype", dtype},
        {"weights", {{"by_kind", by_kind}, {"vector_bytes", s.vector_bytes}, {"total_bytes", s.weight_bytes()}}},
        {"memory",
         {{"weights_bytes", s.weight_bytes()}, {"kv_cache_bytes_per_token", kv_per_token},
          {"gdn_state_bytes_per_sequence", gdn_state}}}}},
      {"load", {{"mapped_bytes", mapped}, {"heap_bytes", s.weight_bytes() - mapped}}},
  };
}

void print_text(const CheckpointSummary& s, const nlohmann::json& j, const std::string& dir) {
  const Config& c = s.config;
  std::printf("checkpoint   %s\n", dir.c_str());
  std::printf("layout       %s (keys %s*, experts %s)\n", s.layout.c_str(), s.naming.c_str(), s.experts_form.c_str());
  std::printf("files        %lld safetensors, %lld tensors, %s\n", (long long)s.files, (long long)s.tensors,
              gb(s.source_bytes).c_str());
  if (s.skipped.empty()) std::printf("skipped      none\n");
  for (const auto& [prefix, cb] : s.skipped)
    std::printf("skipped      %s* %lld tensors, %s\n", prefix.c_str(), (long long)cb.first, gb(cb.second).c_str());
  if (!s.mtp.empty()) std::printf("mtp head     from %s\n", s.mtp.c_str());
  else std::printf("mtp head     absent: %s\n", s.mtp_absent.c_str());
  if (s.vision)
    std::printf("vision       %lld tensors, %s (the image encoder, as stored)\n", (long long)s.vision_tensors,
                gb(s.vision_bytes).c_str());
  else
    std::printf("vision       none (text only: images are unavailable)\n");
  std::printf("model        %s: %d layers (%d linear attention + %d full attention), D=%lld, V=%lld (%lld ids used)\n",
              c.model_type.c_str(), c.num_hidden_layers, c.num_linear_attention_layers(),
              c.num_full_attention_layers(), (long long)c.hidden_size, (long long)c.vocab_size,
              (long long)s.vocab_real);
  std::printf("attention    Hq=%d Hkv=%d dh=%d rotary=%d theta=%g\n", c.num_attention_heads, c.num_key_value_heads,
              c.head_dim, c.rotary_dims(), c.rope_theta);
  std::printf("linear attn  Hk=%d Hv=%d dk=%d dv=%d conv=%d\n", c.linear_num_key_heads, c.linear_num_value_heads,
              c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim);
  std::printf("moe          E=%d k=%d F=%lld shared Fs=%lld\n", c.num_experts, c.num_experts_per_tok,
              (long long)c.moe_intermediate_size, (long long)c.shared_expert_intermediate_size);
  if (c.quant_default.bits)
    std::printf("quantised    %d-bit affine, group %d, %zu module overrides\n", c.quant_default.bits,
                c.quant_default.group_size, c.quant_overrides.size());
  std::printf("\nweights after load (--dtype %s):\n", j["model"]["dtype"].get<std::string>().c_str());
  std::printf("  %-18s %8s  %-34s %s\n", "kind", "matrices", "formats", "bytes");
  for (const auto& [kind, k] : j["model"]["weights"]["by_kind"].items()) {
    std::string formats;
    for (const auto& [f, n] : k["formats"].items()) formats += (formats.empty() ? "" : ", ") + f + " x" + n.dump();
    std::printf("  %-18s %8lld  %-34s %s\n", kind.c_str(), (long long)k["matrices"].get<int64_t>(), formats.c_str(),
                gb(k["bytes"].get<int64_t>()).c_str());
  }
  std::printf("  %-18s %8s  %-34s %s\n", "vectors (fp32)", "", "norms, conv, A_log, dt_bias",
              gb(s.vector_bytes).c_str());
  const auto& mem = j["model"]["memory"];
  std::printf("\nmemory       weights %s on CPU or GPU (%s mapped from the files, %s built at load)\n",
              gb(s.weight_bytes()).c_str(), gb(j["load"]["mapped_bytes"].get<int64_t>()).c_str(),
              gb(j["load"]["heap_bytes"].get<int64_t>()).c_str());
  std::printf("             + KV cache %lld bytes/token, GDN state %.1f MiB/sequence\n",
              (long long)mem["kv_cache_bytes_per_token"].get<int64_t>(),
              double(mem["gdn_state_bytes_per_sequence"].get<int64_t>()) / (1 << 20));
}

}  // namespace

void command_inspect(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  auto* sub = app.add_subcommand("inspect", "Describe a checkpoint: layout, config, tensors, memory");
  sub->add_option("-m,--model", args->model_dir, "Model directory (HF BF16 or MLX)")->required();
  sub->add_option("--dtype", args->dtype, "Weights after load: auto, q4 or bf16")->default_val("auto");
  sub->add_flag("--json", args->json, "Print the summary as JSON");
  sub->add_flag("--no-progress", args->no_progress, "No progress bar (with --dump-weights)");
  sub->add_option("--dump-weights", args->dump_weights, "Load and write the internal weights to a safetensors file")
      ->group("");
  sub->add_option("--draft-weights", args->draft_weights, "The MTP draft head from this file (tern extract-mtp)");
  sub->callback([args] {
    LoadOptions o;
    o.dtype = load_dtype_parse(args->dtype);
    o.draft_weights = args->draft_weights;
    o.progress = !args->no_progress;
    const CheckpointSummary s = checkpoint_summary(args->model_dir, o);
    const nlohmann::json j = summary_json(s, args->dtype);
    if (args->json) std::printf("%s\n", j.dump(2).c_str());
    else print_text(s, j, args->model_dir);
    if (!args->dump_weights.empty()) {
      const ModelWeights w = model_load(args->model_dir, o);
      weights_dump(w, args->dump_weights);
    }
  });
}

}  // namespace tern::cli
