// Ollama's REST API (the routes of `ollama serve` that clients use to chat and to list models), over the same
// machinery as /v1/chat/completions. /api/chat and /api/generate bodies are translated into the internal chat
// request (ollama_schema.h), rendered through the chat template and tokenized as a chat completion is (raw
// /api/generate: the prompt's tokens as they are), queued with the same prefix-cache checkpoints, and answered
// through serve_output (serving/generation.h: queueing, streaming, cancellation) with OllamaOutput writing the
// NDJSON objects. /api/tags, /api/show, /api/ps and /api/version describe the one served model. Every error has
// Ollama's shape: {"error": "message"}.
#include "server/ollama/ollama_handlers.h"

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "core/check.h"
#include "server/ollama/ollama_output.h"
#include "server/ollama/ollama_schema.h"
#include "server/serving/chat_prompt.h"
#include "server/serving/generation.h"
#include "server/serving/prompt_images.h"
#include "server/serving/output_common.h"
#include "server/serving/server_state.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tern::server {

namespace {

// The architecture tern runs (Qwen3.6-35B-A3B); a checkpoint's config.json may name it itself.
constexpr const char* kFamily = "qwen3_5_moe";
const std::string kServerStarted = rfc3339_now();  // modified_at of a model without files (the demo)

// What /api/tags, /api/show and /api/ps say about the model, from its folder (nothing for the demo).
struct ModelFacts {
  int64_t size = 0;                          // bytes of the *.safetensors files
  std::string family = kFamily;
  std::string quantization = "unknown";      // "Q4" / "Q8" (MLX affine bits), else the dtype ("BF16")
  std::string modified_at = kServerStarted;  // config.json's modification time
};

std::string rfc3339_of(std::filesystem::file_time_type t) {
  const auto sys = std::chrono::file_clock::to_sys(t);
  const std::time_t tt = std::chrono::system_clock::to_time_t(sys);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

ModelFacts model_facts(const ServerModel& m) {
  ModelFacts f;
  if (m.model_path.empty()) return f;
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(m.model_path, ec))
    if (e.path().extension() == ".safetensors" && e.is_regular_file(ec)) f.size += int64_t(e.file_size(ec));
  const fs::path config = fs::path(m.model_path) / "config.json";
  if (auto t = fs::last_write_time(config, ec); !ec) f.modified_at = rfc3339_of(t);
  std::ifstream in(config);
  const Json j = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return f;
  if (auto type = j.find("model_type"); type != j.end() && type->is_string()) f.family = type->get<std::string>();
  for (const char* key : {"quantization", "quantization_config"}) {
    auto q = j.find(key);
    if (q != j.end() && q->is_object() && q->contains("bits") && (*q)["bits"].is_number_integer()) {
      f.quantization = "Q" + std::to_string((*q)["bits"].get<int64_t>());
      return f;
    }
  }
  for (const char* key : {"torch_dtype", "dtype"}) {
    auto d = j.find(key);
    if (d != j.end() && d->is_string()) {
      const std::string s = d->get<std::string>();
      f.quantization = s == "bfloat16" ? "BF16" : s == "float16" ? "F16" : s == "float32" ? "F32" : s;
      break;
    }
  }
  return f;
}

// A stable 64-hex-digit digest of the model's id (Ollama lists a sha256 of the weights; tern has no blob store, so
// this only identifies the model: four FNV-1a lanes).
std::string model_digest(const std::string& id) {
  std::string out;
  for (uint64_t lane = 0; lane < 4; ++lane) {
    uint64_t h = 1469598103934665603ull ^ (lane * 0x9e3779b97f4a7c15ull);
    for (unsigned char c : id) h = (h ^ c) * 1099511628211ull;
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    out += buf;
  }
  return out;
}

// tern's version: build_info reads "tern VERSION (BACKEND backend)".
std::string tern_version(const ServerModel& m) {
  const std::string prefix = "tern ";
  if (m.build_info.rfind(prefix, 0) != 0) return "unknown";
  return m.build_info.substr(prefix.size(), m.build_info.find(' ', prefix.size()) - prefix.size());
}

// Ollama lists names with a tag: "qwen" -> "qwen:latest".
std::string tagged(const std::string& name) {
  const size_t slash = name.rfind('/');
  const bool has_tag = name.find(':', slash == std::string::npos ? 0 : slash) != std::string::npos;
  return has_tag ? name : name + ":latest";
}

Json details(const ServerModel& m, const ModelFacts& f) {
  return Json{{"parent_model", ""},
              {"format", "safetensors"},
              {"family", f.family},
              {"families", Json::array({f.family})},
              // The architecture's size; the demo's random weights are a small model of it.
              {"parameter_size", m.random_weights ? "unknown" : "35B"},
              {"quantization_level", f.quantization}};
}

Json tag_entry(const ServerModel& m, const ModelFacts& f, const std::string& name) {
  return Json{{"name", tagged(name)},
              {"model", tagged(name)},
              {"modified_at", f.modified_at},
              {"size", f.size},
              {"digest", model_digest(m.model_id)},
              {"details", details(m, f)}};
}

// A request with no prompt / no messages: Ollama (pre)loads the model and answers at once.
Json load_response(const OllamaRequest& r) {
  Json out = {{"model", r.model_name}, {"created_at", rfc3339_now()}};
  if (r.endpoint == OllamaEndpoint::chat) out["message"] = Json{{"role", "assistant"}, {"content", ""}};
  else out["response"] = "";
  out["done"] = true;
  out["done_reason"] = "load";
  return out;
}

void serve_generation(ServerState& state, const httplib::Request& req, httplib::Response& res, OllamaEndpoint endpoint) {
  const auto start = std::chrono::steady_clock::now();
  if (!model_ready(state, res, respond_ollama_error)) return;
  auto parsed = parse_ollama_request(req.body, parse_options(state), endpoint);
  if (auto* e = std::get_if<ApiError>(&parsed)) return respond_ollama_error(res, *e);
  const OllamaRequest& request = std::get<OllamaRequest>(parsed);
  const ChatRequest& chat = request.chat;
  const char* prompt_param = endpoint == OllamaEndpoint::chat ? "messages" : "prompt";

  if (request.num_ctx && *request.num_ctx > state.model.context)
    return respond_ollama_error(res, api_error_invalid("options.num_ctx", "'options.num_ctx' is " +
                                                       std::to_string(*request.num_ctx) + ", beyond this server's "
                                                       "context of " + std::to_string(state.model.context) +
                                                       " tokens (tern serve --ctx-size sets it)."));
  auto sampling = sampling_params(state, chat.sampling, -1);
  if (auto* e = std::get_if<ApiError>(&sampling)) return respond_ollama_error(res, *e);
  if (request.load_only) {
    request_log().fields["load_only"] = true;
    return respond_json(res, load_response(request));
  }
  if (auto e = request_images_refused(state, chat.images)) return respond_ollama_error(res, *e);

  auto task = std::make_shared<GenerationTask>();
  task->id = response_id("ollama-");
  bool starts_in_reasoning = false;
  try {
    if (request.raw) {
      if (auto e = check_prompt_bytes(state, request.prompt.size(), "prompt")) return respond_ollama_error(res, *e);
      task->request.prompt = state.model.tokenizer->encode(request.prompt);
    } else {
      static const std::vector<std::string> kNone;
      auto rendered = chat_render_prompt(chat, *state.model.chat_template,
                                         state.options.allow_special_in_content ? kNone : state.special_tokens);
      if (auto* e = std::get_if<ApiError>(&rendered)) {
        ApiError error = *e;
        if (error.param == "messages") error.param = prompt_param;
        return respond_ollama_error(res, error);
      }
      const ChatPrompt& prompt = std::get<ChatPrompt>(rendered);
      if (auto e = check_prompt_bytes(state, prompt.text.size(), prompt_param)) return respond_ollama_error(res, *e);
      task->request.prompt = chat_prompt_tokens(prompt, *state.model.tokenizer);
      if (auto e = prompt_images_attach(state, chat.images, task->request.prompt, &task->request.images))
        return respond_ollama_error(res, *e);
      task->request.checkpoint_at = chat_prompt_checkpoints(task->request.prompt, *state.model.tokenizer);
      starts_in_reasoning = prompt.starts_in_reasoning;
    }
    if (chat.forced_output) task->request.forced_tokens = state.model.tokenizer->encode(*chat.forced_output);
  } catch (const Error& e) {
    return respond_ollama_error(res, api_error_invalid(prompt_param, strip_error_location(e.what())));
  }
  if (task->request.prompt.empty())
    return respond_ollama_error(res, api_error_invalid(prompt_param, "'prompt' encodes to no tokens."));
  if (auto e = check_context(state, task->request.prompt.size())) {
    e->param = prompt_param;
    return respond_ollama_error(res, *e);
  }
  task->request.sampling = std::get<SamplingParams>(sampling);
  task->request.max_tokens = chat.max_tokens.value_or(-1);
  task->request.stop = chat.stop;
  // format's constraint starts after the reasoning when the prompt opened it.
  task->request.grammar = chat.grammar;
  if (chat.grammar && starts_in_reasoning) task->request.grammar_start_after = "</think>";
  set_reasoning_controls(state, task->request, std::nullopt, starts_in_reasoning);  // the server's --thinking-budget

  OllamaOutputOptions o;
  o.model = request.model_name;
  o.chat = endpoint == OllamaEndpoint::chat;
  o.parse = !request.raw;
  o.tools = chat.tools;
  o.starts_in_reasoning = starts_in_reasoning;
  o.start = start;
  serve_output(state, req, res, std::move(task), std::make_unique<OllamaOutput>(std::move(o)), chat.stream);
}

}  // namespace

