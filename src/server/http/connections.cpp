#include "server/http/connections.h"

#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>

#include "core/check.h"
#include "server/http/ascii.h"
#include "server/http/client_link.h"
#include "server/http/request_body.h"

namespace tern::server {

namespace {

using Clock = std::chrono::steady_clock;

// Writes all of data within `timeout` per wait (the socket is non-blocking). False on error or timeout.
bool send_all(int fd, const char* data, size_t size, std::chrono::milliseconds timeout) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n > 0) {
      data += n;
      size -= size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
      const int r = ::poll(&p, 1, int(timeout.count()));
      if (r <= 0 || (p.revents & (POLLERR | POLLHUP | POLLNVAL))) return false;
      continue;
    }
    return false;
  }
  return true;
}

thread_local bool tl_close_after = false;

// The methods cpp-httplib parses (a request line with another one gets its 400, and the rest of the head would then
// be read as a second request): case-sensitive, as in RFC 9110.
bool httplib_method(const std::string& m) {
  static const char* const kMethods[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"};
  return std::any_of(std::begin(kMethods), std::end(kMethods), [&](const char* k) { return m == k; });
}

std::string body_limit_message(size_t limit) {
  return "Request body too large: the limit is " + std::to_string(limit) + " bytes.";
}

// s for an error message: printable ASCII only, at most 40 characters.
std::string quoted_for_message(std::string_view s) {
  std::string out;
  for (char ch : s.substr(0, 40)) out += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
  return "'" + out + (s.size() > 40 ? "...'" : "'");
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Connections.

struct HttpConnections::Conn {
  int fd = -1;
  std::string remote_addr, local_addr;
  int remote_port = 0, local_port = 0;
  std::string buf;                     // received and not yet consumed
  enum class Phase { idle, head, body, linger } phase = Phase::idle;
  Clock::time_point deadline;
  bool registered = false;             // in the epoll set
  bool peer_closed = false;            // read EOF or an error
  // The request being received.
  size_t head_len = 0;
  bool chunked = false;
  size_t content_length = 0;
  ChunkedScanner chunks;
  std::string coding;                  // Content-Encoding: "" (none), "gzip", "deflate" or "br"
  bool expect_continue = false, sent_continue = false;
  bool close_after = false;            // answered before its body, or unparseable: close after the response
};

namespace {

// cpp-httplib's accept loop hands each socket to the task queue; ours runs it at once on the accepting thread
// (process_and_close_socket only counts the connection and passes it to the poller).
class InlineTaskQueue : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

// What a worker's httplib::Server::process_request reads from and writes to.
class ConnStream : public httplib::Stream {
 public:
  ConnStream(int fd, std::string& buf, const std::string& remote_addr, int remote_port,
             const std::string& local_addr, int local_port, Clock::time_point read_deadline,
             std::chrono::milliseconds write_timeout)
      : fd_(fd), buf_(buf), remote_addr_(remote_addr), local_addr_(local_addr), remote_port_(remote_port),
        local_port_(local_port), read_deadline_(read_deadline), write_timeout_(write_timeout) {}

  size_t consumed() const { return pos_; }
  bool read_timed_out() const { return timed_out_; }

  bool is_readable() const override {
    if (pos_ < buf_.size()) return true;
    pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
    return ::poll(&p, 1, 0) > 0;
  }
  bool is_writable() const override {
    pollfd p{.fd = fd_, .events = POLLOUT, .revents = 0};
    return ::poll(&p, 1, int(write_timeout_.count())) > 0 && !(p.revents & (POLLERR | POLLHUP | POLLNVAL));
  }
  ssize_t read(char* ptr, size_t size) override {
    if (pos_ < buf_.size()) {
      const size_t n = std::min(size, buf_.size() - pos_);
      std::memcpy(ptr, buf_.data() + pos_, n);
      pos_ += n;
      return ssize_t(n);
    }
    // Everything the poller read is consumed: the rest arrives under the read deadline. Read into the buffer
    // (not straight into ptr) so that bytes beyond this request stay for the next one.
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(read_deadline_ - Clock::now());
      if (left.count() <= 0) {
        timed_out_ = true;
        return -1;
      }
      pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
      const int r = ::poll(&p, 1, int(std::min<int64_t>(left.count(), 1000)));
      if (r < 0 && errno != EINTR) return -1;
      if (r <= 0) continue;
      char tmp[16384];
      const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
      if (n == 0) return 0;
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        return -1;
      }
      buf_.append(tmp, size_t(n));
      return read(ptr, size);
    }
  }
  ssize_t write(const char* ptr, size_t size) override {
    return send_all(fd_, ptr, size, write_timeout_) ? ssize_t(size) : -1;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = remote_addr_;
    port = remote_port_;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = local_addr_;
    port = local_port_;
  }
  socket_t socket() const override { return fd_; }

 private:
  int fd_;
  std::string& buf_;
  const std::string& remote_addr_;
  const std::string& local_addr_;
  int remote_port_, local_port_;
  size_t pos_ = 0;
  Clock::time_point read_deadline_;
  std::chrono::milliseconds write_timeout_;
  bool timed_out_ = false;
};

std::string canned_response(int status, const std::string& reason, const std::string& message) {
  std::string body = R"({"error":{"message":")";
  for (char ch : message) {
    if (ch == '"' || ch == '\\') body += '\\';
    body += ch;
  }
  body += R"(","type":")";
  body += status >= 500 ? "server_error" : "invalid_request_error";
  body += R"(","param":null,"code":null}})";
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason +
                    "\r\nContent-Type: application/json\r\nConnection: close\r\n";
  if (status == 503) out += "Retry-After: 1\r\n";
  out += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  return out;
}

}  // namespace

