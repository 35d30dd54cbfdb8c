#include "server/serving/metrics.h"

#include <cstdio>

namespace tern::server {

void Metrics::on_http_response(const std::string& route, int status) {
  std::lock_guard lock(mutex_);
  ++http_[{route, status}];
}

void Metrics::on_queue_accepted() {
  std::lock_guard lock(mutex_);
  ++accepted_;
  ++waiting_;
}

void Metrics::on_queue_rejected() {
  std::lock_guard lock(mutex_);
  ++rejected_;
}

void Metrics::on_queue_dropped() {
  std::lock_guard lock(mutex_);
  --waiting_;
  ++cancelled_;
}

void Metrics::on_task_started(double queue_wait_s) {
  std::lock_guard lock(mutex_);
  --waiting_;
  ++running_;
  queue_wait_sum_s_ += queue_wait_s;
  ++queue_wait_count_;
}

void Metrics::on_task_finished(TaskOutcome outcome, int64_t prompt_tokens, int64_t cached_tokens,
                               int64_t completion_tokens, double prefill_s, double decode_s) {
  std::lock_guard lock(mutex_);
  --running_;
  (outcome == TaskOutcome::completed ? completed_ : outcome == TaskOutcome::cancelled ? cancelled_ : failed_)++;
  prompt_tokens_ += prompt_tokens;
  cached_tokens_ += cached_tokens;
  completion_tokens_ += completion_tokens;
  if (prefill_s > 0) {
    prefill_s_ += prefill_s;
    prefilled_tokens_ += prompt_tokens - cached_tokens;
    last_prefill_tok_s_ = double(prompt_tokens - cached_tokens) / prefill_s;
    ttft_sum_s_ += prefill_s;
    ++ttft_count_;
  }
  if (decode_s > 0 && completion_tokens > 1) {
    decode_s_ += decode_s;
    decoded_tokens_ += completion_tokens - 1;
    last_decode_tok_s_ = double(completion_tokens - 1) / decode_s;
  }
}

void Metrics::on_drafts(int64_t drafted, int64_t accepted, int64_t verify_steps) {
  std::lock_guard lock(mutex_);
  draft_tokens_ += drafted;
  draft_accepted_ += accepted;
  verify_steps_ += verify_steps;
}

void Metrics::on_step(int64_t sequences, int64_t tokens, int64_t pieces) {
  std::lock_guard lock(mutex_);
  ++steps_;
  step_tokens_ += tokens;
  step_pieces_ += pieces;
  step_sequences_ += sequences;
  int b = 0;
  while (b + 1 < kBatchBuckets && sequences > (int64_t(1) << b)) ++b;
  if (sequences <= (int64_t(1) << b)) ++batch_buckets_[b];
}

void Metrics::on_prefix_cache(const PrefixCacheStats& stats, bool enabled) {
  std::lock_guard lock(mutex_);
  prefix_cache_ = stats;
  prefix_cache_enabled_ = enabled;
}

int64_t Metrics::waiting() const {
  std::lock_guard lock(mutex_);
  return waiting_;
}

int64_t Metrics::running() const {
  std::lock_guard lock(mutex_);
  return running_;
}

namespace {
void metric(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}
void value(std::string& out, const std::string& name_and_labels, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, " %.17g\n", v);
  out += name_and_labels;
  out += buf;
}
}  // namespace

