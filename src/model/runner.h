// What a backend offers the engine: sessions that own their caches, and a forward pass over them.
// The CPU backend (src/cpu) and the CUDA backend (src/cuda) implement this; the engine and server see only it.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/image_input.h"
#include "model/weights.h"

namespace tern {

// A copy of a session's recurrent state at one position: the conv and recurrent states of every Gated DeltaNet
// layer and the position. The attention layers' KV cache is NOT part of it: it stays in place in the session,
// where rows [0, position) are reused as they are when the snapshot is restored (multi-turn prefix reuse).
// Made by Session::snapshot(); its memory lives on the backend's device (GPU memory for CUDA) until to_host()
// moves it to (pinned) host memory; to_device() moves it back. Restoring works from either place.
class StateSnapshot {
 public:
  virtual ~StateSnapshot() = default;
  virtual int64_t position() const = 0;  // tokens the session had consumed when the snapshot was taken
  virtual size_t bytes() const = 0;      // memory it holds (wherever it is)
  virtual bool on_host() const = 0;      // true after to_host() (until to_device())
  virtual void to_host() = 0;            // no-op when already there
  virtual void to_device() = 0;          // no-op when already there
};

// Per-sequence state: KV cache of the attention layers, conv and recurrent state of the Gated DeltaNet layers,
// and the number of tokens consumed. Created by a runner; only that runner may use it.
class Session {
 public:
  virtual ~Session() = default;
  virtual int64_t position() const = 0;   // tokens consumed so far (= next RoPE position before any image)
  virtual int64_t capacity() const = 0;   // maximum tokens (context size)
  virtual void reset() = 0;               // back to an empty sequence; buffers kept
  // M-RoPE (images): a text token fed now sits at rotary position position() + rope_delta() on every axis. 0 until
  // an image's tokens ran; each image moves it by its grid's advance minus its token count (transformers'
  // rope_deltas). Snapshots keep it; restore() and reset() set it back.
  virtual int64_t rope_delta() const { return 0; }

  // The three below are the prefix cache's (src/engine/prefix_cache.h); a backend without them keeps these
  // defaults (can_snapshot() false: the cache turns itself off; the others throw).
  virtual bool can_snapshot() const { return false; }
  // Captures the Gated DeltaNet states and the position (see StateSnapshot).
  virtual std::unique_ptr<StateSnapshot> snapshot() const {
    throw std::logic_error("this backend's sessions have no snapshots");
  }
  // Sets the position back to snap.position() and the Gated DeltaNet states to the snapshot's. The KV cache is
  // kept: the caller guarantees that this session's KV rows [0, snap.position()) hold the same tokens as when the
  // snapshot was taken (the session may have run other tokens after them since: rows from the position on are
  // simply overwritten by the next forward). `snap` must come from a session of the same runner. Throws
  // tern::Error when it does not, or when its position exceeds this session's capacity.
  virtual void restore(const StateSnapshot& snap) {
    throw std::logic_error("this backend's sessions have no snapshots");
  }
  // Copies the KV rows [0, n) of `from` (a session of the same runner) into this session's KV cache, so that a
  // snapshot of `from` at a position <= n can be restored here (a conversation forked into a second session).
  // Leaves the position and the Gated DeltaNet states alone. Throws tern::Error when n exceeds either capacity.
  virtual void copy_kv_prefix(const Session& from, int64_t n) {
    throw std::logic_error("this backend's sessions cannot copy their KV cache");
  }
  // A snapshot from inside a forward call (where ModelRunner::keeps_state_inside says the call honours it): the next
  // forward call on this session, whose tokens must hold `position` strictly inside (position() < position <
  // position() + tokens), also captures the Gated DeltaNet states at `position` as a snapshot, the very states a call
  // that stopped there would leave; take_kept_snapshot() hands it over. So a prompt need not be cut at a checkpoint
  // (one forward call, one step, fewer) to be snapshotted there. Throws tern::Error for a position not past position().
  virtual void keep_state_at(int64_t position) {
    throw std::logic_error("this backend's sessions cannot keep a state inside a forward call");
  }
  // The snapshot the last forward call kept (keep_state_at), once; null when it kept none (it did not cover the
  // position, or the backend did not honour it). Any later forward, reset, restore or rollback drops it.
  virtual std::unique_ptr<StateSnapshot> take_kept_snapshot() { return nullptr; }

  // Layers of a prompt chunk run part way (ModelRunner::forward_layers) that are still to run; 0: none. While some
  // are, position() is that of before the chunk, snapshot() and rollback() refuse (tern::Error), and the next forward
  // call on the session must carry the chunk's tokens (it runs the layers left).
  virtual int layers_pending() const { return 0; }
  // Drops a chunk run part way: the session is again exactly what it was before the chunk's first layers ran (its
  // Gated DeltaNet states bit for bit; KV rows past position() are simply overwritten later). No-op when none.
  // reset() and restore() drop it too.
  virtual void drop_pending_layers() {}

