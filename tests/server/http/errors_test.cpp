// API errors: the OpenAI-shaped body, the messages that carry numbers, and the request log line's reason.
#include <gtest/gtest.h>

#include "server/http/errors.h"
#include "server/http/json.h"
#include "server/http/respond.h"

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

// Every error answer, a 400 as much as a 500 and in any API's shape, says why in the request log line.
TEST(Errors, ErrorAnswersPutTheirReasonInTheLogLine) {
  request_log() = RequestLog{};
  httplib::Response res;
  respond_error(res, api_error_invalid("temperature", "'temperature' must be in [0, 2]."));
  EXPECT_EQ(res.status, 400);
  EXPECT_EQ(request_log().fields["error"], "'temperature' must be in [0, 2].");
  respond_error_with_body(res, api_error_not_found("no such thing"), Json{{"error", "no such thing"}});
  EXPECT_EQ(res.status, 404);
  EXPECT_EQ(request_log().fields["error"], "no such thing");
  // A client that hung up: 499, nginx's "client closed request".
  const ApiError gone = api_error_client_closed();
  EXPECT_EQ(gone.status, 499);
  EXPECT_EQ(gone.code, "client_closed_request");
  request_log() = RequestLog{};
}

}  // namespace
}  // namespace tern::server
