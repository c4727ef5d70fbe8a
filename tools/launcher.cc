// `trainguard run`: see launcher.h. One thread runs the job: a poll loop over a signalfd (SIGCHLD,
// SIGINT, SIGTERM) and every child's output pipe; generation 0 is formed on one helper thread.
#include "tools/launcher.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "sdk/checkpoint/snapshotter.h"
#include "sdk/rendezvous/rendezvous.h"
#include "sdk/rendezvous/tcp_store.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/hang_diagnosis.h"
#include "trainguard/checkpoint.h"
#include "trainguard/env.h"
#include "trainguard/mutex.h"
#include "trainguard/store.h"

extern char** environ;

namespace trainguard::tools {
namespace {

constexpr absl::Duration kStoreTimeout = absl::Seconds(10);

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = sigabbrev_np(WTERMSIG(status));
    return absl::StrCat("killed by SIG", name != nullptr ? name : absl::StrCat(WTERMSIG(status)));
  }
  return absl::StrCat("ended with wait status ", status);
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

absl::StatusOr<std::string> RandomToken() {
  unsigned char bytes[32];
  if (getrandom(bytes, sizeof(bytes), 0) != static_cast<ssize_t>(sizeof(bytes))) {
    return absl::InternalError(absl::StrCat("getrandom: ", strerror(errno)));
  }
  std::string hex;
  for (unsigned char b : bytes) hex += absl::StrFormat("%02x", b);
  return hex;
}

// A port nobody listens on right now, for torchrun's MASTER_PORT.
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 29500;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 29500;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// Written to a temporary file and renamed over `path`: a reader (a test, a script about to send a
// signal) sees the old contents or the new, never an empty or half-written file, which for a pid
// file would read as no pid or a wrong one.
absl::Status WriteFile(const std::string& path, std::string_view contents, mode_t mode) {
  const std::string temp = absl::StrCat(path, ".tmp.", getpid());
  int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", temp, ": ", strerror(errno)));
  const bool ok =
      write(fd, contents.data(), contents.size()) == static_cast<ssize_t>(contents.size());
  const int write_errno = errno;
  if (close(fd) != 0 || !ok) {
    const int error = ok ? errno : write_errno;
    unlink(temp.c_str());
    return absl::InternalError(absl::StrCat("write ", temp, ": ", strerror(error)));
  }
  if (rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    unlink(temp.c_str());
    return absl::InternalError(absl::StrCat("rename ", temp, " to ", path, ": ", strerror(error)));
  }
  return absl::OkStatus();
}

// One process of the job: a rank, or a standby (rank -1 until it is assigned one).
struct Child {
  pid_t pid = -1;
  std::string member_id;
  int rank = -1;
  int standby_index = -1;
  int out_fd = -1;  // the read end of its stdout+stderr
  int log_fd = -1;
  std::string pending;  // output after the last newline
  bool running = true;
  bool killed_for_liveness = false;

  std::string Label() const {
    return rank >= 0 ? absl::StrCat("rank ", rank) : absl::StrCat("standby ", standby_index);
  }
};

class Job {
 public:
  explicit Job(LaunchConfig config) : config_(std::move(config)) {}
  ~Job() {
    if (former_.joinable()) {
      stop_forming_.store(true);
      former_.join();
    }
    if (signal_fd_ >= 0) close(signal_fd_);
    for (auto& c : children_) {
      if (c->out_fd >= 0) close(c->out_fd);
      if (c->log_fd >= 0) close(c->log_fd);
    }
  }

  int Run();

 private:
  absl::Status Prepare();
  absl::Status Spawn(int rank, int standby_index);
  std::vector<std::string> ChildEnvironment(const Child& child) const;
  void Pump(Child& child, bool flush);
  void Reap();
  void OnExit(Child& child, int status);
  void TryReplacements();
  void CheckRecoveries();
  void KillRanksWithStaleHeartbeats();
  void ReportLaggards();
  void DiagnoseHangs();
  void RenewGenerationWhenAsked();
  void StopAll(absl::Duration grace);
  void Fail(const std::string& why);
  void Say(const std::string& line) { std::printf("trainguard run: %s\n", line.c_str()); }
  bool CanSpawnStandby() const;
  absl::Status WritePidFile(int rank, pid_t pid);

