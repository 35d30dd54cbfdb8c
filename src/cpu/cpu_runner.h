// The CPU backend: the reference forward pass of Qwen3.6 (fp32 activations, fp32 accumulation, fp32 recurrent
// state), composed only of the ops in src/cpu/ops_*.h. Runs on f32, bf16 and MLX affine 4/8-bit weights.
#pragma once

#include <memory>
#include <vector>

#include "model/runner.h"

namespace tern {

struct CpuRunnerOptions {
  // Prefill of more than one token uses the chunked Gated DeltaNet form (gdn_chunk tokens per chunk); false uses
  // the recurrent form for every token (the definition; slower).
  bool gdn_chunked = true;
  int gdn_chunk = 64;
};

std::unique_ptr<ModelRunner> cpu_runner_create(std::shared_ptr<const ModelWeights> weights);
std::unique_ptr<ModelRunner> cpu_runner_create(std::shared_ptr<const ModelWeights> weights,
                                               const CpuRunnerOptions& options);

// The Gated DeltaNet conv and recurrent states of every linear-attention layer of a CPU session, back to back (for
// tests that hold states bit for bit, e.g. Session::rollback's). Throws tern::Error for a session of another backend.
std::vector<float> cpu_session_gdn_states(const Session& session);

}  // namespace tern
