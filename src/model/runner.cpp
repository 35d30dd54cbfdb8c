#include "model/runner.h"

#include "core/check.h"

namespace tern {

void ModelRunner::check_distinct_sessions(std::span<const BatchEntry> batch) {
  for (const BatchEntry& e : batch)
    for (const BatchEntry& f : batch)
      TERN_INTERNAL_CHECK(&e == &f || e.session != f.session, "forward_batch: one session appears twice");
}

void ModelRunner::forward_batch(std::span<BatchEntry> batch) {
  check_distinct_sessions(batch);
  for (BatchEntry& e : batch) forward_alone(e);
}

ImageEmbeddings ModelRunner::encode_image(const ImagePixels&) {
  const std::string why = images_unavailable();  // "" where the runner takes image rows but has no encoder of its own
  throw Error(why.empty() ? "the " + backend_name() + " backend has no vision encoder" : why);
}

void ModelRunner::forward_images(Session& session, std::span<const int32_t> tokens, std::span<const ImageSpan> images,
                                 bool all_logits, std::vector<float>& logits) {
  if (!images.empty()) throw Error(images_unavailable());
  forward(session, tokens, all_logits, logits);
}

void ModelRunner::forward_alone(BatchEntry& e) {
  e.sampled.reset();
  e.error = nullptr;
  e.layers_left = 0;
  try {
    TERN_INTERNAL_CHECK(e.session != nullptr && !e.tokens.empty(), "forward_batch: an entry without a session or tokens");
    if (e.layer_limit > 0) {  // a piece of the chunk's layers, unless the limit reaches its last layer
      TERN_INTERNAL_CHECK(e.images.empty() && !e.keep_states,
                          "forward_batch: a chunk in pieces of layers with images or verify");
      const int pending = e.session->layers_pending();
      const int left = pending > 0 ? pending : config().num_hidden_layers;
      if (e.layer_limit < left) {
        TERN_INTERNAL_CHECK(pending > 0 || runs_layers_apart(*e.session, int64_t(e.tokens.size())),
                            "forward_batch: a chunk in pieces of layers that the backend does not run so");
        forward_layers(*e.session, e.tokens, e.layer_limit);
        e.layers_left = left - e.layer_limit;
        return;
      }
    }
    if (!e.images.empty()) {
      TERN_INTERNAL_CHECK(e.logits != nullptr && !e.keep_states && e.sampling == nullptr,
                          "forward_batch: an entry with images must ask for logits, without sampling or verify");
      forward_images(*e.session, e.tokens, e.images, e.all_logits, *e.logits);
      return;
    }
    if (e.keep_states) {
      if (e.sampled_rows) {
        e.sampled_rows->clear();
        if (e.sampling && !e.sampling->mask && forward_verify_sample(*e.session, e.tokens, *e.sampling, *e.sampled_rows))
          return;
        e.sampled_rows->clear();
      }
      TERN_INTERNAL_CHECK(e.logits != nullptr, "forward_batch: a verify entry without a logits buffer");
      forward_verify(*e.session, e.tokens, *e.logits);
      return;
    }
    if (e.sampling) e.sampled = forward_sample(*e.session, e.tokens, *e.sampling);
    if (!e.sampled) {
      TERN_INTERNAL_CHECK(e.logits != nullptr, "forward_batch: an entry without a logits buffer");
      forward(*e.session, e.tokens, e.all_logits, *e.logits);
    }
  } catch (...) {
    e.error = std::current_exception();
  }
}

std::optional<int64_t> sessions_that_fit(const ModelRunner& runner, int64_t max_context) {
  const int64_t per = runner.session_bytes(max_context), free = runner.free_memory_bytes();
  if (per <= 0 || free < 0) return std::nullopt;
  return free / per;
}

}  // namespace tern
