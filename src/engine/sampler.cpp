#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "core/check.h"
#include "engine/token_mask.h"

namespace tern {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool usable(float l) { return std::isfinite(l); }

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// Descending by value, then ascending by id: a total order, so results never depend on the sort's stability.
bool before(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

void SamplingParams::validate() const {
  TERN_CHECK(std::isfinite(temperature) && temperature >= 0.0f, "temperature must be a finite number >= 0, got ",
             temperature);
  TERN_CHECK(std::isfinite(top_p) && top_p > 0.0f && top_p <= 1.0f, "top_p must be in (0, 1], got ", top_p);
  TERN_CHECK(std::isfinite(min_p) && min_p >= 0.0f && min_p <= 1.0f, "min_p must be in [0, 1], got ", min_p);
  TERN_CHECK(top_k >= -1, "top_k must be -1 or 0 (off) or a positive count, got ", top_k);
  TERN_CHECK(std::isfinite(presence_penalty), "presence_penalty must be a finite number, got ", presence_penalty);
  TERN_CHECK(std::isfinite(frequency_penalty), "frequency_penalty must be a finite number, got ", frequency_penalty);
  TERN_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f,
             "repetition_penalty must be a finite number > 0, got ", repetition_penalty);
  TERN_CHECK(top_logprobs >= -1 && top_logprobs <= 20, "top_logprobs must be in [0, 20], got ", top_logprobs);
  for (const auto& [id, bias] : logit_bias)
    TERN_CHECK(!std::isnan(bias) && bias != std::numeric_limits<float>::infinity(), "logit_bias for token ", id,
               " must be a number (or -inf), got ", bias);
}

SamplingParams sampling_defaults(const Config& config) {
  SamplingParams p;
  if (config.gen_temperature) p.temperature = float(*config.gen_temperature);
  if (config.gen_top_p) p.top_p = float(*config.gen_top_p);
  if (config.gen_top_k) p.top_k = *config.gen_top_k;
  if (config.gen_min_p) p.min_p = float(*config.gen_min_p);
  if (config.gen_presence_penalty) p.presence_penalty = float(*config.gen_presence_penalty);
  if (config.gen_repetition_penalty) p.repetition_penalty = float(*config.gen_repetition_penalty);
  return p;
}

int32_t sampler_argmax(std::span<const float> logits, int64_t vocab_real) {
  int32_t best = -1;
  float best_v = kNegInf;
  const int64_t n = std::min<int64_t>(vocab_real, int64_t(logits.size()));
  for (int64_t i = 0; i < n; ++i) {
    const float v = logits[size_t(i)];
    if (usable(v) && (best < 0 || v > best_v)) {
      best = int32_t(i);
      best_v = v;
    }
  }
  return best;
}

std::vector<int32_t> sampler_top_n(std::span<const float> logits, int64_t vocab_real, int64_t n) {
  std::vector<std::pair<float, int32_t>> c;
  const int64_t v = std::min<int64_t>(vocab_real, int64_t(logits.size()));
  for (int64_t i = 0; i < v; ++i)
    if (usable(logits[size_t(i)])) c.emplace_back(logits[size_t(i)], int32_t(i));
  n = std::clamp<int64_t>(n, 0, int64_t(c.size()));
  std::partial_sort(c.begin(), c.begin() + n, c.end(), before);
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = c[size_t(i)].second;
  return out;
}

Sampler::Sampler(const SamplingParams& params, int64_t vocab_real, std::span<const int32_t> prompt)
    : params_(params), vocab_real_(vocab_real) {
  params_.validate();
  TERN_CHECK(vocab_real > 0, "sampler: vocabulary size must be positive, got ", vocab_real);
  for (const auto& [id, bias] : params_.logit_bias)
    TERN_CHECK(id >= 0 && id < vocab_real, "logit_bias names token ", id, ", outside the vocabulary [0, ", vocab_real,
               ")");
  seed_ = params_.seed ? *params_.seed : (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  uint64_t x = seed_;
  for (uint64_t& s : rng_state_) s = splitmix64(x);
  if (params_.repetition_penalty != 1.0f) {
    seen_mask_.assign(size_t(vocab_real), 0);
    for (int32_t id : prompt)
      if (id >= 0 && id < vocab_real && !seen_mask_[size_t(id)]) {
        seen_mask_[size_t(id)] = 1;
        seen_.push_back(id);
      }
  }
}

double Sampler::next_uniform() {  // xoshiro256**, top 53 bits
  uint64_t* s = rng_state_;
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return double(result >> 11) * (1.0 / 9007199254740992.0);
}

void Sampler::accept(int32_t id) {
  if (id < 0 || id >= vocab_real_) return;
  ++output_counts_[id];
  if (!seen_mask_.empty() && !seen_mask_[size_t(id)]) {
    seen_mask_[size_t(id)] = 1;
    seen_.push_back(id);
  }
}

void Sampler::apply_penalties(std::span<float> logits) const {
  const float rp = params_.repetition_penalty;
  if (rp != 1.0f)
    for (int32_t id : seen_) {
      float& l = logits[size_t(id)];
      l = l > 0.0f ? l / rp : l * rp;
    }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f)
    for (const auto& [id, count] : output_counts_)
      logits[size_t(id)] -= params_.presence_penalty + params_.frequency_penalty * float(count);
}

float Sampler::last_logprob(std::span<const float> logits, int32_t id) const {
  TERN_CHECK(id >= 0 && id < vocab_real_ && size_t(id) < logits.size(), "token ", id, " is outside the vocabulary [0, ",
             vocab_real_, ")");
  return float(double(logits[size_t(id)]) - last_max_ - last_log_z(logits));
}

double Sampler::last_log_z(std::span<const float> logits) const {
  if (!log_z_known_) {
    double z = 0.0;
    for (int64_t i = 0; i < vocab_real_; ++i)
      if (usable(logits[size_t(i)])) z += std::exp(double(logits[size_t(i)]) - last_max_);
    last_z_ = z;
    last_log_z_ = std::log(z);
    log_z_known_ = true;
  }
  return last_log_z_;
}

int32_t Sampler::sample(std::span<float> logits, SampleInfo* info, std::span<const uint32_t> allowed) {
  TERN_CHECK(int64_t(logits.size()) >= vocab_real_, "sampler: ", logits.size(), " logits for a vocabulary of ",
             vocab_real_);
  const int64_t n = vocab_real_;
  for (const auto& [id, bias] : params_.logit_bias) logits[size_t(id)] += bias;
  apply_penalties(logits);
  if (!allowed.empty()) apply_token_mask(logits.first(size_t(n)), allowed);

  const bool greedy = params_.greedy();
  if (!greedy) {
    const float inv_t = 1.0f / params_.temperature;
    for (int64_t i = 0; i < n; ++i) logits[size_t(i)] *= inv_t;
  }

  // Maximum and normaliser of the (scaled) distribution over the usable ids.
  float m = kNegInf;
  int64_t n_usable = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float l = logits[size_t(i)];
    if (usable(l)) {
      ++n_usable;
      m = std::max(m, l);
    }
  }
  TERN_CHECK(n_usable > 0, allowed.empty() ? "sampler: no token has a finite logit (every id is banned or the model "
                                              "output is not finite)"
                                            : "sampler: no token that the output constraint allows has a finite "
                                              "logit (every allowed id is banned or the model output is not finite)");
  last_max_ = m;
  log_z_known_ = false;  // the normaliser when something reads it (last_log_z): a pass of exp over the vocabulary

