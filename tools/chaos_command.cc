// `trainguard chaos`: see chaos_command.h.
#include "tools/chaos_command.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "sdk/checkpoint/snapshotter.h"
#include "sdk/core/event_log.h"
#include "sdk/core/proc_stat.h"
#include "sdk/watchdog/flight_recorder.h"
#include "tools/chaos_report.h"
#include "tools/usage.h"
#include "trainguard/env.h"
#include "trainguard/events.h"

extern char** environ;

namespace trainguard::tools {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
// How long a fault waits for its rank to have a process it may signal (a replacement taking over).
constexpr absl::Duration kTargetPatience = absl::Seconds(10);
// How long a job stopped at --duration, or waited for with --wait-for-exit, may take to end.
constexpr absl::Duration kStopPatience = absl::Seconds(60);
constexpr absl::Duration kExitPatience = absl::Minutes(10);
constexpr absl::Duration kFormationPatience = absl::Minutes(5);

// SplitMix64: a tiny, fully specified generator, so a seed means the same schedule everywhere
// (std:: distributions differ between standard libraries).
class ScheduleRandom {
 public:
  explicit ScheduleRandom(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1p-53; }

 private:
  uint64_t state_;
};

struct ChaosConfig {
  int nproc = 4;
  int standby = 2;
  absl::Duration duration = absl::Minutes(10);
  absl::Duration mean_interval = absl::Seconds(20);
  uint64_t seed = 1;
  std::vector<std::pair<std::string, int>> mix = {{"kill", 1}, {"stop", 1}, {"nan", 1}};
  std::vector<std::string> modes = {"trainguard", "baseline"};
  std::string run_dir;
  int heartbeat_timeout_s = 5;
  int checkpoint_every_steps = 50;
  int snapshot_every_steps = 0;  // 0: checkpoint_every_steps / 10 (at least 1)
  bool wait_for_exit = false;
  std::string png;
  std::vector<std::string> command;
};

std::string SelfExe() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return n > 0 ? std::string(path, static_cast<size_t>(n)) : "trainguard";
}

// The example trainer beside this binary (the build tree's, or an install's bin/).
std::string FindExampleTrainer() {
  const std::string self = SelfExe();
  const std::string dir = self.substr(0, self.rfind('/'));
  for (const std::string& candidate :
       {dir + "/../examples/cpp_trainer/cpp_trainer", dir + "/cpp_trainer"}) {
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// /proc/<pid>/stat's state letter and parent pid; false if there is no such process.
bool ReadStat(pid_t pid, char* state, pid_t* parent) {
  absl::StatusOr<ProcStat> stat = ReadProcStat(pid);
  if (!stat.ok()) return false;
  *state = stat->state;
  *parent = stat->ppid;
  return true;
}

// A pidfd for rank `rank`'s process, which must be a running child of `launcher`. The pidfd is
// opened before the check, so the process checked is the one a later signal reaches.
absl::StatusOr<int> OpenOwnRank(const std::string& run_dir, int rank, pid_t launcher) {
  const std::string pid_file = absl::StrCat(run_dir, "/pids/rank-", rank);
  absl::StatusOr<std::string> text = Env::Default()->ReadFileToString(pid_file);
  if (!text.ok()) return text.status();
  int64_t pid = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &pid) || pid <= 1) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s holds no valid pid ('%s')", pid_file, *text));
  }
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrFormat("rank %d's pid %d (%s): %s", rank, pid, pid_file, strerror(errno)));
  }
  char state = 0;
  pid_t parent = 0;
  if (!ReadStat(static_cast<pid_t>(pid), &state, &parent) || parent != launcher) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "rank %d's pid %d is not a child of this run's launcher (pid %d)", rank, pid, launcher));
  }
  if (state == 'T' || state == 't' || state == 'Z' || state == 'X') {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrFormat("rank %d's pid %d is not running (state %c)", rank, pid, state));
  }
  return fd;
}

int SignalFor(const std::string& kind) {
  if (kind == "kill") return SIGKILL;
  if (kind == "stop") return SIGSTOP;
  if (kind == "drop") return SIGURG;
  return SIGUSR1;  // nan
}

