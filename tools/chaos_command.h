// `trainguard chaos`: runs a job under `trainguard run` while injecting real faults from a seeded
// schedule, then the same job and schedule recovered the way torchrun does it (the baseline), and
// reports both (tools/chaos_report.h).
//
//   trainguard chaos [--nproc N] [--standby K] [--duration 10m] [--mean-interval 20s] [--seed S]
//                    [--mix kill=2,stop=1,nan=1] [--mode both|trainguard|baseline]
//                    [--run-dir DIR] [--heartbeat-timeout SECONDS] [--checkpoint-every-steps N]
//                    [--snapshot-every-steps N] [--wait-for-exit] [--png FILE] [-- COMMAND...]
//
// The schedule (PlanFaults) is a Poisson process: exponential gaps of mean --mean-interval over
// --duration, each fault's kind drawn from --mix by weight and its rank uniformly, all from --seed,
// so both runs meet the same faults at the same offsets from their start (generation 0 formed:
// the clock starts when the launcher says so). The kinds:
//   kill  SIGKILL to the rank's process (a crashed rank);
//   stop  SIGSTOP to it (a hung rank: alive, silent);
//   nan   SIGUSR1 to it, which the example trainer (--nan-on-sigusr1 1) turns into a NaN in its
//         gradient at the next step;
//   drop  SIGURG to it, which the example trainer (--drop-on-sigurg 1) turns into closing every
//         connection of its communicator before its next allreduce (a dropped link).
// Each injection is appended to <run>/events/chaos.tgev (custom event what=chaos_inject, the
// target rank, attributes kind and pid) before the signal is sent, so a report never misses a
// fault that was done. The target's pid is read from the launcher's pid file and signalled only
// if it is positive, running (not already stopped) and a child of this run's launcher, through a
// pidfd opened first (a pid reused meanwhile is never the one signalled). A rank with no such
// process right now (it is being replaced) is tried again for up to 10 s, then the fault is
// recorded as skipped (what=chaos_skip).
//
// The runs go to DIR/trainguard and DIR/baseline (default DIR: $TMPDIR/trainguard-chaos-<pid>).
// trainguard: `trainguard run --standby K` (a dead or hung rank is replaced by a warm standby, the
// survivors keep their processes). baseline: `trainguard run --restart-all` (every rank is stopped
// and the whole job restarts from the newest checkpoint on disk). Both checkpoint every
// --checkpoint-every-steps steps to disk; trainguard also snapshots to memory every
// --snapshot-every-steps (default: ten times as often as to disk; TRAINGUARD_CHECKPOINT_EVERY_STEPS
// and _PERSIST_EVERY are set for the launcher).
// Without a COMMAND, the example trainer found beside this binary runs with --steps 1e9
// --step-time-ms 50 --progress-events 1 --nan-on-sigusr1 1. At --duration the job is stopped
// (SIGINT to its launcher); with --wait-for-exit, faults are injected for --duration and then the
// job is waited for until it ends by itself (at most 10 minutes).
//
// Exit status: 0 every run ran (and, with --wait-for-exit, ended with status 0); 1 a run could not
// be started or its job failed; 2 bad usage.
//
// Thread safety: one thread; RunChaos forks the launchers and signals only their children.
#ifndef TRAINGUARD_TOOLS_CHAOS_COMMAND_H_
#define TRAINGUARD_TOOLS_CHAOS_COMMAND_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/core/event_log.h"
#include "trainguard/events.h"

namespace trainguard::tools {

struct PlannedFault {
  absl::Duration at;  // since the run's start
  std::string kind;
  int rank = -1;
};

// The seeded fault schedule: deterministic in its arguments. `mix` holds (kind, weight) pairs with
// positive weights. REQUIRES: mean_interval > 0, nproc >= 1, mix not empty.
std::vector<PlannedFault> PlanFaults(uint64_t seed, absl::Duration mean_interval,
                                     absl::Duration duration,
                                     const std::vector<std::pair<std::string, int>>& mix,
                                     int nproc);

// "kill=2,stop=1,nan=1". InvalidArgument names an unknown kind or a bad weight. With `host_kinds`
// (several hosts: bench/bench_chaos_hosts.cc) also host_kill and partition, whose rank picks the
// host that holds it when the fault comes; without, they are refused, saying where they exist.
absl::StatusOr<std::vector<std::pair<std::string, int>>> ParseMix(const std::string& text,
                                                                  bool host_kinds = false);

// --mode: "both" -> {"trainguard", "baseline"} (the order they run in), or the one named;
// InvalidArgument for anything else.
absl::StatusOr<std::vector<std::string>> ParseModes(const std::string& text);

// Appends to a chaos run's events/chaos.tgev the event of kind `what` (attributes what,
// source=chaos, then `attributes`) for `rank` (-1: the run), stamped now. The one writer of the
// ground truth, for `trainguard chaos` and bench/bench_chaos_hosts.
absl::Status AppendChaosEvent(EventLog* events, int rank, EventKind what,
                              const std::string& message,
                              std::vector<std::pair<std::string, std::string>> attributes);

// `trainguard chaos ...` (the arguments after "chaos"); returns the exit status.
int RunChaosCommand(const std::vector<std::string>& args);
std::string ChaosUsage();

}  // namespace trainguard::tools

#endif  // TRAINGUARD_TOOLS_CHAOS_COMMAND_H_
