// The memory plan (engine/memory_plan.h) on fake devices with the real model's sizes: the context and sequences it
// chooses on 24, 32, 80 and 141 GB, what gives way first, the flags kept as given, the refusals' numbers,
// speculative decoding's verify states (once per running sequence), and the fp8 KV cache (--kv-dtype fp8).
#include "engine/memory_plan.h"

#include <gtest/gtest.h>

#include <string>

#include "core/check.h"

namespace tern {
namespace {

// Qwen3.6-35B-A3B on the CUDA runner: the MLX 4-bit weights (19.51 GB), about the scratch an H200 shows (21.36 GB
// in use at 256 tokens: the weights, the CUDA context and the runner's buffers), the KV cache of 10 attention layers
// (K and V, 2 heads of 256, fp16: 20,480 bytes per token) and the Gated DeltaNet states of 30 layers (conv
// 3 x 8,192 and recurrent 32 x 128 x 128, fp32; and the position) of cuda_session.cu.
constexpr int64_t kWeights = 19'510'000'000;
constexpr int64_t kScratch = 1'300'000'000;
constexpr int64_t kState = 65'863'936;
constexpr int64_t kKvToken = 20'480;
constexpr int64_t kMaxContext = 262'144;
constexpr int64_t kH200Total = 150'754'820'096;  // 143,771 MiB
constexpr int64_t kGiB = int64_t(1) << 30;
// What a verify step keeps per token (cuda_session.cu, kept_state_bytes_of): the 30 layers' Gated DeltaNet states
// without the position. Speculative decoding's default --draft-max 8 verifies 8 tokens (the CUDA runner's most), 3
// drafts verify 4.
constexpr int64_t kVerifyToken = 30 * (3 * 8'192 * 4 + 32 * 128 * 128 * 4);
constexpr int64_t kMiB2 = int64_t(2) << 20;
// The same KV cache in fp8 (model/kv_dtype.h): a byte per value and an fp32 scale per row of 256 values.
constexpr int64_t kKvTokenFp8 = 10'400;

// tern serve's defaults on a GPU with `free` bytes free (or an H200 under --gpu-memory `cap`).
MemoryPlanInput serve_input(int64_t free, int64_t cap = 0) {
  MemoryPlanInput in;
  in.free_bytes = free;
  in.total_bytes = cap > 0 ? kH200Total : free + 500'000'000;
  in.cap_bytes = cap;
  in.weights_bytes = kWeights;
  in.scratch_bytes = kScratch;
  in.state_bytes = kState;
  in.kv_token_bytes = kKvToken;
  in.max_context = kMaxContext;
  in.default_parallel = 4;
  in.cache_slots = 4;
  in.snapshot_budget = 4 * kGiB;
  return in;
}

// tern run's: one sequence, one cache slot, 1 GiB of snapshots while they fit.
MemoryPlanInput run_input(int64_t cap) {
  MemoryPlanInput in = serve_input(kH200Total - 600'000'000, cap);
  in.default_parallel = 1;
  in.cache_slots = 1;
  in.cache_slots_given = true;
  in.snapshot_budget = kGiB;
  in.parallel_flag = "";
  return in;
}

std::string refusal(const MemoryPlanInput& in) {
  try {
    memory_plan(in);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "the plan was not refused";
  return "";
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

TEST(MemoryPlan, A141GbCardHoldsFourSequencesOfTheWholeContextAndTheSnapshots) {
  const MemoryPlan p = memory_plan(serve_input(141'000'000'000));
  EXPECT_EQ(p.context, kMaxContext);
  EXPECT_EQ(p.parallel, 4);
  EXPECT_EQ(p.sessions, 4);
  EXPECT_EQ(p.snapshot_budget, 4 * kGiB);
  EXPECT_TRUE(p.notes.empty());
  EXPECT_EQ(p.session_bytes, 5'435'817'984);  // 262,144 x 20,480 + the state, in 2 MiB
  // 66 snapshots of 64 MiB for the 4 GiB budget, and the 5 spare buffers.
  EXPECT_EQ(p.snapshot_bytes, (66 + 5) * 64 * (int64_t(1) << 20));
  EXPECT_EQ(p.total_bytes, kWeights + kScratch + kMemoryPlanReserveBytes + 4 * p.session_bytes + p.snapshot_bytes);
}

TEST(MemoryPlan, An80GbCardHoldsTheSameAsTheH200) {
  const MemoryPlan p = memory_plan(serve_input(80'000'000'000));
  EXPECT_EQ(p.context, kMaxContext);
  EXPECT_EQ(p.parallel, 4);
  EXPECT_EQ(p.snapshot_budget, 4 * kGiB);
}

TEST(MemoryPlan, A32GbCardGivesUpTheSnapshotsBeforeAnyContext) {
  const MemoryPlan p = memory_plan(serve_input(kH200Total - 600'000'000, 32'000'000'000));
  EXPECT_EQ(p.context, 121'856);
  EXPECT_EQ(p.parallel, 4);
  EXPECT_EQ(p.sessions, 4);
  EXPECT_EQ(p.snapshot_budget, 0);
  EXPECT_EQ(p.snapshot_bytes, 5 * 64 * (int64_t(1) << 20));  // the spare buffers only
  EXPECT_LE(p.total_bytes, 32'000'000'000);
  EXPECT_EQ(p.context % kMemoryPlanContextStep, 0);
  ASSERT_EQ(p.notes.size(), 1u);
  expect_contains(p.notes[0], "snapshots in host memory only (no room for 4.29 GB of them in GPU memory)");
  // One step more would not fit.
  MemoryPlanInput in = serve_input(kH200Total - 600'000'000, 32'000'000'000);
  in.context = p.context + kMemoryPlanContextStep;
  in.parallel = 4;
  EXPECT_THROW(memory_plan(in), Error);
}

TEST(MemoryPlan, A24GbCardRunsFewerSequencesToKeep32KEach) {
  // 4 sequences would get 23K each: 3 get 33,792.
  const MemoryPlan p = memory_plan(serve_input(kH200Total - 600'000'000, 24'000'000'000));
  EXPECT_EQ(p.parallel, 3);
  EXPECT_EQ(p.context, 33'792);
  EXPECT_EQ(p.sessions, 3);
  EXPECT_EQ(p.snapshot_budget, 0);
  EXPECT_LE(p.total_bytes, 24'000'000'000);
  ASSERT_EQ(p.notes.size(), 3u);  // and the prefix cache's fourth session and snapshots
  EXPECT_EQ(p.notes[0], "--parallel 3: 4 sequences would hold fewer than 32,768 tokens each");
  // A card sold as 24 GB has 24 GiB: four sequences of 46,080 there.
  const MemoryPlan q = memory_plan(serve_input(24 * kGiB));
  EXPECT_EQ(q.parallel, 4);
  EXPECT_EQ(q.context, 46'080);
}

TEST(MemoryPlan, OneSequenceTakesTheLongestContext) {
  // tern run: 109,568 tokens on 24 GB; the whole context and its 1 GiB of snapshots on 32 GB.
  const MemoryPlan small = memory_plan(run_input(24'000'000'000));
  EXPECT_EQ(small.parallel, 1);
  EXPECT_EQ(small.context, 109'568);
  EXPECT_EQ(small.snapshot_budget, 0);
  const MemoryPlan large = memory_plan(run_input(32'000'000'000));
  EXPECT_EQ(large.context, kMaxContext);
  EXPECT_EQ(large.snapshot_budget, kGiB);
  EXPECT_TRUE(large.notes.empty());
}

TEST(MemoryPlan, RefusesWhenNotEvenASmallContextFitsWithTheNumbers) {
  // The weights fit, a 4,096-token context does not.
  const std::string e = refusal(serve_input(kH200Total - 600'000'000, 21'750'000'000));
  expect_contains(e, "1 sequence of 4,096 tokens (the shortest context the plan chooses) does not fit in GPU memory");
  expect_contains(e, "it needs 21.83 GB (weights 19.51 GB + scratch 1.30 GB + 1 session of 4,096 tokens x 151.0 MB");
  expect_contains(e, "+ prefix cache snapshots 335.5 MB + reserve 536.9 MB)");
  expect_contains(e, "but 21.75 GB (--gpu-memory; 150.15 GB free of 150.75 GB) is available");
  expect_contains(e, "not even one sequence of 1,024 tokens fits");
  // Not even the weights and the fixed parts.
  const std::string f = refusal(serve_input(20'000'000'000));
  expect_contains(f, "20.00 GB (the GPU's free memory, of 20.50 GB) is available");
  expect_contains(f, "the weights, scratch and reserve alone need 21.35 GB");
}

TEST(MemoryPlan, AGivenContextIsKeptAndTheSequencesFollow) {
  MemoryPlanInput in = serve_input(kH200Total - 600'000'000, 24'000'000'000);
  in.context = 65'536;
  const MemoryPlan p = memory_plan(in);
  EXPECT_EQ(p.context, 65'536);
  EXPECT_EQ(p.parallel, 1);
  EXPECT_EQ(p.notes.at(0), "--parallel 1: 4 sequences of 65,536 tokens do not fit");
  // 141 GB: exactly as given, four sequences.
  MemoryPlanInput big = serve_input(141'000'000'000);
  big.context = 65'536;
  EXPECT_EQ(memory_plan(big).parallel, 4);
  EXPECT_EQ(memory_plan(big).context, 65'536);
  // A context that is not a multiple of the step stays as given.
  big.context = 1000;
  EXPECT_EQ(memory_plan(big).context, 1000);
}

TEST(MemoryPlan, AGivenContextThatDoesNotFitIsRefusedWithWhatFits) {
  MemoryPlanInput in = serve_input(kH200Total - 600'000'000, 24'000'000'000);
  in.context = 131'072;
  const std::string e = refusal(in);
  expect_contains(e, "1 sequence of 131,072 tokens does not fit in GPU memory: it needs");
  expect_contains(e, "1 session of 131,072 tokens x 2.75 GB");
  expect_contains(e, "--ctx-size 109568 fits 1 sequence");
  // With --parallel too: both ways out.
  in.context = 65'536;
  in.parallel = 4;
  const std::string f = refusal(in);
  expect_contains(f, "4 sequences of 65,536 tokens do not fit in GPU memory: they need 27.32 GB");
  expect_contains(f, "--parallel 1 fits at this context; or --ctx-size 24576 fits 4 sequences");
}

TEST(MemoryPlan, ACommandWithoutTheFlagsIsAdvisedInTokens) {
  // tern generate (or bench): one sequence of what the prompt and -n need; no --parallel to advise.
  MemoryPlanInput in = serve_input(kH200Total - 600'000'000, 24'000'000'000);
  in.cache_slots = 0;
  in.context = 200'000;
  in.parallel = 1;
  in.parallel_flag = "";
  in.context_flag = "";
  const std::string e = refusal(in);
  expect_contains(e, "1 sequence of 200,000 tokens does not fit in GPU memory: it needs 25.51 GB");
  expect_contains(e, "is available: 1 sequence of 125,952 tokens fits");
}

TEST(MemoryPlan, GivenSequencesGetTheLongestContextTheyHold) {
  MemoryPlanInput in = serve_input(80'000'000'000);
  in.parallel = 8;
  MemoryPlan p = memory_plan(in);
  EXPECT_EQ(p.parallel, 8);
  EXPECT_EQ(p.context, kMaxContext);
  in = serve_input(kH200Total - 600'000'000, 24'000'000'000);
  in.parallel = 2;
  p = memory_plan(in);
  EXPECT_EQ(p.parallel, 2);
  EXPECT_EQ(p.context, 53'248);
  EXPECT_EQ(p.notes.size(), 2u);  // the cache's sessions beyond the two and the snapshots gave way
  in.parallel = 16;
  const std::string e = refusal(in);
  expect_contains(e, "16 sequences of 4,096 tokens (the shortest context the plan chooses) do not fit");
  expect_contains(e, "--parallel 15 fits at this context");
}

TEST(MemoryPlan, GivenCacheFlagsAreCounted) {
  // --cache-slots 8: eight sessions whatever --parallel is; --cache-gpu-mb kept as given.
  MemoryPlanInput in = serve_input(kH200Total - 600'000'000, 32'000'000'000);
  in.cache_slots = 8;
  in.cache_slots_given = true;
  in.snapshot_budget = 512 << 20;
  in.snapshot_budget_given = true;
  const MemoryPlan p = memory_plan(in);
  EXPECT_EQ(p.sessions, 8);
  EXPECT_EQ(p.parallel, 4);  // fewer would not lengthen the context: the eight sessions stay
  EXPECT_EQ(p.snapshot_budget, 512 << 20);
  EXPECT_EQ(p.snapshot_bytes, (9 + 5) * 64 * (int64_t(1) << 20));
  EXPECT_EQ(p.context, 55'296);
  EXPECT_LE(p.total_bytes, 32'000'000'000);
  in.context = 131'072;
  const std::string e = refusal(in);
  expect_contains(e, "8 sessions of 131,072 tokens");
  expect_contains(e, "a smaller --cache-gpu-mb; or fewer --cache-slots");
}

TEST(MemoryPlan, CacheSessionsBeyondTheSequencesGiveWayBeforeTheContext) {
  // --parallel 1 on 32 GB: the context takes what the other three cache sessions would have taken.
  MemoryPlanInput in = serve_input(kH200Total - 600'000'000, 32'000'000'000);
  in.parallel = 1;
  const MemoryPlan p = memory_plan(in);
  EXPECT_EQ(p.context, kMaxContext);
  EXPECT_EQ(p.sessions, 1);
  expect_contains(p.notes.at(0), "prefix cache: 1 session, not 4");
  // On the H200 they all fit.
  in = serve_input(141'000'000'000);
  in.parallel = 1;
  EXPECT_EQ(memory_plan(in).sessions, 4);
}

TEST(MemoryPlan, WithoutAPrefixCacheOnlyTheSequencesCount) {
  MemoryPlanInput in = serve_input(kH200Total - 600'000'000, 24'000'000'000);
  in.cache_slots = 0;  // --no-prefix-cache (or tern generate)
  const MemoryPlan p = memory_plan(in);
  EXPECT_EQ(p.snapshot_bytes, 0);
  EXPECT_EQ(p.snapshot_budget, 0);
  EXPECT_EQ(p.parallel, 3);
  EXPECT_EQ(p.context, 38'912);
}

TEST(MemoryPlan, AGpuMemoryCapAboveTheFreeMemoryPlansWithTheFreeMemory) {
  const MemoryPlan p = memory_plan(serve_input(30'000'000'000, 80'000'000'000));
  EXPECT_EQ(p.available_bytes, 30'000'000'000);
  EXPECT_EQ(p.context, memory_plan(serve_input(30'000'000'000)).context);
  expect_contains(memory_plan_describe(p).at(0),
                  "planned of 30.00 GB (the free memory: --gpu-memory 80.00 GB is more than the 30.00 GB free of "
                  "150.75 GB)");
}

TEST(MemoryPlan, ASmallModelTakesItsWholeContext) {
  MemoryPlanInput in = serve_input(10'000'000'000);
  in.weights_bytes = 100'000'000;
  in.max_context = 2048;  // below the shortest chosen context: the model's own is the floor
  const MemoryPlan p = memory_plan(in);
  EXPECT_EQ(p.context, 2048);
  EXPECT_EQ(p.parallel, 4);
}

TEST(MemoryPlan, BadInputsAreErrors) {
  MemoryPlanInput in = serve_input(141'000'000'000);
  in.context = kMaxContext + 1;
  EXPECT_THROW(memory_plan(in), Error);
  in = serve_input(141'000'000'000);
  in.max_context = 0;
  EXPECT_THROW(memory_plan(in), Error);
  in = serve_input(141'000'000'000);
  in.parallel = -1;
  EXPECT_THROW(memory_plan(in), Error);
}

TEST(MemoryPlan, TheWeightsAreCheckedBeforeTheyAreLoaded) {
  MemoryPlanInput device = serve_input(kH200Total - 600'000'000, 16'000'000'000);
  try {
    memory_plan_check_weights(kWeights, device);
    ADD_FAILURE() << "not refused";
  } catch (const Error& e) {
    expect_contains(e.what(), "the model's weights do not fit in GPU memory: they need 19.51 GB");
    expect_contains(e.what(), "but 16.00 GB (--gpu-memory; 150.15 GB free of 150.75 GB) is available");
  }
  device.cap_bytes = 24'000'000'000;
  EXPECT_NO_THROW(memory_plan_check_weights(kWeights, device));
}

TEST(MemoryPlan, TheDescriptionNamesEveryItem) {
  const std::vector<std::string> lines = memory_plan_describe(memory_plan(serve_input(141'000'000'000)));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0],
            "context 262,144 tokens x 4 sequences at once: 47.85 GB planned of 141.00 GB (the GPU's free memory, of "
            "141.50 GB)");
  EXPECT_EQ(lines[1],
            "  weights 19.51 GB + scratch 1.30 GB + 4 sessions x 5.44 GB (KV cache f16 20,480 B/token, Gated DeltaNet "
            "state 65.9 MB) + prefix cache snapshots 4.76 GB (4.29 GB kept and 5 spare buffers) + reserve 536.9 MB");
}

TEST(MemoryPlan, VerifyStatesAreCountedOncePerRunningSequence) {
  MemoryPlanInput in = serve_input(141'000'000'000);
  in.verify_bytes = 8 * kVerifyToken;  // 527 MB: 528.5 MB in 2 MiB
  const MemoryPlan p = memory_plan(in);
  EXPECT_EQ(p.parallel, 4);
  EXPECT_EQ(p.context, kMaxContext);
  EXPECT_EQ(p.verify_bytes, 4 * 252 * kMiB2);
  EXPECT_EQ(p.total_bytes, kWeights + kScratch + kMemoryPlanReserveBytes + 4 * p.session_bytes + p.verify_bytes +
                               p.snapshot_bytes);
  // Eight cache sessions (conversations kept for reuse) still verify four at a time: four verify buffers.
  in.cache_slots = 8;
  in.cache_slots_given = true;
  const MemoryPlan q = memory_plan(in);
  EXPECT_EQ(q.sessions, 8);
  EXPECT_EQ(q.verify_bytes, 4 * 252 * kMiB2);
  EXPECT_EQ(q.total_bytes, kWeights + kScratch + kMemoryPlanReserveBytes + 8 * q.session_bytes + q.verify_bytes +
                               q.snapshot_bytes);
  // Without speculative decoding, none.
  EXPECT_EQ(memory_plan(serve_input(141'000'000'000)).verify_bytes, 0);
}

TEST(MemoryPlan, VerifyStatesChangeWhatFits) {
  // 24 GB: 3 sequences of 33,792 tokens without drafts; with 3 drafts per step (4 tokens: 264.2 MB per sequence)
  // 3 sequences would hold 21,504 tokens each, so 2 of 39,936.
  MemoryPlanInput in = serve_input(kH200Total - 600'000'000, 24'000'000'000);
  in.verify_bytes = 4 * kVerifyToken;
  const MemoryPlan p = memory_plan(in);
  EXPECT_EQ(p.parallel, 2);
  EXPECT_EQ(p.context, 39'936);
  EXPECT_EQ(p.verify_bytes, 2 * 126 * kMiB2);
  EXPECT_LE(p.total_bytes, 24'000'000'000);
  EXPECT_EQ(p.notes.at(0), "--parallel 2: 4 sequences would hold fewer than 32,768 tokens each");
  // With 8 tokens per verify (528.5 MB), one sequence of 83,968 tokens (two would hold 26,624 each).
  in.verify_bytes = 8 * kVerifyToken;
  const MemoryPlan q = memory_plan(in);
  EXPECT_EQ(q.parallel, 1);
  EXPECT_EQ(q.context, 83'968);
  // Given --parallel 2, the longest context beside two verify buffers.
  in.parallel = 2;
  EXPECT_EQ(memory_plan(in).context, 26'624);
  // A given context: the sequences that fit with their verify states.
  in.parallel = 0;
  in.verify_bytes = 4 * kVerifyToken;
  in.context = 32'768;
  EXPECT_EQ(memory_plan(in).parallel, 2);
}

TEST(MemoryPlan, ARefusalCountsTheVerifyStates) {
  MemoryPlanInput in = serve_input(kH200Total - 600'000'000, 24'000'000'000);
  in.verify_bytes = 4 * kVerifyToken;
  in.context = 65'536;
  in.parallel = 4;
  const std::string e = refusal(in);
  expect_contains(e, "4 sequences of 65,536 tokens do not fit in GPU memory: they need 28.38 GB");
  expect_contains(e, "4 sessions of 65,536 tokens x 1.41 GB + 4 x speculative decoding's verify states 264.2 MB + "
                     "prefix cache snapshots");
  expect_contains(e, "--parallel 1 fits at this context; or --ctx-size 11264 fits 4 sequences");
  in.verify_bytes = -1;
  EXPECT_THROW(memory_plan(in), Error);
}

TEST(MemoryPlan, TheDescriptionNamesTheVerifyStates) {
  MemoryPlanInput in = serve_input(141'000'000'000);
  in.verify_bytes = 8 * kVerifyToken;
  const std::vector<std::string> lines = memory_plan_describe(memory_plan(in));
  ASSERT_EQ(lines.size(), 2u);
  expect_contains(lines[0], "context 262,144 tokens x 4 sequences at once: 49.97 GB planned of 141.00 GB");
  EXPECT_EQ(lines[1],
            "  weights 19.51 GB + scratch 1.30 GB + 4 sessions x 5.44 GB (KV cache f16 20,480 B/token, Gated DeltaNet "
            "state 65.9 MB) + 4 x speculative decoding's verify states 528.5 MB (Gated DeltaNet states kept by a "
            "verify step) + prefix cache snapshots 4.76 GB (4.29 GB kept and 5 spare buffers) + reserve 536.9 MB");
}

TEST(MemorySizeParse, ReadsGbAndUnits) {
  EXPECT_EQ(memory_size_parse("24"), 24'000'000'000);
  EXPECT_EQ(memory_size_parse("23.5"), 23'500'000'000);
  EXPECT_EQ(memory_size_parse("24GB"), 24'000'000'000);
  EXPECT_EQ(memory_size_parse("24 gb"), 24'000'000'000);
  EXPECT_EQ(memory_size_parse("24G"), 24'000'000'000);
  EXPECT_EQ(memory_size_parse("24GiB"), 24 * kGiB);
  EXPECT_EQ(memory_size_parse("24564MiB"), int64_t(24564) << 20);
  EXPECT_EQ(memory_size_parse("500MB"), 500'000'000);
}

TEST(MemorySizeParse, RefusesWhatIsNoSize) {
  for (const char* bad : {"", "abc", "-24", "0", "0.0", "nan", "NaN", "inf", "-inf", "24TB", "24 potatoes",
                          "0.0001", "1e7", "GB"}) {
    EXPECT_THROW(memory_size_parse(bad), Error) << bad;
  }
  try {
    memory_size_parse("-3");
  } catch (const Error& e) {
    expect_contains(e.what(), "'-3' must be more than 0");
  }
}

// The KV bytes per token the plan is given (measured on the runner: cli/memory_flags.cpp) are the model's K and V rows
// in the cache's type: 20,480 in fp16 or bf16, 10,400 in fp8 (1 byte per value and a 4-byte scale per 256 values).
TEST(MemoryPlan, Fp8KvTokenBytesAreAboutHalfOfFp16) {
  EXPECT_EQ(kv_token_bytes(KvDtype::f16, 10, 2, 256), kKvToken);
  EXPECT_EQ(kv_token_bytes(KvDtype::bf16, 10, 2, 256), kKvToken);
  EXPECT_EQ(kv_token_bytes(KvDtype::fp8, 10, 2, 256), kKvTokenFp8);
}

MemoryPlanInput with_fp8(MemoryPlanInput in) {
  in.kv_token_bytes = kKvTokenFp8;
  in.kv_dtype = KvDtype::fp8;
  return in;
}

// Issue 33: with fp8 KV the 4-bit model serves 64K tokens of context on a 24 GB card (--gpu-memory 24 on a larger
// one): --ctx-size 65536 is kept with 3 sequences at once (fp16 KV: 1, AGivenContextIsKeptAndTheSequencesFollow);
// the plan's own choice is 4 sequences of 49,152 (fp16: 3 of 33,792), on a card of 24 GiB 4 of 91,136 (fp16: 46,080),
// and one sequence alone (tern run) 216,064 (fp16: 109,568).
TEST(MemoryPlan, Fp8KvServes64KOnA24GbCard) {
  MemoryPlanInput in = with_fp8(serve_input(kH200Total - 600'000'000, 24'000'000'000));
  in.context = 65'536;
  const MemoryPlan given = memory_plan(in);
  EXPECT_EQ(given.context, 65'536);
  EXPECT_EQ(given.parallel, 3);
  EXPECT_LE(given.total_bytes, 24'000'000'000);
  EXPECT_EQ(given.session_bytes, (kState + 65'536 * kKvTokenFp8 + kMiB2 - 1) / kMiB2 * kMiB2);
  in.parallel = 1;  // and one sequence of 64K with room to spare
  EXPECT_EQ(memory_plan(in).parallel, 1);

  const MemoryPlan p = memory_plan(with_fp8(serve_input(kH200Total - 600'000'000, 24'000'000'000)));
  EXPECT_EQ(p.parallel, 4);
  EXPECT_EQ(p.context, 49'152);
  EXPECT_LE(p.total_bytes, 24'000'000'000);
  const MemoryPlan q = memory_plan(with_fp8(serve_input(24 * kGiB)));
  EXPECT_EQ(q.parallel, 4);
  EXPECT_EQ(q.context, 91'136);
  const MemoryPlan one = memory_plan(with_fp8(run_input(24'000'000'000)));
  EXPECT_EQ(one.parallel, 1);
  EXPECT_EQ(one.context, 216'064);
}

TEST(MemoryPlan, TheDescriptionNamesTheKvDtype) {
  const std::vector<std::string> lines =
      memory_plan_describe(memory_plan(with_fp8(serve_input(kH200Total - 600'000'000, 24'000'000'000))));
  ASSERT_GE(lines.size(), 2u);
  expect_contains(lines[1], "(KV cache fp8 10,400 B/token, Gated DeltaNet state 65.9 MB)");
}

}  // namespace
}  // namespace tern