  // Speculative decoding (ModelRunner::supports_verify): after a verify forward (BatchEntry::keep_states, or
  // ModelRunner::forward_verify) that took the session from position p0 to p0 + T, sets it back to `position`
  // (p0 <= position <= p0 + T) exactly: the Gated DeltaNet conv and recurrent states bit for bit those of a run
  // that stopped there, the position `position`; the KV rows from it on are simply overwritten by the next forward.
  // Valid once, right after that forward (any other forward, reset, restore or rollback drops the kept states).
  // Throws tern::Error when no verify forward's states are kept or the position is outside [p0, p0 + T].
  virtual void rollback(int64_t position) {
    throw std::logic_error("this backend's sessions cannot roll back");
  }
};

// Constrained decoding on the device path: the allowed-token bitmask of one decode step. The runner calls fill()
// after it has launched the step's forward and before it samples, so the host's mask work (a grammar walk)
// overlaps the device's forward; the runner then uploads the mask and sets the logits of every id whose bit is
// clear to -inf before sampling.
class TokenMaskSource {
 public:
  virtual ~TokenMaskSource() = default;
  // Bit (id % 32) of words[id / 32] set <=> id may be sampled; ids past the last word are never sampled. An empty
  // span: no mask for this step. The span stays valid until the next fill().
  virtual std::span<const uint32_t> fill() = 0;
};

// Sampling that a backend may run on its device (see ModelRunner::forward_sample). Trivially copyable: backends
// copy it to the device as it is (mask is a host pointer the device never reads).
struct DeviceSampling {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;         // with the step index, determines the draw
  uint64_t step = 0;
  TokenMaskSource* mask = nullptr;  // optional allowed-token mask (constrained decoding); null: every id allowed
};

// One sequence's part of a batched step (ModelRunner::forward_batch): new tokens for a session, and where its output
// goes. Either the next id sampled on the device (`sampling` set and the backend able: `sampled` holds it) or the
// logits in *logits ([tokens.size(), V] when all_logits, else [1, V]), as forward() writes them.
struct BatchEntry {
  Session* session = nullptr;
  std::span<const int32_t> tokens;           // at least one
  bool all_logits = false;
  std::vector<float>* logits = nullptr;      // required unless the device samples
  const DeviceSampling* sampling = nullptr;  // optional: sample the next id on the device
  // Verification of drafts (speculative decoding; needs ModelRunner::supports_verify()): the entry runs as
  // forward_verify does: all_logits ([tokens.size(), V]), sampling ignored, each token's logits bit for bit what
  // feeding the tokens one at a time would give, and the states after every token kept for Session::rollback.
  bool keep_states = false;
  // A verify entry whose ids the device may sample (sampling set without a token mask, and this buffer given): the
  // runner fills it with the id row j's sampler draws (sampling with step + j), as forward_verify_sample does, and
  // leaves *logits alone; else it stays empty and *logits holds the rows.
  std::vector<int32_t>* sampled_rows = nullptr;
  // A prompt chunk holding image tokens: where their embeddings come from (ModelRunner::forward_images). Never with
  // sampling or keep_states.
  std::span<const ImageSpan> images;
  // A prompt chunk of text may run only part of its layers in this step (a long prompt read beside running streams,
  // a share of its work per step): at most this many layers (>= 1; 0: all of them). Where it stops short of the last
  // layer (ModelRunner::forward_layers; the backend must run_layers_apart it), nothing is written and
  // `layers_left` says how many remain; the session's next forward, with the same tokens, goes on from there.
  int layer_limit = 0;
  // Outputs:
  std::optional<int32_t> sampled;            // the id the device sampled (then *logits is not written)
  int layers_left = 0;                       // layer_limit stopped the chunk part way: its layers still to run
  std::exception_ptr error;                  // this entry failed (its session's state is then unknown)
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual std::string backend_name() const = 0;  // "cpu", "cuda"
  virtual const Config& config() const = 0;
  virtual int64_t vocab_real() const = 0;        // ids >= this are padding and never sampled
  // Prompt tokens per forward call for a caller that splits a long prompt (to check for cancellation between
  // calls): the backend's own chunk where it splits longer calls anyway and a shorter call costs more per token.
  virtual int64_t preferred_prefill_chunk() const { return 2048; }

