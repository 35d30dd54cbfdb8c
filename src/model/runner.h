// What a backend offers the engine: sessions that own their caches, and a forward pass over them.
// The CPU backend (src/cpu) and the CUDA backend (src/cuda) implement this; the engine and server see only it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/weights.h"

namespace tern {

// Per-sequence state: KV cache of the attention layers, conv and recurrent state of the Gated DeltaNet layers,
// and the number of tokens consumed. Created by a runner; only that runner may use it.
class Session {
 public:
  virtual ~Session() = default;
  virtual int64_t position() const = 0;   // tokens consumed so far (= next RoPE position)
  virtual int64_t capacity() const = 0;   // maximum tokens (context size)
  virtual void reset() = 0;               // back to an empty sequence; buffers kept
};

// Sampling that a backend may run on its device (see ModelRunner::forward_sample).
struct DeviceSampling {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;         // with the step index, determines the draw
  uint64_t step = 0;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual std::string backend_name() const = 0;  // "cpu", "cuda"
  virtual const Config& config() const = 0;
  virtual int64_t vocab_real() const = 0;        // ids >= this are padding and never sampled

  virtual std::unique_ptr<Session> create_session(int64_t max_context) = 0;

  // Runs `tokens` through the model, appending them to the session. Writes float32 logits to `logits`:
  // [tokens.size(), V] when all_logits, else [1, V] for the last token. Padding ids are set to -inf.
  // Throws tern::Error if the session would exceed its capacity (nothing is consumed then).
  virtual void forward(Session& session, std::span<const int32_t> tokens, bool all_logits,
                       std::vector<float>& logits) = 0;

  // Optional fast path: forward the tokens and sample the next id on the device, without copying logits to the
  // host. Returns nullopt when the backend has no such path (the engine then samples from forward's logits).
  virtual std::optional<int32_t> forward_sample(Session& session, std::span<const int32_t> tokens,
                                                const DeviceSampling& sampling) {
    return std::nullopt;
  }

  // Named intermediates (e.g. "attn_norm.7") are written under this directory when set (tern logits
  // --dump-activations). Backends that do not support dumping ignore it.
  virtual void set_activation_dump_dir(const std::string& dir) {}
};

}  // namespace tern
