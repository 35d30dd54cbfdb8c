#include "server/http/admission.h"

#include <cctype>

#include "server/http/ascii.h"
#include "server/http/listener.h"

namespace tern::server {

namespace {

bool same_secret(const std::string& given, const std::string& expected) {
  if (given.size() != expected.size()) return false;
  unsigned char diff = 0;  // constant time in the key's length
  for (size_t i = 0; i < given.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ expected[i]);
  return diff == 0;
}

// The name part of a Host header: "[::1]:8080" -> "::1", "Example.com.:80" -> "example.com".
std::string host_name(const std::string& host) {
  std::string h = host;
  if (!h.empty() && h.front() == '[') {
    const size_t close = h.find(']');
    h = close == std::string::npos ? h.substr(1) : h.substr(1, close - 1);
  } else if (const size_t colon = h.find(':'); colon != std::string::npos && h.find(':', colon + 1) == std::string::npos) {
    h = h.substr(0, colon);
  }
  if (!h.empty() && h.back() == '.') h.pop_back();
  return ascii_lower(h);
}

// The Access-Control-Allow-Headers of a preflight: what the page asked for (header names only), so that SDKs
// that add their own headers (the OpenAI JS SDK's x-stainless-*) pass.
std::string allowed_request_headers(const std::string& requested) {
  std::string out;
  for (char ch : requested) {
    const bool ok = std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == ',' || ch == ' ';
    if (!ok) return "Authorization, Content-Type";
    out += ch;
  }
  if (out.size() > 2048 || out.find_first_not_of(" ,") == std::string::npos) return "Authorization, Content-Type";
  return out;
}

}  // namespace

bool authorized(const std::string& api_key, const std::string* authorization, const std::string* x_api_key) {
  if (api_key.empty()) return true;
  auto bearer = [&](const std::string& a) {
    return a.size() > 7 && a[6] == ' ' && ascii_lower(a.substr(0, 6)) == "bearer" && same_secret(a.substr(7), api_key);
  };
  return (authorization && bearer(*authorization)) || (x_api_key && same_secret(*x_api_key, api_key));
}

bool host_allowed(const std::string* host, bool loopback, const std::string& bound_host,
                  const std::vector<std::string>& allowed_hosts) {
  if (!loopback || host == nullptr || host->empty()) return true;  // no Host: not a browser
  const std::string name = host_name(*host);
  if (name == "localhost" || name == ascii_lower(bound_host) || is_loopback_host(name)) return true;
  for (const std::string& a : allowed_hosts)
    if (a == "*" || ascii_lower(a) == name) return true;
  return false;
}

std::string media_type_of(const std::string& content_type) {
  return ascii_lower(trim_blanks(std::string_view(content_type).substr(0, content_type.find(';'))));
}

bool loopback_origin(std::string_view origin) {
  for (std::string_view scheme : {"http://", "https://"}) {
    if (!origin.starts_with(scheme)) continue;
    const std::string_view authority = origin.substr(scheme.size());
    for (std::string_view host : {"localhost", "127.0.0.1", "[::1]"}) {
      if (!authority.starts_with(host)) continue;
      const std::string_view port = authority.substr(host.size());
      if (port.empty()) return true;
      return port.size() >= 2 && port.size() <= 6 && port[0] == ':' &&
             port.find_first_not_of("0123456789", 1) == std::string_view::npos;
    }
  }
  return false;
}

void add_cors_headers(const std::string& cors_origin, const httplib::Request& req, httplib::Response& res) {
  const std::string origin = req.get_header_value("Origin");
  // The answer depends on Origin (a loopback one is echoed): caches must keep them apart.
  res.set_header("Vary", "Origin");
  const bool allowed = cors_origin == "*" || (!origin.empty() && (origin == cors_origin || loopback_origin(origin)));
  const std::string allow_origin = cors_origin == "*" ? cors_origin : allowed ? origin : cors_origin;
  if (allow_origin.empty()) return;
  res.set_header("Access-Control-Allow-Origin", allow_origin);
  if (req.method != "OPTIONS") return;
  res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
  const std::string requested = req.get_header_value("Access-Control-Request-Headers");
  res.set_header("Access-Control-Allow-Headers",
                 allowed && !requested.empty() ? allowed_request_headers(requested) : "Authorization, Content-Type");
  res.set_header("Access-Control-Max-Age", "600");
}

}  // namespace tern::server