  LaunchConfig config_;
  std::string store_url_;
  std::string token_file_;
  int master_port_ = 0;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<RendezvousCoordinator> coordinator_;
  std::vector<std::unique_ptr<Child>> children_;
  int signal_fd_ = -1;
  int standbys_spawned_ = 0;
  int replacements_ = 0;
  int ranks_finished_ = 0;
  int exit_code_ = -1;

  struct DeadRank {
    int rank;
    absl::Time died;
    absl::Time give_up;
  };
  std::deque<DeadRank> dead_;
  struct Recovery {
    int rank;  // -1: a renewal (no rank died; the communicators broke)
    int64_t generation;
    absl::Time died;  // or, for a renewal, when the first rank asked
  };
  std::vector<Recovery> recoveries_;
  absl::Time next_liveness_check_ = absl::InfinitePast();
  // A hang a rank published (store key hang/gen<G>): diagnosed from the ranks' dumps once every
  // rank has dumped or kHangDumpGrace has passed.
  struct PendingHang {
    int64_t generation;
    absl::Time seen;
    std::map<int, FlightRecorderContents> live_rings;  // read when the hang was seen
  };
  std::optional<PendingHang> pending_hang_;
  int64_t hangs_checked_below_ = 0;  // generations below this one have no hang left to look for
  absl::Time next_hang_check_ = absl::InfinitePast();
  // The first request for a new generation seen in the current one (RenewGenerationWhenAsked).
  struct RenewalAsked {
    int64_t generation;
    absl::Time since;
  };
  std::optional<RenewalAsked> renewal_asked_;

  // Generation 0 is formed on a helper thread while the loop keeps draining the ranks' output.
  std::thread former_;
  std::atomic<bool> stop_forming_{false};
  Mutex formed_mu_;
  std::optional<absl::Status> formed_ ABSL_GUARDED_BY(formed_mu_);
};

absl::Status Job::Prepare() {
  Env* env = Env::Default();
  for (const std::string& dir :
       {config_.run_dir, config_.run_dir + "/logs", config_.run_dir + "/pids"}) {
    if (absl::Status s = env->CreateDirs(dir); !s.ok()) return s;
  }
  std::string token;
  if (config_.store.empty()) {
    absl::StatusOr<std::string> fresh = RandomToken();
    if (!fresh.ok()) return fresh.status();
    token = *fresh;
    token_file_ = config_.run_dir + "/store.token";
    if (absl::Status s = WriteFile(token_file_, token, 0600); !s.ok()) return s;
    TcpStoreServerOptions options;
    options.host = "127.0.0.1";
    options.job_token = token;
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start(options);
    if (!server.ok()) return server.status();
    server_ = *std::move(server);
    store_url_ = absl::StrCat("tcp://127.0.0.1:", server_->port());
  } else {
    store_url_ = config_.store;
    token_file_ = config_.token_file;
    if (!token_file_.empty()) {
      absl::StatusOr<std::string> contents = env->ReadFileToString(token_file_);
      if (!contents.ok()) return contents.status();
      token = std::string(absl::StripTrailingAsciiWhitespace(*contents));
    }
  }
  absl::StatusOr<std::unique_ptr<Store>> store =
      OpenStore(store_url_, config_.job_id, token, kStoreTimeout);
  if (!store.ok()) return store.status();
  store_ = *std::move(store);
  coordinator_ = std::make_unique<RendezvousCoordinator>(store_.get());
  master_port_ = FreePort();

  sigset_t signals;
  sigemptyset(&signals);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM}) sigaddset(&signals, sig);
  signal_fd_ = signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd_ < 0) return absl::InternalError(absl::StrCat("signalfd: ", strerror(errno)));
  return absl::OkStatus();
}

