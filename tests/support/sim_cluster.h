// SimCluster: several simulated HOSTS on one machine, for multi-host tests of `trainguard run`.
//
// Each host is a set of Linux namespaces the test makes itself: a mount namespace with a private
// tmpfs on /dev/shm and on /tmp (its snapshots and temporary files vanish with it), a PID
// namespace (SIGKILL to its init ends every process of the host at once, as a power cut would),
// a UTS namespace (its own hostname), and its own loopback address Address(n) = 127.0.1.<n>. All
// hosts share one network namespace, private to the test: Create() moves the calling thread into
// it, so the addresses, ports and nftables rules of one test never meet another's. A network
// partition drops packets between two addresses with nftables (Partition, Isolate, HealAll); the
// drop is silent (hook input), so a connect times out and a sent byte never arrives, as on a
// real cut link.
//
// What a host's processes must do for the partitions to apply: bind their sockets, servers and
// clients alike, to $TG_SIM_HOST_ADDR (set in every host's environment); the whole of 127.0.0.0/8
// is local on `lo`, so every Address(n) is bindable without configuration. A socket left on
// 127.0.0.1 is no host's, and no rule drops its traffic.
//
// What a host sees of the machine: everything but /tmp and /dev/shm (fresh, empty and private),
// /proc (its own processes), its hostname and /etc/hosts (its own: localhost, and its hostname at
// its address, as a real host's name resolves to its own address; so a library that binds to the
// address of the hostname, as torch's gloo does, binds to the host's address, not 127.0.0.1). One exception keeps a checkout under /tmp usable
// (`git clone . /tmp/x && .ci/run`): every /tmp/<name> tree named by the test's working directory,
// its executable, or a path in the host's argv or environment (an argument or value starting with
// /tmp/, or containing =/tmp/) is bound back into the host's /tmp at the same path, shared as a
// network file system would be. Anything else a host writes under /tmp is its own. The HostSpec's
// log file is opened by the test, so its path may be anywhere.
//
// Teardown: the destructor SIGKILLs every host still running, reaps them, deletes the nftables
// table and moves the thread back to its original network namespace, which then vanishes with
// the last host. A crashed test leaves nothing behind either: every host dies with the test
// process (PR_SET_PDEATHSIG), and the namespaces with their processes.
//
// Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and /usr/sbin/nft (Debian package nftables): without
// them Create() returns FailedPrecondition saying which, and a test asserting it FAILS.
//
// Not thread-safe: one thread drives a SimCluster: the thread that called Create(), which must be
// the one that destroys it (it was moved into the cluster's network namespace and is moved back).
// Processes are forked from that thread, and a host dies when the thread that started it exits
// (PR_SET_PDEATHSIG follows the forking thread), so it should be the test's main thread.
#ifndef TRAINGUARD_TESTS_SUPPORT_SIM_CLUSTER_H_
#define TRAINGUARD_TESTS_SUPPORT_SIM_CLUSTER_H_

#include <dirent.h>
#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/support/own_process.h"

extern char** environ;

