// What the request parsers share: the nesting depth checked before a body is parsed, and which model names a
// request may give.
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

ParseOptions named(bool strict) {
  ParseOptions o;
  o.model_id = "org/model";
  o.model_aliases = {"alias"};
  o.strict_model_name = strict;
  return o;
}

TEST(RequestFields, LatestTag) {
  EXPECT_EQ(without_latest_tag("qwen:latest"), "qwen");
  EXPECT_EQ(without_latest_tag("org/model:latest"), "org/model");
  EXPECT_EQ(without_latest_tag("qwen:7b"), "qwen:7b");
  EXPECT_EQ(without_latest_tag(":latest"), ":latest");
  EXPECT_EQ(without_latest_tag("qwen"), "qwen");
}

TEST(RequestFields, KnownModelNamesWithOrWithoutTheLatestTag) {
  const ParseOptions o = named(true);
  for (const char* name : {"org/model", "alias", "org/model:latest", "alias:latest", ""})
    EXPECT_TRUE(model_name_known(o, name)) << name;
  for (const char* name : {"gpt-4o-mini", "org/model:7b", "alias:", "org/model:latest:latest", "Alias"})
    EXPECT_FALSE(model_name_known(o, name)) << name;
  EXPECT_TRUE(model_name_known(ParseOptions{}, "anything")) << "no name known yet: nothing to compare";
}

TEST(RequestFields, AnyModelNameServedUnlessStrict) {
  for (const char* name : {"gpt-4o-mini", "claude-3-5-haiku-latest", "llama3:8b", "org/model:latest"}) {
    EXPECT_TRUE(model_name_served(named(false), name)) << name;
    EXPECT_EQ(model_name_served(named(true), name), model_name_known(named(true), name)) << name;
  }
  EXPECT_FALSE(model_name_served(named(true), "gpt-4o-mini"));
  EXPECT_TRUE(model_name_served(named(true), "alias:latest"));
}

}  // namespace
}  // namespace tern::server
