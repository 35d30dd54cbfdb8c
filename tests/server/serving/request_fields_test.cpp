// What the request parsers share: the nesting depth checked before a body is parsed.
#include <gtest/gtest.h>

#include <string>

#include "server/serving/request_fields.h"

namespace tern::server {
namespace {

TEST(RequestFields, NestingDepth) {
  EXPECT_EQ(json_nesting_depth(R"({"a":[1,{"b":"[[[["}]})", 64), 3);
  EXPECT_EQ(json_nesting_depth(std::string(70, '['), 64), 65);
  EXPECT_EQ(json_nesting_depth(R"("\"[[[")", 64), 0);
}

}  // namespace
}  // namespace tern::server