void Metrics::on_connection_opened() {
  std::lock_guard lock(mutex_);
  ++connections_open_;
}
void Metrics::on_connection_closed() {
  std::lock_guard lock(mutex_);
  --connections_open_;
}
void Metrics::on_connection_refused() {
  std::lock_guard lock(mutex_);
  ++connections_refused_;
}
void Metrics::on_read_timeout() {
  std::lock_guard lock(mutex_);
  ++read_timeouts_;
}
std::string Metrics::render_prometheus() const {
  std::lock_guard lock(mutex_);
  std::string o;
  metric(o, "tern_http_connections_open", "gauge", "Open client connections.");
  value(o, "tern_http_connections_open", double(connections_open_));
  metric(o, "tern_http_connections_refused_total", "counter",
         "Connections refused (503) because the total or per-address cap was reached.");
  value(o, "tern_http_connections_refused_total", double(connections_refused_));
  metric(o, "tern_http_read_timeouts_total", "counter",
         "Requests whose headers or body did not arrive within the deadline (408, connection closed).");
  value(o, "tern_http_read_timeouts_total", double(read_timeouts_));
  metric(o, "tern_http_responses_total", "counter", "HTTP responses by route and status.");
  for (const auto& [key, n] : http_)
    value(o, "tern_http_responses_total{route=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"}",
          double(n));
  metric(o, "tern_queue_accepted_total", "counter", "Generation requests accepted into the FIFO queue.");
  value(o, "tern_queue_accepted_total", double(accepted_));
  metric(o, "tern_queue_rejected_total", "counter", "Generation requests rejected with 503 because the queue was full.");
  value(o, "tern_queue_rejected_total", double(rejected_));
  metric(o, "tern_queue_finished_total", "counter", "Accepted requests that are done, by outcome.");
  value(o, "tern_queue_finished_total{outcome=\"completed\"}", double(completed_));
  value(o, "tern_queue_finished_total{outcome=\"cancelled\"}", double(cancelled_));
  value(o, "tern_queue_finished_total{outcome=\"failed\"}", double(failed_));
  metric(o, "tern_queue_waiting", "gauge", "Requests waiting in the queue (queue depth).");
  value(o, "tern_queue_waiting", double(waiting_));
  metric(o, "tern_requests_running", "gauge", "Requests the engine is generating for now.");
  value(o, "tern_requests_running", double(running_));
  metric(o, "tern_engine_steps_total", "counter", "Engine steps (one batched forward over the running requests).");
  value(o, "tern_engine_steps_total", double(steps_));
  metric(o, "tern_engine_step_tokens_total", "counter", "New tokens over all steps (prompt chunks and decoded tokens).");
  value(o, "tern_engine_step_tokens_total", double(step_tokens_));
  metric(o, "tern_engine_prompt_pieces_total", "counter",
         "Prompt chunks' pieces of layers (a long prompt read beside running requests, a share of its layers a step).");
  value(o, "tern_engine_prompt_pieces_total", double(step_pieces_));
  metric(o, "tern_engine_batch_size", "histogram", "Requests per engine step.");
  {
    int64_t cumulative = 0;
    for (int b = 0; b < kBatchBuckets; ++b) {
      cumulative += batch_buckets_[b];
      value(o, "tern_engine_batch_size_bucket{le=\"" + std::to_string(int64_t(1) << b) + "\"}", double(cumulative));
    }
    value(o, "tern_engine_batch_size_bucket{le=\"+Inf\"}", double(steps_));
    value(o, "tern_engine_batch_size_sum", double(step_sequences_));
    value(o, "tern_engine_batch_size_count", double(steps_));
  }
  metric(o, "tern_prompt_tokens_total", "counter", "Prompt tokens of finished requests (tokens in).");
  value(o, "tern_prompt_tokens_total", double(prompt_tokens_));
  metric(o, "tern_prompt_tokens_cached_total", "counter", "Prompt tokens reused from a previous turn.");
  value(o, "tern_prompt_tokens_cached_total", double(cached_tokens_));
  metric(o, "tern_completion_tokens_total", "counter", "Generated tokens (tokens out).");
  value(o, "tern_completion_tokens_total", double(completion_tokens_));
  metric(o, "tern_draft_tokens_total", "counter", "Speculative decoding: drafted tokens verified.");
  value(o, "tern_draft_tokens_total", double(draft_tokens_));
  metric(o, "tern_draft_tokens_accepted_total", "counter",
         "Speculative decoding: drafted tokens the model confirmed (the rest were rejected).");
  value(o, "tern_draft_tokens_accepted_total", double(draft_accepted_));
  metric(o, "tern_verify_steps_total", "counter", "Speculative decoding: steps that verified drafts.");
  value(o, "tern_verify_steps_total", double(verify_steps_));
  metric(o, "tern_prefill_seconds_total", "counter", "Seconds spent in prefill.");
  value(o, "tern_prefill_seconds_total", prefill_s_);
  metric(o, "tern_decode_seconds_total", "counter", "Seconds spent decoding after the first token.");
  value(o, "tern_decode_seconds_total", decode_s_);
  metric(o, "tern_prefill_tokens_per_second", "gauge", "Prefill speed of the last request.");
  value(o, "tern_prefill_tokens_per_second", last_prefill_tok_s_);
  metric(o, "tern_decode_tokens_per_second", "gauge", "Decode speed of the last request.");
  value(o, "tern_decode_tokens_per_second", last_decode_tok_s_);
  metric(o, "tern_prefill_tokens_per_second_avg", "gauge", "Prefill speed over all requests.");
  value(o, "tern_prefill_tokens_per_second_avg", prefill_s_ > 0 ? double(prefilled_tokens_) / prefill_s_ : 0.0);
  metric(o, "tern_decode_tokens_per_second_avg", "gauge", "Decode speed over all requests.");
  value(o, "tern_decode_tokens_per_second_avg", decode_s_ > 0 ? double(decoded_tokens_) / decode_s_ : 0.0);
  metric(o, "tern_time_to_first_token_seconds", "summary", "Engine time from start of prefill to the first token.");
  value(o, "tern_time_to_first_token_seconds_sum", ttft_sum_s_);
  value(o, "tern_time_to_first_token_seconds_count", double(ttft_count_));
  const PrefixCacheStats& pc = prefix_cache_;
  metric(o, "tern_prefix_cache_enabled", "gauge", "1 when the prefix cache is on (--no-prefix-cache: 0).");
  value(o, "tern_prefix_cache_enabled", prefix_cache_enabled_ ? 1.0 : 0.0);
  metric(o, "tern_prefix_cache_hits_total", "counter", "Requests that resumed from a cached prefix.");
  value(o, "tern_prefix_cache_hits_total", double(pc.hits));
  metric(o, "tern_prefix_cache_misses_total", "counter", "Requests that reused no cached prefix.");
  value(o, "tern_prefix_cache_misses_total", double(pc.misses));
  metric(o, "tern_prefix_cache_tokens_reused_total", "counter", "Prompt tokens resumed from the cache, not recomputed.");
  value(o, "tern_prefix_cache_tokens_reused_total", double(pc.tokens_reused));
  metric(o, "tern_prefix_cache_snapshots", "gauge", "Gated DeltaNet state snapshots held.");
  value(o, "tern_prefix_cache_snapshots", double(pc.snapshots));
  metric(o, "tern_prefix_cache_bytes", "gauge", "Memory held by snapshots, in device (gpu) and host memory.");
  value(o, "tern_prefix_cache_bytes{where=\"gpu\"}", double(pc.bytes_gpu));
  value(o, "tern_prefix_cache_bytes{where=\"host\"}", double(pc.bytes_host));
  metric(o, "tern_prefix_cache_snapshots_taken_total", "counter", "Snapshots taken.");
  value(o, "tern_prefix_cache_snapshots_taken_total", double(pc.snapshots_taken));
  metric(o, "tern_prefix_cache_snapshots_to_host_total", "counter", "Snapshots moved to host memory (GPU budget).");
  value(o, "tern_prefix_cache_snapshots_to_host_total", double(pc.snapshots_to_host));
  metric(o, "tern_prefix_cache_snapshots_dropped_total", "counter",
         "Snapshots dropped (host budget, or overwritten by a diverging prompt).");
  value(o, "tern_prefix_cache_snapshots_dropped_total", double(pc.snapshots_dropped));
  metric(o, "tern_prefix_cache_sessions", "gauge", "Sessions (conversations with their own KV cache) allocated.");
  value(o, "tern_prefix_cache_sessions", double(pc.sessions));
  metric(o, "tern_queue_wait_seconds", "summary", "Time requests waited in the queue before running.");
  value(o, "tern_queue_wait_seconds_sum", queue_wait_sum_s_);
  value(o, "tern_queue_wait_seconds_count", double(queue_wait_count_));
  return o;
}

}  // namespace tern::server
