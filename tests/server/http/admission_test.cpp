// The checks before any handler and the CORS headers: pages on this machine (loopback origins) get CORS without
// --cors-origin, other origins only through it, and the Host check against DNS rebinding ignores Origin.
#include <gtest/gtest.h>

#include <string>

#include <httplib.h>

#include "server/http/admission.h"

namespace tern::server {
namespace {

TEST(Admission, LoopbackOrigins) {
  for (const char* o : {"http://localhost:3000", "http://127.0.0.1:5173", "http://[::1]:8080", "https://localhost",
                        "https://127.0.0.1:443", "https://[::1]", "http://localhost"})
    EXPECT_TRUE(loopback_origin(o)) << o;
  for (const char* o : {"", "null", "http://localhost.evil.example", "http://localhost:3000.evil.example",
                        "http://127.0.0.1.nip.io", "http://evil.example", "http://localhost:", "http://localhost:30x0",
                        "http://localhost:3000/", "ftp://localhost", "localhost:3000", "http://127.0.0.2:3000",
                        "http://user@localhost", "http://localhost:1234567", "http://[::1]x"})
    EXPECT_FALSE(loopback_origin(o)) << o;
}

// The CORS headers of an answer to `method` from `origin` ("": no Origin header) with --cors-origin `cors_origin`.
httplib::Response cors(const std::string& cors_origin, const std::string& method, const std::string& origin,
                       const std::string& requested_headers = "") {
  httplib::Request req;
  req.method = method;
  if (!origin.empty()) req.headers.emplace("Origin", origin);
  if (!requested_headers.empty()) req.headers.emplace("Access-Control-Request-Headers", requested_headers);
  httplib::Response res;
  add_cors_headers(cors_origin, req, res);
  return res;
}

TEST(Admission, LoopbackOriginsGetCorsByDefault) {
  const std::string asked = "authorization, content-type, x-stainless-os";
  for (const char* origin : {"http://localhost:3000", "https://127.0.0.1:8443", "http://[::1]:5173"}) {
    const httplib::Response get = cors("", "POST", origin);
    EXPECT_EQ(get.get_header_value("Access-Control-Allow-Origin"), origin);
    EXPECT_EQ(get.get_header_value("Vary"), "Origin");
    EXPECT_FALSE(get.has_header("Access-Control-Allow-Methods")) << "only on a preflight";
    const httplib::Response pre = cors("", "OPTIONS", origin, asked);
    EXPECT_EQ(pre.get_header_value("Access-Control-Allow-Origin"), origin);
    EXPECT_EQ(pre.get_header_value("Access-Control-Allow-Headers"), asked);
    EXPECT_NE(pre.get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  }
  // With --cors-origin set, loopback origins still pass (echoed), as does the configured one.
  EXPECT_EQ(cors("http://app.example", "OPTIONS", "http://localhost:3000", asked)
                .get_header_value("Access-Control-Allow-Headers"),
            asked);
  EXPECT_EQ(cors("http://app.example", "GET", "http://localhost:3000").get_header_value("Access-Control-Allow-Origin"),
            "http://localhost:3000");
  EXPECT_EQ(cors("*", "GET", "http://localhost:3000").get_header_value("Access-Control-Allow-Origin"), "*");
}

TEST(Admission, OtherOriginsOnlyThroughCorsOrigin) {
  for (const char* origin : {"http://evil.example", "http://localhost.evil.example:3000", "null", ""}) {
    const httplib::Response res = cors("", "OPTIONS", origin, "x-stainless-os");
    EXPECT_FALSE(res.has_header("Access-Control-Allow-Origin")) << origin;
    EXPECT_FALSE(res.has_header("Access-Control-Allow-Headers")) << origin;
  }
  // As before: the configured origin is named to every request; only its preflights get the headers they asked.
  EXPECT_EQ(cors("http://app.example", "GET", "").get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  const httplib::Response other = cors("http://app.example", "OPTIONS", "http://evil.example", "x-stainless-os");
  EXPECT_EQ(other.get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  EXPECT_EQ(other.get_header_value("Access-Control-Allow-Headers"), "Authorization, Content-Type");
  EXPECT_EQ(cors("http://app.example", "OPTIONS", "http://app.example", "x-stainless-os")
                .get_header_value("Access-Control-Allow-Headers"),
            "x-stainless-os");
}

TEST(Admission, HostCheckOnLoopback) {
  const std::vector<std::string> none;
  for (const char* host : {"127.0.0.1:8080", "localhost:8080", "[::1]:8080", "LOCALHOST"}) {
    const std::string h = host;
    EXPECT_TRUE(host_allowed(&h, true, "127.0.0.1", none)) << host;
  }
  for (const char* host : {"evil.example", "localhost.evil.example", "127.0.0.1.nip.io"}) {
    const std::string h = host;
    EXPECT_FALSE(host_allowed(&h, true, "127.0.0.1", none)) << host;
    EXPECT_TRUE(host_allowed(&h, false, "0.0.0.0", none)) << host;
  }
}

}  // namespace
}  // namespace tern::server
