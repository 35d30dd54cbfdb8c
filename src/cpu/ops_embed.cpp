#include "cpu/ops_embed.h"

#include "core/check.h"
#include "cpu/ops_matmul.h"

namespace tern::cpu {

void embed_lookup(const Matrix& embed, std::span<const int32_t> ids, float* out) {
  TERN_CHECK(!embed.empty() && embed.experts == 1, "embed_lookup: the embedding matrix is missing");
  for (size_t t = 0; t < ids.size(); ++t)
    TERN_CHECK(ids[t] >= 0 && ids[t] < embed.rows, "token id ", ids[t], " at position ", t,
               " is outside the vocabulary [0, ", embed.rows, ")");
  for (size_t t = 0; t < ids.size(); ++t) matrix_row_to_f32(embed, ids[t], out + int64_t(t) * embed.cols);
}

}  // namespace tern::cpu
