// HostAgent: the duties of `trainguard run`'s agent on one host that are its own, whichever host
// coordinates: its heartbeat (agents/hb/<host>) and the bound on losing the store, following the
// published generations (a standby of this host named for a rank takes it; a rank of this host
// that lost its rank is killed), carrying out the kill requests the coordinator addresses to this
// host (agents/kill/<host>/<member>, fenced by the lease term), reporting its workers' deaths
// (agents/deaths/<member>, with the cause, once each) and stops (agents/stopped/<member>), killing
// a rank stopped too long where nothing else would notice (before its restart round formed),
// watching the job's end (job/failed, job/done), stopping when the coordinator fenced this host
// out (agents/dead/<host>): its workers are stopped, since their ranks were given to other hosts,
// leaving (agents/left/<host>; the agent that serves the store waits for the others to leave), and
// under --fail-slow publishing its host's sample once a second (agents/metrics/<host>, HostSampler)
// for the coordinator's detector.
//
// It acts on the workers the launcher started through the ProcessSupervisor and keeps (Hooks::
// workers: the launcher's processes are HostWorkers), and hands to the hooks what stays in the
// launcher: printing a line, recording an event, the newest lease term this agent has seen (the
// coordinator lease is the rendezvous layer's; on one host there is none). What ends the agent is
// returned (AgentExit) for the launcher's loop to end on, so tests read it without a process.
//
// Every decision is taken on the store and the supervisor it is given, with the Clock for its
// instants: tests drive it with an in-memory store, a ManualClock and the fake supervisor
// (tests/unit/host_agent_test.cc), no process and no sleep.
//
// The heartbeat is this host's proof of life to the coordinator, which declares a host whose
// heartbeat stood still for --host-timeout dead and gives its ranks to others. It is written on a
// thread of its own (StartBeating), not in the turn: a turn slowed down by a loaded machine or a
// slow store is no sign that the host is gone, and fencing a live host out costs the job every
// rank it held. A host whose process is killed or stopped (SIGKILL, SIGSTOP) beats no more, and is
// declared within --host-timeout as before; so is one whose loop has not turned (Heartbeat) for
// loop_stall_bound: an agent wedged for that long carries out none of its duties.
//
// Thread safety: not thread-safe; one thread (the launcher's loop, a test) uses an instance, beside
// the heartbeat thread it owns (StartBeating), which only writes the heartbeat; BeatOnce, the
// heartbeat thread's step, may be called by a test standing in for it.
#ifndef TRAINGUARD_SDK_HOST_AGENT_HOST_AGENT_H_
#define TRAINGUARD_SDK_HOST_AGENT_HOST_AGENT_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/agent/failure_history.h"
#include "sdk/agent/process_supervisor.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/duty_thread.h"
#include "sdk/core/mutex.h"
#include "sdk/core/rank_reports.h"
#include "sdk/core/store_keys.h"
#include "sdk/host_agent/host_sampler.h"
#include "trainguard/clock.h"
#include "trainguard/events.h"
#include "trainguard/membership.h"
#include "trainguard/store.h"

namespace trainguard {

// A process of this host as its agent sees it: a rank, or a standby (rank -1 until it takes one).
// The launcher's own record of a process extends it.
struct HostWorker {
  WorkerId worker = 0;  // its ProcessSupervisor's name for it
  pid_t pid = -1;
  std::string member_id;  // store_keys::MemberId, as the rendezvous knows it
  int rank = -1;
  int standby_index = -1;
  // The generation in which it took `rank` (0 for a rank it was started with): a hang of an
  // earlier generation is not this process's.
  int64_t rank_generation = 0;
  bool running = true;  // its exit not seen yet
  // Killed by its agent (HostAgent::KillWorker): its death is expected, and not killed twice.
  bool killed_for_liveness = false;
  // The evidence of its death, for the message that fails the job (FailureHistory): why its agent
  // killed it, else the last error line it printed (the launcher feeds its output to it).
  std::string kill_reason;
  CauseLine printed_cause;
  bool reported_stopped = false;  // agents/stopped/<member_id> written (ReportStoppedWorkers)
  bool death_reported = false;    // agents/deaths/<member_id> written (ReportDeath)
  bool stop_signalled = false;    // SIGTERM sent to stop it (SignalStop)
  // Since when it has been seen stopped (KillRanksStoppedFor); InfiniteFuture: running.
  absl::Time stopped_since = absl::InfiniteFuture();

