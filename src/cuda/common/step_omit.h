// TERN_STEP_OMIT: a timing diagnostic that leaves named kernels out of every step, so that `tern bench` shows what
// each costs in place (the step's time with it minus the step's time without it). That is how a kernel's share of a
// step is measured without a profiler that sees inside CUDA graphs: the kernels overlap under programmatic
// dependent launch, so their own durations add up to more than the step. Every value computed while it is set is
// wrong (a kernel left out leaves its outputs as the last step wrote them); a warning on stderr says so once. Never
// for answers.
//
// The parts, comma-separated (TERN_STEP_OMIT=gdn,router):
//   in        each mixer's first products: the Gated DeltaNet in_proj, attention's q|k|v
//   gdn       gdn_decode (the Gated DeltaNet mixer's core)
//   attention attn_prepare and the split-KV attention with its merge
//   out       each mixer's output product: out_proj, o_proj
//   router    the MoE router (the fused router + gate_up where that runs: with gate_up)
//   gate_up   the MoE gate_up + SwiGLU
//   down      the MoE down + combine
//   head      the LM head (wherever it runs, the prefill's last row included)
//   prequant  the batched products' activation quantisation (qmv_dp4a_prequant_kernel)
//   kept      a verify step's kept states (the Gated DeltaNet states before each token, for a rollback): none
//             written, so a rollback restores wrong states
// With the router left out, every MoE scratch holds a routing drawn once (step_omit_routing: k distinct experts a
// token, as synthetic weights route), so that gate_up and down read as many distinct experts as with the router.
// In the one-token decode plan and the multi-token steps (batched, verify, short calls); the prefill plan's kernels
// are not touched, but for the LM head.
#pragma once

#include <string_view>
#include <vector>

namespace tern::cuda {

enum class StepPart : unsigned {
  in = 1u << 0,
  gdn = 1u << 1,
  attention = 1u << 2,
  out = 1u << 3,
  router = 1u << 4,
  gate_up = 1u << 5,
  down = 1u << 6,
  head = 1u << 7,
  prequant = 1u << 8,
  kept = 1u << 9,
};

// Whether TERN_STEP_OMIT names `part`. Read once: the first call parses the variable, warns if it is set, and throws
// tern::Error naming the parts it knows for a name it does not (no CUDA call: safe inside a graph capture).
bool step_omits(StepPart part);

// The routing that stands in for the router's while it is left out: [T][k] expert ids, each token's k distinct ones
// drawn uniformly from [0, E) with a fixed seed (1 <= k <= E).
std::vector<int> step_omit_routing(int T, int E, int k);
// The parts named by a TERN_STEP_OMIT value (comma-separated, spaces around names ignored) as a mask of StepPart
// bits; throws tern::Error for an unknown name (tests).
unsigned step_omit_parse(std::string_view list);

}  // namespace tern::cuda
