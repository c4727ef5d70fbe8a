// JobCoordinator: the coordinator of a `trainguard run` job, the duties of whichever host agent
// holds the coordinator lease (on one host, of the launcher). Its host-level duties: which hosts
// are in the job and alive (their agents' heartbeats, judged by HostLiveness), the fence of a host
// found silent (agents/dead/<host>) and the replacement of its ranks in one entry, the ranks'
// deaths that the agents report (agents/deaths/<member>, each member once, its cause kept in the
// FailureHistory), and the word that every rank finished (job/done, once). Its rank-level duty:
// the replacements, the queue of dead ranks and hosts (replacements()) given to parked standbys
// through the RendezvousCoordinator (TryReplacements: the crash-loop backoff, the wait for a
// standby still starting, the message that fails the job when none comes), the renewal of a
// generation whose ranks asked for one (RenewGenerationWhenAsked, as RenewalPolicy decides), and
// the recoveries both start (recoveries(), whose end the launcher measures).
//
// What the faults it finds lead to is the job's RecoveryStrategy's (recovery_strategy.h, set with
// set_recovery_strategy): a reported death, a host declared dead and a restart the ranks' requests
// call for are handed to it. StandbyReplacement hands them back to this coordinator's standby path
// (QueueReportedDeath, QueueDeadHost: the replacements); RestartAll starts restart rounds. What it
// cannot do itself it hands to the hooks: failing the job, printing a line, recording an event,
// choosing the standbys a host's ranks go to (the backup placement), knowing whether a standby is
// starting, carrying out a rank's takeover where the process is the launcher's own. The launcher
// still owns the processes and the rendezvous coordinator; the hangs are HangCoordinator's
// (hang_coordinator.h), which asks this coordinator which hosts are quiet or dead.
//
// Every act that writes to the store or says what it decided checks the gate (the coordinator
// lease, Hooks::coordinating) right before it: a deposed coordinator writes nothing. Every instant
// is read from the Clock, so tests drive it with an in-memory store and a ManualClock, no process
// and no sleep (tests/unit/job_coordinator_test.cc).
//
// Thread safety: not thread-safe; one thread (the agent's loop, a test) uses an instance.
#ifndef TRAINGUARD_SDK_COORDINATOR_JOB_COORDINATOR_H_
#define TRAINGUARD_SDK_COORDINATOR_JOB_COORDINATOR_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "sdk/agent/failure_history.h"
#include "sdk/agent/host_liveness.h"
#include "sdk/agent/renewal_policy.h"
#include "sdk/agent/replacement_policy.h"
#include "sdk/coordinator/recovery_strategy.h"
#include "sdk/rendezvous/rendezvous.h"
#include "trainguard/clock.h"
#include "trainguard/events.h"
#include "trainguard/store.h"

namespace trainguard {

// A rank, or a whole host's ranks, to give to parked standbys (JobCoordinator::TryReplacements).
struct PendingReplacement {
  int rank;  // -1: a whole host (ranks)
  std::string how;
  absl::Time died;              // when the death was seen; a dead host's: its last heartbeat
  absl::Time give_up;           // no standby parked by then: the job fails
  absl::Time not_before;        // the crash-loop backoff
  std::vector<int> ranks = {};  // a dead host's ranks, replaced in one generation
  std::string host = {};
};

// A recovery under way: from its fault until every rank completed its first step of `generation`
// (the launcher's CheckRecoveries says how long that took, and a later fault's newer generation
// extends it).
struct Recovery {
  int rank;  // the rank replaced; -1: a renewal, a restart, or a host's ranks (host)
  int64_t generation;
  absl::Time died;        // the death seen; a host's last heartbeat; a renewal's first request
  std::string host = {};  // a dead host whose ranks were all replaced
};

// What the launcher knows that holds a renewal back (besides a queued replacement, which the
// coordinator knows): its death, or the hang's diagnosis, answers the ranks' requests first.
struct RenewalHolds {
  bool hang_pending = false;          // a declared hang is being decided
  bool killed_rank_unreaped = false;  // a rank killed for liveness still runs: its death is next
};

struct JobCoordinatorOptions {
  std::string host_id;  // this agent's host: alive while it coordinates, never declared dead
  // --host-timeout: a host whose heartbeat stood still this long is dead.
  absl::Duration host_timeout = absl::Seconds(3);
  // How long one store call of the agent's loop may take.
  absl::Duration call_timeout = absl::Milliseconds(750);
  int max_replacements = 10;  // --max-replacements, for the message that fails the job
  // How long a queued replacement waits past its not_before for a standby still starting
  // (Hooks::standby_starting) when none is parked, before the job fails: on one host the
  // rendezvous timeout; on several, long enough for a standby host's agent to join and park its
  // standbys (the launcher passes 2 x host_timeout + 10 s).
  absl::Duration standby_wait = absl::Seconds(16);
  // --spread-standbys: a dead host's ranks may go to standbys of several hosts, not only to one
  // standby host's.
  bool spread_standbys = false;
  // How long one replacement or renewal (the store calls that read the requests, claim the
  // standbys and publish the generation) may take.
  absl::Duration replace_timeout = absl::Seconds(10);
};

class JobCoordinator {
 public:
  using Attributes = std::vector<std::pair<std::string, std::string>>;
  struct Hooks {
    // The gate of every act: true while this agent may act as the coordinator (its lease is held).
    std::function<bool()> coordinating;
    // Says one line of the launcher's output (without the "trainguard run: " prefix).
    std::function<void(const std::string&)> say;
    // Records an event of `kind` for `rank` (-1: none) in the launcher's event file.
    std::function<void(int rank, EventKind kind, const std::string& message, Attributes attributes)>
        record;
    // Fails the job for `why`.
    std::function<void(const std::string& why)> fail;
    // The parked standbys that `ranks` of `dead_host` go to first, in order (the launcher's choice
    // away from the hosts that hold their backups); empty: any parked standby.
    std::function<std::vector<std::string>(const std::string& dead_host,
                                           const std::vector<int>& ranks)>
        preferred_standbys;
    // Whether a standby is starting (or about to): a replacement that finds none parked waits for
    // it until its give_up.
    std::function<bool()> standby_starting;
    // `member` took `rank` in `generation`: where the member is the launcher's own process (one
    // host) it relabels it and starts another standby; on several hosts the member's own agent
    // relabels it and the coordinator only says so.
    std::function<void(int rank, const std::string& member, int64_t generation)> rank_taken;
  };