  std::string Label() const;  // "rank 3", "standby 1"
  std::string Cause() const { return kill_reason.empty() ? printed_cause.line() : kill_reason; }
};

// What ends this host's agent: the launcher's exit code, and why (empty when it succeeded).
struct AgentExit {
  int code = 0;
  std::string failure;

  friend bool operator==(const AgentExit&, const AgentExit&) = default;
};

// This host's part of the job's plan (agents/plan, HostAgent::ReadPlan): the ranks it starts,
// its standbys, and where the job's rank 0 listens.
struct HostAssignment {
  int group_rank = -1;  // -1: a standby host (or not named by the plan: it joined after it)
  int training_hosts = 0;
  int world_size = 0;  // training_hosts x ranks per host
  std::string master_addr;
  int master_port = 0;
  std::vector<int> ranks;  // group_rank x N .. group_rank x N + N - 1; none on a standby host
  int standbys = 0;        // the standby processes it starts

  // "host H is group G of T: ranks A..B[ (restart round R)]" or "host H is a standby host: S
  // standbys".
  std::string Describe(const std::string& host, int64_t round) const;
  friend bool operator==(const HostAssignment&, const HostAssignment&) = default;
};

// Asks `host`'s agent to kill the process of `member` (the coordinator's act): writes the request
// (agents/kill/<host>/<member>), then advances the host's count of requests (agents/kills/<host>),
// which its agent reads every turn and lists the requests only when it moved. The store's error
// when either write fails (a request without its count is carried out at the next count's move).
absl::Status RequestKill(Store* store, std::string_view host, std::string_view member,
                         const store_keys::KillRequest& request, absl::Duration timeout);

// What `plan` gives `host`, which runs `ranks_per_host` ranks (--nproc-per-node) and keeps
// `spares` standbys beside them (--standby): a training host its group's ranks and the spares, a
// standby host `ranks_per_host` standbys (one for each rank of a host it may replace); under
// --restart-all (`restart_all`) no standby at all (torchrun's spare node holds no process until a
// restart round gives it a group). FailedPrecondition when the plan's ranks per host are not
// `ranks_per_host` (the host cannot follow it).
absl::StatusOr<HostAssignment> AssignmentOf(const store_keys::Plan& plan, const std::string& host,
                                            int ranks_per_host, int spares, bool restart_all);

// One host's part of a plan of its own (`trainguard run` on one host: nothing to publish, no other
// host to wait for): group 0 of one host, every rank (0 .. `ranks` - 1, --nproc) and `spares`
// standbys (--standby, which one host keeps under --restart-all too), rank 0 at `master_addr`:
// `master_port`.
HostAssignment OneHostAssignment(int ranks, int spares, const std::string& master_addr,
                                 int master_port);

struct HostAgentOptions {
  // This host in the store's keys and member ids: --host-id, or on one host the machine's name.
  std::string host_id;
  // How long one store call of the agent's loop may take (AgentCallTimeout).
  absl::Duration call_timeout = absl::Milliseconds(750);
  // How long a death report may take: the coordinator waits for it to replace the rank.
  absl::Duration report_timeout = absl::Seconds(10);
  // The store's address, for the message of a host that lost it.
  std::string store_url;
  // A host whose heartbeat the store has not taken for longer than this gives up (a partition
  // shorter than this heals).
  absl::Duration store_loss_bound = absl::Seconds(30);
  // A heartbeat thread beats only while the loop turned (Heartbeat) within this bound by the
  // clock: an agent wedged longer is declared dead by the coordinator.
  absl::Duration loop_stall_bound = absl::Seconds(30);
  // The exit code of an agent whose job failed, or whose host was fenced out.
  int failed_exit_code = 1;
  // What this host runs of the plan (AssignmentOf): --nproc-per-node, --standby, --restart-all.
  int ranks_per_host = 1;
  int spares = 0;
  bool restart_all = false;
};

class HostAgent {
 public:
  using Attributes = std::vector<std::pair<std::string, std::string>>;
  struct Hooks {
    // This host's workers, live or not, as the launcher keeps them (pointers valid until the
    // launcher's next change of its list, so only for the call they are returned to).
    std::function<std::vector<HostWorker*>()> workers;
    // Says one line of the launcher's output (without the "trainguard run: " prefix).
    std::function<void(const std::string&)> say;
    // Records an event of `kind` for `rank` (-1: none) in the launcher's event file.
    std::function<void(int rank, EventKind kind, const std::string& message, Attributes attributes)>
        record;
    // The newest coordinator lease term this agent has seen: a kill request of an older term came
    // from a coordinator deposed meanwhile.
    std::function<int64_t()> latest_term;
    // The pid file of the process that holds `rank` (<run dir>/pids/[<host>/]rank-<rank>).
    std::function<std::string(int rank)> pid_file;
    // A worker of this host took a rank (TakeRank): the launcher starts another standby when it
    // keeps spares.
    std::function<void(HostWorker& worker)> rank_taken;
  };

