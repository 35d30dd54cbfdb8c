// The connection layer under cpp-httplib: who may connect, how long a request may take to arrive, and which
// thread serves it. Internal to src/server (http_server.cpp, above every room, is its only user).
//
// cpp-httplib 0.11 gives each accepted connection a worker thread that blocks reading the request, so a client
// that sends its headers a byte at a time (or nothing at all) holds a thread; it has no header deadline, sets
// SO_REUSEPORT, and reads pipelined requests into a per-request buffer that is thrown away. Its hooks let us
// replace that layer and keep its request parser, router and response writer:
//
//   - HttpConnections derives from httplib::Server and overrides the (virtual) process_and_close_socket: the
//     accept loop stays httplib's, each accepted socket is handed to us on the accepting thread (an inline
//     TaskQueue), counted against the caps (total and per peer address; over a cap: 503 and close);
//   - one poller thread (epoll) reads every connection that waits for a request: the head must be complete within
//     `header_timeout` of its first byte and the body within `body_timeout` of the head (408 and close
//     otherwise); an idle keep-alive connection is closed after `idle_timeout`. None of this holds a worker;
//   - once the head is in, `early_reject` (the API key, Host, Content-Type and size checks) decides whether the
//     request is answered at once, before its body (the connection is then closed); otherwise the poller waits
//     for the whole body (Content-Length or chunked) and queues the connection for a worker;
//   - a worker runs httplib's process_request over a Stream that serves the bytes already read (and reads more,
//     under the body deadline, only when the request needs them); bytes of a pipelined next request stay in
//     the connection's buffer, so pipelined requests are answered in order;
//   - closing after an answer sent before the body was read is a lingering close (shut down writing, drain
//     what the client still sends, for a bounded time), so that the client reads the answer rather than a reset.
//
// The listening socket is ours too (listener.h: SO_REUSEADDR only, errors that say why); the head and the body are
// read with request_head.h and request_body.h.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "server/http/connection_events.h"
#include "server/http/request_body.h"
#include "server/http/request_head.h"

namespace tern::server {

struct ConnectionLimits {
  size_t max_connections = 1024;       // open connections in all
  size_t max_per_address = 256;        // open connections from one peer address
  std::chrono::milliseconds header_timeout{10000};  // first byte of a request -> end of its head
  std::chrono::milliseconds body_timeout{30000};    // end of the head -> end of the body
  std::chrono::milliseconds idle_timeout{5000};     // keep-alive: a connection with no request in progress
  std::chrono::milliseconds write_timeout{30000};   // one blocked write
  std::chrono::milliseconds linger_timeout{2000};   // draining before a close
  size_t max_head_bytes = 16384;       // request line + headers; more gets 431
  size_t max_body_bytes = 32u << 20;   // the poller stops waiting for a body beyond this (httplib answers 413)
  size_t workers = 8;                  // threads that run handlers
};

class HttpConnections : public httplib::Server {
 public:
  // true: answer this request at once (its body is not read) and close the connection afterwards.
  using EarlyReject = std::function<bool(const RequestHead&)>;

  HttpConnections(ConnectionLimits limits, EarlyReject early_reject, ConnectionEvents* events);
  ~HttpConnections() override;

  // Adopts the listening socket (from bind_listener) for listen_after_bind().
  void adopt_listener(int fd);
  // httplib's accept loop (listen_after_bind) until stop_accepting().
  void serve_forever();
  // Stops accepting (the accept loop in listen_after_bind returns), closes connections that wait for a request;
  // requests being served finish. Safe from any thread, also before listen_after_bind() has started.
  void stop_accepting();
  // After stop_accepting: waits (up to `timeout`) until the workers are idle, then ends the threads.
  void shut_down(std::chrono::milliseconds timeout);

  // Called by a handler on a worker thread: close this request's connection after its response.
  static void close_after_response();

 private:
  struct Conn;
  bool process_and_close_socket(socket_t sock) override;  // httplib's per-connection entry point: ours
  void poller_main();
  void worker_main();
  void serve(Conn& c);
  // A Content-Encoding body (worker thread): true when it inflates within the body limit, else answers 413 or 400
  // and marks the connection to close.
  bool coded_body_fits(Conn& c);
  void to_poller(std::unique_ptr<Conn> c);               // from any thread
  void to_workers(std::unique_ptr<Conn> c);
  void close_conn(std::unique_ptr<Conn> c);
  void linger(std::unique_ptr<Conn> c);                  // from any thread: shut down writing, drain, close
  // Poller-thread helpers.
  void poll_register(Conn& c);
  void poll_unregister(Conn& c);
  void on_readable(std::unique_ptr<Conn>& c);            // may move c away
  void advance(std::unique_ptr<Conn>& c);                // a complete request in the buffer? dispatch
  void expire(std::unique_ptr<Conn>& c);
  // Any thread: a complete response of its own (status line, JSON error body, Connection: close).
  void send_canned(Conn& c, int status, const std::string& reason, const std::string& message);

  const ConnectionLimits limits_;
  const EarlyReject early_reject_;
  ConnectionEvents* events_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> listen_called_{false};
  int epoll_fd_ = -1;
  int wake_fd_ = -1;

  std::mutex count_mutex_;
  size_t total_ = 0;
  std::map<std::string, size_t> per_address_;

  std::mutex inbox_mutex_;                               // connections handed to the poller
  std::vector<std::unique_ptr<Conn>> inbox_;
  std::map<int, std::unique_ptr<Conn>> waiting_;         // poller thread only: fd -> connection

  std::mutex ready_mutex_;
  std::condition_variable ready_cv_, idle_cv_;
  std::deque<std::unique_ptr<Conn>> ready_;
  size_t busy_ = 0;
  bool workers_exit_ = false;

  std::thread poller_;
  std::vector<std::thread> workers_;
};

}  // namespace tern::server
