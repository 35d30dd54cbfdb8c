// tern run: chat in the terminal through the model's chat template.
//
//   tern run [-m DIR | --demo] [--system S] [--show-thinking] [--no-think] [sampling flags]
//
// Answers stream as they are generated; the thinking part is hidden behind a live indicator (a spinner with its
// token count) or, with --show-thinking, shown dimmed. On a terminal the input has line editing and history
// (cli/line_editor.h), kept between sessions (cli/history_file.h; --history-file, --no-history), and may span
// lines (a trailing backslash, """ blocks, pasted text). Commands: /help, /clear
// (new conversation; /reset too), /system TEXT, /image PATH (attaches an image to the next message, for a model
// with a vision encoder), /history, /exit. Ctrl-C stops the answer, not the program; Ctrl-D
// or /exit quits. After each answer: tok/s on stderr. When stdin is not a terminal, each line is one message.
// The conversation's state is kept between turns in the server's prefix cache (engine/prefix_cache.h): a turn
// resumes from the latest snapshot its prompt shares, also when the template re-renders the earlier answers (their
// thinking dropped; a snapshot where each answer began covers that), so it only runs the new tokens. While a long
// prompt is read, stderr on a terminal shows how far the prefill is.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/backend_select.h"
#include "cli/commands.h"
#include "cli/history_file.h"
#include "cli/line_editor.h"
#include "cli/memory_flags.h"
#include "cli/model_flags.h"
#include "cli/speculative_flags.h"
#include "core/check.h"
#include "core/text_file.h"
#include "engine/generator.h"
#include "engine/image_prompt.h"
#include "engine/prefix_cache.h"
#include "server/serving/chat_prompt.h"
#include "server/serving/request_images.h"
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
  SpeculativeFlags speculative;
  std::string system;
  bool show_thinking = false, no_think = false, no_history = false;
  int64_t max_tokens = -1;
  int64_t thinking_budget = -1;
  std::string history_file = default_history_path();
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
    if (!at_line_start_) std::fputs("\n", stdout);  // no empty line when the answer never started
    std::fflush(stdout);
  }

  const std::string& answer_text() const { return answer_; }
  const std::string& thinking_text() const { return thinking_; }

 private:
  void thinking(const std::string& t) {
    if (t.empty()) return;
    thinking_ += t;
    ++thinking_pieces_;
    if (show_) {
      if (!dim_on_ && tty_) std::fputs("\x1b[2m", stdout);
      dim_on_ = true;
      std::fwrite(t.data(), 1, t.size(), stdout);
    } else if (tty_) {
      spin();
    } else if (!noted_) {
      std::fputs("thinking...", stdout);
      noted_ = true;
    }
    std::fflush(stdout);
  }
  // On a terminal, hidden thinking shows as one line redrawn in place: a spinner, the tokens so far, the seconds.
  void spin() {
    const auto now = std::chrono::steady_clock::now();
    if (!noted_) thinking_start_ = now;
    if (noted_ && now - last_spin_ < std::chrono::milliseconds(80)) return;
    static constexpr const char* kFrames[] = {"|", "/", "-", "\\"};
    last_spin_ = now;
    std::fprintf(stdout, "\r\x1b[2m%s thinking: %lld tokens, %.1f s (Ctrl-C stops)\x1b[0m\x1b[K", kFrames[frame_++ % 4],
                 (long long)thinking_pieces_, seconds_since(thinking_start_));
    noted_ = true;
  }
  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }
  void end_thinking() {
    in_thinking_ = false;
    if (dim_on_ && tty_) std::fputs("\x1b[0m", stdout);
    if (noted_ && tty_ && !show_) {  // the spinner's line becomes a summary
      std::fprintf(stdout, "\r\x1b[2mthought: %lld tokens, %.1f s\x1b[0m\x1b[K", (long long)thinking_pieces_,
                   seconds_since(thinking_start_));
    }
    if (noted_ || dim_on_) {
      std::fputs("\n", stdout);
      at_line_start_ = true;
    }
    dim_on_ = false;
  }
  void answer(std::string t) {
    if (answer_.empty()) t.erase(0, std::min(t.size(), t.find_first_not_of('\n')));  // the "\n\n" after </think>
    if (t.empty()) return;
    answer_ += t;
    at_line_start_ = false;
    std::fwrite(t.data(), 1, t.size(), stdout);
    std::fflush(stdout);
  }
  bool in_thinking_, show_, tty_;
  StopMatcher think_end_;
  std::string pending_;  // raw text since thinking began (until </think>)
  std::string thinking_, answer_;
  bool dim_on_ = false, noted_ = false, at_line_start_ = false;
  int64_t thinking_pieces_ = 0;  // streamed pieces of thinking: one per token, but for bytes held back mid-character
  unsigned frame_ = 0;
  std::chrono::steady_clock::time_point thinking_start_, last_spin_;
};

