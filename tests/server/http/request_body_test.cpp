// A request body as the connection layer receives it: chunked framing, content codings, bounded inflation.
#include <gtest/gtest.h>

#include <httplib.h>

#include <string>

#include "server/http/request_body.h"

namespace tern::server {
namespace {

TEST(ChunkedScanner, FindsTheEndAcrossPieces) {
  const std::string body = "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nTrailer: x\r\n\r\nNEXT REQUEST";
  const size_t end = body.find("NEXT");
  for (size_t cut = 0; cut <= body.size(); ++cut) {  // every split of the arrival into two reads
    ChunkedScanner s;
    ASSERT_TRUE(s.scan(std::string_view(body).substr(0, cut))) << cut;
    if (cut < end) {
      EXPECT_FALSE(s.done()) << cut;
    }
    ASSERT_TRUE(s.scan(body)) << cut;
    ASSERT_TRUE(s.done()) << cut;
    EXPECT_EQ(s.end(), end);
    EXPECT_EQ(s.decoded(), 11u);
  }
  ChunkedScanner bad;
  EXPECT_FALSE(bad.scan("zz\r\nhello\r\n"));
  ChunkedScanner missing_crlf;
  EXPECT_FALSE(missing_crlf.scan("2\r\nabXX0\r\n\r\n"));
  ChunkedScanner huge;  // an announced size counts against the cap before it arrives
  EXPECT_TRUE(huge.scan("100000\r\nab"));
  EXPECT_EQ(huge.decoded(), 0x100000u);
}

TEST(RequestBody, DechunksWhatTheScannerFoundComplete) {
  const std::string body = "5\r\nhello\r\n6;ext=1\r\n world\r\nA\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\nNEXT";
  ChunkedScanner s;
  ASSERT_TRUE(s.scan(body));
  ASSERT_TRUE(s.done());
  EXPECT_EQ(dechunk(std::string_view(body).substr(0, s.end())), "hello world0123456789");
  EXPECT_EQ(dechunk("0\r\n\r\n"), "");
}

TEST(RequestBody, ContentCodingsHttplibDecodes) {
  EXPECT_EQ(content_coding(""), "");
  EXPECT_EQ(content_coding(" identity "), "");
  EXPECT_EQ(content_coding("GZip"), "gzip");
  EXPECT_EQ(content_coding("deflate"), "deflate");
  EXPECT_EQ(content_coding("br"), "br");
  for (const char* v : {"compress", "zstd", "gzip, br", "x-gzip", "gzip;q=1"})
    EXPECT_FALSE(content_coding(v).has_value()) << v;
}

// The bounded inflation: a body that inflates past the cap is found out after inflating cap + 1 bytes, however far
// it would go; one within the cap fits; bytes that are not of the coding are malformed.
TEST(RequestBody, InflatedSizeIsCheckedUpToTheCap) {
  const auto compress = [](httplib::detail::compressor& c, const std::string& plain) {
    std::string out;
    EXPECT_TRUE(c.compress(plain.data(), plain.size(), true, [&](const char* d, size_t n) {
      out.append(d, n);
      return true;
    }));
    return out;
  };
  const std::string small(1000, 'a'), big(64u << 20, ' ');  // 64 MiB of spaces: a few tens of KB coded
  httplib::detail::gzip_compressor g1, g2;
  const std::string gz_small = compress(g1, small), gz_big = compress(g2, big);
  ASSERT_LT(gz_big.size(), 1u << 20);
  EXPECT_EQ(check_inflated_size("gzip", gz_small, 1000), InflateCheck::fits);
  EXPECT_EQ(check_inflated_size("gzip", gz_small, 999), InflateCheck::too_large);
  EXPECT_EQ(check_inflated_size("gzip", gz_big, 8u << 20), InflateCheck::too_large);
  EXPECT_EQ(check_inflated_size("gzip", "this is not gzip data at all", 1000), InflateCheck::malformed);
  httplib::detail::brotli_compressor b1, b2;
  EXPECT_EQ(check_inflated_size("br", compress(b1, small), 1000), InflateCheck::fits);
  EXPECT_EQ(check_inflated_size("br", compress(b2, big), 8u << 20), InflateCheck::too_large);
}

}  // namespace
}  // namespace tern::server
