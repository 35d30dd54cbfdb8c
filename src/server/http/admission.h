// The HTTP checks a request passes before any handler runs, and the CORS headers of its answer. The server's front
// (http_server.cpp) decides which apply where: it runs them as soon as a request's head is in (from the connection
// layer's poller, before the body is read) and again in cpp-httplib's pre-routing handler, which writes the answer.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <httplib.h>

namespace tern::server {

// The API key: "Authorization: Bearer KEY" (OpenAI clients; the scheme name in any case, RFC 9110 11.1) or
// "x-api-key: KEY" (Anthropic clients), compared in constant time. An empty `api_key`: no authentication.
bool authorized(const std::string& api_key, const std::string* authorization, const std::string* x_api_key);

// DNS rebinding: on a loopback address, a page of any web site can reach the server through a name of its own
// that resolves to 127.0.0.1; its requests carry that name in Host. On a `loopback` server only `bound_host`,
// loopback addresses, localhost and `allowed_hosts` ("*": any) are accepted; no Host at all is (not a browser).
bool host_allowed(const std::string* host, bool loopback, const std::string& bound_host,
                  const std::vector<std::string>& allowed_hosts);

// The media type of a Content-Type value, lower case, without parameters or surrounding blanks.
std::string media_type_of(const std::string& content_type);

// The origin of a page on this machine: http:// or https:// then localhost, 127.0.0.1 or [::1], with any port or
// none (an Origin header as browsers write it: lower case, no path).
bool loopback_origin(std::string_view origin);

// CORS: Access-Control-Allow-Origin (and, on a preflight, the methods and headers allowed) for a loopback Origin
// (echoed) or, when set, `cors_origin` ("*": any origin). The Host check (host_allowed) does not depend on it.
void add_cors_headers(const std::string& cors_origin, const httplib::Request& req, httplib::Response& res);

}  // namespace tern::server
