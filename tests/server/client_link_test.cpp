// Noticing a client that hung up: the handler finds its connection's socket and polls it.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/client_link.h"

namespace tern::server {
namespace {

struct Loopback {  // a connected pair over 127.0.0.1: client fd, server-side (accepted) fd
  int listener = -1, client = -1, accepted = -1;
  int server_port = 0, client_port = 0;
  Loopback() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    EXPECT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(listener, 1), 0);
    getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
    server_port = ntohs(a.sin_port);
    client = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    accepted = accept(listener, nullptr, nullptr);
    sockaddr_in c{};
    len = sizeof c;
    getsockname(client, reinterpret_cast<sockaddr*>(&c), &len);
    client_port = ntohs(c.sin_port);
  }
  ~Loopback() {
    for (int fd : {listener, client, accepted})
      if (fd >= 0) close(fd);
  }
};

TEST(ClientLink, FindsTheConnectionAndSeesTheHangUp) {
  Loopback l;
  EXPECT_EQ(find_connection_socket(l.server_port, "127.0.0.1", l.client_port), l.accepted);
  EXPECT_EQ(find_connection_socket(l.server_port, "127.0.0.2", l.client_port), -1);
  ClientLink link(l.server_port, "127.0.0.1", l.client_port);
  ASSERT_TRUE(link.has_socket());
  EXPECT_FALSE(link.gone());
  ASSERT_EQ(write(l.client, "x", 1), 1);  // data from the client is not a hang-up
  EXPECT_FALSE(link.gone());
  close(l.client);
  l.client = -1;
  EXPECT_TRUE(link.gone());
}

TEST(ClientLink, ReleasedLinkStopsPolling) {
  Loopback l;
  ClientLink link(l.server_port, "127.0.0.1", l.client_port);
  link.release();
  close(l.client);
  l.client = -1;
  EXPECT_FALSE(link.gone());  // no longer looks at the socket
  link.mark_gone();
  EXPECT_TRUE(link.gone());
}

TEST(ClientLink, UnknownConnectionHasNoSocket) {
  ClientLink link(1, "127.0.0.1", 1);
  EXPECT_FALSE(link.has_socket());
  EXPECT_FALSE(link.gone());
}

}  // namespace
}  // namespace tern::server
