// The agent of `trainguard run` (launch_agent.h; its flags: tools/launcher.h). One thread runs the
// job: a poll loop over its workers (their output pipes and exits, through the ProcessSupervisor)
// and a signalfd (SIGCHLD, SIGINT, SIGTERM); generation 0 is formed on one helper thread.
#include "sdk/launch/launch_agent.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <string.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "sdk/agent/fail_slow_policy.h"
#include "sdk/agent/failure_history.h"
#include "sdk/agent/posix_process_supervisor.h"
#include "sdk/agent/process_supervisor.h"
#include "sdk/agent/renewal_policy.h"
#include "sdk/agent/replacement_policy.h"
#include "sdk/checkpoint/backup_placement.h"
#include "sdk/checkpoint/backup_service.h"
#include "sdk/checkpoint/snapshotter.h"
#include "sdk/coordinator/fail_slow_coordinator.h"
#include "sdk/coordinator/hang_coordinator.h"
#include "sdk/coordinator/in_process_rank_reports.h"
#include "sdk/coordinator/job_coordinator.h"
#include "sdk/coordinator/lease_keeper.h"
#include "sdk/coordinator/plan_publisher.h"
#include "sdk/coordinator/rank_watch.h"
#include "sdk/coordinator/recovery_strategy.h"
#include "sdk/coordinator/restart_all.h"
#include "sdk/coordinator/standby_replacement.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/event_log.h"
#include "sdk/core/mutex.h"
#include "sdk/core/proc_stat.h"
#include "sdk/core/store_keys.h"
#include "sdk/health/fail_slow_detector.h"
#include "sdk/health/fail_slow_metrics.h"
#include "sdk/host_agent/host_agent.h"
#include "sdk/host_agent/host_membership.h"
#include "sdk/host_agent/host_sampler.h"
#include "sdk/rendezvous/coordinator_lease.h"
#include "sdk/rendezvous/rendezvous.h"
#include "sdk/rendezvous/tcp_store.h"
#include "sdk/runtime/peer_progress.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/hang_diagnosis.h"
#include "trainguard/checkpoint.h"
#include "trainguard/env.h"
#include "trainguard/events.h"
#include "trainguard/options.h"
#include "trainguard/store.h"
#include "trainguard/topology.h"

extern char** environ;

