// FailSlowCoordinator: the coordinator's side of `trainguard run --fail-slow` (docs/GUIDE.md,
// "Fail-slow hosts"). Once a second by the clock it reads the latest sample of every host that
// holds ranks and is not dead (agents/metrics/<host>, which each host's agent publishes:
// HostAgent::PublishHostSample), keeps the last seconds of them (HostMetricsHistory), feeds them to
// the fail-slow detector (FailSlowMonitor) and acts on each host it confirms: DecideFailSlowAction
// says whether the host is evicted (--fail-slow evict, or evict-repeated from its second window,
// within --fail-slow-max-evict-share of the job's hosts, and only when parked standbys of other
// hosts can take its ranks) or only reported. Either way the coordinator writes the history up to
// the detection to a dump (<run_dir>/events/fail_slow/, WriteFailSlowDump), says the verdict and
// records a suspect_host event with its evidence; an evicted host is declared dead through the
// JobCoordinator (JobCoordinator::DeclareHostDead: its fence, and its ranks queued for
// replacement as any dead host's are).
//
// Every act (the dump, the line, the event, the eviction) checks the gate (Hooks::coordinating)
// right before it: a deposed coordinator writes and evicts nothing. Instants come from the Clock
// and files go through the Env, so tests drive it with an in-memory store, a ManualClock and
// injected samples (tests/unit/fail_slow_coordinator_test.cc): no process, no sleep.
//
// Fail-slow compares a job's hosts with each other: the detector names no host among fewer than
// three, so `trainguard run` runs it (and the agents' sampling) on several hosts only.
//
// Thread safety: not thread-safe; one thread (the agent's loop, a test) uses an instance.
#ifndef TRAINGUARD_SDK_COORDINATOR_FAIL_SLOW_COORDINATOR_H_
#define TRAINGUARD_SDK_COORDINATOR_FAIL_SLOW_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/agent/fail_slow_policy.h"
#include "sdk/coordinator/job_coordinator.h"
#include "sdk/health/fail_slow_detector.h"
#include "sdk/health/fail_slow_dump.h"
#include "sdk/health/fail_slow_monitor.h"
#include "trainguard/clock.h"
#include "trainguard/env.h"
#include "trainguard/events.h"
#include "trainguard/store.h"

namespace trainguard {

struct FailSlowCoordinatorOptions {
  FailSlowPolicy policy = FailSlowPolicy::kAlert;  // --fail-slow
  // The detector's options: --fail-slow-continuity, --fail-slow-window (denoise_window, max_fill).
  FailSlowOptions detector;
  double max_evict_share = 0.1;  // --fail-slow-max-evict-share
  int ranks_per_host = 1;        // --nproc: the parked standbys an eviction needs
  std::string dump_dir;          // FailSlowDumpDir(run_dir)
  int max_dumps = 16;            // the dumps kept in dump_dir
  int history_seconds = 120;     // the seconds of every host's records a dump holds
  // --fail-slow-trace: every second's records are appended to this file ("": none).
  std::string trace_path;
  // How long one store call of the agent's loop may take.
  absl::Duration call_timeout = absl::Milliseconds(750);
};

class FailSlowCoordinator {
 public:
  struct Hooks {
    // The gate of every act: true while this agent may act as the coordinator (its lease is held).
    std::function<bool()> coordinating;
    // Says one line of the launcher's output (without the "trainguard run: " prefix).
    std::function<void(const std::string&)> say;
    // Records `event` (a suspect_host) in this agent's event file.
    std::function<void(Event event)> record;
  };

  // InvalidArgument naming the detector's option out of range.
  // REQUIRES: `store`, `clock`, `env` and `job` outlive the coordinator; every hook is set.
  // `store` is the job's (the agents'); `job` is the coordinator whose membership (its rendezvous
  // coordinator) and dead hosts say which hosts train, and which declares an evicted host dead.
  static absl::StatusOr<std::unique_ptr<FailSlowCoordinator>> Create(
      Store* store, Clock* clock, Env* env, JobCoordinator* job, FailSlowCoordinatorOptions options,
      Hooks hooks);
  FailSlowCoordinator(const FailSlowCoordinator&) = delete;
  FailSlowCoordinator& operator=(const FailSlowCoordinator&) = delete;

  // Every tick of the coordinating agent; does its work at most once a second by the clock, and
  // not before the job has a plan (`world_size` 0). A second whose records the store does not give
  // is skipped (the detector fills a short gap).
  void Poll(int world_size);

  // The fail-slow seconds counted so far (the detector's and the dumps' seconds).
  int64_t second() const { return second_; }
  // The hosts evicted on metrics so far (against max_evict_share).
  int evictions() const { return evictions_; }

 private:
  FailSlowCoordinator(Store* store, Clock* clock, Env* env, JobCoordinator* job,
                      FailSlowCoordinatorOptions options, Hooks hooks, FailSlowDetector detector);
  // What to do with `verdict`, done: see the file comment. `world_size`: the job's ranks.
  void Act(const SuspectVerdict& verdict, int world_size);
  // <dump_dir>/<unix>-<host>.trace: the history up to this detection; a failure said once.
  void WriteDump(const SuspectVerdict& verdict, const std::string& action);
  // Appends this second's records to the trace file (--fail-slow-trace); best effort.
  void AppendTrace(const std::map<std::string, std::string>& records);

  Store* const store_;
  Clock* const clock_;
  Env* const env_;
  JobCoordinator* const job_;
  const FailSlowCoordinatorOptions options_;
  const Hooks hooks_;

  FailSlowMonitor monitor_;
  HostMetricsHistory history_;
  absl::Time next_check_ = absl::InfinitePast();
  int64_t second_ = 0;
  int evictions_ = 0;
  bool dump_failed_ = false;  // said once: a full disk would say it every window
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_COORDINATOR_FAIL_SLOW_COORDINATOR_H_