std::vector<std::string> Job::ChildEnvironment(const Child& child) const {
  static const char* const kOurs[] = {"TRAINGUARD_JOB_ID",
                                      "TRAINGUARD_WORLD_SIZE",
                                      "TRAINGUARD_RANK",
                                      "TRAINGUARD_ROLE",
                                      "TRAINGUARD_MEMBER_ID",
                                      "TRAINGUARD_STORE",
                                      "TRAINGUARD_STORE_TOKEN_FILE",
                                      "TRAINGUARD_RUN_DIR",
                                      "TRAINGUARD_LOCAL_RANK",
                                      "TRAINGUARD_LOCAL_WORLD_SIZE",
                                      "RANK",
                                      "WORLD_SIZE",
                                      "LOCAL_RANK",
                                      "LOCAL_WORLD_SIZE",
                                      "MASTER_ADDR",
                                      "MASTER_PORT"};
  std::vector<std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    bool ours = false;
    for (const char* name : kOurs) {
      const size_t n = strlen(name);
      if (entry.size() > n && entry.substr(0, n) == name && entry[n] == '=') ours = true;
    }
    if (!ours) vars.emplace_back(entry);
  }
  const int n = config_.nproc;
  vars.push_back(absl::StrCat("TRAINGUARD_JOB_ID=", config_.job_id));
  vars.push_back(absl::StrCat("TRAINGUARD_WORLD_SIZE=", n));
  vars.push_back(absl::StrCat("TRAINGUARD_LOCAL_WORLD_SIZE=", n));
  vars.push_back(absl::StrCat("TRAINGUARD_MEMBER_ID=", child.member_id));
  vars.push_back(absl::StrCat("TRAINGUARD_STORE=", store_url_));
  if (!token_file_.empty())
    vars.push_back(absl::StrCat("TRAINGUARD_STORE_TOKEN_FILE=", token_file_));
  vars.push_back(absl::StrCat("TRAINGUARD_RUN_DIR=", config_.run_dir));
  vars.push_back(absl::StrCat("WORLD_SIZE=", n));
  vars.push_back(absl::StrCat("LOCAL_WORLD_SIZE=", n));
  vars.push_back("MASTER_ADDR=127.0.0.1");
  vars.push_back(absl::StrCat("MASTER_PORT=", master_port_));
  if (child.rank >= 0) {
    vars.push_back("TRAINGUARD_ROLE=rank");
    for (const char* name :
         {"TRAINGUARD_RANK=", "TRAINGUARD_LOCAL_RANK=", "RANK=", "LOCAL_RANK="}) {
      vars.push_back(absl::StrCat(name, child.rank));
    }
  } else {
    vars.push_back("TRAINGUARD_ROLE=standby");
  }
  return vars;
}

absl::Status Job::WritePidFile(int rank, pid_t pid) {
  return WriteFile(absl::StrCat(config_.run_dir, "/pids/rank-", rank), absl::StrCat(pid, "\n"),
                   0644);
}

absl::Status Job::Spawn(int rank, int standby_index) {
  auto child = std::make_unique<Child>();
  child->rank = rank;
  child->standby_index = standby_index;
  child->member_id = rank >= 0 ? absl::StrCat(HostName(), ":", getpid(), ":rank", rank)
                               : absl::StrCat(HostName(), ":", getpid(), ":standby", standby_index);
  const std::string log_path = absl::StrCat(
      config_.run_dir, "/logs/",
      rank >= 0 ? absl::StrCat("rank-", rank) : absl::StrCat("standby-", standby_index), ".log");
  child->log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (child->log_fd < 0)
    return absl::InternalError(absl::StrCat("open ", log_path, ": ", strerror(errno)));
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0)
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));

  // Everything the child needs is built before fork(): this process has threads, so the child may
  // only make async-signal-safe calls until it execs.
  std::vector<std::string> env_strings = ChildEnvironment(*child);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = config_.command;
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  sigset_t none;
  sigemptyset(&none);

  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // the job dies with its launcher
    if (getppid() != parent) _exit(127);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    execvpe(argv[0], argv.data(), envp.data());
    static const char kMessage[] = "trainguard run: cannot execute the command\n";
    (void)!write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
    _exit(127);
  }
  close(pipe_fds[1]);
  child->pid = pid;
  child->out_fd = pipe_fds[0];
  fcntl(child->out_fd, F_SETFL, O_NONBLOCK);
  if (rank >= 0) {
    if (absl::Status s = WritePidFile(rank, pid); !s.ok()) return s;
  } else {
    ++standbys_spawned_;
  }
  Say(absl::StrFormat("started %s (pid %d, member %s)", child->Label(), pid, child->member_id));
  children_.push_back(std::move(child));
  return absl::OkStatus();
}

