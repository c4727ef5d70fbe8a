// LoopbackSink: the plain baseline of the peer-backup benchmarks (bench_replication,
// bench_restore): the same bytes sent over a fresh loopback TCP connection with default socket
// options to a receiver thread that recv()s them into a buffer of the same size and answers with
// one byte. What a backup transfer is measured against, in the same run.
//
// Not thread-safe: one Transfer at a time.
#ifndef TRAINGUARD_BENCH_LOOPBACK_SINK_H_
#define TRAINGUARD_BENCH_LOOPBACK_SINK_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

namespace trainguard::bench {

class LoopbackSink {
 public:
  explicit LoopbackSink(size_t bytes) : buffer_(bytes, 1) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        listen(listen_fd_, 4) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      return;
    }
    port_ = ntohs(address.sin_port);
  }
  ~LoopbackSink() {
    if (listen_fd_ >= 0) close(listen_fd_);
  }
  LoopbackSink(const LoopbackSink&) = delete;
  LoopbackSink& operator=(const LoopbackSink&) = delete;

  bool ok() const { return port_ > 0; }

  // Sends `bytes` of `data` over a fresh connection; returns once the receiver has every byte. The
  // receiver runs on a thread started (and joined) here. REQUIRES: bytes <= the constructor's.
  bool Transfer(const char* data, size_t bytes) {
    bool received = false;
    std::thread receiver([&] { received = Receive(bytes); });
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons(static_cast<uint16_t>(port_));
    bool sent = fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0;
    for (size_t at = 0; sent && at < bytes;) {
      const ssize_t n = send(fd, data + at, std::min(kPiece, bytes - at), MSG_NOSIGNAL);
      if (n <= 0) sent = false;
      at += n > 0 ? static_cast<size_t>(n) : 0;
    }
    char ack = 0;
    sent = sent && recv(fd, &ack, 1, MSG_WAITALL) == 1;
    if (fd >= 0) close(fd);
    receiver.join();
    return sent && received;
  }

 private:
  static constexpr size_t kPiece = 4 << 20;

  bool Receive(size_t bytes) {
    const int fd = accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) return false;
    size_t at = 0;
    while (at < bytes) {
      const ssize_t n = recv(fd, buffer_.data() + at, bytes - at, 0);
      if (n <= 0) break;
      at += static_cast<size_t>(n);
    }
    const char ack = 1;
    const bool ok = at == bytes && send(fd, &ack, 1, MSG_NOSIGNAL) == 1;
    close(fd);
    return ok;
  }

  std::vector<char> buffer_;
  int listen_fd_ = -1;
  int port_ = 0;
};

}  // namespace trainguard::bench

#endif  // TRAINGUARD_BENCH_LOOPBACK_SINK_H_