namespace trainguard::testing {

namespace sim_cluster_internal {

inline constexpr char kNft[] = "/usr/sbin/nft";
inline constexpr char kTable[] = "trainguard_sim";
// How long a reap, the nft calls and StartHost's start report may take before they are an error.
inline constexpr absl::Duration kOperationTimeout = absl::Seconds(10);

inline std::string ErrnoName(int error) {
  const char* name = strerrorname_np(error);
  return absl::StrCat(name != nullptr ? name : "errno", " (", std::strerror(error), ")");
}

// argv or envp for execve, pointing into `strings` (which must outlive it): built before fork(),
// since between fork and exec only async-signal-safe calls are allowed, and malloc is not one.
inline std::vector<char*> NullTerminated(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// This process's environment with `overrides` ("K=V") replacing or added to it.
inline std::vector<std::string> EnvironmentWith(const std::vector<std::string>& overrides) {
  std::vector<std::string> result;
  auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    bool overridden = false;
    for (const std::string& o : overrides) overridden = overridden || name_of(o) == name_of(entry);
    if (!overridden) result.push_back(entry);
  }
  result.insert(result.end(), overrides.begin(), overrides.end());
  return result;
}

// Async-signal-safe helpers for the forked children.
inline void ResetSignals() {
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  for (int signal = 1; signal < NSIG; ++signal) {
    if (signal != SIGKILL && signal != SIGSTOP) sigaction(signal, &default_action, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

// Ends this process as `wait_status` says another one ended: the same exit code, or the same
// signal (without a core dump), so that a waitpid() on this process reads what one on that
// process would have.
[[noreturn]] inline void ExitLike(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    const struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    ResetSignals();
    kill(getpid(), WTERMSIG(wait_status));
    _exit(128 + WTERMSIG(wait_status));  // a signal this process cannot die of
  }
  _exit(WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 125);
}

// The reap of a process this test forked, `deadline`-bounded: its wait status, or
// DeadlineExceeded (the process is left unreaped).
inline absl::StatusOr<int> ReapBefore(pid_t pid, absl::Time deadline, const std::string& what) {
  for (;;) {
    int status = 0;
    const pid_t reaped = waitpid(pid, &status, WNOHANG);
    if (reaped == pid) return status;
    if (reaped < 0 && errno != EINTR) {
      return absl::InternalError(
          absl::StrCat("waitpid(", pid, ") for ", what, ": ", ErrnoName(errno)));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, " (pid ", pid, ") has not ended by the deadline"));
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
}

inline std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by ", own_process_internal::SignalName(WTERMSIG(status)));
  }
  return absl::StrCat("wait status ", status);
}

// A namespace to enter: an open /proc/.../ns/* file and its CLONE_NEW* type.
struct Namespace {
  int fd;
  int type;
};

struct Captured {
  int wait_status = 0;
  std::string out;
  std::string err;
};

// Runs `argv` (argv[0] an absolute path) with `env` after entering `namespaces`, and returns its
// exit status, stdout and stderr. With `fork_into_pid_namespace` (one of `namespaces` is a PID
// namespace, which setns() applies to the children only), the command runs in a child of the
// process that entered them. On timeout the command is SIGKILLed and DeadlineExceeded returned.
//
// `nsenter_fallback` (optional): when setns() itself fails in the child, which it does under
// ThreadSanitizer (its runtime gives the forked child a thread of its own, and a multithreaded
// process cannot enter a mount namespace), this command line runs instead; it is expected to be
// util-linux's nsenter entering the same namespaces through /proc/self/fd/<fd> of `namespaces`,
// whose close-on-exec flag the child clears for it.
inline absl::StatusOr<Captured> RunCaptured(std::vector<std::string> argv,
                                            std::vector<std::string> env,
                                            const std::vector<Namespace>& namespaces,
                                            bool fork_into_pid_namespace, absl::Duration timeout,
                                            std::vector<std::string> nsenter_fallback = {}) {
  const std::string what = absl::StrCat("`", absl::StrJoin(argv, " "), "`");
  const std::vector<char*> args = NullTerminated(argv);
  const std::vector<char*> envp = NullTerminated(env);
  const std::vector<char*> fallback_args = NullTerminated(nsenter_fallback);
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe2: " + ErrnoName(errno));
  if (pipe2(err, O_CLOEXEC) != 0) {
    const int error = errno;
    close(out[0]);
    close(out[1]);
    return absl::InternalError("pipe2: " + ErrnoName(error));
  }
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child == 0) {  // only async-signal-safe calls from here to exec
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    bool entered = true;
    for (const Namespace& ns : namespaces) {
      if (setns(ns.fd, ns.type) != 0) {
        entered = false;
        break;
      }
    }
    if (!entered && nsenter_fallback.empty()) _exit(126);
    if (!entered) {
      for (const Namespace& ns : namespaces) fcntl(ns.fd, F_SETFD, 0);
      const int null = open("/dev/null", O_RDONLY);
      dup2(null, STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      ResetSignals();
      execve(fallback_args[0], fallback_args.data(), envp.data());
      _exit(127);
    }
    if (fork_into_pid_namespace) {
      const pid_t command = fork();
      if (command < 0) _exit(126);
      if (command > 0) {
        int status = 0;
        while (waitpid(command, &status, 0) < 0 && errno == EINTR) {
        }
        ExitLike(status);
      }
      prctl(PR_SET_PDEATHSIG, SIGKILL);
    }
    if (chdir("/") != 0) _exit(126);  // the old working directory may not exist in the new mounts
    const int null = open("/dev/null", O_RDONLY);
    dup2(null, STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    ResetSignals();
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  const int fork_error = errno;
  close(out[1]);
  close(err[1]);
  if (child < 0) {
    close(out[0]);
    close(err[0]);
    return absl::InternalError(absl::StrCat("fork for ", what, ": ", ErrnoName(fork_error)));
  }
  Captured captured;
  const absl::Time deadline = absl::Now() + timeout;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&captured.out, &captured.err};
  int open_pipes = 2;
  bool timed_out = false;
  // Until both pipes reach end of file: a background process the command left holding them
  // keeps them open, and then the deadline ends the wait.
  while (open_pipes > 0) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      timed_out = true;
      break;
    }
    const int ready = poll(fds, 2, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_pipes;
      }
    }
  }
  for (pollfd& p : fds) {
    if (p.fd >= 0) close(p.fd);
  }
  if (timed_out) SignalOwnProcess(child, SIGKILL).IgnoreError();  // the command dies with it
  absl::StatusOr<int> status = ReapBefore(child, absl::Now() + kOperationTimeout, what);
  if (!status.ok()) {
    SignalOwnProcess(child, SIGKILL).IgnoreError();
    status = ReapBefore(child, absl::Now() + kOperationTimeout, what);
  }
  if (!status.ok()) return status.status();
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, " did not end within ", absl::FormatDuration(timeout),
                     "; its stdout: ", captured.out, "; its stderr: ", captured.err));
  }
  captured.wait_status = *status;
  return captured;
}