  // REQUIRES: `store`, `clock` and `supervisor` outlive the agent; every hook is set. `store` is
  // the job's (the agents'); `supervisor` started the workers Hooks::workers returns.
  HostAgent(Store* store, Clock* clock, ProcessSupervisor* supervisor, HostAgentOptions options,
            Hooks hooks);
  // Stops the heartbeat thread (StopBeating).
  ~HostAgent();
  HostAgent(const HostAgent&) = delete;
  HostAgent& operator=(const HostAgent&) = delete;

  // The turn's share of the heartbeat: notes that the loop turned, beats once where no heartbeat
  // thread runs (BeatOnce), and returns why this host gives up when the store has taken no beat
  // for longer than store_loss_bound by the clock, with the last beat's error (the launcher fails
  // the job with it); nullopt otherwise.
  std::optional<std::string> Heartbeat();
  // Beats agents/hb/<host> once (the counter of beats the store took, plus one; a Set, which may be
  // retried on another etcd member, not an Add), unless the loop has not turned for
  // loop_stall_bound: the heartbeat thread's step. Returns the Set's status (FailedPrecondition,
  // naming the stall, when it did not beat).
  absl::Status BeatOnce();
  // Starts the heartbeat thread (a DutyThread): a wait of `interval` (real time, cut short by
  // StopBeating), then BeatOnce, until StopBeating. From then on Heartbeat leaves the beats to it.
  // REQUIRES: `interval` > 0. Nothing when it runs already.
  void StartBeating(absl::Duration interval);
  // Stops and joins the heartbeat thread (at most one beat under way, call_timeout, is waited
  // for). Nothing when it does not run.
  void StopBeating();
  // The beats the store took.
  int64_t beats() const {
    MutexLock lock(&beat_mu_);
    return beats_;
  }
  // When the store last took a beat (the start of that call; the agent's creation before any).
  absl::Time last_beat_taken() const {
    MutexLock lock(&beat_mu_);
    return store_seen_;
  }

  // This host's part of the published plan (AssignmentOf). NotFound while the coordinator has
  // published none; the store's error when it does not answer; FailedPrecondition, naming the
  // plan and this host, when the plan is malformed or has another number of ranks per host (the
  // job cannot go on with this host).
  absl::StatusOr<HostAssignment> ReadPlan();