void handle_ollama_chat(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  request_log().route = "/api/chat";
  serve_generation(state, req, res, OllamaEndpoint::chat);
}

void handle_ollama_generate(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  request_log().route = "/api/generate";
  serve_generation(state, req, res, OllamaEndpoint::generate);
}

void handle_ollama_tags(ServerState& state, const httplib::Request&, httplib::Response& res) {
  request_log().route = "/api/tags";
  Json models = Json::array();
  if (state.ready.load(std::memory_order_acquire)) {
    const ServerModel& m = state.model;
    const ModelFacts f = model_facts(m);
    models.push_back(tag_entry(m, f, m.model_id));
    for (const std::string& alias : m.aliases) models.push_back(tag_entry(m, f, alias));
  }
  respond_json(res, Json{{"models", std::move(models)}});
}

void handle_ollama_ps(ServerState& state, const httplib::Request&, httplib::Response& res) {
  request_log().route = "/api/ps";
  Json models = Json::array();
  if (state.ready.load(std::memory_order_acquire)) {
    const ServerModel& m = state.model;
    const ModelFacts f = model_facts(m);
    Json entry = tag_entry(m, f, m.model_id);
    entry.erase("modified_at");
    entry["expires_at"] = "9999-12-31T23:59:59Z";  // tern keeps its model loaded until it stops
    entry["size_vram"] = m.build_info.find("cuda") != std::string::npos ? f.size : 0;
    entry["context_length"] = m.context;
    models.push_back(std::move(entry));
  }
  respond_json(res, Json{{"models", std::move(models)}});
}