// Writes "/proc/self/fd/<fd>" into `out` (at least 32 bytes), async-signal-safe.
inline void FormatFdPath(int fd, char* out) {
  static constexpr char kPrefix[] = "/proc/self/fd/";
  size_t n = 0;
  for (; kPrefix[n] != '\0'; ++n) out[n] = kPrefix[n];
  char digits[12];
  size_t count = 0;
  unsigned value = static_cast<unsigned>(fd);
  do {
    digits[count++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value != 0);
  while (count > 0) out[n++] = digits[--count];
  out[n] = '\0';
}

// Identity of a namespace file: equal for two files naming the same namespace.
struct NamespaceId {
  dev_t device = 0;
  ino_t inode = 0;
  bool operator==(const NamespaceId&) const = default;
};

// The /tmp/<name> trees a host must still see at their own path under its private /tmp: those of
// the test's working directory and executable (a checkout and build under /tmp), and of every
// absolute /tmp path in `strings` (the host's argv and environment: "/tmp/x/..." or "K=/tmp/x/...").
// Sorted, without repeats; /tmp itself is never one.
inline std::vector<std::string> TmpTreesToKeep(const std::vector<std::string>& strings) {
  std::vector<std::string> paths = strings;
  char buffer[4096];
  if (getcwd(buffer, sizeof(buffer)) != nullptr) paths.emplace_back(buffer);
  const ssize_t length = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (length > 0) paths.emplace_back(buffer, static_cast<size_t>(length));
  std::vector<std::string> trees;
  for (const std::string& path : paths) {
    size_t start = 0;
    if (path.rfind("/tmp/", 0) != 0) {
      const size_t equals = path.find("=/tmp/");
      if (equals == std::string::npos) continue;
      start = equals + 1;
    }
    const size_t name_end = path.find('/', start + 5);
    std::string tree = path.substr(start, name_end == std::string::npos ? std::string::npos
                                                                        : name_end - start);
    if (tree.size() <= 5 || tree == "/tmp/." || tree == "/tmp/..") continue;
    trees.push_back(std::move(tree));
  }
  std::sort(trees.begin(), trees.end());
  trees.erase(std::unique(trees.begin(), trees.end()), trees.end());
  return trees;
}

inline bool StatNamespace(const std::string& path, NamespaceId* id) {
  struct stat s {};
  if (stat(path.c_str(), &s) != 0) return false;
  *id = {s.st_dev, s.st_ino};
  return true;
}

}  // namespace sim_cluster_internal

class SimCluster {
 public:
  struct HostSpec {
    std::string hostname;           // UTS name, e.g. "host2"
    std::vector<std::string> argv;  // argv[0] an absolute path; run inside the host
    std::vector<std::string> env;   // "K=V" added to (overriding) this process's environment
    // stdout+stderr of the command (appended; /dev/null when empty). Opened by the test, so the
    // path is the test's view of the file system; it may be anywhere.
    std::string log_path;
    // The size of the host's /dev/shm tmpfs in bytes (0: tmpfs's default, half the machine's
    // memory): a host too small for its ranks' snapshot arenas.
    uint64_t shm_bytes = 0;
  };

