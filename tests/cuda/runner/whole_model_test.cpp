// The whole CUDA forward pass against transformers' fp32 logits on the same dequantised weights, written by
// tests/oracles/gpu_reference.py into TERN_GPU_REF_DIR (scripts/gpu-check runs it for several models: weights at
// trained scales, whose router logits have near-ties, and the easy N(0, 1) router; 64, 640 and 4K positions):
//   DIR/model (MLX 4-bit checkpoint), DIR/tokens.bin (int32 [n]), DIR/logits.bin (float32 [n, V]).
// Each plan is held to the fidelity targets: prefill, one token per call (the decode plan) and 8 tokens per call
// (the multi-token step of batching and speculation). ErrorByLayerAgainstCpu breaks the error down per layer
// against the CPU runner (the exact reference) on the same model.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>

#include "../cuda_test_util.h"
#include "core/check.h"
#include "core/npy.h"
#include "cpu/cpu_runner.h"
#include "cpu/ops_matmul.h"
#include "cpu/ops_moe.h"
#include "cpu/ops_norm.h"
#include "cuda/runner/cuda_runner.h"
#include "fidelity_util.h"
#include "model/checkpoint.h"

namespace tern::cuda::test {
namespace {

// The targets (issue 29's milestone): mean KL ≤ 0.002 nats on every plan; over ≥ 192 positions also perplexity
// within 0.1% and top-1 agreement ≥ 98%. TERN_REF_MAX_KL loosens the KL bound for a run that measures a switch.
double max_kl() {
  const char* e = std::getenv("TERN_REF_MAX_KL");
  return e ? std::atof(e) : 0.002;
}
constexpr double kMaxPplRel = 0.001, kMinTop1 = 0.98;
constexpr int64_t kLongRun = 192;

struct Reference {
  std::shared_ptr<ModelWeights> weights;
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  int64_t V = 0, real = 0, n = 0;
};

// nullopt (the test skips) without TERN_GPU_REF_DIR.
std::optional<Reference> load_reference() {
  const char* dir = std::getenv("TERN_GPU_REF_DIR");
  if (!dir) return std::nullopt;
  const std::string d = dir;
  Reference r;
  LoadOptions quiet;
  quiet.progress = false;
  r.weights = std::make_shared<ModelWeights>(model_load(d + "/model", quiet));
  r.V = r.weights->config.vocab_size;
  r.real = r.weights->vocab_real > 0 ? r.weights->vocab_real : r.V;
  std::ifstream tf(d + "/tokens.bin", std::ios::binary | std::ios::ate);
  TERN_CHECK(tf.good(), d, "/tokens.bin cannot be read");
  r.n = int64_t(tf.tellg()) / 4;
  r.tokens.resize(size_t(r.n));
  tf.seekg(0);
  tf.read(reinterpret_cast<char*>(r.tokens.data()), r.n * 4);
  r.logits.resize(size_t(r.n * r.V));
  std::ifstream lf(d + "/logits.bin", std::ios::binary);
  lf.read(reinterpret_cast<char*>(r.logits.data()), int64_t(r.logits.size()) * 4);
  TERN_CHECK(lf.good(), d, "/logits.bin holds fewer than ", r.n, " x ", r.V, " floats");
  return r;
}

// Where the KL sits: a few positions (flipped expert choices, near-tie top-1s) or everywhere (a rounding).
void print_worst(const std::string& what, const Fidelity& f) {
  std::printf("[cuda vs transformers] %s: the worst 1%% of positions carry %.0f%% of the KL; worst:", what.c_str(),
              100.0 * f.worst_share);
  for (const PositionFidelity& w : f.worst)
    std::printf(" %lld (KL %.3g, top-1 %s, reference margin %.3g)", static_cast<long long>(w.position), w.kl,
                w.same_top1 ? "same" : "differs", w.ref_margin);
  std::printf("\n");
}

// Prints one plan's figures and holds them to the targets.
void check_plan(const char* plan, const Reference& r, const std::vector<float>& got) {
  const Fidelity f = compare_logits(r.logits, got, r.tokens, r.V, r.real);
  std::printf("[cuda vs transformers] %s, %lld positions: ppl %.6f vs %.6f (%+.4f%%), mean KL %.3g nats (median %.3g), "
              "top-1 %.2f%%, max |dlogit| %.4g\n",
              plan, static_cast<long long>(r.n - 1), f.ppl, f.ppl_ref, 100.0 * (f.ppl / f.ppl_ref - 1.0), f.kl,
              f.median_kl, 100.0 * f.top1, f.max_abs);
  print_worst(plan, f);
  EXPECT_LE(f.kl, max_kl()) << plan;
  if (r.n >= kLongRun) {
    EXPECT_LE(std::fabs(f.ppl / f.ppl_ref - 1.0), kMaxPplRel) << plan;
    EXPECT_GE(f.top1, kMinTop1) << plan;
  }
}

// Logits of every position, fed `step` tokens per forward call (0: the whole sequence in one call).
std::vector<float> run_in_steps(ModelRunner& gpu, const Reference& r, int64_t step) {
  auto s = gpu.create_session(r.n + 8);
  if (step <= 0) {
    std::vector<float> all;
    gpu.forward(*s, r.tokens, true, all);
    return all;
  }
  std::vector<float> out(size_t(r.n * r.V)), part;
  for (int64_t i = 0; i < r.n; i += step) {
    const int64_t m = std::min(step, r.n - i);
    gpu.forward(*s, std::span(r.tokens).subspan(size_t(i), size_t(m)), true, part);
    std::copy(part.begin(), part.end(), out.begin() + i * r.V);
  }
  return out;
}

TEST(CudaWholeModel, PrefillMatchesTransformers) {
  TERN_REQUIRE_GPU();
  const auto r = load_reference();
  if (!r) GTEST_SKIP() << "TERN_GPU_REF_DIR not set (scripts/gpu-check sets it after running gpu_reference.py)";
  auto gpu = cuda_runner_create(r->weights, {.progress = false});
  check_plan("prefill", *r, run_in_steps(*gpu, *r, 0));
  // Shorter prompts, each its own prefill from an empty session: 1 token (the decode plan), 63, 64, 65 (one partial,
  // one whole and one whole plus one of the Gated DeltaNet's 64-token chunks), compared at their positions.
  for (int64_t p : {int64_t(1), int64_t(63), int64_t(64), int64_t(65)}) {
    if (p + 1 > r->n) continue;
    auto ps = gpu->create_session(p + 8);
    std::vector<float> pg;
    gpu->forward(*ps, std::span(r->tokens).first(size_t(p)), true, pg);
    const std::vector<int32_t> next(r->tokens.begin(), r->tokens.begin() + p + 1);
    const Fidelity fp = compare_logits(r->logits, pg, next, r->V, r->real);
    std::printf("[cuda vs transformers] %lld-token prompt: ppl %+.4f%%, mean KL %.3g nats, top-1 %.2f%%\n",
                static_cast<long long>(p), 100.0 * (fp.ppl / fp.ppl_ref - 1.0), fp.kl, 100.0 * fp.top1);
    print_worst(std::to_string(p) + "-token prompt", fp);
    EXPECT_LE(fp.kl, max_kl()) << p << "-token prompt";
  }
}

TEST(CudaWholeModel, DecodeMatchesTransformers) {
  TERN_REQUIRE_GPU();
  const auto r = load_reference();
  if (!r) GTEST_SKIP() << "TERN_GPU_REF_DIR not set";
  auto gpu = cuda_runner_create(r->weights, {.progress = false});
  check_plan("decode, 1 token per step", *r, run_in_steps(*gpu, *r, 1));
}

TEST(CudaWholeModel, MultiTokenStepsMatchTransformers) {
  TERN_REQUIRE_GPU();
  const auto r = load_reference();
  if (!r) GTEST_SKIP() << "TERN_GPU_REF_DIR not set";
  auto gpu = cuda_runner_create(r->weights, {.progress = false});
  check_plan("8 tokens per step", *r, run_in_steps(*gpu, *r, 8));
  check_plan("3 tokens per step", *r, run_in_steps(*gpu, *r, 3));
}

// ---- the error by layer, against the CPU runner ------------------------------------------------------------------

using Dumps = std::map<std::string, NpyArray>;

Dumps read_dumps(const std::filesystem::path& dir) {
  Dumps d;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".npy") d[e.path().stem().string()] = npy_read(e.path());
  return d;
}

// "layer_out.3": a per-layer dump's name.
std::string layer_tensor(const char* base, size_t layer) {
  std::string name(base);
  name += '.';
  name += std::to_string(layer);
  return name;
}

const std::vector<float>& tensor(const Dumps& d, const std::string& name) {
  const auto it = d.find(name);
  TERN_CHECK(it != d.end(), "activation dump ", name, " is missing");
  return it->second.f32;
}

bool same_experts(const float* a, const float* b, int k) {
  return std::multiset<float>(a, a + k) == std::multiset<float>(b, b + k);
}

// The experts the CPU's router picks from `hidden` (a residual [T, D]) and the gap between the 8th and 9th router
// logits of each token.
void route_from(const LayerWeights& l, const Config& c, const std::vector<float>& hidden, int64_t T,
                std::vector<float>& ids, std::vector<float>& gap) {
  const int64_t D = c.hidden_size;
  const int E = c.num_experts, k = c.num_experts_per_tok;
  std::vector<float> normed(size_t(T * D)), logits(size_t(T * E)), w(size_t(T * k));
  cpu::rms_norm(hidden.data(), l.post_attn_norm.data(), T, D, float(c.rms_norm_eps), normed.data());
  cpu::matmul(l.router, normed.data(), T, logits.data());
  std::vector<int32_t> id(size_t(T * k));
  cpu::moe_route({.logits = logits.data(), .T = T, .E = E, .k = k, .ids = id.data(), .weights = w.data()});
  ids.assign(id.begin(), id.end());
  gap.resize(size_t(T));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> row(logits.begin() + t * E, logits.begin() + (t + 1) * E);
    std::nth_element(row.begin(), row.begin() + k, row.end(), std::greater<float>());
    const float kth = *std::min_element(row.begin(), row.begin() + k);
    gap[size_t(t)] = kth - row[size_t(k)];
  }
}

