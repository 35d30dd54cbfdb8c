// What the attention tests (attention_test.cpp: the 16-bit caches, attention_fp8_test.cpp and attention_i16_test.cpp:
// the row-scaled caches) share: the device tables of an AttnBatch over B sequences, the comparison of a batched step
// against each sequence alone, and the prefill's mma.sync kernels for a scope.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../cuda_test_util.h"
#include "cuda/kernels/attention/attention.cuh"
#include "producer_tables.h"

namespace tern::cuda::test {

// attention()'s prefill on the mma.sync kernels while this lives (attn_prefill_set_wgmma), the switch as it was after.
struct PrefillOnMmaSync {
  const bool was = attn_prefill_wgmma();
  PrefillOnMmaSync() { attn_prefill_set_wgmma(false); }
  ~PrefillOnMmaSync() { attn_prefill_set_wgmma(was); }
  PrefillOnMmaSync(const PrefillOnMmaSync&) = delete;
  PrefillOnMmaSync& operator=(const PrefillOnMmaSync&) = delete;
};

// The device tables of an AttnBatch (attention.cuh), built from host vectors and owned here: each sequence's
// position (pos.p + b is its *pos0, as attn_prepare alone takes it), cache pointers, capacity and split count.
struct DeviceAttnBatch {
  DeviceBuf<int> pos, splits;
  DeviceBuf<int64_t> capacity;
  DeviceBuf<const int*> pos_table;
  DeviceBuf<void*> k_table, v_table;
  AttnBatch batch;

  // ld: the row stride of qg, k and v (AttnBatch::ld_qkv).
  DeviceAttnBatch(const std::vector<int>& positions, const std::vector<int>& split_counts,
                  const std::vector<int64_t>& capacities, const std::vector<void*>& cache_k,
                  const std::vector<void*>& cache_v, int64_t ld)
      : pos(positions),
        splits(split_counts),
        capacity(capacities),
        pos_table(each_of(pos.p, positions.size())),
        k_table(cache_k),
        v_table(cache_v) {
    batch.B = int(positions.size());
    batch.ld_qkv = ld;
    batch.pos0 = pos_table.p;
    batch.cache_k = k_table.p;
    batch.cache_v = v_table.p;
    batch.capacity = capacity.p;
    batch.splits = splits.p;
  }

 private:
  static std::vector<const int*> each_of(const int* base, size_t n) {
    std::vector<const int*> p;
    for (size_t b = 0; b < n; ++b) p.push_back(base + b);
    return p;
  }
};

// One sequence's K and V caches twice, as bytes in the cache's type (the batched call's kb, vb; the lone calls' k1,
// v1), with the same rows below its position and NaN codes above it.
struct BatchSeqCaches {
  std::unique_ptr<DeviceBuf<uint8_t>> kb, vb, k1, v1;
};
// Makes a sequence's caches for the cache type under test: (rng, capacity, position).
using MakeSeqCaches = std::function<BatchSeqCaches(std::mt19937_64&, int64_t, int64_t)>;

// {capacity, position} of 16 sequences: capacities giving 1 to the most splits, positions 0, 1, at and past a
// 64-key tile edge, the last row of a cache.
inline std::vector<std::pair<int64_t, int64_t>> sixteen_seqs() {
  return {{4096, 0},     {64, 63},     {1000, 1},    {40000, 2000}, {4096, 64},  {1000, 999},
          {64, 0},       {40000, 39999}, {5003, 4321}, {128, 65},     {4096, 4095}, {2048, 1024},
          {40000, 63},   {1000, 500},  {65536, 40000}, {300, 129}};
}

// {capacity, position} of 12 sequences whose splits hold at most two 64-key tiles, in a grid of several waves: the
// batched launch takes the one-stage form of the decode kernel (launch_decode), each sequence alone the deep ring.
inline std::vector<std::pair<int64_t, int64_t>> short_caches() {
  return {{4096, 0}, {64, 63},     {1000, 1}, {4096, 64},   {8000, 7999}, {64, 0},
          {4096, 4095}, {2048, 1024}, {128, 65}, {300, 129}, {8448, 4000}, {4160, 4159}};
}

// The inputs of a batched call over {capacity, position} pairs, one token each: the rows of one fused projection
// buffer [B, ld] as the engine has them (q|gate, k and v at random, ld wider than them: the padding NaN), random q/k
// norm weights, each sequence's caches (make_caches) and split count, and the device tables; dmax: d with the
// largest capacity, as the runner passes it.
struct BatchAttnInputs {
  AttnDims d;  // T = 1
  int B;
  int64_t Q, KV, ld, out_n;  // the widths of q|gate, of k (and v) and of a row; the outputs' Hq·dh
  DeviceBuf<float> proj, q_norm, k_norm;
  std::vector<BatchSeqCaches> caches;
  std::vector<void*> k_ptrs, v_ptrs;
  std::vector<int> pos, splits;
  std::vector<int64_t> caps;
  AttnDims dmax;
  std::unique_ptr<DeviceAttnBatch> tables;