  // Moves the CALLING THREAD (call it from the test's main thread before starting any other
  // thread; ctest runs each test in its own process) into a fresh network namespace with `lo` up,
  // so the cluster's addresses, ports and nftables rules are private to this test and vanish with
  // it. FailedPrecondition naming the syscall and errno when not permitted, or nft is missing.
  static absl::StatusOr<std::unique_ptr<SimCluster>> Create() {
    using sim_cluster_internal::ErrnoName;
    if (access(sim_cluster_internal::kNft, X_OK) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          sim_cluster_internal::kNft, " is missing (", ErrnoName(errno),
          "); the multi-host tests partition the network with nftables: run scripts/setup.sh, "
          "which installs the Debian package nftables"));
    }
    std::unique_ptr<SimCluster> cluster(new SimCluster());
    cluster->original_netns_ = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (cluster->original_netns_ < 0) {
      return absl::FailedPreconditionError(
          "open(/proc/thread-self/ns/net): " + ErrnoName(errno) +
          "; the multi-host tests need /proc mounted to keep the test's network namespace");
    }
    if (unshare(CLONE_NEWNET) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "unshare(CLONE_NEWNET): ", ErrnoName(errno),
          ": this process may not create namespaces; the multi-host tests need root / "
          "CAP_SYS_ADMIN (in a container: --privileged, or CAP_SYS_ADMIN and CAP_NET_ADMIN "
          "and no seccomp filter on unshare)"));
    }
    cluster->entered_ = true;
    cluster->netns_ = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (cluster->netns_ < 0) {
      return absl::InternalError("open(/proc/thread-self/ns/net) in the cluster: " +
                                 ErrnoName(errno));
    }
    if (absl::Status up = BringLoopbackUp(); !up.ok()) return up;
    if (absl::Status s = cluster->Nft({"add", "table", "ip", sim_cluster_internal::kTable});
        !s.ok()) {
      return s;
    }
    // Hook input, not output: a packet dropped on output fails the sender's call at once (EPERM),
    // which no real partition does; dropped on input it is lost in silence.
    if (absl::Status s = cluster->Nft({"add", "chain", "ip", sim_cluster_internal::kTable, "input",
                                       "{ type filter hook input priority 0 ; policy accept ; }"});
        !s.ok()) {
      return s;
    }
    return cluster;
  }

  // SIGKILLs every host still running (its init), reaps them, removes the nft table and moves
  // the thread back to its original network namespace.
  // REQUIRES: called on the thread that called Create().
  ~SimCluster() {
    for (auto& [n, host] : hosts_) {
      if (host.reaped) continue;
      if (absl::Status killed = KillHost(n).status(); !killed.ok()) {
        std::fprintf(stderr, "SimCluster: tearing down host %d: %s\n", n,
                     killed.ToString().c_str());
        // The last resort: the intermediate, whose death takes the init with it (PDEATHSIG).
        SignalOwnProcess(host.intermediate, SIGKILL).IgnoreError();
        waitpid(host.intermediate, nullptr, 0);
        host.reaped = true;
      }
    }
    if (netns_ >= 0) {
      if (absl::Status s = Nft({"delete", "table", "ip", sim_cluster_internal::kTable}); !s.ok()) {
        std::fprintf(stderr, "SimCluster: %s\n", s.ToString().c_str());
      }
      close(netns_);
    }
    if (entered_ && setns(original_netns_, CLONE_NEWNET) != 0) {
      std::fprintf(stderr, "SimCluster: setns back to the original network namespace: %s\n",
                   sim_cluster_internal::ErrnoName(errno).c_str());
    }
    if (original_netns_ >= 0) close(original_netns_);
  }

  SimCluster(const SimCluster&) = delete;
  SimCluster& operator=(const SimCluster&) = delete;

  // "127.0.1.<n>", n in [1, 254].
  static std::string Address(int n) { return absl::StrCat("127.0.1.", n); }

  // Starts host n: fork; the child unshares CLONE_NEWNS|CLONE_NEWPID|CLONE_NEWUTS, makes /
  // rprivate, mounts fresh tmpfs on /dev/shm and /tmp, sets the hostname, forks the host's init
  // (pid 1 in the new PID namespace), which mounts a fresh /proc, runs argv as its child with the
  // env, reaps orphans, and exits with the command's exit status when it ends. Also sets
  // TG_SIM_HOST_ADDR=<Address(n)> in the command's environment. Returns once the command was
  // exec'd, or the step that failed (which syscall, its errno). InvalidArgument for a bad n or an
  // n already running. A host that ended (and was reaped: Running, WaitHost, KillHost) may be
  // started again.
  absl::Status StartHost(int n, HostSpec spec);

  // Whether host n's init has not been reaped yet (reaps it if it has ended).
  bool Running(int n) {
    auto it = hosts_.find(n);
    if (it == hosts_.end() || it->second.reaped) return false;
    int status = 0;
    if (waitpid(it->second.intermediate, &status, WNOHANG) == it->second.intermediate) {
      it->second.reaped = true;
      it->second.wait_status = status;
    }
    return !it->second.reaped;
  }

  // SIGKILLs the host's init (global pid, checked positive and our own): the kernel kills every
  // process in its PID namespace; waits (bounded) until reaped. Returns the time of the kill.
  // NotFound for a host never started; FailedPrecondition for one already reaped.
  absl::StatusOr<absl::Time> KillHost(int n) {
    auto it = hosts_.find(n);
    if (it == hosts_.end()) return absl::NotFoundError(absl::StrCat("no host ", n, " was started"));
    Host& host = it->second;
    if (!Running(n)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "host ", n, " (", host.hostname,
          ") has already ended: ", sim_cluster_internal::DescribeWaitStatus(host.wait_status)));
    }
    const absl::Time killed_at = absl::Now();
    if (absl::Status sent = SignalOwnProcess(host.init, SIGKILL); !sent.ok()) {
      // ESRCH: the init ended between the check above and the kill; the reap below tells.
      if (!absl::IsNotFound(sent)) {
        return absl::Status(sent.code(), absl::StrCat("killing host ", n, ": ", sent.message()));
      }
    }
    // The init's exit waits for every process of its namespace to be gone, so once the
    // intermediate has seen it end, the whole host is.
    absl::StatusOr<int> status = sim_cluster_internal::ReapBefore(
        host.intermediate, absl::Now() + sim_cluster_internal::kOperationTimeout,
        absl::StrCat("host ", n, " (", host.hostname, ") after SIGKILL to its init ", host.init));
    if (!status.ok()) return status.status();
    host.reaped = true;
    host.wait_status = *status;
    return killed_at;
  }

  // Waits for the host's command to end; its exit status (as from waitpid: use WIFEXITED etc.).
  // A host KillHost ended reads as killed by SIGKILL. DeadlineExceeded when it still runs after
  // `timeout`; NotFound for a host never started.
  absl::StatusOr<int> WaitHost(int n, absl::Duration timeout) {
    auto it = hosts_.find(n);
    if (it == hosts_.end()) return absl::NotFoundError(absl::StrCat("no host ", n, " was started"));
    Host& host = it->second;
    if (host.reaped) return host.wait_status;
    absl::StatusOr<int> status =
        sim_cluster_internal::ReapBefore(host.intermediate, absl::Now() + timeout,
                                         absl::StrCat("host ", n, " (", host.hostname, ")"));
    if (!status.ok()) return status.status();
    host.reaped = true;
    host.wait_status = *status;
    return *status;
  }

  // Drops every packet between Address(a) and Address(b), both directions.
  absl::Status Partition(int a, int b) {
    if (absl::Status s = CheckHostNumber(a); !s.ok()) return s;
    if (absl::Status s = CheckHostNumber(b); !s.ok()) return s;
    if (absl::Status s = DropRule({"ip", "saddr", Address(a), "ip", "daddr", Address(b)});
        !s.ok()) {
      return s;
    }
    return DropRule({"ip", "saddr", Address(b), "ip", "daddr", Address(a)});
  }

  // Drops every packet between Address(n) and any other 127.0.0.0/8 address (a host cut off
  // from the cluster; its own address still reaches itself).
  absl::Status Isolate(int n) {
    if (absl::Status s = CheckHostNumber(n); !s.ok()) return s;
    if (absl::Status s = DropRule({"ip", "saddr", Address(n), "ip", "daddr", "!=", Address(n)});
        !s.ok()) {
      return s;
    }
    return DropRule({"ip", "daddr", Address(n), "ip", "saddr", "!=", Address(n)});
  }

  // Removes every drop rule.
  absl::Status HealAll() {
    return Nft({"flush", "chain", "ip", sim_cluster_internal::kTable, "input"});
  }

  // Runs argv (argv[0] an absolute path) in the cluster's network namespace, outside every host,
  // and returns its stdout: traffic control on one host's address (`tc` on `lo` with a filter on
  // Address(n), `iptables -s Address(n)`), which then applies to this cluster only. An error with
  // the exit status and stderr when the command fails or runs past `timeout` (it is killed).
  absl::StatusOr<std::string> RunInNetwork(std::vector<std::string> argv, absl::Duration timeout) {
    const std::string what = absl::StrJoin(argv, " ");
    absl::StatusOr<sim_cluster_internal::Captured> ran = sim_cluster_internal::RunCaptured(
        std::move(argv), sim_cluster_internal::EnvironmentWith({}), {{netns_, CLONE_NEWNET}}, false,
        timeout);
    if (!ran.ok()) return ran.status();
    if (ran->wait_status != 0) {
      return absl::InternalError(absl::StrCat(
          what, " in the cluster's network namespace failed (",
          sim_cluster_internal::DescribeWaitStatus(ran->wait_status), "): ", ran->err));
    }
    return ran->out;
  }

  // The cluster's drop rules as `nft list chain` prints them, for failure messages.
  absl::StatusOr<std::string> Rules() {
    absl::StatusOr<sim_cluster_internal::Captured> listed =
        NftCaptured({"list", "chain", "ip", sim_cluster_internal::kTable, "input"});
    if (!listed.ok()) return listed.status();
    return listed->out;
  }

  // Runs argv inside host n's namespaces (setns into its mnt, pid and uts namespaces through
  // /proc/<init>/ns/*, then a fork, so it is a process of the host) with TG_SIM_HOST_ADDR set,
  // and returns its stdout, e.g. {"/bin/ls", "/dev/shm"} to see the host's private shared memory.
  // An error with the exit status and stderr when the command fails; DeadlineExceeded (the
  // command is killed) when it runs past `timeout`; FailedPrecondition when the host is not
  // running.
  absl::StatusOr<std::string> RunInHost(int n, const std::vector<std::string>& argv,
                                        absl::Duration timeout);

  // The global pids of the live (not zombie) processes in host n's PID namespace, in no promised
  // order, read from this process's /proc. Empty once the host is gone, or for a host never
  // started.
  std::vector<pid_t> Processes(int n) {
    std::vector<pid_t> pids;
    auto it = hosts_.find(n);
    if (it == hosts_.end() || !it->second.has_pid_namespace) return pids;
    DIR* proc = opendir("/proc");
    if (proc == nullptr) return pids;
    while (const dirent* entry = readdir(proc)) {
      char* end = nullptr;
      const long pid = std::strtol(entry->d_name, &end, 10);
      if (pid <= 0 || *end != '\0') continue;
      sim_cluster_internal::NamespaceId id;
      char state = 0;
      pid_t parent = 0;
      if (sim_cluster_internal::StatNamespace(absl::StrCat("/proc/", pid, "/ns/pid"), &id) &&
          id == it->second.pid_namespace &&
          own_process_internal::ReadStat(static_cast<pid_t>(pid), &state, &parent) &&
          state != 'Z') {
        pids.push_back(static_cast<pid_t>(pid));
      }
    }
    closedir(proc);
    return pids;
  }

  // The global pid of host n's init, or -1 when it was never started or has been reaped.
  pid_t InitPid(int n) {
    auto it = hosts_.find(n);
    return it == hosts_.end() || it->second.reaped ? -1 : it->second.init;
  }

 private:
  struct Host {
    std::string hostname;
    pid_t intermediate = -1;  // the test's child that unshared; reaped by the test
    pid_t init = -1;          // its child, pid 1 of the host's PID namespace (global pid)
    bool has_pid_namespace = false;
    sim_cluster_internal::NamespaceId pid_namespace;
    bool reaped = false;
    int wait_status = 0;
  };

  // What a forked step of StartHost reports to the test through a pipe: the init's pid once
  // forked, or the step that failed and its errno.
  enum class Step : int {
    kInitForked,
    kSetnsNet,
    kUnshare,
    kMakeRootPrivate,
    kMountShm,
    kMountTmp,
    kKeepTmpTree,
    kSetHostname,
    kEtcHosts,
    kStatusPipe,
    kForkInit,
    kMountProc,
    kForkCommand,
    kOpenDevNull,
    kExec,
  };
  struct Report {
    Step step;
    int error;  // errno, or the init's pid for kInitForked
  };
  static const char* StepName(Step step) {
    switch (step) {
      case Step::kInitForked:
        return "fork of the init";
      case Step::kSetnsNet:
        return "setns(CLONE_NEWNET) into the cluster's network namespace";
      case Step::kUnshare:
        return "unshare(CLONE_NEWNS|CLONE_NEWPID|CLONE_NEWUTS)";
      case Step::kMakeRootPrivate:
        return "mount(/, MS_REC|MS_PRIVATE)";
      case Step::kMountShm:
        return "mount(tmpfs, /dev/shm)";
      case Step::kMountTmp:
        return "mount(tmpfs, /tmp)";
      case Step::kKeepTmpTree:
        return "binding a /tmp tree the host needs (the test's checkout or a path in its argv or "
               "environment) back into its private /tmp";
      case Step::kSetHostname:
        return "sethostname";
      case Step::kEtcHosts:
        return "writing the host's /etc/hosts and binding it over /etc/hosts";
      case Step::kStatusPipe:
        return "pipe2 for the init's status";
      case Step::kForkInit:
        return "fork of the init";
      case Step::kMountProc:
        return "mount(proc, /proc) in the init";
      case Step::kForkCommand:
        return "fork of the command in the init";
      case Step::kOpenDevNull:
        return "open(/dev/null) for the command's stdin";
      case Step::kExec:
        return "execve of the command";
    }
    return "unknown step";
  }

  SimCluster() = default;

  static absl::Status CheckHostNumber(int n) {
    if (n < 1 || n > 254) {
      return absl::InvalidArgumentError(
          absl::StrCat("host number ", n, " is outside [1, 254] (addresses 127.0.1.<n>)"));
    }
    return absl::OkStatus();
  }

  static absl::Status BringLoopbackUp() {
    using sim_cluster_internal::ErrnoName;
    const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::InternalError("socket for bringing lo up: " + ErrnoName(errno));
    ifreq request{};
    std::strncpy(request.ifr_name, "lo", IFNAMSIZ - 1);
    bool up = ioctl(fd, SIOCGIFFLAGS, &request) == 0;
    if (up) {
      request.ifr_flags = static_cast<short>(request.ifr_flags | IFF_UP);
      up = ioctl(fd, SIOCSIFFLAGS, &request) == 0;
    }
    const int error = errno;
    close(fd);
    if (!up) {
      return absl::FailedPreconditionError(
          "ioctl(SIOCSIFFLAGS, lo, IFF_UP) in the cluster's network namespace: " +
          ErrnoName(error) + "; the multi-host tests need CAP_NET_ADMIN");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<sim_cluster_internal::Captured> NftCaptured(std::vector<std::string> args) {
    args.insert(args.begin(), sim_cluster_internal::kNft);
    return sim_cluster_internal::RunCaptured(
        std::move(args), sim_cluster_internal::EnvironmentWith({}), {{netns_, CLONE_NEWNET}}, false,
        sim_cluster_internal::kOperationTimeout);
  }

  absl::Status Nft(std::vector<std::string> args) {
    const std::string what = absl::StrCat("nft ", absl::StrJoin(args, " "));
    absl::StatusOr<sim_cluster_internal::Captured> ran = NftCaptured(std::move(args));
    if (!ran.ok()) return ran.status();
    if (ran->wait_status != 0) {
      return absl::InternalError(absl::StrCat(
          what, " in the cluster's network namespace failed (",
          sim_cluster_internal::DescribeWaitStatus(ran->wait_status), "): ", ran->err));
    }
    return absl::OkStatus();
  }

  absl::Status DropRule(std::vector<std::string> match) {
    std::vector<std::string> args = {"add", "rule", "ip", sim_cluster_internal::kTable, "input"};
    args.insert(args.end(), match.begin(), match.end());
    args.push_back("drop");
    return Nft(std::move(args));
  }

  // Reads StartHost's reports until the pipe closes (the command was exec'd, or every process
  // holding it ended) or the deadline: OK with the init's pid, or the failed step.
  static absl::StatusOr<pid_t> ReadStartReports(int fd, int n);

  bool entered_ = false;
  int original_netns_ = -1;
  int netns_ = -1;
  std::map<int, Host> hosts_;
};

inline absl::StatusOr<pid_t> SimCluster::ReadStartReports(int fd, int n) {
  const absl::Time deadline = absl::Now() + sim_cluster_internal::kOperationTimeout;
  pid_t init = -1;
  Report report{};
  size_t have = 0;
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("host ", n, " did not report its start within ",
                       absl::FormatDuration(sim_cluster_internal::kOperationTimeout)));
    }
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) <= 0) continue;
    const ssize_t got = read(fd, reinterpret_cast<char*>(&report) + have, sizeof(report) - have);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    have += static_cast<size_t>(got);
    if (have < sizeof(report)) continue;
    have = 0;
    if (report.step == Step::kInitForked) {
      init = report.error;
      continue;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "starting host ", n, ": ", StepName(report.step), ": ",
        sim_cluster_internal::ErrnoName(report.error),
        report.step == Step::kUnshare ? "; the multi-host tests need root / CAP_SYS_ADMIN" : ""));
  }
  if (init <= 0) {
    return absl::InternalError(absl::StrCat("host ", n, " ended before it reported its init"));
  }
  return init;
}