namespace trainguard {
namespace {

constexpr absl::Duration kStoreTimeout = absl::Seconds(10);
// How long one store call of the agent's loop may take: short, so that a host cut off from the
// store keeps draining its ranks' output and sees its fencing as soon as it is back.
absl::Duration AgentCallTimeout(absl::Duration host_timeout) { return host_timeout / 4; }
// Fail-slow dumps kept per run (the newest): a host confirmed again every continuity window
// would otherwise write one per window for the job's life.
constexpr int kMaxFailSlowDumps = 16;
// Store keys the ranks write for the launcher: a rank that gives up because the job cannot go on
// (sdk/runtime: a fault that repeats after rollback), and a checkpoint a rank could not persist
// (sdk/checkpoint: job/persist_failed/<step>/<rank>, the error as the value).
constexpr const char* kJobStopKey = store_keys::kJobStop;
constexpr const char* kPersistFailedPrefix = store_keys::kJobPersistFailedPrefix;

// The standby replacement's bounds and backoff (--restart-all is a strategy of its own:
// RestartAll). On several hosts a rank's death is decided by the coordinator (QueueDeadMember),
// which finds standbys on standby hosts.
ReplacementPolicyOptions ReplacementOptions(const LaunchConfig& config) {
  ReplacementPolicyOptions options;
  options.max_replacements = config.max_replacements;
  options.restart_backoff = config.restart_backoff;
  const bool multi_host = config.nnodes_min > 0;
  options.has_standbys = config.standby > 0 || multi_host;
  return options;
}

RenewalPolicyOptions RenewalOptions(const LaunchConfig& config) {
  RenewalPolicyOptions options;
  options.multi_host = config.nnodes_min > 0;
  options.host_timeout = config.host_timeout;
  options.restart_all = config.restart_all >= 0;
  return options;
}

// Process start time in clock ticks since boot (/proc/<pid>/stat field 22): with the pid, it names
// a process for good (a pid alone may be reused). Empty when there is no such process.
std::string ProcessStartTime(pid_t pid) {
  absl::StatusOr<ProcStat> stat = ReadProcStat(pid);
  return stat.ok() ? absl::StrCat(stat->start_time_ticks) : "";
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

// Written to a temporary file and renamed over `path`: a reader sees the old contents or the new,
// never an empty or half-written file.
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

// One process of the job: a rank, or a standby (rank -1 until it is assigned one). What its host's
// agent acts on (HostAgent) is the HostWorker; the rest is the launcher's.
struct Child : HostWorker {
  absl::Time started;
};

class Job {
 public:
  // REQUIRES: `clock` outlives the job. Every decision instant is read from it (the deaths, the
  // backoffs, the hosts' and ranks' liveness, the hangs, the renewals, the events' times); only
  // bounded waits on sockets, processes and condition variables run in real time.
  explicit Job(LaunchConfig config, Clock* clock = Clock::Real())
      : config_(std::move(config)), layout_(LayoutOf(config_, MachineName())), clock_(clock) {}
  ~Job() {
    // The threads that renew the lease and beat the heartbeat use lease_ and store_, which go
    // before them.
    if (lease_keeper_ != nullptr) lease_keeper_->StopRenewing();
    if (host_agent_ != nullptr) host_agent_->StopBeating();
    if (former_.joinable()) {
      stop_forming_.store(true);
      former_.join();
    }
    if (signal_fd_ >= 0) close(signal_fd_);
  }

  int Run();

 private:
  absl::Status Prepare();
  // job_coordinator_, on store_ and coordinator_ (Prepare, once they exist).
  void CreateJobCoordinator();
  // rank_watch_, on ranks_store() and coordinator_ (Prepare; a restart points it at the new ones).
  void CreateRankWatch();
  // lease_keeper_, on lease_ (Prepare; one host: none) and coordinator_.
  void CreateLeaseKeeper();
  // plan_publisher_, on store_ (Prepare).
  void CreatePlanPublisher();
  // recovery_, the strategy --restart-all chooses (Prepare, after job_coordinator_).
  void CreateRecoveryStrategy();
  // A TcpStore of the launcher's own on 127.0.0.1 with a fresh token (store_url_, token_file_,
  // server_, store_).
  absl::Status StartOwnStore();
  // Appends a custom event what=`what` to the launcher's event file (launcher.h); best effort.
  void Record(int rank, EventKind what, const std::string& message,
              std::vector<std::pair<std::string, std::string>> attributes = {});
  // After StopAll, for a restart: ends the generation-0 former, forgets that the job formed and
  // every child (their output descriptors closed).
  void ForgetStoppedProcesses();
  // RestartAll's act (Hooks::start_round), one host as several: SIGKILLs every process of this
  // host, removes the shared memory they held in round `from`, and starts this host's ranks of
  // round `to` (its plan) under the round's job id, on the round's store namespace.
  void StartRound(int64_t from, int64_t to);
  // The restart round the ranks run in (RecoveryStrategy::round; 0 before recovery_ exists).
  int64_t round() const { return recovery_ != nullptr ? recovery_->round() : 0; }
  // Whether the current round's generation 0 formed (or failed to).
  bool RoundFormed() {
    MutexLock lock(&formed_mu_);
    return formed_.has_value();
  }
  // The store options of this agent's connections: on several hosts every connection leaves from
  // this host's address, so that a partition between hosts (by address) cuts this agent off too.
  OpenStoreOptions AgentStoreOptions() const {
    OpenStoreOptions options;
    options.source_address = layout_.source_address;
    options.control = true;  // the agent's and coordinator's calls go ahead of the ranks'
    return options;
  }
  // The job id the ranks run under: the job's, or in restart round K "<job id>.round<K>", so that
  // a round's store keys and shared-memory segments are its own.
  std::string RanksJobId() const { return RoundJobId(config_.job_id, round()); }
  // The store as the ranks see it (their job id's namespace); store_ is the agents' (the job's).
  Store* ranks_store() const { return round_store_ != nullptr ? round_store_.get() : store_.get(); }
  // Where ranks that finished with status 0 are recorded: a restart round starts the count anew.
  std::string FinishedPrefix() const { return store_keys::AgentFinishedPrefix(round()); }
  // This host's part of the plan (HostAgent::ReadPlan) into assignment_, group_rank_, world_size_,
  // master_addr_/port_; while there is none, the coordinator publishes it when the hosts suffice
  // (PlanPublisher). False when there is none yet (or the job failed on one it cannot follow).
  bool ReadPlan();
  // Starts the processes assignment_ names (StartPlannedProcesses, StartEveryRank): the first
  // that cannot be started ends it, its error returned.
  absl::Status SpawnAssignedProcesses();
  // One host's start and restart rounds (OneHostMembership::Hooks::start_every_rank): its plan is
  // its own, built here and never published (group 0 of one host, every rank of --nproc, in round 0
  // the --standby spares too: assignment_, group_rank_, spawned_); its processes start at once and
  // the round's generation 0 forms (StartForming). The first process that cannot start ends it,
  // its error returned.
  absl::Status StartEveryRank(int64_t round);
  // Several hosts: starts this host's processes once the published plan names its group rank (its
  // N ranks and --standby spares, or N standbys on a standby host and on a host that joined after
  // the plan), in the first turn that reads it (StoreHostMembership::Hooks::follow) and in each
  // restart round, the plan read anew (Hooks::start_planned). NotFound while there is none to read
  // (ReadPlan); a process that cannot start fails the job.
  absl::Status StartPlannedProcesses();
  absl::Status Spawn(int rank, int standby_index);
  std::vector<std::string> ChildEnvironment(const Child& child) const;
  // Prints the workers' output lines ("[rank 0] ..."); an exit marks the child not running and,
  // unless the job is `stopping` (StopAll), is answered by OnExit.
  void HandleWorkerEvents(const std::vector<WorkerEvent>& events, bool stopping);
  Child* ChildOf(WorkerId worker);
  // Reads the signalfd: a SIGINT or SIGTERM is kept in interrupted_ (a SIGCHLD only woke the loop).
  void ReadSignals();
  void OnExit(Child& child, const WorkerExit& exit);
  // Whether the current round's generation 0 formed, for the decision about a death of this host
  // (InProcessRankReports): waits up to 5 s for the former's word.
  bool FormedForADeath();
  void OnStandbyExit(Child& child, const std::string& how);
  void RespawnStandbys();
  // JobCoordinator's Hooks::rank_taken: `member` took `rank` in `generation`: recorded; a member
  // of this host (on one host, every one) is relabelled here at once, another host's is said (its
  // own agent relabels it, FollowGeneration).
  void OnRankTaken(int rank, const std::string& member, int64_t generation);
  std::optional<std::string> ReadJobStop(absl::Duration timeout);
  // One host: a rank's stop (job/stop), read every 250 ms by the loop; several hosts read it in
  // the agent's turn, with the turn's other keys.
  void WatchJobStop();
  void StopJob(const std::string& reason);
  // Silent data corruption: each host a rank's judge handed over for eviction
  // (job/silent_corruption_evict/<host>: silent_corruption=evict, or named a second time) is
  // evicted as a fail-slow host is (declared dead, its ranks replaced by parked standbys of other
  // hosts), within the eviction budget (--fail-slow-max-evict-share, counting the fail-slow
  // evictions too); one that cannot be is said, and, named a second time under repair or evict,
  // stops the job. Once per request. The coordinator's.
  void EvictCorruptHosts();
  // The lines that describe the backup placement of a job of `training_hosts` hosts (said by the
  // coordinator with the plan, PlanPublisher::Hooks::backup_lines): none without peer backups;
  // InvalidArgument when no placement is possible.
  absl::StatusOr<std::vector<std::string>> BackupLines(int training_hosts) const;
  // The backup placement the ranks of a job of `training_hosts` hosts compute (the same
  // variables); nullopt without peer backups. InvalidArgument naming what is wrong.
  struct Placement {
    BackupPlacementSpec spec;
    BackupPlacement placement;
  };
  absl::StatusOr<std::optional<Placement>> ComputePlacement(int training_hosts) const;
  std::string Summary() const;
  void ReportLaggards();
  // hang_coordinator_, on store_, job_coordinator_ and the hooks below (after each
  // CreateJobCoordinator). One host: the hang coordinator sees every rank's process here
  // (LocalHolderOf, KillHangSuspect); several: every rank's through the store and its agent.
  void CreateHangCoordinator();
  LocalHolder LocalHolderOf(int rank);
  void KillHangSuspect(int rank, int64_t generation);
  // The running process of this host that holds `rank` and is not being killed; nullptr if none.
  Child* RunningHolder(int rank);
  // Ranks whose communicators failed ask for a new generation (RendezvousMember::
  // RequestNewGeneration): JobCoordinator renews it, or under --restart-all asks for a restart, as
  // RenewalPolicy (sdk/agent/renewal_policy.h) decides; this tells it what holds a renewal back.
  void RenewGenerationWhenAsked();
  void StopAll(absl::Duration grace);
  void Fail(const std::string& why);
  // Forms generation 0 on the helper thread former_.
  void StartForming();

  // Multi-host agent (config_.nnodes_min > 0); see launcher.h. Each runs on the loop's thread.
  // Whether other hosts are in the job (layout_.several_hosts) is read by the wiring only: Prepare
  // (the coordinator lease), CreateHostMembership and CreateHangCoordinator's hooks. What differs
  // in the behaviour is chosen there once, behind membership_, or is data of layout_.
  // membership_, on host_agent_ (Prepare, last): the one choice between one host and several
  // that is behaviour (how this host's processes start, what the loop's turn does for this host,
  // joining, a failure's word to the other hosts, leaving), made once.
  void CreateHostMembership();
  // The keys one turn of this agent reads with a Get (StoreHostMembership::Hooks::turn_keys).
  std::vector<std::string> TurnKeys() const;
  void FollowGeneration();
  // The coordinator's share: generation 0's formation, then job_coordinator_'s host duties (host
  // liveness, the ranks' deaths the agents report, completion).
  void CoordinateHosts();
  // Several hosts, coordinator: `member`, which holds `rank` and its agent reports stopped, is
  // killed through its agent (KillMember) and queued for replacement at once: SIGKILL ends a
  // stopped process without it running again, so waiting for the agent's death report (the
  // process's exit, about 0.1 s for a PyTorch rank, then an agent tick and a coordinator tick) only
  // delays its standby. A store write of it is fenced once its generation is superseded.
  void KillAndReplaceStoppedMember(int rank, const std::string& member, EventKind what,
                                   const std::string& why);
  // Kills `member` here when it is this agent's child, else asks its host's agent to; the agent
  // that kills it records `what` (rank_unresponsive, hang_suspect) with its pid.
  void KillMember(const std::string& member, EventKind what, const std::string& why);
  // Kills this agent's child `c` for the coordinator, recording `what` with its pid
  // (HostAgent::KillWorker).
  void KillForLiveness(Child& c, EventKind what, const std::string& why) {
    host_agent_->KillWorker(c, what, why);
  }
  // host_agent_, on store_ and supervisor_ (Prepare, once they exist).
  void CreateHostAgent();
  // The parked standbys that the dead `ranks` (of `dead_host`, or the dead host's) go to first
  // (ChooseStandbys; JobCoordinator's Hooks::preferred_standbys); empty: any.
  std::vector<std::string> PreferredStandbys(const std::string& dead_host,
                                             const std::vector<int>& ranks);
  // The hosts that now run a rank holding `rank`'s backups or whose backups `rank` holds (the
  // job's backup placement); none without peer backups.
  std::set<std::string> HostsSharingBackups(int rank);
  // Fail-slow hosts (LaunchConfig::fail_slow): every agent publishes its host's sample once a
  // second (HostAgent::PublishHostSample); the coordinator detects and acts (FailSlowCoordinator).
  void SampleHost();
  void DetectFailSlow();
  // The coordinating agent's own event file, <run_dir>/events/agent-<host>.tgev (opened lazily).
  void AppendAgentEvent(Event event);
  std::string HostPrefix() const { return config_.host_id + ":"; }
  // This host in member ids and in agents/stopped/ (HostLayout::host_label).
  const std::string& HostLabel() const { return layout_.host_label; }
  // The gate of every coordinator act (LeaseKeeper::Coordinating): true on one host; on several,
  // while this agent holds the coordinator lease by its clock.
  bool coordinating() { return lease_keeper_->Coordinating(); }
  // Signals `child`'s whole process group (the rank's command and everything it started), unless
  // its exit was seen: its leftovers were SIGKILLed then (PosixProcessSupervisor).
  void SignalGroup(const Child& child, int sig);
  // Flushed at once: with stdout a file or a pipe, a line would otherwise wait for the next output
  // of a rank, which may never come.
  void Say(const std::string& line) {
    std::printf("trainguard run: %s\n", line.c_str());
    std::fflush(stdout);
  }
  bool CanSpawnStandby() const;
  // <run dir>/pids/[<host>/]rank-<rank>: the pid of the process that holds `rank`.
  std::string PidFile(int rank) const;

  LaunchConfig config_;
  const HostLayout layout_;  // worked out from config_ once
  Clock* const clock_;       // before every member initialized from it
  std::string store_url_;
  std::string token_file_;
  std::string launcher_start_time_;  // TRAINGUARD_LAUNCHER_START_TIME
  int master_port_ = 0;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<Store> store_;
  // store_ itself: the job's store behind the turn's reads (TurnReadStore; Prepare).
  TurnReadStore* turn_reads_ = nullptr;
  std::unique_ptr<RendezvousCoordinator> coordinator_;
  // Several hosts: how this agent follows the generations while it does not coordinate (on the
  // ranks' store of the current round).
  std::unique_ptr<GenerationFollower> follower_;
  // Starts, signals and reaps every process of the job (created by Prepare); children_ are its
  // workers.
  std::unique_ptr<ProcessSupervisor> supervisor_;
  std::vector<std::unique_ptr<Child>> children_;
  // This host's agent duties (sdk/host_agent/host_agent.h; created by Prepare, on one host too):
  // its heartbeat, the generations it follows, the kill requests addressed to it, its ranks' death
  // and stop reports, the job's end, its fence, its leaving.
  // One host: its coordinator takes the host agent's reports (its ranks' deaths and finishes) in
  // this process (no store round trip before a replacement); several: none, they go through the
  // store (HostAgent's default).
  // Before host_agent_, which keeps a pointer to it.
  std::unique_ptr<InProcessRankReports> rank_reports_;
  std::unique_ptr<HostAgent> host_agent_;
  // How this host is in the job beside the others (sdk/host_agent/host_membership.h; Prepare):
  // several hosts through the store (join, the agent's turn, job/failed, leave), one host in
  // process (its turn: its stop reports).
  std::unique_ptr<HostMembership> membership_;
  int signal_fd_ = -1;
  int interrupted_ = 0;  // the SIGINT or SIGTERM read from signal_fd_; 0: none
  int standbys_spawned_ = 0;
  int ranks_finished_ = 0;  // by this host's processes, in the current round (the summary's)
  // One host: its coordinator found every rank of the current round finished (rank_reports_);
  // several hosts learn it from job/done (HostAgent::WatchJobEnd).
  bool every_rank_finished_ = false;
  int exit_code_ = -1;
  std::string failure_;               // why the job failed or was stopped, for the summary
  std::unique_ptr<EventLog> events_;  // <run_dir>/events/launcher.tgev
  bool formed_reported_ = false;      // generation 0's formation (or failure) was said
  // How the job recovers, chosen once (--restart-all: RestartAll; else StandbyReplacement), and
  // handed the faults job_coordinator_ finds; its round() is the restart round the ranks run in.
  std::unique_ptr<RecoveryStrategy> recovery_;
  // The ranks' store of the current restart round (null in round 0: store_ is theirs).
  std::unique_ptr<Store> round_store_;
  std::string token_;  // the store's token (a round's store is opened with it)
  absl::Time restarted_at_ = absl::InfinitePast();  // the last restart round's start (StartRound)

  // Every rank's and standby's deaths and the replacements made: what a death leads to.
  ReplacementPolicy replacement_policy_{ReplacementOptions(config_)};
  std::deque<absl::Time> standby_respawns_;  // when each pending respawn is due
  // The ranks' and hosts' deaths with their evidence: the first failure that Fail names. On
  // several hosts the coordinator's (from the death reports).
  FailureHistory failures_;

  absl::Time next_stop_check_ = absl::InfinitePast();
  absl::Time next_persist_check_ = absl::InfinitePast();

  // The coordinator's host duties and replacements (sdk/coordinator/job_coordinator.h; created by
  // Prepare, on one host too): its replacements() are the ranks and hosts it gives to standbys,
  // its recoveries() those CheckRecoveries measures.
  std::unique_ptr<JobCoordinator> job_coordinator_;
  std::deque<PendingReplacement>& replacements() { return job_coordinator_->replacements(); }
  std::vector<Recovery>& recoveries() { return job_coordinator_->recoveries(); }
  // What the coordinator watches of the ranks (sdk/coordinator/rank_watch.h; created with
  // job_coordinator_): their heartbeats, the recoveries' ends, protection, persist failures.
  std::unique_ptr<RankWatch> rank_watch_;
  // The plan, published by the coordinator of several hosts (sdk/coordinator/plan_publisher.h).
  std::unique_ptr<PlanPublisher> plan_publisher_;
  // Whether this agent coordinates (sdk/coordinator/lease_keeper.h; one host: always).
  std::unique_ptr<LeaseKeeper> lease_keeper_;
  // This host's part of the plan once read (ReadPlan).
  std::optional<HostAssignment> assignment_;
  // The hangs the ranks declare, diagnosed and acted on (sdk/coordinator/hang_coordinator.h;
  // created with job_coordinator_).
  std::unique_ptr<HangCoordinator> hang_coordinator_;
  // When the ranks' requests for a new generation renew it (RenewGenerationWhenAsked); it keeps
  // when the current generation's first request was seen.
  RenewalPolicy renewal_policy_{RenewalOptions(config_)};

  // World size: nproc on one host; hosts x nproc-per-node once the plan is known.
  int world_size_ = 0;
  // The backup placement once computed (HostsSharingBackups); the inner nullopt: no peer backups.
  std::optional<std::optional<Placement>> placement_;
  // Multi-host agent state.
  std::unique_ptr<CoordinatorLease> lease_;
  int group_rank_ = -1;   // this host's group rank; -1 for a standby host
  bool spawned_ = false;  // this host's processes were started after the plan
  int64_t followed_generation_ = -1;
  std::string master_addr_ = "127.0.0.1";
  // A host cut off from the store for this long gives up (a partition shorter than this heals).
  absl::Duration StoreLossBound() const {
    return std::max(absl::Seconds(30), 10 * config_.host_timeout);
  }

  // Fail-slow: this agent's sampler (made, and NVML looked for, at SampleHost's first call) and,
  // once it coordinates, the detector's side (made at DetectFailSlow's first call).
  std::unique_ptr<HostSampler> host_sampler_;
  std::unique_ptr<FailSlowCoordinator> fail_slow_;
  // EvictCorruptHosts: the requests handled ("<key>=<value>"), the hosts evicted.
  std::set<std::string> corruption_requests_;
  int corruption_evictions_ = 0;
  std::unique_ptr<EventLog> agent_events_;

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
  absl::StatusOr<std::unique_ptr<EventLog>> events = EventLog::Open(env, layout_.events_file);
  if (!events.ok()) return events.status();
  events_ = *std::move(events);
  std::string token;
  if (config_.store.empty()) {
    if (absl::Status s = StartOwnStore(); !s.ok()) return s;
  } else {
    store_url_ = config_.store;
    token_file_ = config_.token_file;
    if (!token_file_.empty()) {
      absl::StatusOr<std::string> contents = env->ReadFileToString(token_file_);
      if (!contents.ok()) return contents.status();
      token = std::string(absl::StripTrailingAsciiWhitespace(*contents));
      token_ = token;
    }
    // torchrun's c10d rule: the agent on the endpoint's host serves the store (and is the job's
    // single point of failure).
    if (layout_.serve_store_port != 0) {
      TcpStoreServerOptions options;
      options.host = config_.local_addr;
      options.port = layout_.serve_store_port;
      options.job_token = token;
      absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start(options);
      if (!server.ok()) return server.status();
      server_ = *std::move(server);
      Say(
          absl::StrFormat("serving the job's store on %s (this host is the job's single point of "
                          "failure: use an etcd cluster to have none)",
                          store_url_));
    }
  }
  if (!config_.store.empty()) {
    absl::StatusOr<std::unique_ptr<Store>> store =
        OpenStore(store_url_, config_.job_id, token, kStoreTimeout, AgentStoreOptions());
    if (!store.ok()) return store.status();
    store_ = *std::move(store);
  }
  // The agent's turn reads its keys in one request (StoreHostMembership::Tick): every part of this
  // agent reads the job's store through it.
  {
    auto turn_reads = std::make_unique<TurnReadStore>(std::move(store_));
    turn_reads_ = turn_reads.get();
    store_ = std::move(turn_reads);
  }
  if (layout_.clears_stale_job_keys) {
    // An external store may remember a stop of an earlier run of this job id: this run starts
    // afresh. (The ranks' keys are the rendezvous' business; these two are the launcher's.)
    (void)store_->Delete(kJobStopKey, kStoreTimeout);
    absl::StatusOr<std::vector<std::string>> old =
        store_->ListKeys(kPersistFailedPrefix, kStoreTimeout);
    if (old.ok()) {
      for (const std::string& key : *old) (void)store_->Delete(key, kStoreTimeout);
    }
  }
  launcher_start_time_ = ProcessStartTime(getpid());
  world_size_ = config_.nproc;
  if (layout_.several_hosts) {
    // The holder stops acting AgentCallTimeout before the expiry: a write of the agent's loop that
    // passed the gate has timed out before anyone can take the lease over.
    lease_ = std::make_unique<CoordinatorLease>(store_.get(), config_.host_id, config_.host_timeout,
                                                clock_, AgentCallTimeout(config_.host_timeout));
    coordinator_ = std::make_unique<RendezvousCoordinator>(store_.get(), clock_, config_.host_id,
                                                           lease_.get());
    follower_ = std::make_unique<GenerationFollower>(store_.get());
  } else {
    coordinator_ = std::make_unique<RendezvousCoordinator>(store_.get(), clock_);
  }
  CreateLeaseKeeper();
  CreateJobCoordinator();
  CreateRankWatch();
  CreatePlanPublisher();
  CreateRecoveryStrategy();
  CreateHangCoordinator();
  master_port_ = FreePort();

  sigset_t signals;
  sigemptyset(&signals);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM}) sigaddset(&signals, sig);
  signal_fd_ = signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd_ < 0) return absl::InternalError(absl::StrCat("signalfd: ", strerror(errno)));
  PosixProcessSupervisorOptions supervisor_options;
  supervisor_options.wake_fd = signal_fd_;  // a signal ends the loop's wait at once
  supervisor_ = std::make_unique<PosixProcessSupervisor>(supervisor_options);
  CreateHostAgent();
  for (const std::string& dir : {layout_.log_dir, layout_.pid_dir}) {
    if (absl::Status s = env->CreateDirs(dir); !s.ok()) return s;
  }
  CreateHostMembership();
  if (absl::Status s = membership_->Join(); !s.ok()) return s;
  if (layout_.several_hosts) {
    // The heartbeat and the lease's renewal on threads of their own, at the turn's cadence: a slow
    // turn is no sign that this host, or its coordinator, is gone (host_agent.h, lease_keeper.h).
    host_agent_->StartBeating(config_.host_timeout / 12);
    lease_keeper_->StartRenewing(config_.host_timeout / 12);
  }
  return absl::OkStatus();
}

