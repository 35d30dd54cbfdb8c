// Multi-turn prefix reuse: the sessions the server generates in, and snapshots of their Gated DeltaNet state, so
// that a request whose prompt starts with tokens already run resumes from there and prefills only the rest.
//
// Design (docs/server.md, "Prefix reuse"):
//   - Slots: up to `slots` sessions, each one conversation's KV cache region (a session's KV rows [0, n) hold the
//     slot's `tokens`). A session is created when a new conversation needs one, so one conversation costs one
//     session, as without the cache.
//   - Snapshots: the Gated DeltaNet conv + recurrent states and the position (StateSnapshot), taken every
//     `snapshot_every` tokens during a prefill, at the end of the prompt, and at the end of the request. A
//     snapshot at position p of a slot is usable while the slot's tokens [0, p) are unchanged: the KV rows it
//     needs are the session's own, reused in place (no copy).
//   - Images: a slot also keeps the images its tokens hold (where they are, the hash of their pixels), and a prompt
//     differs from it at the first token of the first image that is not the same image at the same place: two
//     images of one size make the same <|image_pad|> tokens. A conversation with an image resumes like any other.
//   - A request looks, over every slot, for the longest snapshot at or before the first token where its prompt
//     differs from the slot's tokens (and before the prompt's last token: that one must run to give logits),
//     restores it and prefills the rest. Snapshots past the divergence point are dropped (their KV rows are about
//     to be overwritten) — unless an unused slot is free: then the reused prefix's KV rows are copied into it
//     (Session::copy_kv_prefix) and the old conversation stays whole (a conversation that forks, or two that
//     share a long system prompt).
//   - A prompt that reuses nothing takes a free slot, else a slot with no snapshots, else the least recently used.
//   - Parallel requests (the server's --parallel): a slot is busy from begin() to end() and is never given to
//     another request meanwhile; a busy slot's snapshots are still reused, by copying their KV rows into an idle
//     slot (the running request only writes rows past them). So `slots` must be at least the number of requests
//     that run at once (the engine loop makes it so).
//   - Memory: snapshots live in device memory up to gpu_bytes; beyond it the least recently used move to host
//     memory (pinned on CUDA) up to host_bytes; beyond that the least recently used are dropped. Restoring works
//     from either place. The sessions' own KV memory is not counted in these budgets.
// One thread uses the cache (the server's engine loop); stats() may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "engine/prompt_image.h"
#include "model/runner.h"

namespace tern {

struct PrefixCacheOptions {
  bool enabled = true;                 // false: no snapshots; every request starts from an empty session
  int64_t snapshot_every = 4096;       // snapshot every N prompt tokens during a prefill (0: only at the ends);
                                       // each one splits the prefill call there (4096: the CUDA runner's chunk)
  int64_t gpu_bytes = int64_t(4096) << 20;   // snapshots kept in device memory (RAM on the CPU backend)
  int64_t host_bytes = int64_t(16384) << 20; // snapshots spilled to host memory
  int slots = 4;                       // sessions (conversations with their own KV cache region)
};

struct PrefixCacheStats {
  int64_t hits = 0, misses = 0;        // requests that reused a prefix / reused nothing
  int64_t tokens_reused = 0;           // prompt tokens not recomputed
  int64_t snapshots_taken = 0, snapshots_to_host = 0, snapshots_dropped = 0;
  int64_t snapshots = 0;               // held now
  int64_t bytes_gpu = 0, bytes_host = 0;  // snapshot memory held now
  int64_t sessions = 0;                // slots with a session now
};

class PrefixCache {
 public:
  // `runner` must outlive the cache. context: every session's capacity.
  PrefixCache(ModelRunner& runner, int64_t context, PrefixCacheOptions options);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // True when snapshots are taken (enabled and the backend supports them).
  bool active() const { return active_; }
  const PrefixCacheOptions& options() const { return options_; }

  struct Lease {
    Session* session = nullptr;  // run the request in this session; it holds prompt[0, cached) already
    int64_t cached = 0;
  };
  // Chooses an idle session for `prompt` (with its `images`, GenerationRequest::images) and restores the longest
  // usable snapshot (or resets the session); the session is busy until end(). Throws tern::InternalError when every
  // slot is busy.
  Lease begin(std::span<const int32_t> prompt, std::span<const PromptImage> images = {});
  // During the prefill (GenerationRequest::on_checkpoint): snapshots the session at its position; `prompt` and
  // `images` are the request's (the session holds prompt[0, position)).
  void checkpoint(Session& session, std::span<const int32_t> prompt, std::span<const PromptImage> images = {});
  // After a prompt chunk that kept a state inside (GenerationRequest::on_kept_checkpoint): holds the session's kept
  // snapshot (Session::take_kept_snapshot; nothing when it kept none). Arguments as for checkpoint().
  void checkpoint_kept(Session& session, std::span<const int32_t> prompt, std::span<const PromptImage> images = {});
  // After the request: the session holds `held` (the prompt and the generated tokens that were fed; size =
  // session.position()) and the prompt's `images` that start before its end. ok = false (an error): the session's
  // state is unknown, so the slot is forgotten.
  void end(Session& session, std::span<const int32_t> held, bool ok, std::span<const PromptImage> images = {});

  // Makes sure `n` sessions exist now (raising options().slots to n when lower), so that n requests can run at
  // once and their memory is taken up front. Throws what the backend throws when one cannot be created.
  void reserve(int n);

  PrefixCacheStats stats() const;

 private:
  struct Entry {
    std::unique_ptr<StateSnapshot> snap;
    uint64_t last_use = 0;
  };
  struct ImageKey {                 // an image among a slot's tokens: where, how long, which pixels
    int64_t offset = 0, tokens = 0;
    uint64_t hash = 0;
    bool operator==(const ImageKey&) const = default;
  };
  struct Slot {
    std::unique_ptr<Session> session;
    std::vector<int32_t> tokens;   // what the session's KV rows [0, tokens.size()) hold
    std::vector<ImageKey> images;  // the images among them (offsets below tokens.size()), in order
    std::vector<Entry> snaps;      // sorted by position, positions <= tokens.size()
    uint64_t last_use = 0;
    bool busy = false;             // a request runs in it (between begin() and end())
  };

  Slot& slot_of(Session& session);
  Slot& new_slot();
  Slot* idle_slot();
  void take_snapshot(Slot& slot);
  void hold_snapshot(Slot& slot, std::unique_ptr<StateSnapshot> snap);  // at its position, unless one is there
  void drop_after(Slot& slot, int64_t position);  // snapshots past `position`
  // The slot holds tokens[0, n) and the images that start there.
  static void hold(Slot& slot, std::span<const int32_t> tokens, std::span<const PromptImage> images, int64_t n);
  void enforce_budgets();
  void publish();  // refreshes stats_ (under stats_mutex_)

  ModelRunner& runner_;
  int64_t context_;
  PrefixCacheOptions options_;
  bool active_ = false;
  std::vector<std::unique_ptr<Slot>> slots_;
  uint64_t clock_ = 0;
  PrefixCacheStats counters_;      // the engine thread's copy
  mutable std::mutex stats_mutex_;
  PrefixCacheStats stats_;         // what stats() returns
};

}  // namespace tern
