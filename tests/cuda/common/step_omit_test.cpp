// TERN_STEP_OMIT's parts (step_omit.h): the names it takes, and a clear error for one it does not.
#include "cuda/common/step_omit.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "core/check.h"

namespace tern::cuda::test {
namespace {

TEST(StepOmit, ParsesThePartsItNames) {
  EXPECT_EQ(step_omit_parse(""), 0u);
  EXPECT_EQ(step_omit_parse("gdn"), unsigned(StepPart::gdn));
  EXPECT_EQ(step_omit_parse("router, gate_up,down"),
            unsigned(StepPart::router) | unsigned(StepPart::gate_up) | unsigned(StepPart::down));
  EXPECT_EQ(step_omit_parse("in,out,,head"),
            unsigned(StepPart::in) | unsigned(StepPart::out) | unsigned(StepPart::head));
  EXPECT_EQ(step_omit_parse("attention,prequant"), unsigned(StepPart::attention) | unsigned(StepPart::prequant));
  EXPECT_EQ(step_omit_parse("kept"), unsigned(StepPart::kept));
}

// The stand-in routing: k distinct experts in range a token, spread over the experts as a uniform draw (32 tokens of
// 8 of 256: about 163 distinct, where 8 · 32 = 256 would be all distinct and 8 would be one token's).
TEST(StepOmit, StandInRoutingIsKDistinctExpertsATokenSpreadLikeAUniformDraw) {
  const int T = 32, E = 256, k = 8;
  const std::vector<int> ids = step_omit_routing(T, E, k);
  ASSERT_EQ(ids.size(), size_t(T * k));
  std::set<int> all;
  for (int t = 0; t < T; ++t) {
    std::set<int> mine;
    for (int j = 0; j < k; ++j) {
      const int e = ids[size_t(t * k + j)];
      EXPECT_GE(e, 0);
      EXPECT_LT(e, E);
      mine.insert(e);
      all.insert(e);
    }
    EXPECT_EQ(mine.size(), size_t(k)) << "token " << t;
  }
  // A uniform draw of 32 tokens gives 256 · (1 − (1 − 8/256)^32) ≈ 163 distinct experts (standard deviation ~5).
  EXPECT_GT(all.size(), 140u);
  EXPECT_LT(all.size(), 190u);
  EXPECT_EQ(step_omit_routing(T, E, k), ids);  // a fixed seed
  EXPECT_THROW(step_omit_routing(1, 4, 5), Error);
}

TEST(StepOmit, RefusesAnUnknownPartByName) {
  try {
    step_omit_parse("gdn,moe");
    FAIL() << "an unknown part was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown part 'moe'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tern::cuda::test
