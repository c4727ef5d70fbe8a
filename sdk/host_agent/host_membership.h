// HostMembership: how this host's agent is in the job beside the others: it joins the job, takes
// its part in every turn of the agent's loop, tells the other hosts that the job failed, and
// leaves. `trainguard run` chooses one implementation at start, so that its loop reads the same
// calls for one host and several:
// - StoreHostMembership (several hosts, --nnodes): the hosts meet through the job's store. It joins
//   (agents/join/<host>), beats and watches its fence and the job's end every host_timeout / 12
//   (HostAgent; where the launcher started the agent's heartbeat thread, the turn only checks that
//   the store still takes its beats, HostAgent::Heartbeat), hands the rest of the turn (the lease,
//   the plan, the generation, coordinating) to the launcher's hooks, publishes a failure
//   (job/failed) for every other agent to stop on, and leaves (agents/left/<host>; the agent that
//   serves the store waits for the others).
// - OneHostMembership (one host): the agent and the coordinator share one process and no other host
//   is in the job: nothing to join, publish or leave, and no store call added to the loop beyond
//   its ranks' stop reports (agents/stopped/<member>, which the ranks waiting for a stopped peer
//   read) once generation 0 formed.
//
// Tests drive both with an in-memory store, a ManualClock and the fake supervisor
// (tests/unit/host_membership_test.cc), no process and no sleep.
//
// Thread safety: not thread-safe; one thread (the agent's loop, a test) uses an instance.
#ifndef TRAINGUARD_SDK_HOST_AGENT_HOST_MEMBERSHIP_H_
#define TRAINGUARD_SDK_HOST_AGENT_HOST_MEMBERSHIP_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "sdk/host_agent/host_agent.h"
#include "sdk/host_agent/turn_read_store.h"
#include "trainguard/clock.h"
#include "trainguard/store.h"

namespace trainguard {

class HostMembership {
 public:
  virtual ~HostMembership() = default;
  // Joins the job, once, before the loop starts. An error when this host cannot be in the job (the
  // store's, or AlreadyExists naming a host id another agent joined with).
  virtual absl::Status Join() = 0;
  // Starts this host's processes where they need no other host, once, after Join: one host plans
  // every rank of the job here, starts them at once and forms generation 0; several hosts start
  // theirs later, in the turn that first reads a plan naming them (Tick). An error when they could
  // not be started: the job cannot start (the processes that did start are the caller's to stop).
  virtual absl::Status Start() = 0;
  // Restart round `round` (>= 1) began, every process of this host stopped (--restart-all): starts
  // this host's processes of the round. One host: every rank at once, and the round's generation 0
  // forms; several: those the published plan gives this host. An error names why not (the plan
  // could not be read, a process could not start).
  virtual absl::Status StartRound(int64_t round) = 0;
  // This host's part of one turn of the agent's loop (every turn; an implementation keeps its own
  // cadence). Returns how this agent ends when the job ended for it in this turn (fenced out, or
  // the job's end as the others published it); a failure of its own goes to the fail hook.
  virtual std::optional<AgentExit> Tick() = 0;
  // The job failed for `message` (said already by the caller): the other hosts' agents stop their
  // processes too, and say why.
  virtual void AnnounceFailure(const std::string& message) = 0;
  // This agent leaves the job with `exit_code`, its processes stopped.
  virtual void Leave(int exit_code) = 0;
  // What this host says of a job that succeeded, after "job <id> succeeded: " in its last line:
  // `ranks_finished_here` is how many of its processes finished a rank with status 0 in the last
  // round.
  virtual std::string DescribeSuccess(int ranks_finished_here) const = 0;
};

// The keys one turn of a several-host agent reads with a Get (StoreHostMembership::Hooks::
// turn_keys): its fence, the job's end, its kill requests' count, the coordinator lease; the plan
// until it follows it (`following`: its processes were started), then the newest generation and a
// rank's job stop where the ranks' keys are the agents' (`ranks_on_agents_store`: not in a restart
// round, whose store is its own); the restart round under --restart-all (`restart_all`).
std::vector<std::string> AgentTurnKeys(const std::string& host, bool following,
                                       bool ranks_on_agents_store, bool restart_all);

struct StoreHostMembershipOptions {
  // The join record (store_keys::JoinRecord) of this host: --host-id, --role standby, --local-addr
  // and the port its rank 0 would listen on if it held rank 0 (MASTER_PORT).
  std::string host_id;
  bool standby_host = false;
  std::string local_addr;
  int master_port = 0;
  std::string job_id;  // for the message of a host id that joined twice
  // How long the join's store calls may take.
  absl::Duration join_timeout = absl::Seconds(10);
  // How long the turn's read of its keys (Hooks::turn_keys) may take.
  absl::Duration call_timeout = absl::Milliseconds(750);
  // The cadence of the agent's turns (--host-timeout / 12): the heartbeat's, and the rest's.
  absl::Duration tick_interval = absl::Milliseconds(250);
  // Whether this agent serves the job's store (HostLayout::serve_store_port): it then leaves only
  // once every other host left or was declared dead, at most `leave_wait`, so that they read the
  // job's end before the store goes.
  bool serves_store = false;
  absl::Duration leave_wait = absl::Seconds(11);
};

class StoreHostMembership final : public HostMembership {
 public:
  struct Hooks {
    // Fails the job for `why` (this host lost the store for longer than its bound).
    std::function<void(const std::string& why)> fail;
    // Whether the job ended for this agent meanwhile (a hook failed it): the rest of the turn is
    // skipped.
    std::function<bool()> ended;
    // The coordinator lease: renewed, watched or taken (LeaseKeeper::Update); released on leaving.
    std::function<void()> update_lease;
    std::function<void()> release_lease;
    // Follows the plan (this host's processes started once it names them) and the newest
    // generation (its standbys take ranks, its ranks that lost theirs are killed).
    std::function<void()> follow;
    // The coordinator's share of the turn, when this agent holds the lease (the hosts' liveness and
    // reports, generation 0's formation), and the fail-slow sample and detection.
    std::function<void()> coordinate;
    // Starts the processes the published plan gives this host in a restart round (the plan is read
    // anew: a standby host may hold a dead host's group rank now); an error names why not.
    std::function<absl::Status()> start_planned;
    // The keys this turn reads with a Get (its fence, the job's end, the lease, the newest
    // generation, its kill requests' count, the plan until it is followed...): read at the turn's
    // start in one request (TurnReadStore::BeginTurn).
    std::function<std::vector<std::string>()> turn_keys;
  };

