// Downloading an image a request names by an http(s) URL (tern serve --allow-image-urls only; by default the server
// never fetches on a client's behalf). The fetch runs before the request is queued, on the HTTP handler's side, and
// is bounded: one deadline for all of a request's URLs, a byte cap per image, a few redirects (to http(s) only), 2xx
// answers only. The bytes are then read as a data: URL's would be (serving/prompt_images.h). Every failure is a
// sentence saying why, for the 400 that names the image.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

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

struct ImageFetchLimits {
  std::chrono::steady_clock::time_point deadline;  // the whole fetch, redirects included, ends by then
  double timeout_s = 10;                           // what the deadline stands for, for the messages
  size_t max_bytes = 20u << 20;                    // a larger image is refused (announced or while it arrives)
  int max_redirects = 3;
};

struct ImageFetchResult {
  std::string bytes;         // the body of the 2xx answer
  std::string content_type;  // its Content-Type ("" if none)
  std::string error;         // "" when fetched; else why not: "the server answered HTTP 404", "timed out after 10 s"
};

// Fetches `url`, blocking the caller until it is done or the deadline passes (whichever comes first: the download
// runs on a thread of its own that a slow server cannot make the caller wait for; past the deadline it is abandoned
// and ends by itself).
ImageFetchResult image_url_fetch(const std::string& url, const ImageFetchLimits& limits);

}  // namespace tern::server