  // Follows the newest published generation `current` (the launcher reads it): each running
  // worker of this host that `current` names for a rank it does not hold yet takes it (TakeRank);
  // each running rank that `current` no longer names (its host was declared dead, or it was
  // declared stale) is killed, unless a pending kill request for it is carried out first
  // (ExecuteKillRequests: its reason is the one recorded, the culprit a report names).
  void FollowMembership(const Membership& current);

  // `worker` (a standby, or a rank relabelled) holds `rank` from `generation` on: said, and its
  // pid written to the rank's pid file (Hooks::pid_file), then Hooks::rank_taken is told.
  void TakeRank(HostWorker& worker, int rank, int64_t generation);

  // A standby `worker` that exited: if the coordinator had assigned it a rank (rdzv/assign/<member>
  // in `ranks_store`, the ranks' namespace of the current round), it takes that rank now
  // (TakeRank), so that its death is reported as the rank's (ReportDeath) and the rank replaced.
  // A standby learns its assignment from the store at once, its agent only at its next turn: one
  // that died in between (its restore failed, it was killed) died holding the rank. Returns
  // whether it took one; false when none was assigned or the store does not answer (then it is a
  // parked standby's death, as before).
  bool TakeAssignedRank(HostWorker& worker, Store* ranks_store);

  // The job's end as the other agents published it: job/failed (said as "job failed: <why>", the
  // failed exit code with <why>) before job/done (exit code 0). nullopt while neither is there or
  // the store does not answer.
  std::optional<AgentExit> WatchJobEnd();

  // Whether the coordinator fenced this host out (agents/dead/<host>, which says why): then its
  // ranks were given to other hosts, so this agent says so ("fenced out: ..."), sends its running
  // workers SIGTERM (SignalStop; the launcher's stop SIGKILLs them after its grace) and returns the
  // failed exit code. Only this host ends: nothing is published for the others.
  std::optional<AgentExit> CheckFenced();

  // Carries out the kill requests addressed to this host (agents/kill/<host>/<member>): the live
  // worker that `member` names, not killed yet, is killed (KillWorker) with the request's kind and
  // reason. A request of a lease term older than Hooks::latest_term came from a coordinator
  // deposed meanwhile and is ignored (said); a malformed one too. Each request read is deleted.
  // The requests are listed only when their count (agents/kills/<host>, RequestKill) moved since
  // the last listing: one Get per turn, read with the turn's other keys (TurnReadStore).
  void ExecuteKillRequests();

  // SIGKILLs `worker`'s process group and records `what` (rank_unresponsive, hang_suspect, ...)
  // with its pid; `why` follows "killing it" in the line said (e.g. ": <reason>"). Its death is
  // then reaped and reported like any other, with "the launcher killed it<why>" as its cause.
  void KillWorker(HostWorker& worker, EventKind what, const std::string& why);

  // Tells the coordinator that `worker`, which held its rank, died (`how`: "exited with status 1",
  // "killed by SIGKILL"): a DeathReport with its member, rank, `how` and its cause, delivered
  // through the store (agents/deaths/<member>) unless set_rank_reports gave another way. Once per
  // worker: a later call for the same worker delivers nothing. A delivery that fails is said.
  void ReportDeath(HostWorker& worker, const std::string& how);
  // Tells the coordinator that `worker` finished its rank with status 0 in restart round `round`
  // (agents/[round<K>/]finished/<rank> through the store unless set_rank_reports gave another
  // way): the coordinator ends the job once every rank of the round finished. Best effort.
  void ReportFinished(HostWorker& worker, int64_t round);
  // Where ReportDeath and ReportFinished deliver from now on (one host: the coordinator in this
  // process, InProcessRankReports); by default the store (StoreRankReports, within
  // report_timeout). REQUIRES: `reports` outlives the agent.
  void set_rank_reports(RankReports* reports) { rank_reports_ = reports; }

