// Server counters and gauges, rendered in the Prometheus text format (GET /metrics). Thread-safe.
//
// Queue accounting (the load test checks it adds up at every instant when idle):
//   tern_queue_accepted_total = tern_queue_finished_total{outcome=...} summed + tern_queue_waiting + tern_requests_running
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "engine/prefix_cache.h"
#include "server/http/connection_events.h"

namespace tern::server {

enum class TaskOutcome { completed, cancelled, failed };

class Metrics final : public ConnectionEvents {
 public:
  // One HTTP response (any route): counted by route and status.
  void on_http_response(const std::string& route, int status);

  // The queue: accepted (entered the FIFO), rejected (queue full), started (left the FIFO for the engine),
  // dropped (cancelled while still waiting), finished (engine done).
  void on_queue_accepted();
  void on_queue_rejected();
  void on_queue_dropped();   // left the queue without running (client gone): finished with outcome cancelled
  void on_task_started(double queue_wait_s);
  void on_task_finished(TaskOutcome outcome, int64_t prompt_tokens, int64_t cached_tokens,
                        int64_t completion_tokens, double prefill_s, double decode_s);

  // Speculative decoding, per finished task: drafted tokens verified, those accepted, the verify steps.
  void on_drafts(int64_t drafted, int64_t accepted, int64_t verify_steps);

  // One engine step: `sequences` tasks in one batched forward, `tokens` new tokens in all.
  // pieces: entries that ran part of a prompt chunk's layers (BatchEntry::layer_limit stopped short of the last).
  void on_step(int64_t sequences, int64_t tokens, int64_t pieces = 0);

  // The prefix cache's counters and memory (after each task).
  void on_prefix_cache(const PrefixCacheStats& stats, bool enabled);

  // Connections (the HTTP layer): opened and closed, refused at the cap, closed for a read deadline.
  void on_connection_opened() override;
  void on_connection_closed() override;
  void on_connection_refused() override;
  void on_read_timeout() override;

  int64_t waiting() const;
  int64_t running() const;

  std::string render_prometheus() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> http_;  // (route, status) -> count
  int64_t connections_open_ = 0, connections_refused_ = 0, read_timeouts_ = 0;
  int64_t accepted_ = 0, rejected_ = 0, waiting_ = 0, running_ = 0;
  int64_t completed_ = 0, cancelled_ = 0, failed_ = 0;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0, completion_tokens_ = 0;
  double prefill_s_ = 0, decode_s_ = 0;        // summed seconds
  int64_t prefilled_tokens_ = 0, decoded_tokens_ = 0;  // tokens those seconds covered
  double last_prefill_tok_s_ = 0, last_decode_tok_s_ = 0;
  double ttft_sum_s_ = 0; int64_t ttft_count_ = 0;      // prefill time (time to first token, engine side)
  double queue_wait_sum_s_ = 0; int64_t queue_wait_count_ = 0;
  static constexpr int kBatchBuckets = 7;               // sequences per step <= 1, 2, 4, 8, 16, 32, 64
  int64_t steps_ = 0, step_tokens_ = 0, step_sequences_ = 0, step_pieces_ = 0;
  int64_t batch_buckets_[kBatchBuckets] = {};          // steps per bucket (not cumulative)
  int64_t draft_tokens_ = 0, draft_accepted_ = 0, verify_steps_ = 0;
  PrefixCacheStats prefix_cache_;
  bool prefix_cache_enabled_ = false;
};

}  // namespace tern::server
