// The weight upload through pinned staging (src/cuda/weights/staged_upload): every byte of every copy lands where
// it should, through buffers much smaller than the copies and through the default ones; and a small MLX checkpoint
// written to disk, loaded (its matrices used in place in the mapped files) and uploaded, holds on the device exactly
// the bytes of the host weights, stacked experts at a stride that is not their size included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

#include "../cuda_test_util.h"
#include "cuda/weights/device_weights.cuh"
#include "cuda/weights/staged_upload.cuh"
#include "engine/demo_model.h"
#include "model/checkpoint.h"
#include "model/quantize.h"

namespace tern::cuda::test {
namespace {

std::vector<uint8_t> device_bytes(const void* p, size_t n) {
  std::vector<uint8_t> out(n);
  if (n) TERN_CUDA(cudaMemcpy(out.data(), p, n, cudaMemcpyDeviceToHost));
  return out;
}

// Random copies (empty, tiny, up to several staging buffers long) from shuffled host places to shuffled device
// places of one device buffer; the whole buffer is compared with its expected host image.
void check_random_copies(uint64_t seed, size_t max_copy, int copies, const StagingOptions& options) {
  std::mt19937_64 rng(seed);
  std::vector<size_t> sizes;
  size_t total = 0;
  for (int i = 0; i < copies; ++i) {
    const int kind = int(rng() % 4);
    sizes.push_back(kind == 0 ? 0 : kind == 1 ? 1 + rng() % 31 : 1 + rng() % max_copy);
    total += sizes.back() + 16;
  }
  std::vector<uint8_t> host(total);
  uint64_t x = rng();
  for (size_t i = 0; i < total; i += 8) {  // cheap pseudo-random bytes
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    std::memcpy(host.data() + i, &x, std::min<size_t>(8, total - i));
  }
  DeviceArena arena(total, "staged upload test");
  uint8_t* dev = arena.take_n<uint8_t>(total);
  TERN_CUDA(cudaMemset(dev, 0xee, total));
  std::vector<uint8_t> want(total, 0xee);
  std::vector<size_t> order(sizes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<HostCopy> plan;
  size_t src_at = 0, dst_at = 0;
  std::vector<size_t> dst_of(sizes.size());
  for (size_t i : order) {  // destinations in shuffled order, odd offsets
    dst_of[i] = dst_at + rng() % 8;
    dst_at += sizes[i] + 16;
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    const size_t s = src_at + rng() % 8;
    src_at += sizes[i] + 16;
    plan.push_back(HostCopy{host.data() + s, reinterpret_cast<uintptr_t>(dev + dst_of[i]), sizes[i]});
    std::memcpy(want.data() + dst_of[i], host.data() + s, sizes[i]);
  }
  const StagedUploadResult r = staged_upload(plan, "staged upload test", false, options);
  size_t payload = 0;
  for (size_t s : sizes) payload += s;
  EXPECT_EQ(r.bytes, int64_t(payload));
  const std::vector<uint8_t> got = device_bytes(dev, total);
  size_t first_bad = total;
  for (size_t i = 0; i < total && first_bad == total; ++i)
    if (got[i] != want[i]) first_bad = i;
  EXPECT_EQ(first_bad, total) << "first wrong device byte (seed " << seed << ")";
}

TEST(StagedUpload, SmallBuffersManyChunks) {
  TERN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed("StagedUpload.SmallBuffersManyChunks");
  StagingOptions o;
  o.buffer_bytes = 1 << 20;
  o.buffers = 3;
  o.streams = 2;
  o.threads = 3;
  check_random_copies(seed, 3 << 20, 120, o);
  o.buffers = 1;  // one buffer: each fill waits for the previous chunk's copies
  o.streams = 1;
  check_random_copies(seed + 1, 3 << 20, 40, o);
}

TEST(StagedUpload, DefaultBuffersWrapAround) {
  TERN_REQUIRE_GPU();
  // ~800 MB (no less than ~300 MB): more chunks than the default 4 x 64 MB buffers, each buffer refilled.
  check_random_copies(fresh_seed("StagedUpload.DefaultBuffersWrapAround"), size_t(64) << 20, 40, StagingOptions{});
}

TEST(StagedUpload, NothingToCopy) {
  TERN_REQUIRE_GPU();
  const StagedUploadResult r = staged_upload({}, "nothing", false);
  EXPECT_EQ(r.bytes, 0);
}

// --------------------------------------------------------------------------------------------------------------

void expect_same_bytes(const void* device, const void* host, size_t n, const std::string& what) {
  ASSERT_NE(device, nullptr) << what;
  const std::vector<uint8_t> got = device_bytes(device, n);
  EXPECT_EQ(std::memcmp(got.data(), host, n), 0) << what;
}

void expect_same_matrix(const DMat& d, const Matrix& m, const std::string& what) {
  if (m.empty()) {
    EXPECT_TRUE(d.empty()) << what;
    return;
  }
  ASSERT_EQ(int(d.format), int(m.format)) << what;
  ASSERT_EQ(d.experts, m.experts) << what;
  ASSERT_EQ(d.rows, m.rows) << what;
  ASSERT_EQ(d.cols, m.cols) << what;
  ASSERT_EQ(d.row_words, m.row_words()) << what;
  const size_t elem = m.format == WeightFormat::bf16 ? 2 : 4;
  const size_t data_bytes = size_t(m.rows * m.row_words()) * elem, group_bytes = size_t(m.rows * m.groups_per_row()) * 2;
  for (int64_t e = 0; e < m.experts; ++e) {
    const Matrix me = m.experts == 1 ? m : m.expert(e);
    const std::string we = what + " expert " + std::to_string(e);
    expect_same_bytes(static_cast<const uint8_t*>(d.data) + size_t(e) * data_bytes, me.data, data_bytes, we + " data");
    if (m.quantized()) {
      expect_same_bytes(d.scales + e * m.rows * m.groups_per_row(), me.scales, group_bytes, we + " scales");
      expect_same_bytes(d.biases + e * m.rows * m.groups_per_row(), me.biases, group_bytes, we + " biases");
    }
  }
}

void expect_same_vector(const float* d, const std::vector<float>& v, const std::string& what) {
  if (v.empty()) {
    EXPECT_EQ(d, nullptr) << what;
    return;
  }
  expect_same_bytes(d, v.data(), v.size() * 4, what);
}

void expect_same_weights(const DeviceWeights& dw, const ModelWeights& w) {
  expect_same_matrix(dw.embed, w.embed, "embed");
  expect_same_matrix(dw.lm_head, w.lm_head, "lm_head");
  expect_same_vector(dw.final_norm, w.final_norm, "final_norm");
  ASSERT_EQ(dw.layers.size(), w.layers.size());
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const DeviceLayer& d = dw.layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    const std::pair<const DMat*, const Matrix*> mats[] = {
        {&d.in_proj_qkv, &l.in_proj_qkv}, {&d.in_proj_z, &l.in_proj_z},     {&d.in_proj_b, &l.in_proj_b},
        {&d.in_proj_a, &l.in_proj_a},     {&d.out_proj, &l.out_proj},       {&d.q_proj, &l.q_proj},
        {&d.k_proj, &l.k_proj},           {&d.v_proj, &l.v_proj},           {&d.o_proj, &l.o_proj},
        {&d.router, &l.router},           {&d.expert_gate, &l.expert_gate}, {&d.expert_up, &l.expert_up},
        {&d.expert_down, &l.expert_down}, {&d.shared_gate, &l.shared_gate}, {&d.shared_up, &l.shared_up},
        {&d.shared_down, &l.shared_down}, {&d.shared_expert_gate, &l.shared_expert_gate}};
    for (size_t k = 0; k < std::size(mats); ++k) expect_same_matrix(*mats[k].first, *mats[k].second, p + std::to_string(k));
    const std::pair<const float*, const std::vector<float>*> vecs[] = {
        {d.input_norm, &l.input_norm}, {d.post_attn_norm, &l.post_attn_norm}, {d.conv1d, &l.conv1d},
        {d.A_log, &l.A_log},           {d.dt_bias, &l.dt_bias},               {d.gdn_norm, &l.gdn_norm},
        {d.q_norm, &l.q_norm},         {d.k_norm, &l.k_norm}};
    for (size_t k = 0; k < std::size(vecs); ++k) expect_same_vector(vecs[k].first, *vecs[k].second, p + "vector " + std::to_string(k));
  }
}

// A copy of m's experts at a stride of `pad` words (and pad/8 groups) more than their size: the layout that
// Matrix's expert strides describe (HF's fused gate_up split in place).
struct StridedCopy {
  std::vector<uint32_t> words;
  std::vector<uint16_t> scales, biases;
  Matrix m;
};
std::unique_ptr<StridedCopy> strided_copy(const Matrix& m, int64_t pad) {
  auto s = std::make_unique<StridedCopy>();
  const int64_t dw = m.rows * m.row_words(), dg = m.rows * m.groups_per_row(), pg = pad / 8;
  s->words.assign(size_t(m.experts * (dw + pad)), 0xdeadbeefu);
  s->scales.assign(size_t(m.experts * (dg + pg)), 0xffff);
  s->biases.assign(size_t(m.experts * (dg + pg)), 0xffff);
  for (int64_t e = 0; e < m.experts; ++e) {
    const Matrix me = m.expert(e);
    std::memcpy(s->words.data() + e * (dw + pad), me.data, size_t(dw) * 4);
    std::memcpy(s->scales.data() + e * (dg + pg), me.scales, size_t(dg) * 2);
    std::memcpy(s->biases.data() + e * (dg + pg), me.biases, size_t(dg) * 2);
  }
  s->m = m;
  s->m.data = s->words.data();
  s->m.scales = s->scales.data();
  s->m.biases = s->biases.data();
  s->m.expert_stride_data = dw + pad;
  s->m.expert_stride_groups = dg + pg;
  return s;
}

TEST(DeviceWeightsUpload, MappedCheckpointArrivesByteForByte) {
  TERN_REQUIRE_GPU();
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("tern_upload_" + std::to_string(std::random_device{}()));
  const fs::path src = root / "src", out = root / "mlx";
  fs::create_directories(src);
  DemoModelOptions o;
  o.seed = fresh_seed("DeviceWeightsUpload");
  o.mtp = false;
  o.vision = false;
  std::ofstream(src / "config.json") << demo_config_json(o);
  std::ofstream(src / "generation_config.json") << demo_generation_config_json(o);
  checkpoint_write_mlx(*demo_model_build(o), src, out, int64_t(4) << 20, /*progress=*/false);  // several shards
  LoadOptions lo;
  lo.progress = false;
  ModelWeights w = model_load(out, lo);
  ASSERT_EQ(w.source_layout, "mlx");
  // Layer 0's experts at a stride larger than their size (one copy per expert instead of one for all).
  const auto strided = strided_copy(w.layers[0].expert_gate, 64);
  w.layers[0].expert_gate = strided->m;
  const auto dw = device_weights_upload(w, /*progress=*/false);
  expect_same_weights(*dw, w);
  fs::remove_all(root);
}

}  // namespace
}  // namespace tern::cuda::test
