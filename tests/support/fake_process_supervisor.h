// FakeProcessSupervisor: a ProcessSupervisor (sdk/agent/process_supervisor.h) whose workers are
// not processes. It records every spawn, signal and pid file, and a test decides what the workers
// do: Print a line, Stop, Continue, Exit. Poll hands over what the test made happen, in that
// order, at once: it never waits, sleeps or starts a thread, whatever the timeout.
//
// A signal is only recorded unless the options make it act as its default action would (SIGKILL,
// SIGTERM, SIGINT, SIGHUP: the worker is killed by it; SIGSTOP, SIGTSTP: stopped; SIGCONT:
// continued), which a test of what follows a kill wants.
//
// Header-only (no gtest). Thread safety: not thread-safe, as the interface.
#ifndef TRAINGUARD_TESTS_SUPPORT_FAKE_PROCESS_SUPERVISOR_H_
#define TRAINGUARD_TESTS_SUPPORT_FAKE_PROCESS_SUPERVISOR_H_

#include <signal.h>
#include <sys/types.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "sdk/agent/process_supervisor.h"

namespace trainguard::testing {

struct FakeProcessSupervisorOptions {
  // Signal applies the signal's default action at once (see above) besides recording it.
  bool signals_act = false;
  // The pid of the first worker; each next one gets the next pid.
  pid_t first_pid = 1000;
};

class FakeProcessSupervisor final : public ProcessSupervisor {
 public:
  struct Spawned {
    WorkerId worker;
    pid_t pid;
    WorkerSpec spec;
  };
  struct Sent {
    WorkerId worker;
    int signal;
  };

  explicit FakeProcessSupervisor(FakeProcessSupervisorOptions options = {}) : options_(options) {}

  // ---- What the test makes happen ----

  // The next Spawn fails with `error` (and starts nothing).
  void FailNextSpawn(absl::Status error) { next_spawn_error_ = std::move(error); }
  // `worker` writes `line` (a line of output, without its newline).
  void Print(WorkerId worker, std::string line) {
    WorkerEvent event = Event(worker, WorkerEvent::Kind::kOutput);
    event.line = std::move(line);
    events_.push_back(std::move(event));
  }
  // `worker`, live and running, is stopped by `signal`.
  void Stop(WorkerId worker, int signal = SIGSTOP) {
    State& state = Live(worker);
    if (state.stopped) return;
    state.stopped = true;
    WorkerEvent event = Event(worker, WorkerEvent::Kind::kStopped);
    event.stop_signal = signal;
    events_.push_back(std::move(event));
  }
  // `worker`, live and stopped, runs again.
  void Continue(WorkerId worker) {
    State& state = Live(worker);
    if (!state.stopped) return;
    state.stopped = false;
    events_.push_back(Event(worker, WorkerEvent::Kind::kContinued));
  }
  // `worker`, live, ends as `exit` says.
  void Exit(WorkerId worker, WorkerExit exit) {
    State& state = Live(worker);
    state.live = false;
    state.stopped = false;
    WorkerEvent event = Event(worker, WorkerEvent::Kind::kExited);
    event.exit = exit;
    events_.push_back(std::move(event));
  }

  // ---- What the test reads ----

  const std::vector<Spawned>& spawned() const { return spawned_; }
  const std::vector<Sent>& signals() const { return signals_; }
  // Every pid file written, by path: the pid it holds now.
  const std::map<std::string, pid_t>& pid_files() const { return pid_files_; }
  bool live(WorkerId worker) const {
    auto it = workers_.find(worker);
    return it != workers_.end() && it->second.live;
  }
  // The events the test made happen that Poll has not handed over yet.
  size_t pending_events() const { return events_.size(); }

  // ---- ProcessSupervisor ----

