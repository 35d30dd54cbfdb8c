#include "server/serving/image_fetch.h"

#include <httplib.h>

#include <atomic>
#include <cctype>
#include <charconv>
#include <future>
#include <memory>
#include <sstream>
#include <system_error>
#include <thread>

namespace tern::server {

namespace {

using Clock = std::chrono::steady_clock;

bool starts_with_nocase(const std::string& s, const char* prefix) {
  size_t i = 0;
  for (; prefix[i]; ++i)
    if (i >= s.size() || std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  return true;
}

// The port after a host's ':' ("" keeps the scheme's, as RFC 3986 allows); nullopt unless 1..65535.
std::optional<int> parse_port(const std::string& text, int scheme_port) {
  if (text.empty()) return scheme_port;
  int port = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
  if (ec != std::errc() || end != text.data() + text.size() || port < 1 || port > 65535) return std::nullopt;
  return port;
}

// "scheme://host[:port]" as a URL prefix, the port left out when it is the scheme's.
std::string origin(const ImageUrl& u) {
  std::string out = u.https ? "https://" : "http://";
  out += u.host.find(':') != std::string::npos ? "[" + u.host + "]" : u.host;
  if (u.port != (u.https ? 443 : 80)) out += ":" + std::to_string(u.port);
  return out;
}

// A Location that names its own scheme ("http:", "ftp:", ...): letters first, then letters, digits, + - . up to ':'.
bool has_scheme(const std::string& s) {
  if (s.empty() || !std::isalpha(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s) {
    if (c == ':') return true;
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.') return false;
  }
  return false;
}

std::string seconds_text(double s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

std::string timed_out(const ImageFetchLimits& limits) {
  return "it timed out (the server allows " + seconds_text(limits.timeout_s) + " s for a request's image URLs; "
         "tern serve --image-url-timeout sets it)";
}

std::string too_large(const ImageFetchLimits& limits) {
  const size_t mib = size_t(1) << 20;
  const std::string limit = limits.max_bytes % mib == 0 ? std::to_string(limits.max_bytes / mib) + " MiB"
                                                       : std::to_string(limits.max_bytes) + " bytes";
  return "the image is larger than " + limit + ", the most this server fetches";
}

// Why a request failed for a reason of the connection's (not an HTTP status).
std::string transport_error(httplib::Error error, const ImageUrl& u, const ImageFetchLimits& limits) {
  if (error == httplib::Error::ConnectionTimeout || Clock::now() >= limits.deadline) return timed_out(limits);
  const std::string where = u.host + ":" + std::to_string(u.port);
  switch (error) {
    case httplib::Error::Connection:
      return "could not connect to " + where + " (no such host, or nothing answers there)";
    case httplib::Error::Read:
    case httplib::Error::Write:
      return "the connection to " + where + " broke off before the answer was complete";
    case httplib::Error::SSLConnection:
      return "the TLS handshake with " + where + " failed";
    case httplib::Error::SSLServerVerification:
      return "the TLS certificate of " + where + " could not be verified";
    case httplib::Error::SSLLoadingCerts:
      return "this machine's CA certificates could not be loaded to verify " + where;
    case httplib::Error::Compression:
      return "the answer's compressed body could not be decoded";
    default:
      return "the request to " + where + " failed (" + httplib::to_string(error) + ")";
  }
}

std::unique_ptr<httplib::ClientImpl> make_client(const ImageUrl& u) {
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
  if (u.https) {
    auto client = std::make_unique<httplib::SSLClient>(u.host, u.port);
    client->enable_server_certificate_verification(true);  // the default today; an image from an unverified host
    return client;                                          // could be anyone's
  }
#endif
  return std::make_unique<httplib::ClientImpl>(u.host, u.port);
}

// One GET, not following redirects: the status and its headers, and for a 2xx the body.
struct Answer {
  int status = 0;
  std::string location, content_type, bytes;
  std::string error;  // a transport failure, a timeout, or too large (the status is then meaningless)
};

struct FetchJob {
  std::string url;
  ImageFetchLimits limits;
  std::atomic<bool> abandoned{false};  // the caller stopped waiting: stop reading
  std::promise<ImageFetchResult> done;
};

Answer get_once(const ImageUrl& u, const FetchJob& job) {
  Answer a;
  const ImageFetchLimits& limits = job.limits;
  const Clock::duration remaining = limits.deadline - Clock::now();
  if (remaining <= Clock::duration::zero()) {
    a.error = timed_out(limits);
    return a;
  }
  std::unique_ptr<httplib::ClientImpl> client = make_client(u);
  // Each wait of the client's is bounded by the time left; the body's reader also checks the deadline itself.
  client->set_connection_timeout(remaining);
  client->set_read_timeout(remaining);
  client->set_write_timeout(remaining);
  client->set_keep_alive(false);
  client->set_follow_location(false);  // followed here, to count them and to allow http(s) only
  const httplib::Headers headers = {{"Accept", "image/*"}, {"Accept-Encoding", "identity"}, {"User-Agent", "tern"}};
  std::string cut;  // why the answer was cut short, if it was
  auto on_head = [&](const httplib::Response& r) {
    a.status = r.status;
    a.location = r.get_header_value("Location");
    a.content_type = r.get_header_value("Content-Type");
    if (r.status < 200 || r.status >= 300) return false;  // a redirect or a refusal: its body is not wanted
    const std::string length = r.get_header_value("Content-Length");
    uint64_t n = 0;
    const auto [end, ec] = std::from_chars(length.data(), length.data() + length.size(), n);
    if (!length.empty() && ec == std::errc() && end == length.data() + length.size() && n > limits.max_bytes) {
      cut = too_large(limits);
      return false;
    }
    return true;
  };
  auto on_body = [&](const char* data, size_t n) {
    if (job.abandoned.load(std::memory_order_relaxed) || Clock::now() >= limits.deadline) {
      cut = timed_out(limits);
      return false;
    }
    if (a.bytes.size() + n > limits.max_bytes) {  // no Content-Length, or one that lied
      cut = too_large(limits);
      return false;
    }
    a.bytes.append(data, n);
    return true;
  };
  const httplib::Result r = client->Get(u.target, headers, on_head, on_body);
  if (r) return a;
  if (!cut.empty()) {
    a.error = cut;
  } else if (r.error() != httplib::Error::Canceled || a.status == 0) {
    a.error = transport_error(r.error(), u, limits);
  }
  return a;  // else: on_head turned a non-2xx status away, for the caller to read
}

ImageFetchResult failed(std::string why) {
  ImageFetchResult r;
  r.error = std::move(why);
  return r;
}

bool is_redirect(int status) {
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

ImageFetchResult fetch_following(const FetchJob& job) {
  ImageFetchResult out;
  std::string url = job.url;
  for (int hop = 0;; ++hop) {
    std::string why;
    const std::optional<ImageUrl> u = image_url_parse(url, &why);
    if (!u) return failed(hop == 0 ? why : "it redirected to '" + url.substr(0, 200) + "', where " + why);
    if (u->https && !image_fetch_https_supported())
      return failed("this build of tern cannot fetch https URLs (its HTTP client, cpp-httplib, was built without "
                    "OpenSSL); use an http URL or send the image inline");
    Answer a = get_once(*u, job);
    if (!a.error.empty()) return failed(a.error);
    if (is_redirect(a.status)) {
      if (a.location.empty())
        return failed("the server answered HTTP " + std::to_string(a.status) + " without a Location");
      if (hop == job.limits.max_redirects)
        return failed("it redirected more than " + std::to_string(job.limits.max_redirects) + " times");
      url = image_url_resolve(*u, a.location);
      continue;
    }
    if (a.status < 200 || a.status >= 300)
      return failed("the server answered HTTP " + std::to_string(a.status) + " (only a 2xx answer is an image)");
    out.bytes = std::move(a.bytes);
    out.content_type = std::move(a.content_type);
    return out;
  }
}

}  // namespace

std::optional<ImageUrl> image_url_parse(const std::string& url, std::string* why) {
  auto fail = [&](const char* reason) {
    if (why) *why = reason;
    return std::nullopt;
  };
  for (unsigned char c : url)
    if (c <= 0x20 || c == 0x7f) return fail("it holds a space or a control character (percent-encode them)");
  ImageUrl u;
  std::string rest;
  if (starts_with_nocase(url, "http://")) {
    rest = url.substr(7);
  } else if (starts_with_nocase(url, "https://")) {
    u.https = true;
    rest = url.substr(8);
  } else {
    return fail("it is not an http(s) URL");
  }
  const size_t end = rest.find_first_of("/?#");
  const std::string authority = rest.substr(0, end);
  std::string target = end == std::string::npos ? "" : rest.substr(end);
  if (authority.find('@') != std::string::npos)
    return fail("it holds credentials (user:password@host), which this server does not send");
  std::string port_text;
  if (!authority.empty() && authority[0] == '[') {  // an IPv6 address: [::1]:8080
    const size_t close = authority.find(']');
    if (close == std::string::npos) return fail("its IPv6 host has no closing ']'");
    u.host = authority.substr(1, close - 1);
    const std::string after = authority.substr(close + 1);
    if (!after.empty() && after[0] != ':') return fail("it has characters after its IPv6 host");
    if (!after.empty()) port_text = after.substr(1);
  } else {
    const size_t colon = authority.rfind(':');
    u.host = authority.substr(0, colon);
    if (colon != std::string::npos) port_text = authority.substr(colon + 1);
  }
  if (u.host.empty()) return fail("it has no host");
  const std::optional<int> port = parse_port(port_text, u.https ? 443 : 80);
  if (!port) return fail("its port is not a number from 1 to 65535");
  u.port = *port;
  target = target.substr(0, target.find('#'));
  if (target.empty() || target[0] != '/') target = "/" + target;
  u.target = target;
  return u;
}

std::string image_url_resolve(const ImageUrl& base, const std::string& location) {
  if (has_scheme(location)) return location;
  if (location.rfind("//", 0) == 0) return (base.https ? "https:" : "http:") + location;
  if (!location.empty() && location[0] == '/') return origin(base) + location;
  const std::string path = base.target.substr(0, base.target.find('?'));
  if (location.empty() || location[0] == '?') return origin(base) + path + location;
  return origin(base) + path.substr(0, path.rfind('/') + 1) + location;
}

bool image_fetch_https_supported() {
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
  return true;
#else
  return false;
#endif
}

ImageFetchResult image_url_fetch(const std::string& url, const ImageFetchLimits& limits) {
  auto job = std::make_shared<FetchJob>();
  job->url = url;
  job->limits = limits;
  std::future<ImageFetchResult> result = job->done.get_future();
  // The job is shared with the thread, which may outlive this call: past the deadline the caller answers at once
  // and the download ends on its own (its waits are bounded by the time left, its reader stops when abandoned).
  try {
    std::thread([job] {
      try {
        job->done.set_value(fetch_following(*job));
      } catch (const std::exception& e) {  // out of memory, a client's own error: a refusal, not a crash
        job->done.set_value(failed(std::string("the download failed: ") + e.what()));
      }
    }).detach();
  } catch (const std::system_error&) {
    return failed("no thread could be started to fetch it (the server is out of resources)");
  }
  if (result.wait_until(limits.deadline) == std::future_status::ready) return result.get();
  job->abandoned.store(true, std::memory_order_relaxed);
  return failed(timed_out(limits));
}

}  // namespace tern::server
