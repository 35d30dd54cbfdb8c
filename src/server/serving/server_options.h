// What `tern serve` configures (ServerOptions: its flags) and the loaded model as the handlers use it
// (ServerModel). HttpServer (http_server.h) takes both; the handlers read them through ServerState.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "engine/image_prompt.h"
#include "engine/prefix_cache.h"
#include "engine/sampler.h"
#include "server/serving/ip_address.h"

namespace tern {
class ChatTemplate;
class Tokenizer;
}  // namespace tern

namespace tern::server {

// The engine loop's scheduler (engine_loop.h).
struct SchedulerOptions {
  int parallel = 0;              // requests that run at once (--parallel; 0: kDefaultParallel, fewer when the memory
                                 // holds fewer sessions); the others wait in the queue
  static constexpr int kDefaultParallel = 4;
  int64_t step_tokens = 512;     // prompt work per step while other requests decode (--step-tokens): tokens through
                                 // every layer; a longer chunk of the runner's runs a share of its layers per step
                                 // (GenerationRun::next_step). A prompt with no one else decoding prefills in the
                                 // runner's own chunks
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                       // 0: any free port (see HttpServer::port())
  std::string api_key;                   // "": no authentication
  std::string cors_origin;               // CORS for this origin ("*": any) besides the loopback origins (always)
  std::vector<std::string> allowed_hosts;  // Host names accepted besides the bound address and localhost ("*": any)
  bool allow_special_in_content = false; // special tokens typed in chat content stay control tokens
  size_t max_queue = 64;                 // requests waiting beyond the running ones; more get 503
  SchedulerOptions scheduler;            // --parallel, --step-tokens
  size_t max_body_bytes = 32u << 20;     // larger bodies get 413 (room for a 20 MB image as a base64 data: URL)
  int http_threads = 0;                  // 0: max_queue + parallel + 8 (a streaming request holds a thread)
  bool allow_forced_output = false;      // --debug-allow-forced-output: accept tern_debug_forced_output
  bool allow_image_urls = false;         // --allow-image-urls: http(s) image URLs are fetched (else refused)
  double image_url_timeout_s = 10;       // --image-url-timeout: all of a request's image URLs are fetched within this
  size_t image_url_max_bytes = 20u << 20;  // a fetched image past this is refused (as the chat page's own cap)
  std::vector<IpRange> image_url_allow;  // --image-url-allow: non-public addresses image URLs may reach all the same
  bool log_requests = true;              // one JSON line per request on stderr
  size_t max_connections = 1024;         // open connections in all; beyond: 503 and close
  size_t max_connections_per_address = 256;  // open connections from one client address
  double header_timeout_s = 10;          // a request's headers must arrive within this (408 otherwise)
  double body_timeout_s = 30;            // and its body within this after the headers
  double keep_alive_timeout_s = 5;       // an idle connection is closed after this
  PrefixCacheOptions prefix_cache;       // multi-turn prefix reuse (--no-prefix-cache, --cache-*)
  int64_t thinking_budget = -1;          // --thinking-budget / --reasoning-budget: for requests that set none (-1: none)
  double stream_keep_alive_s = 2;        // --stream-keep-alive: a stream quiet this long gets a keep-alive comment
                                         // (waiting in the queue, or while its tokens show nothing, as in a tool call)
  int64_t debug_stream_fault_after = 0;  // TESTS ONLY (--debug-stream-fault-after): > 0: a stream's provider fails
                                         // on its token event N + 1, as an internal fault would
  // The names the model will be served under, known before it loads ("": unknown): /v1/models lists them while it
  // loads. set_model() checks that the model has these names.
  std::string model_id;
  std::vector<std::string> model_aliases;
  bool strict_model_name = false;        // --strict-model-name: requests naming another model than the id or an alias
                                         // get 404 (by default any name is served by the one model)
};

// The loaded model, as the handlers use it. Everything must outlive the server.
struct ServerModel {
  std::string model_id;                  // GET /v1/models id, the name answers give
  std::vector<std::string> aliases;      // tern serve --alias: also accepted as the model's name, listed too
  std::string model_path;                // the folder it was loaded from ("" for the demo)
  bool random_weights = false;           // the demo model or synthetic weights: its output is meaningless
  std::string build_info;                // GET /props: tern's version and the backend it runs on
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
  Generator* generator = nullptr;        // used only by the engine loop's thread
  SamplingParams defaults;               // generation_config.json
  int64_t context = 0;                   // the session's capacity (--ctx-size, or the memory plan's)
  // The memory plan's choices (tern serve on a GPU, cli/memory_flags.h); 0 and -1: ServerOptions' own.
  int parallel = 0;                      // requests at once (SchedulerOptions::parallel)
  int cache_slots = 0;                   // the prefix cache's sessions (PrefixCacheOptions::slots)
  int64_t cache_gpu_bytes = -1;          // its snapshots in GPU memory (PrefixCacheOptions::gpu_bytes)
  int64_t vocab_size = 0;                // ids below it are valid in logit_bias and prompts
  // Images: whether the model takes them (images.unavailable says why not), its processor and token ids
  // (engine/image_prompt.h: image_settings).
  ImageSettings images;
};

}  // namespace tern::server
