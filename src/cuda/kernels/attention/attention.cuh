// Gated full attention (model.md §2.5): q/k RMSNorm + partial rotate-half RoPE + KV-cache append (attn_prepare),
// then causal attention over the KV cache (AttnDims::kv: fp16, bf16 or fp8) with the sigmoid output gate
// (attention). Positions live in device
// memory (*pos0 = tokens already in the cache), so a decode step needs no host value and replays in a CUDA graph.
//
// attention() picks one of two tensor-core paths (mma.sync m16n8k16 on 16-bit inputs, fp32 accumulation, online
// softmax in fp32):
//   - prefill (T > 8): flash attention, one block per (query head, 64 new tokens), K/V tiles of 64 keys;
//   - decode (T <= 8): split-KV flash decoding, one block per (KV head, split) holding the T·(Hq/Hkv) query rows
//     of that KV head, then a merge kernel that applies the gate. The split count is fixed by the device and the
//     cache capacity (never by the current length), each split finds its key range from *pos0 on the device.
// attn_prepare_batched and attention_batched run one token of each of B sequences (the batched decode step) through
// the same kernels, each sequence with its own position, cache and split count, bit for bit as it runs alone.
// Head dims 64, 128 and 256 are supported. q and the softmax weights are rounded to the tensor cores' 16-bit type
// (the cache's for fp16 and bf16; fp16 for fp8). fp16 (the runner's default) keeps 11 significant bits against
// bf16's 8: on a model at trained scales the attention layers' rounding was the floor of the whole model's error
// against an fp32 reference (docs/benchmarks.md); magnitudes past 65504 saturate to ±65504 when stored (q and k are
// RMS-normed; v would have to be that large), NaN stays NaN (so it reaches the output).
//
// The fp8 cache (KvDtype::fp8, half the bytes): each row (one token's K or V of one KV head, dh values) is dh e4m3fn
// bytes and an fp32 scale = amax(|row|) / 448 (NaN ignored, ±inf counted as FLT_MAX); byte = e4m3(x / scale),
// round to nearest even, past ±448 saturated; a row of zeros has scale 0 and reads back zeros; NaN stays NaN (code
// 0x7f). K is quantised after its norm and RoPE. The kernels dequantise as they load a tile into shared memory,
// fp16(e4m3 · scale) (the product rounded to fp32, then to fp16), and run the fp16 path's mma on it. core/fp8.h is
// the CPU twin of the quantiser.
//
// The i16 cache (KvDtype::i16, fp16's bytes and a scale a row; --kv-dtype i16): each row is dh int16 values and an
// fp32 scale = amax(|row|) / 32767 (±inf counted as FLT_MAX; NaN when the row holds a NaN, which then reads back NaN);
// value = rint(x / scale), nearest even, clamped to ±32767; a row of zeros has scale 0. The kernels hold the rows'
// integers as exact fp16 hi + lo pairs, q and the softmax weights as fp16 hi + lo (~22 significant bits), and sum
// the pairs' products on the tensor cores (the prefill hi·hi + hi·lo + lo·hi, the decode all four); the scores are
// multiplied by their keys' K scales, the weights by their keys' V scales over the tile's power of two
// (attention_i16_tiles.cuh). The prefill needs 2.3 times the fp16 path's shared memory at head dim 256, one block an
// SM (attention_check refuses the cache where it does not fit); no items-per-block form. core/kv_i16.h is the CPU
// twin.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "model/kv_dtype.h"

