#include "engine/bench_speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <span>

#include "core/check.h"
#include "engine/bench_run.h"
#include "engine/draft_mtp.h"
#include "engine/generation_run.h"
#include "engine/generator.h"

namespace tern {

namespace {

using Clock = std::chrono::steady_clock;

// The end-to-end runs' drafter: the reference continuation's next tokens, each replaced by another token with
// probability 1 - acceptance; the count fixed (no policy), so that the rows show what k drafts give.
class ControlledDrafter final : public Drafter {
 public:
  ControlledDrafter(const std::vector<int32_t>& reference, int drafts, double acceptance, uint64_t seed, int64_t vocab)
      : ref_(reference), drafts_(drafts), acceptance_(acceptance), vocab_(vocab), rng_(seed) {}
  void append(int32_t) override { ++emitted_; }
  std::vector<int32_t> draft(int64_t limit) override {
    // The step feeds output token emitted_ - 1; draft i guesses output token emitted_ + i.
    const int64_t n = std::min<int64_t>({limit, drafts_, int64_t(ref_.size()) - emitted_});
    std::vector<int32_t> out;
    for (int64_t i = 0; i < n; ++i) {
      int32_t t = ref_[size_t(emitted_ + i)];
      if (!(coin_(rng_) < acceptance_)) t = int32_t((t + 1 + int64_t(rng_() % uint64_t(vocab_ - 1))) % vocab_);
      out.push_back(t);
    }
    return out;
  }
  void record(int, int) override {}

 private:
  const std::vector<int32_t>& ref_;
  int64_t drafts_;
  double acceptance_;
  int64_t vocab_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> coin_{0.0, 1.0};
  int64_t emitted_ = 0;
};

// Milliseconds of each of `repeats` calls of f after `warmup` untimed ones.
template <class F>
std::vector<double> timed(int warmup, int repeats, F&& f) {
  std::vector<double> ms;
  for (int i = 0; i < warmup + repeats; ++i) {
    const auto t0 = Clock::now();
    f();
    if (i >= warmup) ms.push_back(bench_ms_since(t0));
  }
  return ms;
}

// Feeds tokens[position, size) in the runner's prefill chunks, the MTP head after each.
void prefill(ModelRunner& runner, Session& s, std::span<const int32_t> tokens, MtpDrafter* mtp) {
  std::vector<float> logits;
  const int64_t chunk = std::max<int64_t>(1, runner.preferred_prefill_chunk());
  while (s.position() < int64_t(tokens.size())) {
    const int64_t pos = s.position(), n = std::min<int64_t>(chunk, int64_t(tokens.size()) - pos);
    runner.forward(s, tokens.subspan(size_t(pos), size_t(n)), false, logits);
    if (mtp) mtp->catch_up();
  }
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser: independent seeds per run
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void check_options(const ModelRunner& runner, const SpecBenchOptions& o) {
  TERN_CHECK(runner.supports_verify(), "tern bench --speculative: the ", runner.backend_name(),
             " backend cannot verify drafts yet");
  TERN_CHECK(runner.vocab_real() >= 2, "tern bench --speculative: a vocabulary of ", runner.vocab_real(), " tokens");
  TERN_CHECK(!o.lengths.empty(), "tern bench --speculative: no lengths");
  TERN_CHECK(o.max_drafts >= 1 && o.max_drafts <= 32, "--draft-max must be in [1, 32], got ", o.max_drafts);
  TERN_CHECK(o.tokens >= 2, "tern bench --speculative: --decode-steps (tokens per run) must be >= 2, got ", o.tokens);
  TERN_CHECK(o.repeats >= 1 && o.warmup >= 0, "--repeats must be >= 1 and --warmup >= 0");
  for (int k : o.draft_counts)
    TERN_CHECK(k >= 1 && k <= o.max_drafts, "--draft-counts: ", k, " is outside [1, --draft-max ", o.max_drafts, "]");
  for (double a : o.acceptance)
    TERN_CHECK(a >= 0.0 && a <= 1.0, "--acceptance: ", a, " is outside [0, 1]");
  for (int64_t L : o.lengths) {
    TERN_CHECK(L >= 2, "tern bench --speculative: length ", L, " must be >= 2");
    const int64_t need = L + std::max<int64_t>(o.tokens + 1, o.warmup + o.repeats) + o.max_drafts + 2;
    TERN_CHECK(need <= runner.config().max_position_embeddings, "tern bench --speculative: length ",
               bench_length_label(L), " with ", o.tokens, " tokens per run needs ", need,
               " positions; the model has ", runner.config().max_position_embeddings);
  }
}

}  // namespace

double spec_tokens_per_step(double p, int k) {
  if (p >= 1.0) return double(k + 1);
  return (1.0 - std::pow(p, k + 1)) / (1.0 - p);
}

double spec_computed_speedup(double p, int k, double plain_ms, double verify_ms, double draft_ms) {
  const double step_ms = verify_ms + draft_ms;
  if (!std::isfinite(plain_ms) || !std::isfinite(step_ms) || !std::isfinite(p) || plain_ms <= 0 || step_ms <= 0 ||
      draft_ms < 0)
    return 0;
  return spec_tokens_per_step(p, k) * plain_ms / step_ms;
}

std::vector<double> bench_parse_acceptance(const std::string& text) {
  std::vector<double> out;
  for (const std::string& item : bench_split_list(text, "--acceptance")) {
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TERN_CHECK(used == item.size() && v >= 0.0 && v <= 1.0, "--acceptance: '", item,
               "' is not a probability in [0, 1] (like 0.8)");
    out.push_back(v);
  }
  return out;
}

std::vector<int> bench_parse_draft_counts(const std::string& text, int max_drafts) {
  std::vector<int> out;
  for (const std::string& item : bench_split_list(text, "--draft-counts")) {
    TERN_CHECK(item.size() <= 3 && std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; }),
               "--draft-counts: '", item, "' is not a count (like 3)");
    const int v = std::stoi(item);
    TERN_CHECK(v >= 1 && v <= max_drafts, "--draft-counts: ", v, " is outside [1, --draft-max ", max_drafts, "]");
    out.push_back(v);
  }
  return out;
}

