#include "engine/bench_prefix.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>

#include "core/check.h"
#include "engine/bench_run.h"

namespace tern {

namespace {

using clock_type = std::chrono::steady_clock;


}  // namespace

PrefixBenchReport bench_prefix_reuse(ModelRunner& runner, const PrefixBenchOptions& o) {
  TERN_CHECK(o.context >= 1 && o.reply >= 0 && o.next >= 1, "bench --prefix-reuse: context (", o.context,
             ") and next (", o.next, ") must be >= 1, reply (", o.reply, ") >= 0");
  TERN_CHECK(o.snapshot_every >= 0 && o.prefill_chunk >= 1 && o.repeats >= 1,
             "bench --prefix-reuse: snapshot_every >= 0, prefill_chunk >= 1 and repeats >= 1");
  const int64_t total = o.context + o.reply + o.next;
  TERN_CHECK(total <= runner.config().max_position_embeddings, "bench --prefix-reuse: ", total,
             " tokens exceed the model's max_position_embeddings ", runner.config().max_position_embeddings);
  const int64_t vocab = runner.vocab_real();
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> dist(0, int32_t(vocab - 1));
  std::vector<int32_t> tokens(static_cast<size_t>(total));
  for (auto& t : tokens) t = dist(rng);
  const std::span<const int32_t> all(tokens);
  const int64_t turn1 = o.context + o.reply;

  PrefixBenchReport rep;
  rep.backend = runner.backend_name();
  rep.options = o;
  rep.options.log = nullptr;
  rep.turn2_tokens = total;
  rep.reused_tokens = turn1;
  auto session = runner.create_session(total);
  TERN_CHECK(session->can_snapshot(), "bench --prefix-reuse: the ", runner.backend_name(),
             " backend's sessions have no snapshots");
  std::vector<float> logits;
  std::vector<double> snapshot_ms;

  // Feeds tokens [position, end) in calls that end at multiples of prefill_chunk past the start (and of `every`
  // when > 0), calling at_checkpoint at each multiple of `every` and at `end`.
  auto prefill = [&](int64_t end, int64_t every, const std::function<void()>& at_checkpoint) {
    while (session->position() < end) {
      const int64_t pos = session->position();
      int64_t n = std::min(end - pos, o.prefill_chunk);
      if (every > 0) n = std::min(n, every - pos % every);
      runner.forward(*session, all.subspan(size_t(pos), size_t(n)), false, logits);
      if (at_checkpoint && (session->position() == end || (every > 0 && session->position() % every == 0)))
        at_checkpoint();
    }
  };
  std::vector<std::unique_ptr<StateSnapshot>> held;  // turn 1's snapshots, kept as the server keeps them
  auto take = [&] {
    const auto t0 = clock_type::now();
    held.push_back(session->snapshot());
    snapshot_ms.push_back(bench_ms_since(t0));
  };

  // ---- turn 1 ----
  if (o.log) o.log("turn 1: " + std::to_string(o.context) + " prompt tokens + " + std::to_string(o.reply) + " reply");
  session->reset();
  auto t0 = clock_type::now();
  prefill(o.context, o.snapshot_every, take);
  if (o.reply > 0) {
    runner.forward(*session, all.subspan(size_t(o.context), size_t(o.reply)), false, logits);
    take();
  }
  rep.turn1_ms = bench_ms_since(t0);
  rep.snapshots = int(held.size());
  StateSnapshot& end_of_turn1 = *held.back();
  TERN_CHECK(end_of_turn1.position() == turn1, "bench --prefix-reuse: the last snapshot is at ",
             end_of_turn1.position(), ", expected ", turn1);
  rep.snapshot_bytes = int64_t(end_of_turn1.bytes());

  std::vector<double> to_host, to_device;
  for (int r = 0; r < o.repeats + 1; ++r) {  // run 0 is a warm-up
    // Without reuse: the whole turn-2 prompt from an empty session.
    session->reset();
    t0 = clock_type::now();
    prefill(total, 0, nullptr);
    const double scratch = bench_ms_since(t0);
    const std::vector<float> want = logits;
    // With reuse: the session's KV rows [0, turn1) hold turn 1's tokens again (the run above ran them).
    t0 = clock_type::now();
    session->restore(end_of_turn1);
    prefill(total, 0, [&] { held.push_back(session->snapshot()); });
    const double reuse = bench_ms_since(t0);
    held.pop_back();
    for (size_t i = 0; i < size_t(vocab); ++i) {
      rep.max_abs_dlogit = std::max(rep.max_abs_dlogit, double(std::fabs(logits[i] - want[i])));
      rep.max_abs_logit = std::max(rep.max_abs_logit, double(std::fabs(want[i])));
    }
    // With reuse from host memory (the snapshot was evicted from the GPU).
    auto t1 = clock_type::now();
    end_of_turn1.to_host();
    const double th = bench_ms_since(t1);
    t0 = clock_type::now();
    session->restore(end_of_turn1);
    prefill(total, 0, [&] { held.push_back(session->snapshot()); });
    const double reuse_host = bench_ms_since(t0);
    held.pop_back();
    t1 = clock_type::now();
    end_of_turn1.to_device();
    const double td = bench_ms_since(t1);
    if (r == 0) continue;
    rep.scratch_ms.push_back(scratch);
    rep.reuse_ms.push_back(reuse);
    rep.reuse_host_ms.push_back(reuse_host);
    to_host.push_back(th);
    to_device.push_back(td);
    if (o.log) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "turn 2 run %d/%d: no reuse %.1f ms, reuse %.1f ms, reuse from host %.1f ms", r,
                    o.repeats, scratch, reuse, reuse_host);
      o.log(buf);
    }
  }
  rep.scratch_ms_median = bench_median(rep.scratch_ms);
  rep.reuse_ms_median = bench_median(rep.reuse_ms);
  rep.reuse_host_ms_median = bench_median(rep.reuse_host_ms);
  rep.snapshot_ms = bench_median(snapshot_ms);
  rep.to_host_ms = bench_median(to_host);
  rep.to_device_ms = bench_median(to_device);
  return rep;
}

