// Which addresses the image URL fetcher refuses by default (serving/ip_address.h), on a table of IPv4 and IPv6
// addresses at the edges of each range, and the CIDR ranges of --image-url-allow.
#include <gtest/gtest.h>

#include "server/serving/ip_address.h"

namespace tern::server {
namespace {

IpAddress ip(const std::string& text) {
  const std::optional<IpAddress> a = ip_parse(text);
  EXPECT_TRUE(a.has_value()) << text;
  return a.value_or(IpAddress{});
}

// Whether `text`'s reason starts with `kind` (the table says what each address is; the range follows), or for
// kind "" whether it is public.
::testing::AssertionResult is_kind(const std::string& text, const std::string& kind) {
  const std::string r = ip_non_public_reason(ip(text));
  if (kind.empty() ? r.empty() : r.rfind(kind + " (", 0) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << text << ": '" << r << "', not '" << kind << "'";
}

TEST(IpAddress, ParsesNumericAddressesOnly) {
  EXPECT_TRUE(ip("10.0.0.5").v4);
  EXPECT_FALSE(ip("2001:db8::1").v4);
  EXPECT_EQ(ip("::ffff:127.0.0.1"), ip("127.0.0.1"));  // mapped: the IPv4 address
  EXPECT_EQ(ip("::FFFF:7f00:1"), ip("127.0.0.1"));
  EXPECT_EQ(ip_text(ip("::ffff:10.1.2.3")), "10.1.2.3");
  EXPECT_EQ(ip_text(ip("2001:0db8:0000::0001")), "2001:db8::1");
  for (const char* bad : {"", "localhost", "127.1", "0x7f000001", "2130706433", "1.2.3.4.5", "256.0.0.1",
                          "fe80::1%eth0", "[::1]", "::1/128", " 1.2.3.4"})
    EXPECT_FALSE(ip_parse(bad).has_value()) << bad;
}

TEST(IpAddress, ClassifiesAddressesAtTheEdgesOfEachRange) {
  const std::pair<const char*, const char*> table[] = {
      // IPv4
      {"0.0.0.0", "an unspecified (this-network) address"},
      {"0.255.255.255", "an unspecified (this-network) address"},
      {"1.0.0.0", ""},
      {"8.8.8.8", ""},
      {"9.255.255.255", ""},
      {"10.0.0.0", "a private address"},
      {"10.255.255.255", "a private address"},
      {"11.0.0.0", ""},
      {"100.63.255.255", ""},
      {"100.64.0.0", "a shared (carrier-grade NAT) address"},
      {"100.127.255.255", "a shared (carrier-grade NAT) address"},
      {"100.128.0.0", ""},
      {"126.255.255.255", ""},
      {"127.0.0.1", "a loopback address"},
      {"127.255.255.254", "a loopback address"},
      {"128.0.0.0", ""},
      {"169.253.255.255", ""},
      {"169.254.0.0", "a link-local address"},
      {"169.254.169.254", "a link-local address"},  // cloud metadata
      {"169.254.255.255", "a link-local address"},
      {"169.255.0.0", ""},
      {"172.15.255.255", ""},
      {"172.16.0.0", "a private address"},
      {"172.31.255.255", "a private address"},
      {"172.32.0.0", ""},
      {"192.0.0.8", "a special-purpose (IETF protocol) address"},
      {"192.0.1.0", ""},
      {"192.167.255.255", ""},
      {"192.168.0.0", "a private address"},
      {"192.168.255.255", "a private address"},
      {"192.169.0.0", ""},
      {"198.17.255.255", ""},
      {"198.18.0.0", "a benchmarking-network address"},
      {"198.19.255.255", "a benchmarking-network address"},
      {"198.20.0.0", ""},
      {"223.255.255.255", ""},
      {"224.0.0.0", "a multicast address"},
      {"239.255.255.255", "a multicast address"},
      {"240.0.0.0", "a reserved address"},
      {"255.255.255.254", "a reserved address"},
      {"255.255.255.255", "the broadcast address"},
      // IPv4-mapped IPv6: as their IPv4 address
      {"::ffff:127.0.0.1", "a loopback address"},
      {"::ffff:169.254.169.254", "a link-local address"},
      {"::ffff:10.0.0.1", "a private address"},
      {"::ffff:0.0.0.0", "an unspecified (this-network) address"},
      {"::ffff:8.8.8.8", ""},
      // IPv6
      {"::", "the unspecified address"},
      {"::1", "the loopback address"},
      {"::2", "a reserved address"},
      {"::127.0.0.1", "a reserved address"},  // IPv4-compatible (deprecated)
      {"::ffff:0:0:1", "a reserved address"},  // not the mapped form (that is ::ffff:0:0/96)
      {"00ff:ffff::", "a reserved address"},
      {"100::", "a discard-only address"},
      {"100:0:0:1::", ""},
      {"2001:4860:4860::8888", ""},
      {"2606:4700::1111", ""},
      {"64:ff9b::7f00:1", "a loopback address"},      // NAT64 of 127.0.0.1
      {"64:ff9b::a9fe:a9fe", "a link-local address"},  // NAT64 of 169.254.169.254
      {"64:ff9b::808:808", ""},                         // NAT64 of 8.8.8.8
      {"64:ff9b:1::1", "a local-use NAT64 address"},
      {"2002:c0a8:0101::1", "a private address"},  // 6to4 of 192.168.1.1
      {"2002:0808:0808::1", ""},
      {"fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", ""},
      {"fc00::", "a private (unique local) address"},
      {"fd12:3456::1", "a private (unique local) address"},
      {"fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "a private (unique local) address"},
      {"fe00::", ""},
      {"fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", ""},
      {"fe80::", "a link-local address"},
      {"fe80::1", "a link-local address"},
      {"febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "a link-local address"},
      {"fec0::1", "a site-local address"},
      {"feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "a site-local address"},
      {"ff00::", "a multicast address"},
      {"ff02::1", "a multicast address"},
      {"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "a multicast address"},
  };
  for (const auto& [address, expected] : table) EXPECT_TRUE(is_kind(address, expected));
}

TEST(IpAddress, ReasonsNameTheRange) {
  EXPECT_EQ(ip_non_public_reason(ip("10.0.0.5")), "a private address (10.0.0.0/8)");
  EXPECT_EQ(ip_non_public_reason(ip("169.254.169.254")),
            "a link-local address (169.254.0.0/16, where cloud metadata services answer)");
  EXPECT_EQ(ip_non_public_reason(ip("::1")), "the loopback address (::1/128)");
  EXPECT_EQ(ip_non_public_reason(ip("64:ff9b::a00:1")), "a private address (10.0.0.0/8) in a NAT64 address "
                                                         "(64:ff9b::/96)");
}

IpRange range(const std::string& text) {
  std::string why;
  const std::optional<IpRange> r = ip_range_parse(text, &why);
  EXPECT_TRUE(r.has_value()) << text << ": " << why;
  return r.value_or(IpRange{});
}

std::string range_refusal(const std::string& text) {
  std::string why;
  EXPECT_FALSE(ip_range_parse(text, &why).has_value()) << text;
  return why;
}

TEST(IpAddress, RangesContainTheirAddresses) {
  const IpRange net10 = range("10.0.0.0/8");
  EXPECT_TRUE(net10.contains(ip("10.0.0.0")));
  EXPECT_TRUE(net10.contains(ip("10.255.255.255")));
  EXPECT_TRUE(net10.contains(ip("::ffff:10.1.2.3")));  // mapped: as its IPv4 address
  EXPECT_FALSE(net10.contains(ip("11.0.0.0")));
  EXPECT_FALSE(net10.contains(ip("a00::")));  // an IPv6 address with the same first bytes
  const IpRange one = range("127.0.0.1");  // a bare address: a range of one
  EXPECT_EQ(one.prefix, 32);
  EXPECT_TRUE(one.contains(ip("127.0.0.1")));
  EXPECT_FALSE(one.contains(ip("127.0.0.2")));
  const IpRange odd = range("172.16.0.0/12");
  EXPECT_TRUE(odd.contains(ip("172.31.255.255")));
  EXPECT_FALSE(odd.contains(ip("172.32.0.0")));
  const IpRange v6 = range("fd00::/8");
  EXPECT_TRUE(v6.contains(ip("fd12::1")));
  EXPECT_FALSE(v6.contains(ip("fc00::1")));
  EXPECT_FALSE(v6.contains(ip("10.0.0.1")));
  EXPECT_TRUE(range("::/0").contains(ip("2001:db8::1")));
  EXPECT_FALSE(range("::/0").contains(ip("8.8.8.8")));  // IPv4 ranges are written as IPv4
  EXPECT_TRUE(range("0.0.0.0/0").contains(ip("::ffff:8.8.8.8")));
  const IpRange mapped = range("::ffff:10.0.0.0/104");  // the mapped form of 10.0.0.0/8
  EXPECT_TRUE(mapped.base.v4);
  EXPECT_EQ(mapped.prefix, 8);
  EXPECT_EQ(ip_range_text(mapped), "10.0.0.0/8");
  EXPECT_EQ(ip_range_text(range("fe80::/10")), "fe80::/10");
}

TEST(IpAddress, RefusesBadRanges) {
  EXPECT_NE(range_refusal("localhost").find("not an IP address or a CIDR range"), std::string::npos);
  EXPECT_NE(range_refusal("10.0.0.0/33").find("0 to 32"), std::string::npos);
  EXPECT_NE(range_refusal("fd00::/129").find("0 to 128"), std::string::npos);
  EXPECT_NE(range_refusal("10.0.0.0/").find("prefix length"), std::string::npos);
  EXPECT_NE(range_refusal("10.0.0.0/-1").find("prefix length"), std::string::npos);
  EXPECT_NE(range_refusal("10.0.0.0/8x").find("prefix length"), std::string::npos);
  EXPECT_NE(range_refusal("::ffff:10.0.0.0/95").find("IPv4-mapped"), std::string::npos);
  const std::string typo = range_refusal("10.0.0.1/8");
  EXPECT_NE(typo.find("did you mean 10.0.0.0/8?"), std::string::npos) << typo;
  EXPECT_NE(range_refusal("fe80::1/10").find("did you mean fe80::/10?"), std::string::npos);
}

}  // namespace
}  // namespace tern::server
