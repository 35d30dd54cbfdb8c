// tern generate: one-shot generation for scripts.
//
//   tern generate [-m DIR | --demo] -p TEXT [--chat [--system S] [--no-think]] [-n 256] [sampling flags]
//   tern generate -m DIR --prompt-tokens 1,2,3 -n 64 --temperature 0 --print-ids     (ids in, ids out)
//   tern generate ... --json                                                           (one JSON object)
//   tern generate ... --json-schema schema.json | --json-object      (constrained: the output is one JSON value)
//
// Text streams to stdout as it is generated; a summary (token counts, tok/s, finish reason) goes to stderr.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/backend_select.h"
#include "cli/commands.h"
#include "cli/memory_flags.h"
#include "cli/model_flags.h"
#include "cli/speculative_flags.h"
#include "core/check.h"
#include "engine/generator.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tern::cli {
namespace {

struct GenerateArgs {
  ModelFlags model;
  SamplingFlags sampling;
  SpeculativeFlags speculative;
  std::string prompt, prompt_file, prompt_tokens, system;
  bool chat = false, no_think = false, ignore_eos = false, print_ids = false, json = false, quiet = false;
  int64_t max_tokens = 256;
  int top_logprobs = -1;
  std::vector<std::string> stop;
  std::string json_schema_file;  // --json-schema: constrain the output to this JSON Schema
  bool json_object = false;      // --json-object: constrain the output to a JSON object
  int64_t thinking_budget = -1;  // --thinking-budget (with --chat): reasoning tokens at most
};

// The output constraint of --json-schema / --json-object (null without them). A schema the compiler refuses is a
// usage error naming the keyword.
grammar::GrammarPtr build_grammar(const GenerateArgs& a) {
  TERN_CHECK(!(a.json_object && !a.json_schema_file.empty()), "--json-schema and --json-object are exclusive");
  if (a.json_object) return grammar::compile_json_object();
  if (a.json_schema_file.empty()) return nullptr;
  std::ifstream f(a.json_schema_file, std::ios::binary);
  TERN_CHECK(f.good(), "cannot open --json-schema ", a.json_schema_file);
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(f, nullptr, /*allow_exceptions=*/false);
  TERN_CHECK(!schema.is_discarded(), "--json-schema ", a.json_schema_file, " is not valid JSON");
  try {
    return grammar::compile_json_schema(schema);
  } catch (const grammar::SchemaError& e) {
    TERN_FAIL("--json-schema ", a.json_schema_file, ": ", e.what(), " (keyword '", e.keyword(), "')");
  }
}

// True when the rendered prompt ends inside an open <think> block (the chat template's thinking is on).
bool ends_in_reasoning(const std::string& text) {
  const size_t open = text.rfind("<think>"), close = text.rfind("</think>");
  return open != std::string::npos && (close == std::string::npos || close < open);
}

std::vector<int32_t> build_prompt(const GenerateArgs& a, const ModelSource& src, bool* in_reasoning) {
  const int given = int(!a.prompt.empty()) + int(!a.prompt_file.empty()) + int(!a.prompt_tokens.empty());
  TERN_USAGE_CHECK(given == 1, "give exactly one of -p/--prompt, --prompt-file and --prompt-tokens");
  if (!a.prompt_tokens.empty()) {
    TERN_USAGE_CHECK(!a.chat, "--chat applies the chat template to text; it cannot be used with --prompt-tokens");
    return token_list_parse(a.prompt_tokens, "--prompt-tokens");
  }
  std::string text = a.prompt;
  if (!a.prompt_file.empty()) {
    std::ifstream f(a.prompt_file, std::ios::binary);
    TERN_CHECK(f.good(), "cannot open --prompt-file ", a.prompt_file);
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  if (a.chat) {
    TERN_CHECK(src.chat_template, "--chat: the model folder has no chat template (chat_template.jinja or "
                                  "tokenizer_config.json)");
    ChatTemplateInputs in;
    in.messages = nlohmann::ordered_json::array();
    if (!a.system.empty()) in.messages.push_back({{"role", "system"}, {"content", a.system}});
    in.messages.push_back({{"role", "user"}, {"content", text}});
    if (a.no_think) in.extra_kwargs = {{"enable_thinking", false}};
    text = src.chat_template->render(in);
    *in_reasoning = ends_in_reasoning(text);
  } else {
    TERN_USAGE_CHECK(a.system.empty() && !a.no_think, "--system and --no-think need --chat");
  }
  return src.tokenizer->encode(text);
}

void run_generate(const GenerateArgs& a) {
  TERN_CHECK(a.max_tokens >= 0, "-n/--max-tokens must be >= 0, got ", a.max_tokens);
  TERN_USAGE_CHECK(!(a.json && a.print_ids), "--json and --print-ids are exclusive");
  TERN_USAGE_CHECK(a.thinking_budget < 0 || a.chat, "--thinking-budget needs --chat");
  const ModelSource src = model_flags_open(a.model, a.quiet);  // -q: only the answer, no banner
  GenerationRequest req;
  req.grammar = build_grammar(a);
  bool in_reasoning = false;
  req.prompt = build_prompt(a, src, &in_reasoning);
  if (req.grammar && in_reasoning) {  // the reasoning stays free
    req.grammar_start_after = "</think>";
    req.grammar_start_tokens = src.tokenizer->encode(req.grammar_start_after);
  }
  req.starts_in_reasoning = in_reasoning;
  if (a.thinking_budget >= 0) {
    req.thinking_budget = a.thinking_budget;
    req.reasoning_close_tokens = src.tokenizer->encode(kReasoningBudgetClose);
  }
  req.sampling = sampling_flags_apply(a.sampling, src.defaults);
  req.sampling.top_logprobs = a.top_logprobs;
  req.max_tokens = a.max_tokens;
  req.stop = a.stop;
  req.ignore_eos = a.ignore_eos;

  // One sequence of what the prompt and -n need (or --ctx-size); on a GPU checked against its memory first.
  const int64_t max_ctx = model_flags_config(src).max_position_embeddings;
  const int64_t ctx = a.model.ctx_size > 0 ? a.model.ctx_size
                                           : std::min<int64_t>(max_ctx, int64_t(req.prompt.size()) + a.max_tokens);
  TERN_USAGE_CHECK(ctx <= max_ctx, "--ctx-size ", ctx, " exceeds the model's ", max_ctx, " positions");
  MemoryPlanInput ask;
  ask.context = std::max<int64_t>(ctx, 1);
  ask.parallel = 1;
  ask.parallel_flag = "";  // not a flag of tern generate
  const std::unique_ptr<ModelRunner> runner =
      model_flags_runner_planned(a.model, src, ask, "tern generate", a.quiet, &a.speculative).runner;
  auto session = runner->create_session(ctx);
  GeneratorOptions gen_options;
  gen_options.speculative = speculative_flags_options(a.speculative, *runner, a.quiet);
  Generator gen(*runner, *src.tokenizer, gen_options);

  const bool stream_text = !a.json && !a.print_ids;
  nlohmann::ordered_json logprobs = nlohmann::ordered_json::array();
  const GenerationResult r = gen.generate(*session, req, [&](const TokenEvent& e) {
    if (stream_text && !e.text.empty()) {
      std::fwrite(e.text.data(), 1, e.text.size(), stdout);
      std::fflush(stdout);
    }
    if (e.has_logprobs && e.id >= 0) {
      nlohmann::ordered_json top = nlohmann::ordered_json::array();
      for (const TokenLogprob& t : e.top_logprobs) top.push_back({{"id", t.id}, {"logprob", t.logprob}});
      logprobs.push_back({{"id", e.id}, {"logprob", e.logprob}, {"top", top}});
    }
    return true;
  });

  if (a.json) {
    nlohmann::ordered_json out = {{"model", src.name},
                                  {"text", r.text},
                                  {"tokens", r.tokens},
                                  {"finish_reason", finish_reason_name(r.finish)},
                                  {"prompt_tokens", r.prompt_tokens},
                                  {"completion_tokens", r.completion_tokens},
                                  {"reasoning_tokens", r.reasoning_tokens},
                                  {"draft_tokens", r.draft_tokens},
                                  {"accepted_draft_tokens", r.accepted_draft_tokens},
                                  {"prefill_s", r.prefill_s},
                                  {"decode_s", r.decode_s},
                                  {"seed", r.seed},
                                  {"backend", runner->backend_name()}};
    if (!r.message.empty()) out["message"] = r.message;
    if (!r.stop_string.empty()) out["stop_string"] = r.stop_string;
    if (a.top_logprobs >= 0) out["logprobs"] = logprobs;
    std::string s = out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::printf("%s\n", s.c_str());
  } else if (a.print_ids) {
    for (size_t i = 0; i < r.tokens.size(); ++i) std::printf(i ? ",%d" : "%d", r.tokens[i]);
    std::printf("\n");
  } else {
    std::printf("\n");
  }
  std::fflush(stdout);
  if (!a.quiet) {
    std::fprintf(stderr, "tern generate: %lld prompt + %lld generated tokens on %s; prefill %.1f tok/s, decode %.2f "
                         "tok/s; finish: %s%s%s\n",
                 (long long)r.prompt_tokens, (long long)r.completion_tokens, runner->backend_name().c_str(),
                 r.prefill_tok_s(), r.decode_tok_s(), finish_reason_name(r.finish), r.message.empty() ? "" : " (",
                 r.message.empty() ? "" : (r.message + ")").c_str());
  }
}

}  // namespace

void command_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  auto* sub = app.add_subcommand("generate", "Generate text from a prompt (one shot, for scripts)");
  model_flags_add(sub, a->model);
  sub->add_option("-p,--prompt", a->prompt, "Prompt text");
  sub->add_option("--prompt-file", a->prompt_file, "Read the prompt text from a file");
  sub->add_option("--prompt-tokens,--tokens", a->prompt_tokens, "Prompt as token ids: 1,2,3");
  sub->add_flag("--chat", a->chat, "Apply the chat template to the prompt (a user message)");
  sub->add_option("--system", a->system, "System message (with --chat)");
  sub->add_flag("--no-think", a->no_think, "Chat template with enable_thinking=false (with --chat)");
  sub->add_option("--thinking-budget", a->thinking_budget,
                  "Reasoning tokens at most (with --chat and thinking on); then the model is told to answer")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("-n,--max-tokens", a->max_tokens, "Tokens to generate at most")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sampling_flags_add(sub, a->sampling);
  speculative_flags_add(sub, a->speculative);
  sub->add_option("--stop", a->stop, "Stop string (repeatable); never printed");
  sub->add_flag("--ignore-eos", a->ignore_eos, "Do not stop at the end-of-text ids");
  sub->add_option("--top-logprobs", a->top_logprobs, "With --json: log-probabilities and this many alternatives (0-20)")
      ->check(CLI::Range(0, 20));
  sub->add_flag("--print-ids", a->print_ids, "Print the generated token ids (comma separated) instead of text");
  sub->add_flag("--json", a->json, "Print one JSON object: text, tokens, finish_reason, counts, timings");
  sub->add_option("--json-schema", a->json_schema_file,
                  "Constrain the output to one JSON value valid for the JSON Schema in this file (after </think> "
                  "when thinking is on)");
  sub->add_flag("--json-object", a->json_object, "Constrain the output to one JSON object");
  sub->add_flag("-q,--quiet", a->quiet, "Only the answer: no model banner, load progress or summary on stderr");
  sub->callback([a] { run_generate(*a); });
}

}  // namespace tern::cli
