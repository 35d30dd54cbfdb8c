// The listening socket: ours rather than cpp-httplib's, which sets SO_REUSEPORT (a second server on a busy port
// would then start and share it).
#pragma once

#include <string>

namespace tern::server {

// Binds and listens: SO_REUSEADDR only (never SO_REUSEPORT, so that a second server on a busy port fails).
// Throws tern::Error that names host:port and the reason (address in use, not an address of this machine, ...).
// Returns the descriptor; *bound_port gets the port (useful with port 0).
int bind_listener(const std::string& host, int port, int* bound_port);

// True when host names a loopback address (127.0.0.0/8, ::1, or "localhost").
bool is_loopback_host(const std::string& host);

}  // namespace tern::server
