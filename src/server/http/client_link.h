// Noticing that an HTTP client went away, so that its generation stops within one decode step.
//
// cpp-httplib tells a handler nothing about its connection, and a write to a closed socket only fails one or two
// writes later. tern's connection layer (connections.h) runs each request's handler on the worker thread that
// serves the connection and records the connection's socket for that thread (CurrentConnection); a ClientLink made
// there polls that socket for hang-up: POLLRDHUP / POLLHUP / POLLERR mean the client closed or reset. The socket
// stays open while the handler (or its content provider) runs, because it is closed only after the response is
// written; `release()` is called before that, and later polls answer "gone" only when the link was marked so.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <mutex>
#include <string>

namespace tern::server {

// Port and printable address of a sockaddr (IPv4 or IPv6); false for other families.
bool socket_address(const sockaddr_storage& a, std::string& addr, int& port);

// The socket of the connection whose request this thread is serving (-1 outside a request): set by the connection
// layer's worker around each request.
class CurrentConnection {
 public:
  static int socket();
  explicit CurrentConnection(int fd);  // sets it for this thread until destroyed
  ~CurrentConnection();
  CurrentConnection(const CurrentConnection&) = delete;
  CurrentConnection& operator=(const CurrentConnection&) = delete;

 private:
  int previous_;
};

class ClientLink {
 public:
  // Polls the socket fd (the request's connection; CurrentConnection::socket()). With fd < 0 polling is off and
  // only failed writes (mark_gone) report a disconnect.
  explicit ClientLink(int fd) : fd_(fd) {}
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

}  // namespace tern::server