  virtual std::unique_ptr<Session> create_session(int64_t max_context) = 0;
  // Memory a session of max_context tokens takes at most (KV cache, recurrent state), in bytes; 0 when unknown.
  virtual int64_t session_bytes(int64_t max_context) const { return 0; }
  // Memory free for new sessions now (device memory on CUDA, available RAM on the CPU), in bytes; -1 when unknown.
  virtual int64_t free_memory_bytes() const { return -1; }

  // Runs `tokens` through the model, appending them to the session. Writes float32 logits to `logits`:
  // [tokens.size(), V] when all_logits, else [1, V] for the last token. Padding ids are set to -inf.
  // Throws tern::Error if the session would exceed its capacity (nothing is consumed then).
  virtual void forward(Session& session, std::span<const int32_t> tokens, bool all_logits,
                       std::vector<float>& logits) = 0;

  // Optional fast path: forward the tokens and sample the next id on the device, without copying logits to the
  // host. Returns nullopt when the backend has no such path (the engine then samples from forward's logits).
  // A backend that implements it must honour sampling.mask (never return an id whose bit is clear).
  virtual std::optional<int32_t> forward_sample(Session& session, std::span<const int32_t> tokens,
                                                const DeviceSampling& sampling) {
    return std::nullopt;
  }

  // ---- Images (the vision encoder; docs/architecture.md "Images in the language model") -----------------------
  // "" when this runner takes images; else why not, in words a client can read (a 400's message).
  virtual std::string images_unavailable() const {
    return "images are not supported on the " + backend_name() + " backend";
  }
  // The vision encoder on one image: the embeddings of its <|image_pad|> tokens. Throws tern::Error when the pixels
  // do not match their grid, or with images_unavailable() when the runner takes no images.
  virtual ImageEmbeddings encode_image(const ImagePixels& pixels);
  // Sets aside now, for every image up to `max_patches` patches of the encoder (the processor's max_pixels / patch²),
  // the working memory encode_image needs, so that a memory plan made after it counts it and no request meets an
  // allocation failure there. Returns the bytes that memory takes (0: the runner has none to set aside).
  virtual int64_t reserve_image_memory(int64_t max_patches) { return 0; }
  // What reserve_image_memory(max_patches) would hold, without allocating it.
  virtual int64_t image_memory_bytes(int64_t max_patches) const { return 0; }
  // forward(), where the tokens `images` covers are image tokens: their embeddings are the images' rows instead of
  // the token ids', and their rotary positions (and the text's after them) the 3-axis M-RoPE positions
  // (mrope_chunk_positions, from the session's rope_delta). No images: exactly forward(). Throws tern::Error for
  // spans that do not fit the call (image_spans_check), or with images_unavailable(); nothing is consumed then.
  virtual void forward_images(Session& session, std::span<const int32_t> tokens, std::span<const ImageSpan> images,
                              bool all_logits, std::vector<float>& logits);
  // ---- end of images ------------------------------------------------------------------------------------------

  // ---- A prompt chunk in pieces of layers (BatchEntry::layer_limit) ------------------------------------------------
  // Whether forward_layers takes a chunk of `tokens` text tokens on this session now (where a chunk of that length
  // runs the backend's chunked plan, and none of its other sessions holds a chunk part way).
  virtual bool runs_layers_apart(const Session& session, int64_t tokens) const { return false; }
  // Runs the next `layers` layers (>= 1, fewer than the chunk has left) of the prompt chunk `tokens` (text only) on
  // the session, which then holds the chunk part way (Session::layers_pending). The forward call that finishes it
  // (forward, forward_sample or forward_batch with the same tokens) runs the layers left and gives the output of
  // one call over the whole chunk, bit for bit. Throws tern::Error as forward does, or when the tokens are not those
  // of the chunk the session holds part way (nothing is run then).
  virtual void forward_layers(Session& session, std::span<const int32_t> tokens, int layers) {
    throw std::logic_error("this backend runs every chunk through all its layers at once");
  }
  // ---- end of the chunk in pieces ---------------------------------------------------------------------------------

  // Whether a forward call of `tokens` text tokens (no image rows) honours Session::keep_state_at.
  virtual bool keeps_state_inside(int64_t tokens) const { return false; }