// nan and drop are the trainer's own hooks on SIGUSR1 and SIGURG: a process that has not installed
// its handler yet (still starting: an interpreter importing torch) would die of SIGUSR1 or ignore
// SIGURG, neither of which is the fault planned. FailedPrecondition until the handler is there.
absl::Status CheckHookInstalled(const std::string& kind, int rank, pid_t pid) {
  if (kind != "nan" && kind != "drop") return absl::OkStatus();
  const int sig = SignalFor(kind);
  absl::StatusOr<uint64_t> caught =
      ReadStatusSignalMask(absl::StrCat("/proc/", pid, "/status"), "SigCgt");
  if (!caught.ok()) return caught.status();
  if (((*caught >> (sig - 1)) & 1) != 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "rank %d's pid %d does not handle SIG%s (yet): its %s hook is not installed", rank, pid,
      sigabbrev_np(sig), kind));
}

// One run: its launcher, its faults, its end.
class ChaosRun {
 public:
  ChaosRun(const ChaosConfig& config, std::string mode, std::vector<PlannedFault> plan)
      : config_(config), mode_(std::move(mode)), plan_(std::move(plan)),
        run_dir_(absl::StrCat(config.run_dir, "/", mode_)) {}
  ChaosRun(const ChaosRun&) = delete;
  ChaosRun& operator=(const ChaosRun&) = delete;
  // The launcher is never left behind: stopped, then killed, and reaped.
  ~ChaosRun() {
    if (launcher_ > 0 && !exit_status_.has_value()) {
      kill(launcher_, SIGKILL);
      waitpid(launcher_, nullptr, 0);
    }
  }

  // Returns the launcher's exit status (-1: it could not be started).
  int Run();

 private:
  absl::Status StartLauncher();
  void Record(int rank, EventKind what, const std::string& message,
              std::vector<std::pair<std::string, std::string>> attributes);
  // Waits until `when` or the launcher's exit; true if it is still running.
  bool WaitUntil(absl::Time when);
  void Inject(const PlannedFault& fault);
  bool Reap(int options);
  // Waits (bounded) until the launcher says generation 0 formed: the schedule's clock starts then,
  // so that a fault never lands before the job exists (a rank lost before generation 0 fails the
  // job by design) and both runs meet their faults at the same point of training.
  absl::Status WaitForFormation();
  void Say(const std::string& line) {
    std::printf("trainguard chaos [%s]: %s\n", mode_.c_str(), line.c_str());
    std::fflush(stdout);
  }

  const ChaosConfig& config_;
  const std::string mode_;
  const std::vector<PlannedFault> plan_;
  const std::string run_dir_;
  std::unique_ptr<EventLog> events_;
  pid_t launcher_ = -1;
  std::optional<int> exit_status_;
  absl::Time start_;
  const std::string job_id_ = absl::StrCat("chaos-", mode_, "-", getpid());
};

void ChaosRun::Record(int rank, EventKind what, const std::string& message,
                      std::vector<std::pair<std::string, std::string>> attributes) {
  if (absl::Status s = AppendChaosEvent(events_.get(), rank, what, message, std::move(attributes));
      !s.ok()) {
    Say(s.ToString());
  }
}

bool ChaosRun::Reap(int options) {
  if (exit_status_.has_value()) return true;
  int status = 0;
  if (waitpid(launcher_, &status, options) != launcher_) return false;
  exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return true;
}

