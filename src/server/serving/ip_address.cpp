#include "server/serving/ip_address.h"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <system_error>

namespace tern::server {

namespace {

IpAddress v4_address(uint32_t a) {
  IpAddress ip;
  ip.v4 = true;
  for (int i = 0; i < 4; ++i) ip.bytes[i] = uint8_t(a >> (24 - 8 * i));
  return ip;
}

uint32_t v4_value(const uint8_t* b) {
  return uint32_t(b[0]) << 24 | uint32_t(b[1]) << 16 | uint32_t(b[2]) << 8 | uint32_t(b[3]);
}

// The first `bits` bits of a and b agree.
bool same_prefix(const uint8_t* a, const uint8_t* b, int bits) {
  const int whole = bits / 8, rest = bits % 8;
  if (std::memcmp(a, b, whole) != 0) return false;
  if (rest == 0) return true;
  const uint8_t mask = uint8_t(0xff << (8 - rest));
  return (a[whole] & mask) == (b[whole] & mask);
}

struct V4Rule {
  uint32_t base;
  int prefix;
  const char* what;
};

// The IPv4 ranges that are not the public internet (RFC 6890's special-purpose registry, the ones a fetch could
// reach something through), most specific first where they nest.
constexpr V4Rule kV4Rules[] = {
    {0x00000000, 8, "an unspecified (this-network) address"},
    {0x0a000000, 8, "a private address"},
    {0x64400000, 10, "a shared (carrier-grade NAT) address"},
    {0x7f000000, 8, "a loopback address"},
    {0xa9fe0000, 16, "a link-local address"},  // 169.254.169.254: cloud metadata
    {0xac100000, 12, "a private address"},
    {0xc0000000, 24, "a special-purpose (IETF protocol) address"},
    {0xc0a80000, 16, "a private address"},
    {0xc6120000, 15, "a benchmarking-network address"},
    {0xe0000000, 4, "a multicast address"},
    {0xffffffff, 32, "the broadcast address"},
    {0xf0000000, 4, "a reserved address"},
};

std::string v4_reason(uint32_t a) {
  for (const V4Rule& r : kV4Rules) {
    const uint32_t mask = r.prefix == 0 ? 0 : ~uint32_t(0) << (32 - r.prefix);
    if ((a & mask) != r.base) continue;
    std::string out = std::string(r.what) + " (" + ip_text(v4_address(r.base)) + "/" + std::to_string(r.prefix);
    if (r.base == 0xa9fe0000) out += ", where cloud metadata services answer";
    return out + ")";
  }
  return "";
}

struct V6Rule {
  std::array<uint8_t, 16> base;
  int prefix;
  const char* what;
  const char* text;
};

constexpr std::array<uint8_t, 16> v6(std::initializer_list<uint8_t> head) {
  std::array<uint8_t, 16> b{};
  size_t i = 0;
  for (uint8_t x : head) b[i++] = x;
  return b;
}

// The IPv6 ranges that are not the public internet, the first that holds an address naming it. ::ffff:0:0/96 never gets here (ip_parse reads it as IPv4);
// NAT64 and 6to4 addresses are judged by the IPv4 address in them, before these rules.
const V6Rule kV6Rules[] = {
    {v6({}), 128, "the unspecified address", "::/128"},
    {v6({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}), 128, "the loopback address", "::1/128"},
    {v6({0x00, 0x64, 0xff, 0x9b, 0x00, 0x01}), 48, "a local-use NAT64 address", "64:ff9b:1::/48"},
    {v6({}), 8, "a reserved address (IPv4-compatible and other ::/8 forms)", "::/8"},  // holds the ones above
    {v6({0x01, 0x00}), 64, "a discard-only address", "100::/64"},
    {v6({0xfc}), 7, "a private (unique local) address", "fc00::/7"},
    {v6({0xfe, 0x80}), 10, "a link-local address", "fe80::/10"},
    {v6({0xfe, 0xc0}), 10, "a site-local address (deprecated; private)", "fec0::/10"},
    {v6({0xff}), 8, "a multicast address", "ff00::/8"},
};

}  // namespace

std::optional<IpAddress> ip_parse(const std::string& text) {
  IpAddress ip;
  if (text.find(':') == std::string::npos) {
    in_addr a{};
    if (inet_pton(AF_INET, text.c_str(), &a) != 1) return std::nullopt;
    ip.v4 = true;
    std::memcpy(ip.bytes.data(), &a, 4);  // network order: the first byte first
    return ip;
  }
  in6_addr a{};
  if (inet_pton(AF_INET6, text.c_str(), &a) != 1) return std::nullopt;
  static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(a.s6_addr, kMapped, 12) == 0) {
    ip.v4 = true;
    std::memcpy(ip.bytes.data(), a.s6_addr + 12, 4);
    return ip;
  }
  ip.v4 = false;
  std::memcpy(ip.bytes.data(), a.s6_addr, 16);
  return ip;
}