void Job::CreateHostMembership() {
  if (!layout_.several_hosts) {
    // One host is one agent and one coordinator in one process: the agent's reports reach the
    // coordinator's decision directly, and no other host is there to meet.
    InProcessRankReports::Hooks reports;
    reports.formed = [this] { return FormedForADeath(); };
    reports.every_rank_finished = [this] { every_rank_finished_ = true; };
    rank_reports_ = std::make_unique<InProcessRankReports>(&failures_, recovery_.get(), clock_,
                                                           config_.nproc, std::move(reports));
    host_agent_->set_rank_reports(rank_reports_.get());
    OneHostMembership::Hooks hooks;
    hooks.formed = [this] { return formed_reported_; };
    hooks.start_every_rank = [this](int64_t round) { return StartEveryRank(round); };
    membership_ =
        std::make_unique<OneHostMembership>(host_agent_.get(), config_.nproc, std::move(hooks));
    return;
  }
  // Several hosts meet through the store; the deaths and finishes go through it too (HostAgent's
  // default reports).
  StoreHostMembershipOptions options;
  options.host_id = config_.host_id;
  options.standby_host = config_.standby_host;
  options.local_addr = config_.local_addr;
  options.master_port = master_port_;
  options.job_id = config_.job_id;
  options.join_timeout = kStoreTimeout;
  options.call_timeout = AgentCallTimeout(config_.host_timeout);
  options.tick_interval = config_.host_timeout / 12;
  options.serves_store = server_ != nullptr;
  options.leave_wait = 2 * config_.host_timeout + absl::Seconds(5);
  StoreHostMembership::Hooks hooks;
  hooks.fail = [this](const std::string& why) { Fail(why); };
  hooks.ended = [this] { return exit_code_ >= 0; };
  hooks.update_lease = [this] { lease_keeper_->Update(); };
  hooks.release_lease = [this] { lease_keeper_->Release(absl::Seconds(1)); };
  hooks.follow = [this] {
    if (!spawned_) (void)StartPlannedProcesses();  // NotFound: no plan yet
    if (exit_code_ < 0) FollowGeneration();
    // A rank's stop, read with the turn's keys (one host reads it in its loop instead).
    if (exit_code_ < 0) {
      if (std::optional<std::string> reason = ReadJobStop(AgentCallTimeout(config_.host_timeout));
          reason.has_value()) {
        StopJob(*reason);
      }
    }
  };
  hooks.coordinate = [this] {
    if (coordinating()) CoordinateHosts();
    if (exit_code_ < 0 && config_.fail_slow != LaunchConfig::FailSlowPolicy::kOff) {
      SampleHost();
      if (coordinating()) DetectFailSlow();
    }
  };
  hooks.start_planned = [this] { return StartPlannedProcesses(); };
  hooks.turn_keys = [this] { return TurnKeys(); };
  membership_ = std::make_unique<StoreHostMembership>(
      store_.get(), clock_, host_agent_.get(), turn_reads_, std::move(options), std::move(hooks));
}

std::vector<std::string> Job::TurnKeys() const {
  return AgentTurnKeys(HostLabel(), spawned_, round_store_ == nullptr, config_.restart_all >= 0);
}

void Job::CreateJobCoordinator() {
  fail_slow_.reset();  // it reads the coordinator (and the store) replaced here
  JobCoordinatorOptions options;
  options.host_id = config_.host_id;
  options.host_timeout = config_.host_timeout;
  options.call_timeout = AgentCallTimeout(config_.host_timeout);
  options.max_replacements = config_.max_replacements;
  // One host: a replacement waits for a standby still starting as long as generation 0 may take
  // to form; several: for a standby host's agent to join, start and park its standbys.
  options.standby_wait = layout_.standby_wait;
  options.spread_standbys = config_.spread_standbys;
  options.replace_timeout = kStoreTimeout;
  JobCoordinator::Hooks hooks;
  hooks.coordinating = [this] { return coordinating(); };
  hooks.say = [this](const std::string& line) { Say(line); };
  hooks.record = [this](int rank, EventKind kind, const std::string& message,
                        JobCoordinator::Attributes attributes) {
    Record(rank, kind, message, std::move(attributes));
  };
  hooks.fail = [this](const std::string& why) { Fail(why); };
  hooks.preferred_standbys = [this](const std::string& dead_host, const std::vector<int>& ranks) {
    return PreferredStandbys(dead_host, ranks);
  };
  // A standby due to be respawned, or one of this host's standbys running but not parked yet.
  // (On several hosts a standby host's standbys are its own agent's: not seen here.)
  hooks.standby_starting = [this] {
    return !standby_respawns_.empty() ||
           std::any_of(children_.begin(), children_.end(),
                       [](const std::unique_ptr<Child>& c) { return c->running && c->rank < 0; });
  };
  hooks.rank_taken = [this](int rank, const std::string& member, int64_t generation) {
    OnRankTaken(rank, member, generation);
  };
  // The faults it finds go to the recovery strategy, made after it (CreateRecoveryStrategy).
  job_coordinator_ = std::make_unique<JobCoordinator>(store_.get(), clock_, coordinator_.get(),
                                                      &replacement_policy_, &renewal_policy_,
                                                      &failures_, options, std::move(hooks));
  job_coordinator_->set_world_size(world_size_);
}

void Job::CreateRankWatch() {
  RankWatchOptions watch;
  watch.heartbeat_timeout = config_.heartbeat_timeout;
  watch.host_timeout = config_.host_timeout;
  watch.store_timeout = kStoreTimeout;
  RankWatch::Hooks watch_hooks;
  watch_hooks.coordinating = [this] { return coordinating(); };
  watch_hooks.say = [this](const std::string& line) { Say(line); };
  watch_hooks.record = [this](int rank, EventKind kind, const std::string& message,
                              RankWatch::Attributes attributes) {
    Record(rank, kind, message, std::move(attributes));
  };
  watch_hooks.kill_member = [this](const std::string& member, EventKind what,
                                   const std::string& why) { KillMember(member, what, why); };
  watch_hooks.report_laggards = [this] { ReportLaggards(); };
  // Quiet for a third of the host timeout, as the hang's diagnosis holds off for (host_quiet): a
  // stale rank of such a host is left to the host's declaration.
  watch_hooks.quiet_hosts = [this] {
    return job_coordinator_->QuietHosts(config_.host_timeout / 3, clock_->Now());
  };
  watch_hooks.kill_and_replace = [this](int rank, const std::string& member, EventKind what,
                                        const std::string& why) {
    KillAndReplaceStoppedMember(rank, member, what, why);
  };
  rank_watch_ = std::make_unique<RankWatch>(store_.get(), ranks_store(), clock_, coordinator_.get(),
                                            watch, std::move(watch_hooks));
  rank_watch_->set_world_size(world_size_);
}