// "31000" -> "31,000".
std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? std::string("-").append(out) : out;
}

// While a long prompt is prefilled: "reading prompt 12,000 / 31,000 tokens" on stderr, redrawn in place, and gone
// once the prompt is in. Only on a terminal, and only for more than kMinTokens new tokens (a short one is quick).
class PrefillProgress {
 public:
  static constexpr int64_t kMinTokens = 2048;
  PrefillProgress(bool tty, int64_t cached, int64_t total) : on_(tty && total - cached > kMinTokens), total_(total) {
    update(cached);
  }
  ~PrefillProgress() { done(); }
  bool on() const { return on_; }
  // The session holds `position` tokens of the prompt.
  void update(int64_t position) {
    if (!on_) return;
    if (position >= total_) return done();
    std::fprintf(stderr, "\r\x1b[2mreading prompt %s / %s tokens (Ctrl-C stops)\x1b[0m\x1b[K",
                 with_commas(position).c_str(), with_commas(total_).c_str());
    std::fflush(stderr);
    shown_ = true;
  }
  void done() {
    if (!shown_) return;
    std::fputs("\r\x1b[K", stderr);
    std::fflush(stderr);
    shown_ = false;
  }

 private:
  bool on_, shown_ = false;
  int64_t total_;
};

const char* const kHelp =
    "Type a message and press Enter. A line ending in \\ goes on to the next line;\n"
    "\"\"\" opens a block that a line ending in \"\"\" closes; pasted text keeps its lines.\n"
    "Commands:\n"
    "  /help          this text\n"
    "  /clear         a new conversation (/reset does the same)\n"
    "  /system TEXT   set the system message; a new conversation (/system alone clears it)\n"
    "  /image PATH    attach an image (PNG, JPEG, WebP, GIF) to your next message\n"
    "  /history       show the conversation so far\n"
    "  /exit          quit (/quit, or Ctrl-D on an empty line)\n"
    "Keys: Left/Right, Home/End or Ctrl-A/E, Up/Down for earlier messages,\n"
    "  Ctrl-U/K/W delete to the start, to the end, the word before;\n"
    "  Ctrl-C clears the line, or stops an answer while one streams.\n";

// Where messages come from: the line editor on a terminal, plain lines otherwise (scripts pipe into tern run).
class MessageInput {
 public:
  // history_path: where the editor's history is kept between sessions (empty: only in memory).
  explicit MessageInput(const std::string& history_path)
      : tty_(isatty(STDIN_FILENO) && isatty(STDOUT_FILENO)), history_(history_path, LineEditor::kMaxHistory) {
    if (!tty_) return;
    editor_ = std::make_unique<LineEditor>(STDIN_FILENO, STDOUT_FILENO);
    for (const std::string& m : history_.load()) editor_->add_history(m);
  }
  bool tty() const { return tty_; }

