#include "server/client_link.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>

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

bool socket_matches(int fd, int local_port, const std::string& remote_addr, int remote_port) {
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof local, peer_len = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return false;  // not a socket
  std::string addr;
  int port = -1;
  if (!socket_address(local, addr, port) || port != local_port) return false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;  // listening socket
  if (!socket_address(peer, addr, port) || port != remote_port) return false;
  return addr == remote_addr;
}

}  // namespace

int find_connection_socket(int local_port, const std::string& remote_addr, int remote_port) {
  if (local_port <= 0 || remote_port <= 0) return -1;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    const int fd = std::atoi(entry->d_name);
    if (fd == dirfd(dir)) continue;
    if (socket_matches(fd, local_port, remote_addr, remote_port)) {
      found = fd;
      break;
    }
  }
  closedir(dir);
  return found;
}

ClientLink::ClientLink(int local_port, const std::string& remote_addr, int remote_port)
    : fd_(find_connection_socket(local_port, remote_addr, remote_port)) {}

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
