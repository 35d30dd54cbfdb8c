// tern logits: float32 logits of every position as .npy, for checking tern against reference implementations.
//
//   tern logits -m DIR --tokens 1,2,3 --out FILE.npy [--prefill N] [--dump-activations DIR] [--dtype stored]
//               [--device cpu|cuda|auto]
//               [--image-pixels PIXELS.npy --image-grids GRIDS.npy]
//               [--mtp-out MTP.npy [--mtp-draft 7,8] [--draft-weights FILE]]
//
// The first N tokens (default: all) go through one prefill; the rest are decoded one at a time, continuing the
// same session, so one command checks both paths. The output is [T, V]; padded ids (>= the tokenizer's id count)
// are -inf.
//
// Images: PIXELS.npy float32 [patches, patch_dim] (every image's pixel_values, one after another, as transformers
// takes them) and GRIDS.npy int32 [images, 3] (grid_thw). The tokens hold one run of <|image_pad|> per image, in
// order; each image is encoded by the vision encoder and its run's embeddings replaced, with the 3-axis M-RoPE
// positions (ModelRunner::forward_images). A prefill may end inside an image: its other tokens are decoded one by
// one, each with its own row.
//
// --mtp-out also runs the MTP draft head as the engine would: after each forward call, over every pair
// (h_t, x_{t+1}) whose token is known, then a draft chain over the --mtp-draft tokens d_1..d_k: (h_{T-1}, d_1) at
// position T-1, then (the head's own output, d_j) at T-2+j. Its logits are [T-1+k, V]: row t predicts token t+2.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/backend_select.h"
#include "cli/commands.h"
#include "cli/memory_flags.h"
#include "cli/model_flags.h"
#include "core/check.h"
#include "core/npy.h"
#include "cpu/cpu_runner.h"
#include "model/checkpoint.h"
#include "model/image_input.h"

namespace tern::cli {
namespace {

struct LogitsArgs {
  std::string model_dir, tokens, tokens_file, out, dump_dir, dtype = "stored", gdn = "chunked", device = "cpu";
  std::string kv_dtype = "f16";  // --kv-dtype (CUDA; the CPU takes only the default)
  std::string image_pixels, image_grids;
  std::string mtp_out, mtp_draft, draft_weights;
  int64_t prefill = -1;
  int gdn_chunk = 64;
};

std::vector<int32_t> read_tokens(const LogitsArgs& a) {
  TERN_CHECK(a.tokens.empty() != a.tokens_file.empty(), "give exactly one of --tokens and --tokens-file");
  if (!a.tokens.empty()) return token_list_parse(a.tokens, "--tokens");
  if (a.tokens_file.size() > 4 && a.tokens_file.substr(a.tokens_file.size() - 4) == ".npy") {
    NpyArray arr = npy_read(a.tokens_file);
    TERN_CHECK(arr.dtype == "<i4", "--tokens-file ", a.tokens_file, " must hold int32 ids, got ", arr.dtype);
    return arr.i32;
  }
  std::ifstream f(a.tokens_file);
  TERN_CHECK(f.good(), "cannot open --tokens-file ", a.tokens_file);
  std::stringstream ss;
  ss << f.rdbuf();
  return token_list_parse(ss.str(), a.tokens_file);
}

// The prompt's images: each encoded, and where its run of <|image_pad|> tokens starts.
struct PromptImages {
  std::vector<ImageEmbeddings> encoded;
  std::vector<int64_t> offsets;