  // Writes agents/stopped/<member> (this host) for each running rank the supervisor says is
  // stopped (SIGSTOP), and deletes it once the rank runs again or is gone. The coordinator, which
  // cannot see another host's processes, reads these (a stopped rank dumps no hang and its
  // heartbeat goes stale late), and so do the ranks waiting for it in a collective.
  void ReportStoppedWorkers();

  // Kills (KillWorker, rank_unresponsive) each running rank of this host that the supervisor has
  // seen stopped (SIGSTOP) for `bound` or longer by the clock, counted from the first call that
  // saw it stopped; one seen running again starts afresh. Its reason: ": stopped for <d>
  // <context>". For where nothing else would notice: a rank stopped before its restart round
  // formed has no heartbeat to go stale, and the round would wait for it until the rendezvous
  // timeout.
  void KillRanksStoppedFor(absl::Duration bound, const std::string& context);

  // Says that this host's agent leaves the job with `exit_code` (agents/left/<host>), once its
  // workers are stopped, and beats no more (StopBeating): the agent that serves the store waits for
  // it (WaitForOthersToLeave). Best effort: a store that does not answer within a second is not
  // waited for.
  void Leave(int exit_code);

  // The agent that serves the job's store (TcpStore) keeps serving it until every other host that
  // joined has left or was declared dead (HostsStillInJob: a host fenced out, then back, counts
  // once), so that every agent reads the job's end before the store goes; at most `bound` by the
  // clock, reading the store every 50 ms (the clock's SleepFor). True when every other host left in
  // time; else false, said as "stopping the store before every host left (still in the job: <the
  // hosts>; ...)", "unknown" for the hosts when the store never answered.
  bool WaitForOthersToLeave(absl::Duration bound);

  // Sends SIGTERM to every running worker not sent it yet: the start of a stop (the launcher waits
  // for them, and SIGKILLs those left after its grace).
  void SignalStop();

  // --fail-slow: publishes this host's sample (agents/metrics/<host>) at most once a second by the
  // clock: what `sampler` makes of the running ranks (workers holding a rank), with their work
  // records (health/rank/<rank>, one MultiGet) and the GPU each uses (its local rank: rank %
  // `ranks_per_host`). Nothing on a host with no rank (a standby host: nothing to compare until
  // its standbys take ranks), nor while the sampler has no interval to compare yet. Best effort: a
  // second the store does not take is a gap the coordinator's detector fills.
  void PublishHostSample(HostSampler& sampler, int ranks_per_host);

  const HostAgentOptions& options() const { return options_; }

 private:
  std::vector<HostWorker*> workers() { return hooks_.workers(); }

  Store* const store_;
  Clock* const clock_;
  ProcessSupervisor* const supervisor_;
  const HostAgentOptions options_;
  const Hooks hooks_;
  StoreRankReports store_rank_reports_;
  RankReports* rank_reports_ = &store_rank_reports_;

  // The heartbeat's state, shared by the loop (Heartbeat) and the heartbeat thread (BeatOnce).
  mutable Mutex beat_mu_;
  int64_t beats_ ABSL_GUARDED_BY(beat_mu_) = 0;
  absl::Time store_seen_ ABSL_GUARDED_BY(beat_mu_);   // when the store last took a beat (its start)
  absl::Status last_beat_ ABSL_GUARDED_BY(beat_mu_);  // the last beat's outcome
  absl::Time loop_turned_ ABSL_GUARDED_BY(beat_mu_);  // when the loop last called Heartbeat
  std::unique_ptr<DutyThread> beater_;                // while the heartbeat thread runs
  // The count of kill requests (agents/kills/<host>) when they were last listed; nullopt: never.
  std::optional<std::string> kill_count_seen_;
  absl::Time next_host_sample_ = absl::InfinitePast();  // PublishHostSample's next second
  bool work_records_asked_ = false;  // PublishHostSample wrote health/work_wanted
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_HOST_AGENT_HOST_AGENT_H_
