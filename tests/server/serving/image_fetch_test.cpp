// The pure parts of fetching image URLs (--allow-image-urls): which URLs are fetched and how they split for the
// client, and where a redirect's Location leads. The downloads themselves: tests/py/test_image_urls.py.
#include <gtest/gtest.h>

#include "server/serving/image_fetch.h"

namespace tern::server {
namespace {

ImageUrl parsed(const std::string& url) {
  std::string why;
  const std::optional<ImageUrl> u = image_url_parse(url, &why);
  EXPECT_TRUE(u.has_value()) << url << ": " << why;
  return u.value_or(ImageUrl{});
}

std::string refusal(const std::string& url) {
  std::string why;
  EXPECT_FALSE(image_url_parse(url, &why).has_value()) << url;
  return why;
}

TEST(ImageFetch, ParsesHttpAndHttpsUrls) {
  ImageUrl u = parsed("http://example.com/a/b.png?x=1#frag");
  EXPECT_FALSE(u.https);
  EXPECT_EQ(u.host, "example.com");
  EXPECT_EQ(u.port, 80);
  EXPECT_EQ(u.target, "/a/b.png?x=1");  // the fragment is never sent
  u = parsed("HTTPS://Example.com");
  EXPECT_TRUE(u.https);
  EXPECT_EQ(u.port, 443);
  EXPECT_EQ(u.target, "/");
  u = parsed("http://127.0.0.1:8081?q");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, 8081);
  EXPECT_EQ(u.target, "/?q");
  u = parsed("https://[::1]:9000/i.png");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, 9000);
  EXPECT_EQ(parsed("http://h:/x").port, 80);  // an empty port is the scheme's
}

TEST(ImageFetch, RefusesWhatItWillNotFetch) {
  EXPECT_NE(refusal("ftp://example.com/a.png").find("not an http(s) URL"), std::string::npos);
  EXPECT_NE(refusal("file:///etc/passwd").find("not an http(s) URL"), std::string::npos);
  EXPECT_NE(refusal("http:///a.png").find("no host"), std::string::npos);
  EXPECT_NE(refusal("http://:80/a.png").find("no host"), std::string::npos);
  EXPECT_NE(refusal("http://user:pw@example.com/").find("credentials"), std::string::npos);
  EXPECT_NE(refusal("http://example.com:0/").find("port"), std::string::npos);
  EXPECT_NE(refusal("http://example.com:65536/").find("port"), std::string::npos);
  EXPECT_NE(refusal("http://example.com:8x/").find("port"), std::string::npos);
  EXPECT_NE(refusal("http://example.com/a b.png").find("space"), std::string::npos);
  EXPECT_NE(refusal("http://example.com/a\r\nHost: evil").find("control"), std::string::npos);
  EXPECT_NE(refusal("http://[::1/").find("']'"), std::string::npos);
}

TEST(ImageFetch, ResolvesRedirects) {
  const ImageUrl base = parsed("http://h:8080/dir/page.png?x=1");
  EXPECT_EQ(image_url_resolve(base, "https://other/a.png"), "https://other/a.png");
  EXPECT_EQ(image_url_resolve(base, "ftp://other/a.png"), "ftp://other/a.png");  // refused when parsed
  EXPECT_EQ(image_url_resolve(base, "//cdn.example/a.png"), "http://cdn.example/a.png");
  EXPECT_EQ(image_url_resolve(base, "/b.png"), "http://h:8080/b.png");
  EXPECT_EQ(image_url_resolve(base, "c.png"), "http://h:8080/dir/c.png");
  EXPECT_EQ(image_url_resolve(base, "?y=2"), "http://h:8080/dir/page.png?y=2");
  EXPECT_EQ(image_url_resolve(parsed("https://h/"), "a.png"), "https://h/a.png");
  EXPECT_EQ(image_url_resolve(parsed("https://[::1]:444/x/y"), "/z"), "https://[::1]:444/z");
}

TEST(ImageFetch, AnUnreachableHostIsARefusalWithinTheDeadline) {
  ImageFetchLimits limits;
  limits.timeout_s = 5;
  limits.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  // Port 1 on loopback: nothing listens there, so the connection is refused at once.
  const ImageFetchResult r = image_url_fetch("http://127.0.0.1:1/a.png", limits);
  EXPECT_TRUE(r.bytes.empty());
  EXPECT_NE(r.error.find("could not connect to 127.0.0.1:1"), std::string::npos) << r.error;
  limits.deadline = std::chrono::steady_clock::now();  // already past
  const ImageFetchResult late = image_url_fetch("http://127.0.0.1:1/a.png", limits);
  EXPECT_NE(late.error.find("timed out"), std::string::npos) << late.error;
}

}  // namespace
}  // namespace tern::server