  int32_t chosen = -1;
  if (greedy) {
    chosen = sampler_argmax(logits, n);
  } else if (params_.top_k <= 0 && params_.top_p >= 1.0f) {
    // No ordering needed: inverse CDF in id order over the ids that pass min-p.
    const float threshold = params_.min_p > 0.0f ? m + std::log(params_.min_p) : kNegInf;
    double kept = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const float l = logits[size_t(i)];
      if (usable(l) && l >= threshold) kept += std::exp(double(l) - m);
    }
    const double u = next_uniform() * kept;
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const float l = logits[size_t(i)];
      if (!usable(l) || l < threshold) continue;
      chosen = int32_t(i);  // the last kept id catches rounding at the top end
      acc += std::exp(double(l) - m);
      if (u < acc) break;
    }
  } else {
    // Candidates: the top c ids (before's order, a total one, so the set is unique): c = top_k, in one pass that
    // keeps the c best seen so far (a heap whose top is the worst of them); without top-k, the top 1024 widened until
    // they hold top_p of the mass.
    scratch_.clear();
    int64_t c = 0;
    if (params_.top_k > 0) {
      c = std::min<int64_t>(params_.top_k, n_usable);
      for (int64_t i = 0; i < n; ++i) {
        const float l = logits[size_t(i)];
        if (!usable(l)) continue;
        const std::pair<float, int32_t> e{l, int32_t(i)};
        if (int64_t(scratch_.size()) < c) {
          scratch_.push_back(e);
          std::push_heap(scratch_.begin(), scratch_.end(), before);
        } else if (before(e, scratch_.front())) {
          std::pop_heap(scratch_.begin(), scratch_.end(), before);
          scratch_.back() = e;
          std::push_heap(scratch_.begin(), scratch_.end(), before);
        }
      }
    } else {
      for (int64_t i = 0; i < n; ++i)
        if (usable(logits[size_t(i)])) scratch_.emplace_back(logits[size_t(i)], int32_t(i));
      const int64_t total = int64_t(scratch_.size());
      last_log_z(logits);
      const double z = last_z_;
      c = std::min<int64_t>(1024, total);
      for (;;) {
        std::nth_element(scratch_.begin(), scratch_.begin() + (c - 1), scratch_.end(), before);
        if (c == total) break;
        double mass = 0.0;
        for (int64_t i = 0; i < c; ++i) mass += std::exp(double(scratch_[size_t(i)].first) - m);
        if (mass / z >= double(params_.top_p)) break;
        c = std::min<int64_t>(total, c * 4);
      }
    }
    std::sort(scratch_.begin(), scratch_.begin() + c, before);
    // Top-p over the candidates' renormalised mass: keep the shortest prefix whose mass reaches top_p.
    double cand_mass = 0.0;
    for (int64_t i = 0; i < c; ++i) cand_mass += std::exp(double(scratch_[size_t(i)].first) - m);
    int64_t keep = c;
    if (params_.top_p < 1.0f) {
      double acc = 0.0;
      for (int64_t i = 0; i < c; ++i) {
        if (acc >= double(params_.top_p) * cand_mass) {
          keep = i;
          break;
        }
        acc += std::exp(double(scratch_[size_t(i)].first) - m);
      }
      keep = std::max<int64_t>(keep, 1);
    }
    if (params_.min_p > 0.0f) {
      const float threshold = scratch_[0].first + std::log(params_.min_p);
      int64_t k = 1;
      while (k < keep && scratch_[size_t(k)].first >= threshold) ++k;
      keep = k;
    }
    double kept = 0.0;
    for (int64_t i = 0; i < keep; ++i) kept += std::exp(double(scratch_[size_t(i)].first) - m);
    const double u = next_uniform() * kept;
    double acc = 0.0;
    for (int64_t i = 0; i < keep; ++i) {
      chosen = scratch_[size_t(i)].second;
      acc += std::exp(double(scratch_[size_t(i)].first) - m);
      if (u < acc) break;
    }
  }

  if (info && params_.top_logprobs >= 0) {
    const double log_z = last_log_z(logits);
    info->logprob = float(double(logits[size_t(chosen)]) - m - log_z);
    info->top.clear();
    for (int32_t id : sampler_top_n(logits, n, params_.top_logprobs))
      info->top.push_back({id, float(double(logits[size_t(id)]) - m - log_z)});
  }
  return chosen;
}

}  // namespace tern
