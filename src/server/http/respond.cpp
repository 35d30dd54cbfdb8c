#include "server/http/respond.h"

namespace tern::server {

namespace {

void write_error(httplib::Response& res, const ApiError& error, const std::string& body) {
  request_log().fields["error"] = error.message;
  res.status = error.status;
  if (error.retry_after_s > 0) res.set_header("Retry-After", std::to_string(error.retry_after_s));
  res.set_content(body, "application/json");
}

}  // namespace

RequestLog& request_log() {
  thread_local RequestLog log;
  return log;
}

void respond_json(httplib::Response& res, const Json& body, int status) {
  res.status = status;
  res.set_content(json_dump(body), "application/json");
}

void respond_error(httplib::Response& res, const ApiError& error) {
  write_error(res, error, api_error_body(error));
}

void respond_error_with_body(httplib::Response& res, const ApiError& error, const Json& body) {
  write_error(res, error, json_dump(body));
}

}  // namespace tern::server