  // REQUIRES: `store`, `clock`, `rendezvous` (see set_rendezvous), `replacement_policy`,
  // `renewal_policy` and `failures` outlive the coordinator; every hook is set. `store` is the
  // job's (the agents'); `rendezvous` publishes the generations (the membership whose ranks a dead
  // host held); `replacement_policy` counts a rank's deaths against --max-replacements and the
  // crash-loop backoff; `renewal_policy` decides when the ranks' requests renew the generation (its
  // owner resets it for a restart); `failures` is the job's history of deaths, for the message
  // that fails it. The recovery strategy is set after construction (set_recovery_strategy), since
  // it holds this coordinator.
  JobCoordinator(Store* store, Clock* clock, RendezvousCoordinator* rendezvous,
                 ReplacementPolicy* replacement_policy, RenewalPolicy* renewal_policy,
                 FailureHistory* failures, JobCoordinatorOptions options, Hooks hooks);
  JobCoordinator(const JobCoordinator&) = delete;
  JobCoordinator& operator=(const JobCoordinator&) = delete;

  // Every tick of the coordinating agent once the plan is known: reads the joined hosts and their
  // heartbeats and declares the silent ones dead (DeclareHostDead), takes the agents' death reports
  // (ReadDeathReports), and publishes job/done once every rank finished. Hosts that left and hosts
  // declared dead are not watched; nothing is done once job/done is published.
  // REQUIRES: a recovery strategy is set (as for ReadDeathReports, DeclareHostDead and
  // RenewGenerationWhenAsked).
  void CoordinateHosts();

  // Every turn of the coordinating agent's loop between its ticks (the launcher's ~50 ms poll of
  // its workers), once generation 0 formed: takes the death reports (ReadDeathReports), so that a
  // dead rank is replaced as soon as its agent reported it, and re-reads the heartbeats of the
  // hosts watched at the last tick whose beat has stood still for half the host timeout, declaring
  // those silent for the host timeout dead (DeclareHostDead, as CoordinateHosts), so that a dead
  // host is declared within a turn of its bound rather than at the next tick. While every host
  // beats, one ListKeys (the reports) and no heartbeat read.
  void CoordinateBetweenTicks();

  // Takes the death reports (agents/deaths/<member>) not taken yet, oldest member id first: each is
  // recorded as a death with its cause, marked taken, and handed to the recovery strategy
  // (RecoveryStrategy::OnDeathReported) with the current membership, until the strategy says to
  // stop for this turn. Nothing once the gate is closed.
  void ReadDeathReports();

  // The standby path of a reported death (StandbyReplacement::OnDeathReported): before `current`'s
  // generation 0 formed the job fails; the death of a parked standby or of a rank already replaced
  // (a member that `current` does not name) only forgets the standby; else the rank the member
  // holds in `current` is queued (QueueDeadMember). Returns false when the job failed.
  bool QueueReportedDeath(const ReportedDeath& death, const Membership& current);

