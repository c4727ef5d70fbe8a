// What the scale benchmarks (bench_scale, bench_simulate) share: the job's TcpStore server in a
// process of its own (ServerProcess), as `trainguard run` serves it from one agent's process, so
// that the simulated ranks and agents do not share its core's time accounting or its file
// descriptors; a client connection to it (Connect); what one process costs the machine
// (ProcessUsage, read from /proc); and whether this machine can hold a size at all
// (MachineCannotHold).
//
// Not thread-safe: one thread owns a ServerProcess.
#ifndef TRAINGUARD_BENCH_SCALE_SERVER_H_
#define TRAINGUARD_BENCH_SCALE_SERVER_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "sdk/rendezvous/tcp_store.h"
#include "trainguard/store.h"

namespace trainguard::bench {

inline constexpr char kScaleToken[] = "bench-scale-token";
inline constexpr char kScaleJob[] = "scale";

// Raises this process's soft limit on file descriptors to its hard limit (a size of thousands of
// ranks holds a connection each).
inline void RaiseFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

// What the kernel says one process used so far: its CPU time (user and system, all its threads)
// and its resident memory now.
struct ProcessUsage {
  double cpu_seconds = 0;
  int64_t rss_bytes = 0;
};

// `pid`'s usage ("self" for this process); zeros for what /proc does not say.
inline ProcessUsage ReadProcessUsage(const std::string& pid) {
  ProcessUsage usage;
  const std::string dir = absl::StrCat("/proc/", pid);
  {
    std::ifstream stat(dir + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    // The fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    const size_t close = text.rfind(')');
    if (close != std::string::npos) {
      std::vector<std::string> fields =
          absl::StrSplit(absl::string_view(text).substr(close + 2), ' ', absl::SkipEmpty());
      int64_t utime = 0;
      int64_t stime = 0;
      if (fields.size() > 12 && absl::SimpleAtoi(fields[11], &utime) &&
          absl::SimpleAtoi(fields[12], &stime)) {
        usage.cpu_seconds = static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
      }
    }
  }
  std::ifstream status(dir + "/status");
  for (std::string line; std::getline(status, line);) {
    absl::string_view value = line;
    if (absl::ConsumePrefix(&value, "VmRSS:")) {
      int64_t kb = 0;
      if (absl::SimpleAtoi(absl::StripSuffix(absl::StripAsciiWhitespace(value), " kB"), &kb)) {
        usage.rss_bytes = kb * 1024;
      }
    }
  }
  return usage;
}

// The TcpStore server in a child process. The parent asks for its counters with a line on the
// control pipe ("stats"); closing the pipe ends the child.
class ServerProcess {
 public:
  // `busy_poll`: the server's TcpStoreServerOptions::busy_poll; nullopt: its default.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      int max_connections, std::optional<absl::Duration> busy_poll = std::nullopt) {
    int control[2];
    int report[2];
    if (pipe2(control, O_CLOEXEC) != 0 || pipe2(report, O_CLOEXEC) != 0) {
      return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
    }
    const pid_t pid = fork();
    if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(control[1]);
      close(report[0]);
      RunServer(control[0], report[1], max_connections, busy_poll);  // never returns
    }
    close(control[0]);
    close(report[1]);
    auto server = std::unique_ptr<ServerProcess>(new ServerProcess(pid, control[1], report[0]));
    absl::StatusOr<std::string> port = server->ReadLine();
    if (!port.ok()) return port.status();
    if (!absl::SimpleAtoi(*port, &server->port_)) {
      return absl::InternalError(absl::StrCat("the store server's process said '", *port, "'"));
    }
    return server;
  }
  ~ServerProcess() {
    close(control_);
    close(report_);
    int status = 0;
    waitpid(pid_, &status, 0);  // it exits once its control pipe closes
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  // What the server counted so far (TcpStoreServerStats).
  struct Counts {
    int64_t requests = 0;
    int64_t refused = 0;  // connections refused
    int64_t bytes_received = 0;
    int64_t bytes_sent = 0;
  };
  absl::StatusOr<Counts> Counters() {
    if (write(control_, "stats\n", 6) != 6) {
      return absl::InternalError(absl::StrCat("writing to the store server: ", strerror(errno)));
    }
    absl::StatusOr<std::string> line = ReadLine();
    if (!line.ok()) return line.status();
    std::vector<std::string> parts = absl::StrSplit(*line, ' ');
    Counts counts;
    if (parts.size() != 4 || !absl::SimpleAtoi(parts[0], &counts.requests) ||
        !absl::SimpleAtoi(parts[1], &counts.refused) ||
        !absl::SimpleAtoi(parts[2], &counts.bytes_received) ||
        !absl::SimpleAtoi(parts[3], &counts.bytes_sent)) {
      return absl::InternalError(absl::StrCat("the store server's counters: '", *line, "'"));
    }
    return counts;
  }
  // The server process's usage so far (its CPU, its memory).
  ProcessUsage Usage() const { return ReadProcessUsage(absl::StrCat(pid_)); }

 private:
  ServerProcess(pid_t pid, int control, int report)
      : pid_(pid), control_(control), report_(report) {}

  [[noreturn]] static void RunServer(int control, int report, int max_connections,
                                     std::optional<absl::Duration> busy_poll) {
    RaiseFileLimit();
    TcpStoreServerOptions options;
    options.job_token = kScaleToken;
    options.max_connections = max_connections;
    if (busy_poll.has_value()) options.busy_poll = *busy_poll;
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start(options);
    const std::string port =
        server.ok() ? absl::StrCat((*server)->port(), "\n") : std::string("error\n");
    if (write(report, port.data(), port.size()) < 0 || !server.ok()) _exit(1);
    std::string pending;
    char buffer[64];
    for (;;) {
      const ssize_t n = read(control, buffer, sizeof(buffer));
      if (n <= 0) _exit(0);  // the parent closed the pipe, or died
      pending.append(buffer, n);
      for (size_t end; (end = pending.find('\n')) != std::string::npos;) {
        pending.erase(0, end + 1);
        const TcpStoreServerStats stats = (*server)->stats();
        const std::string line =
            absl::StrCat(stats.requests_served, " ", stats.connections_refused, " ",
                         stats.bytes_received, " ", stats.bytes_sent, "\n");
        if (write(report, line.data(), line.size()) < 0) _exit(1);
      }
    }
  }

  absl::StatusOr<std::string> ReadLine() {
    std::string line;
    char c;
    for (;;) {
      const ssize_t n = read(report_, &c, 1);
      if (n <= 0) return absl::UnavailableError("the store server's process ended");
      if (c == '\n') return line;
      line.push_back(c);
    }
  }

  const pid_t pid_;
  const int control_;
  const int report_;
  int port_ = 0;
};

// A client connection to the server of `port`, as a rank's or an agent's; `busy_poll`,
// `max_connections` and `control`: its TcpStoreOptions' (nullopt: their defaults; an agent's and
// a coordinator's are control connections, as the launcher's).
inline absl::StatusOr<std::unique_ptr<Store>> Connect(
    int port, absl::Duration timeout, std::optional<absl::Duration> busy_poll = std::nullopt,
    std::optional<int> max_connections = std::nullopt, bool control = false) {
  TcpStoreOptions options;
  options.control = control;
  if (busy_poll.has_value()) options.busy_poll = *busy_poll;
  if (max_connections.has_value()) options.max_connections = *max_connections;
  options.port = port;
  options.job_id = kScaleJob;
  options.job_token = kScaleToken;
  options.connect_timeout = timeout;
  absl::StatusOr<std::unique_ptr<TcpStore>> client = TcpStore::Connect(options);
  if (!client.ok()) return client.status();
  return std::unique_ptr<Store>(*std::move(client));
}

// Why this process cannot hold `threads` more threads and `files` more descriptors; nullopt when
// it can (the process's file limit, kernel.threads-max, kernel.pid_max).
inline std::optional<std::string> MachineCannotHold(int threads, int files) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && static_cast<int64_t>(limit.rlim_cur) < files) {
    return absl::StrFormat("%d file descriptors needed, the limit is %d", files,
                           static_cast<int64_t>(limit.rlim_cur));
  }
  int64_t max_threads = 0;
  std::ifstream in("/proc/sys/kernel/threads-max");
  if (in >> max_threads && max_threads < threads) {
    return absl::StrFormat("%d threads needed, kernel.threads-max is %d", threads, max_threads);
  }
  int64_t pid_max = 0;
  std::ifstream pids("/proc/sys/kernel/pid_max");
  if (pids >> pid_max && pid_max < threads + 1024) {
    return absl::StrFormat("%d threads needed, kernel.pid_max is %d", threads, pid_max);
  }
  return std::nullopt;
}

}  // namespace trainguard::bench

#endif  // TRAINGUARD_BENCH_SCALE_SERVER_H_