SpecBenchReport bench_speculative(ModelRunner& runner, const SpecBenchOptions& o) {
  check_options(runner, o);
  SpecBenchReport rep;
  rep.backend = runner.backend_name();
  rep.options = o;
  rep.options.log = nullptr;
  rep.mtp = runner.supports_mtp();
  const int64_t vocab = runner.vocab_real();
  auto log = [&](const std::string& line) {
    if (o.log) o.log(line);
  };
  Generator gen(runner, TokenTextSource{.bytes = [](int32_t) { return std::string(); }, .is_special = {}});
  std::vector<float> logits;

  for (int64_t L : o.lengths) {
    const std::string label = bench_length_label(L);
    std::mt19937_64 rng(mix(o.seed ^ uint64_t(L)));
    std::uniform_int_distribution<int32_t> any(0, int32_t(vocab - 1));
    std::vector<int32_t> prompt(static_cast<size_t>(L)), filler(static_cast<size_t>(o.max_drafts + 1));
    for (auto& t : prompt) t = any(rng);
    for (auto& t : filler) t = any(rng);
    SpecBenchPoint pt;
    pt.length = L;
    auto s = runner.create_session(L + std::max<int64_t>(o.tokens + 1, o.warmup + o.repeats) + o.max_drafts + 2);

    // ---- verify and draft costs at L, then the plain step ----
    log("length " + label + ": prefill");
    std::unique_ptr<MtpDrafter> mtp;
    if (rep.mtp) mtp = std::make_unique<MtpDrafter>(runner, *s, prompt);
    prefill(runner, *s, prompt, mtp.get());
    // At least two untimed calls of each kind: a CUDA runner runs a step's first call eagerly and captures its graph
    // in the second, which would otherwise be among the timed ones (the median of two runs is their mean).
    const int warm = std::max(o.warmup, 2);
    // The verify as the generation runs it: its rows' ids sampled on the device where the runner can (greedy, no
    // mask), else its logits to the host.
    const DeviceSampling greedy{};
    std::vector<int32_t> ids;
    bool verify_on_device = true;
    for (int k = 0; k <= o.max_drafts; ++k) {
      SpecVerifyRow row;
      row.drafts = k;
      std::vector<double> rollback_ms;  // every call's, the warm-up ones first
      row.ms = timed(warm, o.repeats, [&] {
        const std::span<const int32_t> tokens = std::span<const int32_t>(filler).first(size_t(k + 1));
        if (!(verify_on_device && runner.forward_verify_sample(*s, tokens, greedy, ids))) {
          verify_on_device = false;
          runner.forward_verify(*s, tokens, logits);
        }
        const auto t0 = Clock::now();
        s->rollback(L);  // synchronous: returns once the states are back
        rollback_ms.push_back(bench_ms_since(t0));
      });
      row.ms_median = bench_median(row.ms);
      row.rollback_ms.assign(rollback_ms.begin() + warm, rollback_ms.end());
      row.rollback_ms_median = bench_median(row.rollback_ms);
      pt.verify.push_back(std::move(row));
    }
    if (mtp) {
      mtp->append(filler[0]);  // x_L: the token a step at L feeds
      for (int k = 1; k <= o.max_drafts; ++k) {
        SpecVerifyRow& row = pt.verify[size_t(k)];
        row.mtp_ms = timed(warm, o.repeats, [&] {
          const std::vector<int32_t> d = mtp->draft(k);
          TERN_INTERNAL_CHECK(int64_t(d.size()) == k && mtp->usable(), "the MTP head drafted ", d.size(), " of ", k);
        });
        row.mtp_ms_median = bench_median(row.mtp_ms);
      }
      mtp.reset();
    }
    bool on_device = true;
    int64_t next = 0;
    pt.plain_ms = timed(warm, o.repeats, [&] {
      const int32_t tok[1] = {filler[size_t(next++ % int64_t(filler.size()))]};
      if (on_device && runner.forward_sample(*s, tok, greedy)) return;
      on_device = false;  // no device path: the logits come to the host, as the generation then takes them
      runner.forward(*s, tok, false, logits);
    });
    rep.plain_path = on_device ? "forward_sample" : "forward";
    rep.verify_path = verify_on_device ? "forward_verify_sample" : "forward_verify";
    pt.plain_ms_median = bench_median(pt.plain_ms);
    for (SpecVerifyRow& row : pt.verify) row.ratio = row.ms_median / pt.plain_ms_median;
    {
      char buf[160];
      std::snprintf(buf, sizeof buf, "length %s: plain step %.3f ms, verify of 1 + %d drafts %.3f ms", label.c_str(),
                    pt.plain_ms_median, o.max_drafts, pt.verify.back().ms_median);
      log(buf);
    }

    // ---- end to end through GenerationRun ----
    s->reset();
    std::unique_ptr<StateSnapshot> snap;
    rep.snapshots = s->can_snapshot();
    if (rep.snapshots) {
      prefill(runner, *s, std::span<const int32_t>(prompt).first(size_t(L - 1)), nullptr);
      snap = s->snapshot();
    }
    GenerationRequest req;
    req.prompt = prompt;
    req.sampling.temperature = 0.0f;
    req.max_tokens = o.tokens;
    req.ignore_eos = true;
    int64_t decode_forwards = 0;  // of the last run: its forwards after the prompt
    auto generate = [&](std::unique_ptr<Drafter> drafter) {
      if (snap) s->restore(*snap);
      else s->reset();
      GenerationRun run(gen, *s, req, nullptr, std::move(drafter));
      BatchEntry e;
      decode_forwards = 0;
      while (!run.finished()) {
        const bool decode = !run.prefilling();
        if (!run.next_step(e, INT64_MAX)) break;
        runner.forward_batch(std::span<BatchEntry>(&e, 1));
        decode_forwards += decode;
        run.step_done(e);
      }
      return run.take_result();
    };
    std::vector<int32_t> reference;
    auto add = [&](SpecEndToEndRow& row, const GenerationResult& r, bool is_timed) {
      if (reference.empty()) {
        TERN_INTERNAL_CHECK(int64_t(r.tokens.size()) == o.tokens, "the reference run generated ", r.tokens.size(),
                            " of ", o.tokens, " tokens (", finish_reason_name(r.finish), ")");
        reference = r.tokens;
      }
      ++row.runs;
      row.drafted += r.draft_tokens;
      row.accepted += r.accepted_draft_tokens;
      row.generated += int64_t(r.tokens.size()) - 1;
      row.decode_steps += decode_forwards;
      if (r.tokens != reference) {
        ++row.mismatches;
        int64_t at = 0;
        while (at < int64_t(std::min(r.tokens.size(), reference.size())) && r.tokens[size_t(at)] == reference[size_t(at)])
          ++at;
        row.first_mismatch = row.first_mismatch < 0 ? at : std::min(row.first_mismatch, at);
      }
      if (is_timed) row.tok_s.push_back(r.decode_tok_s());
    };
    log("length " + label + ": end to end, no drafts (the reference)");
    SpecEndToEndRow plain;
    for (int i = 0; i < o.warmup + o.repeats; ++i) add(plain, generate(nullptr), i >= o.warmup);
    plain.tok_s_median = bench_median(plain.tok_s);
    plain.speedup = 1.0;
    pt.end_to_end.push_back(plain);
    for (int k : o.draft_counts) {
      for (double a : o.acceptance) {
        char buf[120];
        std::snprintf(buf, sizeof buf, "length %s: end to end, %d drafts at acceptance %.2f", label.c_str(), k, a);
        log(buf);
        SpecEndToEndRow row;
        row.drafts = k;
        row.acceptance = a;
        for (int i = 0; i < o.warmup + o.repeats; ++i) {
          const uint64_t seed = mix(o.seed ^ mix(uint64_t(L) * 1000003u + uint64_t(k) * 101u + uint64_t(i)) ^
                                    uint64_t(std::llround(a * 1e6)));
          add(row, generate(std::make_unique<ControlledDrafter>(reference, k, a, seed, vocab)), i >= o.warmup);
        }
        row.tok_s_median = bench_median(row.tok_s);
        row.speedup = row.tok_s_median / plain.tok_s_median;
        // The controlled drafter costs nothing: the verify alone.
        row.computed_speedup = spec_computed_speedup(a, k, pt.plain_ms_median, pt.verify[size_t(k)].ms_median);
        pt.end_to_end.push_back(row);
      }
    }
    for (const SpecEndToEndRow& row : pt.end_to_end) {
      rep.mismatches += row.mismatches;
      rep.runs += row.runs;
    }

    // ---- computed: the published acceptance of this model's MTP head ----
    for (int k : kPublishedMtpDrafts) {
      if (k > o.max_drafts) continue;
      for (double p : kPublishedMtpAcceptance) {
        SpecPublishedRow row;
        row.drafts = k;
        row.acceptance = p;
        row.tokens_per_step = spec_tokens_per_step(p, k);
        const SpecVerifyRow& v = pt.verify[size_t(k)];
        row.draft_cost = v.mtp_ms_median > 0;
        row.cost_ratio = (v.ms_median + v.mtp_ms_median) / pt.plain_ms_median;
        row.speedup = spec_computed_speedup(p, k, pt.plain_ms_median, v.ms_median, v.mtp_ms_median);
        pt.published.push_back(row);
      }
    }
    rep.points.push_back(std::move(pt));
  }
  return rep;
}

}  // namespace tern