void Job::CreateLeaseKeeper() {
  LeaseKeeper::Hooks hooks;
  hooks.say = [this](const std::string& line) { Say(line); };
  hooks.resume = [this] { return coordinator_->Resume(kStoreTimeout); };
  hooks.generation = [this] { return coordinator_->generation(); };
  hooks.took_over = [this] {
    // The hangs of earlier generations were the old coordinator's to diagnose, and on several
    // hosts none can be acted on once its generation moved on: diagnosing them again, each waiting
    // out the dumps' grace for ranks long replaced, held up the current generation's hang by
    // seconds.
    hang_coordinator_->Reset(coordinator_->generation());
    // Every host's bound starts afresh, the previous holder's too; the dead hosts are the store's.
    job_coordinator_->TakeOver(kStoreTimeout);
  };
  hooks.deposed = [this] { job_coordinator_->Depose(); };  // its queue and its recoveries
  // A loop wedged for as long as a store loss is borne renews the lease no more (LeaseKeeper).
  lease_keeper_ = std::make_unique<LeaseKeeper>(
      lease_.get(), AgentCallTimeout(config_.host_timeout), std::move(hooks), StoreLossBound());
}

void Job::CreatePlanPublisher() {
  PlanOptions options;
  options.nnodes_min = config_.nnodes_min;
  options.nnodes_max = config_.nnodes_max;
  options.standby_nodes = config_.standby_nodes;
  options.ranks_per_host = config_.nproc;
  options.last_call = config_.rdzv_last_call;
  options.call_timeout = AgentCallTimeout(config_.host_timeout);
  PlanPublisher::Hooks hooks;
  hooks.coordinating = [this] { return coordinating(); };
  hooks.say = [this](const std::string& line) { Say(line); };
  hooks.backup_lines = [this](int training_hosts) { return BackupLines(training_hosts); };
  hooks.fail = [this](const std::string& why) { Fail(why); };
  plan_publisher_ =
      std::make_unique<PlanPublisher>(store_.get(), clock_, options, std::move(hooks));
}

void Job::CreateRecoveryStrategy() {
  if (config_.restart_all < 0) {
    StandbyReplacement::Hooks hooks;
    hooks.say = [this](const std::string& line) { Say(line); };
    hooks.fail = [this](const std::string& why) { Fail(why); };
    recovery_ = std::make_unique<StandbyReplacement>(&replacement_policy_, job_coordinator_.get(),
                                                     std::move(hooks));
    job_coordinator_->set_recovery_strategy(recovery_.get());
    return;
  }
  RestartAllOptions options;
  options.host_id = config_.host_id;
  options.limit = config_.restart_all;
  options.ranks_per_host = config_.nproc;
  options.heartbeat_timeout = config_.heartbeat_timeout;
  options.call_timeout = AgentCallTimeout(config_.host_timeout);
  options.scope = layout_.restart_scope;
  RestartAll::Hooks hooks;
  hooks.coordinating = [this] { return coordinating(); };
  hooks.say = [this](const std::string& line) { Say(line); };
  hooks.record = [this](int rank, EventKind kind, const std::string& message,
                        RestartAll::Attributes attributes) {
    Record(rank, kind, message, std::move(attributes));
  };
  hooks.fail = [this](const std::string& why) { Fail(why); };
  hooks.start_round = [this](int64_t from, int64_t to) { StartRound(from, to); };
  hooks.kill_stopped = [this](absl::Duration bound, const std::string& context) {
    host_agent_->KillRanksStoppedFor(bound, context);
  };
  recovery_ = std::make_unique<RestartAll>(store_.get(), clock_, job_coordinator_.get(),
                                           std::move(options), std::move(hooks));
  job_coordinator_->set_recovery_strategy(recovery_.get());
}

absl::Status Job::StartOwnStore() {
  absl::StatusOr<std::string> token = RandomToken();
  if (!token.ok()) return token.status();
  token_file_ = config_.run_dir + "/store.token";
  if (absl::Status s = WriteFile(token_file_, *token, 0600); !s.ok()) return s;
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.job_token = *token;
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start(options);
  if (!server.ok()) return server.status();
  server_ = *std::move(server);
  store_url_ = absl::StrCat("tcp://127.0.0.1:", server_->port());
  OpenStoreOptions open_options;
  open_options.control = true;  // the launcher's own calls go ahead of its ranks'
  absl::StatusOr<std::unique_ptr<Store>> store =
      OpenStore(store_url_, config_.job_id, *token, kStoreTimeout, open_options);
  if (!store.ok()) return store.status();
  store_ = *std::move(store);
  token_ = *token;  // a restart round's store is opened with it
  return absl::OkStatus();
}

void Job::CreateHostAgent() {
  HostAgentOptions options;
  options.host_id = HostLabel();
  options.call_timeout = AgentCallTimeout(config_.host_timeout);
  options.report_timeout = kStoreTimeout;
  options.failed_exit_code = kExitJobFailed;
  options.store_url = store_url_;
  options.store_loss_bound = StoreLossBound();
  options.loop_stall_bound = StoreLossBound();
  options.ranks_per_host = config_.nproc;
  options.spares = config_.standby;
  options.restart_all = config_.restart_all >= 0;
  HostAgent::Hooks hooks;
  hooks.workers = [this] {
    std::vector<HostWorker*> workers;
    workers.reserve(children_.size());
    for (auto& c : children_) workers.push_back(c.get());
    return workers;
  };
  hooks.say = [this](const std::string& line) { Say(line); };
  hooks.record = [this](int rank, EventKind kind, const std::string& message,
                        HostAgent::Attributes attributes) {
    Record(rank, kind, message, std::move(attributes));
  };
  // On one host there is no lease, and no kill request: the launcher kills its own processes.
  hooks.latest_term = [this]() -> int64_t { return lease_ != nullptr ? lease_->latest_term() : 0; };
  hooks.pid_file = [this](int rank) { return PidFile(rank); };
  // A training host that keeps --standby spares starts another for the one that took a rank (one
  // host is the training host of its own plan).
  hooks.rank_taken = [this](HostWorker&) {
    if (config_.standby > 0 && group_rank_ >= 0 && CanSpawnStandby()) {
      if (absl::Status s = Spawn(-1, standbys_spawned_); !s.ok()) Say(s.ToString());
    }
  };
  host_agent_ = std::make_unique<HostAgent>(store_.get(), clock_, supervisor_.get(),
                                            std::move(options), std::move(hooks));
}

void Job::Record(int rank, EventKind what, const std::string& message,
                 std::vector<std::pair<std::string, std::string>> attributes) {
  if (events_ == nullptr) return;
  Event event = EventOfKind(what, message);
  event.time = clock_->Now();
  event.rank = rank;
  event.generation = coordinator_ != nullptr ? coordinator_->generation() : 0;
  if (follower_ != nullptr) {
    event.generation = std::max(event.generation, follower_->current().generation);
  }
  event.attributes.emplace_back("source", "launcher");
  // Pids are this host's (its PID namespace): with several hosts, a pid means (on_host, pid).
  if (!layout_.on_host.empty()) event.attributes.emplace_back("on_host", layout_.on_host);
  event.attributes.insert(event.attributes.end(), attributes.begin(), attributes.end());
  // A launcher that cannot write its record still runs the job; the report will lack the line.
  if (absl::Status s = events_->Append(event); !s.ok()) Say(s.ToString());
}

void Job::ForgetStoppedProcesses() {
  stop_forming_.store(true);
  if (former_.joinable()) former_.join();
  stop_forming_.store(false);
  {
    MutexLock lock(&formed_mu_);
    formed_.reset();
  }
  formed_reported_ = false;
  for (auto& c : children_) (void)supervisor_->Release(c->worker);  // StopAll reaped them
  children_.clear();
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
                                      "TRAINGUARD_LAUNCHER_PID",
                                      "TRAINGUARD_LAUNCHER_START_TIME",
                                      "TRAINGUARD_LAUNCHER_TIMEOUT_MS",
                                      "TRAINGUARD_HOST_ADDR",
                                      "RANK",
                                      "WORLD_SIZE",
                                      "LOCAL_RANK",
                                      "LOCAL_WORLD_SIZE",
                                      "MASTER_ADDR",
                                      "MASTER_PORT",
                                      "GROUP_RANK",
                                      "ROLE_RANK",
                                      "ROLE_WORLD_SIZE",
                                      "TORCHELASTIC_RUN_ID",
                                      "TORCHELASTIC_RESTART_COUNT",
                                      "TORCHELASTIC_MAX_RESTARTS",
                                      "TORCHELASTIC_USE_AGENT_STORE",
                                      "TORCH_NCCL_ASYNC_ERROR_HANDLING"};
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
  const int n = world_size_;
  const int local_n = config_.nproc;
  vars.push_back(absl::StrCat("TRAINGUARD_JOB_ID=", RanksJobId()));
  vars.push_back(absl::StrCat("TRAINGUARD_WORLD_SIZE=", n));
  vars.push_back(absl::StrCat("TRAINGUARD_LOCAL_WORLD_SIZE=", local_n));
  vars.push_back(absl::StrCat("TRAINGUARD_MEMBER_ID=", child.member_id));
  vars.push_back(absl::StrCat("TRAINGUARD_STORE=", store_url_));
  if (!token_file_.empty())
    vars.push_back(absl::StrCat("TRAINGUARD_STORE_TOKEN_FILE=", token_file_));
  vars.push_back(absl::StrCat("TRAINGUARD_RUN_DIR=", config_.run_dir));
  // The Runtime's launcher watch (sdk/runtime/launcher_watch.h): a rank leaves when this process
  // exits, or stays stopped as long as a rank's heartbeat may be stale before it is replaced.
  vars.push_back(absl::StrCat("TRAINGUARD_LAUNCHER_PID=", getpid()));
  if (!launcher_start_time_.empty()) {
    vars.push_back(absl::StrCat("TRAINGUARD_LAUNCHER_START_TIME=", launcher_start_time_));
  }
  vars.push_back(absl::StrCat("TRAINGUARD_LAUNCHER_TIMEOUT_MS=",
                              absl::ToInt64Milliseconds(config_.heartbeat_timeout)));
  if (!layout_.host_addr.empty()) {
    vars.push_back(absl::StrCat("TRAINGUARD_HOST_ADDR=", layout_.host_addr));
  }
  vars.push_back(absl::StrCat("WORLD_SIZE=", n));
  vars.push_back(absl::StrCat("LOCAL_WORLD_SIZE=", local_n));
  vars.push_back(absl::StrCat("ROLE_WORLD_SIZE=", n));
  vars.push_back(absl::StrCat("MASTER_ADDR=", master_addr_));
  vars.push_back(absl::StrCat("MASTER_PORT=", master_port_));
  // torchelastic's: the job's id, and how often the worker group was restarted (never: trainguard
  // replaces ranks in place, so a replacement's count is 0 like everyone's).
  vars.push_back(absl::StrCat("TORCHELASTIC_RUN_ID=", config_.job_id));
  vars.push_back(absl::StrCat("TORCHELASTIC_RESTART_COUNT=", round()));
  vars.push_back("TORCHELASTIC_MAX_RESTARTS=0");
  // torch.distributed's: no agent store to connect to (process groups are built from trainguard's
  // store: rank 0's TCPStore would die with rank 0), and a NCCL error aborts the communicator only,
  // so the survivors keep their processes and recover() rebuilds it.
  vars.push_back("TORCHELASTIC_USE_AGENT_STORE=False");
  vars.push_back("TORCH_NCCL_ASYNC_ERROR_HANDLING=2");
  // As torchrun: several ranks per host each running a thread per core oversubscribe the cores
  // (and give other results than under torchrun); the user's own value is kept.
  if (local_n > 1 && getenv("OMP_NUM_THREADS") == nullptr) vars.push_back("OMP_NUM_THREADS=1");
  // A step stuck after its generation was superseded exits the process after
  // superseded_step_exit_ms (10 s by default), which must outlast the time this launcher takes to
  // kill a stopped peer (--host-timeout): with a longer --host-timeout (10 s by default with etcd)
  // a survivor would exit first and take a second standby (HostLayout::superseded_step_exit).
  if (layout_.superseded_step_exit > absl::ZeroDuration() &&
      getenv("TRAINGUARD_SUPERSEDED_STEP_EXIT_MS") == nullptr) {
    vars.push_back(absl::StrCat("TRAINGUARD_SUPERSEDED_STEP_EXIT_MS=",
                                absl::ToInt64Milliseconds(layout_.superseded_step_exit)));
  }
  if (child.rank >= 0) {
    const int local_rank = child.rank % local_n;
    vars.push_back("TRAINGUARD_ROLE=rank");
    vars.push_back(absl::StrCat("GROUP_RANK=", child.rank / local_n));
    for (const char* name : {"TRAINGUARD_RANK=", "RANK=", "ROLE_RANK="}) {
      vars.push_back(absl::StrCat(name, child.rank));
    }
    for (const char* name : {"TRAINGUARD_LOCAL_RANK=", "LOCAL_RANK="}) {
      vars.push_back(absl::StrCat(name, local_rank));
    }
  } else {
    vars.push_back("TRAINGUARD_ROLE=standby");
  }
  return vars;
}

