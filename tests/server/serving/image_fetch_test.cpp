// Fetching image URLs (--allow-image-urls): which URLs are fetched and how they split for the client, where a
// redirect's Location leads; against a local server here, the address policy on every hop (a test resolver names the
// hosts: the connection goes to the address it answered), the deadline over a lookup that hangs and over a server
// that drips its headers. The server's side of it (each API, the 400s): tests/py/test_image_urls.py.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <thread>

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

using Clock = std::chrono::steady_clock;

IpRange cidr(const std::string& text) {
  std::string why;
  const std::optional<IpRange> r = ip_range_parse(text, &why);
  EXPECT_TRUE(r.has_value()) << why;
  return r.value_or(IpRange{});
}

ImageFetchLimits limits_for(double seconds, std::vector<IpRange> allowed = {}) {
  ImageFetchLimits limits;
  limits.timeout_s = seconds;
  limits.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  limits.allowed = std::move(allowed);
  return limits;
}

// Runs `fetch` on a thread of its own and fails the whole test binary if it has not returned within `bound_s`: a
// fetch that hangs must not hang the test run.
ImageFetchResult within(double bound_s, std::function<ImageFetchResult()> fetch) {
  auto done = std::make_shared<std::promise<ImageFetchResult>>();
  std::future<ImageFetchResult> result = done->get_future();
  std::thread([done, fetch = std::move(fetch)] { done->set_value(fetch()); }).detach();
  if (result.wait_for(std::chrono::duration<double>(bound_s)) != std::future_status::ready) {
    ADD_FAILURE() << "the fetch did not return within " << bound_s << " s";
    std::fflush(stdout);
    std::abort();
  }
  return result.get();
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

TEST(ImageFetch, AnUnreachableHostIsARefusalWithinTheDeadline) {
  ImageFetchLimits limits = limits_for(5, {cidr("127.0.0.1")});
  // Port 1 on loopback: nothing listens there, so the connection is refused at once.
  const ImageFetchResult r = image_url_fetch("http://127.0.0.1:1/a.png", limits);
  EXPECT_TRUE(r.bytes.empty());
  EXPECT_NE(r.error.find("could not connect to 127.0.0.1:1 (nothing answers there)"), std::string::npos) << r.error;
  limits.deadline = std::chrono::steady_clock::now();  // already past
  const ImageFetchResult late = image_url_fetch("http://127.0.0.1:1/a.png", limits);
  EXPECT_NE(late.error.find("timed out"), std::string::npos) << late.error;
}

TEST(ImageFetch, NonPublicAddressesAreRefusedUnlessAllowed) {
  ImageFetchLimits limits = limits_for(5);
  ImageFetchResult r = within(10, [&] { return image_url_fetch("http://127.0.0.1:1/a.png", limits); });
  EXPECT_EQ(r.error, "the host 127.0.0.1 is a loopback address (127.0.0.0/8), which this server does not fetch from "
                     "(tern serve --image-url-allow 127.0.0.1, or a range holding it, would allow it)");
  r = within(10, [&] { return image_url_fetch("http://[::1]:1/a.png", limits); });
  EXPECT_NE(r.error.find("the host ::1 is the loopback address (::1/128)"), std::string::npos) << r.error;
  r = within(10, [&] { return image_url_fetch("http://[::ffff:169.254.169.254]/latest/meta-data/", limits); });
  EXPECT_NE(r.error.find("is a link-local address (169.254.0.0/16, where cloud metadata services answer)"),
            std::string::npos) << r.error;
  r = within(10, [&] { return image_url_fetch("http://0x7f000001:1/", limits); });  // the resolver reads it as an
  EXPECT_NE(r.error.find("the host 0x7f000001 resolves to 127.0.0.1, a loopback address"),  // address: checked as one
            std::string::npos) << r.error;
  limits.allowed = {cidr("10.0.0.0/8")};  // another range: still refused
  r = within(10, [&] { return image_url_fetch("http://127.0.0.1:1/a.png", limits); });
  EXPECT_NE(r.error.find("a loopback address"), std::string::npos) << r.error;
  limits.allowed = {cidr("127.0.0.0/8")};  // allowed: connected to (nothing listens there)
  r = within(10, [&] { return image_url_fetch("http://127.0.0.1:1/a.png", limits); });
  EXPECT_NE(r.error.find("could not connect to 127.0.0.1:1"), std::string::npos) << r.error;
}

// A resolver for test host names (nothing reaches the system's: the connection can only go where it says).
ImageResolver test_resolver(std::map<std::string, std::vector<std::string>> hosts) {
  return [hosts = std::move(hosts)](const std::string& host, std::string* why) {
    auto it = hosts.find(host);
    if (it != hosts.end()) return it->second;
    *why = "no such test host";
    return std::vector<std::string>{};
  };
}

// An HTTP server on 127.0.0.1 for the fetches to reach.
struct LocalServer {
  httplib::Server server;
  std::thread thread;
  int port = 0;

  LocalServer() {
    server.Get("/red.png", [](const httplib::Request& req, httplib::Response& res) {
      res.set_header("X-Host-Asked", req.get_header_value("Host"));
      res.set_content("\x89PNG\r\n\x1a\nred", "image/png");
    });
    server.Get("/host", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(req.get_header_value("Host"), "image/png");  // which name the client asked for
    });
    server.Get("/to-private", [](const httplib::Request&, httplib::Response& res) {
      res.set_redirect("http://10.0.0.5/x.png");
    });
    server.Get("/to-metadata", [](const httplib::Request&, httplib::Response& res) {
      res.set_redirect("http://metadata.test/latest/meta-data/");
    });
    server.Get("/to-loopback-v6", [](const httplib::Request&, httplib::Response& res) {
      res.set_redirect("http://[::ffff:127.0.0.2]/x.png");
    });
    server.Get("/to-self", [](const httplib::Request&, httplib::Response& res) {
      res.set_redirect("/red.png");
    });
    port = server.bind_to_any_port("127.0.0.1");
    thread = std::thread([this] { server.listen_after_bind(); });
    while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~LocalServer() {
    server.stop();
    thread.join();
  }
  std::string url(const std::string& host, const std::string& path) const {
    return "http://" + host + ":" + std::to_string(port) + path;
  }
};

TEST(ImageFetch, ConnectsToTheAddressItCheckedOnEveryHop) {
  LocalServer local;
  ImageFetchLimits limits = limits_for(10, {cidr("127.0.0.1")});
  limits.resolver = test_resolver({{"images.test", {"127.0.0.1"}},
                                   {"metadata.test", {"169.254.169.254"}},
                                   {"mixed.test", {"10.1.2.3", "127.0.0.1"}},
                                   {"private.test", {"192.168.1.20", "fd00::1"}}});
  // A name only the test resolver knows: fetched from its address, asked for by its name.
  ImageFetchResult r = within(20, [&] { return image_url_fetch(local.url("images.test", "/host"), limits); });
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.bytes, "images.test:" + std::to_string(local.port));
  r = within(20, [&] { return image_url_fetch(local.url("images.test", "/to-self"), limits); });
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.content_type, "image/png");
  // A redirect to a private address, to a name that resolves to the metadata address, to a mapped loopback address
  // outside the allowed one: refused at that hop, saying where it led.
  r = within(20, [&] { return image_url_fetch(local.url("images.test", "/to-private"), limits); });
  EXPECT_EQ(r.error, "it redirected to 'http://10.0.0.5/x.png', where the host 10.0.0.5 is a private address "
                     "(10.0.0.0/8), which this server does not fetch from (tern serve --image-url-allow 10.0.0.5, or "
                     "a range holding it, would allow it)");
  r = within(20, [&] { return image_url_fetch(local.url("images.test", "/to-metadata"), limits); });
  EXPECT_NE(r.error.find("it redirected to 'http://metadata.test/latest/meta-data/', where the host metadata.test "
                         "resolves to 169.254.169.254, a link-local address"), std::string::npos) << r.error;
  r = within(20, [&] { return image_url_fetch(local.url("images.test", "/to-loopback-v6"), limits); });
  EXPECT_NE(r.error.find("where the host ::ffff:127.0.0.2 is a loopback address"), std::string::npos) << r.error;
  // A host with a refused address and an allowed one: the allowed one is used.
  r = within(20, [&] { return image_url_fetch(local.url("mixed.test", "/red.png"), limits); });
  EXPECT_EQ(r.error, "");
  // Only refused addresses: the first is named.
  r = within(20, [&] { return image_url_fetch(local.url("private.test", "/red.png"), limits); });
  EXPECT_NE(r.error.find("the host private.test resolves to 192.168.1.20, a private address (192.168.0.0/16)"),
            std::string::npos) << r.error;
  r = within(20, [&] { return image_url_fetch(local.url("nowhere.test", "/red.png"), limits); });
  EXPECT_EQ(r.error, "the host nowhere.test could not be looked up (no such test host)");
}