std::string bench_prefix_table(const PrefixBenchReport& r) {
  const PrefixBenchOptions& o = r.options;
  char buf[512];
  std::string out;
  std::snprintf(buf, sizeof buf,
                "prefix reuse (%s): turn 1 = %lld prompt + %lld reply tokens; turn 2 = %lld tokens, %lld of them "
                "reused; prefill calls of %lld tokens, snapshots every %lld\n",
                r.backend.c_str(), (long long)o.context, (long long)o.reply, (long long)r.turn2_tokens,
                (long long)r.reused_tokens, (long long)o.prefill_chunk, (long long)o.snapshot_every);
  out += buf;
  out += "| turn 2, time to first token | ms (median of " + std::to_string(r.scratch_ms.size()) + ") | speed-up |\n";
  out += "|---|---:|---:|\n";
  auto row = [&](const char* name, double ms) {
    std::snprintf(buf, sizeof buf, "| %s | %.1f | %.1fx |\n", name, ms, ms > 0 ? r.scratch_ms_median / ms : 0.0);
    out += buf;
  };
  row("no reuse (whole prompt)", r.scratch_ms_median);
  row("reuse (snapshot in device memory)", r.reuse_ms_median);
  row("reuse (snapshot in host memory)", r.reuse_host_ms_median);
  std::snprintf(buf, sizeof buf,
                "turn 1: %.1f ms with %d snapshots of %.1f MB (%.3f ms each); to host %.2f ms, back %.2f ms; turn-2 "
                "logits reuse vs none: max |d| %.3g (max |logit| %.3g)\n",
                r.turn1_ms, r.snapshots, double(r.snapshot_bytes) / 1e6, r.snapshot_ms, r.to_host_ms, r.to_device_ms,
                r.max_abs_dlogit, r.max_abs_logit);
  out += buf;
  return out;
}

}  // namespace tern