absl::Status ChaosRun::StartLauncher() {
  std::vector<std::string> args = {SelfExe(),
                                   "run",
                                   "--nproc",
                                   absl::StrCat(config_.nproc),
                                   "--run-dir",
                                   run_dir_,
                                   "--job-id",
                                   job_id_,
                                   "--heartbeat-timeout",
                                   absl::StrCat(config_.heartbeat_timeout_s)};
  // Both write a checkpoint to disk every --checkpoint-every-steps steps. trainguard also keeps
  // in-memory snapshots every --snapshot-every-steps (by default ten times as often: what its
  // replacements restore); the baseline, like torchrun, has only the disk.
  const int every = config_.checkpoint_every_steps;
  std::vector<std::pair<std::string, std::string>> env;
  if (mode_ == "baseline") {
    args.insert(args.end(), {"--restart-all", "100000"});
    env = {{"TRAINGUARD_CHECKPOINT_EVERY_STEPS", absl::StrCat(every)},
           {"TRAINGUARD_CHECKPOINT_PERSIST_EVERY", "1"}};
  } else {
    // Faults arrive at random: a rank hit twice within a minute is not in a crash loop.
    args.insert(args.end(), {"--standby", absl::StrCat(config_.standby), "--max-replacements",
                             "100000", "--restart-backoff", "0"});
    const int snapshot_every =
        config_.snapshot_every_steps > 0 ? config_.snapshot_every_steps : std::max(1, every / 10);
    env = {{"TRAINGUARD_CHECKPOINT_EVERY_STEPS", absl::StrCat(snapshot_every)},
           {"TRAINGUARD_CHECKPOINT_PERSIST_EVERY", absl::StrCat(std::max(1, every / snapshot_every))}};
  }
  args.push_back("--");
  args.insert(args.end(), config_.command.begin(), config_.command.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string out_path = run_dir_ + "/launcher.out";
  const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) return absl::InternalError(absl::StrCat("open ", out_path, ": ", strerror(errno)));
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(out);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // the job ends with this command
    if (getppid() != parent) _exit(127);
    for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
    dup2(out, STDOUT_FILENO);
    dup2(out, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out);
  launcher_ = pid;
  Say(absl::StrFormat("launcher pid %d: %s (output in %s)", pid, absl::StrJoin(args, " "),
                      out_path));
  // The SDK options this command's environment sets (TRAINGUARD_WATCHDOG_FLOOR_MS...) shape the
  // figures as much as the flags do: a report is read with them.
  std::vector<std::string> inherited;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var(*e);
    if (!absl::StartsWith(var, "TRAINGUARD_")) continue;
    const std::string name = var.substr(0, var.find('='));
    const bool ours = std::any_of(env.begin(), env.end(),
                                  [&](const auto& set) { return set.first == name; });
    if (!ours) inherited.push_back(var);
  }
  std::sort(inherited.begin(), inherited.end());
  Say(absl::StrCat("SDK options from the environment: ",
                   inherited.empty() ? "none (the defaults)" : absl::StrJoin(inherited, " ")));
  return absl::OkStatus();
}

absl::Status ChaosRun::WaitForFormation() {
  const std::string out_path = run_dir_ + "/launcher.out";
  const absl::Time deadline = absl::Now() + kFormationPatience;
  while (WaitUntil(absl::Now() + absl::Milliseconds(100))) {
    absl::StatusOr<std::string> out = Env::Default()->ReadFileToString(out_path);
    if (out.ok() && absl::StrContains(*out, "trainguard run: generation 0 formed")) {
      return absl::OkStatus();
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "generation 0 of the %s run did not form within %s (see %s)", mode_,
          absl::FormatDuration(kFormationPatience), out_path));
    }
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "the %s run's launcher exited with status %d before generation 0 formed (see %s)", mode_,
      *exit_status_, out_path));
}

bool ChaosRun::WaitUntil(absl::Time when) {
  while (true) {
    if (Reap(WNOHANG)) return false;
    const absl::Duration left = when - absl::Now();
    if (left <= absl::ZeroDuration()) return true;
    absl::SleepFor(std::min(left, absl::Milliseconds(100)));  // bounded: `when` is finite
  }
}