TEST(ImageFetch, TriesTheHostsNextAddressWhenNothingAnswers) {
  LocalServer local;  // on 127.0.0.1 only: nothing answers on 127.0.0.2
  ImageFetchLimits limits = limits_for(10, {cidr("127.0.0.0/8")});
  limits.resolver = test_resolver({{"two.test", {"127.0.0.2", "127.0.0.1"}}, {"none.test", {"127.0.0.2"}}});
  ImageFetchResult r = within(20, [&] { return image_url_fetch(local.url("two.test", "/red.png"), limits); });
  EXPECT_EQ(r.error, "");
  r = within(20, [&] { return image_url_fetch(local.url("none.test", "/red.png"), limits); });
  EXPECT_EQ(r.error, "could not connect to none.test:" + std::to_string(local.port) +
                         " at 127.0.0.2 (nothing answers there)");
}

TEST(ImageFetch, AHangingLookupEndsAtTheDeadline) {
  // The resolver sleeps well past the deadline; it shares nothing with the test but what it captured by value.
  auto finished = std::make_shared<std::atomic<int>>(0);
  const auto start = Clock::now();
  {
    ImageFetchLimits limits = limits_for(0.3);
    limits.resolver = [finished](const std::string&, std::string*) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      finished->fetch_add(1);
      return std::vector<std::string>{"8.8.8.8"};
    };
    const ImageFetchResult r = within(10, [&] { return image_url_fetch("http://slow-dns.test/a.png", limits); });
    const double took = seconds_since(start);
    EXPECT_NE(r.error.find("it timed out looking up slow-dns.test"), std::string::npos) << r.error;
    EXPECT_LT(took, 0.3 + 0.25);
    EXPECT_GE(took, 0.25);
    EXPECT_EQ(finished->load(), 0);
  }  // the request's objects are gone; the lookup still runs, and ends by itself without touching them
  while (finished->load() == 0 && seconds_since(start) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(finished->load(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the download's thread sees the answer too late
  // A deadline that already passed: no lookup is waited on at all.
  ImageFetchLimits late = limits_for(0);
  late.resolver = [](const std::string&, std::string*) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    return std::vector<std::string>{"8.8.8.8"};
  };
  const auto t = Clock::now();
  const ImageFetchResult r = within(10, [&] { return image_url_fetch("http://slow-dns.test/a.png", late); });
  EXPECT_NE(r.error.find("timed out"), std::string::npos) << r.error;
  EXPECT_LT(seconds_since(t), 0.25);
}

TEST(ImageFetch, AServerDrippingItsHeadersIsCutOffAtTheDeadline) {
  // A raw server that sends its header one byte at a time, each within any read timeout: only the deadline ends it.
  // It records when the client's side of the connection went away.
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  const timeval accept_bound{5, 0};  // a fetch that never connects must not hold the test at accept
  ASSERT_EQ(::setsockopt(listener, SOL_SOCKET, SO_RCVTIMEO, &accept_bound, sizeof accept_bound), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  auto gone_after = std::make_shared<std::atomic<double>>(-1);
  const auto start = Clock::now();
  std::thread server([listener, gone_after, start] {
    const int conn = ::accept(listener, nullptr, nullptr);
    if (conn < 0) return;
    const std::string head = "HTTP/1.1 200 OK\r\nX-Drip: ";
    ::send(conn, head.data(), head.size(), MSG_NOSIGNAL);
    while (seconds_since(start) < 8) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (::send(conn, "a", 1, MSG_NOSIGNAL) != 1) break;
    }
    gone_after->store(seconds_since(start));
    ::close(conn);
  });
  const ImageFetchLimits limits = limits_for(0.5, {cidr("127.0.0.1")});
  const ImageFetchResult r =
      within(10, [&] { return image_url_fetch("http://127.0.0.1:" + std::to_string(port) + "/a.png", limits); });
  EXPECT_LT(seconds_since(start), 0.5 + 0.25);
  EXPECT_NE(r.error.find("timed out"), std::string::npos) << r.error;
  server.join();
  ::close(listener);
  // The download let go of the connection at the deadline, not when the header ran out of room minutes later.
  EXPECT_LT(gone_after->load(), 0.5 + 1.0);
}

}  // namespace
}  // namespace tern::server
