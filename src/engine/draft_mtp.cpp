#include "engine/draft_mtp.h"

#include <algorithm>

#include "core/check.h"

namespace tern {

MtpDrafter::MtpDrafter(ModelRunner& runner, Session& session, std::span<const int32_t> prompt)
    : runner_(runner), session_(session), tokens_(prompt.begin(), prompt.end()) {
  TERN_INTERNAL_CHECK(runner.supports_mtp(), "an MTP drafter on a runner without the MTP head");
  TERN_INTERNAL_CHECK(session.position() <= int64_t(tokens_.size()), "the session holds ", session.position(),
                      " tokens, more than the prompt's ", tokens_.size());
  // The rows before position - 1 hold pairs of tokens the session holds (the last one's token may change now).
  true_rows_ = std::min(runner.mtp_rows(session), std::max<int64_t>(0, session.position() - 1));
}

bool MtpDrafter::feed(int64_t last) {
  const int64_t first = std::min({true_rows_, runner_.mtp_rows(session_), last});
  if (last < first || !usable_) return usable_;
  TERN_INTERNAL_CHECK(last + 1 < int64_t(tokens_.size()), "MTP: the pair at ", last, " needs token ", last + 1,
                      " of ", tokens_.size());
  const int64_t D = runner_.config().hidden_size;
  int64_t h0 = 0;
  const std::span<const float> h = runner_.mtp_hidden(session_, &h0);
  const int64_t rows = int64_t(h.size()) / D;
  if (first < h0) {  // a gap: the hidden states of rows [first, h0) are gone
    usable_ = false;
    return false;
  }
  TERN_INTERNAL_CHECK(last < h0 + rows, "MTP: the last forward's hidden states cover [", h0, ", ", h0 + rows,
                      "), not row ", last);
  const int64_t n = last - first + 1;
  runner_.forward_mtp(session_, h.subspan(size_t((first - h0) * D), size_t(n * D)),
                      std::span<const int32_t>(tokens_).subspan(size_t(first + 1), size_t(n)), first,
                      /*all_logits=*/false, logits_, hidden_out_);
  true_rows_ = last + 1;
  return true;
}

// Up to the pair of the last forward's last hidden when its token is known (the next prompt token, or the token the
// next decode step feeds): the next catch_up then has nothing to feed, and the one after finds both rows it needs
// (a forward keeps the previous one's last row), so a step without MTP drafts feeds the head every other step.
void MtpDrafter::catch_up() { feed(std::min(int64_t(tokens_.size()) - 2, session_.position() - 1)); }

std::vector<int32_t> MtpDrafter::draft(int64_t k) {
  if (k <= 0) {
    catch_up();
    return {};
  }
  const int64_t P = session_.position();
  TERN_INTERNAL_CHECK(P >= 1 && int64_t(tokens_.size()) == P + 1, "MTP draft at position ", P, " with ",
                      tokens_.size(), " tokens known (the next token must be the last)");
  if (!feed(P - 1)) return {};
  const int64_t D = runner_.config().hidden_size;
  std::vector<int32_t> out{argmax()};
  std::vector<float> h;
  for (int64_t i = 1; i < k; ++i) {  // (out_{i-1}, d_i) at row P + i - 1 predicts d_{i+1}
    h.assign(hidden_out_.end() - D, hidden_out_.end());
    runner_.forward_mtp(session_, h, std::span<const int32_t>(&out.back(), 1), P + i - 1, false, logits_,
                        hidden_out_);
    out.push_back(argmax());
  }
  return out;
}

int32_t MtpDrafter::argmax() const {
  const int64_t n = std::min<int64_t>(runner_.vocab_real(), int64_t(logits_.size()));
  TERN_INTERNAL_CHECK(n > 0, "MTP: no logits");
  return int32_t(std::max_element(logits_.begin(), logits_.begin() + n) - logits_.begin());
}

}  // namespace tern
