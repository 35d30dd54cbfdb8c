// A request's head as the connection layer's poller parses it.
#include <gtest/gtest.h>

#include "server/http/request_head.h"

namespace tern::server {
namespace {

TEST(RequestHead, ParsesLineAndHeaders) {
  RequestHead h;
  ASSERT_TRUE(parse_request_head("POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a:1\r\nContent-Type:  "
                                 "application/json \r\nX-Empty:",
                                 h));
  EXPECT_EQ(h.method, "POST");
  EXPECT_EQ(h.target, "/v1/chat/completions?x=1");
  EXPECT_EQ(h.path, "/v1/chat/completions");
  EXPECT_EQ(h.version, "HTTP/1.1");
  ASSERT_NE(h.header("content-type"), nullptr);
  EXPECT_EQ(*h.header("content-type"), "application/json");
  EXPECT_EQ(*h.header("host"), "a:1");
  EXPECT_EQ(*h.header("x-empty"), "");
  EXPECT_EQ(h.header("authorization"), nullptr);
  EXPECT_FALSE(parse_request_head("GARBAGE", h));
  EXPECT_FALSE(parse_request_head("GET / HTTP/1.1\r\nno colon here", h));
}

}  // namespace
}  // namespace tern::server