  // Queues `rank`, which `member` held, for replacement: counted as a death (`how`) against
  // --max-replacements and the crash-loop backoff; a later death report of `member` is ignored.
  // `cause` (may be empty): the death's evidence from its agent (CauseLine), said with it, since
  // the coordinator's output is where an operator reads of a death on another host.
  // Returns false when the job failed instead (the bound was reached).
  bool QueueDeadMember(int rank, const std::string& member, const std::string& how,
                       const std::string& cause = "");

  // Fences `host` out (agents/dead/<host> = `why`), forgets its parked standbys, says and records
  // its death with the ranks it held (those not finished, each death marked taken), and hands it
  // to the recovery strategy (RecoveryStrategy::OnHostDeclaredDead). `last_beat`: when its
  // heartbeat last advanced, the recovery's start. Nothing when the gate is closed; when the fence
  // cannot be written, tried again at the next tick (the host stays silent).
  void DeclareHostDead(const std::string& host, absl::Time last_beat, const std::string& why);

  // The standby path of a dead host (StandbyReplacement::OnHostDeclaredDead): nothing when it held
  // no rank to replace; before `current`'s generation 0 formed the job fails; else its ranks are
  // queued in one entry (replaced at once, its recovery from `dead.last_beat`), which takes the
  // place of any of them queued already (the rendezvous' liveness and the survivors' failed
  // collectives may have queued some).
  void QueueDeadHost(const DeadHost& dead, const Membership& current);

  // This agent took the lease over: the hosts' bounds start afresh (HostLiveness), no death report
  // counts as taken, and the hosts dead are those the store names (agents/dead/).
  void TakeOver(absl::Duration timeout);
  // Gives the queued ranks and hosts, oldest first, to parked standbys as of `now`, each entry in
  // one generation (a host's ranks together, to the standbys Hooks::preferred_standbys names
  // first). It stops at an entry whose not_before (the crash-loop backoff) is after `now`, at an
  // entry that finds no standby parked while one is starting (Hooks::standby_starting) before its
  // give_up, and when the gate is closed or the rendezvous coordinator refuses (another coordinator
  // acted): those stay queued. An entry that finds no standby and none coming fails the job,
  // naming the death and why no standby came. A replacement made is counted (ReplacementPolicy),
  // said, recorded or handed to Hooks::rank_taken, and its recovery kept (recoveries()).
  void TryReplacements(absl::Time now);
  // Answers the ranks' requests for a new generation (RendezvousMember::RequestNewGeneration) as
  // the RenewalPolicy decides at the clock's instants: nothing while a replacement is queued or
  // `holds` holds; the current generation's requests read, then a wait (the first request said
  // once), a renewal with the same ranks (said, a generation_renewed event, a recovery from the
  // first request), or, where the policy restarts every rank instead (--restart-all), the recovery
  // strategy's RecoveryStrategy::OnRestartRequested. A renewal the store refuses is said and tried
  // again at the next call; nothing is written or said once the gate is closed.
  void RenewGenerationWhenAsked(RenewalHolds holds);

  // Queues `rank` (one host: its death decided by the launcher's ReplacementPolicy) to be replaced
  // not before `not_before`, waiting for a standby until standby_wait past it.
  void QueueRankReplacement(int rank, const std::string& how, absl::Time died,
                            absl::Time not_before);

  // This agent lost the lease: what it queued, and the recoveries it measured, are its successor's.
  void Depose() {
    replacements_.clear();
    recoveries_.clear();
  }

  // What the launcher reads of the job's shape: its world size (0: no plan yet) and its restart
  // round (--restart-all; 0: the job's first start). Set them as they change.
  void set_world_size(int world_size) { world_size_ = world_size; }
  void set_round(int64_t round) { round_ = round; }
  // How the job recovers from the faults this coordinator finds (see the class comment).
  // REQUIRES: `strategy` outlives the coordinator, or the next set_recovery_strategy.
  void set_recovery_strategy(RecoveryStrategy* strategy) { strategy_ = strategy; }
  // A restart round's ranks form under a rendezvous coordinator of their own (on the round's
  // store): the memberships are read from `rendezvous` from now on.
  // REQUIRES: `rendezvous` outlives the coordinator, or the next set_rendezvous.
  void set_rendezvous(RendezvousCoordinator* rendezvous) { rendezvous_ = rendezvous; }
  // The rendezvous coordinator the memberships are read from now.
  RendezvousCoordinator* rendezvous() const { return rendezvous_; }