std::string Job::PidFile(int rank) const { return absl::StrCat(layout_.pid_dir, "/rank-", rank); }

absl::Status Job::Spawn(int rank, int standby_index) {
  auto child = std::make_unique<Child>();
  child->rank = rank;
  child->standby_index = standby_index;
  const std::string host = HostLabel();
  // A restart round's processes are members of their own (MemberId::round), so that a death
  // reported from an earlier round is never taken for one of this round's.
  store_keys::MemberId id;
  id.host = host;
  id.pid = getpid();
  id.round = round();
  id.role = rank >= 0 ? store_keys::MemberId::Role::kRank : store_keys::MemberId::Role::kStandby;
  id.index = rank >= 0 ? rank : standby_index;
  child->member_id = store_keys::EncodeMemberId(id);
  WorkerSpec spec;
  spec.label = child->Label();
  spec.argv = config_.command;
  spec.env = ChildEnvironment(*child);
  spec.log_path = absl::StrCat(
      layout_.log_dir, "/",
      rank >= 0 ? absl::StrCat("rank-", rank) : absl::StrCat("standby-", standby_index), ".log");
  if (rank >= 0) spec.pid_file = PidFile(rank);
  absl::StatusOr<WorkerId> worker = supervisor_->Spawn(spec);
  if (!worker.ok()) return worker.status();
  child->worker = *worker;
  child->pid = supervisor_->pid(*worker);
  child->started = clock_->Now();
  if (rank < 0) ++standbys_spawned_;
  Say(absl::StrFormat("started %s (pid %d, member %s)", child->Label(), child->pid,
                      child->member_id));
  children_.push_back(std::move(child));
  return absl::OkStatus();
}

Child* Job::ChildOf(WorkerId worker) {
  for (auto& c : children_) {
    if (c->worker == worker) return c.get();
  }
  return nullptr;
}

void Job::HandleWorkerEvents(const std::vector<WorkerEvent>& events, bool stopping) {
  for (const WorkerEvent& event : events) {
    Child* c = ChildOf(event.worker);
    if (c == nullptr) continue;
    switch (event.kind) {
      case WorkerEvent::Kind::kOutput:
        std::printf("[%s] %s\n", c->Label().c_str(), event.line.c_str());
        c->printed_cause.Observe(event.line);
        break;
      case WorkerEvent::Kind::kExited:
        std::fflush(stdout);
        c->running = false;
        if (!stopping) OnExit(*c, event.exit);
        break;
      case WorkerEvent::Kind::kStopped:  // read when needed instead (IsStopped)
      case WorkerEvent::Kind::kContinued:
        break;
    }
  }
  std::fflush(stdout);
}

void Job::ReadSignals() {
  signalfd_siginfo info;
  while (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
    if (info.ssi_signo == SIGCHLD) continue;  // an exit or a stop: the supervisor reports it
    interrupted_ = static_cast<int>(info.ssi_signo);
  }
}

bool Job::CanSpawnStandby() const {
  // A standby host keeps its N standbys: one that died while parked is started again.
  // (Under --restart-all a standby host holds no processes: torchrun's spare node.)
  const bool standby_host = spawned_ && group_rank_ < 0 && recovery_->ReplacesRanks();
  return (config_.standby > 0 || standby_host) && !replacement_policy_.standbys_exhausted();
}

void Job::SignalGroup(const Child& child, int sig) {
  (void)supervisor_->Signal(child.worker, sig);  // refused once it has exited: nothing to reach
}

void Job::OnExit(Child& child, const WorkerExit& exit) {
  const std::string how = exit.Describe();
  if (exit_code_ >= 0) return;  // stopping: exits are expected
  // Several hosts: a standby that took a rank its agent had not followed yet died as that rank.
  // (One host relabels its standby in the same turn as the replacement.)
  if (child.rank < 0 && layout_.several_hosts) {
    (void)host_agent_->TakeAssignedRank(child, ranks_store());
  }
  if (child.rank < 0) return OnStandbyExit(child, how);
  if (exit.succeeded()) {
    ++ranks_finished_;
    Say(absl::StrFormat("%s (pid %d) finished", child.Label(), child.pid));
    // The coordinator ends the job once every rank finished: several hosts' publishes job/done
    // (every agent's WatchJobEnd reads it), one host's says so in this process
    // (every_rank_finished_).
    host_agent_->ReportFinished(child, round());
    return;
  }
  Say(absl::StrFormat("%s (pid %d, member %s) %s", child.Label(), child.pid, child.member_id, how));
  Record(child.rank, EventKind::kRankDied,
         absl::StrFormat("%s (pid %d) %s", child.Label(), child.pid, how),
         {{"pid", absl::StrCat(child.pid)},
          {"how", how},
          {"killed_by_launcher", child.killed_for_liveness ? "true" : "false"}});
  // A rank that gives up because the job cannot go on publishes why before it exits: that is not a
  // machine fault, and a replacement would only meet the same fault.
  if (std::optional<std::string> reason = ReadJobStop(absl::Seconds(1)); reason.has_value()) {
    return StopJob(*reason);
  }
  // The coordinator decides: replaced by a standby, or every rank restarted, or the job fails (and
  // carries it out at the loop's turn: Coordinate). Its report goes to the coordinator of several
  // hosts through the store, to one host's in this process at once (rank_reports_).
  host_agent_->ReportDeath(child, how);
}

bool Job::FormedForADeath() {
  // A rank that exits right after joining may be reaped before the helper thread has reported
  // the generation it joined: give it a moment rather than call the death premature.
  MutexLock lock(&formed_mu_);
  formed_mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return formed_.has_value(); },
                              absl::Seconds(5));
  return formed_.has_value() && formed_->ok();
}

void Job::OnStandbyExit(Child& child, const std::string& how) {
  Say(absl::StrFormat("%s (pid %d) %s while parked", child.Label(), child.pid, how));
  (void)coordinator_->ForgetStandby(child.member_id, kStoreTimeout);
  const bool respawns = CanSpawnStandby();  // before this death is counted
  const ReplacementPolicy::StandbyDecision next =
      replacement_policy_.OnStandbyDeath(how, child.started, clock_->Now());
  if (!respawns) return;
  if (!next.message.empty()) Say(next.message);
  if (next.respawn) standby_respawns_.push_back(next.not_before);
}

void Job::RespawnStandbys() {
  while (!standby_respawns_.empty() && exit_code_ < 0 &&
         clock_->Now() >= standby_respawns_.front()) {
    standby_respawns_.pop_front();
    if (!CanSpawnStandby()) continue;
    if (absl::Status s = Spawn(-1, standbys_spawned_); !s.ok()) Say(s.ToString());
  }
}

void Job::OnRankTaken(int rank, const std::string& member, int64_t generation) {
  Record(rank, EventKind::kRankReplaced,
         absl::StrFormat("rank %d taken by %s in generation %d", rank, member, generation),
         {{"member", member}});
  // The member's own agent relabels it. When it is this host's process (on one host, always) that
  // is this agent, at once: its standby learns its rank in the same turn of the loop, and
  // HostAgent::TakeRank says so and starts a spare for it. Another host's agent does it when it
  // follows the generation (FollowGeneration), and the coordinator says whom it gave the rank to.
  for (auto& c : children_) {
    if (c->member_id == member && c->running) return host_agent_->TakeRank(*c, rank, generation);
  }
  Say(absl::StrFormat("generation %d: rank %d taken by %s", generation, rank, member));
}

// Checked on every non-zero exit too (OnExit), so a rank that published the stop and exited at once
// is never replaced; this poll stops the ranks that are still running.
std::optional<std::string> Job::ReadJobStop(absl::Duration timeout) {
  absl::StatusOr<std::string> reason = ranks_store()->Get(kJobStopKey, timeout);
  if (!reason.ok()) return std::nullopt;  // absent, or the store briefly unreachable
  return std::string(absl::StripTrailingAsciiWhitespace(*reason));
}

void Job::WatchJobStop() {
  const absl::Time now = clock_->Now();
  if (now < next_stop_check_) return;
  next_stop_check_ = now + absl::Milliseconds(250);
  if (std::optional<std::string> reason = ReadJobStop(absl::Milliseconds(200)); reason) {
    StopJob(*reason);
  }
}

