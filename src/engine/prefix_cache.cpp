#include "engine/prefix_cache.h"

#include <algorithm>

#include "core/check.h"

namespace tern {

namespace {

int64_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return int64_t(i);
}

// The first position where a slot's images and a prompt's stop being the same images at the same places (the start
// of the first one that differs, in either), or INT64_MAX when they never do.
template <typename Key>
int64_t first_image_difference(std::span<const Key> slot, std::span<const PromptImage> prompt) {
  for (size_t i = 0; i < slot.size() || i < prompt.size(); ++i) {
    const Key* a = i < slot.size() ? &slot[i] : nullptr;
    const PromptImage* b = i < prompt.size() ? &prompt[i] : nullptr;
    if (a && b && a->offset == b->offset && a->tokens == b->tokens && a->hash == b->hash) continue;
    return std::min(a ? a->offset : INT64_MAX, b ? b->offset : INT64_MAX);
  }
  return INT64_MAX;
}

}  // namespace

PrefixCache::PrefixCache(ModelRunner& runner, int64_t context, PrefixCacheOptions options)
    : runner_(runner), context_(context), options_(options) {
  TERN_CHECK(context_ > 0, "prefix cache: the context must be positive, got ", context_);
  TERN_CHECK(options_.snapshot_every >= 0, "--cache-snapshot-every must be >= 0, got ", options_.snapshot_every);
  TERN_CHECK(options_.gpu_bytes >= 0 && options_.host_bytes >= 0, "prefix cache budgets must be >= 0");
  TERN_CHECK(options_.slots >= 1, "--cache-slots must be >= 1, got ", options_.slots);
  Slot& first = new_slot();
  active_ = options_.enabled && first.session->can_snapshot();
  publish();
}

PrefixCache::~PrefixCache() = default;

PrefixCache::Slot& PrefixCache::new_slot() {
  auto slot = std::make_unique<Slot>();
  slot->session = runner_.create_session(context_);
  slots_.push_back(std::move(slot));
  return *slots_.back();
}

void PrefixCache::reserve(int n) {
  TERN_CHECK(n >= 1, "prefix cache: at least one session is needed, got ", n);
  options_.slots = std::max(options_.slots, n);
  while (int(slots_.size()) < n) new_slot();
  publish();
}

PrefixCache::Slot& PrefixCache::slot_of(Session& session) {
  for (auto& s : slots_)
    if (s->session.get() == &session) return *s;
  TERN_INTERNAL_CHECK(false, "prefix cache: the session is not one of the cache's");
  return *slots_.front();
}

void PrefixCache::hold(Slot& slot, std::span<const int32_t> tokens, std::span<const PromptImage> images, int64_t n) {
  slot.tokens.assign(tokens.begin(), tokens.begin() + n);
  slot.images.clear();
  for (const PromptImage& im : images)
    if (im.offset < n) slot.images.push_back({im.offset, im.tokens, im.hash});
}

void PrefixCache::drop_after(Slot& slot, int64_t position) {
  const size_t before = slot.snaps.size();
  std::erase_if(slot.snaps, [&](const Entry& e) { return e.snap->position() > position; });
  counters_.snapshots_dropped += int64_t(before - slot.snaps.size());
}

// An idle slot for a new conversation: one with no snapshots (the least recently used), else a new one while
// fewer than options_.slots exist, else the least recently used idle one (its contents dropped). Null when every
// slot is busy and no more may be made.
PrefixCache::Slot* PrefixCache::idle_slot() {
  Slot* target = nullptr;
  for (auto& sp : slots_)
    if (!sp->busy && sp->snaps.empty() && (!target || sp->last_use < target->last_use)) target = sp.get();
  if (!target && int(slots_.size()) < options_.slots) target = &new_slot();
  if (!target)
    for (auto& sp : slots_)
      if (!sp->busy && (!target || sp->last_use < target->last_use)) target = sp.get();
  if (target) {
    drop_after(*target, 0);
    target->tokens.clear();
    target->images.clear();
  }
  return target;
}