  // The ranks and hosts to replace, oldest first (TryReplacements consumes them).
  std::deque<PendingReplacement>& replacements() { return replacements_; }
  // The recoveries under way: the replacements made, and the renewals and restarts the launcher
  // adds; the launcher removes each once every rank resumed (CheckRecoveries).
  std::vector<Recovery>& recoveries() { return recoveries_; }
  // The hosts declared dead (fenced), by this coordinator or, before a takeover, by the previous.
  const std::set<std::string>& dead_hosts() const { return dead_hosts_; }
  // Whether `member`'s death was taken (reported, or its host declared dead).
  bool DeathTaken(const std::string& member) const { return handled_deaths_.count(member) != 0; }
  // Whether `host` has been silent for the host timeout at `now`, as of the last tick.
  bool IsSilent(const std::string& host, absl::Time now) const {
    return host_liveness_.IsSilent(host, now);
  }
  // The hosts whose heartbeat has not advanced for `quiet` at `now`, as of the last tick
  // (HostLiveness::QuietFor): a hang's diagnosis holds off while a host of its generation is.
  std::vector<HostLiveness::Silent> HostsQuietFor(absl::Duration quiet, absl::Time now) const {
    return host_liveness_.QuietFor(quiet, now);
  }
  // The names of the hosts HostsQuietFor(`quiet`, `now`) returns, and of the hosts declared dead
  // (no longer watched, their ranks replaced by the declaration, while the new generation may not
  // be published yet): the RankWatch holds the kills of their stale ranks (Hooks::quiet_hosts), a
  // kill asked of a silent or dead host's agent being one nobody carries out.
  std::set<std::string> QuietHosts(absl::Duration quiet, absl::Time now) const {
    std::set<std::string> hosts(dead_hosts_.begin(), dead_hosts_.end());
    for (const HostLiveness::Silent& host : host_liveness_.QuietFor(quiet, now)) {
      hosts.insert(host.host);
    }
    return hosts;
  }
  // When this coordinator's view of the hosts' heartbeats last started afresh (a takeover, its
  // first read, a gap in its reads): until the quiet time after it, HostsQuietFor cannot name a
  // host that was silent before. InfinitePast when it never watched hosts (one host).
  absl::Time HostBoundsSince() const {
    return std::max(took_over_at_, host_liveness_.bounds_since());
  }
  bool done_published() const { return done_published_; }

 private:
  bool coordinating() { return hooks_.coordinating(); }
  // The hosts' liveness where the store says how old each heartbeat is (Store::MultiGetWithAges):
  // the hosts due for a read (never read, or their beat a quarter of the host timeout old), and at
  // a tick (`tick`) the counts of joins and departures in the same request, listing the hosts
  // again when they changed; the silent hosts declared dead. Sets ages_unsupported_ when the store
  // keeps no ages. Returns whether the store answered (true when nothing was due between ticks).
  bool ReadHostsByAge(bool tick);
  // Judges the ages of `hosts`' heartbeats, `aged` from index `first_beat` on, read at `read_at`,
  // and declares the silent hosts dead.
  void ObserveAgedBeats(const std::set<std::string>& hosts,
                        const std::vector<std::optional<Store::AgedValue>>& aged, size_t first_beat,
                        absl::Time read_at);
  // Where the store keeps no ages: the hosts listed and every watched host's heartbeat value read;
  // whether the store answered.
  bool ReadHostsByValue();
  // Lists the joined hosts and those that left into watched_hosts_; false when the store did not
  // answer (or the job is done).
  bool ListHosts();
  void DeclareSilentHostDead(const HostLiveness::Silent& silent);
  // TryReplacements' ends: a dead host's ranks all taken in `next`; no standby for `dead` and none
  // coming (`refused`: the rendezvous coordinator's answer).
  void HostReplaced(const PendingReplacement& dead, const Membership& next);
  void FailForLackOfStandbys(const PendingReplacement& dead, const absl::Status& refused);

  Store* const store_;
  Clock* const clock_;
  RendezvousCoordinator* rendezvous_;
  RecoveryStrategy* strategy_ = nullptr;
  ReplacementPolicy* const replacement_policy_;
  RenewalPolicy* const renewal_policy_;
  FailureHistory* const failures_;
  const JobCoordinatorOptions options_;
  const Hooks hooks_;

  int world_size_ = 0;
  int64_t round_ = 0;
  HostLiveness host_liveness_;
  absl::Time took_over_at_ = absl::InfinitePast();  // TakeOver's last call
  std::set<std::string> dead_hosts_;
  // The hosts whose heartbeats are judged (the last ListHosts): joined, not left, not this agent's
  // own (those declared dead since are skipped where it is read).
  std::set<std::string> watched_hosts_;
  // The store keeps no write instants: the heartbeats' values are watched instead.
  bool ages_unsupported_ = false;
  // When the hosts were last listed, and the counts of joins and departures read before it.
  absl::Time hosts_listed_at_ = absl::InfinitePast();
  std::optional<std::string> join_count_listed_;
  std::optional<std::string> left_count_listed_;
  std::set<std::string> handled_deaths_;  // member ids whose death was taken
  bool done_published_ = false;
  std::deque<PendingReplacement> replacements_;
  std::vector<Recovery> recoveries_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_COORDINATOR_JOB_COORDINATOR_H_