void Job::Pump(Child& child, bool flush) {
  char buffer[1 << 14];
  while (child.out_fd >= 0) {
    ssize_t n = read(child.out_fd, buffer, sizeof(buffer));
    if (n > 0) {
      (void)!write(child.log_fd, buffer, static_cast<size_t>(n));
      child.pending.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {  // the child and everything it forked closed the pipe
      close(child.out_fd);
      child.out_fd = -1;
      flush = true;
    }
    break;
  }
  for (size_t end; (end = child.pending.find('\n')) != std::string::npos;) {
    std::printf("[%s] %s\n", child.Label().c_str(), child.pending.substr(0, end).c_str());
    child.pending.erase(0, end + 1);
  }
  if (flush && !child.pending.empty()) {
    std::printf("[%s] %s\n", child.Label().c_str(), child.pending.c_str());
    child.pending.clear();
  }
  std::fflush(stdout);
}

void Job::Reap() {
  while (true) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (auto& c : children_) {
      if (c->pid == pid && c->running) {
        c->running = false;
        Pump(*c, /*flush=*/false);
        OnExit(*c, status);
      }
    }
  }
}

bool Job::CanSpawnStandby() const {
  if (config_.standby == 0) return false;
  const int64_t allowed = config_.max_replacements < 0
                              ? std::numeric_limits<int>::max()
                              : int64_t{config_.standby} + config_.max_replacements;
  return standbys_spawned_ < allowed;
}

void Job::OnExit(Child& child, int status) {
  const std::string how = DescribeExit(status);
  if (exit_code_ >= 0) return;  // stopping: exits are expected
  if (child.rank < 0) {
    Say(absl::StrFormat("%s (pid %d) %s while parked", child.Label(), child.pid, how));
    (void)coordinator_->ForgetStandby(child.member_id, kStoreTimeout);
    if (CanSpawnStandby()) {
      if (absl::Status s = Spawn(-1, standbys_spawned_); !s.ok()) Say(s.ToString());
    }
    return;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    ++ranks_finished_;
    Say(absl::StrFormat("%s (pid %d) finished", child.Label(), child.pid));
    return;
  }
  Say(absl::StrFormat("%s (pid %d, member %s) %s", child.Label(), child.pid, child.member_id, how));
  bool formed = false;
  {
    MutexLock lock(&formed_mu_);
    formed = formed_.has_value() && formed_->ok();
  }
  if (!formed) return Fail(absl::StrCat(child.Label(), " died before generation 0 formed"));
  if (config_.standby == 0)
    return Fail(absl::StrCat(child.Label(), " died and the job has no standbys"));
  if (config_.max_replacements >= 0 && replacements_ >= config_.max_replacements) {
    return Fail(absl::StrFormat("%s died after %d replacements (--max-replacements %d)",
                                child.Label(), replacements_, config_.max_replacements));
  }
  const absl::Time now = absl::Now();
  dead_.push_back({child.rank, now, now + config_.rendezvous_timeout});
}

void Job::TryReplacements() {
  while (!dead_.empty() && exit_code_ < 0) {
    const DeadRank dead = dead_.front();
    absl::StatusOr<Membership> next = coordinator_->ReplaceRank(dead.rank, kStoreTimeout);
    if (absl::IsFailedPrecondition(next.status())) {
      // No standby has parked yet. Wait for one if one is still starting up.
      bool starting = false;
      for (auto& c : children_) starting |= c->running && c->rank < 0;
      if (starting && absl::Now() < dead.give_up) return;
      return Fail(absl::StrFormat("rank %d died and no standby is available (%s)", dead.rank,
                                  std::string(next.status().message())));
    }
    if (!next.ok())
      return Fail(absl::StrCat("replacing rank ", dead.rank, ": ", next.status().ToString()));
    dead_.pop_front();
    ++replacements_;
    const std::string& member = next->members[dead.rank];
    for (auto& c : children_) {
      if (c->member_id != member || !c->running) continue;
      Say(absl::StrFormat("%s (pid %d) takes rank %d in generation %d", c->Label(), c->pid,
                          dead.rank, next->generation));
      c->rank = dead.rank;
      (void)WritePidFile(dead.rank, c->pid);
    }
    recoveries_.push_back({dead.rank, next->generation, dead.died});
    if (CanSpawnStandby()) {
      if (absl::Status s = Spawn(-1, standbys_spawned_); !s.ok()) Say(s.ToString());
    }
  }
}

