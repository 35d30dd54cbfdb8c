// Shared by the tests of each API's translation: the request parsers' results (a parsed request expected, a rejection
// being a test failure naming the body and the message, or a rejection expected) and feeding an output the model's
// text in random pieces, as tokens arrive.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "engine/generator.h"
#include "server/http/errors.h"
#include "server/http/json.h"

namespace tern::server {

template <typename Request>
Request expect_accepted(const std::variant<Request, ApiError>& r, const std::string& body) {
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << "rejected: " << body << " -> " << e->message;
    return {};
  }
  return std::get<Request>(r);
}

template <typename Request>
ApiError expect_rejected(const std::variant<Request, ApiError>& r, const std::string& body) {
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << "accepted: " << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

// Feeds `text` to `streamed` and `whole` in random pieces of 1 to 7 bytes (one token event each); returns the
// stream's objects (events, chunks) in order. The caller adds the first and final ones.
template <typename Output>
std::vector<Json> feed_in_pieces(Output& streamed, Output& whole, const std::string& text, std::mt19937& rng) {
  std::vector<Json> out;
  for (size_t at = 0; at < text.size();) {
    const size_t n = std::min(text.size() - at, size_t(1 + rng() % 7));
    TokenEvent e;
    e.id = 1;
    e.text = text.substr(at, n);
    for (Json& ob : streamed.on_token(e)) out.push_back(std::move(ob));
    whole.on_token(e);
    at += n;
  }
  return out;
}

}  // namespace tern::server
