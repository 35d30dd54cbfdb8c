// tern run: chat in the terminal through the model's chat template.
//
//   tern run [-m DIR | --demo] [--system S] [--show-thinking] [--no-think] [sampling flags]
//
// Answers stream as they are generated; the thinking part is hidden (a "thinking..." note) or, with
// --show-thinking, shown dimmed. Commands: /reset (new conversation), /system TEXT (set the system message and
// reset), /exit. Ctrl-C stops the answer, not the program; Ctrl-D or /exit quits. After each answer: tok/s on stderr.
// The session keeps the conversation's state between turns, so a turn only runs its new tokens.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/backend_select.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "core/check.h"
#include "engine/generator.h"
#include "text/chat_template.h"
#include "text/stop_matcher.h"
#include "text/tokenizer.h"

namespace tern::cli {
namespace {

std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) { g_interrupted.store(true); }

struct RunArgs {
  ModelFlags model;
  SamplingFlags sampling;
  std::string system;
  bool show_thinking = false, no_think = false;
  int64_t max_tokens = -1;
};

// Splits the streamed answer into thinking (before </think>) and the answer, and prints each its way.
class AnswerPrinter {
 public:
  AnswerPrinter(bool thinking_open, bool show_thinking, bool tty)
      : in_thinking_(thinking_open), show_(show_thinking), tty_(tty), think_end_({"</think>"}) {}

  void push(const std::string& text) {
    if (!in_thinking_) {
      answer(text);
      return;
    }
    pending_ += text;
    StopMatcher::Result r = think_end_.push(text);
    thinking(r.text);
    if (r.stopped) {  // the answer starts after the first </think>; the matcher drops that part, take it from pending_
      end_thinking();
      answer(pending_.substr(pending_.find("</think>") + 8));
      pending_.clear();
    }
  }

  void finish() {
    if (in_thinking_) {
      thinking(think_end_.flush());
      end_thinking();
    }
    std::fputs("\n", stdout);
    std::fflush(stdout);
  }

  const std::string& answer_text() const { return answer_; }
  const std::string& thinking_text() const { return thinking_; }

