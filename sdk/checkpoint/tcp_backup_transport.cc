#include "sdk/checkpoint/tcp_backup_transport.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "sdk/core/errno_error.h"
#include "sdk/core/scoped_fd.h"
#include "sdk/core/socket_address.h"

namespace trainguard {
namespace {

constexpr int kListenBacklog = 64;

// Poll's timeout for a wait of at most `wait`: rounded up to a millisecond, at most a second.
int PollTimeoutMs(absl::Duration wait) {
  return static_cast<int>(std::clamp<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(wait, absl::Milliseconds(1))), 1, 1000));
}

// A listener's shutdown signal: a pipe that becomes readable, and stays so, at Shutdown. Shared
// with the streams it accepted, so that it outlives whichever of them is closed last.
struct WakePipe {
  WakePipe(int read_fd, int write_fd) : read(read_fd), write(write_fd) {}
  const ScopedFd read;
  const ScopedFd write;
};

// One end of a backup connection. Not thread-safe.
class TcpBackupStream final : public BackupStream {
 public:
  TcpBackupStream(int fd, std::string peer, absl::Time deadline, absl::Duration idle_timeout,
                  const std::atomic<bool>* cancel, std::shared_ptr<const WakePipe> wake)
      : fd_(fd),
        peer_(std::move(peer)),
        deadline_(deadline),
        idle_timeout_(idle_timeout),
        cancel_(cancel),
        wake_(std::move(wake)),
        last_progress_(absl::Now()) {}

  int fd() const { return fd_.get(); }
  const std::string& peer() const override { return peer_; }
  void set_deadline(absl::Time deadline) override { deadline_ = deadline; }

  absl::Status Send(const char* data, size_t n) override {
    size_t done = 0;
    while (done < n) {
      const ssize_t sent = send(fd(), data + done, n - done, MSG_NOSIGNAL);
      if (sent > 0) {
        done += static_cast<size_t>(sent);
        last_progress_ = absl::Now();
        continue;
      }
      if (sent < 0 && errno == EINTR) continue;
      if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (absl::Status s = Wait(POLLOUT, "sending to"); !s.ok()) return s;
        continue;
      }
      return absl::UnavailableError(absl::StrFormat("sending to %s: %s", peer_, ErrnoText(errno)));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> ReceiveSome(char* data, size_t max) override {
    while (true) {
      const ssize_t got = recv(fd(), data, max, 0);
      if (got > 0) {
        last_progress_ = absl::Now();
        return static_cast<size_t>(got);
      }
      if (got == 0) {
        return absl::UnavailableError(
            absl::StrFormat("receiving from %s: connection closed by the peer", peer_));
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (absl::Status s = Wait(POLLIN, "receiving from"); !s.ok()) return s;
        continue;
      }
      return absl::UnavailableError(
          absl::StrFormat("receiving from %s: %s", peer_, ErrnoText(errno)));
    }
  }

  // Until the socket is ready for `events`, or one of the ends of a wait
  // (sdk/checkpoint/backup_transport.h).
  absl::Status Wait(short events, const char* doing) {
    while (true) {
      const absl::StatusOr<absl::Duration> wait = NextStreamWait(
          doing, peer_, absl::Now(), deadline_, last_progress_, idle_timeout_, cancel_);
      if (!wait.ok()) return wait.status();
      const int wake_fd = wake_ != nullptr ? wake_->read.get() : -1;
      pollfd fds[2] = {{fd(), events, 0}, {wake_fd, POLLIN, 0}};
      const int n = poll(fds, wake_fd >= 0 ? 2 : 1, PollTimeoutMs(*wait));
      if (n < 0 && errno != EINTR) {
        return absl::UnavailableError(
            absl::StrFormat("%s %s: poll: %s", doing, peer_, ErrnoText(errno)));
      }
      if (n <= 0) continue;
      if (wake_fd >= 0 && fds[1].revents != 0) {
        return absl::CancelledError(
            absl::StrFormat("%s %s: the backup service is stopping", doing, peer_));
      }
      if (fds[0].revents != 0) return absl::OkStatus();
    }
  }

 private:
  ScopedFd fd_;
  const std::string peer_;
  absl::Time deadline_;
  const absl::Duration idle_timeout_;
  const std::atomic<bool>* const cancel_;
  const std::shared_ptr<const WakePipe> wake_;
  absl::Time last_progress_;
};

class TcpBackupListener final : public BackupListener {
 public:
  TcpBackupListener(int fd, std::string address, absl::Duration idle_timeout,
                    std::shared_ptr<const WakePipe> wake)
      : fd_(fd),
        address_(std::move(address)),
        idle_timeout_(idle_timeout),
        wake_(std::move(wake)) {}
  ~TcpBackupListener() override { Shutdown(); }

  std::string address() const override { return address_; }