void Job::EvictCorruptHosts() {
  absl::StatusOr<std::vector<std::string>> keys = ranks_store()->ListKeys(
      store_keys::kJobSilentCorruptionEvictPrefix, AgentCallTimeout(config_.host_timeout));
  if (!keys.ok()) return;
  for (const std::string& key : *keys) {
    std::optional<std::string> host =
        store_keys::NameAfter(store_keys::kJobSilentCorruptionEvictPrefix, key);
    if (!host.has_value()) continue;
    absl::StatusOr<std::string> value =
        ranks_store()->Get(key, AgentCallTimeout(config_.host_timeout));
    if (!value.ok() || corruption_requests_.count(key + "=" + *value) > 0) continue;
    const std::pair<std::string, std::string> parts =
        absl::StrSplit(*value, absl::MaxSplits('\n', 1));
    const std::pair<std::string, std::string> head = absl::StrSplit(parts.first, ' ');
    int64_t times = 1;
    (void)absl::SimpleAtoi(head.first, &times);
    const bool alert_only = head.second == "alert";
    int spare = 0;
    if (absl::StatusOr<std::vector<std::string>> parked =
            coordinator_->ParkedStandbys(AgentCallTimeout(config_.host_timeout));
        parked.ok()) {
      for (const std::string& member : *parked) {
        if (store_keys::MemberHost(member) != *host) ++spare;
      }
    }
    const int nproc = std::max(1, config_.nproc);
    const int evicted =
        corruption_evictions_ + (fail_slow_ != nullptr ? fail_slow_->evictions() : 0);
    const bool dead = job_coordinator_->dead_hosts().count(*host) > 0;
    const FailSlowDecision decision =
        DecideFailSlowAction(FailSlowPolicy::kEvict, 1, evicted, std::max(1, world_size_ / nproc),
                             config_.fail_slow_max_evict_share, spare, nproc);
    if (!coordinating()) return;
    corruption_requests_.insert(key + "=" + *value);
    if (dead) continue;
    if (decision.evict) {
      ++corruption_evictions_;
      Say(absl::StrFormat("silent corruption: evicting host %s (named %d time(s))", *host, times));
      job_coordinator_->DeclareHostDead(
          *host, clock_->Now(), absl::StrFormat("silent data corruption: named %d time(s)", times));
    } else if (times >= 2 && !alert_only) {
      const std::string reason = absl::StrFormat(
          "host %s was named for silent data corruption %d times: a rollback does not cure it, "
          "and it cannot be evicted (%s); replace the host",
          *host, times, decision.action);
      // As a rank stops the job: every host's agent reads job/stop (first writer wins).
      (void)ranks_store()->CompareAndSet(kJobStopKey, std::nullopt, reason,
                                         AgentCallTimeout(config_.host_timeout));
      StopJob(reason);
      return;
    } else {
      Say(absl::StrFormat("silent corruption: host %s: %s", *host, decision.action));
    }
  }
}

void Job::StopJob(const std::string& reason) {
  Say(absl::StrCat("job stopped: ", reason));
  failure_ = absl::StrCat("stopped by a rank: ", reason);
  exit_code_ = kExitJobFailed;
}

absl::StatusOr<std::optional<Job::Placement>> Job::ComputePlacement(int training_hosts) const {
  // The ranks read the same variables (the flags set them in this environment): the placement
  // computed here is the one they compute.
  std::map<std::string, std::string> vars = {
      {"TRAINGUARD_WORLD_SIZE", absl::StrCat(training_hosts * config_.nproc)},
      {"TRAINGUARD_LOCAL_WORLD_SIZE", absl::StrCat(config_.nproc)}};
  for (const char* name :
       {"TRAINGUARD_TP", "TRAINGUARD_CP", "TRAINGUARD_PP", "TRAINGUARD_BACKUP_COPIES",
        "TRAINGUARD_BACKUP_EVICT", "TRAINGUARD_BACKUP_RACKS"}) {
    const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): never set after start
    if (v != nullptr) vars[name] = v;
  }
  absl::StatusOr<Options> o = Options::FromEnvironment(vars);
  if (!o.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("backup placement: ", o.status().message()));
  }
  if (o->backup_copies <= 1 || training_hosts < 2) return std::nullopt;
  absl::StatusOr<Topology> topology =
      Topology::Create({.world_size = training_hosts * config_.nproc,
                        .tp = o->tp,
                        .cp = o->cp,
                        .pp = o->pp,
                        .ranks_per_host = config_.nproc});
  if (!topology.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("backup placement: ", topology.status().message()));
  }
  absl::StatusOr<std::vector<EvictionClass>> classes = ParseEvictionClasses(o->backup_evict);
  if (!classes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--backup-evict: ", classes.status().message()));
  }
  std::vector<std::string> racks;
  if (!o->backup_racks.empty()) racks = absl::StrSplit(o->backup_racks, ',');
  BackupPlacementSpec spec{
      .topology = *topology, .copies = o->backup_copies, .classes = *classes, .racks = racks};
  absl::StatusOr<BackupPlacement> placement = BackupPlacement::Place(spec);
  if (!placement.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no backup placement: ", placement.status().message()));
  }
  return Placement{std::move(spec), *std::move(placement)};
}

absl::StatusOr<std::vector<std::string>> Job::BackupLines(int training_hosts) const {
  absl::StatusOr<std::optional<Placement>> placement = ComputePlacement(training_hosts);
  if (!placement.ok()) return placement.status();
  if (!placement->has_value()) return std::vector<std::string>{};
  std::vector<std::string> lines = absl::StrSplit(
      DescribePlacement((*placement)->spec, (*placement)->placement), '\n', absl::SkipEmpty());
  return lines;
}

// Reads every rank's flight-recorder ring (readable while a rank is stopped or dead) and says which
// rank the others are waiting for.
void Job::ReportLaggards() {
  std::vector<int> ranks;
  std::vector<FlightRecorderContents> rings;
  for (int r = 0; r < world_size_; ++r) {
    absl::StatusOr<FlightRecorderContents> ring = ReadFlightRecorder(RanksJobId(), r);
    if (!ring.ok()) continue;
    ranks.push_back(r);
    rings.push_back(*std::move(ring));
  }
  for (const LaggardReport& report : FindLaggards(ranks, rings)) {
    Say(absl::StrCat("laggard: ", report.ToString()));
  }
}

Child* Job::RunningHolder(int rank) {
  for (const auto& c : children_) {
    if (c->rank == rank && c->running && !c->killed_for_liveness) return c.get();
  }
  return nullptr;
}

void Job::CreateHangCoordinator() {
  HangCoordinatorOptions options;
  options.dump_dir = config_.run_dir + "/flight_recorder";
  options.heartbeat_timeout = config_.heartbeat_timeout;
  options.host_quiet = config_.host_timeout / 3;
  options.max_hold_off = 2 * config_.host_timeout;
  options.store_timeout = kStoreTimeout;
  HangCoordinator::Hooks hooks;
  hooks.coordinating = [this] { return coordinating(); };
  hooks.say = [this](const std::string& line) { Say(line); };
  hooks.ranks_store = [this] { return ranks_store(); };
  hooks.rendezvous = [this] { return coordinator_.get(); };
  hooks.restarted_at = [this] { return restarted_at_; };
  hooks.live_rings = [this] {
    std::map<int, FlightRecorderContents> rings;
    for (int r = 0; r < world_size_; ++r) {
      absl::StatusOr<FlightRecorderContents> ring = ReadFlightRecorder(RanksJobId(), r);
      if (ring.ok()) rings[r] = *std::move(ring);
    }
    return rings;
  };
  // One host runs every rank's process: it sees each stopped or gone in whichever generation.
  // Several: the coordinator's agent reports its own ranks' stops like any agent, so one path
  // (the store's) serves every host's ranks.
  if (!layout_.several_hosts) {
    hooks.local_holder = [this](int rank) { return LocalHolderOf(rank); };
    hooks.kill_local = [this](int rank, int64_t generation) { KillHangSuspect(rank, generation); };
  }
  hooks.kill_member = [this](const std::string& member, EventKind kind, const std::string& why) {
    KillMember(member, kind, why);
  };
  hooks.kill_and_replace_stopped = [this](int rank, const std::string& member, EventKind kind,
                                          const std::string& why) {
    KillAndReplaceStoppedMember(rank, member, kind, why);
  };
  hang_coordinator_ = std::make_unique<HangCoordinator>(
      store_.get(), clock_, Env::Default(), job_coordinator_.get(), options, std::move(hooks));
  hang_coordinator_->set_world_size(world_size_);
}

LocalHolder Job::LocalHolderOf(int rank) {
  LocalHolder holder;
  holder.here = true;
  const Child* c = RunningHolder(rank);
  if (c == nullptr) return holder;
  holder.running = true;
  holder.stopped = supervisor_->IsStopped(c->worker);
  holder.rank_generation = c->rank_generation;
  holder.label = c->Label();
  holder.pid = c->pid;
  return holder;
}

void Job::KillHangSuspect(int rank, int64_t generation) {
  Child* c = RunningHolder(rank);
  if (c == nullptr) return;
  Record(rank, EventKind::kHangSuspect,
         absl::StrFormat("%s (pid %d) is the suspect of generation %d's hang", c->Label(), c->pid,
                         generation),
         {{"pid", absl::StrCat(c->pid)}});
  c->killed_for_liveness = true;
  c->kill_reason =
      absl::StrFormat("the launcher killed it: the suspect of generation %d's hang", generation);
  SignalGroup(*c, SIGKILL);  // reaped and replaced like any dead rank
}

void Job::RenewGenerationWhenAsked() {
  RenewalHolds holds;
  holds.hang_pending = hang_coordinator_->pending();
  holds.killed_rank_unreaped = std::any_of(
      children_.begin(), children_.end(),
      [](const std::unique_ptr<Child>& c) { return c->killed_for_liveness && c->running; });
  job_coordinator_->RenewGenerationWhenAsked(holds);
}

void Job::Fail(const std::string& why) {
  // The death that ends the job is seldom the fault that started it: the message names both.
  const std::string message = failures_.FinalMessage(why);
  Say(absl::StrCat("job failed: ", message));
  failure_ = message;
  exit_code_ = kExitJobFailed;
  // Every other host's agent stops its processes too, and says why (HostAgent::WatchJobEnd).
  membership_->AnnounceFailure(message);
}