  BatchAttnInputs(std::mt19937_64& rng, const AttnDims& dims, const std::vector<std::pair<int64_t, int64_t>>& seqs,
                  const MakeSeqCaches& make_caches)
      : d(one_token(dims)),
        B(int(seqs.size())),
        Q(int64_t(d.Hq) * 2 * d.dh),
        KV(int64_t(d.Hkv) * d.dh),
        ld(Q + 2 * KV + 4),
        out_n(int64_t(d.Hq) * d.dh),
        proj(random_rows(rng, B, Q, KV, ld)),
        q_norm(random_floats(rng, size_t(d.dh), 0.5f, 1.5f)),
        k_norm(random_floats(rng, size_t(d.dh), 0.5f, 1.5f)),
        dmax(d) {
    dmax.capacity = 0;
    for (const auto& [capacity, position] : seqs) {
      caches.push_back(make_caches(rng, capacity, position));
      k_ptrs.push_back(caches.back().kb->p);
      v_ptrs.push_back(caches.back().vb->p);
      pos.push_back(int(position));
      caps.push_back(capacity);
      AttnDims ds = d;
      ds.capacity = capacity;
      splits.push_back(attn_batch_splits(ds));
      dmax.capacity = std::max(dmax.capacity, capacity);
    }
    tables = std::make_unique<DeviceAttnBatch>(pos, splits, caps, k_ptrs, v_ptrs, ld);
  }

  // attn_prepare_batched over the rows: q [B, Hq·dh] after norm and RoPE, the new rows into the caches.
  void prepare(float* q) const {
    attn_prepare_batched(proj.p, proj.p + Q, proj.p + Q + KV, q_norm.p, k_norm.p, tables->batch, dmax, q, nullptr);
  }