namespace tern::cuda {

struct AttnDims {
  int64_t T = 0;        // new tokens
  int Hq = 16, Hkv = 2, dh = 256, rot = 64;
  float theta = 1e7f;
  float eps = 1e-6f;
  int64_t capacity = 0; // KV cache length
  KvDtype kv = KvDtype::bf16;  // the cache's type (q and the softmax weights: fp16, or bf16 with a bf16 cache)
};

// One layer's K (or V) cache, `capacity` rows per KV head: [Hkv, capacity, dh] 16-bit values (fp16, bf16), or for fp8
// [Hkv, capacity, dh] e4m3 bytes followed by the rows' fp32 scales [Hkv, capacity] at byte attn_row_scales_offset.
// i16: [Hkv, capacity, dh] int16 values, then the rows' fp32 scales [Hkv, capacity] at byte attn_row_scales_offset.
inline int64_t attn_row_scales_offset(KvDtype kv, int Hkv, int64_t capacity, int dh) {
  return int64_t(Hkv) * capacity * dh * kv_value_bytes(kv);
}
inline int64_t attn_cache_bytes(KvDtype kv, int Hkv, int64_t capacity, int dh) {
  return int64_t(Hkv) * capacity * kv_row_bytes(kv, dh);
}

// The rotary positions of the new tokens when they are not their cache positions (M-RoPE after images;
// docs/architecture.md, "Images in the language model"). Token t rotates at pos0 + t + *delta on every axis, or, with
// `axes`, at its own (t, h, w) positions: rotary pair i takes axis h when i % 3 == 1 and i < 3·section[1], axis w
// when i % 3 == 2 and i < 3·section[2], else axis t (interleaved M-RoPE, cpu::mrope_angles). A token whose three
// positions are equal rotates exactly as a token at that one position. Both are device memory, read after the
// kernel's pdl_wait (written by copies before the launch, or by an earlier kernel). The cache row stays pos0 + t.
struct AttnRope {
  const int* delta = nullptr;  // [1]: the session's M-RoPE delta (Session::rope_delta); null: 0
  const int* axes = nullptr;   // [T, 3]: token t's (t, h, w) positions, in place of pos0 + t + delta; null: none
  int section[3] = {0, 0, 0};  // mrope_section (read only with axes)
};

// qg [T, Hq·2·dh] (per head [q | gate]), k, v [T, Hkv·dh] ->
//   q_out [T, Hq, dh] = rope(rmsnorm(q)·q_norm), cache_k[kvh][pos0+t] = rope(rmsnorm(k)·k_norm), cache_v[..] = v, in
//   the cache's type (d.kv; fp8: the row's bytes and scale).
// cache_k, cache_v: attn_cache_bytes(d.kv, Hkv, capacity, dh) each. Head dims 64, 128, 256; rotary dims 0 or a power
// of two from 16 to min(dh, 128) (anything else: tern::Error). rope: the rotary positions when they are not pos0 + t
// (AttnRope).
void attn_prepare(const float* qg, const float* k, const float* v, const float* q_norm, const float* k_norm,
                  const int* pos0, const AttnDims& d, float* q_out, void* cache_k, void* cache_v,
                  cudaStream_t stream, const AttnRope& rope = {});

// Floats of scratch (`partial` below) that attention() needs for any call of at most T new tokens, at any capacity:
// the decode split partials o [min(T,8), Hq, splits, dh], m and l [min(T,8), Hq, splits] for up to
// kAttnMaxSplits splits. The prefill path needs none.
constexpr int kAttnMaxSplits = 128;
int64_t attn_partial_floats(int64_t T, int Hq, int dh);
// The former signature, kept until the runner calls the one above: `splits` is ignored (same value).
inline int64_t attn_partial_floats(int64_t T, int Hq, int dh, int /*splits*/) { return attn_partial_floats(T, Hq, dh); }

// Reads the device (SM count, shared memory) and sets the kernels' shared-memory attributes, once per process.
// attention() calls it on first use; call it before capturing a CUDA graph (e.g. when the runner starts) so that
// no attribute is set while a stream is capturing.
void attention_init();

// Throws tern::Error naming what the kernels do not take in d's head shapes (head dim, rotary dims, query heads per
// KV head) or, for an i16 cache, this device's shared memory (reads the device); T and capacity are not looked at.
// For a runner to refuse a model when it loads, not at its first step.
void attention_check(const AttnDims& d);

// out [T, Hq·dh] = softmax(q·Kᵀ/√dh, causal over positions 0..pos0+t) · V, times sigmoid(gate) from qg.
// q fp32 [T, Hq, dh] (from attn_prepare); cache rows [0, pos0 + T) must be written; partial: attn_partial_floats.
// Decode (T <= 8) reads *pos0 and the cache rows before pos0 before its pdl_wait (launch.cuh), overlapping their
// loads with the kernel before it: that kernel must be attn_prepare (which triggers only after its own wait) or
// work that is not a kernel launched with PDL; pos0 and rows < pos0 must not be written by the kernel just before.
void attention(const float* q, const float* qg, const void* cache_k, const void* cache_v, const int* pos0,
               const AttnDims& d, float* partial, float* out, cudaStream_t stream);

// ---- a batch of sequences, one token each (the batched decode step, issue 31) ----
// Where each sequence's cache and position are: device arrays of B entries, filled by the caller before the launch
// (they may change between replays of a captured graph). The decode kernels read them before their pdl_wait, so they
// are launch constants of the step: written by a copy before it, never by the kernel just before these calls. The
// sequences' caches are distinct (attention_batched reads rows below a sequence's position before its pdl_wait, as
// attention() does: attn_prepare_batched writes only each sequence's row at its position).
struct AttnBatch {
  int B = 1;                          // 1..32
  int64_t ld_qkv = 0;                 // row stride (floats) of qg, k and v: sequence b's row at + b·ld_qkv;
                                      // at least Hq·2·dh, a multiple of 4
  const int* const* pos0 = nullptr;   // [B] each sequence's position (tokens already in its cache)
  void* const* cache_k = nullptr;     // [B] each sequence's cache, capacity_b rows per head as for attn_prepare
  void* const* cache_v = nullptr;
  const int64_t* capacity = nullptr;  // [B] capacity_b: the rows of sequence b's cache (its d.capacity alone)
  const int* splits = nullptr;        // [B] attn_batch_splits(d with capacity_b) of each sequence (attention_batched)
  // [B] each sequence's M-RoPE delta (AttnRope::delta; attn_prepare_batched, read after its pdl_wait); null: none.
  const int* const* rope_delta = nullptr;
  // The B "sequences" are consecutive tokens of one session (verification of drafts: positions p0, p0 + 1, ...):
  // rows below a sequence's position may be written by this step's attn_prepare_batched, so attention_batched reads
  // no K/V tile before its wait on the kernel before.
  bool one_session = false;
  // attention_batched only (null: none): o_proj's activation tables (dp4a_tables.cuh; qmv_dp4a_mma_scratch_bytes(B,
  // Hq·dh) bytes, 16-byte aligned), row b's in token slot b % 8 of tile b / 8, without a norm (rinv 1), written by the
  // merge kernel beside out.
  uint8_t* out_tables = nullptr;
};
// The decode split count attention() uses for one token of a sequence whose cache has d.capacity rows, so that
// the batched kernels split each sequence exactly as it is split alone. 1..kAttnMaxSplits; never more for a smaller
// capacity. Reads the device (attention_init) on first use.
int attn_batch_splits(const AttnDims& d);
// Floats of `partial` scratch attention_batched needs for B sequences: room for kAttnMaxSplits splits each,
// B·Hq·kAttnMaxSplits·(dh + 2) = B · attn_partial_floats(1, Hq, dh).
int64_t attn_batch_partial_floats(int B, int Hq, int dh);
// attn_prepare for B sequences, one token each (d.T = 1, d.capacity ignored: batch.capacity is each sequence's):
// qg/k/v rows b at + b·ld_qkv; q_out [B, Hq, dh]; sequence b's k, v rows written at position *pos0[b] of its cache.
// Each sequence bit for bit as attn_prepare alone (the same kernel). batch.splits is not read.
void attn_prepare_batched(const float* qg, const float* k, const float* v, const float* q_norm, const float* k_norm,
                          const AttnBatch& batch, const AttnDims& d, float* q_out, cudaStream_t stream);
// attention for B sequences, one token each (d.T = 1; d.capacity: at least the largest of the sequences', it sets the
// grid's split columns, attn_batch_splits(d): a sequence with more splits than that traps): q [B, Hq, dh] from
// attn_prepare_batched, the gate from qg rows b at + b·ld_qkv; out [B, Hq·dh]. Each sequence bit for bit as
// attention() alone with its own cache, position and capacity (its own split count: the same kernels, a sequence's
// columns past its count exit at once). partial: attn_batch_partial_floats(B, ...) floats. Needs Hq/Hkv <= 64 (the
// decode path of one token).
void attention_batched(const float* q, const float* qg, const AttnBatch& batch, const AttnDims& d, float* partial,
                       float* out, cudaStream_t stream);

// attention_batched's items-per-block form (opt-in pending measurement; attention_decode.cu, "items-per-block form"):
// from two sequences on, one block runs several (sequence, KV head, split) work items in turn, copying the next
// item's first K/V tiles while it finishes the current one, in place of one block per item. The same bits as the
// default (each item's arithmetic is the same code). TERN_ATTN_BATCH_ITEMS, read at the first batched call: unset or
// 0 off; `auto` one wave of resident blocks; N (>= 1) about N items per block. Where the form does not fit the
// device's shared memory (it needs two 66 KB stages at dh 256) or for more than 16 query rows per KV head, the
// default kernel runs. attn_batch_set_items (tests; outside graph capture) sets it: 0, kAttnBatchItemsAuto or N.
constexpr int kAttnBatchItemsAuto = -1;
void attn_batch_set_items(int items);
int attn_batch_items();
// How many items-per-block launches this process has made (tests: that the form ran where the device has it).
int64_t attn_batch_items_launches();
// Whether this device runs the items-per-block form for heads of dh (up to 16 query rows per KV head): its ring of at
// least two stages fits the shared memory. Reads the device (attention_init) on first use.
bool attn_batch_items_available(int dh);
// Tests: the items-per-block form's ring at `stages` (2 or 3) where the device allows that many, so that the two-stage
// ring of A100-class devices also runs on Hopper; 0: the device's choice (3 where they fit, else 2). Outside capture.
void attn_batch_set_items_stages(int stages);
int attn_batch_items_stages();

// attention()'s prefill on Hopper's warpgroup MMA (head dim 256; fp16, bf16 and i16 caches: the same arithmetic as the
// mma.sync kernels', in another order of the tensor cores' sums; the i16 cache's V tiles' powers of two over 32 keys
// instead of 64) is the default where this device and binary run it (attn_prefill_wgmma_available, for a cache type).
// TERN_ATTN_PREFILL_WGMMA=0, or attn_prefill_set_wgmma(false) (tests; outside capture), keeps the mma.sync kernels.
void attn_prefill_set_wgmma(bool on);
bool attn_prefill_wgmma();  // the switch (true unless set off)
bool attn_prefill_wgmma_available(KvDtype kv);
// The i16 cache's warpgroup kernel with its K tile's hi and lo planes stacked into one m64n64k16 operand
// (attention_prefill_wgmma.cu): the default; TERN_ATTN_PREFILL_I16_STACK=0 or attn_prefill_set_i16_stack(false)
// (tests; outside capture) takes three m64n32k16 products a k-step.
void attn_prefill_set_i16_stack(bool on);
bool attn_prefill_i16_stack();

}  // namespace tern::cuda
