#include "server/http/listener.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/check.h"
#include "server/http/client_link.h"

namespace tern::server {

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr a4{};
  if (inet_pton(AF_INET, host.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6{};
  if (inet_pton(AF_INET6, host.c_str(), &a6) == 1) return IN6_IS_ADDR_LOOPBACK(&a6);
  return false;
}

int bind_listener(const std::string& host, int port, int* bound_port) {
  TERN_CHECK(port >= 0 && port <= 65535, "port must be in 1..65535 (or 0 for any free port), got ", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  const int gai = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &list);
  TERN_CHECK(gai == 0, "cannot listen on ", host, ":", port, ": ", gai_strerror(gai));
  std::string why = "no usable address";
  int fd = -1;
  for (addrinfo* a = list; a && fd < 0; a = a->ai_next) {
    const int s = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (s < 0) {
      why = std::strerror(errno);
      continue;
    }
    const int yes = 1;
    ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);  // restart while old connections linger
    if (a->ai_family == AF_INET6) ::setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &yes, sizeof yes);
    if (::bind(s, a->ai_addr, a->ai_addrlen) != 0 || ::listen(s, 128) != 0) {
      const int e = errno;
      why = e == EADDRINUSE    ? "the address is already in use (another server on this port?)"
            : e == EADDRNOTAVAIL ? "not an address of this machine"
            : e == EACCES        ? "permission denied (ports below 1024 need privileges)"
                                 : std::strerror(e);
      ::close(s);
      continue;
    }
    fd = s;
  }
  ::freeaddrinfo(list);
  TERN_CHECK(fd >= 0, "cannot listen on ", host, ":", port, ": ", why);
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  std::string addr;
  int p = port;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) socket_address(local, addr, p);
  if (bound_port) *bound_port = p;
  return fd;
}

}  // namespace tern::server