void ChaosRun::Inject(const PlannedFault& fault) {
  const absl::Time give_up = absl::Now() + kTargetPatience;
  absl::Status last;
  while (true) {
    absl::StatusOr<int> fd = OpenOwnRank(run_dir_, fault.rank, launcher_);
    pid_t pid = -1;
    if (fd.ok()) {
      // The pid as the kernel knows the pidfd's process (the file may be rewritten meanwhile).
      absl::StatusOr<std::string> fdinfo =
          Env::Default()->ReadFileToString(absl::StrCat("/proc/self/fdinfo/", *fd));
      if (fdinfo.ok()) {
        for (absl::string_view line : absl::StrSplit(*fdinfo, '\n')) {
          if (absl::ConsumePrefix(&line, "Pid:")) {
            int64_t p = 0;
            if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &p)) pid = static_cast<pid_t>(p);
          }
        }
      }
      if (absl::Status hooked = CheckHookInstalled(fault.kind, fault.rank, pid); !hooked.ok()) {
        close(*fd);
        fd = hooked;
      }
    }
    if (fd.ok()) {
      // The ground truth first: a report must never miss a fault that was done.
      Record(fault.rank, EventKind::kChaosInject,
             absl::StrFormat("%s rank %d (pid %d)", fault.kind, fault.rank, pid),
             {{"kind", fault.kind},
              {"pid", absl::StrCat(pid)},
              {"planned_at_ms", absl::StrCat(absl::ToInt64Milliseconds(fault.at))}});
      const int sig = SignalFor(fault.kind);
      if (syscall(SYS_pidfd_send_signal, *fd, sig, nullptr, 0) != 0) {
        Say(absl::StrFormat("signal %d to rank %d (pid %d): %s", sig, fault.rank, pid,
                            strerror(errno)));
      } else {
        Say(absl::StrFormat("%s: rank %d (pid %d) at %.1f s", fault.kind, fault.rank, pid,
                            absl::ToDoubleSeconds(absl::Now() - start_)));
      }
      close(*fd);
      return;
    }
    last = fd.status();
    if (absl::Now() >= give_up || !WaitUntil(absl::Now() + absl::Milliseconds(200))) break;
  }
  Say(absl::StrFormat("%s rank %d skipped: %s", fault.kind, fault.rank, last.ToString()));
  Record(fault.rank, EventKind::kChaosSkip, std::string(last.message()), {{"kind", fault.kind}});
}

int ChaosRun::Run() {
  if (absl::Status s = Env::Default()->CreateDirs(run_dir_); !s.ok()) {
    Say(s.ToString());
    return -1;
  }
  absl::StatusOr<std::unique_ptr<EventLog>> events =
      EventLog::Open(Env::Default(), run_dir_ + "/events/chaos.tgev");
  if (!events.ok()) {
    Say(events.status().ToString());
    return -1;
  }
  events_ = *std::move(events);
  if (absl::Status s = StartLauncher(); !s.ok()) {
    Say(s.ToString());
    return -1;
  }
  if (absl::Status s = WaitForFormation(); !s.ok()) {
    Say(s.ToString());
    kill(launcher_, SIGINT);  // an unreaped child: the pid is still ours
    if (WaitUntil(absl::Now() + kStopPatience)) kill(launcher_, SIGKILL);
    Reap(0);
    return -1;
  }
  start_ = absl::Now();
  Record(-1, EventKind::kChaosRunStart, absl::StrCat(mode_, " run"),
         {{"mode", mode_},
          {"seed", absl::StrCat(config_.seed)},
          {"duration_s", absl::StrCat(absl::ToDoubleSeconds(config_.duration))},
          {"mean_interval_s", absl::StrCat(absl::ToDoubleSeconds(config_.mean_interval))},
          {"nproc", absl::StrCat(config_.nproc)},
          {"launcher_pid", absl::StrCat(launcher_)}});
  for (const PlannedFault& fault : plan_) {
    if (!WaitUntil(start_ + fault.at)) break;
    Inject(fault);
  }
  if (config_.wait_for_exit) {
    WaitUntil(start_ + config_.duration);
    if (WaitUntil(absl::Now() + kExitPatience)) {
      Say("the job did not end within 10 minutes: stopping it");
      kill(launcher_, SIGINT);  // an unreaped child: the pid is still ours
    }
    Record(-1, EventKind::kChaosRunEnd, "the job ended", {});
  } else if (WaitUntil(start_ + config_.duration)) {
    Record(-1, EventKind::kChaosRunEnd, "the run's duration is over: stopping the job", {});
    kill(launcher_, SIGINT);  // an unreaped child: the pid is still ours
  } else {
    Record(-1, EventKind::kChaosRunEnd, "the job ended before the run's duration", {});
  }
  if (WaitUntil(absl::Now() + kStopPatience)) {
    Say("the launcher did not stop within 60 s of SIGINT: killing it");
    kill(launcher_, SIGKILL);
  }
  Reap(0);
  Say(absl::StrFormat("launcher exited with status %d", *exit_status_));
  // A launcher that was stopped keeps the ranks' shared memory for a restart; a chaos run is over.
  for (int r = 0; r < config_.nproc; ++r) {
    (void)Snapshotter::RemoveArena(job_id_, r);
    (void)FlightRecorder::Remove(job_id_, r);
  }
  return *exit_status_;
}