  absl::StatusOr<std::unique_ptr<BackupStream>> Accept(absl::Time deadline) override {
    while (true) {
      const absl::Duration left = deadline - absl::Now();
      pollfd fds[2] = {{fd_.get(), POLLIN, 0}, {wake_->read.get(), POLLIN, 0}};
      const int n = poll(fds, 2, left <= absl::ZeroDuration() ? 0 : PollTimeoutMs(left));
      if (n < 0 && errno != EINTR) {
        return absl::UnavailableError(
            absl::StrFormat("backup listener %s: poll: %s", address_, ErrnoText(errno)));
      }
      if (n > 0 && fds[1].revents != 0) {
        return absl::CancelledError(
            absl::StrFormat("backup listener %s: the backup service is stopping", address_));
      }
      if (n > 0 && fds[0].revents != 0) break;
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrFormat("backup listener %s: no connection", address_));
      }
    }
    sockaddr_storage peer{};
    socklen_t length = sizeof(peer);
    const int fd = accept4(fd_.get(), reinterpret_cast<sockaddr*>(&peer), &length,
                           SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      return absl::UnavailableError(
          absl::StrFormat("backup listener %s: accept: %s", address_, ErrnoText(errno)));
    }
    return std::unique_ptr<BackupStream>(
        new TcpBackupStream(fd, absl::StrFormat("peer %s", FormatSockaddr(peer)),
                            absl::InfiniteFuture(), idle_timeout_, nullptr, wake_));
  }

  void Shutdown() override {
    // The pipe stays readable: every later wait wakes at once too.
    const char byte = 1;
    (void)!write(wake_->write.get(), &byte, 1);
  }

 private:
  const ScopedFd fd_;
  const std::string address_;
  const absl::Duration idle_timeout_;
  const std::shared_ptr<const WakePipe> wake_;
};

// Connects `stream`'s socket to `a`, waiting (by the dial's deadline and cancel flag) for a
// connect in progress.
absl::Status ConnectOne(TcpBackupStream* stream, const addrinfo* a,
                        const BackupDialOptions& options) {
  if (connect(stream->fd(), a->ai_addr, a->ai_addrlen) == 0) return absl::OkStatus();
  if (errno != EINPROGRESS && errno != EINTR) {
    return absl::UnavailableError(absl::StrFormat("cannot connect to backup holder %s: %s",
                                                  options.address, ErrnoText(errno)));
  }
  if (absl::Status s = stream->Wait(POLLOUT, "connecting to"); !s.ok()) return s;
  int err = 0;
  socklen_t len = sizeof(err);
  getsockopt(stream->fd(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    return absl::UnavailableError(
        absl::StrFormat("cannot connect to backup holder %s: %s", options.address, ErrnoText(err)));
  }
  return absl::OkStatus();
}

}  // namespace

TcpBackupTransport* TcpBackupTransport::Get() {
  static TcpBackupTransport* const transport = new TcpBackupTransport();
  return transport;
}

absl::StatusOr<std::unique_ptr<BackupListener>> TcpBackupTransport::Listen(
    const BackupListenOptions& options) {
  const std::string where = absl::StrFormat("%s:%d", options.bind_address, options.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(options.port);
  if (const int rc = getaddrinfo(options.bind_address.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: cannot resolve the bind address: %s", where, gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(found, freeaddrinfo);
  ScopedFd listener(socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                           found->ai_protocol));
  if (listener.get() < 0) {
    return absl::UnavailableError(absl::StrFormat("%s: socket: %s", where, ErrnoText(errno)));
  }
  const int one = 1;
  setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(listener.get(), found->ai_addr, found->ai_addrlen) != 0 ||
      listen(listener.get(), kListenBacklog) != 0) {
    return absl::UnavailableError(
        absl::StrFormat("%s: cannot listen: %s", where, ErrnoText(errno)));
  }
  const int bound_port = BoundPort(listener.get());
  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::UnavailableError(absl::StrFormat("%s: pipe: %s", where, ErrnoText(errno)));
  }
  const bool v6 = options.bind_address.find(':') != std::string::npos;
  std::string address = v6 ? absl::StrFormat("[%s]:%d", options.bind_address, bound_port)
                           : absl::StrFormat("%s:%d", options.bind_address, bound_port);
  return std::unique_ptr<BackupListener>(
      new TcpBackupListener(listener.release(), std::move(address), options.idle_timeout,
                            std::make_shared<const WakePipe>(wake[0], wake[1])));
}

absl::StatusOr<std::unique_ptr<BackupStream>> TcpBackupTransport::Dial(
    const BackupDialOptions& options) {
  absl::StatusOr<HostPort> split = SplitHostPort(options.address, "backup holder address");
  if (!split.ok()) return split.status();
  std::optional<sockaddr_storage> source;
  if (!options.source_address.empty()) {
    absl::StatusOr<sockaddr_storage> parsed =
        NumericSockaddr(options.source_address, "source address");
    if (!parsed.ok()) return parsed.status();
    source = *parsed;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(split->port);
  if (const int rc = getaddrinfo(split->host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrFormat("cannot resolve backup holder %s: %s", options.address, gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(found, freeaddrinfo);
  absl::Status last = absl::UnavailableError(
      absl::StrFormat("backup holder %s resolves to no address", options.address));
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int raw =
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (raw < 0) {
      last = absl::UnavailableError(
          absl::StrFormat("socket for backup holder %s: %s", options.address, ErrnoText(errno)));
      continue;
    }
    auto stream = std::make_unique<TcpBackupStream>(
        raw, absl::StrFormat("backup holder %s", options.address), options.deadline,
        absl::InfiniteDuration(), options.cancel, nullptr);
    if (source.has_value()) {
      if (source->ss_family != a->ai_family) {
        last = absl::UnavailableError(absl::StrFormat(
            "source address %s and backup holder %s are of different address families",
            options.source_address, options.address));
        continue;
      }
      if (bind(raw, reinterpret_cast<const sockaddr*>(&*source), SockaddrLength(*source)) != 0) {
        return absl::UnavailableError(
            absl::StrFormat("cannot bind source address %s for backup holder %s: %s",
                            options.source_address, options.address, ErrnoText(errno)));
      }
    }
    absl::Status connected = ConnectOne(stream.get(), a, options);
    if (absl::IsCancelled(connected) || absl::IsDeadlineExceeded(connected)) return connected;
    if (!connected.ok()) {
      last = connected;
      continue;
    }
    return std::unique_ptr<BackupStream>(std::move(stream));
  }
  return last;
}

}  // namespace trainguard