void handle_ollama_version(ServerState& state, const httplib::Request&, httplib::Response& res) {
  request_log().route = "/api/version";
  if (!model_ready(state, res, respond_ollama_error)) return;
  respond_json(res, Json{{"version", tern_version(state.model)}});
}

void handle_ollama_show(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  request_log().route = "/api/show";
  if (!model_ready(state, res, respond_ollama_error)) return;
  auto parsed = parse_ollama_show_request(req.body, parse_options(state));
  if (auto* e = std::get_if<ApiError>(&parsed)) return respond_ollama_error(res, *e);
  const ServerModel& m = state.model;
  const ModelFacts f = model_facts(m);
  const SamplingParams& d = m.defaults;
  char parameters[256];  // Ollama's Modelfile PARAMETER lines: the generation_config defaults
  std::snprintf(parameters, sizeof parameters, "temperature %g\ntop_p %g\ntop_k %d\nmin_p %g\nrepeat_penalty %g",
                double(d.temperature), double(d.top_p), d.top_k, double(d.min_p), double(d.repetition_penalty));
  Json model_info = {{"general.architecture", f.family},
                     {"general.basename", m.model_id},
                     {f.family + ".context_length", m.context}};
  respond_json(res, Json{{"license", ""},
                         {"modelfile", "# served by tern: " + m.model_id + "\nFROM " +
                                           (m.model_path.empty() ? m.model_id : m.model_path) + "\n"},
                         {"parameters", parameters},
                         {"template", m.chat_template->source()},
                         {"details", details(m, f)},
                         {"model_info", std::move(model_info)},
                         {"capabilities", m.images.unavailable.empty()
                                              ? Json::array({"completion", "tools", "thinking", "vision"})
                                              : Json::array({"completion", "tools", "thinking"})},
                         {"modified_at", f.modified_at}});
}

}  // namespace tern::server