void Job::CheckRecoveries() {
  for (auto it = recoveries_.begin(); it != recoveries_.end();) {
    std::vector<std::string> keys;
    for (int r = 0; r < config_.nproc; ++r) {
      keys.push_back(absl::StrCat("rdzv/gen/", it->generation, "/resumed/", r));
    }
    absl::StatusOr<std::vector<std::optional<std::string>>> values =
        store_->MultiGet(keys, kStoreTimeout);
    bool all = values.ok();
    if (all) {
      for (const auto& v : *values) all &= v.has_value();
    }
    if (!all) {
      ++it;
      continue;
    }
    const double took = absl::ToDoubleSeconds(absl::Now() - it->died);
    if (it->rank < 0) {
      Say(
          absl::StrFormat("recovered with the same ranks in %.3f s (first request for a new "
                          "generation -> every rank completed its first step of generation %d)",
                          took, it->generation));
    } else {
      Say(
          absl::StrFormat("recovered from the loss of rank %d in %.3f s (death seen -> every rank "
                          "completed its first step of generation %d)",
                          it->rank, took, it->generation));
    }
    it = recoveries_.erase(it);
  }
}

void Job::KillRanksWithStaleHeartbeats() {
  const absl::Time now = absl::Now();
  if (now < next_liveness_check_) return;
  next_liveness_check_ = now + absl::Milliseconds(500);
  absl::StatusOr<std::vector<int>> stale =
      coordinator_->RanksWithStaleHeartbeats(config_.heartbeat_timeout, kStoreTimeout);
  if (!stale.ok()) return;  // the store is briefly unreachable: look again next time
  if (!stale->empty()) ReportLaggards();
  for (int rank : *stale) {
    for (auto& c : children_) {
      if (c->rank != rank || !c->running || c->killed_for_liveness) continue;
      Say(absl::StrFormat("%s (pid %d) has not sent a heartbeat for %s: killing it", c->Label(),
                          c->pid, absl::FormatDuration(config_.heartbeat_timeout)));
      c->killed_for_liveness = true;
      kill(c->pid, SIGKILL);  // reaped and replaced like any dead rank
    }
  }
}

// Reads every rank's flight-recorder ring (readable while a rank is stopped or dead) and says which
// rank the others are waiting for.
void Job::ReportLaggards() {
  std::vector<int> ranks;
  std::vector<FlightRecorderContents> rings;
  for (int r = 0; r < config_.nproc; ++r) {
    absl::StatusOr<FlightRecorderContents> ring = ReadFlightRecorder(config_.job_id, r);
    if (!ring.ok()) continue;
    ranks.push_back(r);
    rings.push_back(*std::move(ring));
  }
  for (const LaggardReport& report : FindLaggards(ranks, rings)) {
    Say(absl::StrCat("laggard: ", report.ToString()));
  }
}

