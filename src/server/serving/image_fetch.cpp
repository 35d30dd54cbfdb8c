#include "server/serving/image_fetch.h"

#include <fcntl.h>
#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
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

// `during`: what it was doing, when that says more than the URL ("looking up example.com").
std::string timed_out(const ImageFetchLimits& limits, const std::string& during = "") {
  return "it timed out" + (during.empty() ? "" : " " + during) + " (the server allows " +
         seconds_text(limits.timeout_s) + " s for a request's image URLs; tern serve --image-url-timeout sets it)";
}

std::string too_large(const ImageFetchLimits& limits) {
  const size_t mib = size_t(1) << 20;
  const std::string limit = limits.max_bytes % mib == 0 ? std::to_string(limits.max_bytes / mib) + " MiB"
                                                       : std::to_string(limits.max_bytes) + " bytes";
  return "the image is larger than " + limit + ", the most this server fetches";
}

// Why a request to `ip` failed for a reason of the connection's (not an HTTP status).
std::string transport_error(httplib::Error error, const ImageUrl& u, const std::string& ip,
                            const ImageFetchLimits& limits) {
  if (error == httplib::Error::ConnectionTimeout || Clock::now() >= limits.deadline) return timed_out(limits);
  const std::string where = u.host + ":" + std::to_string(u.port);
  switch (error) {
    case httplib::Error::Connection:
      return "could not connect to " + where + (ip == u.host ? "" : " at " + ip) + " (nothing answers there)";
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

// The client for `u`'s host, connecting to `ip` (what was looked up and checked: the client looks nothing up itself,
// so a DNS answer that changes between the check and the connection changes nothing). TLS still names and verifies
// the host.
std::unique_ptr<httplib::ClientImpl> make_client(const ImageUrl& u, const std::string& ip) {
  std::unique_ptr<httplib::ClientImpl> client;
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
  if (u.https) {
    auto ssl = std::make_unique<httplib::SSLClient>(u.host, u.port);
    ssl->enable_server_certificate_verification(true);  // the default today; an image from an unverified host
    client = std::move(ssl);                             // could be anyone's
  }
#endif
  if (!client) client = std::make_unique<httplib::ClientImpl>(u.host, u.port);
  client->set_hostname_addr_map({{u.host, ip}});
  return client;
}

// One fetch's state, shared by the caller, the download's thread and (through `Lookup`) the lookups' threads: the
// caller may return at the deadline while they still run, so they hold nothing of its but this, and copies.
struct FetchJob {
  std::string url;
  ImageFetchLimits limits;
  std::promise<ImageFetchResult> done;
  std::atomic<bool> abandoned{false};  // the caller stopped waiting: stop reading, connect nowhere else
  std::mutex mutex;
  int socket_copy = -1;  // under mutex: a duplicate of the connection's socket while it is open
  std::string waiting_for;  // under mutex: what a timeout then says it waited for ("looking up example.com"), or ""

  // The caller, at the deadline: whatever the download waits on (a connect, a TLS handshake, a read) ends now.
  // The copy is the download's own descriptor, so it cannot have been closed and reused for another socket.
  // Returns what it was waiting for.
  std::string abandon() {
    abandoned.store(true);
    std::lock_guard<std::mutex> lock(mutex);
    if (socket_copy >= 0) ::shutdown(socket_copy, SHUT_RDWR);
    return waiting_for;
  }

  void set_waiting_for(std::string what) {
    std::lock_guard<std::mutex> lock(mutex);
    waiting_for = std::move(what);
  }

  // The client's socket options hook: called with each socket it opens, before it connects.
  void watch_socket(int sock) {
    std::lock_guard<std::mutex> lock(mutex);
    if (socket_copy >= 0) ::close(socket_copy);
    socket_copy = ::fcntl(sock, F_DUPFD_CLOEXEC, 0);
    if (socket_copy >= 0 && abandoned.load()) ::shutdown(socket_copy, SHUT_RDWR);
  }

  void unwatch_socket() {
    std::lock_guard<std::mutex> lock(mutex);
    if (socket_copy >= 0) ::close(socket_copy);
    socket_copy = -1;
  }
};

// One lookup, shared by the download's thread (which stops waiting at the deadline) and the lookup's thread (which
// may outlive it: it holds this, a copy of the host and a copy of the resolver, nothing else).
struct Lookup {
  std::mutex mutex;
  std::condition_variable answered_cv;
  bool answered = false;
  std::vector<std::string> addresses;
  std::string why;
};

// Looks `host` up with the job's resolver on a thread of its own, waiting for it no longer than the deadline.
// nullopt: no answer in time; else the addresses, or none with *why set.
std::optional<std::vector<std::string>> look_up(const std::string& host, const FetchJob& job, std::string* why) {
  if (ip_parse(host)) return std::vector<std::string>{host};  // an address already: nothing to look up
  auto lookup = std::make_shared<Lookup>();
  ImageResolver resolver = job.limits.resolver ? job.limits.resolver : ImageResolver(image_resolve_system);
  try {
    std::thread([lookup, host, resolver = std::move(resolver)] {
      std::vector<std::string> addresses;
      std::string reason;
      try {
        addresses = resolver(host, &reason);
      } catch (const std::exception& e) {
        addresses.clear();
        reason = e.what();
      }
      std::lock_guard<std::mutex> lock(lookup->mutex);
      lookup->addresses = std::move(addresses);
      lookup->why = std::move(reason);
      lookup->answered = true;
      lookup->answered_cv.notify_all();
    }).detach();
  } catch (const std::system_error&) {
    *why = "no thread could be started to look its host up (the server is out of resources)";
    return std::vector<std::string>{};
  }
  std::unique_lock<std::mutex> lock(lookup->mutex);
  // Woken by the answer; the deadline bounds the wait (the caller gives up then too).
  if (!lookup->answered_cv.wait_until(lock, job.limits.deadline, [&] { return lookup->answered; }))
    return std::nullopt;
  *why = lookup->why;
  return std::move(lookup->addresses);
}

// What the host of `u` is, as a refusal names it: "the host 10.0.0.5" or "the host images.lan (10.0.0.5)".
std::string host_named(const ImageUrl& u, const std::string& ip) {
  const std::optional<IpAddress> literal = ip_parse(u.host);
  if (literal) return "the host " + u.host + " is";
  return "the host " + u.host + " resolves to " + ip + ",";
}

// The addresses of `u`'s host that may be connected to, in the resolver's order (at most 4: each is tried in turn
// while nothing answers). Empty, with *why set, when there are none: no such host, or only non-public addresses
// that --image-url-allow does not allow. nullopt: the lookup ran past the deadline.
std::optional<std::vector<std::string>> addresses_to_try(const ImageUrl& u, FetchJob& job, std::string* why) {
  std::string lookup_why;
  job.set_waiting_for("looking up " + u.host);
  std::optional<std::vector<std::string>> found = look_up(u.host, job, &lookup_why);
  if (!found) return std::nullopt;  // waiting_for stays: the caller may read it a moment after the deadline too
  job.set_waiting_for("");
  std::vector<std::string> usable;
  std::string refused;  // the first address refused, and why
  for (const std::string& text : *found) {
    const std::optional<IpAddress> ip = ip_parse(text.substr(0, text.find('%')));  // a zone (fe80::1%eth0) aside
    if (!ip) continue;
    const std::string reason = ip_non_public_reason(*ip);
    const bool allowed = reason.empty() || std::any_of(job.limits.allowed.begin(), job.limits.allowed.end(),
                                                       [&](const IpRange& r) { return r.contains(*ip); });
    if (allowed) {
      if (std::find(usable.begin(), usable.end(), text) == usable.end() && usable.size() < 4) usable.push_back(text);
    } else if (refused.empty()) {
      refused = host_named(u, ip_text(*ip)) + " " + reason + ", which this server does not fetch from (tern serve "
                "--image-url-allow " + ip_text(*ip) + ", or a range holding it, would allow it)";
    }
  }
  if (usable.empty())
    *why = !refused.empty() ? refused
           : !found->empty() ? "the host " + u.host + " has no address this server can connect to"
           : "the host " + u.host + " could not be looked up (" +
                 (lookup_why.empty() ? std::string("no address") : lookup_why) + ")";
  return usable;
}

// One GET, not following redirects: the status and its headers, and for a 2xx the body.
struct Answer {
  int status = 0;
  std::string location, content_type, bytes;
  std::string error;  // a transport failure, a timeout, or too large (the status is then meaningless)
  bool unreachable = false;  // nothing answered at that address: another of the host's may
};

// The GET of `u` from the address `ip`.
Answer get_once(const ImageUrl& u, const std::string& ip, FetchJob& job) {
  Answer a;
  const ImageFetchLimits& limits = job.limits;
  const Clock::duration remaining = limits.deadline - Clock::now();
  if (remaining <= Clock::duration::zero() || job.abandoned.load()) {
    a.error = timed_out(limits);
    return a;
  }
  std::unique_ptr<httplib::ClientImpl> client = make_client(u, ip);
  // Each wait of the client's is bounded by the time left; at the deadline the caller shuts the socket down (which
  // ends any wait at once), and the body's reader checks the deadline itself too.
  client->set_connection_timeout(remaining);
  client->set_read_timeout(remaining);
  client->set_write_timeout(remaining);
  client->set_keep_alive(false);
  client->set_follow_location(false);  // followed here, to count them, to allow http(s) only and to check each host
  client->set_socket_options([&job](socket_t sock) {
    httplib::default_socket_options(sock);
    job.watch_socket(sock);
  });
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
  job.unwatch_socket();
  if (r) return a;
  if (!cut.empty()) {
    a.error = cut;
  } else if (job.abandoned.load()) {
    a.error = timed_out(limits);
  } else if (r.error() != httplib::Error::Canceled || a.status == 0) {
    a.error = transport_error(r.error(), u, ip, limits);
    a.unreachable = r.error() == httplib::Error::Connection;
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

ImageFetchResult fetch_following(FetchJob& job) {
  ImageFetchResult out;
  std::string url = job.url;
  for (int hop = 0;; ++hop) {
    // A refusal of this hop's URL or host: a redirect's says where it led.
    auto refused = [&](const std::string& why) {
      return failed(hop == 0 ? why : "it redirected to '" + url.substr(0, 200) + "', where " + why);
    };
    std::string why;
    const std::optional<ImageUrl> u = image_url_parse(url, &why);
    if (!u) return refused(why);
    if (u->https && !image_fetch_https_supported())
      return failed("this build of tern cannot fetch https URLs (its HTTP client, cpp-httplib, was built without "
                    "OpenSSL); use an http URL or send the image inline");
    const std::optional<std::vector<std::string>> ips = addresses_to_try(*u, job, &why);
    if (!ips) return failed(timed_out(job.limits, "looking up " + u->host));
    if (ips->empty()) return refused(why);
    Answer a;
    for (const std::string& ip : *ips) {
      a = get_once(*u, ip, job);
      if (!a.unreachable) break;  // else the next address, while there is time
    }
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

std::vector<std::string> image_resolve_system(const std::string& host, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  std::vector<std::string> out;
  if (rc != 0) {
    if (why) *why = rc == EAI_SYSTEM ? std::generic_category().message(errno) : ::gai_strerror(rc);
    return out;
  }
  for (const addrinfo* a = found; a; a = a->ai_next) {
    char text[NI_MAXHOST] = {};
    if (::getnameinfo(a->ai_addr, a->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST) == 0)
      out.push_back(text);
  }
  ::freeaddrinfo(found);
  return out;
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
  // The job is shared with the thread, which may outlive this call: past the deadline the caller answers at once,
  // shutting the download's connection down, and the thread ends on its own (a lookup it waits on is bounded by the
  // deadline too).
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
  return failed(timed_out(limits, job->abandon()));
}

}  // namespace tern::server