HttpConnections::HttpConnections(ConnectionLimits limits, EarlyReject early_reject, ConnectionEvents* events)
    : limits_(limits), early_reject_(std::move(early_reject)), events_(events) {
  TERN_CHECK(limits_.workers >= 1 && limits_.max_connections >= 1 && limits_.max_per_address >= 1,
             "connection limits must be at least 1");
  new_task_queue = [] { return new InlineTaskQueue; };
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  TERN_CHECK(epoll_fd_ >= 0 && wake_fd_ >= 0, "cannot create the connection poller: ", std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  poller_ = std::thread([this] { poller_main(); });
  for (size_t i = 0; i < limits_.workers; ++i) workers_.emplace_back([this] { worker_main(); });
}

HttpConnections::~HttpConnections() {
  stop_accepting();
  shut_down(std::chrono::milliseconds(0));
  if (!listen_called_.load() && svr_sock_ != INVALID_SOCKET) ::close(svr_sock_);
  ::close(epoll_fd_);
  ::close(wake_fd_);
}

void HttpConnections::adopt_listener(int fd) { svr_sock_ = fd; }

void HttpConnections::serve_forever() {
  listen_called_ = true;
  listen_after_bind();
}

void HttpConnections::stop_accepting() {
  if (stopping_.exchange(true)) return;
  // shutdown() makes accept() fail with EINVAL, now or when httplib's loop starts: the loop then closes the socket
  // and returns. svr_sock_ keeps its value, so that responses being streamed are not cut (httplib ends a content
  // provider's loop once svr_sock_ is INVALID_SOCKET).
  const socket_t fd = svr_sock_;
  if (fd != INVALID_SOCKET) {
    ::shutdown(fd, SHUT_RDWR);  // the accept loop closes it; the destructor does when the loop never ran
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t r = ::write(wake_fd_, &one, sizeof one);
}

void HttpConnections::shut_down(std::chrono::milliseconds timeout) {
  {
    std::unique_lock lock(ready_mutex_);
    idle_cv_.wait_for(lock, timeout, [&] { return ready_.empty() && busy_ == 0; });
    workers_exit_ = true;
  }
  ready_cv_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t r = ::write(wake_fd_, &one, sizeof one);
  if (poller_.joinable()) poller_.join();
  std::deque<std::unique_ptr<Conn>> left;
  {
    std::lock_guard lock(ready_mutex_);
    left.swap(ready_);
  }
  for (auto& c : left) close_conn(std::move(c));
}

void HttpConnections::close_after_response() { tl_close_after = true; }

bool HttpConnections::process_and_close_socket(socket_t sock) {
  auto c = std::make_unique<Conn>();
  c->fd = sock;
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getpeername(sock, reinterpret_cast<sockaddr*>(&a), &len) == 0) socket_address(a, c->remote_addr, c->remote_port);
  len = sizeof a;
  if (::getsockname(sock, reinterpret_cast<sockaddr*>(&a), &len) == 0) socket_address(a, c->local_addr, c->local_port);
  ::fcntl(sock, F_SETFL, ::fcntl(sock, F_GETFL) | O_NONBLOCK);
  ::fcntl(sock, F_SETFD, FD_CLOEXEC);
  if (stopping_) {
    ::close(sock);
    return false;
  }
  bool refused = false;
  {
    std::lock_guard lock(count_mutex_);
    size_t& mine = per_address_[c->remote_addr];
    if (total_ >= limits_.max_connections || mine >= limits_.max_per_address) {
      refused = true;
      if (mine == 0) per_address_.erase(c->remote_addr);
    } else {
      ++total_;
      ++mine;
    }
  }
  if (refused) {
    if (events_) events_->on_connection_refused();
    const std::string r = canned_response(503, "Service Unavailable",
                                          "Too many open connections (the server allows " +
                                              std::to_string(limits_.max_connections) + " in all and " +
                                              std::to_string(limits_.max_per_address) +
                                              " per client address); retry later.");
    [[maybe_unused]] ssize_t n = ::send(sock, r.data(), r.size(), MSG_NOSIGNAL);  // best effort, never blocks
    ::shutdown(sock, SHUT_WR);
    ::close(sock);
    return false;
  }
  if (events_) events_->on_connection_opened();
  c->phase = Conn::Phase::idle;
  c->deadline = Clock::now() + limits_.idle_timeout;
  to_poller(std::move(c));
  return true;
}

void HttpConnections::to_poller(std::unique_ptr<Conn> c) {
  {
    std::lock_guard lock(inbox_mutex_);
    inbox_.push_back(std::move(c));
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t r = ::write(wake_fd_, &one, sizeof one);
}

void HttpConnections::to_workers(std::unique_ptr<Conn> c) {
  {
    std::lock_guard lock(ready_mutex_);
    ready_.push_back(std::move(c));
  }
  ready_cv_.notify_one();
}

void HttpConnections::close_conn(std::unique_ptr<Conn> c) {
  if (!c) return;
  ::close(c->fd);
  {
    std::lock_guard lock(count_mutex_);
    --total_;
    auto it = per_address_.find(c->remote_addr);
    if (it != per_address_.end() && --it->second == 0) per_address_.erase(it);
  }
  if (events_) events_->on_connection_closed();
}

void HttpConnections::linger(std::unique_ptr<Conn> c) {
  ::shutdown(c->fd, SHUT_WR);
  c->phase = Conn::Phase::linger;
  c->deadline = Clock::now() + limits_.linger_timeout;
  c->buf.clear();
  c->buf.shrink_to_fit();
  to_poller(std::move(c));
}

void HttpConnections::send_canned(Conn& c, int status, const std::string& reason, const std::string& message) {
  const std::string r = canned_response(status, reason, message);
  send_all(c.fd, r.data(), r.size(), std::chrono::milliseconds(100));
}

void HttpConnections::poll_register(Conn& c) {
  if (c.registered) return;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = c.fd;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c.fd, &ev) == 0) c.registered = true;
}

