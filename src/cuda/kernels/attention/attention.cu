// The attention kernels' public entry points (attention.cuh), their one-time setup and the run-time switches. The
// kernels are in one file per family, over the device helpers they share (attention_tiles.cuh: cp.async and ldmatrix
// over swizzled tiles, the 16-bit mma, score masks, online softmax, P·V) and the internal header
// (attention_internal.cuh: Seqs, the setup, the switches, the cross-file calls):
//   attention_prepare.cu  attn_prepare, attn_prepare_batched: norm, RoPE, q out, k and v into the cache
//   attention_prefill.cu  attention()'s flash path, one block per (query head, 64 new tokens)
//   attention_prefill_wgmma.cu  the same on Hopper's warpgroup MMA (head dim 256; fp16, bf16, i16 caches)
//   attention_decode.cu   attention()'s and attention_batched's split-KV decode: the one-item split kernel, the
//                         items-per-block form (TERN_ATTN_BATCH_ITEMS), the merge
// This file picks between the prefill and decode paths and sets both up.
#include "cuda/kernels/attention/attention.cuh"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/kernels/attention/attention_internal.cuh"

namespace tern::cuda {
namespace attn {

// Device properties and kernel attributes, once per process (the first attention call; keep it out of capture).
const AttentionSetup& attention_setup() {
  static const AttentionSetup setup = [] {
    AttentionSetup s;
    int dev = 0;
    TERN_CUDA(cudaGetDevice(&dev));
    TERN_CUDA(cudaDeviceGetAttribute(&s.sms, cudaDevAttrMultiProcessorCount, dev));
    const int optin = smem_optin_bytes();
    s.smem_optin = optin;
    prefill_setup(optin);
    prefill_wgmma_setup(optin);
    decode_setup(s, optin);
    return s;
  }();
  return setup;
}

// TERN_ATTN_KV_EARLY=0: the decode kernel loads no K/V tile before pdl_wait (for comparison).
bool kv_early() {
  static const bool on = !env_is("TERN_ATTN_KV_EARLY", "0");
  return on;
}

// TERN_ATTN_BATCH_STAGES=0: batched launches keep the deep ring (launch_decode's one-stage form off; for comparison).
bool attn_batch_one_stage() {
  static const bool on = !env_is("TERN_ATTN_BATCH_STAGES", "0");
  return on;
}

// TERN_ATTN_SPLIT_TILES=N: every decode split holds at least N 64-key tiles of the capacity (default 2; 1: up to one
// split a tile, the form before). Read once. A sequence's splits depend on its capacity alone whatever N, so every
// batch gives it the same bits; N sets how many blocks share a sequence's keys. Two tiles a split (H200,
// docs/benchmarks.md, thirty-fifth session): 4 / 8 / 16 streams +2.2 to +2.7% (fewer one-tile blocks, each paying its
// prologue and epilogue), one stream within the noise (−0.0 / −1.4% in two rounds).
int attn_split_tiles() {
  static const int n = [] {
    const char* e = std::getenv("TERN_ATTN_SPLIT_TILES");
    return e == nullptr || *e == '\0' ? 2 : env_count("TERN_ATTN_SPLIT_TILES", e, 1, 4096, "a count of 64-key tiles");
  }();
  return n;
}

// TERN_ATTN_BATCH_ITEMS (attention.cuh: attn_batch_set_items): attention_batched's items-per-block form. Read once,
// at the first batched call (outside capture); the tests set it with attn_batch_set_items.
int& batch_items() {
  static int items = [] {
    const char* e = std::getenv("TERN_ATTN_BATCH_ITEMS");
    if (e == nullptr || *e == '\0' || std::strcmp(e, "0") == 0) return 0;
    if (std::strcmp(e, "auto") == 0) return kAttnBatchItemsAuto;
    return env_count("TERN_ATTN_BATCH_ITEMS", e, 1, 1000000, "0 (off), auto, or a count of work items per block");
  }();
  return items;
}

std::atomic<int64_t> items_launches{0};  // attn_batch_items_launches

// attn_batch_set_items_stages: the items form's ring stages asked by a test (0: the device's choice).
int& items_stages_asked() {
  static int stages = 0;
  return stages;
}

void check_i16_fits(const AttnDims& d) {
  const AttentionSetup& s = attention_setup();
  const size_t prefill = prefill_smem(d);
  bool decode = true;
  for (const DecodeVariant& v : s.decode[dh_index(d.dh)]) decode = decode && v.i16_stages >= 1;
  TERN_CHECK(prefill <= size_t(s.smem_optin) && decode, "--kv-dtype i16: its attention kernels need up to ", prefill,
             " bytes of shared memory a block at head dim ", d.dh, ", this device has ", s.smem_optin,
             " (an fp16 cache needs half)");
}

// What attn_prepare_batched and attention_batched both require (d's head shapes are checked by the caller).
void check_batch(const AttnBatch& b, const AttnDims& d, const char* what) {
  TERN_CHECK(d.T == 1, what, ": one token per sequence (d.T = ", d.T, ")");
  TERN_CHECK(b.B >= 1 && b.B <= kMaxBatch, what, ": ", b.B, " sequences (1..", kMaxBatch, ")");
  TERN_CHECK(b.ld_qkv >= int64_t(d.Hq) * 2 * d.dh && b.ld_qkv % 4 == 0, what, ": row stride ", b.ld_qkv,
             " (at least Hq·2·dh = ", int64_t(d.Hq) * 2 * d.dh, ", a multiple of 4 floats)");
  TERN_CHECK(b.pos0 && b.cache_k && b.cache_v && b.capacity, what, ": null table");
}

}  // namespace attn

using namespace attn;

void attention_init() {
  attention_setup();
  batch_items();  // TERN_ATTN_BATCH_ITEMS parsed here, outside any capture: a bad value fails at start-up
}

int64_t attn_partial_floats(int64_t T, int Hq, int dh) {
  const int64_t t = std::min<int64_t>(T, kDecodeMaxTokens);
  return t * Hq * kAttnMaxSplits * (int64_t(dh) + 2);
}

void attention(const float* q, const float* qg, const void* cache_k, const void* cache_v, const int* pos0,
               const AttnDims& d, float* partial, float* out, cudaStream_t stream) {
  if (d.T == 0) return;
  TERN_CHECK(d.Hkv > 0 && d.Hq % d.Hkv == 0, "attention: ", d.Hq, " query heads over ", d.Hkv, " KV heads");
  TERN_CHECK(d.capacity > 0, "attention: empty KV cache");
  const int G = d.Hq / d.Hkv;
  if (d.T <= kDecodeMaxTokens && d.T * G <= kDecodeMaxRows)
    attention_decode(q, qg, cache_k, cache_v, pos0, d, partial, out, stream);
  else if (prefill_wgmma_takes(d))
    attention_prefill_wgmma(q, qg, cache_k, cache_v, pos0, d, out, stream);
  else
    attention_prefill(q, qg, cache_k, cache_v, pos0, d, out, stream);
}

int attn_batch_splits(const AttnDims& d) {
  attention_check(d);
  TERN_CHECK(d.capacity > 0, "attn_batch_splits: empty KV cache");
  TERN_CHECK(d.Hq / d.Hkv <= kDecodeMaxRows, "attn_batch_splits: ", d.Hq / d.Hkv,
             " query heads per KV head (the decode kernels take ", kDecodeMaxRows, ")");
  AttnDims one = d;
  one.T = 1;
  const AttentionSetup& setup = attention_setup();
  return decode_splits(one, decode_variant(setup, one), setup.sms);
}

int64_t attn_batch_partial_floats(int B, int Hq, int dh) { return B * attn_partial_floats(1, Hq, dh); }

void attn_batch_set_items(int items) {
  TERN_CHECK(items >= 0 || items == kAttnBatchItemsAuto, "attn_batch_set_items: ", items,
             " (0: off, kAttnBatchItemsAuto, or items per block >= 1)");
  batch_items() = items;
}
int attn_batch_items() { return batch_items(); }
bool attn_batch_items_available(int dh) {
  TERN_CHECK(dh == 64 || dh == 128 || dh == 256, "attn_batch_items_available: head dim ", dh, " (64, 128 or 256)");
  return attention_setup().decode[dh_index(dh)][rw_index(1)].items_stages >= 2;
}
void attn_batch_set_items_stages(int stages) {
  TERN_CHECK(stages == 0 || stages == 2 || stages == 3, "attn_batch_set_items_stages: ", stages, " (0, 2 or 3)");
  items_stages_asked() = stages;
}
int attn_batch_items_stages() { return items_stages_asked(); }
int64_t attn_batch_items_launches() { return items_launches.load(std::memory_order_relaxed); }

void attention_batched(const float* q, const float* qg, const AttnBatch& batch, const AttnDims& d, float* partial,
                       float* out, cudaStream_t stream) {
  const int columns = attn_batch_splits(d);  // the largest capacity's: no sequence has more splits
  check_batch(batch, d, "attention_batched");
  TERN_CHECK(batch.splits && partial, "attention_batched: null split table or partial scratch");
  TERN_CHECK(!batch.out_tables || (reinterpret_cast<uintptr_t>(batch.out_tables) & 15) == 0,
             "attention_batched: out_tables not 16-byte aligned");
  attention_decode_batched(q, qg, batch, d, columns, partial, out, stream);
}

}  // namespace tern::cuda