  // The next message; nullopt at the end of input. Ctrl-C at the prompt gives an empty message.
  std::optional<std::string> next() {
    if (editor_) {
      LineEditor::Result r = editor_->read("> ", ". ");
      if (r.status == LineEditor::Status::end_of_input) return std::nullopt;
      if (r.status == LineEditor::Status::message && editor_->add_history(r.text)) history_.append(r.text);
      return r.text;
    }
    std::string line;
    g_interrupted = false;
    if (!std::getline(std::cin, line)) {
      if (g_interrupted && !std::cin.eof()) {  // Ctrl-C at a prompt without the editor: a fresh prompt
        std::cin.clear();
        std::fputs("\n(/exit or Ctrl-D quits)\n", stdout);
        return std::string();
      }
      return std::nullopt;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return line;
  }

  // While an answer streams, typing is not echoed into it (see LineEditor::quiet_input).
  void answering(bool on) {
    if (editor_) editor_->quiet_input(on);
  }

 private:
  bool tty_;
  HistoryFile history_;
  std::unique_ptr<LineEditor> editor_;
};

// The conversation: the system message, the messages (a user message with images holds them as {"type": "image"}
// parts before its text), the images in the order the template meets them, and those attached to the next message.
struct Conversation {
  std::string system;
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  std::vector<PromptImage> images;   // offsets are set for each turn's prompt
  std::vector<PromptImage> pending;  // /image: for the next message
  void clear() {
    messages = nlohmann::ordered_json::array();
    images.clear();
    pending.clear();
  }
};

// Prints the conversation so far: each message's role and text (thinking left out; an image as [image]).
void print_history(const Conversation& c) {
  if (!c.system.empty()) std::printf("[system] %s\n", c.system.c_str());
  if (c.messages.empty()) std::puts("(no messages yet)");
  for (const auto& m : c.messages) {
    std::string text;
    if (m["content"].is_string()) {
      text = m["content"].get<std::string>();
    } else {
      for (const auto& part : m["content"])
        text += part["type"] == "image" ? "[image] " : part["text"].get<std::string>();
    }
    std::printf("[%s] %s\n", m["role"].get<std::string>().c_str(), text.c_str());
  }
  if (!c.pending.empty()) std::printf("(%zu image(s) attached to the next message)\n", c.pending.size());
}

// /image PATH: the file decoded and processed now (a bad one is told here), kept for the next message.
void attach_image(const std::string& path, const ImageSettings& settings, Conversation& c) {
  if (!settings.unavailable.empty()) {
    std::printf("cannot attach an image: %s\n", settings.unavailable.c_str());
    return;
  }
  try {
    constexpr uintmax_t kMaxFileBytes = uintmax_t(256) << 20;  // an image file's compressed bytes, at most
    std::error_code ec;
    TERN_CHECK(std::filesystem::is_regular_file(path, ec), path, ": no such file");
    TERN_CHECK(std::filesystem::file_size(path, ec) <= kMaxFileBytes, path, ": the file is over 256 MiB");
    const std::string bytes = read_text_file(path);
    const PreparedImage image =
        image_prompt_decode({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, settings, path);
    c.pending.push_back(image_prompt_process(image, 0, settings));
    std::printf("(image attached to your next message: %s, %dx%d, %lld tokens)\n", path.c_str(), image.image.width,
                image.image.height, (long long)image.tokens);
  } catch (const Error& e) {
    std::printf("cannot attach the image: %s\n", e.what());
  }
}

// The slash commands. Returns true when `line` was one (handled here); sets `quit` for /exit.
bool run_command(const std::string& line, Conversation& c, const ImageSettings& images, bool& quit) {
  if (line.empty() || line[0] != '/' || line.find('\n') != std::string::npos) return false;
  const std::string name = line.substr(0, line.find(' '));
  if (name == "/exit" || name == "/quit") {
    quit = true;
  } else if (name == "/help") {
    std::fputs(kHelp, stdout);
  } else if (name == "/clear" || name == "/reset") {
    c.clear();
    std::fputs("(new conversation)\n", stdout);
  } else if (name == "/system") {
    c.system = line.size() > 8 ? line.substr(8) : "";
    c.clear();
    std::fputs(c.system.empty() ? "(system message cleared; new conversation)\n"
                                : "(system message set; new conversation)\n",
               stdout);
  } else if (name == "/image") {
    const size_t at = line.find_first_not_of(' ', name.size());
    if (at == std::string::npos) std::fputs("/image PATH attaches the image at PATH to your next message\n", stdout);
    else attach_image(line.substr(at), images, c);
  } else if (name == "/history") {
    print_history(c);
  } else if (line.find(' ') == std::string::npos) {
    std::fprintf(stdout, "unknown command %s: /help lists the commands\n", line.c_str());
  } else {
    return false;  // "/path/to something": a message that starts with a slash
  }
  std::fflush(stdout);
  return true;
}

void run_chat(const RunArgs& a) {
  const ModelSource src = model_flags_open(a.model);
  TERN_CHECK(src.chat_template, "the model folder has no chat template (chat_template.jinja or tokenizer_config.json); "
                                "use tern generate for raw prompts");
  const int64_t max_ctx = model_flags_config(src).max_position_embeddings;
  TERN_USAGE_CHECK(a.model.ctx_size <= max_ctx, "--ctx-size ", a.model.ctx_size, " exceeds the model's ", max_ctx,
                   " positions");  // exit 2
  // One conversation at a time: one slot (one session, as before the cache); snapshots in 1 GiB of device memory
  // (RAM on the CPU backend; on a GPU less when its memory is short), then 4 GiB of host memory. Those of the latest
  // turns are the ones reused.
  PrefixCacheOptions cache_options;
  cache_options.slots = 1;
  cache_options.gpu_bytes = int64_t(1024) << 20;
  cache_options.host_bytes = int64_t(4096) << 20;
  // On a GPU the context is planned in its memory (as tern serve's, for one sequence), else the CPU's default.
  MemoryPlanInput ask;
  ask.context = a.model.ctx_size;
  ask.parallel = 1;
  ask.parallel_flag = "";  // not a flag of tern run
  ask.cache_slots = 1;
  ask.cache_slots_given = true;
  ask.snapshot_budget = cache_options.gpu_bytes;
  PlannedRunner planned = model_flags_runner_planned(a.model, src, ask, "tern run", false, &a.speculative);
  std::unique_ptr<ModelRunner> runner = std::move(planned.runner);
  int64_t ctx = 0;
  if (planned.plan) {
    ctx = planned.plan->context;
    cache_options.gpu_bytes = planned.plan->snapshot_budget;
  } else {
    ctx = cpu_context("tern run", a.model.ctx_size, max_ctx);
  }
  PrefixCache cache(*runner, ctx, cache_options);
  GeneratorOptions gen_options;
  gen_options.speculative = speculative_flags_options(a.speculative, *runner);
  Generator gen(*runner, *src.tokenizer, gen_options);
  SamplingParams sampling = sampling_flags_apply(a.sampling, src.defaults);
  const ImageSettings image_settings_ = model_flags_image_settings(a.model, src, *runner, planned.image_max_pixels);

  const bool tty_out = isatty(STDOUT_FILENO), tty_err = isatty(STDERR_FILENO);
  struct sigaction sa = {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: Ctrl-C at a plain prompt interrupts the read
  sigaction(SIGINT, &sa, nullptr);

  Conversation conv;
  conv.system = a.system;
  if (src.random_weights())
    std::fprintf(stderr, "tern: this is the %s model: its weights are random, so it answers with noise.\n",
                 src.demo ? "demo" : "synthetic");
  std::fprintf(stderr, "tern: type a message; /help lists the commands. Ctrl-C stops an answer, Ctrl-D quits.\n");
  MessageInput input(a.no_history ? std::string() : a.history_file);

  for (;;) {
    if (!input.tty() && isatty(STDIN_FILENO)) {  // a terminal for input but not for output: a plain prompt
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    const std::optional<std::string> next = input.next();
    if (!next) break;  // end of input
    const std::string& line = *next;
    if (line.find_first_not_of(" \t\n") == std::string::npos) continue;
    bool quit = false;
    if (run_command(line, conv, image_settings_, quit)) {
      if (quit) break;
      continue;
    }

    // The message, its attached images first (as Ollama places them); undone when the turn fails.
    server::MessageContent content;
    for (size_t i = 0; i < conv.pending.size(); ++i) content.add_image();
    content.add_text(line);
    conv.messages.push_back({{"role", "user"}, {"content", content.json()}});
    const size_t images_before = conv.images.size();
    conv.images.insert(conv.images.end(), conv.pending.begin(), conv.pending.end());
    conv.pending.clear();
    auto undo_message = [&] {
      conv.messages.erase(conv.messages.end() - 1);
      conv.images.resize(images_before);
    };
    ChatTemplateInputs in;
    in.messages = nlohmann::ordered_json::array();
    if (!conv.system.empty()) in.messages.push_back({{"role", "system"}, {"content", conv.system}});
    for (const auto& m : conv.messages) in.messages.push_back(m);
    if (a.no_think) in.extra_kwargs = {{"enable_thinking", false}};
    const std::string prompt_text = src.chat_template->render(in);
    GenerationRequest req;
    req.prompt = src.tokenizer->encode(prompt_text);
    if (!conv.images.empty()) {  // each image's one <|image_pad|> becomes its tokens
      std::vector<int64_t> counts;
      for (const PromptImage& im : conv.images) counts.push_back(im.tokens);
      try {
        const std::vector<int64_t> offsets = image_pads_expand(req.prompt, counts, image_settings_.image_token_id);
        for (size_t i = 0; i < conv.images.size(); ++i) conv.images[i].offset = offsets[i];
      } catch (const Error& e) {  // e.g. <|image_pad|> typed in a message
        std::fprintf(stderr, "tern: %s\n", e.what());
        undo_message();
        continue;
      }
      req.images = conv.images;
    }
    req.sampling = sampling;
    req.max_tokens = a.max_tokens;
    req.cancel = &g_interrupted;
    if (int64_t(req.prompt.size()) >= ctx) {
      std::fprintf(stderr, "tern: the conversation (%zu tokens) no longer fits the context of %lld tokens; /reset "
                           "starts a new one\n", req.prompt.size(), (long long)ctx);
      undo_message();
      continue;
    }

    const size_t open = prompt_text.rfind("<think>"), close = prompt_text.rfind("</think>");
    const bool thinking_open = open != std::string::npos && (close == std::string::npos || close < open);
    req.starts_in_reasoning = thinking_open;
    if (a.thinking_budget >= 0) {
      req.thinking_budget = a.thinking_budget;
      req.reasoning_close_tokens = src.tokenizer->encode(kReasoningBudgetClose);
    }
    // Resume from the longest snapshot this prompt shares (as the server does, engine_loop.cpp): snapshots during
    // the prefill every snapshot_every tokens, where the generation prompt begins (the next turn re-renders this
    // answer, without its thinking, after that point), at the end of the prompt and of the answer.
    req.checkpoint_at = server::chat_prompt_checkpoints(req.prompt, *src.tokenizer);
    const int64_t n_prompt = int64_t(req.prompt.size());
    const PrefixCache::Lease lease = cache.begin(req.prompt, req.images);
    Session& session = *lease.session;
    PrefillProgress progress(tty_err, lease.cached, n_prompt);
    if (cache.active()) {
      req.checkpoint_every = cache.options().snapshot_every;
      req.on_checkpoint = [&](Session& s) { cache.checkpoint(s, req.prompt, req.images); };
      req.on_kept_checkpoint = [&](Session& s) { cache.checkpoint_kept(s, req.prompt, req.images); };
    } else {
      req.checkpoint_at.clear();
    }
    // After each of the prefill's forward calls (the runner's chunks, cut where a snapshot falls).
    if (progress.on()) req.on_prompt_progress = [&](const PromptProgress& p) { progress.update(p.processed); };
    AnswerPrinter printer(thinking_open, a.show_thinking, tty_out);
    GenerationResult r;
    g_interrupted = false;
    input.answering(true);
    try {
      r = gen.generate(session, req, [&](const TokenEvent& e) {
        printer.push(e.text);
        return true;
      });
      input.answering(false);
    } catch (const Error& e) {
      input.answering(false);
      progress.done();
      cache.end(session, {}, false);  // the session's state is unknown: start over next turn
      undo_message();
      std::fprintf(stderr, "\ntern: error: %s\n", e.what());
      continue;
    }
    progress.done();  // a prefill cancelled before its end
    printer.finish();
    // What the session holds: the prompt (or the part of it fed before a cancel), then the answer's tokens that
    // were fed back (all but the last).
    const int64_t pos = session.position();
    std::vector<int32_t> held(req.prompt.begin(), req.prompt.begin() + std::min(pos, n_prompt));
    for (size_t i = 0; int64_t(held.size()) < pos && i < r.tokens.size(); ++i) held.push_back(r.tokens[i]);
    cache.end(session, held, int64_t(held.size()) == pos, req.images);
    nlohmann::ordered_json reply = {{"role", "assistant"}, {"content", printer.answer_text()}};
    if (!printer.thinking_text().empty()) reply["reasoning_content"] = printer.thinking_text();
    conv.messages.push_back(reply);
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
  model_flags_add_images(sub, a->model);
  sampling_flags_add(sub, a->sampling);
  speculative_flags_add(sub, a->speculative);
  sub->add_option("--system", a->system, "System message");
  sub->add_flag("--show-thinking", a->show_thinking, "Show the model's thinking, dimmed (default: hidden)");
  sub->add_flag("--no-think", a->no_think, "Chat template with enable_thinking=false");
  sub->add_option("--thinking-budget", a->thinking_budget,
                  "Reasoning tokens per answer at most; then the model is told to answer (default: no limit)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--history-file", a->history_file,
                  "Where typed messages are kept between sessions (default: $TERN_HISTORY_FILE, else "
                  "$XDG_STATE_HOME/tern/run_history or ~/.local/state/tern/run_history)");
  sub->add_flag("--no-history", a->no_history, "Keep the typed messages only for this session");
  sub->add_option("-n,--max-tokens", a->max_tokens, "Tokens per answer at most (default: until the model stops)")
      ->check(CLI::PositiveNumber);  // a bad value is a usage error (exit 2)
  sub->callback([a] { run_chat(*a); });
}

}  // namespace tern::cli