PrefixCache::Lease PrefixCache::begin(std::span<const int32_t> prompt, std::span<const PromptImage> images) {
  ++clock_;
  // Without snapshots (!active_) no slot holds any: every request takes the idle-slot path below.
  const int64_t n = int64_t(prompt.size());
  // The best snapshot: the longest at or before the divergence point, and before the prompt's last token.
  Slot* best = nullptr;
  Entry* best_entry = nullptr;
  int64_t best_common = 0;
  for (auto& sp : slots_) {
    Slot& s = *sp;
    const int64_t common = std::min(common_prefix(s.tokens, prompt),
                                    first_image_difference(std::span<const ImageKey>(s.images), images));
    for (Entry& e : s.snaps) {
      const int64_t p = e.snap->position();
      if (p > 0 && p <= common && p <= n - 1 && (!best_entry || p > best_entry->snap->position())) {
        best = &s;
        best_entry = &e;
        best_common = common;
      }
    }
  }

  if (!best_entry) {
    ++counters_.misses;
    Slot* target = idle_slot();
    TERN_INTERNAL_CHECK(target != nullptr, "prefix cache: every one of the ", options_.slots, " sessions is in use");
    target->session->reset();
    target->busy = true;
    target->last_use = clock_;
    publish();
    return {target->session.get(), 0};
  }

  const int64_t q = best_entry->snap->position();
  best_entry->last_use = clock_;
  const bool loses_snapshots = std::any_of(best->snaps.begin(), best->snaps.end(),
                                           [&](const Entry& e) { return e.snap->position() > best_common; });
  Slot* target = best;
  // Fork: copy the reused KV rows into another session and keep the old conversation whole, when restoring in
  // place would lose snapshots and a slot can be made, or when the slot is busy (another request runs in it: its
  // KV rows [0, q) stay as they are while it appends after them).
  Slot* fork = nullptr;
  if (best->busy) {
    fork = idle_slot();  // never `best` (busy); slots are held by pointer: `best` and `best_entry` stay valid
    TERN_INTERNAL_CHECK(fork != nullptr, "prefix cache: every one of the ", options_.slots, " sessions is in use");
  } else if (loses_snapshots && int(slots_.size()) < options_.slots) {
    fork = &new_slot();
  }
  ++counters_.hits;
  counters_.tokens_reused += q;
  if (fork) {
    fork->session->copy_kv_prefix(*best->session, q);
    fork->session->restore(*best_entry->snap);
    hold(*fork, prompt, images, q);
    target = fork;
  } else {
    drop_after(*best, best_common);
    best->tokens.resize(size_t(best_common));
    std::erase_if(best->images, [&](const ImageKey& k) { return k.offset >= best_common; });
    best->session->restore(*best_entry->snap);
  }
  target->busy = true;
  target->last_use = clock_;
  publish();
  return {target->session.get(), q};
}

void PrefixCache::take_snapshot(Slot& slot) {
  const int64_t pos = slot.session->position();
  if (pos <= 0) return;
  auto it = std::find_if(slot.snaps.begin(), slot.snaps.end(), [&](const Entry& e) { return e.snap->position() >= pos; });
  if (it != slot.snaps.end() && it->snap->position() == pos) {  // already held (same tokens: slot invariant)
    it->last_use = clock_;
    return;
  }
  hold_snapshot(slot, slot.session->snapshot());
}

void PrefixCache::hold_snapshot(Slot& slot, std::unique_ptr<StateSnapshot> snap) {
  const int64_t pos = snap->position();
  TERN_INTERNAL_CHECK(pos > 0 && pos <= int64_t(slot.tokens.size()), "prefix cache: a snapshot at ", pos,
                      " of a slot holding ", slot.tokens.size(), " tokens");
  auto it = std::find_if(slot.snaps.begin(), slot.snaps.end(), [&](const Entry& e) { return e.snap->position() >= pos; });
  if (it != slot.snaps.end() && it->snap->position() == pos) {  // already held (same tokens: slot invariant)
    it->last_use = clock_;
    return;
  }
  Entry e;
  e.snap = std::move(snap);
  e.last_use = ++clock_;  // the newest snapshot is the most recently used
  slot.snaps.insert(it, std::move(e));
  ++counters_.snapshots_taken;
  enforce_budgets();
}

