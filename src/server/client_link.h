// Noticing that an HTTP client went away, so that its generation stops within one decode step.
//
// cpp-httplib 0.11.4 tells a handler nothing about its connection, and a write to a closed socket only fails one
// or two writes later. So the handler finds its own connection's socket (the one whose local port and peer
// address match the request) and polls it for hang-up: POLLRDHUP / POLLHUP / POLLERR mean the client closed or
// reset. The socket stays open while the handler (or its content provider) runs, because cpp-httplib closes it
// only after the response is written; `release()` is called before that, and later polls answer "gone" only when
// the link was marked so.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <mutex>
#include <string>

namespace tern::server {

// Port and printable address of a sockaddr (IPv4 or IPv6); false for other families.
bool socket_address(const sockaddr_storage& a, std::string& addr, int& port);

class ClientLink {
 public:
  // Finds the socket of the connection (local_port, remote_addr:remote_port). When it cannot be found, polling
  // is off and only failed writes (mark_gone) report a disconnect.
  ClientLink(int local_port, const std::string& remote_addr, int remote_port);
  ~ClientLink();
  ClientLink(const ClientLink&) = delete;
  ClientLink& operator=(const ClientLink&) = delete;

  // True once the client closed or reset the connection (or mark_gone was called). Thread-safe; one poll(2) call.
  bool gone();
  void mark_gone() { gone_ = true; }
  // Stops polling the socket (call before the handler returns to cpp-httplib).
  void release();
  bool has_socket() const { return fd_ >= 0; }

 private:
  std::mutex mutex_;
  int fd_ = -1;
  std::atomic<bool> gone_{false};
};

// The descriptor of this process's TCP socket with that local port and peer, or -1.
int find_connection_socket(int local_port, const std::string& remote_addr, int remote_port);

}  // namespace tern::server