// Watches for a hang a rank published, then reads every rank's dump of it (and the live rings of
// ranks that wrote none, as they were when the hang was seen) and names the suspects
// (hang_diagnosis.h): the rank that never entered the collective, or that entered it and stalled
// there while the others wait.
void Job::DiagnoseHangs() {
  // Ranks dump within hang_dump_wait_ms (1 s by default) of the declaration; one that is stopped or
  // dead never does.
  constexpr absl::Duration kHangDumpGrace = absl::Seconds(3);
  const absl::Time now = absl::Now();
  if (now < next_hang_check_) return;
  next_hang_check_ = now + absl::Milliseconds(250);
  const std::string dir = config_.run_dir + "/flight_recorder";
  if (!pending_hang_.has_value()) {
    const int64_t current = coordinator_->generation();
    for (int64_t g = hangs_checked_below_; g <= current; ++g) {
      absl::StatusOr<std::string> who =
          store_->Get(absl::StrCat("hang/gen", g), absl::Milliseconds(200));
      if (!who.ok()) {
        if (absl::IsNotFound(who.status()) && g < current) hangs_checked_below_ = g + 1;
        continue;
      }
      Say(absl::StrCat("hang in generation ", g, ": ", *who));
      PendingHang hang{g, now, {}};
      for (int r = 0; r < config_.nproc; ++r) {
        absl::StatusOr<FlightRecorderContents> ring = ReadFlightRecorder(config_.job_id, r);
        if (ring.ok()) hang.live_rings[r] = *std::move(ring);
      }
      pending_hang_ = std::move(hang);
      break;
    }
    if (!pending_hang_.has_value()) return;
  }
  absl::StatusOr<std::vector<FlightRecorderDump>> dumps =
      ReadHangDumps(dir, pending_hang_->generation);
  const size_t dumped = dumps.ok() ? dumps->size() : 0;
  if (dumped < static_cast<size_t>(config_.nproc) && now < pending_hang_->seen + kHangDumpGrace) {
    return;  // some rank is still dumping
  }
  HangEvidence evidence;
  if (dumps.ok()) evidence.dumps = *std::move(dumps);
  evidence.live_rings = std::move(pending_hang_->live_rings);
  evidence.world_size = config_.nproc;
  const HangDiagnosis diagnosis = DiagnoseHang(evidence);
  for (absl::string_view line : absl::StrSplit(diagnosis.ToString(), '\n')) {
    Say(absl::StrCat("hang diagnosis: ", line));
  }
  const int64_t generation = pending_hang_->generation;
  hangs_checked_below_ = generation + 1;
  pending_hang_.reset();
  // The suspects are replaced like dead ranks, as long as they are a minority and still hold their
  // ranks in the generation that hung (a replacement may have taken over meanwhile).
  if (diagnosis.suspects.empty() || coordinator_->generation() != generation) return;
  if (2 * diagnosis.suspects.size() >= static_cast<size_t>(config_.nproc)) {
    Say("hang diagnosis: too many suspects to replace; the ranks' own timeouts decide");
    return;
  }
  for (int rank : diagnosis.suspects) {
    for (auto& c : children_) {
      if (c->rank != rank || !c->running || c->killed_for_liveness) continue;
      Say(absl::StrFormat("%s (pid %d) is the hang's suspect: killing it", c->Label(), c->pid));
      c->killed_for_liveness = true;
      kill(c->pid, SIGKILL);  // reaped and replaced like any dead rank
    }
  }
}

// Ranks whose communicators failed ask for a new generation (RendezvousMember::
// RequestNewGeneration). When one died, its replacement's generation answers them; otherwise (a
// dropped connection, a hang declared on a healthy job) nobody else would publish one, and the job
// would wait until the heartbeats ran out. So the generation is renewed with the same members as
// soon as every rank has asked, or kRenewalGrace after the first did: a rank that does not ask may
// be dead or stopped, and its death, or the diagnosis of a hang, comes first.
void Job::RenewGenerationWhenAsked() {
  constexpr absl::Duration kRenewalGrace = absl::Seconds(1);
  if (!dead_.empty() || pending_hang_.has_value()) return;
  for (const auto& c : children_) {
    if (c->killed_for_liveness && c->running) return;  // its death, about to be reaped, comes first
  }
  const int64_t generation = coordinator_->generation();
  absl::StatusOr<std::map<int, std::string>> asked =
      coordinator_->NewGenerationRequests(kStoreTimeout);
  if (!asked.ok() || asked->empty()) return;  // the store briefly unreachable: look again next time
  const absl::Time now = absl::Now();
  if (!renewal_asked_.has_value() || renewal_asked_->generation != generation) {
    renewal_asked_ = RenewalAsked{generation, now};
    const auto& [rank, why] = *asked->begin();
    Say(absl::StrFormat("rank %d asks for a new generation: %s", rank, why));
  }
  if (asked->size() < static_cast<size_t>(config_.nproc) &&
      now < renewal_asked_->since + kRenewalGrace) {
    return;
  }
  absl::StatusOr<Membership> next = coordinator_->RenewGeneration(kStoreTimeout);
  if (!next.ok()) {
    Say(absl::StrCat("renewing generation ", generation, ": ", next.status().ToString()));
    return;  // tried again next time
  }
  std::vector<int> ranks;
  for (const auto& [rank, why] : *asked) ranks.push_back(rank);
  Say(absl::StrFormat("generation %d renewed with the same ranks (asked by %s)", next->generation,
                      absl::StrJoin(ranks, ",")));
  recoveries_.push_back({-1, next->generation, renewal_asked_->since});
}