  // REQUIRES: `store`, `clock`, `agent` and `turn_reads` outlive this; every hook is set. `store`
  // is the job's (the agents'); `agent` is this host's; `turn_reads` is the store in front of
  // `store` that the agent's parts read through (the agent, the lease, the rendezvous coordinator):
  // each turn's Gets of Hooks::turn_keys are answered from one MultiGet made at the turn's start.
  StoreHostMembership(Store* store, Clock* clock, HostAgent* agent, TurnReadStore* turn_reads,
                      StoreHostMembershipOptions options, Hooks hooks);
  StoreHostMembership(const StoreHostMembership&) = delete;
  StoreHostMembership& operator=(const StoreHostMembership&) = delete;

  // Writes this host's join record (agents/join/<host>, its sequence from agents/seq): the
  // coordinator's plan orders the hosts by it. AlreadyExists, naming the host id, the job and the
  // record there, when another agent joined with this host id.
  absl::Status Join() override;
  // Nothing: this host's processes start when the coordinator's plan names them (Hooks::follow).
  absl::Status Start() override { return absl::OkStatus(); }
  absl::Status StartRound(int64_t round) override;
  // At most once per tick_interval by the clock: the keys the turn reads, in one request
  // (Hooks::turn_keys: what follows reads them as of the turn's start); the heartbeat (a host that
  // lost the store past its
  // bound fails the job: Hooks::fail); then the fence (a fenced host ends first, whether or not the
  // job ended meanwhile: it leaves saying it was fenced out) and the job's end (job/failed, then
  // job/done) end this agent, before it could take over a lease the leaving coordinator released;
  // then the lease, the plan and generation, the kill requests addressed to this host, its stop
  // reports, and the coordinator's share, each skipped once the job ended for this agent.
  std::optional<AgentExit> Tick() override;
  // job/failed = `message`, within 2 s (best effort: the others also see this host leave).
  void AnnounceFailure(const std::string& message) override;
  // Releases the lease (within a second), says it left (agents/left/<host>), and when it serves the
  // store waits for the others to leave (HostAgent::WaitForOthersToLeave).
  void Leave(int exit_code) override;
  // "every rank finished; host <id>: K rank(s) finished here": the job's ranks were on several
  // hosts, and this one says its share.
  std::string DescribeSuccess(int ranks_finished_here) const override;

 private:
  Store* const store_;
  Clock* const clock_;
  HostAgent* const agent_;
  TurnReadStore* const turn_reads_;
  const StoreHostMembershipOptions options_;
  const Hooks hooks_;
  absl::Time next_tick_ = absl::InfinitePast();
};

class OneHostMembership final : public HostMembership {
 public:
  struct Hooks {
    // Whether the current round's generation 0 formed (or failed to) and was said.
    std::function<bool()> formed;
    // Plans every rank of the job on this host and starts their processes (in round 0 with the
    // --standby spare processes too), then forms the round's generation 0; an error names the
    // process that could not start.
    std::function<absl::Status(int64_t round)> start_every_rank;
  };
  // `ranks`: the job's ranks, all of them this host's (--nproc).
  // REQUIRES: `agent` outlives this; every hook is set.
  OneHostMembership(HostAgent* agent, int ranks, Hooks hooks)
      : agent_(agent), ranks_(ranks), hooks_(std::move(hooks)) {}

  absl::Status Join() override { return absl::OkStatus(); }  // no other host to meet
  // This host's plan is its own: every rank, at once (Hooks::start_every_rank).
  absl::Status Start() override { return hooks_.start_every_rank(0); }
  absl::Status StartRound(int64_t round) override { return hooks_.start_every_rank(round); }
  // Once generation 0 formed: this host's stop reports (HostAgent::ReportStoppedWorkers), for the
  // ranks waiting for a stopped peer. Never ends the agent: its coordinator, in this process,
  // decides the job's end.
  std::optional<AgentExit> Tick() override;
  void AnnounceFailure(const std::string&) override {}  // no other agent to tell
  void Leave(int) override {}  // no lease, no other host waits for this one
  // "N ranks finished": every rank of the job was this host's.
  std::string DescribeSuccess(int ranks_finished_here) const override;

 private:
  HostAgent* const agent_;
  const int ranks_;
  const Hooks hooks_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_HOST_AGENT_HOST_MEMBERSHIP_H_
