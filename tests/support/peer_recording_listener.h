// PeerRecordingListener: a bare TCP listening socket on 127.0.0.1 that accepts one connection,
// records the address the peer connected from (getpeername) and closes it, speaking no protocol.
// Tests use it to see which source address a client binds; the client's call then fails, which
// is expected.
//
// Not thread-safe: one thread calls AcceptOnePeer (the client runs in another).
#ifndef TRAINGUARD_TESTS_SUPPORT_PEER_RECORDING_LISTENER_H_
#define TRAINGUARD_TESTS_SUPPORT_PEER_RECORDING_LISTENER_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainguard::testing {

class PeerRecordingListener {
 public:
  // Listens on 127.0.0.1 at a port of the kernel's choice.
  static absl::StatusOr<std::unique_ptr<PeerRecordingListener>> Start() {
    std::unique_ptr<PeerRecordingListener> listener(new PeerRecordingListener());
    listener->fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener->fd_ < 0) {
      return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (bind(listener->fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        listen(listener->fd_, 16) != 0 ||
        getsockname(listener->fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      return absl::InternalError(absl::StrCat("listening on 127.0.0.1: ", std::strerror(errno)));
    }
    listener->port_ = ntohs(address.sin_port);
    return listener;
  }

  ~PeerRecordingListener() { Close(); }
  PeerRecordingListener(const PeerRecordingListener&) = delete;
  PeerRecordingListener& operator=(const PeerRecordingListener&) = delete;

  int port() const { return port_; }

  // Waits (until `timeout`) for one connection, closes it and the listening socket (so that a
  // client's reconnection is refused at once), and returns the peer's address, e.g. "127.0.0.5".
  absl::StatusOr<std::string> AcceptOnePeer(absl::Duration timeout) {
    pollfd ready{fd_, POLLIN, 0};
    const int ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(timeout), INT_MAX));
    const int polled = poll(&ready, 1, ms);
    if (polled <= 0) {
      Close();
      return absl::DeadlineExceededError(absl::StrCat("no connection to 127.0.0.1:", port_,
                                                      " within ", absl::FormatDuration(timeout)));
    }
    sockaddr_in peer{};
    socklen_t length = sizeof(peer);
    const int connection = accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &length, SOCK_CLOEXEC);
    const int accept_errno = errno;
    if (connection >= 0) close(connection);
    Close();
    if (connection < 0) {
      return absl::InternalError(absl::StrCat("accept: ", std::strerror(accept_errno)));
    }
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &peer.sin_addr, text, sizeof(text));
    return std::string(text);
  }

 private:
  PeerRecordingListener() = default;

  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  int fd_ = -1;
  int port_ = 0;
};

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_PEER_RECORDING_LISTENER_H_