absl::StatusOr<absl::Duration> ParsePositiveDuration(const std::string& flag,
                                                     const std::string& value) {
  absl::Duration d;
  if (!absl::ParseDuration(value, &d) || d <= absl::ZeroDuration()) {
    // A bare number is seconds.
    double seconds = 0;
    if (!absl::SimpleAtod(value, &seconds) || !(seconds > 0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s '%s': need a positive duration (20s, 10m, 1.5h)", flag, value));
    }
    d = absl::Seconds(seconds);
  }
  return d;
}

absl::StatusOr<ChaosConfig> ParseChaosArguments(const std::vector<std::string>& args) {
  ChaosConfig config;
  size_t i = 0;
  for (; i < args.size() && args[i] != "--"; ++i) {
    const std::string& flag = args[i];
    if (flag == "--wait-for-exit") {
      config.wait_for_exit = true;
      continue;
    }
    if (i + 1 >= args.size() || args[i + 1] == "--") {
      return absl::InvalidArgumentError(absl::StrCat(flag, " needs a value"));
    }
    const std::string& value = args[++i];
    int n = 0;
    auto count = [&](int minimum) -> absl::Status {
      if (!absl::SimpleAtoi(value, &n) || n < minimum) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s '%s': need an integer >= %d", flag, value, minimum));
      }
      return absl::OkStatus();
    };
    absl::Status status;
    if (flag == "--nproc") {
      status = count(2);
      config.nproc = n;
    } else if (flag == "--standby") {
      status = count(1);
      config.standby = n;
    } else if (flag == "--duration" || flag == "--mean-interval") {
      absl::StatusOr<absl::Duration> d = ParsePositiveDuration(flag, value);
      if (!d.ok()) return d.status();
      (flag == "--duration" ? config.duration : config.mean_interval) = *d;
    } else if (flag == "--seed") {
      if (!absl::SimpleAtoi(value, &config.seed)) {
        return absl::InvalidArgumentError(absl::StrFormat("--seed '%s': need an integer", value));
      }
    } else if (flag == "--mix") {
      absl::StatusOr<std::vector<std::pair<std::string, int>>> mix = ParseMix(value);
      if (!mix.ok()) return mix.status();
      config.mix = *std::move(mix);
    } else if (flag == "--mode") {
      absl::StatusOr<std::vector<std::string>> modes = ParseModes(value);
      if (!modes.ok()) return modes.status();
      config.modes = *std::move(modes);
    } else if (flag == "--run-dir") {
      config.run_dir = value;
    } else if (flag == "--heartbeat-timeout") {
      status = count(1);
      config.heartbeat_timeout_s = n;
    } else if (flag == "--checkpoint-every-steps") {
      status = count(1);
      config.checkpoint_every_steps = n;
    } else if (flag == "--snapshot-every-steps") {
      status = count(1);
      config.snapshot_every_steps = n;
    } else if (flag == "--png") {
      config.png = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", flag));
    }
    if (!status.ok()) return status;
  }
  if (i < args.size()) config.command.assign(args.begin() + i + 1, args.end());
  if (config.command.empty()) {
    const std::string trainer = FindExampleTrainer();
    if (trainer.empty()) {
      return absl::InvalidArgumentError(
          "no COMMAND after -- and no example trainer (cpp_trainer) beside this binary");
    }
    config.command = {trainer,          "--steps",           "1000000000", "--step-time-ms", "50",
                      "--print-every",  "100",               "--progress-events", "1",
                      "--nan-on-sigusr1", "1",               "--drop-on-sigurg", "1"};
  }
  if (config.run_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");  // NOLINT(concurrency-mt-unsafe): one thread
    config.run_dir = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                  "/trainguard-chaos-", getpid());
  }
  return config;
}

