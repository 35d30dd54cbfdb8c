// The roofline of tern bench: bytes a decode step must move and FLOPs a prefill must compute, from the model's
// config and the formats and shapes of its weights (kernels.md §2). Shapes only: no weight data is read, so
// weights whose matrices live on a device (null host pointers) work too.
//
// Decode, per token at context L:
//   weights: every non-expert matrix, k/E of each stacked expert matrix (k of E experts are read), the LM head,
//            one embedding row, the norm and conv vectors;
//   state:   Gated DeltaNet recurrent state [Hv, dk, dv] and conv state [Ck-1, C], read and written, per layer;
//   KV:      L x Hkv x dh x 2 (K and V) values read per attention layer.
// Prefill of T tokens (logits of the last token only):
//   linear:    2 x (active matrix parameters per token, LM head excluded) x T, plus 2 x V x D for the LM head;
//   attention: 4 x Hq x dh x T(T+1)/2 per attention layer (QKᵀ and PV, causal);
//   GDN:       per token and value head, 6 x dk x dv (state read, update, output) + 2 x 64 x (3 dk + 2 dv) for the
//              intra-chunk products of the chunked form (chunk 64), + 2 x C x Ck for the conv. An approximation.
#pragma once

#include <cstdint>

#include "model/weights.h"

namespace tern {

struct RooflineAssumptions {
  int kv_bytes_per_value = 2;         // 16-bit KV cache (fp16)
  int recurrent_state_bytes = 4;      // fp32 Gated DeltaNet state
  int conv_state_bytes = 2;           // bf16 conv state
  int gdn_chunk = 64;                 // chunk of the chunked Gated DeltaNet prefill
};

struct Roofline {
  double weight_bytes_per_token = 0;  // decode: weights read per token
  double state_bytes_per_token = 0;   // decode: GDN recurrent + conv state, read + written
  double kv_bytes_per_context = 0;    // decode: KV bytes read per token of context (all attention layers)
  double total_weight_bytes = 0;      // every weight (all experts): what a prefill reads at least once
  double linear_flops_per_token = 0;  // prefill: 2 x active matrix parameters, LM head excluded
  double lm_head_flops = 0;           // 2 x V x D, once per prefill
  double gdn_flops_per_token = 0;     // all GDN layers
  double attention_flops_coeff = 0;   // all attention layers: 4 x Hq x dh; times T(T+1)/2 for a prefill of T

  double decode_bytes(double context) const {  // bytes moved by one decode step at this context
    return weight_bytes_per_token + state_bytes_per_token + kv_bytes_per_context * context;
  }
  double prefill_flops(int64_t tokens) const;  // FLOPs of the prefill of `tokens` tokens
};

Roofline roofline_from_weights(const ModelWeights& weights, const RooflineAssumptions& assumptions = {});

// The matrices (shapes and formats, no data) of `config` in the MLX 4-bit layout (model.md §4.2: every matrix
// 4-bit group 64, the router and shared-expert gate 8-bit, vectors fp32): the roofline of weights that live only on
// a device (tern bench --synthetic).
ModelWeights weights_mlx4_shapes(const Config& config);

}  // namespace tern