 private:
  void thinking(const std::string& t) {
    if (t.empty()) return;
    thinking_ += t;
    if (show_) {
      if (!dim_on_ && tty_) std::fputs("\x1b[2m", stdout);
      dim_on_ = true;
      std::fwrite(t.data(), 1, t.size(), stdout);
    } else if (!noted_) {
      std::fputs(tty_ ? "\x1b[2mthinking...\x1b[0m" : "thinking...", stdout);
      noted_ = true;
    }
    std::fflush(stdout);
  }
  void end_thinking() {
    in_thinking_ = false;
    if (dim_on_ && tty_) std::fputs("\x1b[0m", stdout);
    if (noted_ || dim_on_) std::fputs("\n", stdout);
    dim_on_ = false;
  }
  void answer(std::string t) {
    if (answer_.empty()) t.erase(0, std::min(t.size(), t.find_first_not_of('\n')));  // the "\n\n" after </think>
    if (t.empty()) return;
    answer_ += t;
    std::fwrite(t.data(), 1, t.size(), stdout);
    std::fflush(stdout);
  }
  bool in_thinking_, show_, tty_;
  StopMatcher think_end_;
  std::string pending_;  // raw text since thinking began (until </think>)
  std::string thinking_, answer_;
  bool dim_on_ = false, noted_ = false;
};

void run_chat(const RunArgs& a) {
  const ModelSource src = model_flags_open(a.model);
  TERN_CHECK(src.chat_template, "the model folder has no chat template (chat_template.jinja or tokenizer_config.json); "
                                "use tern generate for raw prompts");
  auto runner = runner_create(src.weights, a.model.device);
  const int64_t max_ctx = runner->config().max_position_embeddings;
  const int64_t ctx = a.model.ctx_size > 0 ? a.model.ctx_size : std::min<int64_t>(max_ctx, 16384);
  TERN_CHECK(ctx <= max_ctx, "--ctx-size ", ctx, " exceeds the model's ", max_ctx, " positions");
  auto session = runner->create_session(ctx);
  Generator gen(*runner, *src.tokenizer);
  SamplingParams sampling = sampling_flags_apply(a.sampling, src.defaults);

  const bool tty_in = isatty(STDIN_FILENO), tty_out = isatty(STDOUT_FILENO);
  struct sigaction sa = {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: Ctrl-C at the prompt interrupts the read
  sigaction(SIGINT, &sa, nullptr);

  std::string system = a.system;
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  std::vector<int32_t> held;  // the tokens the session holds
  if (src.demo)
    std::fprintf(stderr, "tern: this is the demo model: its weights are random, so it answers with noise.\n");
  std::fprintf(stderr, "tern: type a message; /reset, /system TEXT, /exit. Ctrl-C stops an answer.\n");

  for (;;) {
    if (tty_in) {
      std::fputs(tty_out ? "\x1b[1m> \x1b[0m" : "> ", stdout);
      std::fflush(stdout);
    }
    std::string line;
    g_interrupted = false;
    if (!std::getline(std::cin, line)) {
      if (g_interrupted && !std::cin.eof()) {  // Ctrl-C at the prompt: a fresh prompt
        std::cin.clear();
        std::fputs("\n(/exit or Ctrl-D quits)\n", stdout);
        continue;
      }
      break;  // end of input
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      messages = nlohmann::ordered_json::array();
      std::fputs("(new conversation)\n", stdout);
      continue;
    }
    if (line.rfind("/system", 0) == 0 && (line.size() == 7 || line[7] == ' ')) {
      system = line.size() > 8 ? line.substr(8) : "";
      messages = nlohmann::ordered_json::array();
      std::fputs(system.empty() ? "(system message cleared; new conversation)\n"
                                : "(system message set; new conversation)\n",
                 stdout);
      continue;
    }
    if (line[0] == '/' && line.find(' ') == std::string::npos) {
      std::fprintf(stdout, "unknown command %s: /reset, /system TEXT, /exit\n", line.c_str());
      continue;
    }

    messages.push_back({{"role", "user"}, {"content", line}});
    ChatTemplateInputs in;
    in.messages = nlohmann::ordered_json::array();
    if (!system.empty()) in.messages.push_back({{"role", "system"}, {"content", system}});
    for (const auto& m : messages) in.messages.push_back(m);
    if (a.no_think) in.extra_kwargs = {{"enable_thinking", false}};
    const std::string prompt_text = src.chat_template->render(in);
    GenerationRequest req;
    req.prompt = src.tokenizer->encode(prompt_text);
    req.sampling = sampling;
    req.max_tokens = a.max_tokens;
    req.cancel = &g_interrupted;
    // Reuse the session when it holds a prefix of this prompt; otherwise start over.
    const bool prefix = held.size() < req.prompt.size() && std::equal(held.begin(), held.end(), req.prompt.begin());
    if (!prefix) session->reset();
    if (int64_t(req.prompt.size()) >= ctx) {
      std::fprintf(stderr, "tern: the conversation (%zu tokens) no longer fits the context of %lld tokens; /reset "
                           "starts a new one\n", req.prompt.size(), (long long)ctx);
      messages.erase(messages.end() - 1);
      continue;
    }

    const size_t open = prompt_text.rfind("<think>"), close = prompt_text.rfind("</think>");
    const bool thinking_open = open != std::string::npos && (close == std::string::npos || close < open);
    AnswerPrinter printer(thinking_open, a.show_thinking, tty_out);
    GenerationResult r;
    try {
      r = gen.generate(*session, req, [&](const TokenEvent& e) {
        printer.push(e.text);
        return true;
      });
    } catch (const Error& e) {
      session->reset();
      held.clear();
      messages.erase(messages.end() - 1);
      std::fprintf(stderr, "\ntern: error: %s\n", e.what());
      continue;
    }
    printer.finish();
    held = req.prompt;
    if (!r.tokens.empty()) held.insert(held.end(), r.tokens.begin(), r.tokens.end() - 1);
    nlohmann::ordered_json reply = {{"role", "assistant"}, {"content", printer.answer_text()}};
    if (!printer.thinking_text().empty()) reply["reasoning_content"] = printer.thinking_text();
    messages.push_back(reply);
    std::fprintf(stderr, "%s[%lld tokens, %.1f tok/s; prompt %lld tokens (%lld reused), %.1f tok/s%s]%s\n",
                 tty_out ? "\x1b[2m" : "", (long long)r.completion_tokens, r.decode_tok_s(),
                 (long long)r.prompt_tokens, (long long)r.cached_tokens, r.prefill_tok_s(),
                 r.finish == FinishReason::cancelled ? "; stopped"
                 : r.finish == FinishReason::length  ? "; max tokens"
                 : r.finish == FinishReason::context ? "; context full"
                                                     : "",
                 tty_out ? "\x1b[0m" : "");
  }
}

}  // namespace

void command_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  auto* sub = app.add_subcommand("run", "Chat in the terminal");
  model_flags_add(sub, a->model);
  sampling_flags_add(sub, a->sampling);
  sub->add_option("--system", a->system, "System message");
  sub->add_flag("--show-thinking", a->show_thinking, "Show the model's thinking, dimmed (default: hidden)");
  sub->add_flag("--no-think", a->no_think, "Chat template with enable_thinking=false");
  sub->add_option("-n,--max-tokens", a->max_tokens, "Tokens per answer at most (default: until the model stops)");
  sub->callback([a] { run_chat(*a); });
}

}  // namespace tern::cli