  absl::StatusOr<WorkerId> Spawn(const WorkerSpec& spec) override {
    if (!next_spawn_error_.ok()) return std::exchange(next_spawn_error_, absl::OkStatus());
    if (spec.argv.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("no command to start for ", spec.label));
    }
    const WorkerId worker = next_id_++;
    const pid_t pid = options_.first_pid + static_cast<pid_t>(worker - 1);
    workers_[worker] = State{pid, spec.label};
    spawned_.push_back({worker, pid, spec});
    if (!spec.pid_file.empty()) pid_files_[spec.pid_file] = pid;
    return worker;
  }

  absl::Status Signal(WorkerId worker, int signal) override {
    auto it = workers_.find(worker);
    if (it == workers_.end()) {
      return absl::NotFoundError(absl::StrCat("no worker ", worker, " was started here"));
    }
    if (!it->second.live) {
      return absl::FailedPreconditionError(absl::StrFormat("%s (pid %d) has exited: not signalled",
                                                           it->second.label, it->second.pid));
    }
    signals_.push_back({worker, signal});
    if (!options_.signals_act) return absl::OkStatus();
    switch (signal) {
      case SIGKILL:
      case SIGTERM:
      case SIGINT:
      case SIGHUP:
        Exit(worker, WorkerExit::Killed(signal));
        break;
      case SIGSTOP:
      case SIGTSTP:
        Stop(worker, signal);
        break;
      case SIGCONT:
        Continue(worker);
        break;
      default:
        break;
    }
    return absl::OkStatus();
  }

  std::vector<WorkerEvent> Poll(absl::Duration /*timeout*/) override {
    return std::exchange(events_, {});
  }

  bool IsStopped(WorkerId worker) override {
    auto it = workers_.find(worker);
    return it != workers_.end() && it->second.live && it->second.stopped;
  }

  absl::Status WritePidFile(WorkerId worker, const std::string& path) override {
    auto it = workers_.find(worker);
    if (it == workers_.end()) {
      return absl::NotFoundError(absl::StrCat("no worker ", worker, " was started here"));
    }
    if (!it->second.live) {
      return absl::FailedPreconditionError(absl::StrFormat("%s (pid %d) has exited: no pid file %s",
                                                           it->second.label, it->second.pid, path));
    }
    pid_files_[path] = it->second.pid;
    return absl::OkStatus();
  }

  pid_t pid(WorkerId worker) const override {
    auto it = workers_.find(worker);
    return it == workers_.end() ? -1 : it->second.pid;
  }

  absl::Status Release(WorkerId worker) override {
    auto it = workers_.find(worker);
    if (it == workers_.end()) {
      return absl::NotFoundError(absl::StrCat("no worker ", worker, " was started here"));
    }
    if (it->second.live) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s (pid %d) is still live: not released", it->second.label, it->second.pid));
    }
    workers_.erase(it);
    return absl::OkStatus();
  }

 private:
  struct State {
    pid_t pid = -1;
    std::string label;
    bool live = true;
    bool stopped = false;
  };

  static WorkerEvent Event(WorkerId worker, WorkerEvent::Kind kind) {
    WorkerEvent event;
    event.kind = kind;
    event.worker = worker;
    return event;
  }
  // The state of a live worker; a test that drives a worker it never spawned, or one that
  // exited, is wrong: it aborts there rather than fake an impossible event.
  State& Live(WorkerId worker) {
    auto it = workers_.find(worker);
    if (it == workers_.end() || !it->second.live) {
      absl::FPrintF(stderr, "FakeProcessSupervisor: worker %d is not live\n", worker);
      abort();
    }
    return it->second;
  }

  const FakeProcessSupervisorOptions options_;
  WorkerId next_id_ = 1;
  std::map<WorkerId, State> workers_;
  std::vector<Spawned> spawned_;
  std::vector<Sent> signals_;
  std::map<std::string, pid_t> pid_files_;
  std::vector<WorkerEvent> events_;
  absl::Status next_spawn_error_;
};

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_FAKE_PROCESS_SUPERVISOR_H_