void HttpConnections::poll_unregister(Conn& c) {
  if (!c.registered) return;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  c.registered = false;
}

void HttpConnections::poller_main() {
  std::vector<epoll_event> events(256);
  auto last_sweep = Clock::now();
  for (;;) {
    const int n = ::epoll_wait(epoll_fd_, events.data(), int(events.size()), 100);
    const bool stop = stopping_.load();
    std::vector<std::unique_ptr<Conn>> inbox;
    {
      std::lock_guard lock(inbox_mutex_);
      inbox.swap(inbox_);
    }
    {
      std::lock_guard lock(ready_mutex_);
      if (workers_exit_ && stop) {  // shut_down: close everything and end
        for (auto& c : inbox) close_conn(std::move(c));
        for (auto& [fd, c] : waiting_) {
          poll_unregister(*c);
          close_conn(std::move(c));
        }
        waiting_.clear();
        return;
      }
    }
    for (auto& c : inbox) {
      if (stop) {  // no new requests once stopping: close connections that come back
        close_conn(std::move(c));
        continue;
      }
      Conn& ref = *c;
      const int fd = ref.fd;
      waiting_[fd] = std::move(c);
      poll_register(ref);
      if (ref.phase != Conn::Phase::linger) advance(waiting_[fd]);  // a pipelined request may be complete
      if (!waiting_[fd]) waiting_.erase(fd);
    }
    if (stop && !waiting_.empty()) {
      for (auto& [fd, c] : waiting_) {
        poll_unregister(*c);
        close_conn(std::move(c));
      }
      waiting_.clear();
    }
    for (int i = 0; i < n; ++i) {
      const int fd = events[size_t(i)].data.fd;
      if (fd == wake_fd_) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_, &v, sizeof v);
        continue;
      }
      auto it = waiting_.find(fd);
      if (it == waiting_.end()) continue;
      on_readable(it->second);
      if (!it->second) waiting_.erase(it);
    }
    const auto now = Clock::now();
    if (now - last_sweep >= std::chrono::milliseconds(50)) {
      last_sweep = now;
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if (it->second->deadline <= now) expire(it->second);
        if (!it->second) it = waiting_.erase(it);
        else ++it;
      }
    }
  }
}

