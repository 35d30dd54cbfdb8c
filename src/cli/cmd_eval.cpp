// tern eval: teacher-forced perplexity, mean KL divergence and top-1 agreement against reference logits
// (src/engine/eval_run.h). The reference comes from tests/oracles/reference_eval_logits.py (transformers on the
// same weights).
//
//   tern eval -m DIR --tokens-file tokens.npy --reference logits.npy [--json out.json] [--max-kl 0.005]
//             [--report report.tsv|report.json [--tie-margin 0.1]]   (per position; engine/eval_report.h)
//   tern eval -m DIR --text wiki.txt            (perplexity alone)
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/check.h"
#include "core/npy.h"
#include "cpu/cpu_runner.h"
#include "engine/demo_model.h"
#include "engine/eval_report.h"
#include "engine/eval_run.h"
#include "model/checkpoint.h"
#include "text/tokenizer.h"

#ifdef TERN_HAVE_CUDA
#include "cuda/runner/cuda_runner.h"
#endif

namespace tern::cli {

namespace {

struct EvalArgs {
  std::string model_dir;
  bool demo = false;
  std::string device = "auto";
  std::string dtype = "auto";
  std::string tokens_file, reference, text_file, tokenizer;
  int64_t context = 0, batch = 128;
  std::string json_path;
  std::string report_path;
  double tie_margin = kDefaultTieMargin;
  bool tie_margin_given = false;
  double max_kl = -1, max_ppl_rel = -1, min_top1 = -1;  // optional pass/fail bounds
};

void run_eval(const EvalArgs& a) {
  TERN_CHECK(int(!a.model_dir.empty()) + int(a.demo) == 1, "tern eval: give exactly one of -m DIR or --demo");
  TERN_CHECK(a.tokens_file.empty() != a.text_file.empty(), "tern eval: give exactly one of --tokens-file or --text");
  TERN_CHECK(a.reference.empty() || !a.tokens_file.empty(),
             "tern eval: --reference scores the tokens of --tokens-file (the reference script teacher-forces a token "
             "file)");
  TERN_CHECK(a.device == "auto" || a.device == "cpu" || a.device == "cuda", "--device '", a.device,
             "' is not auto, cpu or cuda");
  TERN_CHECK(!a.reference.empty() || (a.max_kl < 0 && a.min_top1 < 0 && a.max_ppl_rel < 0),
             "tern eval: --max-kl, --max-ppl-rel and --min-top1 need --reference");
  TERN_CHECK(!a.reference.empty() || a.report_path.empty(), "tern eval: --report needs --reference");
  TERN_CHECK(!a.tie_margin_given || !a.report_path.empty(), "tern eval: --tie-margin goes with --report");
  TERN_CHECK(std::isfinite(a.tie_margin) && a.tie_margin >= 0,
             "tern eval: --tie-margin must be a number >= 0 (nats), got ", a.tie_margin);
  if (!a.report_path.empty()) eval_report_check_path(a.report_path);

  std::shared_ptr<const ModelWeights> weights;
  if (a.demo) {
    weights = demo_model_build();
  } else {
    LoadOptions lo;
    lo.dtype = load_dtype_parse(a.dtype);
    weights = std::make_shared<const ModelWeights>(model_load(a.model_dir, lo));
  }

  std::vector<int32_t> tokens;
  if (!a.tokens_file.empty()) {
    tokens = eval_tokens_read(a.tokens_file);
  } else {
    TERN_CHECK(!a.tokenizer.empty() || !a.model_dir.empty(), "tern eval --text with --demo needs --tokenizer FILE");
    const Tokenizer tokenizer = a.tokenizer.empty()                        ? Tokenizer::from_model_dir(a.model_dir)
                                : std::filesystem::is_directory(a.tokenizer) ? Tokenizer::from_model_dir(a.tokenizer)
                                                                             : Tokenizer::from_file(a.tokenizer);
    std::ifstream in(a.text_file, std::ios::binary);
    TERN_CHECK(in.good(), "cannot open the text file ", a.text_file);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    tokens = tokenizer.encode(text);
    TERN_CHECK(tokens.size() >= 2, "the text file ", a.text_file, " gives ", tokens.size(),
               " token(s); perplexity needs at least 2");
  }

  NpyArray ref;
  ReferenceLogits reference;
  if (!a.reference.empty()) {
    ref = npy_read(a.reference);
    TERN_CHECK(ref.dtype == "<f4" && ref.shape.size() == 2, "reference logits ", a.reference,
               " must be a float32 [tokens, vocab] array; found dtype ", ref.dtype, " with ", ref.shape.size(),
               " dimension(s)");
    reference = {ref.f32.data(), ref.shape[0], ref.shape[1]};
  }

  std::string device = a.device;
  std::unique_ptr<ModelRunner> runner;
#ifdef TERN_HAVE_CUDA
  if (device == "auto") device = cuda_device_count() > 0 ? "cuda" : "cpu";
  if (device == "cuda") runner = cuda_runner_create(weights);
#else
  if (device == "auto") device = "cpu";
  TERN_CHECK(device != "cuda", "--device cuda: this tern was built without the CUDA backend (backends: ",
             compiled_backends(), ")");
#endif
  if (device == "cpu") runner = cpu_runner_create(weights);

  EvalOptions o;
  o.context = a.context;
  o.batch = a.batch;
  const int64_t total = int64_t(tokens.size());
  o.progress = [total](int64_t done, int64_t) {
    std::fprintf(stderr, "\reval: %lld / %lld tokens", (long long)done, (long long)total);
    if (done == total) std::fputc('\n', stderr);
  };
  std::vector<EvalPosition> positions;
  if (!a.report_path.empty()) o.positions = &positions;
  const EvalSummary s = eval_run(*runner, tokens, a.reference.empty() ? nullptr : &reference, o);
  std::printf("tern eval | backend %s | %lld tokens%s\n", runner->backend_name().c_str(), (long long)total,
              a.reference.empty() ? "" : (" | reference " + a.reference).c_str());
  std::fputs(eval_summary_text(s).c_str(), stdout);
  if (!a.report_path.empty()) {
    const EvalReportSummary r = eval_report_summarize(positions, a.tie_margin);
    std::fputs(eval_report_summary_text(r).c_str(), stdout);
    eval_report_write(a.report_path, s, r, positions);
    std::printf("report           %s\n", a.report_path.c_str());
  }
  std::fflush(stdout);
  if (!a.json_path.empty()) {
    std::ofstream out(a.json_path, std::ios::binary);
    TERN_CHECK(out.good(), "cannot write the JSON file ", a.json_path);
    out << eval_summary_json(s) << "\n";
    TERN_CHECK(out.good(), "writing the JSON file ", a.json_path, " failed");
  }
  if (a.max_kl >= 0)
    TERN_CHECK(s.kl_mean <= a.max_kl, "mean KL ", s.kl_mean, " nats exceeds --max-kl ", a.max_kl);
  if (a.max_ppl_rel >= 0)
    TERN_CHECK(std::abs(s.perplexity_rel_diff) <= a.max_ppl_rel, "perplexity differs from the reference by ",
               s.perplexity_rel_diff, " (relative), beyond --max-ppl-rel ", a.max_ppl_rel);
  if (a.min_top1 >= 0)
    TERN_CHECK(s.top1_agreement >= a.min_top1, "top-1 agreement ", s.top1_agreement, " is below --min-top1 ",
               a.min_top1);
}

}  // namespace

void command_eval(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  auto* sub = app.add_subcommand("eval", "Perplexity, KL divergence and top-1 agreement against reference logits");
  sub->add_option("-m,--model", args->model_dir, "Model folder (HF BF16 or MLX)");
  sub->add_flag("--demo", args->demo, "The built-in demo model (random weights)");
  sub->add_option("--device", args->device, "auto, cpu or cuda")->capture_default_str();
  sub->add_option("--dtype", args->dtype, "Weights of -m: auto, q4, bf16 or stored (see tern inspect)")->capture_default_str();
  sub->add_option("--tokens-file", args->tokens_file, "Token ids: .npy int32, or text (white space, commas)");
  sub->add_option("--reference", args->reference, "Reference logits .npy, float32 [tokens, vocab]");
  sub->add_option("--text", args->text_file, "A text file: perplexity alone");
  sub->add_option("--tokenizer", args->tokenizer, "tokenizer.json for --text (default: the model folder's)");
  sub->add_option("--context", args->context, "Tokens per window, each from a fresh session (0: one window)")
      ->capture_default_str();
  sub->add_option("--batch", args->batch, "Tokens per forward call")->capture_default_str();
  sub->add_option("--json", args->json_path, "Write the metrics as JSON to this file");
  sub->add_option("--report", args->report_path,
                  "With --reference: write per-position KL and every top-1 difference with both top-2 margins, "
                  "near-ties counted apart, KL quantiles; JSON if the name ends in .json, else a tab-separated table "
                  "(engine/eval_report.h)");
  auto* tie = sub->add_option("--tie-margin", args->tie_margin,
                              "With --report: a top-1 difference is a near-tie when the reference's log-prob of its "
                              "top-1 exceeds its log-prob of tern's top-1 by less than this, nats (tern chose the "
                              "reference's runner-up: its top-1 minus top-2 margin)")
                  ->capture_default_str();
  sub->add_option("--max-kl", args->max_kl, "Fail (exit 1) when the mean KL exceeds this (nats)");
  sub->add_option("--max-ppl-rel", args->max_ppl_rel, "Fail when |ppl/ref_ppl - 1| exceeds this");
  sub->add_option("--min-top1", args->min_top1, "Fail when top-1 agreement is below this fraction");
  sub->callback([args, tie] {
    args->tie_margin_given = tie->count() > 0;
    run_eval(*args);
  });
}

}  // namespace tern::cli
