// Socket addresses as trainguard's TCP endpoints spell them (private to sdk/; any subsystem may
// include it, sdk/core being the bottom layer): "HOST:PORT" and "[V6]:PORT" split, numeric
// addresses parsed for bind(), and peers formatted for errors. Shared by TcpStore (sdk/rendezvous)
// and the backup transport (sdk/checkpoint). Pure functions of their arguments: thread-safe.
#ifndef TRAINGUARD_SDK_CORE_SOCKET_ADDRESS_H_
#define TRAINGUARD_SDK_CORE_SOCKET_ADDRESS_H_

#include <sys/socket.h>

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace trainguard {

struct HostPort {
  std::string host;  // without the brackets of "[V6]:PORT"
  int port = 0;      // 1..65535
};

// "HOST:PORT" or "[V6]:PORT" (the last colon separates the port). InvalidArgument naming `what`
// and `address` when there is no host or the port is not a number in 1..65535, e.g.
// "backup holder address '10.0.0.2' is not HOST:PORT".
absl::StatusOr<HostPort> SplitHostPort(std::string_view address, std::string_view what);

// A numeric IPv4 or IPv6 address with port 0, for bind(). InvalidArgument naming `what` and
// `address` otherwise (a host name is not resolved).
absl::StatusOr<sockaddr_storage> NumericSockaddr(std::string_view address, std::string_view what);

// The length bind() and connect() take for an AF_INET or AF_INET6 `address`.
socklen_t SockaddrLength(const sockaddr_storage& address);

// "1.2.3.4:5" or "[::1]:5" ("[?]:0" for another family).
std::string FormatSockaddr(const sockaddr_storage& address);

// The port `fd` is bound to (getsockname), or -1.
int BoundPort(int fd);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CORE_SOCKET_ADDRESS_H_
