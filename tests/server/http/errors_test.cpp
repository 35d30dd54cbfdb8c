// API errors: the OpenAI-shaped body and the messages that carry numbers.
#include <gtest/gtest.h>

#include "server/http/errors.h"
#include "server/http/json.h"

namespace tern::server {
namespace {

TEST(Errors, BodyShape) {
  ApiError e = api_error_invalid("temperature", "bad \xff");
  Json j = Json::parse(api_error_body(e));
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(j["error"]["code"].is_null());
  EXPECT_EQ(strip_error_location("no good [src/x/y.cpp:12]"), "no good");
  EXPECT_EQ(api_error_overloaded(4, 2).status, 503);
  ApiError c = api_error_context(5000, 4096);
  EXPECT_NE(c.message.find("5000"), std::string::npos);
  EXPECT_NE(c.message.find("4096"), std::string::npos);
}

}  // namespace
}  // namespace tern::server
