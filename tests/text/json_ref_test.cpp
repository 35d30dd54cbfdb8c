// Local $ref resolution (text/json_ref.h): pointers with escapes, array indices, the document itself, and the
// references it refuses (remote, anchors, dangling).
#include <gtest/gtest.h>

#include "text/json_ref.h"

namespace tern {
namespace {

using ojson = nlohmann::ordered_json;

TEST(JsonRef, ResolvesLocalPointers) {
  const ojson root = ojson::parse(R"({"$defs": {"a/b": {"type": "integer"}, "t~x": {"enum": [1]}, "sp ace": {}},
                                      "list": [{"type": "string"}, {"type": "null"}]})");
  std::string path;
  EXPECT_EQ(resolve_local_ref(root, "#", &path), &root);
  EXPECT_EQ(path, "");
  const ojson* a = resolve_local_ref(root, "#/$defs/a~1b", &path);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ((*a)["type"], "integer");
  EXPECT_EQ(path, "/$defs/a~1b");
  ASSERT_NE(resolve_local_ref(root, "#/$defs/t~0x"), nullptr);
  EXPECT_EQ(resolve_local_ref(root, "#/$defs/sp%20ace", &path), &root["$defs"]["sp ace"]);
  EXPECT_EQ(path, "/$defs/sp ace");
  const ojson* second = resolve_local_ref(root, "#/list/1");
  ASSERT_NE(second, nullptr);
  EXPECT_EQ((*second)["type"], "null");
}

TEST(JsonRef, RefusesWhatIsNotALocalTarget) {
  const ojson root = ojson::parse(R"({"$defs": {"a": {}}, "list": [1]})");
  EXPECT_EQ(resolve_local_ref(root, "other.json#/$defs/a"), nullptr);  // remote
  EXPECT_EQ(resolve_local_ref(root, "#a"), nullptr);                   // an anchor
  EXPECT_EQ(resolve_local_ref(root, "#/$defs/b"), nullptr);            // dangling
  EXPECT_EQ(resolve_local_ref(root, "#/list/2"), nullptr);
  EXPECT_EQ(resolve_local_ref(root, "#/list/x"), nullptr);
  EXPECT_EQ(resolve_local_ref(root, ""), nullptr);
}

TEST(JsonRef, EscapesPointerTokens) {
  EXPECT_EQ(json_pointer_escape("a/b~c"), "a~1b~0c");
  EXPECT_EQ(json_pointer_escape("plain"), "plain");
}

}  // namespace
}  // namespace tern
