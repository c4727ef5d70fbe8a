// RankWatch: what the coordinator of a `trainguard run` job watches of the ranks themselves, on the
// ranks' store (the job's, or a restart round's): their heartbeats (a rank whose heartbeat stood
// still for --heartbeat-timeout is killed, to be replaced like a dead one), the stops their agents
// report on the job's store (a rank stopped for --host-timeout while a new generation waits for it
// is killed and replaced: no step runs, so no watchdog fires), the end of each recovery
// (every rank completed its first step of the recovery's generation: the "recovered ..." line and
// the `recovered` event, timed from the fault), the checkpoints' protection (ckpt/protected moved
// to a new epoch: "the job is protected") and the checkpoints a rank could not persist
// (job/persist_failed/...: "checkpoint not persisted", once each). One host and several take the
// same path: on one host the coordinator is the launcher's, and the kill it asks for is of its own
// child (Hooks::kill_member).
//
// Every act that says or kills checks the gate (Hooks::coordinating: the coordinator lease) right
// before it, so a deposed coordinator reports and kills nothing. Every instant is the Clock's (the
// heartbeats' staleness is the RendezvousCoordinator's, by the same clock), so tests drive it with
// an in-memory store and a ManualClock, no process and no sleep (tests/unit/rank_watch_test.cc).
//
// Thread safety: not thread-safe; one thread (the launcher's loop, a test) uses an instance.
#ifndef TRAINGUARD_SDK_COORDINATOR_RANK_WATCH_H_
#define TRAINGUARD_SDK_COORDINATOR_RANK_WATCH_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "sdk/coordinator/job_coordinator.h"
#include "sdk/rendezvous/rendezvous.h"
#include "trainguard/clock.h"
#include "trainguard/events.h"
#include "trainguard/store.h"

namespace trainguard {

struct RankWatchOptions {
  // --heartbeat-timeout: a rank whose heartbeat stood still this long (by the clock) is killed.
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // --host-timeout: a rank its agent reports stopped this long while the current generation waits
  // for it is killed.
  absl::Duration host_timeout = absl::Seconds(3);
  // The heartbeats are read at most this often (each read is a store round trip per rank).
  absl::Duration heartbeat_check_period = absl::Milliseconds(500);
  // How long the reads of the heartbeats and of the ranks' resumes may take.
  absl::Duration store_timeout = absl::Seconds(10);
  // How long the reads of ckpt/protected and of the persist failures may take: short, they are
  // reports, read again at the next turn.
  absl::Duration report_timeout = absl::Milliseconds(500);
};

class RankWatch {
 public:
  using Attributes = std::vector<std::pair<std::string, std::string>>;
  struct Hooks {
    // The gate of every act: true while this agent may act as the coordinator.
    std::function<bool()> coordinating;
    // Says one line of the launcher's output (without the "trainguard run: " prefix).
    std::function<void(const std::string&)> say;
    // Records an event of `kind` for `rank` (-1: none) in the launcher's event file.
    std::function<void(int rank, EventKind kind, const std::string& message, Attributes attributes)>
        record;
    // Kills the process that holds `member` for `why`, recording `what` with its pid: this
    // launcher's own child, or through its host's agent (a kill request fenced by the lease term).
    std::function<void(const std::string& member, EventKind what, const std::string& why)>
        kill_member;
    // Some rank's heartbeat is stale: says which rank the others wait for (the flight recorders).
    std::function<void()> report_laggards;
    // The hosts whose agents have sent no heartbeat for a while (the launcher's: JobCoordinator::
    // HostsQuietFor(host_timeout / 3)); empty on one host, whose agent is the coordinator.
    std::function<std::set<std::string>()> quiet_hosts;
    // Kills `member`, which holds `rank` and is stopped, and queues its rank for replacement at
    // once (its exit would come only after the kill lands).
    std::function<void(int rank, const std::string& member, EventKind what, const std::string& why)>
        kill_and_replace;
  };

  // REQUIRES: `agents_store`, `ranks_store`, `clock` and `rendezvous` outlive the watch (or the
  // next set_...); every hook is set. `agents_store` is the job's (the agents' reports),
  // `ranks_store` the ranks' (the same but in a restart round); `rendezvous` publishes the
  // generations of the ranks of `ranks_store`.
  RankWatch(Store* agents_store, Store* ranks_store, Clock* clock,
            RendezvousCoordinator* rendezvous, RankWatchOptions options, Hooks hooks);
  RankWatch(const RankWatch&) = delete;
  RankWatch& operator=(const RankWatch&) = delete;

  // A restart (every rank started again) moves the ranks to a store and a rendezvous of their own
  // and to a world size (the plan's): the watch reads those from now on.
  void set_ranks_store(Store* ranks_store) { ranks_store_ = ranks_store; }
  void set_rendezvous(RendezvousCoordinator* rendezvous) { rendezvous_ = rendezvous; }
  void set_world_size(int world_size) { world_size_ = world_size; }

