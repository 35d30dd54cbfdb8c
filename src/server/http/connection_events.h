// What the connection layer (connections.h) reports as it runs; the server's Metrics (serving/metrics.h) counts it
// for /metrics. An interface, so that the connection layer knows nothing of what is counted beside it.
#pragma once

namespace tern::server {

class ConnectionEvents {
 public:
  virtual void on_connection_opened() = 0;
  virtual void on_connection_closed() = 0;
  virtual void on_connection_refused() = 0;   // over a connection cap
  virtual void on_read_timeout() = 0;         // closed for a read deadline (408)

 protected:
  ~ConnectionEvents() = default;
};

}  // namespace tern::server
