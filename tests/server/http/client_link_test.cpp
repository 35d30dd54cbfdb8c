// Noticing a client that hung up: the handler polls its connection's socket (CurrentConnection).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "server/http/client_link.h"

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

TEST(ClientLink, SeesTheHangUpOfTheCurrentConnection) {
  Loopback l;
  EXPECT_EQ(CurrentConnection::socket(), -1);  // outside a request
  {
    const CurrentConnection current(l.accepted);
    EXPECT_EQ(CurrentConnection::socket(), l.accepted);
    ClientLink link(CurrentConnection::socket());
    ASSERT_TRUE(link.has_socket());
    EXPECT_FALSE(link.gone());
    ASSERT_EQ(write(l.client, "x", 1), 1);  // data from the client is not a hang-up
    EXPECT_FALSE(link.gone());
    close(l.client);
    l.client = -1;
    EXPECT_TRUE(link.gone());
    EXPECT_TRUE(link.gone());  // stays gone
  }
  EXPECT_EQ(CurrentConnection::socket(), -1);  // restored when the request ends
}

TEST(ClientLink, CurrentConnectionIsPerThreadAndNests) {
  const CurrentConnection outer(7);
  {
    const CurrentConnection inner(9);
    EXPECT_EQ(CurrentConnection::socket(), 9);
    int other = 0;
    std::thread([&] { other = CurrentConnection::socket(); }).join();
    EXPECT_EQ(other, -1);
  }
  EXPECT_EQ(CurrentConnection::socket(), 7);
}

TEST(ClientLink, ReleasedLinkStopsPolling) {
  Loopback l;
  ClientLink link(l.accepted);
  link.release();
  close(l.client);
  l.client = -1;
  EXPECT_FALSE(link.gone());  // no longer looks at the socket
  link.mark_gone();
  EXPECT_TRUE(link.gone());
}

TEST(ClientLink, NoSocketMeansOnlyMarkedGone) {
  ClientLink link(-1);
  EXPECT_FALSE(link.has_socket());
  EXPECT_FALSE(link.gone());
  link.mark_gone();
  EXPECT_TRUE(link.gone());
}

}  // namespace
}  // namespace tern::server
