// TERN_STEP_OMIT's parts (step_omit.h): the names it takes, and a clear error for one it does not.
#include "cuda/common/step_omit.h"

#include <gtest/gtest.h>

#include <string>

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
