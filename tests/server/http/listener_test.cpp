// The listening socket and loopback names.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "core/check.h"
#include "server/http/listener.h"

namespace tern::server {
namespace {

TEST(Listener, LoopbackNames) {
  for (const char* h : {"127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"}) EXPECT_TRUE(is_loopback_host(h)) << h;
  for (const char* h : {"0.0.0.0", "::", "192.168.1.1", "example.com", "128.0.0.1"})
    EXPECT_FALSE(is_loopback_host(h)) << h;
}

TEST(Listener, BusyPortIsAClearError) {
  int port = 0;
  const int fd = bind_listener("127.0.0.1", 0, &port);
  ASSERT_GT(port, 0);
  try {
    bind_listener("127.0.0.1", port, nullptr);
    ADD_FAILURE() << "a second listener on the same port";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already in use"), std::string::npos) << e.what();
  }
  int reuseport = -1;
  socklen_t len = sizeof reuseport;
  ASSERT_EQ(getsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &reuseport, &len), 0);
  EXPECT_EQ(reuseport, 0);
  ::close(fd);
  EXPECT_THROW(bind_listener("127.0.0.1", 70000, nullptr), Error);
}

}  // namespace
}  // namespace tern::server
