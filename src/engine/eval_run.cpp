#include "engine/eval_run.h"

#include <algorithm>
#include <climits>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/npy.h"

namespace tern {

EvalSummary eval_run(ModelRunner& runner, std::span<const int32_t> tokens, const ReferenceLogits* reference,
                     const EvalOptions& options) {
  const int64_t n = int64_t(tokens.size());
  const int64_t V = runner.config().vocab_size;
  const int64_t vocab_real = runner.vocab_real();
  TERN_CHECK(n > 0, "eval: the token sequence is empty");
  TERN_CHECK(options.batch > 0, "eval: batch must be positive, got ", options.batch);
  TERN_CHECK(options.context >= 0, "eval: context must be >= 0, got ", options.context);
  for (int64_t i = 0; i < n; ++i)
    TERN_CHECK(tokens[i] >= 0 && tokens[i] < vocab_real, "eval: token ", i, " has id ", tokens[i],
               ", outside the model's vocabulary [0, ", vocab_real, ")");
  const int64_t window = options.context > 0 ? std::min(options.context, n) : n;
  if (reference) {
    TERN_CHECK(reference->data != nullptr, "eval: reference logits have no data");
    TERN_CHECK(reference->rows == n, "eval: reference logits have ", reference->rows, " rows but the token file has ",
               n, " tokens (one row per token expected)");
    TERN_CHECK(reference->cols >= vocab_real, "eval: reference logits have ", reference->cols,
               " columns, fewer than the model's ", vocab_real, " real vocabulary ids");
    TERN_CHECK(window == n, "eval: reference logits cover one pass over all ", n,
               " tokens; a context window of ", options.context, " tokens would score other contexts");
  }

  EvalAccumulator acc(vocab_real);
  std::vector<float> logits;  // [b, V]
  auto session = runner.create_session(window);
  for (int64_t start = 0; start < n; start += window) {
    const int64_t end = std::min(n, start + window);
    session->reset();
    for (int64_t b0 = start; b0 < end; b0 += options.batch) {
      const int64_t b1 = std::min(end, b0 + options.batch);
      runner.forward(*session, tokens.subspan(size_t(b0), size_t(b1 - b0)), /*all_logits=*/true, logits);
      TERN_CHECK(int64_t(logits.size()) == (b1 - b0) * V, "eval: the runner returned ", logits.size(),
                 " logits for ", b1 - b0, " tokens of vocabulary ", V);
      for (int64_t i = b0; i < b1; ++i) {
        std::span<const float> row(logits.data() + (i - b0) * V, size_t(V));
        std::span<const float> ref;
        if (reference) ref = std::span<const float>(reference->data + i * reference->cols, size_t(reference->cols));
        const int32_t next = i + 1 < end ? tokens[size_t(i + 1)] : -1;
        acc.add(row, ref, next);
      }
      if (options.progress) options.progress(b1, n);
    }
  }
  if (options.positions) *options.positions = acc.positions();
  return acc.summary();
}

std::vector<int32_t> eval_tokens_read(const std::filesystem::path& path) {
  if (path.extension() == ".npy") {
    NpyArray a = npy_read(path);
    TERN_CHECK(a.dtype == "<i4", "token file ", path.string(), " holds dtype ", a.dtype,
               "; token ids must be int32 (numpy.int32)");
    TERN_CHECK(!a.i32.empty(), "token file ", path.string(), " holds no token ids");
    for (size_t i = 0; i < a.i32.size(); ++i)
      TERN_CHECK(a.i32[i] >= 0, "token file ", path.string(), ": id ", a.i32[i], " at index ", i, " is negative");
    return std::move(a.i32);
  }
  std::ifstream in(path, std::ios::binary);
  TERN_CHECK(in.good(), "cannot open token file ", path.string());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<int32_t> tokens;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (std::isspace(static_cast<unsigned char>(c)) || c == ',' || c == '[' || c == ']') {
      ++i;
      continue;
    }
    size_t j = i;
    if (text[j] == '-' || text[j] == '+') ++j;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
    TERN_CHECK(j > i && std::isdigit(static_cast<unsigned char>(text[j - 1])), "token file ", path.string(),
               ": expected an integer at byte ", i, ", found '", text.substr(i, 16), "'");
    TERN_CHECK(j - i <= 11, "token file ", path.string(), ": id '", text.substr(i, j - i), "' at byte ", i,
               " is out of range");
    const long long v = std::stoll(text.substr(i, j - i));
    TERN_CHECK(v >= 0 && v <= INT32_MAX, "token file ", path.string(), ": id ", v, " at byte ", i,
               " is out of range");
    tokens.push_back(int32_t(v));
    i = j;
  }
  TERN_CHECK(!tokens.empty(), "token file ", path.string(), " holds no token ids");
  return tokens;
}

std::string eval_summary_json(const EvalSummary& s) {
  nlohmann::json j;
  j["positions"] = s.positions;
  j["predictions"] = s.predictions;
  j["nll_mean"] = s.nll_mean;
  j["perplexity"] = s.perplexity;
  if (s.has_reference) {
    j["reference_nll_mean"] = s.reference_nll_mean;
    j["reference_perplexity"] = s.reference_perplexity;
    j["perplexity_rel_diff"] = s.perplexity_rel_diff;
    j["kl_mean"] = s.kl_mean;
    j["kl_max"] = s.kl_max;
    j["kl_max_position"] = s.kl_max_position;
    j["top1_agreement"] = s.top1_agreement;
  }
  return j.dump(2);
}

std::string eval_summary_text(const EvalSummary& s) {
  char buf[256];
  std::string out;
  std::snprintf(buf, sizeof buf, "positions        %lld (%lld scored for perplexity)\n", (long long)s.positions,
                (long long)s.predictions);
  out += buf;
  std::snprintf(buf, sizeof buf, "perplexity       %.6f (mean NLL %.6f nats)\n", s.perplexity, s.nll_mean);
  out += buf;
  if (s.has_reference) {
    std::snprintf(buf, sizeof buf, "reference ppl    %.6f (tern/reference - 1 = %+.3e)\n", s.reference_perplexity,
                  s.perplexity_rel_diff);
    out += buf;
    std::snprintf(buf, sizeof buf, "mean KL          %.6g nats (max %.6g at position %lld)\n", s.kl_mean, s.kl_max,
                  (long long)s.kl_max_position);
    out += buf;
    std::snprintf(buf, sizeof buf, "top-1 agreement  %.2f%%\n", 100.0 * s.top1_agreement);
    out += buf;
  }
  return out;
}

}  // namespace tern