void Job::Fail(const std::string& why) {
  Say(absl::StrCat("job failed: ", why));
  exit_code_ = kExitJobFailed;
}

void Job::StopAll(absl::Duration grace) {
  for (auto& c : children_) {
    if (c->running) kill(c->pid, SIGTERM);
  }
  const absl::Time deadline = absl::Now() + grace;
  bool any = true;
  while (any) {
    any = false;
    for (auto& c : children_) {
      if (!c->running) continue;
      int status = 0;
      if (waitpid(c->pid, &status, WNOHANG) == c->pid) {
        c->running = false;
        Pump(*c, /*flush=*/true);
        continue;
      }
      Pump(*c, /*flush=*/false);
      any = true;
      if (absl::Now() >= deadline) kill(c->pid, SIGKILL);
    }
    if (any) absl::SleepFor(absl::Milliseconds(10));  // bounded: SIGKILL after the grace period
  }
}

int Job::Run() {
  sigset_t signals;
  sigemptyset(&signals);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM}) sigaddset(&signals, sig);
  // Blocked before any thread starts, so every thread inherits the mask and the signalfd sees them.
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  if (absl::Status s = Prepare(); !s.ok()) {
    Say(absl::StrCat("cannot start the job: ", s.ToString()));
    return kExitLaunchError;
  }
  Say(absl::StrFormat("job %s: %d ranks, %d standbys, store %s, run dir %s", config_.job_id,
                      config_.nproc, config_.standby, store_url_, config_.run_dir));
  for (int r = 0; r < config_.nproc; ++r) {
    if (absl::Status s = Spawn(r, -1); !s.ok()) {
      Say(s.ToString());
      StopAll(config_.stop_grace);
      return kExitLaunchError;
    }
  }
  for (int i = 0; i < config_.standby; ++i) {
    if (absl::Status s = Spawn(-1, i); !s.ok()) {
      Say(s.ToString());
      StopAll(config_.stop_grace);
      return kExitLaunchError;
    }
  }
  former_ = std::thread([this] {
    const absl::Time deadline = absl::Now() + config_.rendezvous_timeout;
    absl::StatusOr<Membership> m = absl::DeadlineExceededError("not started");
    // Short slices, so that a failing job does not keep this thread waiting for the full timeout.
    while (!stop_forming_.load() && absl::Now() < deadline) {
      m = coordinator_->FormInitialGeneration(config_.nproc, absl::Milliseconds(250));
      if (!absl::IsDeadlineExceeded(m.status())) break;
    }
    MutexLock lock(&formed_mu_);
    formed_ = m.status();
  });

  bool formed_reported = false;
  int interrupted = 0;
  while (exit_code_ < 0) {
    std::vector<pollfd> fds = {{signal_fd_, POLLIN, 0}};
    std::vector<Child*> owners = {nullptr};
    for (auto& c : children_) {
      if (c->out_fd >= 0) {
        fds.push_back({c->out_fd, POLLIN, 0});
        owners.push_back(c.get());
      }
    }
    poll(fds.data(), fds.size(), 100);
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) Pump(*owners[i], /*flush=*/false);
    }
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info;
      while (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
        if (info.ssi_signo == SIGCHLD) continue;  // reaped below
        interrupted = static_cast<int>(info.ssi_signo);
      }
    }
    Reap();
    if (interrupted != 0) {
      Say(absl::StrFormat("interrupted by SIG%s; stopping the job", sigabbrev_np(interrupted)));
      exit_code_ = 128 + interrupted;
      break;
    }
    if (!formed_reported) {
      MutexLock lock(&formed_mu_);
      if (formed_.has_value()) {
        formed_reported = true;
        if (formed_->ok()) {
          Say(absl::StrFormat("generation 0 formed with %d ranks", config_.nproc));
        } else {
          exit_code_ = kExitJobFailed;
          Say(absl::StrCat("job failed: generation 0 did not form: ", formed_->ToString()));
        }
      }
    }
    TryReplacements();
    CheckRecoveries();
    if (formed_reported && exit_code_ < 0 && dead_.empty()) KillRanksWithStaleHeartbeats();
    if (formed_reported && exit_code_ < 0) DiagnoseHangs();
    if (formed_reported && exit_code_ < 0) RenewGenerationWhenAsked();
    if (exit_code_ < 0 && ranks_finished_ == config_.nproc) exit_code_ = 0;
  }
  StopAll(config_.stop_grace);
  stop_forming_.store(true);
  former_.join();
  if (exit_code_ == 0) {
    // The ranks' snapshot arenas outlive them so that a replacement (or a restarted job) on this
    // machine restores without disk; once the job is done they only hold memory.
    // The same for the flight-recorder rings, the evidence of a hung or dead rank.
    for (int r = 0; r < config_.nproc; ++r) {
      (void)Snapshotter::RemoveArena(config_.job_id, r);
      (void)FlightRecorder::Remove(config_.job_id, r);
    }
    Say(absl::StrFormat("job %s succeeded: %d ranks finished, %d replacement(s)", config_.job_id,
                        config_.nproc, replacements_));
  }
  return exit_code_;
}

