// FreeTcpPorts: ports for the servers a test starts, and for "a port nothing listens on".
#ifndef TRAINGUARD_TESTS_SUPPORT_FREE_PORT_H_
#define TRAINGUARD_TESTS_SUPPORT_FREE_PORT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace trainguard::testing {

// `count` distinct TCP ports on `address` (numeric IPv4) that are free now, for servers a test
// starts. They are drawn at random below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), from which every bind to port 0 and every outgoing connection
// takes its port: so between this call and the server's own bind only another explicit bind can
// take one (two tests drawing the same port), which the server then reports as "address already
// in use" and the caller starts again with new ports (IsAddressInUse). Each port is checked with a
// bind, and every socket is held until all are chosen, so the ports differ.
inline absl::StatusOr<std::vector<int>> FreeTcpPorts(const std::string& address, int count) {
  sockaddr_in bound{};
  bound.sin_family = AF_INET;
  if (inet_pton(AF_INET, address.c_str(), &bound.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not an IPv4 address"));
  }
  // Below the ephemeral range; 32768 (Linux's default low bound) when the range cannot be read.
  int ephemeral_low = 32768;
  {
    std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
    int low = 0;
    if (range >> low && low > 0) ephemeral_low = low;
  }
  constexpr int kLowest = 10000;
  if (ephemeral_low - kLowest < 1000) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ephemeral port range starts at ", ephemeral_low,
                     ", leaving no room below it above ", kLowest, " for the test's servers"));
  }
  std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<int> draw(kLowest, ephemeral_low - 1);
  std::vector<int> held;
  std::vector<int> ports;
  const auto release = [&held] {
    for (int fd : held) close(fd);
  };
  for (int attempt = 0; static_cast<int>(ports.size()) < count; ++attempt) {
    if (attempt == 1000) {
      release();
      return absl::ResourceExhaustedError(absl::StrCat("no ", count, " free TCP ports on ", address,
                                                       " in [", kLowest, ", ", ephemeral_low,
                                                       ") after 1000 draws"));
    }
    const int port = draw(random);
    if (std::find(ports.begin(), ports.end(), port) != ports.end()) continue;
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      release();
      return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
    }
    bound.sin_port = htons(static_cast<uint16_t>(port));
    if (bind(fd, reinterpret_cast<sockaddr*>(&bound), sizeof(bound)) != 0) {
      close(fd);  // taken: draw another
      continue;
    }
    held.push_back(fd);
    ports.push_back(port);
  }
  release();
  return ports;
}

// One port of FreeTcpPorts.
inline absl::StatusOr<int> FreeTcpPort(const std::string& address) {
  absl::StatusOr<std::vector<int>> ports = FreeTcpPorts(address, 1);
  if (!ports.ok()) return ports.status();
  return ports->front();
}

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_FREE_PORT_H_
