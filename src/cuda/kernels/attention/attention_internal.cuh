// The attention files' shared internals (included only by src/cuda/kernels/attention/*.cu): the shapes' limits, the
// sequences of a launch (Seqs: the kernels' parameter, so it stays in the anonymous namespace with the kernels that
// take it; every file includes it, and each kernel keeps internal linkage and its name), and the host side's shared
// state and switches (namespace attn: defined once, in attention.cu unless said otherwise).
#pragma once

#include <atomic>
#include <cstdint>

#include "core/check.h"
#include "cuda/kernels/attention/attention.cuh"

namespace tern::cuda {
namespace {

constexpr int kBlockKeys = 64;        // keys per K/V tile in shared memory (both paths)
constexpr int kPrefillRows = 64;      // new tokens per prefill block: 4 row groups of 16 (a warp each, or two)
constexpr int kDecodeMaxTokens = 8;   // T <= 8 takes the split-KV decode path
constexpr int kDecodeMaxRows = 64;    // T·(Hq/Hkv) query rows per decode block: 4 warps × 16 rows at most
constexpr int kMaxRopeHalf = 64;      // rot/2 <= 64
constexpr int kMaxBatch = 32;         // AttnBatch::B
constexpr float kLog2e = 1.4426950408889634f;

// ---- the sequences of a launch ----------------------------------------------------------------------------------
//
// Every attention kernel runs B sequences of T new tokens each, row i = b·T + t of q_out, out and the decode partials:
// attn_prepare and attention are B = 1 (one sequence's T tokens, its position, cache and split count given as
// scalars), attn_prepare_batched and attention_batched are T = 1 (B sequences, each from AttnBatch's tables). A kernel
// takes a sequence's values from seq_at / splits_at in both forms, so its arithmetic is the same code either way.

// Elem: void (attn_prepare writes the caches), const void (attention reads them); the caches in AttnDims::kv's type.
template <typename Elem>
struct Seqs {
  int B = 1;
  // No tables (B = 1): the one sequence's first position, cache [Hkv, capacity, dh] and decode split count.
  const int* pos0 = nullptr;
  Elem* cache_k = nullptr;
  Elem* cache_v = nullptr;
  int64_t capacity = 0;
  int splits = 1;
  // The batched calls: AttnBatch's tables, [B] each.
  const int* const* pos0_of = nullptr;
  void* const* cache_k_of = nullptr;
  void* const* cache_v_of = nullptr;
  const int64_t* capacity_of = nullptr;
  const int* splits_of = nullptr;
  // attn_prepare's rotary offsets (AttnRope::delta): the one sequence's, or the batched calls' table; null: 0.
  const int* rope_delta = nullptr;
  const int* const* rope_delta_of = nullptr;
};

template <typename Elem>
struct Seq {
  int64_t pos0;  // the position of the sequence's first new token
  Elem* cache_k;
  Elem* cache_v;
  int64_t capacity;
};

template <typename Elem>
__device__ __forceinline__ Seq<Elem> seq_at(const Seqs<Elem>& s, int b) {
  if (s.pos0_of) return {*s.pos0_of[b], s.cache_k_of[b], s.cache_v_of[b], s.capacity_of[b]};
  return {*s.pos0, s.cache_k, s.cache_v, s.capacity};
}

template <typename Elem>
__device__ __forceinline__ int splits_at(const Seqs<Elem>& s, int b) {
  return s.splits_of ? s.splits_of[b] : s.splits;
}

// Sequence b's M-RoPE delta (0 without one). attn_prepare only, after its pdl_wait.
template <typename Elem>
__device__ __forceinline__ int64_t rope_delta_at(const Seqs<Elem>& s, int b) {
  const int* delta = s.rope_delta_of ? s.rope_delta_of[b] : s.rope_delta;
  return delta ? *delta : 0;
}

// The batched calls' sequences: AttnBatch's tables.
template <typename Elem>
Seqs<Elem> batch_seqs(const AttnBatch& b) {
  return {.B = b.B, .pos0_of = b.pos0, .cache_k_of = b.cache_k, .cache_v_of = b.cache_v, .capacity_of = b.capacity,
          .splits_of = b.splits, .rope_delta_of = b.rope_delta};
}

}  // namespace

namespace attn {

// ---- the one-time setup (attention.cu: attention_setup; each kernel family sets its own kernels' attributes) -------

struct DecodeVariant {
  int stages = 1;
  size_t smem = 0;
  int blocks_per_sm = 1;
  // The one-stage form of the same kernel (launch_decode takes it for a batched grid of more than one wave whose
  // splits hold at most two tiles): less shared memory, more blocks per SM, the same arithmetic.
  size_t smem_one_stage = 0;
  int blocks_per_sm_one_stage = 1;
  // The items-per-block form (attention_decode_items_kernel; RW = 1 only): its ring's stages (0: the form does not
  // fit this device, attention_batched keeps the one-item kernel), shared memory and blocks per SM.
  int items_stages = 0;
  size_t items_smem = 0;
  int items_blocks_per_sm = 1;
  // The i16 cache's one-item kernel (attention_i16_tiles.cuh): its ring's stages and shared memory (0: it does not
  // fit); and with q's hi and lo stacked (RW = 1, at most 8 query rows).
  int i16_stages = 0;
  size_t i16_smem = 0;
  int i16_stack_stages = 0;
  size_t i16_stack_smem = 0;
};

struct AttentionSetup {
  int sms = 1, smem_optin = 0;
  DecodeVariant decode[3][3];  // [dh 64/128/256][RW 1/2/4]
};

inline int dh_index(int dh) { return dh == 64 ? 0 : dh == 128 ? 1 : 2; }
inline int rw_index(int rw) { return rw == 1 ? 0 : rw == 2 ? 1 : 2; }

// Device properties and kernel attributes, once per process (the first attention call; keep it out of capture).
const AttentionSetup& attention_setup();
void prefill_setup(int optin);                    // attention_prefill.cu: the prefill kernels' attributes
void prefill_wgmma_setup(int optin);              // attention_prefill_wgmma.cu: the Hopper prefill kernel's
void decode_setup(AttentionSetup& s, int optin);  // attention_decode.cu: the decode variants and their kernels

// ---- the switches (attention.cu) ---------------------------------------------------------------------------------

bool kv_early();              // TERN_ATTN_KV_EARLY
bool attn_batch_one_stage();  // TERN_ATTN_BATCH_STAGES
int attn_split_tiles();       // TERN_ATTN_SPLIT_TILES
int& batch_items();           // TERN_ATTN_BATCH_ITEMS, attn_batch_set_items
int& items_stages_asked();    // attn_batch_set_items_stages
extern std::atomic<int64_t> items_launches;  // attn_batch_items_launches

// The i16 cache's kernels need more shared memory than the fp16 cache's (the prefill 2.3 times at head dim 256, the
// decode 512 bytes a stage): throws tern::Error when this device has too little for d's head dim (attention_check
// calls it, so that a runner refuses --kv-dtype i16 when it loads).
void check_i16_fits(const AttnDims& d);
// The prefill kernel's shared memory for d's head dim and cache type (attention_prefill.cu).
size_t prefill_smem(const AttnDims& d);

// What attn_prepare_batched and attention_batched both require (attention.cu).
void check_batch(const AttnBatch& b, const AttnDims& d, const char* what);

// ---- the decode path (attention_decode.cu) -------------------------------------------------------------------------

int decode_rows_warps(int64_t rows);
const DecodeVariant& decode_variant(const AttentionSetup& setup, const AttnDims& d);
int decode_splits(const AttnDims& d, const DecodeVariant& v, int sms);
// attention()'s decode path (d.T <= kDecodeMaxTokens, T·G <= kDecodeMaxRows): split kernel and merge.
void attention_decode(const float* q, const float* qg, const void* cache_k, const void* cache_v, const int* pos0,
                      const AttnDims& d, float* partial, float* out, cudaStream_t stream);
// attention_batched's launches over `columns` split columns (the checks are the caller's).
void attention_decode_batched(const float* q, const float* qg, const AttnBatch& batch, const AttnDims& d, int columns,
                              float* partial, float* out, cudaStream_t stream);

// ---- the prefill path (attention_prefill.cu) -----------------------------------------------------------------------

// attention()'s flash path for d.T tokens (beyond the decode path's shapes).
void attention_prefill(const float* q, const float* qg, const void* cache_k, const void* cache_v, const int* pos0,
                       const AttnDims& d, float* out, cudaStream_t stream);

// ---- the Hopper prefill path (attention_prefill_wgmma.cu) ---------------------------------------------------------

// Whether attention_prefill_wgmma takes d: a Hopper GPU running the sm_90a binary, head dim 256, an fp16, bf16 or i16
// cache, and TERN_ATTN_PREFILL_WGMMA not 0.
bool prefill_wgmma_takes(const AttnDims& d);
// attention_prefill's arithmetic on the warpgroup MMA, for the shapes prefill_wgmma_takes.
void attention_prefill_wgmma(const float* q, const float* qg, const void* cache_k, const void* cache_v,
                             const int* pos0, const AttnDims& d, float* out, cudaStream_t stream);

// ---- the compile-time switches over head dim and cache type --------------------------------------------------------

// f.template operator()<DH, KV>() for a cache type (d.kv) at head dim DH.
template <int DH, typename F>
void with_cache_type(const AttnDims& d, F&& f) {
  switch (d.kv) {
    case KvDtype::f16: return f.template operator()<DH, KvDtype::f16>();
    case KvDtype::bf16: return f.template operator()<DH, KvDtype::bf16>();
    case KvDtype::fp8: return f.template operator()<DH, KvDtype::fp8>();
    case KvDtype::i16: return f.template operator()<DH, KvDtype::i16>();
  }
  TERN_FAIL("attention: KV cache type ", int(d.kv), " unknown");
}

// f.template operator()<DH, KV>() for d's head dim (64, 128 or 256) and cache type (d.kv).
template <typename F>
void with_head_dim(const AttnDims& d, F&& f) {
  switch (d.dh) {
    case 64: return with_cache_type<64>(d, f);
    case 128: return with_cache_type<128>(d, f);
    case 256: return with_cache_type<256>(d, f);
    default: TERN_FAIL("attention: head dim ", d.dh, " not supported by the CUDA kernels (64, 128 or 256)");
  }
}

}  // namespace attn
}  // namespace tern::cuda
