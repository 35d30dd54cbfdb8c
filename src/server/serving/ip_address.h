// IP addresses as the image URL fetcher (serving/image_fetch.h) checks them: which ones are not the public internet
// (loopback, private, link-local, ...; a server that fetches on a client's behalf must not reach them unless told
// to), and the CIDR ranges of --image-url-allow that let some through.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace tern::server {

// An IPv4 or IPv6 address; an IPv4-mapped IPv6 address (::ffff:a.b.c.d) is read as its IPv4 address, so that a
// rule for one is a rule for both.
struct IpAddress {
  bool v4 = true;
  std::array<uint8_t, 16> bytes{};  // v4: the first 4

  int bits() const { return v4 ? 32 : 128; }
  bool operator==(const IpAddress&) const = default;
};

// A numeric address ("10.0.0.5", "::1", "::ffff:127.0.0.1"); nullopt for anything else (host names, zone ids,
// "127.1" and other shorthands: a resolver's output is what gets here).
std::optional<IpAddress> ip_parse(const std::string& text);

// The address as text: dotted quad, or the RFC 5952 form for IPv6.
std::string ip_text(const IpAddress& ip);

// A CIDR range: "10.0.0.0/8", "fd00::/8"; a bare address is a range of one.
struct IpRange {
  IpAddress base;  // its host bits zero
  int prefix = 32;

  bool contains(const IpAddress& ip) const;
};

// Parses "ADDRESS[/PREFIX]"; nullopt, with *why set, for anything else (host bits set past the prefix are refused,
// as they are usually a typo: 10.0.0.1/8).
std::optional<IpRange> ip_range_parse(const std::string& text, std::string* why);

std::string ip_range_text(const IpRange& range);

// Why the image fetcher does not connect to `ip` by default: "" for a public address; else what it is and the range,
// as a message says it: "a loopback address (127.0.0.0/8)", "a private address (10.0.0.0/8)", "a link-local address
// (169.254.0.0/16, where cloud metadata services answer)". IPv6 forms that embed an IPv4 address (mapped, NAT64,
// 6to4) are judged by it.
std::string ip_non_public_reason(const IpAddress& ip);

}  // namespace tern::server