constexpr char kChaosHelp[] =
    "\n"
    "Runs COMMAND (default: the example trainer) as N ranks under `trainguard run` for\n"
    "--duration while injecting faults at Poisson arrivals of mean --mean-interval, drawn from\n"
    "--seed: kill (SIGKILL a rank), stop (SIGSTOP: a hung rank), nan (SIGUSR1: a NaN in the\n"
    "rank's gradient; the trainer must handle it, as cpp_trainer --nan-on-sigusr1 1 does),\n"
    "drop (SIGURG: the rank closes its connections before its next allreduce, as cpp_trainer\n"
    "--drop-on-sigurg 1 does; ignored by a command that does not handle it),\n"
    "weighted by --mix. Every injection is written to the run's events (events/chaos.tgev,\n"
    "what=chaos_inject: kind, rank, pid) before it is done; only running children of the run's\n"
    "launcher are signalled. --mode both (default) runs trainguard's recovery (warm standbys,\n"
    "survivors kept) and then the baseline (--restart-all: every rank restarts from the newest\n"
    "checkpoint on disk, as torchrun does) on the same schedule, in DIR/trainguard and\n"
    "DIR/baseline, and prints `trainguard report DIR` (also written to DIR/report.txt and\n"
    "DIR/report.json; --png FILE plots it). --wait-for-exit injects for --duration and then waits\n"
    "for the job to finish by itself instead of stopping it.\n"
    "\n"
    "Defaults: --nproc 4 --standby 2 --duration 10m --mean-interval 20s --seed 1\n"
    "--mix kill=1,stop=1,nan=1 --heartbeat-timeout 5 --checkpoint-every-steps 50\n"
    "--snapshot-every-steps (checkpoint-every-steps / 10, at least 1).\n"
    "\n"
    "Exit status: 0 every run ran (with --wait-for-exit: and its job succeeded); 1 a run could\n"
    "not be started or its job failed; 2 bad usage.\n";

}  // namespace

std::vector<PlannedFault> PlanFaults(uint64_t seed, absl::Duration mean_interval,
                                     absl::Duration duration,
                                     const std::vector<std::pair<std::string, int>>& mix,
                                     int nproc) {
  ScheduleRandom random(seed);
  int total = 0;
  for (const auto& [kind, weight] : mix) total += weight;
  std::vector<PlannedFault> plan;
  absl::Duration at = absl::ZeroDuration();
  while (true) {
    at += mean_interval * -std::log1p(-random.Uniform());
    if (at >= duration) break;
    int pick = static_cast<int>(random.Next() % static_cast<uint64_t>(total));
    std::string kind;
    for (const auto& [k, weight] : mix) {
      if (pick < weight) {
        kind = k;
        break;
      }
      pick -= weight;
    }
    const int rank = static_cast<int>(random.Next() % static_cast<uint64_t>(nproc));
    plan.push_back({at, kind, rank});
  }
  return plan;
}

absl::StatusOr<std::vector<std::string>> ParseModes(const std::string& text) {
  if (text == "both") return std::vector<std::string>{"trainguard", "baseline"};
  if (text == "trainguard" || text == "baseline") return std::vector<std::string>{text};
  return absl::InvalidArgumentError(
      absl::StrFormat("--mode '%s': need both, trainguard or baseline", text));
}