std::string ip_text(const IpAddress& ip) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ip.v4) {
    in_addr a{};
    std::memcpy(&a, ip.bytes.data(), 4);
    inet_ntop(AF_INET, &a, buf, sizeof buf);
  } else {
    in6_addr a{};
    std::memcpy(a.s6_addr, ip.bytes.data(), 16);
    inet_ntop(AF_INET6, &a, buf, sizeof buf);
  }
  return buf;
}

bool IpRange::contains(const IpAddress& ip) const {
  return ip.v4 == base.v4 && same_prefix(ip.bytes.data(), base.bytes.data(), prefix);
}

std::optional<IpRange> ip_range_parse(const std::string& text, std::string* why) {
  auto fail = [&](const std::string& reason) -> std::optional<IpRange> {
    if (why) *why = "'" + text + "' " + reason;
    return std::nullopt;
  };
  const size_t slash = text.find('/');
  const std::optional<IpAddress> ip = ip_parse(text.substr(0, slash));
  if (!ip) return fail("is not an IP address or a CIDR range (10.0.0.0/8, fd00::/8, 127.0.0.1)");
  IpRange range;
  range.base = *ip;
  range.prefix = ip->bits();
  if (slash != std::string::npos) {
    const std::string p = text.substr(slash + 1);
    const bool mapped = ip->v4 && text.substr(0, slash).find(':') != std::string::npos;  // ::ffff:10.0.0.0/104
    const int most = mapped ? 128 : ip->bits();
    int n = -1;
    const auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), n);
    if (p.empty() || ec != std::errc() || end != p.data() + p.size() || n < 0 || n > most)
      return fail("has a prefix length that is not a number from 0 to " + std::to_string(most));
    if (mapped) n -= 96;  // read as the IPv4 range it covers
    if (n < 0) return fail("covers more than the IPv4-mapped addresses; write the IPv6 range without them");
    range.prefix = n;
  }
  IpAddress masked = range.base;
  for (int i = 0; i < 16; ++i) {
    const int keep = std::min(8, std::max(0, range.prefix - 8 * i));
    masked.bytes[i] &= uint8_t(0xff00 >> keep);
  }
  if (masked != range.base)
    return fail("has bits set past its prefix length (did you mean " + ip_text(masked) + "/" +
                std::to_string(range.prefix) + "?)");
  return range;
}

std::string ip_range_text(const IpRange& range) { return ip_text(range.base) + "/" + std::to_string(range.prefix); }

std::string ip_non_public_reason(const IpAddress& ip) {
  if (ip.v4) return v4_reason(v4_value(ip.bytes.data()));
  const uint8_t* b = ip.bytes.data();
  static constexpr uint8_t kNat64[12] = {0x00, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
  if (std::memcmp(b, kNat64, 12) == 0) {  // 64:ff9b::/96: the IPv4 address it translates to
    const std::string r = v4_reason(v4_value(b + 12));
    return r.empty() ? r : r + " in a NAT64 address (64:ff9b::/96)";
  }
  if (b[0] == 0x20 && b[1] == 0x02) {  // 2002::/16, 6to4: the IPv4 address of its relay
    const std::string r = v4_reason(v4_value(b + 2));
    return r.empty() ? r : r + " in a 6to4 address (2002::/16)";
  }
  for (const V6Rule& r : kV6Rules)
    if (same_prefix(b, r.base.data(), r.prefix)) return std::string(r.what) + " (" + r.text + ")";
  return "";
}

}  // namespace tern::server