 private:
  static AttnDims one_token(AttnDims d) {
    d.T = 1;
    return d;
  }
  // B rows of ld floats: q|gate and k uniform in [-2, 2], v in [-1, 1], the padding NaN.
  static std::vector<float> random_rows(std::mt19937_64& rng, int B, int64_t Q, int64_t KV, int64_t ld) {
    std::vector<float> rows(size_t(B * ld), std::numeric_limits<float>::quiet_NaN());
    for (int b = 0; b < B; ++b) {
      const auto qgk = random_floats(rng, size_t(Q + KV), -2.0f, 2.0f), v = random_floats(rng, size_t(KV), -1.0f, 1.0f);
      std::copy(qgk.begin(), qgk.end(), rows.begin() + b * ld);
      std::copy(v.begin(), v.end(), rows.begin() + b * ld + Q + KV);
    }
    return rows;
  }
};

// attn_prepare_batched + attention_batched over the sequences (one token each; {capacity, position} pairs) against
// attn_prepare + attention for each sequence alone, bit for bit: q after norm and RoPE, the gated outputs and the
// whole caches (the row each call writes, and every other row). qg, k and v are the rows of one fused projection
// buffer [B, ld] as the engine has them, ld wider than them (the padding NaN).
inline void expect_batched_matches_alone(std::mt19937_64& rng, AttnDims d,
                                         const std::vector<std::pair<int64_t, int64_t>>& seqs, const std::string& what,
                                         const MakeSeqCaches& make_caches) {
  SCOPED_TRACE(what);
  d.T = 1;
  BatchAttnInputs in(rng, d, seqs, make_caches);
  std::string split_list;
  for (int x : in.splits) split_list += " " + std::to_string(x);
  std::printf("[attention] %s: splits%s\n", what.c_str(), split_list.c_str());
  if (in.B >= 3) {
    EXPECT_GT(std::set<int>(in.splits.begin(), in.splits.end()).size(), 1u) << "the sequences' split counts all agree";
  }
  DeviceBuf<float> q_b(size_t(in.B * in.out_n)), out_b(q_b.n), q_1(q_b.n), out_1(q_b.n);  // poisoned
  DeviceBuf<float> part_b(size_t(attn_batch_partial_floats(in.B, d.Hq, d.dh)));
  DeviceBuf<float> part_1(size_t(attn_partial_floats(1, d.Hq, d.dh)));
  in.prepare(q_b.p);
  // o_proj's tables beside out, where a batched product takes the width (1024, 2048 or 4096 columns)
  const int64_t cols = in.out_n;
  const bool tabled = cols == 1024 || cols == 2048 || cols == 4096;
  ZeroTables tables(in.B, tabled ? cols : 1024);
  AttnBatch batch = in.tables->batch;
  batch.out_tables = tabled ? tables.buf.p : nullptr;
  attention_batched(q_b.p, in.proj.p, batch, in.dmax, part_b.p, out_b.p, nullptr);
  TERN_CUDA(cudaGetLastError());
  if (tabled) expect_tables_match(tables, out_b.p, cols, cols, nullptr, 0.0f, in.B, "o_proj's tables");
  for (int b = 0; b < in.B; ++b) {
    AttnDims ds = d;
    ds.capacity = in.caps[size_t(b)];
    const float* row = in.proj.p + b * in.ld;
    const BatchSeqCaches& c = in.caches[size_t(b)];
    attn_prepare(row, row + in.Q, row + in.Q + in.KV, in.q_norm.p, in.k_norm.p, in.tables->pos.p + b, ds,
                 q_1.p + b * in.out_n, c.k1->p, c.v1->p, nullptr);
    attention(q_1.p + b * in.out_n, row, c.k1->p, c.v1->p, in.tables->pos.p + b, ds, part_1.p, out_1.p + b * in.out_n,
              nullptr);
  }
  TERN_CUDA(cudaGetLastError());
  const auto qg = q_b.host(), qw = q_1.host(), og = out_b.host(), ow = out_1.host();
  EXPECT_EQ(std::count_if(ow.begin(), ow.end(), [](float x) { return !std::isfinite(x); }), 0) << "lone outputs";
  EXPECT_EQ(std::memcmp(qg.data(), qw.data(), qg.size() * sizeof(float)), 0) << "q after norm and rope";
  for (int b = 0; b < in.B; ++b) {
    const size_t o = size_t(b * in.out_n);
    EXPECT_EQ(std::memcmp(og.data() + o, ow.data() + o, size_t(in.out_n) * sizeof(float)), 0)
        << "output of sequence " << b << " (capacity " << in.caps[size_t(b)] << ", position " << in.pos[size_t(b)]
        << ", " << in.splits[size_t(b)] << " splits)";
    const BatchSeqCaches& c = in.caches[size_t(b)];
    EXPECT_TRUE(c.kb->host() == c.k1->host()) << "K cache of sequence " << b;
    EXPECT_TRUE(c.vb->host() == c.v1->host()) << "V cache of sequence " << b;
  }
}

// ---- the row-scaled caches' tests (attention_fp8_test.cpp, attention_i16_test.cpp) ----

// Hq query heads and Hkv KV heads of dh values (rot of them rotated) over a cache of type kv.
inline AttnDims kv_dims(KvDtype kv, int Hq, int Hkv, int dh, int rot) {
  AttnDims d;
  d.Hq = Hq;
  d.Hkv = Hkv;
  d.dh = dh;
  d.rot = rot;
  d.kv = kv;
  return d;
}

// The decode cases {context, T, capacity} (context = pos0 + T keys): many splits, most empty; tile edges; the decode
// kernels' row variants (T·G up to 16, 32, 64 rows).
struct DecodeCase {
  int64_t context, T, capacity;
};
inline constexpr DecodeCase kScaledDecodeCases[] = {
    {1, 1, 65536},          {100, 1, 100},   {5000, 1, 5003}, {20000, 1, 32768}, {66, 3, 100},
    {64 * 40 + 1, 2, 65536}, {3000, 4, 3000}, {777, 5, 1000},  {4000, 8, 8192},   {8, 8, 8}};

// A sequence's caches for expect_batched_matches_alone from the host image of a row-scaled cache (Image: Fp8Image or
// I16Image, with fill(rng, rows, lo, hi) and an upload(image) beside it): random quantised rows below its position.
template <typename Image>
MakeSeqCaches image_caches(const AttnDims& d) {
  return [d](std::mt19937_64& rng, int64_t capacity, int64_t pos) {
    Image kc(d, capacity), vc(d, capacity);
    kc.fill(rng, pos, -1.7f, 1.7f);
    vc.fill(rng, pos, -1.0f, 1.0f);
    BatchSeqCaches c;
    c.kb = upload(kc);
    c.k1 = upload(kc);
    c.vb = upload(vc);
    c.v1 = upload(vc);
    return c;
  };
}

// expect_batched_matches_alone over Image's caches at the model's heads d (B = 1, 3 and 16 of sixteen_seqs, the
// short caches) and at two other head shapes (dh 64 and 128, B = 3).
template <typename Image>
void expect_image_batched_matches_alone(std::mt19937_64& rng, const AttnDims& d) {
  const auto sixteen = sixteen_seqs();
  expect_batched_matches_alone(rng, d, {{40000, 2000}}, "B=1", image_caches<Image>(d));
  expect_batched_matches_alone(rng, d, {sixteen.begin(), sixteen.begin() + 3}, "B=3", image_caches<Image>(d));
  expect_batched_matches_alone(rng, d, sixteen, "B=16", image_caches<Image>(d));
  expect_batched_matches_alone(rng, d, short_caches(), "B=12 short caches", image_caches<Image>(d));
  for (const AttnDims& o : {kv_dims(d.kv, 4, 2, 64, 16), kv_dims(d.kv, 8, 1, 128, 32)})
    expect_batched_matches_alone(rng, o, {{400, 250}, {64, 0}, {3000, 2999}},
                                 "dh " + std::to_string(o.dh) + " Hq " + std::to_string(o.Hq) + " B=3",
                                 image_caches<Image>(o));
}

// ---- attention_batched's items-per-block form (attn_batch_set_items) ----

// Sets the items-per-block form for a scope (attn_batch_set_items), then restores the setting before it.
struct BatchItemsScope {
  int saved;
  explicit BatchItemsScope(int items) : saved(attn_batch_items()) { attn_batch_set_items(items); }
  ~BatchItemsScope() { attn_batch_set_items(saved); }
  BatchItemsScope(const BatchItemsScope&) = delete;
  BatchItemsScope& operator=(const BatchItemsScope&) = delete;
};

// {capacity, position} of the first B (<= 32) of 32 sequences for the items-per-block form: lengths (position + 1)
// 1, 63, 64, 65, 1000, 4096 and the last rows of their caches, over capacities 1100, 4096, 8192 and 20000 (18, 64 and
// the most splits; at 8192 and 20000 a split holds several tiles, at 4096 one, at short lengths most splits are
// empty); the first two have different capacities.
inline std::vector<std::pair<int64_t, int64_t>> items_form_seqs(int B) {
  static const std::vector<std::pair<int64_t, int64_t>> all = {
      {4096, 4095}, {8192, 0},    {1100, 62},   {20000, 63},    {4096, 64},   {8192, 999},  {1100, 1099}, {20000, 4095},
      {4096, 0},    {8192, 8191}, {1100, 64},   {20000, 19998}, {4096, 62},   {8192, 63},   {1100, 999},  {20000, 0},
      {4096, 999},  {8192, 4095}, {1100, 0},    {20000, 64},    {4096, 4094}, {8192, 62},   {1100, 63},   {20000, 999},
      {4096, 63},   {8192, 64},   {1100, 1098}, {20000, 8191},  {4096, 1},    {8192, 4096}, {1100, 500},  {20000, 777}};
  return {all.begin(), all.begin() + std::min<size_t>(size_t(B), all.size())};
}

// Sets the items-per-block form's ring stages for a scope (attn_batch_set_items_stages), then restores them.
struct BatchItemsStagesScope {
  int saved;
  explicit BatchItemsStagesScope(int stages) : saved(attn_batch_items_stages()) { attn_batch_set_items_stages(stages); }
  ~BatchItemsStagesScope() { attn_batch_set_items_stages(saved); }
  BatchItemsStagesScope(const BatchItemsStagesScope&) = delete;
  BatchItemsStagesScope& operator=(const BatchItemsStagesScope&) = delete;
};

// Poisons (NaN codes, 0xff bytes) the row at position pos[b] of every KV head of sequence b's K and V caches, fp8
// scales included (fp8, i16), on the default stream: the rows attn_prepare_batched writes next.
inline void poison_new_rows(const std::vector<void*>& k_ptrs, const std::vector<void*>& v_ptrs,
                            const std::vector<int>& pos, const std::vector<int64_t>& caps, const AttnDims& d) {
  const int64_t elem = kv_value_bytes(d.kv);
  for (size_t b = 0; b < pos.size(); ++b)
    for (int h = 0; h < d.Hkv; ++h) {
      const int64_t row = int64_t(h) * caps[b] + pos[b];
      for (void* cache : {k_ptrs[b], v_ptrs[b]}) {
        uint8_t* bytes = static_cast<uint8_t*>(cache);
        TERN_CUDA(cudaMemsetAsync(bytes + row * d.dh * elem, 0xff, size_t(d.dh * elem), nullptr));
        if (kv_row_scaled(d.kv))
          TERN_CUDA(cudaMemsetAsync(bytes + attn_row_scales_offset(d.kv, d.Hkv, caps[b], d.dh) + row * 4, 0xff, 4,
                                    nullptr));
      }
    }
}

// attention_batched with the items-per-block form, at each of `settings` (kAttnBatchItemsAuto or N items per block),
// against the default kernel over the same q, gate and caches (written once by attn_prepare_batched), bit for bit:
// the outputs and the whole partial scratch (every split's m, l and o; what neither form writes stays poisoned
// alike), with the early K/V reads before the wait and without them (AttnBatch::one_session). The sequences are
// {capacity, position} pairs, one token each.
inline void expect_items_form_matches_default(std::mt19937_64& rng, AttnDims d,
                                              const std::vector<std::pair<int64_t, int64_t>>& seqs,
                                              const std::string& what, const MakeSeqCaches& make_caches,
                                              const std::vector<int>& settings) {
  SCOPED_TRACE(what);
  d.T = 1;
  BatchAttnInputs in(rng, d, seqs, make_caches);
  DeviceBuf<float> q(size_t(in.B * in.out_n)), out(q.n);
  DeviceBuf<float> part(size_t(attn_batch_partial_floats(in.B, d.Hq, d.dh)));
  in.prepare(q.p);
  TERN_CUDA(cudaGetLastError());

  // One attention_batched call with the form set to `items`: its outputs and partial scratch (both poisoned first).
  auto run = [&](int items, bool one_session) {
    BatchItemsScope scope(items);
    in.tables->batch.one_session = one_session;
    TERN_CUDA(cudaMemset(out.p, 0xff, out.n * sizeof(float)));
    TERN_CUDA(cudaMemset(part.p, 0xff, part.n * sizeof(float)));
    attention_batched(q.p, in.proj.p, in.tables->batch, in.dmax, part.p, out.p, nullptr);
    TERN_CUDA(cudaGetLastError());
    return std::make_pair(out.host(), part.host());
  };
  const int64_t launches = attn_batch_items_launches();
  // Each setting with the device's ring and with two stages (A100's; on Hopper the ring takes three).
  for (const bool one_session : {false, true}) {
    for (const int stages : {0, 2}) {
      BatchItemsStagesScope stages_scope(stages);
      const auto [out_ref, part_ref] = run(0, one_session);
      EXPECT_EQ(std::count_if(out_ref.begin(), out_ref.end(), [](float x) { return !std::isfinite(x); }), 0)
          << "the default kernel's outputs";
      for (const int items : settings) {
        const auto [out_got, part_got] = run(items, one_session);
        const std::string setting = std::string(items == kAttnBatchItemsAuto ? "auto" : std::to_string(items)) +
                                    " items a block" + (one_session ? ", one session" : "") +
                                    (stages ? ", two stages" : "");
        for (int b = 0; b < in.B; ++b) {
          const size_t o = size_t(b * in.out_n);
          EXPECT_EQ(std::memcmp(out_got.data() + o, out_ref.data() + o, size_t(in.out_n) * sizeof(float)), 0)
              << setting << ": output of sequence " << b << " (capacity " << in.caps[size_t(b)] << ", position "
              << in.pos[size_t(b)] << ", " << in.splits[size_t(b)] << " splits)";
        }
        EXPECT_EQ(std::memcmp(part_got.data(), part_ref.data(), part_ref.size() * sizeof(float)), 0)
            << setting << ": the split partials (m, l, o)";
      }
    }
  }
  // Chained as in a step, kChained times: the rows this token writes poisoned on the stream, attn_prepare_batched
  // writing them, the form reading them (its launch may start before attn_prepare_batched ends: programmatic
  // dependent launch). A tile holding a new row copied before the form's wait would carry NaN into the outputs.
  constexpr int kChained = 20;
  const std::vector<float> out_ref = run(0, false).first;
  {
    BatchItemsScope scope(settings.front());
    in.tables->batch.one_session = false;
    for (int i = 0; i < kChained; ++i) {
      poison_new_rows(in.k_ptrs, in.v_ptrs, in.pos, in.caps, d);
      in.prepare(q.p);
      attention_batched(q.p, in.proj.p, in.tables->batch, in.dmax, part.p, out.p, nullptr);
    }
    TERN_CUDA(cudaGetLastError());
    const std::vector<float> got = out.host();
    EXPECT_EQ(std::memcmp(got.data(), out_ref.data(), got.size() * sizeof(float)), 0)
        << "the form chained after attn_prepare_batched (the new rows poisoned before each)";
  }
  const int64_t ran = attn_batch_items_launches() - launches;
  std::printf("[attention] %s: %lld items-per-block launches\n", what.c_str(), static_cast<long long>(ran));
  if (in.B >= 2 && d.Hq / d.Hkv <= 16 && attn_batch_items_available(d.dh)) {
    EXPECT_EQ(ran, int64_t(4 * settings.size() + kChained)) << "the items-per-block form did not run";
  }
}

}  // namespace tern::cuda::test