inline absl::Status SimCluster::StartHost(int n, HostSpec spec) {
  using sim_cluster_internal::ErrnoName;
  if (absl::Status s = CheckHostNumber(n); !s.ok()) return s;
  if (Running(n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host ", n, " (", hosts_[n].hostname, ") is already running as init pid ", hosts_[n].init));
  }
  if (spec.argv.empty() || spec.argv[0].empty() || spec.argv[0][0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("host ", n, ": argv[0] must be an absolute path, got \"",
                     spec.argv.empty() ? std::string() : spec.argv[0], "\""));
  }
  if (spec.hostname.empty()) spec.hostname = absl::StrCat("host", n);
  if (spec.hostname.size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("host ", n, ": hostname \"", spec.hostname, "\" is longer than 64 bytes"));
  }
  // Everything the children use is made now: after fork() only async-signal-safe calls.
  spec.env.push_back(absl::StrCat("TG_SIM_HOST_ADDR=", Address(n)));
  std::vector<std::string> env = sim_cluster_internal::EnvironmentWith(spec.env);
  const std::vector<char*> argv = sim_cluster_internal::NullTerminated(spec.argv);
  const std::vector<char*> envp = sim_cluster_internal::NullTerminated(env);
  std::vector<std::string> named = spec.argv;
  named.insert(named.end(), spec.env.begin(), spec.env.end());
  const std::vector<std::string> kept_trees = sim_cluster_internal::TmpTreesToKeep(named);
  if (kept_trees.size() > 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host ", n, ": its argv, environment and the test's checkout name ", kept_trees.size(),
        " trees under /tmp (", absl::StrJoin(kept_trees, ", "), "); at most 16 can be kept"));
  }
  std::vector<std::string> kept_sources;  // "/proc/self/fd/N" for each kept tree, N set in the child
  kept_sources.reserve(kept_trees.size());
  for (size_t i = 0; i < kept_trees.size(); ++i) kept_sources.emplace_back(32, '\0');
  const char* hostname = spec.hostname.c_str();
  const size_t hostname_length = spec.hostname.size();
  const std::string etc_hosts = absl::StrCat("127.0.0.1\tlocalhost\n", Address(n), "\t",
                                             spec.hostname, "\n::1\tlocalhost ip6-localhost\n");
  const std::string log_path = spec.log_path.empty() ? "/dev/null" : spec.log_path;
  const std::string shm_options =
      spec.shm_bytes > 0 ? absl::StrCat("mode=1777,size=", spec.shm_bytes) : "mode=1777";
  const char* shm_data = shm_options.c_str();
  const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host ", n, ": opening its log ", log_path, ": ", ErrnoName(errno)));
  }
  int reports[2];
  if (pipe2(reports, O_CLOEXEC) != 0) {
    const int error = errno;
    close(log);
    return absl::InternalError("pipe2 for the host's start reports: " + ErrnoName(error));
  }
  const int netns = netns_;
  const pid_t parent = getpid();

  const pid_t intermediate = fork();
  if (intermediate == 0) {  // only async-signal-safe calls from here to exec
    close(reports[0]);
    const int report_fd = reports[1];
    auto fail = [report_fd](Step step) {
      const Report report{step, errno};
      (void)!write(report_fd, &report, sizeof(report));
      _exit(126);
    };
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    if (setns(netns, CLONE_NEWNET) != 0) fail(Step::kSetnsNet);
    if (unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS) != 0) fail(Step::kUnshare);
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      fail(Step::kMakeRootPrivate);
    }
    if (mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, shm_data) != 0) {
      fail(Step::kMountShm);
    }
    // The kept trees are opened before the tmpfs hides them, then bound back through their fds.
    int kept_fds[16];
    const size_t kept_count = kept_trees.size();
    for (size_t i = 0; i < kept_count; ++i) {
      kept_fds[i] = open(kept_trees[i].c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    }
    if (mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") != 0) {
      fail(Step::kMountTmp);
    }
    for (size_t i = 0; i < kept_count; ++i) {
      if (kept_fds[i] < 0) continue;  // a named path that does not exist (yet): nothing to keep
      char* source = kept_sources[i].data();
      sim_cluster_internal::FormatFdPath(kept_fds[i], source);
      if (mkdir(kept_trees[i].c_str(), 0755) != 0 ||
          mount(source, kept_trees[i].c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
        fail(Step::kKeepTmpTree);
      }
      close(kept_fds[i]);
    }
    if (sethostname(hostname, hostname_length) != 0) fail(Step::kSetHostname);
    {  // The host's /etc/hosts: written in its /tmp, bound over /etc/hosts, then unlinked there.
      constexpr char kStaged[] = "/tmp/.tg-sim-etc-hosts";
      const int fd = open(kStaged, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0) fail(Step::kEtcHosts);
      const bool written = write(fd, etc_hosts.data(), etc_hosts.size()) ==
                           static_cast<ssize_t>(etc_hosts.size());
      close(fd);
      if (!written || mount(kStaged, "/etc/hosts", nullptr, MS_BIND, nullptr) != 0 ||
          unlink(kStaged) != 0) {
        fail(Step::kEtcHosts);
      }
    }
    int status_pipe[2];  // the init tells the command's wait status through it
    if (pipe2(status_pipe, O_CLOEXEC) != 0) fail(Step::kStatusPipe);
    const pid_t init = fork();
    if (init < 0) fail(Step::kForkInit);
    if (init > 0) {
      const Report forked{Step::kInitForked, init};
      (void)!write(report_fd, &forked, sizeof(forked));
      close(report_fd);
      close(status_pipe[1]);
      int init_status = 0;
      while (waitpid(init, &init_status, 0) < 0 && errno == EINTR) {
      }
      int command_status = 0;
      // The init's own status says only that it ended (SIGKILL when the host was killed); when
      // it ended on its own, it told the command's status first.
      if (read(status_pipe[0], &command_status, sizeof(command_status)) ==
          static_cast<ssize_t>(sizeof(command_status))) {
        sim_cluster_internal::ExitLike(command_status);
      }
      sim_cluster_internal::ExitLike(init_status);
    }
    // The host's init: pid 1 of the new PID namespace.
    close(status_pipe[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
      fail(Step::kMountProc);
    }
    const pid_t command = fork();
    if (command < 0) fail(Step::kForkCommand);
    if (command == 0) {
      close(status_pipe[1]);
      const int null = open("/dev/null", O_RDONLY);
      if (null < 0) fail(Step::kOpenDevNull);
      dup2(null, STDIN_FILENO);
      dup2(log, STDOUT_FILENO);
      dup2(log, STDERR_FILENO);
      // The test's other descriptors (sockets, store connections) are none of the host's.
      close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
      sim_cluster_internal::ResetSignals();
      execve(argv[0], argv.data(), envp.data());
      fail(Step::kExec);
    }
    close(report_fd);
    close(log);
    int command_status = 0;
    for (;;) {  // reaps the orphans of the host too, until the command ends
      int status = 0;
      const pid_t reaped = waitpid(-1, &status, 0);
      if (reaped == command) {
        command_status = status;
        break;
      }
      if (reaped < 0 && errno != EINTR) break;
    }
    (void)!write(status_pipe[1], &command_status, sizeof(command_status));
    _exit(0);  // the kernel ends what is left of the host
  }
  const int fork_error = errno;
  close(reports[1]);
  close(log);
  if (intermediate < 0) {
    close(reports[0]);
    return absl::InternalError(absl::StrCat("fork for host ", n, ": ", ErrnoName(fork_error)));
  }
  Host& host = hosts_[n];
  host = Host{};
  host.hostname = spec.hostname;
  host.intermediate = intermediate;
  absl::StatusOr<pid_t> init = ReadStartReports(reports[0], n);
  close(reports[0]);
  if (!init.ok()) {
    SignalOwnProcess(intermediate, SIGKILL).IgnoreError();
    absl::StatusOr<int> status = sim_cluster_internal::ReapBefore(
        intermediate, absl::Now() + sim_cluster_internal::kOperationTimeout,
        absl::StrCat("host ", n, " after a failed start"));
    host.reaped = true;
    host.wait_status = status.ok() ? *status : 0;
    return init.status();
  }
  host.init = *init;
  host.has_pid_namespace = sim_cluster_internal::StatNamespace(
      absl::StrCat("/proc/", host.init, "/ns/pid"), &host.pid_namespace);
  return absl::OkStatus();
}

inline absl::StatusOr<std::string> SimCluster::RunInHost(int n,
                                                         const std::vector<std::string>& argv,
                                                         absl::Duration timeout) {
  using sim_cluster_internal::ErrnoName;
  using sim_cluster_internal::Namespace;
  if (!Running(n)) {
    return absl::FailedPreconditionError(absl::StrCat("host ", n, " is not running"));
  }
  if (argv.empty() || argv[0].empty() || argv[0][0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("RunInHost(", n, "): argv[0] must be an absolute path"));
  }
  const Host& host = hosts_[n];
  std::vector<Namespace> namespaces = {{netns_, CLONE_NEWNET}};
  absl::Status opened;
  for (const auto& [name, type] : {std::pair<const char*, int>{"uts", CLONE_NEWUTS},
                                   {"pid", CLONE_NEWPID},
                                   {"mnt", CLONE_NEWNS}}) {
    const std::string path = absl::StrCat("/proc/", host.init, "/ns/", name);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      opened = absl::FailedPreconditionError(
          absl::StrCat("RunInHost(", n, "): open(", path, "): ", ErrnoName(errno)));
      break;
    }
    namespaces.push_back({fd, type});
    struct stat s {};
    if (type == CLONE_NEWPID &&
        (fstat(fd, &s) != 0 ||
         !(sim_cluster_internal::NamespaceId{s.st_dev, s.st_ino} == host.pid_namespace))) {
      opened = absl::FailedPreconditionError(
          absl::StrCat("RunInHost(", n, "): pid ", host.init, " is no longer the host's init"));
      break;
    }
  }
  absl::StatusOr<sim_cluster_internal::Captured> ran;
  if (opened.ok()) {
    std::vector<std::string> nsenter = {"/usr/bin/nsenter", "--wd=/"};
    for (const Namespace& ns : namespaces) {
      const char* flag = ns.type == CLONE_NEWNET   ? "--net"
                         : ns.type == CLONE_NEWUTS ? "--uts"
                         : ns.type == CLONE_NEWPID ? "--pid"
                                                   : "--mount";
      nsenter.push_back(absl::StrCat(flag, "=/proc/self/fd/", ns.fd));
    }
    nsenter.push_back("--");
    nsenter.insert(nsenter.end(), argv.begin(), argv.end());
    ran = sim_cluster_internal::RunCaptured(
        argv,
        sim_cluster_internal::EnvironmentWith({absl::StrCat("TG_SIM_HOST_ADDR=", Address(n))}),
        namespaces, true, timeout, std::move(nsenter));
  }
  for (size_t i = 1; i < namespaces.size(); ++i) close(namespaces[i].fd);
  if (!opened.ok()) return opened;
  if (!ran.ok()) {
    return absl::Status(ran.status().code(),
                        absl::StrCat("in host ", n, ": ", ran.status().message()));
  }
  if (ran->wait_status != 0) {
    return absl::InternalError(
        absl::StrCat("`", absl::StrJoin(argv, " "), "` in host ", n, " (", host.hostname,
                     ") failed (", sim_cluster_internal::DescribeWaitStatus(ran->wait_status),
                     "); its stderr: ", ran->err, "; its stdout: ", ran->out));
  }
  return ran->out;
}

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_SIM_CLUSTER_H_
