// Base64 decoding (core/base64): every length and padding, the URL-safe alphabet, wrapped lines; what is not base64
// is refused with the reason.
#include <gtest/gtest.h>

#include <random>

#include "core/base64.h"

namespace tern {
namespace {

std::string encode(const std::string& bytes) {  // the reference: RFC 4648 with padding
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 2]));
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

TEST(Base64, RoundTripsEveryLength) {
  std::mt19937 rng(std::random_device{}());
  for (size_t n = 0; n < 200; ++n) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = char(rng());
    const std::string text = encode(bytes);
    EXPECT_EQ(base64_decode(text), bytes) << n;
    std::string bare = text;  // padding left out
    while (!bare.empty() && bare.back() == '=') bare.pop_back();
    EXPECT_EQ(base64_decode(bare), bytes) << n;
  }
}

TEST(Base64, WrappedLinesAndTheUrlSafeAlphabet) {
  EXPECT_EQ(base64_decode("aGVs\nbG8s\r\n IHdv cmxk"), "hello, world");
  EXPECT_EQ(base64_decode("-_-_"), base64_decode("+/+/"));
}

TEST(Base64, WhatIsNotBase64IsRefusedWithTheReason) {
  std::string why;
  EXPECT_FALSE(base64_decode("aGk*", &why));
  EXPECT_NE(why.find("offset 3"), std::string::npos) << why;
  EXPECT_FALSE(base64_decode("aG=k", &why));
  EXPECT_NE(why.find("padding"), std::string::npos) << why;
  EXPECT_FALSE(base64_decode("aGVsb", &why));  // one character left over
  EXPECT_FALSE(base64_decode("aGk==", &why));  // padding past the group
  EXPECT_FALSE(base64_decode("====", &why));
  EXPECT_EQ(base64_decode(""), std::string());
}

}  // namespace
}  // namespace tern