// Per layer and per GPU plan: the residual's error after the mixer and after the MoE block (all positions, and the
// median position, which a flipped expert choice elsewhere does not move), and the tokens whose experts differ
// from the CPU's: because the GPU's router input differs (flips from the error upstream), or because the GPU's
// router arithmetic picks differently from the same input (held to near-ties: gap < 0.01).
TEST(CudaWholeModel, ErrorByLayerAgainstCpu) {
  TERN_REQUIRE_GPU();
  const auto r = load_reference();
  if (!r) GTEST_SKIP() << "TERN_GPU_REF_DIR not set";
  const char* pe = std::getenv("TERN_LAYER_POSITIONS");
  const int64_t P = std::min<int64_t>(r->n, pe ? std::atoll(pe) : 640);
  const Config& c = r->weights->config;
  const int64_t D = c.hidden_size;
  const int k = c.num_experts_per_tok;
  const std::vector<int32_t> tokens(r->tokens.begin(), r->tokens.begin() + P);
  const auto root = std::filesystem::temp_directory_path() / layer_tensor("tern-layers", fresh_seed("dump"));

  auto cpu = cpu_runner_create(r->weights);
  cpu->set_activation_dump_dir((root / "cpu").string());
  auto cs = cpu->create_session(P);
  std::vector<float> unused;
  cpu->forward(*cs, tokens, false, unused);
  const Dumps want = read_dumps(root / "cpu");

  auto gpu = cuda_runner_create(r->weights, {.progress = false});
  const std::pair<const char*, int64_t> plans[] = {{"prefill", 0}, {"decode", 1}, {"8-token steps", 8}};
  for (const auto& [plan, step] : plans) {
    const auto dir = root / layer_tensor("gpu", size_t(step));
    gpu->set_activation_dump_dir(dir.string());
    auto s = gpu->create_session(P + 8);
    for (int64_t i = 0; i < P; i += step > 0 ? step : P) {
      const int64_t m = step > 0 ? std::min(step, P - i) : P;
      gpu->forward(*s, std::span(tokens).subspan(size_t(i), size_t(m)), false, unused);
    }
    gpu->set_activation_dump_dir("");  // writes the dumps
    const Dumps got = read_dumps(dir);
    std::printf("[layer error, %s] %lld positions: layer, mixer, residual after mixer (all / median), after MoE, "
                "tokens with other experts than the CPU (from the input / from the router, near-ties of those)\n",
                plan, static_cast<long long>(P));
    for (size_t i = 0; i < r->weights->layers.size(); ++i) {
      std::vector<float> cpu_mix = tensor(want, layer_tensor("attn_out", i));
      // Names held in locals: a reference returned by tensor() from a temporary name reads as dangling to GCC 13+.
      const std::string before_name = i == 0 ? std::string("embed") : layer_tensor("layer_out", i - 1);
      const std::string ids_name = layer_tensor("route_ids", i);
      const std::vector<float>& before = tensor(want, before_name);
      for (size_t j = 0; j < cpu_mix.size(); ++j) cpu_mix[j] += before[j];
      const auto em = relative_error(tensor(got, layer_tensor("mixer_res", i)), cpu_mix, D);
      const auto eo =
          relative_error(tensor(got, layer_tensor("layer_out", i)), tensor(want, layer_tensor("layer_out", i)), D);
      std::vector<float> ids_in, gap;
      route_from(r->weights->layers[i], c, tensor(got, layer_tensor("mixer_res", i)), P, ids_in, gap);
      const std::vector<float>& cpu_ids = tensor(want, ids_name);
      const std::vector<float>& gpu_ids = tensor(got, ids_name);
      int from_input = 0, from_router = 0, router_near_tie = 0;
      float smallest_gap = INFINITY;  // of the tokens whose experts the GPU router chose otherwise
      for (int64_t t = 0; t < P; ++t) {
        from_input += !same_experts(cpu_ids.data() + t * k, ids_in.data() + t * k, k);
        if (!same_experts(ids_in.data() + t * k, gpu_ids.data() + t * k, k)) {
          ++from_router;
          router_near_tie += gap[size_t(t)] < 0.01f;
          smallest_gap = std::min(smallest_gap, gap[size_t(t)]);
        }
      }
      char gap_text[48] = "";
      if (from_router > 0) std::snprintf(gap_text, sizeof gap_text, ", the smallest gap %.2e", smallest_gap);
      std::printf("[layer error, %s] %2zu %-9s %.3e / %.3e  %.3e / %.3e  experts differ: %d / %d (%d near ties%s)\n",
                  plan, i, r->weights->layers[i].type == LayerType::full_attention ? "attention" : "deltanet", em.first,
                  em.second, eo.first, eo.second, from_input, from_router, router_near_tie, gap_text);
      EXPECT_EQ(from_router, router_near_tie) << plan << ", layer " << i
                                              << ": the GPU router picks other experts than the CPU's from the same "
                                                 "input away from a near-tie";
    }
  }
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace tern::cuda::test