absl::StatusOr<std::vector<std::pair<std::string, int>>> ParseMix(const std::string& text,
                                                                  bool host_kinds) {
  std::vector<std::pair<std::string, int>> mix;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    int weight = 0;
    const bool host_kind = kv.first == "host_kill" || kv.first == "partition";
    if (host_kind && !host_kinds) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--mix: '%s' needs several hosts: run bench_chaos_hosts (simulated hosts) for it",
          kv.first));
    }
    if (kv.first != "kill" && kv.first != "stop" && kv.first != "nan" && kv.first != "drop" &&
        !host_kind) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--mix: unknown fault kind '%s' (kinds: kill, stop, nan, drop%s)", kv.first,
          host_kinds ? ", host_kill, partition" : ""));
    }
    if (!absl::SimpleAtoi(kv.second, &weight) || weight < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--mix: '%s' needs a weight >= 0 (kind=WEIGHT)", std::string(item)));
    }
    if (weight > 0) mix.emplace_back(kv.first, weight);
  }
  if (mix.empty()) return absl::InvalidArgumentError("--mix: no fault kind with a weight > 0");
  return mix;
}

std::string ChaosUsage() {
  return "usage: trainguard chaos [--nproc N] [--standby K] [--duration 10m] [--mean-interval "
         "20s]\n"
         "                        [--seed S] [--mix kill=1,stop=1,nan=1]\n"
         "                        [--mode both|trainguard|baseline] [--run-dir DIR]\n"
         "                        [--heartbeat-timeout SECONDS] [--checkpoint-every-steps N]\n"
         "                        [--snapshot-every-steps N] [--wait-for-exit] [--png FILE]\n"
         "                        [-- COMMAND...]\n";
}

absl::Status AppendChaosEvent(EventLog* events, int rank, EventKind what,
                              const std::string& message,
                              std::vector<std::pair<std::string, std::string>> attributes) {
  Event event = EventOfKind(what, message);
  event.time = absl::Now();
  event.rank = rank;
  event.attributes.emplace_back("source", "chaos");
  event.attributes.insert(event.attributes.end(), attributes.begin(), attributes.end());
  return events->Append(event);
}

int RunChaosCommand(const std::vector<std::string>& args) {
  if (AsksForHelp(args)) {
    std::printf("%s%s", ChaosUsage().c_str(), kChaosHelp);
    return kExitOk;
  }
  absl::StatusOr<ChaosConfig> config = ParseChaosArguments(args);
  if (!config.ok()) {
    std::fprintf(stderr, "trainguard chaos: %s\n%s", std::string(config.status().message()).c_str(),
                 ChaosUsage().c_str());
    return kExitUsage;
  }
  const std::vector<PlannedFault> plan = PlanFaults(
      config->seed, config->mean_interval, config->duration, config->mix, config->nproc);
  std::vector<std::string> planned;
  for (const PlannedFault& f : plan) {
    planned.push_back(absl::StrFormat("%.1fs %s rank %d", absl::ToDoubleSeconds(f.at), f.kind,
                                      f.rank));
  }
  std::printf("%s", absl::StrFormat("trainguard chaos: %d faults planned over %s (seed %d): %s\n",
                                    plan.size(), absl::FormatDuration(config->duration),
                                    config->seed, absl::StrJoin(planned, ", "))
                        .c_str());
  int rc = kExitOk;
  for (const std::string& mode : config->modes) {
    ChaosRun run(*config, mode, plan);
    const int status = run.Run();
    const bool expected = config->wait_for_exit ? status == 0 : (status == 0 || status == 128 + SIGINT);
    if (!expected) rc = kExitFailed;
  }
  std::vector<std::string> report_args = {config->run_dir};
  if (!config->png.empty()) report_args.insert(report_args.end(), {"--png", config->png});
  std::fflush(stdout);
  if (RunReportCommand(report_args) != 0) rc = kExitFailed;
  // The same, kept with the runs.
  std::vector<RunAnalysis> runs;
  for (const std::string& mode : config->modes) {
    absl::StatusOr<std::vector<Event>> events = ReadRunEvents(config->run_dir + "/" + mode);
    if (events.ok()) runs.push_back(AnalyzeRun(*std::move(events)));
  }
  for (const auto& [name, text] : {std::pair<std::string, std::string>{"report.txt", FormatReport(runs)},
                                   {"report.json", ReportJson(runs)}}) {
    FILE* f = std::fopen((config->run_dir + "/" + name).c_str(), "w");
    if (f == nullptr) continue;
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  return rc;
}

}  // namespace trainguard::tools