  // Kills (Hooks::kill_member, rank_unresponsive) every rank of the current generation whose
  // heartbeat has stood still for heartbeat_timeout or longer (RendezvousCoordinator::
  // RanksWithStaleHeartbeats: exactly the timeout is stale), after saying who the others wait for
  // (Hooks::report_laggards), but those whose host is quiet (Hooks::quiet_hosts,
  // StaleRanksToKill): their kill is held, left to the host's declaration. Reads at most once per
  // heartbeat_check_period, and not before the instant HoldHeartbeatChecksUntil set.
  void KillRanksWithStaleHeartbeats();
  // The ranks were all started again: their heartbeats are not judged before `until`.
  void HoldHeartbeatChecksUntil(absl::Time until) { next_heartbeat_check_ = until; }

  // The ranks of the current generation whose agents say their process is stopped
  // (agents/stopped/<member>), with their member ids; nullopt when the store does not answer.
  std::optional<std::map<int, std::string>> StoppedMembers();
  // Kills and replaces (Hooks::kill_and_replace, rank_unresponsive) each rank of the current
  // generation that its agent has reported stopped for host_timeout or longer by the clock (from
  // the first call that saw the report) and that has not completed a step of the generation (one
  // that did is in training: its stop is a hang, which the watchdogs and the diagnosis name).
  // Once per member; a member no longer reported stopped starts afresh.
  void KillMembersStoppedInFormation();

  // Whether every rank completed its first step of `generation`: one read of the ranks' count
  // (store_keys::ResumedCount, PublishResumed), whatever the world size; false when the store does
  // not answer.
  bool EveryRankResumed(int64_t generation);
  // Ends each recovery of `recoveries` whose generation (raised to the current one: a second fault
  // before every rank resumed extends it) every rank resumed: records `recovered` (took_ms, host)
  // and says "recovered from the loss of rank R | host H | with the same ranks in X s (...)",
  // timed from its fault by the clock, and removes it. Nothing once the gate is closed.
  void CheckRecoveries(std::vector<Recovery>& recoveries);

  // Says "the job is protected[ again]: ..." when ckpt/protected ("<step> <epoch>") names an epoch
  // not said yet: once per change of epoch.
  void ReportProtection();
  // Says "checkpoint not persisted: <the rank's error>" once for each job/persist_failed/ key: a
  // rank that could not write its checkpoint keeps training, so its event file would be the only
  // trace.
  void ReportPersistFailures();
  // Says "silent corruption: <line>" for each line of job/silent_corruption (the verdict of the
  // rank that judged a snapshot's replicas, replica_check.h) once per verdict.
  void ReportSilentCorruption();
  // The persist failures said, by store key (job/persist_failed/<step>/<rank>): the rank's error.
  const std::map<std::string, std::string>& persist_failures() const { return persist_failures_; }

 private:
  bool coordinating() { return hooks_.coordinating(); }

  Store* const agents_store_;
  Store* ranks_store_;
  Clock* const clock_;
  RendezvousCoordinator* rendezvous_;
  const RankWatchOptions options_;
  const Hooks hooks_;

  int world_size_ = 0;
  absl::Time next_heartbeat_check_ = absl::InfinitePast();
  std::string protected_epoch_;                          // of the last ckpt/protected said
  std::string corruption_said_;  // the "<epoch>/<step>" of the last job/silent_corruption said
  std::map<std::string, std::string> persist_failures_;  // store key -> the rank's error, said
  // KillMembersStoppedInFormation: when each member was first seen stopped, and those killed.
  std::map<std::string, absl::Time> stopped_since_;
  std::set<std::string> stopped_killed_;
};

// Of `stale`, ranks of `current` whose heartbeat stood still for the heartbeat timeout, those to
// kill now: every one but those whose member's host (store_keys::MemberHost) is in `quiet_hosts`,
// hosts whose agent has itself stopped beating. A kill request to such a host waits for an agent
// that may be dead (and, with the rank heartbeat timeout equal to the host timeout, a dead host's
// ranks go stale just before the host is declared dead); the host's declaration replaces its
// ranks, and should its agent beat again first, the next check kills them. In `stale`'s order;
// ranks outside `current` are left out.
std::vector<int> StaleRanksToKill(const std::vector<int>& stale, const Membership& current,
                                  const std::set<std::string>& quiet_hosts);

// The ranks of `current` whose agents say their process is stopped (agents/stopped/<member>), with
// their member ids; nullopt when the store does not answer. RankWatch and HangCoordinator read it.
std::optional<std::map<int, std::string>> StoppedMembers(Store* agents_store,
                                                         const Membership& current,
                                                         absl::Duration timeout);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_COORDINATOR_RANK_WATCH_H_
