// Downloading an image a request names by an http(s) URL (tern serve --allow-image-urls only; by default the server
// never fetches on a client's behalf). The fetch runs before the request is queued, on the HTTP handler's side, and
// is bounded: one deadline for all of a request's URLs (the host lookups included), a byte cap per image, a few
// redirects (to http(s) only), 2xx answers only. Each host is looked up here and the connection made to the address
// that was checked: one that is not the public internet (loopback, private, link-local, ...: ip_address.h) is
// refused unless --image-url-allow names a range holding it, on every redirect's hop. The bytes are then read as a
// data: URL's would be (serving/prompt_images.h). Every failure is a sentence saying why, for the 400 that names the
// image.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "server/serving/ip_address.h"

namespace tern::server {

// An absolute http(s) URL split for the HTTP client: the host (an IPv6 address without its brackets), the port (the
// scheme's when none is given) and the request target (the path and query; "/" when the URL has no path; the
// fragment dropped, as a browser never sends it).
struct ImageUrl {
  bool https = false;
  std::string host;
  int port = 0;
  std::string target;
};

// Parses `url`: nullopt, with *why set to the reason, for anything but an absolute http(s) URL with a host
// (credentials in the URL, spaces and control characters, a bad port are refused too).
std::optional<ImageUrl> image_url_parse(const std::string& url, std::string* why);

// A redirect's Location against the URL it answered: an absolute URL as is, "//host/..." with the base's scheme,
// "/path" on the base's host, anything else relative to the base's directory (dot segments are left to the server).
std::string image_url_resolve(const ImageUrl& base, const std::string& location);

// Whether this build's HTTP client speaks https (cpp-httplib built with OpenSSL).
bool image_fetch_https_supported();

// Looks a host up: its numeric addresses ("93.184.216.34", "2001:db8::1"), or none with *why set to the reason.
// It may block for as long as it likes (getaddrinfo does): the fetch runs it on a thread of its own, stops waiting
// at the deadline, and the thread ends by itself later; so it must hold nothing of the caller's by reference.
using ImageResolver = std::function<std::vector<std::string>(const std::string& host, std::string* why)>;

// The system's resolver (getaddrinfo: /etc/hosts, DNS), TCP addresses of either family, in its order.
std::vector<std::string> image_resolve_system(const std::string& host, std::string* why);

struct ImageFetchLimits {
  std::chrono::steady_clock::time_point deadline;  // the whole fetch, lookups and redirects included, ends by then
  double timeout_s = 10;                           // what the deadline stands for, for the messages
  size_t max_bytes = 20u << 20;                    // a larger image is refused (announced or while it arrives)
  int max_redirects = 3;
  std::vector<IpRange> allowed;  // non-public addresses fetched all the same (--image-url-allow); public ones always
  ImageResolver resolver;        // empty: image_resolve_system (tests give one that sleeps, or names test hosts)
};

struct ImageFetchResult {
  std::string bytes;         // the body of the 2xx answer
  std::string content_type;  // its Content-Type ("" if none)
  std::string error;         // "" when fetched; else why not: "the server answered HTTP 404", "timed out after 10 s"
};

// Fetches `url`, blocking the caller until it is done or the deadline passes, whichever comes first. The download
// runs on a thread of its own, and each lookup on another, so that neither a slow server nor a slow DNS can make the
// caller wait. At the deadline the caller returns the timeout at once: the download's connection is shut down then
// (its waits end), and a lookup still running ends when the resolver returns. Neither thread touches anything of
// the caller's after that: they share only what they copied.
ImageFetchResult image_url_fetch(const std::string& url, const ImageFetchLimits& limits);

}  // namespace tern::server