absl::StatusOr<int> ParseCount(const std::string& flag, const std::string& value, int minimum) {
  int n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < minimum) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s '%s': need an integer >= %d", flag, value, minimum));
  }
  return n;
}

}  // namespace

std::string RunUsage() {
  return "usage: trainguard run --nproc N [--standby K] [--max-replacements M]\n"
         "                      [--store tcp://HOST:PORT --token-file F | --store "
         "etcd://HOST:PORT]\n"
         "                      [--job-id ID] [--run-dir DIR] [--rendezvous-timeout SECONDS]\n"
         "                      [--heartbeat-timeout SECONDS]\n"
         "                      -- COMMAND [ARGS...]\n";
}

absl::StatusOr<LaunchConfig> ParseRunArguments(const std::vector<std::string>& args) {
  LaunchConfig config;
  size_t i = 0;
  for (; i < args.size() && args[i] != "--"; ++i) {
    const std::string& flag = args[i];
    if (i + 1 >= args.size() || args[i + 1] == "--") {
      return absl::InvalidArgumentError(absl::StrCat(flag, " needs a value"));
    }
    const std::string& value = args[++i];
    absl::StatusOr<int> n = 0;
    if (flag == "--nproc") {
      n = ParseCount(flag, value, 1);
      config.nproc = n.value_or(0);
    } else if (flag == "--standby") {
      n = ParseCount(flag, value, 0);
      config.standby = n.value_or(0);
    } else if (flag == "--max-replacements") {
      n = ParseCount(flag, value, 0);
      config.max_replacements = n.value_or(0);
    } else if (flag == "--heartbeat-timeout") {
      n = ParseCount(flag, value, 1);
      config.heartbeat_timeout = absl::Seconds(n.value_or(1));
    } else if (flag == "--rendezvous-timeout") {
      n = ParseCount(flag, value, 1);
      config.rendezvous_timeout = absl::Seconds(n.value_or(1));
    } else if (flag == "--store") {
      config.store = value;
    } else if (flag == "--token-file") {
      config.token_file = value;
    } else if (flag == "--job-id") {
      config.job_id = value;
    } else if (flag == "--run-dir") {
      config.run_dir = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", flag));
    }
    if (!n.ok()) return n.status();
  }
  if (i < args.size()) config.command.assign(args.begin() + i + 1, args.end());
  if (config.nproc < 1) return absl::InvalidArgumentError("--nproc N is required");
  if (config.command.empty()) return absl::InvalidArgumentError("no command after --");
  if (config.job_id.empty()) config.job_id = absl::StrCat("job-", getpid());
  if (config.run_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");  // NOLINT(concurrency-mt-unsafe): before any thread
    config.run_dir =
        absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/trainguard/", config.job_id);
  }
  return config;
}

int RunJob(const LaunchConfig& config) {
  Job job(config);
  return job.Run();
}

}  // namespace trainguard::tools