void Job::StopAll(absl::Duration grace) {
  host_agent_->SignalStop();
  // Real time, not clock_: a bounded wait for processes to exit (the supervisor's poll waits in
  // real time), no decision.
  const absl::Time deadline = absl::Now() + grace;
  const auto any_running = [&] {
    return std::any_of(children_.begin(), children_.end(),
                       [](const std::unique_ptr<Child>& c) { return c->running; });
  };
  while (any_running()) {
    // Bounded: SIGKILL after the grace period. The signals are read (a SIGCHLD would end every
    // wait at once) and an interruption kept for the loop.
    HandleWorkerEvents(supervisor_->Poll(absl::Milliseconds(10)), /*stopping=*/true);
    ReadSignals();
    if (absl::Now() < deadline) continue;
    for (auto& c : children_) {
      if (c->running) SignalGroup(*c, SIGKILL);
    }
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
  Say(absl::StrFormat("%s, store %s, run dir %s", layout_.start_line, store_url_, config_.run_dir));
  if (!layout_.several_hosts) {
    // Peer backups live on other hosts: a one-host job asked to place them is told why it has none.
    for (const auto& [name, value] : config_.backup_env) {
      if (name == "TRAINGUARD_BACKUP_EVICT") {
        Say(absl::StrCat("backup placement: one host, so no peer backups (--backup-evict ", value,
                         " places them on other hosts): each rank's snapshot stays in its "
                         "arena, and on disk when persisted"));
      }
    }
  }
  // One host's plan is its own, started and its generation 0 formed at once; several hosts follow
  // the plan their coordinator publishes once enough of them joined (their turn), and a process
  // that cannot start there fails the job like any fault after the start.
  if (absl::Status s = membership_->Start(); !s.ok()) {
    Say(absl::StrCat("cannot start the job: ", s.message()));
    StopAll(config_.stop_grace);
    return kExitLaunchError;
  }

  while (exit_code_ < 0) {
    // The workers' output and exits, or a signal (signal_fd_ wakes the supervisor's wait).
    const std::vector<WorkerEvent> events = supervisor_->Poll(absl::Milliseconds(50));
    ReadSignals();
    HandleWorkerEvents(events, /*stopping=*/false);
    if (interrupted_ != 0) {
      Say(absl::StrFormat("interrupted by SIG%s; stopping the job", sigabbrev_np(interrupted_)));
      failure_ = absl::StrCat("interrupted by SIG", sigabbrev_np(interrupted_));
      exit_code_ = 128 + interrupted_;
      break;
    }
    // This host's part of the turn: on several hosts its heartbeat, fence, the job's end, the
    // lease, the plan and generation, kill requests, stop reports and the coordinator's share (at
    // --host-timeout / 12); on one host its stop reports once generation 0 formed.
    if (exit_code_ < 0) {
      if (std::optional<AgentExit> end = membership_->Tick(); end.has_value()) {
        if (end->code != 0) failure_ = end->failure;
        exit_code_ = end->code;
      }
    }
    if (!formed_reported_) {
      MutexLock lock(&formed_mu_);
      if (formed_.has_value()) {
        formed_reported_ = true;
        if (formed_->ok()) {
          Say(absl::StrFormat("generation 0 formed with %d ranks", world_size_));
        } else {
          recovery_->OnNotFormed(*formed_);  // fails the job, or restarts every rank again
        }
      }
    }
    // Every agent, one host's too: a rank stopped while its restart round forms (RestartAll).
    if (exit_code_ < 0) recovery_->KillStoppedBeforeFormation(RoundFormed());
    // The replacements, or the restart round, due now. The gate is checked inside, before each
    // act, not once for all: an act may wait on the store for longer than the lease lasts; a
    // deposed coordinator's restart is dropped (the next holder finds the fault in the store).
    // Several hosts: the agents' death reports and the hosts near their bound at every turn, not
    // only at the coordinator's tick (--host-timeout / 12), so that a dead rank or host is
    // replaced as soon as it is known dead.
    if (layout_.several_hosts && formed_reported_ && exit_code_ < 0 && coordinating()) {
      job_coordinator_->CoordinateBetweenTicks();
    }
    if (exit_code_ < 0) recovery_->Coordinate(clock_->Now());
    if (coordinating()) rank_watch_->CheckRecoveries(recoveries());
    if (formed_reported_ && exit_code_ < 0 && replacements().empty() && coordinating()) {
      rank_watch_->KillRanksWithStaleHeartbeats();
    }
    if (recovery_->ReplacesRanks() && formed_reported_ && exit_code_ < 0 && coordinating()) {
      rank_watch_->KillMembersStoppedInFormation();
    }
    if (formed_reported_ && exit_code_ < 0 && coordinating()) hang_coordinator_->Poll();
    if (formed_reported_ && exit_code_ < 0 && coordinating()) RenewGenerationWhenAsked();
    if (exit_code_ < 0 && !layout_.several_hosts) WatchJobStop();
    if (exit_code_ < 0) RespawnStandbys();
    if (coordinating() && clock_->Now() >= next_persist_check_) {
      next_persist_check_ = clock_->Now() + absl::Milliseconds(500);
      rank_watch_->ReportPersistFailures();
      rank_watch_->ReportProtection();
      rank_watch_->ReportSilentCorruption();
      if (exit_code_ < 0 && formed_reported_) EvictCorruptHosts();
    }
    if (exit_code_ < 0 && every_rank_finished_) exit_code_ = 0;
  }
  StopAll(config_.stop_grace);
  stop_forming_.store(true);
  if (former_.joinable()) former_.join();
  membership_->Leave(exit_code_);
  // What the ranks reported just before they ended.
  if (coordinating()) rank_watch_->ReportPersistFailures();
  // A restart round's job id is never run again (a restarted launcher starts at the job's own id),
  // so nothing its ranks left in shared memory can serve anyone.
  if (exit_code_ == 0 || round() > 0) {
    // The ranks' snapshot arenas outlive them so that a replacement (or a restarted job) on this
    // machine restores without disk; once the job is done they only hold memory.
    // The same for the flight-recorder rings, the evidence of a hung or dead rank.
    for (const auto& c : children_) {
      if (c->rank < 0) continue;
      (void)Snapshotter::RemoveArena(RanksJobId(), c->rank);
      (void)FlightRecorder::Remove(RanksJobId(), c->rank);
    }
    // The backups this host's ranks held for their sources (peer backups; none on one host).
    for (int s = 0; s < world_size_; ++s) (void)BackupService::RemoveArenas(RanksJobId(), {s});
  }
  Say(Summary());
  return exit_code_;
}

void Job::StartForming() {
  former_ = std::thread([this] {
    // Real time, not clock_: the bound of store calls that wait in real time (their sockets).
    const absl::Time deadline = absl::Now() + config_.rendezvous_timeout;
    absl::StatusOr<Membership> m = absl::DeadlineExceededError("not started");
    // Short slices, so that a failing job does not keep this thread waiting for the full timeout.
    // A slice that ran out may surface as Unavailable (the store client's own deadline passed on a
    // loaded machine before the server answered): retried like a deadline, until `deadline`.
    while (!stop_forming_.load() && absl::Now() < deadline) {
      m = coordinator_->FormInitialGeneration(world_size_, absl::Milliseconds(250));
      if (absl::IsAborted(m.status()) && lease_ != nullptr && !lease_->held()) {
        // Refused by the lease's gate (HeldAt is safe from this thread): another agent publishes
        // generation 0 if this one does not get its lease back.
        if (coordinator_->Resume(absl::Milliseconds(250)).ok()) break;
        absl::SleepFor(absl::Milliseconds(50));
        continue;
      }
      if (!absl::IsDeadlineExceeded(m.status()) && !absl::IsUnavailable(m.status())) break;
    }
    // Another agent's coordinator published generation 0 first (this one was deposed meanwhile).
    if (absl::IsAborted(m.status()) && coordinator_->generation() >= 0) m = coordinator_->current();
    MutexLock lock(&formed_mu_);
    if (!formed_.has_value()) formed_ = m.status();
  });
}

// ---- The multi-host agent ----
//
// Store keys (under the job's prefix), besides the rendezvous' own: sdk/core/agent_keys.h (the
// agents' agents/..., coord/lease, job/failed and job/done) and sdk/core/store_keys.h (the kill
// requests, fenced by the lease term: a request of a term older than the newest the agent has seen
// is ignored). This host's own duties (the kill requests addressed to it, its ranks' death and stop
// reports, the job's end, its fence) are host_agent_'s (sdk/host_agent/host_agent.h); joining,
// the turn's order, the failure's word and leaving are membership_'s (StoreHostMembership,
// sdk/host_agent/host_membership.h).

bool Job::ReadPlan() {
  absl::StatusOr<HostAssignment> assignment = host_agent_->ReadPlan();
  if (!assignment.ok()) {
    // The coordinator publishes it once the hosts suffice (this agent's own tick reads it next).
    if (absl::IsNotFound(assignment.status()) && coordinating()) {
      (void)plan_publisher_->PublishWhenReady();
    } else if (absl::IsFailedPrecondition(assignment.status())) {
      Fail(std::string(assignment.status().message()));
    }
    return false;
  }
  assignment_ = *std::move(assignment);
  master_addr_ = assignment_->master_addr;
  master_port_ = assignment_->master_port;
  world_size_ = assignment_->world_size;
  job_coordinator_->set_world_size(world_size_);
  rank_watch_->set_world_size(world_size_);
  hang_coordinator_->set_world_size(world_size_);
  group_rank_ = assignment_->group_rank;
  return true;
}

absl::Status Job::SpawnAssignedProcesses() {
  for (int rank : assignment_->ranks) {
    if (absl::Status s = Spawn(rank, -1); !s.ok()) return s;
  }
  for (int i = 0; i < assignment_->standbys; ++i) {
    if (absl::Status s = Spawn(-1, i); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Job::StartEveryRank(int64_t round) {
  // A restart round's ranks start without spares: they are replaced by the next round, never by a
  // standby (RestartAll).
  assignment_ = OneHostAssignment(config_.nproc, round == 0 ? config_.standby : 0, master_addr_,
                                  master_port_);
  group_rank_ = assignment_->group_rank;
  spawned_ = true;
  if (absl::Status s = SpawnAssignedProcesses(); !s.ok()) return s;
  StartForming();
  return absl::OkStatus();
}

absl::Status Job::StartPlannedProcesses() {
  if (!ReadPlan()) {
    return absl::NotFoundError(absl::StrFormat("no plan at %s", store_keys::kAgentPlan));
  }
  spawned_ = true;
  Say(assignment_->Describe(config_.host_id, round()));
  if (absl::Status s = SpawnAssignedProcesses(); !s.ok()) {
    Fail(absl::StrCat("cannot start the job: ", s.message()));  // said, and the job ends
  }
  return absl::OkStatus();
}

// ---- --restart-all: the acts of a restart round (RestartAll decides) ----

void Job::StartRound(int64_t from, int64_t to) {
  // torchrun's shape: every process goes, whatever it was doing (SIGKILL: nothing of it is kept).
  std::vector<std::string> stopped;
  for (auto& c : children_) {
    if (!c->running) continue;
    SignalGroup(*c, SIGKILL);
    stopped.push_back(absl::StrFormat("%s (pid %d)", c->Label(), c->pid));
  }
  StopAll(absl::ZeroDuration());  // reaps them; SIGKILL again at once for any left
  ForgetStoppedProcesses();
  standby_respawns_.clear();
  // Nothing of the old processes' memory survives a restart: their snapshot arenas, flight
  // recorders and the peer backups they held go (and the new round's job id could not name them).
  const std::string old_id = RoundJobId(config_.job_id, from);
  for (int r = 0; r < world_size_; ++r) {
    (void)Snapshotter::RemoveArena(old_id, r);
    (void)FlightRecorder::Remove(old_id, r);
    (void)BackupService::RemoveArenas(old_id, {r});
  }
  Say(absl::StrFormat("restart round %d: stopped %s; shared memory of job id %s removed", to,
                      stopped.empty() ? "no process" : absl::StrJoin(stopped, ", "), old_id));
  job_coordinator_->set_round(to);
  restarted_at_ = clock_->Now();
  absl::StatusOr<std::unique_ptr<Store>> store =
      OpenStore(store_url_, RanksJobId(), token_, kStoreTimeout, AgentStoreOptions());
  if (!store.ok()) {
    return Fail(absl::StrFormat("restart round %d: connecting to the store as %s: %s", to,
                                RanksJobId(), store.status().ToString()));
  }
  coordinator_.reset();
  round_store_ = *std::move(store);
  // The round's generation 0 forms anew on its own namespace, under the lease on several hosts.
  coordinator_ = std::make_unique<RendezvousCoordinator>(
      ranks_store(), clock_, lease_ != nullptr ? config_.host_id : "coordinator", lease_.get());
  if (follower_ != nullptr) follower_ = std::make_unique<GenerationFollower>(ranks_store());
  job_coordinator_->set_rendezvous(coordinator_.get());
  rank_watch_->set_ranks_store(ranks_store());
  rank_watch_->set_rendezvous(coordinator_.get());
  // A coordinator that follows a round another published (it took the lease over meanwhile) acts
  // on the round's membership if it formed already (NotFound: not yet).
  if (lease_ != nullptr && coordinating()) {
    if (absl::Status s = coordinator_->Resume(kStoreTimeout); !s.ok() && !absl::IsNotFound(s)) {
      Say(s.ToString());
    }
  }
  followed_generation_ = -1;
  replacements().clear();
  hang_coordinator_->Reset(0);
  renewal_policy_.Reset();
  ranks_finished_ = 0;
  rank_watch_->HoldHeartbeatChecksUntil(clock_->Now() + config_.heartbeat_timeout);
  // A fresh port for a round's rank 0 (one host; several read the plan's).
  master_port_ = FreePort();
  // One host starts every rank and forms the round at once; several start what the plan gives
  // them (the coordinator's CoordinateHosts forms the round once the plan is followed). A failure
  // that ended the job already (a plan it cannot follow) is said once.
  if (absl::Status s = membership_->StartRound(to); !s.ok() && exit_code_ < 0) {
    Fail(absl::StrFormat("restart round %d: %s", to, s.message()));
  }
}

// Follows the published generations (HostAgent::FollowMembership: a standby of this host that took
// a rank is relabelled; a process of this host that lost its rank while alive, declared dead or
// stale, is killed). A host that was declared dead (partitioned, then back) stopped before this,
// fenced out (StoreHostMembership::Tick, HostAgent::CheckFenced).
void Job::FollowGeneration() {
  const absl::Duration timeout = AgentCallTimeout(config_.host_timeout);
  recovery_->FollowRound();
  if (exit_code_ >= 0) return;
  // The newest published generation: the coordinator holds every member (it publishes them); an
  // agent that does not coordinate follows only what its own processes need (GenerationFollower:
  // its ranks' registrations and each generation's changes, never the table), and reads the
  // table once if it takes the lease over (LeaseKeeper's resume).
  Membership current;
  if (follower_ == nullptr || coordinating()) {
    if (!coordinator_->Resume(timeout).ok()) return;
    current = coordinator_->current();
  } else {
    const std::vector<int> own = assignment_.has_value() ? assignment_->ranks : std::vector<int>{};
    if (!follower_->Follow(own, timeout).ok()) return;
    current = follower_->current();
  }
  const int64_t generation = current.generation;
  if (generation <= followed_generation_) return;
  followed_generation_ = generation;
  {
    MutexLock lock(&formed_mu_);
    if (!formed_.has_value()) formed_ = absl::OkStatus();
  }
  // Its standbys named for a rank take it; its ranks that lost theirs are killed.
  host_agent_->FollowMembership(current);
}

void Job::KillMember(const std::string& member, EventKind what, const std::string& why) {
  if (!coordinating()) return;
  // A member of this host is this launcher's child (on one host, every member: there is no lease
  // to fence a request by).
  if (absl::StartsWith(member, HostLabel() + ":")) {
    for (auto& c : children_) {
      if (c->member_id != member || !c->running || c->killed_for_liveness) continue;
      KillForLiveness(*c, what, absl::StrCat(": ", why));
    }
    return;
  }
  const std::string host = store_keys::MemberHost(member);
  Say(absl::StrFormat("asking host %s to kill %s: %s", host, member, why));
  // Fenced by this coordinator's lease term: the agent ignores it once a newer term exists.
  (void)RequestKill(store_.get(), host, member,
                    {lease_->term(), std::string(EventKindName(what)), why},
                    AgentCallTimeout(config_.host_timeout));
}

void Job::CoordinateHosts() {
  if (!spawned_) return;  // no plan yet
  bool generation_zero = false;
  {
    MutexLock lock(&formed_mu_);
    generation_zero = formed_.has_value();
  }
  if (!generation_zero && !former_.joinable()) StartForming();
  job_coordinator_->CoordinateHosts();
}

void Job::KillAndReplaceStoppedMember(int rank, const std::string& member, EventKind what,
                                      const std::string& why) {
  if (!coordinating()) return;
  KillMember(member, what, why);
  // One host: the kill's exit reaches OnExit, which decides (replace, restart all, fail) as for any
  // death (HostLayout::queues_killed_stopped_ranks).
  if (!layout_.queues_killed_stopped_ranks || !recovery_->ReplacesRanks() ||
      job_coordinator_->DeathTaken(member)) {
    return;
  }
  (void)job_coordinator_->QueueDeadMember(
      rank, member,
      absl::StrCat("is stopped, its agent says, and is being killed (",
                   std::string(EventKindName(what)), ")"));
}

std::vector<std::string> Job::PreferredStandbys(const std::string& dead_host,
                                                const std::vector<int>& ranks) {
  std::set<std::string> unsafe;
  for (int rank : ranks) unsafe.merge(HostsSharingBackups(rank));
  // A rank with no host of its own to prefer a spare on (one host queues its dead ranks without
  // one) and no backup to keep away from: ChooseStandbys would prefer none, so the parked standbys
  // are not read for it (a store round trip on one host's replacement path). Any parked standby
  // then takes it, in member-id order.
  if (ranks.size() == 1 && dead_host.empty() && unsafe.empty()) return {};
  absl::StatusOr<std::vector<std::string>> parked =
      coordinator_->ParkedStandbys(AgentCallTimeout(config_.host_timeout));
  if (!parked.ok()) return {};
  return ChooseStandbys(*parked, job_coordinator_->dead_hosts(), dead_host, ranks.size(), unsafe);
}

std::set<std::string> Job::HostsSharingBackups(int rank) {
  std::set<std::string> hosts;
  const Membership current = coordinator_->current();
  const int nproc = std::max(1, config_.nproc);
  if (!placement_.has_value()) {
    absl::StatusOr<std::optional<Placement>> computed =
        ComputePlacement(static_cast<int>(current.members.size()) / nproc);
    if (!computed.ok()) return hosts;
    placement_ = *std::move(computed);
  }
  if (!placement_->has_value() || rank >= static_cast<int>(current.members.size())) return hosts;
  const BackupPlacement& placement = (*placement_)->placement;
  std::vector<int> related = placement.HolderRanks(rank);
  for (int source : placement.SourceRanks(rank)) related.push_back(source);
  for (int r : related) {
    if (r < 0 || r >= static_cast<int>(current.members.size())) continue;
    const std::string& member = current.members[r];
    hosts.insert(store_keys::MemberHost(member));
  }
  return hosts;
}

// ---- Fail-slow hosts ----

void Job::SampleHost() {
  if (!spawned_) return;
  if (host_sampler_ == nullptr) {
    // Once per agent: a host without an NVIDIA driver collects no GPU metric, and says so once.
    absl::StatusOr<std::unique_ptr<GpuMetricsSource>> gpus = NvmlGpuMetricsSource::Open();
    if (gpus.ok()) {
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");  // NOLINT(concurrency-mt-unsafe)
      Say(absl::StrCat("fail-slow: GPU metrics through NVML (", (*gpus)->device_count(),
                       " GPU(s) on this host)"));
      host_sampler_ = std::make_unique<HostSampler>(
          *std::move(gpus),
          visible != nullptr ? std::optional<std::string>(visible) : std::nullopt);
    } else {
      Say(absl::StrCat("fail-slow: no GPU metrics: ", gpus.status().message()));
      host_sampler_ = std::make_unique<HostSampler>();
    }
  }
  host_agent_->PublishHostSample(*host_sampler_, config_.nproc);
}

void Job::DetectFailSlow() {
  if (fail_slow_ == nullptr) {
    FailSlowCoordinatorOptions options;
    options.policy = config_.fail_slow;
    options.detector.continuity = config_.fail_slow_continuity_s;
    options.detector.denoise_window = config_.fail_slow_window_s;
    options.detector.max_fill = config_.fail_slow_window_s;
    options.max_evict_share = config_.fail_slow_max_evict_share;
    options.ranks_per_host = config_.nproc;
    options.dump_dir = FailSlowDumpDir(config_.run_dir);
    options.max_dumps = kMaxFailSlowDumps;
    options.trace_path = config_.fail_slow_trace;
    options.call_timeout = AgentCallTimeout(config_.host_timeout);
    FailSlowCoordinator::Hooks hooks;
    hooks.coordinating = [this] { return coordinating(); };
    hooks.say = [this](const std::string& line) { Say(line); };
    hooks.record = [this](Event event) { AppendAgentEvent(std::move(event)); };
    absl::StatusOr<std::unique_ptr<FailSlowCoordinator>> created =
        FailSlowCoordinator::Create(store_.get(), clock_, Env::Default(), job_coordinator_.get(),
                                    std::move(options), std::move(hooks));
    if (!created.ok()) {
      Say(absl::StrCat("fail-slow detection is off: ", created.status().ToString()));
      config_.fail_slow = LaunchConfig::FailSlowPolicy::kOff;
      return;
    }
    fail_slow_ = *std::move(created);
  }
  fail_slow_->Poll(world_size_);
}

void Job::AppendAgentEvent(Event event) {
  if (agent_events_ == nullptr) {
    const std::string path =
        absl::StrCat(config_.run_dir, "/events/agent-", config_.host_id, ".tgev");
    absl::StatusOr<std::unique_ptr<EventLog>> log = EventLog::Open(Env::Default(), path);
    if (!log.ok()) {
      Say(absl::StrCat("cannot write the event: ", log.status().ToString()));
      return;
    }
    agent_events_ = *std::move(log);
  }
  event.time = clock_->Now();
  if (absl::Status s = agent_events_->Append(event); !s.ok()) {
    Say(absl::StrCat("cannot write the event: ", s.ToString()));
  }
}

// The last line of every run: how it ended, and what it took.
std::string Job::Summary() const {
  std::string counts = absl::StrFormat("%d replacement(s)", replacement_policy_.replacements());
  if (replacement_policy_.standby_deaths() > 0) {
    absl::StrAppendFormat(&counts, ", %d standby death(s) (last: %s)",
                          replacement_policy_.standby_deaths(),
                          replacement_policy_.standby_last_death());
  }
  if (const std::map<std::string, std::string>& failed = rank_watch_->persist_failures();
      !failed.empty()) {
    // The newest checkpoint on disk is older than it should be: a job that "succeeded" must say so.
    absl::StrAppendFormat(&counts, "; %d checkpoint(s) not persisted (last: %s)", failed.size(),
                          failed.rbegin()->second);
  }
  if (exit_code_ == 0) {
    return absl::StrFormat("job %s succeeded: %s, %s", config_.job_id,
                           membership_->DescribeSuccess(ranks_finished_), counts);
  }
  return absl::StrFormat("job %s ended (exit status %d): %s; %s", config_.job_id, exit_code_,
                         failure_, counts);
}

}  // namespace

int RunLaunchAgent(const LaunchConfig& config) {
  // Before any thread: the ranks inherit these, and DescribeBackups reads them.
  for (const auto& [name, value] : config.backup_env) setenv(name.c_str(), value.c_str(), 1);
  // Multi-host --restart-all: no peer backups, so that a restart restores from the disk only.
  if (config.restart_all >= 0 && config.nnodes_min > 0) {
    setenv("TRAINGUARD_BACKUP_COPIES", "1", 1);
  }
  Job job(config);
  return job.Run();
}

}  // namespace trainguard