  // Speculative decoding: true when forward_verify (and BatchEntry::keep_states) and Session::rollback work.
  virtual bool supports_verify() const { return false; }
  // The most tokens (the fed one and its drafts) one forward_verify takes.
  virtual int64_t max_verify_tokens() const { return int64_t(1) << 20; }
  // Memory (where session_bytes counts: device memory on CUDA, RAM on the CPU) that the states a verify of `tokens`
  // tokens keeps for Session::rollback take, per session, beyond session_bytes, from the verify until the session's
  // next forward or rollback (the memory plan's verify_bytes, engine/memory_plan.h); 0 when none or unknown.
  virtual int64_t verify_state_bytes(int tokens) const { return 0; }
  // Runs `tokens` (a sequence's last sampled id and its drafts) like forward(session, tokens, true, logits) —
  // logits [tokens.size(), V] — with two promises more: row j is bit for bit the logits that feeding tokens[0..j]
  // one forward call at a time would give (so greedy decoding with drafts equals decoding without), and the
  // session keeps the states after every token so that Session::rollback can return to any position in between.
  // Throws tern::Error as forward does (nothing is consumed then).
  virtual void forward_verify(Session& session, std::span<const int32_t> tokens, std::vector<float>& logits) {
    throw std::logic_error("this backend cannot verify drafts");
  }
  // forward_verify with the rows sampled on the device instead of returned: ids[j] is the id forward_sample would
  // return for row j's step with `sampling` at step sampling.step + j (so greedy and seeded draws equal decoding
  // without drafts). sampling.mask must be null. Returns false (nothing run) when the backend has no such path.
  virtual bool forward_verify_sample(Session& session, std::span<const int32_t> tokens, const DeviceSampling& sampling,
                                     std::vector<int32_t>& ids) {
    return false;
  }

  // One step over several sequences: each entry's tokens are appended to its session and its output written (see
  // BatchEntry). Sessions must be distinct. Batch invariance: an entry's output is bit for bit what it would be
  // if it ran alone (forward, or forward_sample with its sampling), whatever the other entries are. A failure is
  // reported in the entry's `error`, not thrown. The default runs the entries one after another.
  virtual void forward_batch(std::span<BatchEntry> batch);

  // ---- The MTP draft head (issue 32; docs/architecture.md "The MTP draft head") ---------------------------------
  // The head pairs the main model's hidden h_t (after the final norm) with the token x_{t+1} at position t of its own
  // KV cache, and predicts x_{t+2}. The engine feeds it every pair whose token is known after each forward (the
  // sequence's positions so far, so that its cache is complete), then drafts: the pair (h_last, sampled token), and
  // further (the head's own output hidden, the drafted token) at the next positions.
  //
  // True when the weights hold the MTP head (ModelWeights::mtp) and this backend runs it.
  virtual bool supports_mtp() const { return false; }
  // The main model's hidden states after the final norm of the session's last forward call, [rows, D], for the
  // positions [*pos0, *pos0 + rows): that call's tokens, preceded by the previous call's last position when the
  // two calls were consecutive (the pair it makes with this call's first token is known only now). After
  // Session::rollback, the rows before the position it returned to (the next call continues from there).
  virtual std::span<const float> mtp_hidden(const Session& session, int64_t* pos0) const {
    throw std::logic_error("this backend has no MTP head");
  }
  // Runs the head over the pairs (hidden[i] [D], tokens[i]) at positions pos0 + i, i < T = tokens.size():
  // hidden[i] is h at position pos0 + i (mtp_hidden's, or the head's own hidden_out of the previous pair when
  // drafting), tokens[i] the token at position pos0 + i + 1. Rows of the head's cache from pos0 on are rewritten
  // (pos0 must not exceed the rows written so far: drafts are simply overwritten by the true pairs later). Writes
  // float32 logits [T, V] when all_logits, else [1, V] of the last pair (padding ids -inf), predicting the token at
  // pos0 + T + 1, and hidden_out [T, D], the head's output hidden of every pair (the next draft step's input).
  virtual void forward_mtp(Session& session, std::span<const float> hidden, std::span<const int32_t> tokens,
                           int64_t pos0, bool all_logits, std::vector<float>& logits, std::vector<float>& hidden_out) {
    throw std::logic_error("this backend has no MTP head");
  }
  // Positions [0, n) of the session's MTP cache are written (forward_mtp may start at any pos0 <= n); reset and
  // restore cut it back to what stays valid.
  virtual int64_t mtp_rows(const Session& session) const { return 0; }
  // ---- end of the MTP draft head ------------------------------------------------------------------------------

  // Named intermediates (e.g. "attn_norm.7") are written under this directory when set (tern logits
  // --dump-activations). Backends that do not support dumping ignore it.
  virtual void set_activation_dump_dir(const std::string& dir) {}
 protected:
  // One entry of forward_batch run alone (forward_sample, else forward), its failure caught into e.error: the
  // default forward_batch runs every entry this way, a backend's own for the entries it does not batch.
  void forward_alone(BatchEntry& e);
  // forward_batch's precondition (an internal error when one session appears twice).
  static void check_distinct_sessions(std::span<const BatchEntry> batch);
};

// How many sessions of max_context tokens the free memory holds now (ModelRunner::session_bytes against
// free_memory_bytes); nullopt when the runner cannot tell.
std::optional<int64_t> sessions_that_fit(const ModelRunner& runner, int64_t max_context);

}  // namespace tern