void PrefixCache::checkpoint(Session& session, std::span<const int32_t> prompt, std::span<const PromptImage> images) {
  if (!active_) return;
  Slot& slot = slot_of(session);
  const int64_t pos = session.position();
  TERN_INTERNAL_CHECK(pos <= int64_t(prompt.size()), "prefix cache: checkpoint at ", pos, " past the prompt's ",
                      prompt.size(), " tokens");
  if (pos > int64_t(slot.tokens.size())) hold(slot, prompt, images, pos);
  take_snapshot(slot);
  publish();
}

void PrefixCache::checkpoint_kept(Session& session, std::span<const int32_t> prompt,
                                  std::span<const PromptImage> images) {
  if (!active_) return;
  std::unique_ptr<StateSnapshot> snap = session.take_kept_snapshot();
  if (!snap) return;
  Slot& slot = slot_of(session);
  const int64_t pos = session.position();
  TERN_INTERNAL_CHECK(pos <= int64_t(prompt.size()) && snap->position() < pos, "prefix cache: a kept snapshot at ",
                      snap->position(), " of a session at ", pos, " in a prompt of ", prompt.size(), " tokens");
  if (pos > int64_t(slot.tokens.size())) hold(slot, prompt, images, pos);
  hold_snapshot(slot, std::move(snap));
  publish();
}

void PrefixCache::end(Session& session, std::span<const int32_t> held, bool ok, std::span<const PromptImage> images) {
  Slot& slot = slot_of(session);
  slot.busy = false;
  if (!active_) {  // begin() resets the session before the next request
    publish();
    return;
  }
  if (!ok) {
    drop_after(slot, 0);
    slot.tokens.clear();
    slot.images.clear();
    try {
      session.reset();
    } catch (...) {
    }
    publish();
    return;
  }
  TERN_INTERNAL_CHECK(int64_t(held.size()) == session.position(), "prefix cache: ", held.size(),
                      " tokens held for a session at position ", session.position());
  // The slot's tokens beyond `held` (a prefill cancelled before reaching them) still match: keep the longer.
  if (held.size() >= slot.tokens.size()) hold(slot, held, images, int64_t(held.size()));
  take_snapshot(slot);
  publish();
}

void PrefixCache::enforce_budgets() {
  auto bytes = [&](bool host) {
    int64_t b = 0;
    for (auto& s : slots_)
      for (const Entry& e : s->snaps)
        if (e.snap->on_host() == host) b += int64_t(e.snap->bytes());
    return b;
  };
  // The least recently used snapshot in one place (device or host), or null.
  auto lru = [&](bool host) -> std::pair<Slot*, size_t> {
    Slot* slot = nullptr;
    size_t index = 0;
    uint64_t oldest = UINT64_MAX;
    for (auto& s : slots_)
      for (size_t i = 0; i < s->snaps.size(); ++i) {
        const Entry& e = s->snaps[i];
        if (e.snap->on_host() == host && e.last_use < oldest) {
          oldest = e.last_use;
          slot = s.get();
          index = i;
        }
      }
    return {slot, index};
  };
  int64_t gpu = bytes(false), host = bytes(true);
  while (gpu > options_.gpu_bytes) {
    auto [slot, i] = lru(false);
    if (!slot) break;
    StateSnapshot& snap = *slot->snaps[i].snap;
    const int64_t b = int64_t(snap.bytes());
    gpu -= b;
    if (b <= options_.host_bytes) {
      snap.to_host();
      host += b;
      ++counters_.snapshots_to_host;
    } else {
      slot->snaps.erase(slot->snaps.begin() + ptrdiff_t(i));
      ++counters_.snapshots_dropped;
    }
  }
  while (host > options_.host_bytes) {
    auto [slot, i] = lru(true);
    if (!slot) break;
    host -= int64_t(slot->snaps[i].snap->bytes());
    slot->snaps.erase(slot->snaps.begin() + ptrdiff_t(i));
    ++counters_.snapshots_dropped;
  }
}

void PrefixCache::publish() {
  PrefixCacheStats s = counters_;
  s.snapshots = s.bytes_gpu = s.bytes_host = 0;
  s.sessions = int64_t(slots_.size());
  for (auto& slot : slots_)
    for (const Entry& e : slot->snaps) {
      ++s.snapshots;
      (e.snap->on_host() ? s.bytes_host : s.bytes_gpu) += int64_t(e.snap->bytes());
    }
  std::lock_guard lock(stats_mutex_);
  stats_ = s;
}

PrefixCacheStats PrefixCache::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

}  // namespace tern
