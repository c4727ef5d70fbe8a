// JobCoordinator: the coordinator of a multi-host `trainguard run` job, the duties of whichever
// host agent holds the coordinator lease. So far its host-level duties: which hosts are in the job
// and alive (their agents' heartbeats, judged by HostLiveness), the fence of a host found silent
// (agents/dead/<host>) and the replacement of its ranks in one entry, the ranks' deaths that the
// agents report (agents/deaths/<member>, each member once, its cause kept in the FailureHistory),
// and the word that every rank finished (job/done, once).
//
// What it decides, the launcher carries out: it queues the ranks and hosts to give to standbys
// (replacements(), consumed by the launcher's TryReplacements through the RendezvousCoordinator),
// and hands what it cannot do itself to the hooks: failing the job, starting a restart round
// (--restart-all on several hosts), printing a line, recording an event. The launcher still owns
// the processes, the rendezvous coordinator, the replacements, the hangs and the renewals.
//
// Every act that writes to the store or says what it decided checks the gate (the coordinator
// lease, Hooks::coordinating) right before it: a deposed coordinator writes nothing. Every instant
// is read from the Clock, so tests drive it with an in-memory store and a ManualClock, no process
// and no sleep (tests/unit/job_coordinator_test.cc).
//
// Thread safety: not thread-safe; one thread (the agent's loop, a test) uses an instance.
#ifndef TRAINGUARD_SDK_COORDINATOR_JOB_COORDINATOR_H_
#define TRAINGUARD_SDK_COORDINATOR_JOB_COORDINATOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "sdk/agent/failure_history.h"
#include "sdk/agent/host_liveness.h"
#include "sdk/agent/replacement_policy.h"
#include "sdk/rendezvous/rendezvous.h"
#include "trainguard/clock.h"
#include "trainguard/events.h"
#include "trainguard/store.h"

namespace trainguard {

// A rank, or a whole host's ranks, to give to parked standbys (the launcher's TryReplacements).
struct PendingReplacement {
  int rank;  // -1: a whole host (ranks)
  std::string how;
  absl::Time died;              // when the death was seen; a dead host's: its last heartbeat
  absl::Time give_up;           // no standby parked by then: the job fails
  absl::Time not_before;        // the crash-loop backoff
  std::vector<int> ranks = {};  // a dead host's ranks, replaced in one generation
  std::string host = {};
};

struct JobCoordinatorOptions {
  std::string host_id;  // this agent's host: alive while it coordinates, never declared dead
  // --host-timeout: a host whose heartbeat stood still this long is dead.
  absl::Duration host_timeout = absl::Seconds(3);
  // How long one store call of the agent's loop may take.
  absl::Duration call_timeout = absl::Milliseconds(750);
  int max_replacements = 10;  // --max-replacements, for the message that fails the job
  bool restart_all = false;   // --restart-all: a death starts a restart round, nothing is replaced
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
    // --restart-all: starts the next restart round for `why`; `dead_host`, when not empty, hands
    // its group rank to a standby host; `since`: when the fault began (InfinitePast: now).
    std::function<void(const std::string& why, const std::string& dead_host, absl::Time since)>
        restart_round;
  };

  // REQUIRES: `store`, `clock`, `rendezvous` (see set_rendezvous), `replacement_policy` and
  // `failures` outlive the coordinator; every hook is set. `store` is the job's (the agents');
  // `rendezvous` publishes the generations (the membership whose ranks a dead host held);
  // `replacement_policy` counts a rank's deaths against --max-replacements and the crash-loop
  // backoff; `failures` is the job's history of deaths, for the message that fails it.
  JobCoordinator(Store* store, Clock* clock, RendezvousCoordinator* rendezvous,
                 ReplacementPolicy* replacement_policy, FailureHistory* failures,
                 JobCoordinatorOptions options, Hooks hooks);
  JobCoordinator(const JobCoordinator&) = delete;
  JobCoordinator& operator=(const JobCoordinator&) = delete;

