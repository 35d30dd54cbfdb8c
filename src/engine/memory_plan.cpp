#include "engine/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/check.h"

namespace tern {

namespace {

using detail::concat;

int64_t round_up(int64_t bytes, int64_t granule) { return (bytes + granule - 1) / granule * granule; }

// Flag values in advice are printed plain ("--ctx-size 109568"), token counts with separators.
std::string count_text(int64_t n) {
  const std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out = n < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string sequences_text(int64_t n) { return count_text(n) + (n == 1 ? " sequence" : " sequences"); }
std::string sessions_text(int64_t n) { return count_text(n) + (n == 1 ? " session" : " sessions"); }

// The arithmetic of one input: every size the plan weighs, and what fits in a given room.
class Sizes {
 public:
  explicit Sizes(const MemoryPlanInput& in) : in_(in) {}

  bool cache() const { return in_.cache_slots > 0; }
  int64_t available() const { return in_.cap_bytes > 0 ? std::min(in_.free_bytes, in_.cap_bytes) : in_.free_bytes; }
  int64_t fixed() const { return in_.weights_bytes + in_.scratch_bytes + in_.reserve_bytes; }
  // One session of `context` tokens: one allocation (cuda_session.cu's arena).
  int64_t session(int64_t context) const {
    return round_up(in_.state_bytes + context * in_.kv_token_bytes, kMemoryPlanAllocationGranule);
  }
  // Device memory of the snapshots under `budget` bytes of them: each in its own buffer, plus the spares.
  int64_t snapshots(int64_t budget) const {
    if (!cache() || in_.state_bytes <= 0) return 0;
    const int64_t held = (budget + in_.state_bytes - 1) / in_.state_bytes;
    return (held + kMemoryPlanSnapshotSpares) * snapshot_buffer();
  }
  int64_t snapshot_buffer() const { return round_up(in_.state_bytes, kMemoryPlanAllocationGranule); }
  // Sessions for `parallel` sequences at once: the prefix cache's own when they were given and are more.
  int sessions(int parallel) const {
    return cache() && in_.cache_slots_given ? std::max(parallel, in_.cache_slots) : parallel;
  }
  // One running sequence's verify states (one buffer of the CUDA runner's pool: cuda_session.cuh,
  // KeptStateBuffers); 0 without speculative decoding.
  int64_t verify() const { return round_up(in_.verify_bytes, kMemoryPlanAllocationGranule); }
  int64_t verifies(int parallel) const { return parallel * verify(); }
  // Whether `parallel` sequences of `context` tokens fit in `room`: their sessions (the prefix cache's when more)
  // and their verify states.
  bool fits(int parallel, int64_t context, int64_t room) const {
    return sessions(parallel) * session(context) + verifies(parallel) <= room;
  }
  // The most sequences of `context` tokens, up to `most`, that fit in `room`; 0 when not even one does.
  int parallel_fit(int64_t room, int64_t context, int most) const {
    int p = most;
    while (p >= 1 && !fits(p, context, room)) --p;
    return p;
  }
  // The room for sessions once the fixed parts and the snapshots under `budget` are counted (may be negative).
  int64_t room(int64_t budget) const { return available() - fixed() - snapshots(budget); }
  // Sequences of `context` tokens that `room` holds, each with its own session and verify states.
  int64_t sequences_fit(int64_t room, int64_t context) const {
    return room <= 0 ? 0 : room / (session(context) + verify());
  }
  // The longest context each of `n` sessions gets in `room` beside the verify states of `parallel` sequences: the
  // model's positions when they fit, else a multiple of the step; 0 when not even one step fits.
  int64_t context_fit(int64_t room, int n, int parallel) const {
    room -= verifies(parallel);
    if (n <= 0 || room <= 0) return 0;
    const int64_t kv_room = room / n / kMemoryPlanAllocationGranule * kMemoryPlanAllocationGranule - in_.state_bytes;
    if (kv_room < 0) return 0;
    if (in_.kv_token_bytes <= 0 || kv_room / in_.kv_token_bytes >= in_.max_context) return in_.max_context;
    return kv_room / in_.kv_token_bytes / kMemoryPlanContextStep * kMemoryPlanContextStep;
  }

  // "21.49 GB (weights 19.51 GB + scratch 1.30 GB + 1 session of 4,096 tokens 0.15 GB + ...)" for `parallel`
  // sequences.
  std::string need_text(int parallel, int64_t context, int64_t budget) const {
    const int n = sessions(parallel);
    std::string s = concat(memory_size_text(fixed() + n * session(context) + verifies(parallel) + snapshots(budget)),
                           " (weights ", memory_size_text(in_.weights_bytes), " + scratch ",
                           memory_size_text(in_.scratch_bytes), " + ", sessions_text(n), " of ", count_text(context),
                           " tokens x ", memory_size_text(session(context)));
    if (verify() > 0) s += concat(" + ", verify_text(parallel));
    if (cache()) s += " + prefix cache snapshots " + memory_size_text(snapshots(budget));
    return s + " + reserve " + memory_size_text(in_.reserve_bytes) + ")";
  }
  // "4 x speculative decoding's verify states 535.8 MB"
  std::string verify_text(int parallel) const {
    return concat(count_text(parallel), " x speculative decoding's verify states ", memory_size_text(verify()));
  }
  // "24.00 GB (--gpu-memory; 139.20 GB free of 143.77 GB)"
  std::string available_text() const {
    const std::string device = concat(memory_size_text(in_.free_bytes), " free of ", memory_size_text(in_.total_bytes));
    if (in_.cap_bytes <= 0) return concat(memory_size_text(available()), " (the GPU's free memory, of ",
                                          memory_size_text(in_.total_bytes), ")");
    if (in_.cap_bytes <= in_.free_bytes)
      return concat(memory_size_text(available()), " (--gpu-memory; ", device, ")");
    return concat(memory_size_text(available()), " (the free memory: --gpu-memory ", memory_size_text(in_.cap_bytes),
                  " is more than the ", device, ")");
  }

  // Throws the refusal of `parallel` sequences of `context` tokens, with what would fit.
  [[noreturn]] void refuse(int parallel, int64_t context, int64_t budget, const std::string& why) const {
    const int n = sessions(parallel);
    const int64_t space = room(budget);
    std::vector<std::string> fits;
    const int k = parallel_fit(space, context, parallel);
    // The given cache sessions do not fit beside even one sequence's verify states.
    const bool slots_bind =
        cache() && in_.cache_slots_given && in_.cache_slots * session(context) + verifies(1) > space;
    if (!in_.parallel_flag.empty() && !slots_bind && k >= 1 && k < parallel)
      fits.push_back(concat(in_.parallel_flag, " ", k, " fits at this context"));
    if (const int64_t c = context_fit(space, n, parallel); c > 0 && !in_.context_flag.empty())
      fits.push_back(concat(in_.context_flag, " ", c, " fits ", n == parallel ? sequences_text(n) : sessions_text(n)));
    else if (c > 0)
      fits.push_back(concat(n == parallel ? sequences_text(n) : sessions_text(n), " of ", count_text(c), " tokens ",
                            n == 1 ? "fits" : "fit"));
    if (fits.empty() && available() <= fixed() + snapshots(budget))
      fits.push_back(concat("the weights, scratch and reserve alone need ", memory_size_text(fixed()),
                            cache() ? concat(" and the prefix cache's snapshots ", memory_size_text(snapshots(budget)))
                                    : std::string()));
    else if (fits.empty())
      fits.push_back(concat("not even one sequence of ", count_text(kMemoryPlanContextStep), " tokens fits"));
    if (cache() && in_.snapshot_budget_given && in_.snapshot_budget > 0) fits.push_back("a smaller --cache-gpu-mb");
    if (slots_bind) fits.push_back("fewer --cache-slots");
    std::string advice;
    for (size_t i = 0; i < fits.size(); ++i) advice += (i == 0 ? "" : i + 1 == fits.size() ? "; or " : "; ") + fits[i];
    TERN_FAIL(sequences_text(parallel), " of ", count_text(context), " tokens", why,
              parallel == 1 ? " does not fit in GPU memory: it needs " : " do not fit in GPU memory: they need ",
              need_text(parallel, context, budget), " but ", available_text(), " is available: ", advice);
  }

 private:
  const MemoryPlanInput& in_;
};

}  // namespace

MemoryPlan memory_plan(const MemoryPlanInput& in) {
  TERN_CHECK(in.max_context > 0, "memory plan: the model's positions must be positive, got ", in.max_context);
  TERN_CHECK(in.free_bytes >= 0 && in.total_bytes >= 0 && in.cap_bytes >= 0, "memory plan: negative device sizes");
  TERN_CHECK(in.weights_bytes >= 0 && in.scratch_bytes >= 0 && in.state_bytes >= 0 && in.kv_token_bytes >= 0 &&
                 in.reserve_bytes >= 0 && in.snapshot_budget >= 0 && in.verify_bytes >= 0,
             "memory plan: negative model sizes");
  TERN_CHECK(in.context >= 0 && in.context <= in.max_context, "memory plan: a context of ", in.context,
             " tokens is outside the model's ", in.max_context, " positions");
  TERN_CHECK(in.parallel >= 0 && in.default_parallel >= 1 && in.cache_slots >= 0,
             "memory plan: bad sequence counts");
  const Sizes s(in);
  const int64_t min_context = std::min(kMemoryPlanMinContext, in.max_context);
  const int64_t budget_asked = in.snapshot_budget_given ? in.snapshot_budget : 0;  // a default gives way first
  const int64_t room = s.room(budget_asked);
  MemoryPlan plan;
  plan.input = in;
  plan.available_bytes = s.available();

  int p = 0;
  int64_t c = 0;
  if (in.context > 0) {  // the context as given
    c = in.context;
    if (in.parallel > 0) {
      p = in.parallel;
      if (!s.fits(p, c, room)) s.refuse(p, c, budget_asked, "");
    } else {
      p = s.parallel_fit(room, c, in.default_parallel);
      if (p == 0)
        s.refuse(int(std::clamp<int64_t>(s.sequences_fit(room, c), 1, in.default_parallel)), c, budget_asked, "");
      if (p < in.default_parallel)
        plan.notes.push_back(concat(in.parallel_flag, " ", p, ": ", sequences_text(in.default_parallel), " of ",
                                    count_text(c), " tokens do not fit"));
    }
  } else if (in.parallel > 0) {  // the sequences as given, the longest context they hold
    p = in.parallel;
    c = s.context_fit(room, s.sessions(p), p);
    if (c < min_context) s.refuse(p, min_context, budget_asked, " (the shortest context the plan chooses)");
  } else {
    // Both chosen: the most sequences (up to the default) that still hold the target context each, else the longest
    // context; fewer sequences only where that buys context.
    const int64_t target = std::min(kMemoryPlanParallelContext, in.max_context);
    const int64_t longest = s.context_fit(room, s.sessions(1), 1);
    for (p = in.default_parallel; p > 1; --p) {
      c = s.context_fit(room, s.sessions(p), p);
      if (c >= target || c >= longest) break;
    }
    if (p == 1) c = longest;
    if (c < min_context) s.refuse(1, min_context, budget_asked, " (the shortest context the plan chooses)");
    if (p < in.default_parallel)
      plan.notes.push_back(concat(in.parallel_flag, " ", p, ": ", sequences_text(in.default_parallel),
                                  " would hold fewer than ", count_text(target), " tokens each"));
  }

  // What is left goes to the prefix cache: first its sessions beyond the running ones, then its snapshots.
  const int64_t one = s.session(c);
  int sessions = s.sessions(p);
  int64_t left = room - sessions * one - s.verifies(p);
  if (s.cache() && !in.cache_slots_given && in.cache_slots > sessions) {
    const int64_t more = std::clamp<int64_t>(left / one, 0, in.cache_slots - sessions);
    if (sessions + more < in.cache_slots)
      plan.notes.push_back(concat("prefix cache: ", sessions_text(sessions + more), ", not ", in.cache_slots,
                                  " (conversations kept for reuse, each with its own context)"));
    sessions += int(more);
    left -= more * one;
  }
  int64_t budget = budget_asked;
  if (s.cache() && !in.snapshot_budget_given) {
    const int64_t buffers = s.snapshot_buffer() > 0 ? std::max<int64_t>(0, left / s.snapshot_buffer()) : 0;
    budget = std::min(in.snapshot_budget, buffers * in.state_bytes);
    if (budget == 0 && in.snapshot_budget > 0)
      plan.notes.push_back(concat("prefix cache: snapshots in host memory only (no room for ",
                                  memory_size_text(in.snapshot_budget), " of them in GPU memory)"));
    else if (budget < in.snapshot_budget)
      plan.notes.push_back(concat("prefix cache: ", memory_size_text(budget), " of snapshots in GPU memory, not ",
                                  memory_size_text(in.snapshot_budget), " (the others in host memory)"));
  }

  plan.context = c;
  plan.parallel = p;
  plan.sessions = sessions;
  plan.snapshot_budget = budget;
  plan.session_bytes = one;
  plan.snapshot_bytes = s.snapshots(budget);
  plan.verify_bytes = s.verifies(p);
  plan.total_bytes = s.fixed() + sessions * one + plan.verify_bytes + plan.snapshot_bytes;
  TERN_INTERNAL_CHECK(plan.total_bytes <= plan.available_bytes, "memory plan: ", plan.total_bytes, " bytes planned in ",
                      plan.available_bytes);
  return plan;
}

void memory_plan_check_weights(int64_t weights_bytes, const MemoryPlanInput& device) {
  const Sizes s(device);
  const int64_t need = weights_bytes + device.reserve_bytes;
  TERN_CHECK(need <= s.available(), "the model's weights do not fit in GPU memory: they need ",
             memory_size_text(weights_bytes), " (with the reserve of ", memory_size_text(device.reserve_bytes),
             ": ", memory_size_text(need), ", before any context) but ", s.available_text(), " is available");
}

std::vector<std::string> memory_plan_describe(const MemoryPlan& plan) {
  const MemoryPlanInput& in = plan.input;
  const Sizes s(in);
  std::vector<std::string> lines;
  lines.push_back(concat("context ", count_text(plan.context), " tokens x ", sequences_text(plan.parallel),
                         " at once: ", memory_size_text(plan.total_bytes), " planned of ", s.available_text()));
  std::string items = concat("  weights ", memory_size_text(in.weights_bytes), " + scratch ",
                             memory_size_text(in.scratch_bytes), " + ", sessions_text(plan.sessions), " x ",
                             memory_size_text(plan.session_bytes), " (KV cache ", kv_dtype_name(in.kv_dtype), " ",
                             count_text(in.kv_token_bytes), " B/token, Gated DeltaNet state ",
                             memory_size_text(in.state_bytes), ")");
  if (plan.verify_bytes > 0)  // per running sequence, held from a verify step to the sequence's next step
    items += concat(" + ", s.verify_text(plan.parallel), " (Gated DeltaNet states kept by a verify step)");
  if (s.cache())
    items += concat(" + prefix cache snapshots ", memory_size_text(plan.snapshot_bytes),
                    plan.snapshot_budget > 0
                        ? concat(" (", memory_size_text(plan.snapshot_budget), " kept and ", kMemoryPlanSnapshotSpares,
                                 " spare buffers)")
                        : concat(" (", kMemoryPlanSnapshotSpares,
                                 " spare buffers: the snapshots are kept in host memory)"));
  lines.push_back(items + " + reserve " + memory_size_text(in.reserve_bytes));
  for (const std::string& note : plan.notes) lines.push_back("  " + note);
  return lines;
}

int64_t memory_size_parse(const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double x = std::strtod(begin, &end);
  TERN_CHECK(end != begin, "'", text, "' is not a size (a number of GB, e.g. 24 or 23.5; or with a unit: 24GiB, "
                           "24576MiB)");
  std::string unit;
  for (const char* p = end; *p; ++p)
    if (!std::isspace(static_cast<unsigned char>(*p))) unit += char(std::tolower(static_cast<unsigned char>(*p)));
  double scale = 0;
  if (unit.empty() || unit == "gb" || unit == "g") scale = 1e9;
  else if (unit == "gib") scale = double(int64_t(1) << 30);
  else if (unit == "mb" || unit == "m") scale = 1e6;
  else if (unit == "mib") scale = double(int64_t(1) << 20);
  TERN_CHECK(scale > 0, "'", text, "' has an unknown unit '", unit, "' (GB, GiB, MB or MiB; none: GB)");
  TERN_CHECK(std::isfinite(x), "'", text, "' is not a finite size");
  TERN_CHECK(x > 0, "'", text, "' must be more than 0");
  const double bytes = x * scale;
  TERN_CHECK(bytes >= 1e6, "'", text, "' is less than 1 MB");
  TERN_CHECK(bytes <= 1e15, "'", text, "' is more than any GPU holds");
  return int64_t(bytes);
}

std::string token_count_text(int64_t tokens) { return count_text(tokens); }

std::string memory_size_text(int64_t bytes) {
  char buf[48];
  if (bytes >= 1000000000 || bytes <= -1000000000) std::snprintf(buf, sizeof buf, "%.2f GB", double(bytes) / 1e9);
  else std::snprintf(buf, sizeof buf, "%.1f MB", double(bytes) / 1e6);
  return buf;
}

}  // namespace tern