void HttpConnections::on_readable(std::unique_ptr<Conn>& c) {
  const size_t cap = limits_.max_head_bytes + limits_.max_body_bytes + 65536;
  char tmp[16384];
  for (;;) {
    if (c->phase != Conn::Phase::linger && c->buf.size() >= cap) break;
    const ssize_t n = ::recv(c->fd, tmp, sizeof tmp, 0);
    if (n > 0) {
      if (c->phase != Conn::Phase::linger) c->buf.append(tmp, size_t(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    c->peer_closed = true;  // EOF or error
    break;
  }
  if (c->phase == Conn::Phase::linger) {
    if (c->peer_closed) {
      poll_unregister(*c);
      close_conn(std::move(c));
    }
    return;
  }
  advance(c);
  if (c && c->peer_closed) {  // gone before its request was complete
    poll_unregister(*c);
    close_conn(std::move(c));
  }
}

void HttpConnections::advance(std::unique_ptr<Conn>& c) {
  Conn& k = *c;
  auto dispatch = [&] {
    poll_unregister(k);
    k.phase = Conn::Phase::idle;
    to_workers(std::move(c));
  };
  auto refuse = [&](int status, const char* reason, const std::string& message) {
    poll_unregister(k);
    send_canned(k, status, reason, message);
    linger(std::move(c));
  };
  if (k.phase == Conn::Phase::idle) {
    size_t skip = 0;  // empty lines before a request line are ignored (RFC 9112 2.2)
    while (skip < k.buf.size() && (k.buf[skip] == '\r' || k.buf[skip] == '\n')) ++skip;
    k.buf.erase(0, skip);
    if (k.buf.empty()) return;
    k.phase = Conn::Phase::head;
    k.deadline = Clock::now() + limits_.header_timeout;
    k.head_len = 0;
    k.chunked = false;
    k.content_length = 0;
    k.chunks = ChunkedScanner{};
    k.coding.clear();
    k.expect_continue = k.sent_continue = false;
  }
  if (k.phase == Conn::Phase::head) {
    const size_t end = k.buf.find("\r\n\r\n");
    if (end == std::string::npos || end + 4 > limits_.max_head_bytes) {
      if (k.buf.size() > limits_.max_head_bytes)
        refuse(431, "Request Header Fields Too Large",
               "The request line and headers are larger than " + std::to_string(limits_.max_head_bytes) + " bytes.");
      return;
    }
    k.head_len = end + 4;
    RequestHead head;
    if (!parse_request_head(std::string_view(k.buf).substr(0, end), head))
      return refuse(400, "Bad Request",
                    "The request line or a header line is malformed (\"METHOD TARGET HTTP/1.1\", then \"Name: value\" "
                    "lines).");
    if (head.version != "HTTP/1.1" && head.version != "HTTP/1.0")  // first: HTTP/2's preface is "PRI * HTTP/2.0"
      return refuse(505, "HTTP Version Not Supported",
                    "HTTP version " + quoted_for_message(head.version) + " is not supported: HTTP/1.1 or HTTP/1.0.");
    if (!httplib_method(head.method))
      return refuse(501, "Not Implemented",
                    "Method " + quoted_for_message(head.method) + " is not implemented (methods are case-sensitive).");
    // Exactly one Host in HTTP/1.1 (RFC 9112 3.2); HTTP/1.0 may have none.
    const auto hosts = std::count_if(head.headers.begin(), head.headers.end(),
                                     [](const auto& h) { return h.first == "host"; });
    if (hosts > 1) return refuse(400, "Bad Request", "The request has more than one Host header.");
    if (hosts == 0 && head.version == "HTTP/1.1")
      return refuse(400, "Bad Request", "An HTTP/1.1 request must carry a Host header.");
    // The body's framing (RFC 9112 6): chunked, or one Content-Length, or none (then the body is empty).
    if (const std::string* te = head.header("transfer-encoding")) {
      if (ascii_lower(trim_blanks(*te)) != "chunked")
        return refuse(501, "Not Implemented",
                      "Transfer-Encoding " + quoted_for_message(*te) + " is not supported: only chunked.");
      k.chunked = true;
    }
    const std::string* cl = nullptr;
    for (const auto& [name, value] : head.headers) {
      if (name != "content-length") continue;
      if (k.chunked)  // both: a request-smuggling pattern
        return refuse(400, "Bad Request", "A request may not carry both Transfer-Encoding and Content-Length.");
      if (value.empty() || !std::all_of(value.begin(), value.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
        return refuse(400, "Bad Request", "Content-Length " + quoted_for_message(value) + " is not a byte count.");
      if (cl && *cl != value) return refuse(400, "Bad Request", "The request has two different Content-Length headers.");
      cl = &value;
    }
    if (cl) {
      std::string_view digits = *cl;
      while (digits.size() > 1 && digits.front() == '0') digits.remove_prefix(1);
      if (digits.size() > 18)
        return refuse(413, "Payload Too Large", body_limit_message(limits_.max_body_bytes));
      k.content_length = std::stoull(std::string(digits));
    } else if (!k.chunked) {
      // No length: an empty body. Said to httplib, which would otherwise read until the client closes.
      static const std::string kNoBody = "Content-Length: 0\r\n";
      k.buf.insert(end + 2, kNoBody);
      k.head_len += kNoBody.size();
    }
    if (const std::string* ce = head.header("content-encoding")) {
      const std::optional<std::string> coding = content_coding(*ce);
      if (!coding)
        return refuse(415, "Unsupported Media Type",
                      "Content-Encoding " + quoted_for_message(*ce) + " is not supported: gzip, deflate, br or none.");
      k.coding = *coding;
    }
    if (const std::string* ex = head.header("expect"); ex && ascii_lower(*ex) == "100-continue") k.expect_continue = true;
    bool early = false;
    try {
      early = early_reject_ && early_reject_(head);
    } catch (...) {
      early = true;
    }
    if (early || (!k.chunked && k.content_length > limits_.max_body_bytes)) {
      k.close_after = true;  // answered without reading the body
      return dispatch();
    }
    k.phase = Conn::Phase::body;
    k.deadline = Clock::now() + limits_.body_timeout;
  }
  if (k.phase == Conn::Phase::body) {
    const std::string_view body = std::string_view(k.buf).substr(k.head_len);
    // A complete body goes to a worker, which checks that a coded one inflates to at most the body limit (httplib
    // would inflate it whole, whatever its size; inflating takes milliseconds, kept off the poller: coded_body_fits).
    if (k.chunked) {
      if (!k.chunks.scan(body))
        return refuse(400, "Bad Request", "The chunked body is malformed (a chunk-size line, or the CRLF after a chunk).");
      if (k.chunks.decoded() > limits_.max_body_bytes)
        return refuse(413, "Payload Too Large", body_limit_message(limits_.max_body_bytes));
      if (k.chunks.done()) return dispatch();
    } else if (body.size() >= k.content_length) {
      return dispatch();
    }
    if (k.expect_continue && !k.sent_continue) {
      k.sent_continue = true;
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      send_all(k.fd, kContinue.data(), kContinue.size(), std::chrono::milliseconds(100));
    }
  }
}

void HttpConnections::expire(std::unique_ptr<Conn>& c) {
  poll_unregister(*c);
  if (c->phase == Conn::Phase::head || c->phase == Conn::Phase::body) {
    if (events_) events_->on_read_timeout();
    const bool head = c->phase == Conn::Phase::head;
    send_canned(*c, 408, "Request Timeout",
                std::string("The request's ") + (head ? "headers" : "body") + " did not arrive within " +
                    std::to_string((head ? limits_.header_timeout : limits_.body_timeout).count()) + " ms.");
    linger(std::move(c));
    return;
  }
  close_conn(std::move(c));  // idle past the keep-alive timeout, or lingering long enough
}

void HttpConnections::worker_main() {
  for (;;) {
    std::unique_ptr<Conn> c;
    {
      std::unique_lock lock(ready_mutex_);
      ready_cv_.wait(lock, [&] { return !ready_.empty() || workers_exit_; });
      if (ready_.empty()) return;
      c = std::move(ready_.front());
      ready_.pop_front();
      ++busy_;
    }
    try {
      serve(*c);
    } catch (const std::exception& e) {  // httplib's writer or a handler outside its exception handler
      std::fprintf(stderr, "tern serve: internal error on a connection from %s: %s\n", c->remote_addr.c_str(),
                   e.what());
      c->close_after = true;
    } catch (...) {
      c->close_after = true;
    }
    const bool keep = !c->close_after && !c->peer_closed && !stopping_.load();
    if (keep) {
      c->phase = Conn::Phase::idle;
      c->deadline = Clock::now() + limits_.idle_timeout;
      to_poller(std::move(c));
    } else if (stopping_.load()) {
      close_conn(std::move(c));
    } else {
      linger(std::move(c));
    }
    {
      std::lock_guard lock(ready_mutex_);
      --busy_;
    }
    idle_cv_.notify_all();
  }
}

bool HttpConnections::coded_body_fits(Conn& c) {
  const std::string_view body = std::string_view(c.buf).substr(c.head_len);
  const std::string dechunked = c.chunked ? dechunk(body.substr(0, c.chunks.end())) : std::string();
  const std::string_view data = c.chunked ? std::string_view(dechunked) : body.substr(0, c.content_length);
  switch (check_inflated_size(c.coding, data, limits_.max_body_bytes)) {
    case InflateCheck::too_large:
      send_canned(c, 413, "Payload Too Large",
                  "Request body too large once decompressed (" + c.coding + "): the limit is " +
                      std::to_string(limits_.max_body_bytes) + " bytes.");
      break;
    case InflateCheck::malformed:
      send_canned(c, 400, "Bad Request", "The request body is not valid " + c.coding + " data.");
      break;
    case InflateCheck::fits:
      return true;
  }
  c.close_after = true;
  return false;
}

void HttpConnections::serve(Conn& c) {
  if (!c.coding.empty() && !c.close_after && !coded_body_fits(c)) return;
  tl_close_after = false;
  const bool close_connection = c.close_after || c.peer_closed || stopping_.load();
  ConnStream strm(c.fd, c.buf, c.remote_addr, c.remote_port, c.local_addr, c.local_port,
                  Clock::now() + limits_.body_timeout, limits_.write_timeout);
  bool connection_closed = false;
  const CurrentConnection current(c.fd);  // the handler's ClientLink polls this socket
  const bool ok = process_request(strm, close_connection, connection_closed,
                                  [](httplib::Request& req) {
                                    // The poller has answered "100 Continue" already (or answered early).
                                    auto it = req.headers.find("Expect");
                                    if (it != req.headers.end()) req.headers.erase(it);
                                  });
  c.buf.erase(0, strm.consumed());
  if (c.buf.capacity() > (1u << 20)) c.buf.shrink_to_fit();
  // A large request (its body, its tokens) leaves freed memory in this thread's malloc arena, where glibc keeps
  // it: hand it back, so that the resident size returns near idle after large requests.
  if (strm.consumed() >= (1u << 20)) ::malloc_trim(0);
  if (strm.read_timed_out() && events_) events_->on_read_timeout();
  if (!ok || connection_closed || close_connection || tl_close_after) c.close_after = true;
}

}  // namespace tern::server