  // Every tick of the coordinating agent once the plan is known: reads the joined hosts and their
  // heartbeats and declares the silent ones dead (DeclareHostDead), takes the agents' death reports
  // (ReadDeathReports), and publishes job/done once every rank finished. Hosts that left and hosts
  // declared dead are not watched; nothing is done once job/done is published.
  void CoordinateHosts();

  // Takes the death reports (agents/deaths/<member>) not taken yet: each is recorded as a death
  // with its cause, and its rank queued for replacement (QueueDeadMember); the death of a standby
  // or of a rank already replaced only forgets the standby. With restart_all, a death of the
  // current round starts a restart round. A death before generation 0 formed fails the job.
  void ReadDeathReports();

  // Queues `rank`, which `member` held, for replacement: counted as a death (`how`) against
  // --max-replacements and the crash-loop backoff; a later death report of `member` is ignored.
  // Returns false when the job failed instead (the bound was reached).
  bool QueueDeadMember(int rank, const std::string& member, const std::string& how);

  // Fences `host` out (agents/dead/<host> = `why`) and queues the ranks it held (those not
  // finished) for replacement in one entry, replacing any of them queued already; with restart_all,
  // starts a restart round when it trained. `last_beat`: when its heartbeat last advanced, the
  // recovery's start. Nothing when the gate is closed; when the fence cannot be written, tried
  // again at the next tick (the host stays silent).
  void DeclareHostDead(const std::string& host, absl::Time last_beat, const std::string& why);

  // This agent took the lease over: the hosts' bounds start afresh (HostLiveness), no death report
  // counts as taken, and the hosts dead are those the store names (agents/dead/).
  void TakeOver(absl::Duration timeout);
  // This agent lost the lease: what it queued is its successor's to decide again.
  void Depose() { replacements_.clear(); }

  // What the launcher reads of the job's shape: its world size (0: no plan yet) and its restart
  // round (--restart-all; 0: the job's first start). Set them as they change.
  void set_world_size(int world_size) { world_size_ = world_size; }
  void set_round(int64_t round) { round_ = round; }
  // A restart round's ranks form under a rendezvous coordinator of their own (on the round's
  // store): the memberships are read from `rendezvous` from now on.
  // REQUIRES: `rendezvous` outlives the coordinator, or the next set_rendezvous.
  void set_rendezvous(RendezvousCoordinator* rendezvous) { rendezvous_ = rendezvous; }

  // The ranks and hosts to replace, oldest first. The launcher pops what it replaced, and queues a
  // single host's deaths here too.
  std::deque<PendingReplacement>& replacements() { return replacements_; }
  // The hosts declared dead (fenced), by this coordinator or, before a takeover, by the previous.
  const std::set<std::string>& dead_hosts() const { return dead_hosts_; }
  // Whether `member`'s death was taken (reported, or its host declared dead).
  bool DeathTaken(const std::string& member) const { return handled_deaths_.count(member) != 0; }
  // Whether `host` has been silent for the host timeout at `now`, as of the last tick.
  bool IsSilent(const std::string& host, absl::Time now) const {
    return host_liveness_.IsSilent(host, now);
  }
  bool done_published() const { return done_published_; }

 private:
  bool coordinating() { return hooks_.coordinating(); }

  Store* const store_;
  Clock* const clock_;
  RendezvousCoordinator* rendezvous_;
  ReplacementPolicy* const replacement_policy_;
  FailureHistory* const failures_;
  const JobCoordinatorOptions options_;
  const Hooks hooks_;

  int world_size_ = 0;
  int64_t round_ = 0;
  HostLiveness host_liveness_;
  std::set<std::string> dead_hosts_;
  std::set<std::string> handled_deaths_;  // member ids whose death was taken
  bool done_published_ = false;
  std::deque<PendingReplacement> replacements_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_COORDINATOR_JOB_COORDINATOR_H_
