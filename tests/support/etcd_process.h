// EtcdProcess: a real etcd server (/usr/bin/etcd, Debian package etcd-server) for tests and
// benchmarks, listening on free loopback ports with its data in a fresh temporary directory.
//
// Start() forks and execs etcd and waits (bounded) until it serves; the destructor stops it
// (SIGTERM, then SIGKILL), reaps it and removes the directory. The faults a test injects: Kill()
// (SIGKILL, as a crash would be), then Restart() on the same data and ports; Pause() (SIGSTOP, a
// hung server), then Resume(). etcd also gets SIGKILL if the process that started it dies, so a
// crashed test leaves no server.
//
// Not thread-safe: one thread drives an EtcdProcess (others may talk to the server).
#ifndef TRAINGUARD_TESTS_SUPPORT_ETCD_PROCESS_H_
#define TRAINGUARD_TESTS_SUPPORT_ETCD_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "sdk/rendezvous/etcd_store.h"
#include "tests/support/free_port.h"
#include "tests/support/own_process.h"
#include "tests/support/temp_dir.h"

namespace trainguard::testing {

inline constexpr char kEtcdBinary[] = "/usr/bin/etcd";

// FailedPrecondition saying how to install etcd when kEtcdBinary is missing.
inline absl::Status CheckEtcdInstalled() {
  if (access(kEtcdBinary, X_OK) == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(kEtcdBinary, " is missing (", std::strerror(errno),
                   "); the etcd tests need a real etcd: run scripts/setup.sh, which installs the "
                   "Debian package etcd-server"));
}

// Whether a server's failure to start (a status carrying its log) was a port another process
// bound first: the caller starts it again on new ports.
inline bool IsAddressInUse(const absl::Status& status) {
  return absl::StrContains(status.message(), "address already in use");
}

// How many times a test server is started on new ports when its ports were taken.
inline constexpr int kPortAttempts = 5;

// Forks and execs `args` (args[0] the binary) with stdout and stderr appended to `log_path`; the
// child gets SIGKILL if the calling process dies, so a crashed test leaves no server behind.
inline absl::StatusOr<pid_t> SpawnEtcd(std::vector<std::string> args, const std::string& log_path) {
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) {
    return absl::InternalError(absl::StrCat("open ", log_path, ": ", std::strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(log);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {  // only async-signal-safe calls from here to exec
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(log);
  return pid;
}

// The last `bytes` of the file at `path` (a server's log, for failure messages).
inline std::string FileTail(const std::string& path, size_t bytes = 4000) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  return all.size() <= bytes ? all : all.substr(all.size() - bytes);
}

class EtcdProcess {
 public:
  // How long Start() and Restart() wait for etcd to serve.
  static constexpr absl::Duration kStartTimeout = absl::Seconds(20);

  // Starts etcd on new free ports, again on others (up to kPortAttempts) when another process
  // bound one first.
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start() {
    if (absl::Status s = CheckEtcdInstalled(); !s.ok()) return s;
    absl::Status last;
    for (int attempt = 0; attempt < kPortAttempts; ++attempt) {
      std::unique_ptr<EtcdProcess> etcd(new EtcdProcess());
      absl::StatusOr<std::vector<int>> ports = FreeTcpPorts("127.0.0.1", 2);
      if (!ports.ok()) return ports.status();
      etcd->client_port_ = (*ports)[0];
      etcd->peer_port_ = (*ports)[1];
      last = etcd->Launch();
      if (last.ok()) return etcd;
      if (!IsAddressInUse(last)) return last;
    }
    return last;
  }

  ~EtcdProcess() { Stop(); }
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // "http://127.0.0.1:<port>"
  std::string endpoint() const { return absl::StrCat("http://127.0.0.1:", client_port_); }

  // The crash: SIGKILL, reaped; the data directory stays.
  void Kill() {
    if (pid_ <= 0) return;
    // Reaped only once the kill went out: a blocking wait for a server not signalled would hang.
    if (Signal(SIGKILL)) waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // The hang: SIGSTOP. etcd keeps its sockets open and answers nothing until Resume().
  // Returns once the kernel reports the process stopped: SIGSTOP is delivered asynchronously, and
  // on a loaded machine etcd could otherwise still answer a request sent right after the kill.
  void Pause() {
    if (pid_ <= 0 || !Signal(SIGSTOP)) return;
    for (absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;) {
      absl::StatusOr<ProcStat> stat = ReadProcStat(pid_);
      if (stat.ok() && stat->stopped()) return;
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  void Resume() {
    if (pid_ > 0) Signal(SIGCONT);
  }

  // Starts etcd again on the same data directory and ports, and waits until it serves.
  absl::Status Restart() {
    Kill();
    return Launch();
  }

  // The end of etcd's log, for failure messages.
  std::string LogTail() const { return FileTail(dir_.File("etcd.log")); }

 private:
  EtcdProcess() = default;

  absl::Status Launch() {
    const std::string name = absl::StrCat("tg-test-", getpid(), "-", client_port_);
    const std::string client_url = endpoint();
    const std::string peer_url = absl::StrCat("http://127.0.0.1:", peer_port_);
    // clang-format off
    std::vector<std::string> args = {
        kEtcdBinary,
        "--name", name,
        "--data-dir", dir_.File("data"),
        "--listen-client-urls", client_url,
        "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url,
        "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", absl::StrCat(name, "=", peer_url),
        "--initial-cluster-token", name,
        "--logger", "zap",
        "--log-level", "warn",
        "--log-outputs", "stderr",
    };
    // clang-format on
    absl::StatusOr<pid_t> pid = SpawnEtcd(std::move(args), dir_.File("etcd.log"));
    if (!pid.ok()) return pid.status();
    pid_ = *pid;
    return WaitUntilServing();
  }

  // Polls with a real client until etcd answers, etcd exits, or kStartTimeout passes.
  absl::Status WaitUntilServing() {
    const absl::Time deadline = absl::Now() + kStartTimeout;
    EtcdStoreOptions options;
    options.endpoints = {endpoint()};
    options.job_id = "etcd-process-probe";
    options.connect_timeout = absl::Milliseconds(500);
    absl::Status last;
    while (absl::Now() < deadline) {
      int wait_status = 0;
      if (waitpid(pid_, &wait_status, WNOHANG) == pid_) {
        pid_ = -1;
        return absl::InternalError(absl::StrCat("etcd exited before serving (status ", wait_status,
                                                "); its log:\n", LogTail()));
      }
      absl::StatusOr<std::unique_ptr<EtcdStore>> probe = EtcdStore::Connect(options);
      if (probe.ok()) return absl::OkStatus();
      last = probe.status();
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "etcd did not serve at ", endpoint(), " within ", absl::FormatDuration(kStartTimeout), ": ",
        last.ToString(), "; its log:\n", LogTail()));
  }

  void Stop() {
    if (pid_ <= 0) return;
    Signal(SIGCONT);
    Signal(SIGTERM);
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (absl::Now() < deadline) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    Kill();
  }

  // Every signal goes through SignalOwnProcess (the etcd this object forked); a refusal is
  // reported on stderr, where the test's log shows it.
  bool Signal(int signal) {
    const absl::Status sent = SignalOwnProcess(pid_, signal);
    if (!sent.ok()) std::fprintf(stderr, "EtcdProcess: %s\n", sent.ToString().c_str());
    return sent.ok();
  }

  TempDir dir_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_ETCD_PROCESS_H_