  // The spans of the tokens [from, to).
  std::vector<ImageSpan> spans(int64_t from, int64_t to) const {
    std::vector<ImageSpan> out;
    for (size_t i = 0; i < encoded.size(); ++i)
      if (std::optional<ImageSpan> s = image_span_within(offsets[i], encoded[i].tokens, from, to)) {
        s->image = &encoded[i];
        out.push_back(*s);
      }
    return out;
  }
};

PromptImages encode_images(const LogitsArgs& a, ModelRunner& runner, const std::vector<int32_t>& tokens) {
  PromptImages out;
  TERN_CHECK(a.image_pixels.empty() == a.image_grids.empty(), "give both --image-pixels and --image-grids, or neither");
  if (a.image_pixels.empty()) return out;
  const std::string why = runner.images_unavailable();
  TERN_CHECK(why.empty(), a.model_dir, ": ", why);
  const NpyArray pixels = npy_read(a.image_pixels), grids = npy_read(a.image_grids);
  TERN_CHECK(pixels.dtype == "<f4" && pixels.shape.size() == 2, "--image-pixels must be float32 [patches, patch_dim]");
  TERN_CHECK(grids.dtype == "<i4" && grids.shape.size() == 2 && grids.shape[1] == 3,
             "--image-grids must be int32 [images, 3]");
  const int64_t width = pixels.shape[1];
  int64_t row = 0;
  for (int64_t i = 0; i < grids.shape[0]; ++i) {
    ImagePixels p;
    p.grid = {grids.i32[size_t(3 * i)], grids.i32[size_t(3 * i + 1)], grids.i32[size_t(3 * i + 2)]};
    p.patch_dim = width;
    const int64_t rows = p.grid.t * p.grid.h * p.grid.w;
    TERN_CHECK(rows > 0 && row + rows <= pixels.shape[0], "--image-grids: image ", i, " needs patches [", row, ", ",
               row + rows, ") of ", pixels.shape[0]);
    p.values.assign(pixels.f32.begin() + row * width, pixels.f32.begin() + (row + rows) * width);
    row += rows;
    out.encoded.push_back(runner.encode_image(p));
  }
  TERN_CHECK(row == pixels.shape[0], "--image-pixels has ", pixels.shape[0], " patches; the grids use ", row);
  const int32_t pad = runner.config().image_token_id;
  for (int64_t t = 0; t < int64_t(tokens.size()); ++t) {
    if (tokens[size_t(t)] != pad || (t > 0 && tokens[size_t(t - 1)] == pad)) continue;
    const size_t i = out.offsets.size();
    TERN_CHECK(i < out.encoded.size(), "the tokens hold more runs of <|image_pad|> (", pad, ") than the ",
               out.encoded.size(), " images");
    int64_t n = 0;
    while (t + n < int64_t(tokens.size()) && tokens[size_t(t + n)] == pad) ++n;
    TERN_CHECK(n == out.encoded[i].tokens, "image ", i, "'s run at token ", t, " has ", n, " tokens; its grid makes ",
               out.encoded[i].tokens);
    out.offsets.push_back(t);
  }
  TERN_CHECK(out.offsets.size() == out.encoded.size(), out.encoded.size(), " images for ", out.offsets.size(),
             " runs of <|image_pad|> in the tokens");
  return out;
}

void run_logits(const LogitsArgs& a) {
  const std::vector<int32_t> tokens = read_tokens(a);
  const int64_t T = int64_t(tokens.size());
  TERN_CHECK(T > 0, "no tokens given");
  const int64_t prefill = a.prefill < 0 ? T : a.prefill;
  TERN_CHECK(prefill >= 1 && prefill <= T, "--prefill ", prefill, " must be in [1, ", T, "]");
  TERN_CHECK(a.gdn == "chunked" || a.gdn == "recurrent", "--gdn must be chunked or recurrent, got '", a.gdn, "'");

  LoadOptions lo;
  lo.dtype = load_dtype_parse(a.dtype);
  lo.progress = false;
  lo.draft_weights = a.draft_weights;
  auto weights = std::make_shared<ModelWeights>(model_load(a.model_dir, lo));
  const std::string device = device_resolve(a.device);
  const KvDtype kv = kv_dtype_parse(a.kv_dtype);
  if (device == "cpu") cpu_kv_dtype_check(kv);
  auto runner = device == "cpu" ? cpu_runner_create(weights, CpuRunnerOptions{.gdn_chunked = a.gdn == "chunked",
                                                                              .gdn_chunk = a.gdn_chunk})
                                : runner_create(weights, device, kv);
  if (!a.dump_dir.empty()) runner->set_activation_dump_dir(a.dump_dir);
  const int64_t V = runner->config().vocab_size;

  const bool mtp = !a.mtp_out.empty();
  const std::vector<int32_t> drafts = a.mtp_draft.empty() ? std::vector<int32_t>{}
                                                           : token_list_parse(a.mtp_draft, "--mtp-draft");
  TERN_CHECK(!mtp || runner->supports_mtp(), a.model_dir, " has no MTP draft head: ", weights->mtp_absent);
  TERN_CHECK(mtp || drafts.empty(), "--mtp-draft needs --mtp-out");
  const PromptImages images = encode_images(a, *runner, tokens);
  auto session = runner->create_session(T + int64_t(drafts.size()));
  std::vector<float> all, step, mtp_all, mtp_step, mtp_h;
  // The pairs (h_t, x_{t+1}) the last forward made known: t from the head's rows to the session's position - 2.
  auto feed_mtp = [&] {
    if (!mtp) return;
    int64_t h0 = 0;
    const std::span<const float> h = runner->mtp_hidden(*session, &h0);
    const int64_t from = runner->mtp_rows(*session), to = session->position() - 1;  // pairs [from, to)
    if (to <= from) return;
    const int64_t D = weights->config.hidden_size;
    runner->forward_mtp(*session, h.subspan(size_t((from - h0) * D), size_t((to - from) * D)),
                        std::span(tokens).subspan(size_t(from + 1), size_t(to - from)), from, true, mtp_step, mtp_h);
    mtp_all.insert(mtp_all.end(), mtp_step.begin(), mtp_step.end());
  };
  const auto t0 = std::chrono::steady_clock::now();
  runner->forward_images(*session, std::span(tokens).first(size_t(prefill)), images.spans(0, prefill), true, all);
  feed_mtp();
  const auto t1 = std::chrono::steady_clock::now();
  if (!a.dump_dir.empty()) runner->set_activation_dump_dir("");  // dumps describe the prefill
  for (int64_t t = prefill; t < T; ++t) {
    runner->forward_images(*session, std::span(tokens).subspan(size_t(t), 1), images.spans(t, t + 1), false, step);
    all.insert(all.end(), step.begin(), step.end());
    feed_mtp();
  }
  const auto t2 = std::chrono::steady_clock::now();
  npy_write_f32(a.out, all.data(), {T, V});
  if (mtp) {  // the draft chain: (h_{T-1}, d_1) at T-1, then (the head's output, d_j)
    const int64_t D = weights->config.hidden_size;
    int64_t h0 = 0;
    const std::span<const float> h = runner->mtp_hidden(*session, &h0);
    std::vector<float> prev(h.end() - D, h.end());
    for (size_t j = 0; j < drafts.size(); ++j) {
      runner->forward_mtp(*session, prev, std::span(drafts).subspan(j, 1), T - 1 + int64_t(j), false, mtp_step, mtp_h);
      mtp_all.insert(mtp_all.end(), mtp_step.begin(), mtp_step.end());
      prev = mtp_h;
    }
    npy_write_f32(a.mtp_out, mtp_all.data(), {int64_t(mtp_all.size()) / V, V});
  }
  const double sp = std::chrono::duration<double>(t1 - t0).count(), sd = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(stderr, "tern logits: %lld tokens (prefill %lld: %.1f tok/s", (long long)T, (long long)prefill,
               double(prefill) / sp);
  if (T > prefill)
    std::fprintf(stderr, "; decode %lld: %.2f tok/s", (long long)(T - prefill), double(T - prefill) / sd);
  std::fprintf(stderr, ") -> %s [%lld, %lld]\n", a.out.c_str(), (long long)T, (long long)V);
}

}  // namespace

void command_logits(CLI::App& app) {
  auto args = std::make_shared<LogitsArgs>();
  auto* sub = app.add_subcommand("logits", "Write the float32 logits of every position as .npy (the CPU backend "
                                             "unless --device cuda)");
  sub->add_option("-m,--model", args->model_dir, "Checkpoint directory")->required();
  sub->add_option("--tokens", args->tokens, "Token ids, comma separated");
  sub->add_option("--tokens-file", args->tokens_file, "File of token ids (text, or int32 .npy)");
  sub->add_option("--out", args->out, "Output .npy: float32 [T, V]")->required();
  sub->add_option("--prefill", args->prefill, "Prefill this many tokens at once, decode the rest one by one");
  sub->add_option("--dump-activations", args->dump_dir, "Write each named intermediate of the prefill here");
  sub->add_option("--dtype", args->dtype, "Weights: stored (as in the files), auto, q4 or bf16")
      ->capture_default_str();
  sub->add_option("--image-pixels", args->image_pixels,
                  "Images' pixel_values, float32 [patches, patch_dim] .npy (with --image-grids)");
  sub->add_option("--image-grids", args->image_grids, "Images' grid_thw, int32 [images, 3] .npy: one run of "
                                                      "<|image_pad|> tokens each, in order");
  sub->add_option("--mtp-out", args->mtp_out, "Also write the MTP draft head's logits here: float32 [T-1+k, V]");
  sub->add_option("--mtp-draft", args->mtp_draft, "With --mtp-out: k tokens for a draft chain after the last token");
  sub->add_option("--draft-weights", args->draft_weights, "The MTP draft head from this file (tern extract-mtp)");
  sub->add_option("--device", args->device, "cpu (the reference), cuda or auto")->capture_default_str();
  kv_dtype_flag_add(sub, args->kv_dtype);
  sub->add_option("--gdn", args->gdn, "Gated DeltaNet prefill on the CPU: chunked or recurrent")->capture_default_str();
  sub->add_option("--gdn-chunk", args->gdn_chunk, "Chunk size of the chunked Gated DeltaNet")->capture_default_str();
  sub->callback([args] { run_logits(*args); });
}

}  // namespace tern::cli
