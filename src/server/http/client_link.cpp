#include "server/http/client_link.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

namespace tern::server {

bool socket_address(const sockaddr_storage& a, std::string& addr, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    if (!inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf)) return false;
    port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    if (!inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf)) return false;
    port = ntohs(in6->sin6_port);
  } else {
    return false;
  }
  addr = buf;
  return true;
}

namespace {
thread_local int tl_connection_socket = -1;
}  // namespace

int CurrentConnection::socket() { return tl_connection_socket; }

CurrentConnection::CurrentConnection(int fd) : previous_(tl_connection_socket) { tl_connection_socket = fd; }

CurrentConnection::~CurrentConnection() { tl_connection_socket = previous_; }

ClientLink::~ClientLink() { release(); }

void ClientLink::release() {
  std::lock_guard lock(mutex_);
  fd_ = -1;
}

bool ClientLink::gone() {
  if (gone_) return true;
  std::lock_guard lock(mutex_);
  if (fd_ < 0) return gone_;
  pollfd p{.fd = fd_, .events = POLLRDHUP, .revents = 0};
  if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) gone_ = true;
  return gone_;
}

}  // namespace tern::server
