// `trainguard run`: see launcher.h. One thread runs the job: a poll loop over its workers (their
// output pipes and exits, through the ProcessSupervisor) and a signalfd (SIGCHLD, SIGINT, SIGTERM);
// generation 0 is formed on one helper thread.
#include "tools/launcher.h"

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
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "sdk/agent/failure_history.h"
#include "sdk/agent/posix_process_supervisor.h"
#include "sdk/agent/process_supervisor.h"
#include "sdk/agent/renewal_policy.h"
#include "sdk/agent/replacement_policy.h"
#include "sdk/agent/restart_rounds.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/store_keys.h"
#include "sdk/checkpoint/backup_placement.h"
#include "sdk/checkpoint/backup_service.h"
#include "sdk/checkpoint/snapshotter.h"
#include "sdk/coordinator/hang_coordinator.h"
#include "sdk/coordinator/job_coordinator.h"
#include "sdk/core/event_log.h"
#include "sdk/core/mutex.h"
#include "sdk/core/proc_stat.h"
#include "sdk/health/fail_slow_detector.h"
#include "sdk/health/fail_slow_metrics.h"
#include "sdk/host_agent/host_agent.h"
#include "sdk/rendezvous/coordinator_lease.h"
#include "sdk/rendezvous/rendezvous.h"
#include "sdk/rendezvous/tcp_store.h"
#include "sdk/runtime/peer_progress.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/hang_diagnosis.h"
#include "tools/fail_slow_dump.h"
#include "tools/fail_slow_monitor.h"
#include "trainguard/checkpoint.h"
#include "trainguard/env.h"
#include "trainguard/events.h"
#include "trainguard/options.h"
#include "trainguard/store.h"
#include "trainguard/topology.h"

extern char** environ;

namespace trainguard::tools {
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
// Multi-host: what an agent fails the job with, and the coordinator's word that every rank finished.
constexpr const char* kJobFailedKey = store_keys::kJobFailed;
constexpr const char* kJobDoneKey = store_keys::kJobDone;

// On several hosts the policy only bounds and backs off: a rank's death there is decided by the
// coordinator (QueueDeadMember), which finds standbys on standby hosts and restarts in rounds.
ReplacementPolicyOptions ReplacementOptions(const LaunchConfig& config) {
  ReplacementPolicyOptions options;
  options.max_replacements = config.max_replacements;
  options.restart_backoff = config.restart_backoff;
  const bool multi_host = config.nnodes_min > 0;
  options.has_standbys = config.standby > 0 || multi_host;
  options.restart_all = config.restart_all >= 0 && !multi_host;
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

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
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
      : config_(std::move(config)), clock_(clock) {}
  ~Job() {
    if (former_.joinable()) {
      stop_forming_.store(true);
      former_.join();
    }
    if (signal_fd_ >= 0) close(signal_fd_);
  }

  int Run();

 private:
  absl::Status Prepare();
  // job_coordinator_, on store_ and coordinator_ (Prepare, once they exist; RestartAll, which
  // replaces both).
  void CreateJobCoordinator();
  // A TcpStore of the launcher's own on 127.0.0.1 with a fresh token (store_url_, token_file_,
  // server_, store_).
  absl::Status StartOwnStore();
  // Appends a custom event what=`what` to the launcher's event file (launcher.h); best effort.
  void Record(int rank, EventKind what, const std::string& message,
              std::vector<std::pair<std::string, std::string>> attributes = {});
  // --restart-all: stops every process of the job and starts all ranks again (launcher.h).
  void RestartAll();
  // After StopAll, for a restart: ends the generation-0 former, forgets that the job formed and
  // every child (their output descriptors closed).
  void ForgetStoppedProcesses();
  // --restart-all on several hosts. The coordinator publishes restart round round_ + 1 for `why`
  // (store key agents/restart); `dead_host`, when set, hands its group rank to a standby host in
  // the round's plan. `since`: when the fault began (a dead host's last heartbeat), for the
  // recovery's time; InfinitePast: now. Fails the job at the (M+1)-th fault. DecideRestartRound
  // (sdk/agent/restart_rounds.h) decides; this reads the store, publishes and starts the round.
  void PublishRestartRound(const std::string& why, const std::string& dead_host,
                           absl::Time since = absl::InfinitePast());
  // What the coordinator knows of the hosts for a restart round after a host's death: the plan,
  // the joined hosts, those that left (the store), those dead or silent (its own records).
  absl::StatusOr<RestartRoundHosts> ReadRestartRoundHosts(absl::Duration timeout);
  // Every agent: follows agents/restart to a newer round (StartRound).
  void FollowRestartRound();
  // SIGKILLs every process of this host, removes the shared memory they held, and starts this
  // host's ranks of `round` (its plan) under the round's job id.
  void StartRound(int64_t round);
  // A rank that is stopped (SIGSTOP) before its round formed has no heartbeat to go stale, and
  // the round would wait for it until --rendezvous-timeout: its agent kills it after
  // --heartbeat-timeout (HostAgent::KillRanksStoppedFor), a rank lost before the restarted job
  // formed.
  void KillRanksStoppedBeforeFormation();
  // Multi-host --restart-all (every restart-all path of the agents and the coordinator).
  bool RestartsOnHosts() const { return MultiHost() && config_.restart_all >= 0; }
  // The job id the ranks run under: the job's, or in restart round K "<job id>.round<K>", so that
  // a round's store keys and shared-memory segments are its own.
  std::string RanksJobId() const {
    return round_ == 0 ? config_.job_id : absl::StrCat(config_.job_id, ".round", round_);
  }
  // The store as the ranks see it (their job id's namespace); store_ is the agents' (the job's).
  Store* ranks_store() const { return round_store_ != nullptr ? round_store_.get() : store_.get(); }
  // Where ranks that finished with status 0 are recorded: a restart round starts the count anew.
  std::string FinishedPrefix() const { return store_keys::AgentFinishedPrefix(round_); }
  // Parses the plan (agents/plan) into group_rank_, world_size_, master_addr_/port_. False when
  // there is none yet (or the job failed on a malformed one).
  bool ReadPlan(int* hosts);
  // Starts this host's processes of the plan: its ranks (and --standby spares), or standbys.
  void SpawnPlannedProcesses(int hosts);
  absl::Status Spawn(int rank, int standby_index);
  std::vector<std::string> ChildEnvironment(const Child& child) const;
  // Prints the workers' output lines ("[rank 0] ..."); an exit marks the child not running and,
  // unless the job is `stopping` (StopAll), is answered by OnExit.
  void HandleWorkerEvents(const std::vector<WorkerEvent>& events, bool stopping);
  Child* ChildOf(WorkerId worker);
  // Reads the signalfd: a SIGINT or SIGTERM is kept in interrupted_ (a SIGCHLD only woke the loop).
  void ReadSignals();
  void OnExit(Child& child, const WorkerExit& exit);
  void OnStandbyExit(Child& child, const std::string& how);
  void RespawnStandbys();
  // JobCoordinator's Hooks::rank_taken: `member` took `rank` in `generation`. One host: the
  // standby, this launcher's child, is relabelled and another one started; several hosts: said
  // (the standby's own agent relabels it, FollowGeneration).
  void OnRankTaken(int rank, const std::string& member, int64_t generation);
  std::optional<std::string> ReadJobStop(absl::Duration timeout);
  void WatchJobStop();
  void StopJob(const std::string& reason);
  void ReportPersistFailures();
  // Prints the backup placement of a job of `training_hosts` hosts (coordinator, at formation);
  // fails the job when no placement is possible.
  void DescribeBackups(int training_hosts);
  // The backup placement the ranks of a job of `training_hosts` hosts compute (the same
  // variables); nullopt without peer backups. InvalidArgument naming what is wrong.
  struct Placement {
    BackupPlacementSpec spec;
    BackupPlacement placement;
  };
  absl::StatusOr<std::optional<Placement>> ComputePlacement(int training_hosts) const;
  // Says when ckpt/protected moves to a new epoch: the job is protected (again).
  void ReportProtection();
  std::string Summary() const;
  void CheckRecoveries();
  // Whether every rank completed its first step of `generation` (false when the store does not
  // answer).
  bool EveryRankResumed(int64_t generation);
  void KillRanksWithStaleHeartbeats();
  // The coordinator (one host too): kills a rank its agent reports stopped (SIGSTOP) for --host-timeout
  // while the current generation waits for it to resume (it has not completed a step of it). The
  // hang path cannot: no step runs, so no watchdog fires, and only the heartbeat's timeout would.
  void KillMembersStoppedInFormation();
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
  bool MultiHost() const { return config_.nnodes_min > 0; }
  absl::Status JoinAsHost();
  // Every agent, every tick: heartbeat, lease, plan, generation, kill requests, job end.
  void AgentTick();
  void UpdateLease();
  void PublishPlan();
  void FollowPlan();
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
  // Fail-slow hosts (tools/fail_slow_monitor.h): every agent publishes its host's sample once a
  // second; the coordinator detects and acts (LaunchConfig::fail_slow).
  void SampleHost();
  void DetectFailSlow();
  void ActOnSuspect(const SuspectVerdict& verdict);
  // <run_dir>/events/fail_slow/<unix>-<host>.trace: the history up to this detection.
  void WriteSuspectDump(const SuspectVerdict& v, const std::string& action);
  // The coordinating agent's own event file, <run_dir>/events/agent-<host>.tgev (opened lazily).
  void AppendAgentEvent(Event event);
  std::string HostPrefix() const { return config_.host_id + ":"; }
  // This host in member ids and in agents/stopped/: the host id, or on one host the host name.
  std::string HostLabel() const { return MultiHost() ? config_.host_id : HostName(); }
  // The gate of every coordinator act, checked right before the act writes to the store (or says
  // what it decided), not once per loop: one store call may wait longer than the lease lasts (a
  // partition) and every act after it would run on a stale check (issue 36). True on one host; on
  // several, while this agent holds the coordinator lease by its clock, short of its renewal
  // deadline (CoordinatorLease::HeldAt). The first call to find the gate closed while the lease is
  // still claimed (not renewed in time) says "no longer coordinating", before any act is refused.
  bool coordinating();
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
  Clock* const clock_;  // before every member initialized from it
  std::string store_url_;
  std::string token_file_;
  std::string launcher_start_time_;  // TRAINGUARD_LAUNCHER_START_TIME
  int master_port_ = 0;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<RendezvousCoordinator> coordinator_;
  // Starts, signals and reaps every process of the job (created by Prepare); children_ are its
  // workers.
  std::unique_ptr<ProcessSupervisor> supervisor_;
  std::vector<std::unique_ptr<Child>> children_;
  // This host's agent duties (sdk/host_agent/host_agent.h; created by Prepare, on one host too):
  // its heartbeat, the generations it follows, the kill requests addressed to it, its ranks' death
  // and stop reports, the job's end, its fence, its leaving.
  std::unique_ptr<HostAgent> host_agent_;
  int signal_fd_ = -1;
  int interrupted_ = 0;  // the SIGINT or SIGTERM read from signal_fd_; 0: none
  int standbys_spawned_ = 0;
  int ranks_finished_ = 0;
  int exit_code_ = -1;
  std::string failure_;  // why the job failed or was stopped, for the summary
  std::unique_ptr<EventLog> events_;  // <run_dir>/events/launcher.tgev
  bool formed_reported_ = false;  // generation 0's formation (or failure) was said
  int restarts_ = 0;  // --restart-all: how often every rank was started again
  // Multi-host --restart-all: the round this agent follows (0: the job's first start) and the
  // ranks' store of that round (null in round 0: store_ is theirs).
  int64_t round_ = 0;
  std::unique_ptr<Store> round_store_;
  std::string token_;  // the store's token (a round's store is opened with it)
  std::optional<std::string> restart_pending_;  // --restart-all: the fault to restart for
  absl::Time restarted_at_ = absl::InfinitePast();  // the last restart (RestartAll, StartRound)

  // Every rank's and standby's deaths and the replacements made: what a death leads to.
  ReplacementPolicy replacement_policy_{ReplacementOptions(config_)};
  std::deque<absl::Time> standby_respawns_;  // when each pending respawn is due
  // The ranks' and hosts' deaths with their evidence: the first failure that Fail names. On
  // several hosts the coordinator's (from the death reports).
  FailureHistory failures_;

  absl::Time next_stop_check_ = absl::InfinitePast();
  absl::Time next_persist_check_ = absl::InfinitePast();
  std::string protected_epoch_;  // of the last ckpt/protected reported
  std::map<std::string, std::string> persist_failures_;  // store key -> the rank's error

  // The coordinator's host duties and replacements (sdk/coordinator/job_coordinator.h; created by
  // Prepare, on one host too): its replacements() are the ranks and hosts it gives to standbys,
  // its recoveries() those CheckRecoveries measures.
  std::unique_ptr<JobCoordinator> job_coordinator_;
  std::deque<PendingReplacement>& replacements() { return job_coordinator_->replacements(); }
  std::vector<Recovery>& recoveries() { return job_coordinator_->recoveries(); }
  absl::Time next_liveness_check_ = absl::InfinitePast();
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
  // "coordinating the job" was said, and "no longer coordinating" not since.
  bool said_coordinating_ = false;
  int group_rank_ = -1;  // this host's group rank; -1 for a standby host
  bool spawned_ = false;  // this host's processes were started after the plan
  int64_t followed_generation_ = -1;
  absl::Time next_agent_tick_ = absl::InfinitePast();
  std::string master_addr_ = "127.0.0.1";
  // KillMembersStoppedInFormation: when each member was first seen stopped, and those killed.
  std::map<std::string, absl::Time> stopped_members_since_;
  std::set<std::string> stopped_members_killed_;
  std::optional<absl::Time> min_reached_;  // when nnodes_min workers had joined (PublishPlan)
  // A host cut off from the store for this long gives up (a partition shorter than this heals).
  absl::Duration StoreLossBound() const {
    return std::max(absl::Seconds(30), 10 * config_.host_timeout);
  }
  // The agent that serves the store stays until the others left (bounded), so they see the end.
  void LeaveJob();

  // Fail-slow state (this agent's sample; the coordinator's detector and evictions).
  HostSampler host_sampler_;
  bool gpus_probed_ = false;  // NVML looked for (SampleHost's first call)
  absl::Time next_host_sample_ = absl::InfinitePast();
  std::unique_ptr<FailSlowMonitor> fail_slow_;
  int64_t fail_slow_second_ = 0;
  absl::Time next_fail_slow_check_ = absl::InfinitePast();
  int fail_slow_evictions_ = 0;
  // The last 120 s of every host's record, written out with each suspect (tools/fail_slow_dump.h).
  HostMetricsHistory fail_slow_history_{120};
  bool fail_slow_dump_failed_ = false;  // said once
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
  const std::string events_path = absl::StrCat(
      config_.run_dir, "/events/", MultiHost() ? "launcher-" + config_.host_id : "launcher", ".tgev");
  absl::StatusOr<std::unique_ptr<EventLog>> events = EventLog::Open(env, events_path);
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
    std::vector<std::string> endpoint = absl::StrSplit(
        absl::StripPrefix(store_url_, "tcp://"), absl::MaxSplits(':', 1));
    int port = 0;
    if (MultiHost() && absl::StartsWith(store_url_, "tcp://") && endpoint.size() == 2 &&
        endpoint[0] == config_.local_addr && absl::SimpleAtoi(endpoint[1], &port)) {
      TcpStoreServerOptions options;
      options.host = config_.local_addr;
      options.port = port;
      options.job_token = token;
      absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start(options);
      if (!server.ok()) return server.status();
      server_ = *std::move(server);
      Say(absl::StrFormat("serving the job's store on %s (this host is the job's single point of "
                          "failure: use an etcd cluster to have none)",
                          store_url_));
    }
  }
  // On several hosts every connection leaves from this host's address, so that a partition
  // between hosts (by address) cuts this agent off too.
  if (!config_.store.empty()) {
    OpenStoreOptions store_options;
    if (MultiHost()) store_options.source_address = config_.local_addr;
    absl::StatusOr<std::unique_ptr<Store>> store =
        OpenStore(store_url_, config_.job_id, token, kStoreTimeout, store_options);
    if (!store.ok()) return store.status();
    store_ = *std::move(store);
  }
  if (!config_.store.empty() && !MultiHost()) {
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
  if (MultiHost()) {
    // The holder stops acting AgentCallTimeout before the expiry: a write of the agent's loop that
    // passed the gate has timed out before anyone can take the lease over.
    lease_ = std::make_unique<CoordinatorLease>(store_.get(), config_.host_id,
                                                config_.host_timeout, clock_,
                                                AgentCallTimeout(config_.host_timeout));
    coordinator_ = std::make_unique<RendezvousCoordinator>(store_.get(), clock_,
                                                           config_.host_id, lease_.get());
  } else {
    coordinator_ = std::make_unique<RendezvousCoordinator>(store_.get(), clock_);
  }
  CreateJobCoordinator();
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
  if (MultiHost()) {
    for (const std::string& dir : {absl::StrCat(config_.run_dir, "/logs/", config_.host_id),
                                   absl::StrCat(config_.run_dir, "/pids/", config_.host_id)}) {
      if (absl::Status s = env->CreateDirs(dir); !s.ok()) return s;
    }
    return JoinAsHost();
  }
  return absl::OkStatus();
}

void Job::CreateJobCoordinator() {
  JobCoordinatorOptions options;
  options.host_id = config_.host_id;
  options.host_timeout = config_.host_timeout;
  options.call_timeout = AgentCallTimeout(config_.host_timeout);
  options.max_replacements = config_.max_replacements;
  options.restart_all = RestartsOnHosts();
  // One host: a replacement waits for a standby still starting as long as generation 0 may take
  // to form; several: for a standby host's agent to join, start and park its standbys.
  options.standby_wait = MultiHost() ? 2 * config_.host_timeout + absl::Seconds(10)
                                     : config_.rendezvous_timeout;
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
  hooks.restart_round = [this](const std::string& why, const std::string& dead_host,
                               absl::Time since) { PublishRestartRound(why, dead_host, since); };
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
  // Carried out at the loop's next turn (Run), as any restart.
  hooks.request_restart = [this](const std::string& why) { restart_pending_ = why; };
  job_coordinator_ = std::make_unique<JobCoordinator>(
      store_.get(), clock_, coordinator_.get(), &replacement_policy_, &renewal_policy_, &failures_,
      options, std::move(hooks));
  job_coordinator_->set_world_size(world_size_);
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
  absl::StatusOr<std::unique_ptr<Store>> store =
      OpenStore(store_url_, config_.job_id, *token, kStoreTimeout, OpenStoreOptions{});
  if (!store.ok()) return store.status();
  store_ = *std::move(store);
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
  // A training host that keeps --standby spares starts another for the one that took a rank (on
  // one host, OnRankTaken does).
  hooks.rank_taken = [this](HostWorker&) {
    if (MultiHost() && config_.standby > 0 && group_rank_ >= 0 && CanSpawnStandby()) {
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
  event.attributes.emplace_back("source", "launcher");
  // Pids are this host's (its PID namespace): with several hosts, a pid means (on_host, pid).
  if (MultiHost()) event.attributes.emplace_back("on_host", config_.host_id);
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

void Job::RestartAll() {
  const std::string why = *restart_pending_;
  restart_pending_.reset();
  if (restarts_ >= config_.restart_all) {
    return Fail(absl::StrFormat("%s; --restart-all=%d reached", why, config_.restart_all));
  }
  ++restarts_;
  const absl::Time fault = clock_->Now();
  restarted_at_ = fault;
  Say(absl::StrFormat("restarting every rank (restart %d of at most %d): %s", restarts_,
                      config_.restart_all, why));
  // torchrun's shape: the survivors are stopped too, whatever they were doing.
  StopAll(absl::Seconds(1));
  ForgetStoppedProcesses();
  // Nothing of the old processes' memory survives a restart: their snapshot arenas and rings go,
  // so the new ranks restore the newest checkpoint on disk.
  for (int r = 0; r < world_size_; ++r) {
    (void)Snapshotter::RemoveArena(config_.job_id, r);
    (void)FlightRecorder::Remove(config_.job_id, r);
  }
  // A fresh store: generation 0 again, no keys of the old incarnation (hangs, stops, resumes).
  coordinator_.reset();
  store_.reset();
  server_.reset();
  if (absl::Status s = StartOwnStore(); !s.ok()) {
    return Fail(absl::StrCat("restart ", restarts_, ": cannot start a store: ", s.ToString()));
  }
  coordinator_ = std::make_unique<RendezvousCoordinator>(store_.get(), clock_);
  CreateJobCoordinator();  // on the new store and coordinator: nothing queued
  CreateHangCoordinator();  // no hang pending
  master_port_ = FreePort();
  renewal_policy_.Reset();
  ranks_finished_ = 0;
  next_liveness_check_ = clock_->Now() + config_.heartbeat_timeout;
  for (int r = 0; r < config_.nproc; ++r) {
    if (absl::Status s = Spawn(r, -1); !s.ok()) {
      return Fail(absl::StrCat("restart ", restarts_, ": ", s.message()));
    }
  }
  Record(-1, EventKind::kRestartAll, why, {{"restart", absl::StrCat(restarts_)}});
  StartForming();
  recoveries().push_back({-1, 0, fault});
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
  if (MultiHost()) vars.push_back(absl::StrCat("TRAINGUARD_HOST_ADDR=", config_.local_addr));
  vars.push_back(absl::StrCat("WORLD_SIZE=", n));
  vars.push_back(absl::StrCat("LOCAL_WORLD_SIZE=", local_n));
  vars.push_back(absl::StrCat("ROLE_WORLD_SIZE=", n));
  vars.push_back(absl::StrCat("MASTER_ADDR=", master_addr_));
  vars.push_back(absl::StrCat("MASTER_PORT=", master_port_));
  // torchelastic's: the job's id, and how often the worker group was restarted (never: trainguard
  // replaces ranks in place, so a replacement's count is 0 like everyone's).
  vars.push_back(absl::StrCat("TORCHELASTIC_RUN_ID=", config_.job_id));
  vars.push_back(absl::StrCat("TORCHELASTIC_RESTART_COUNT=", restarts_));
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
  // a survivor would exit first and take a second standby. Twice the timeout unless the user set it.
  const int64_t host_timeout_ms = absl::ToInt64Milliseconds(config_.host_timeout);
  if (MultiHost() && 2 * host_timeout_ms > 10'000 &&
      getenv("TRAINGUARD_SUPERSEDED_STEP_EXIT_MS") == nullptr) {
    vars.push_back(absl::StrCat("TRAINGUARD_SUPERSEDED_STEP_EXIT_MS=", 2 * host_timeout_ms));
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

std::string Job::PidFile(int rank) const {
  // Several hosts may share the run dir, and a pid means something only on its own host.
  const std::string dir =
      MultiHost() ? absl::StrCat(config_.run_dir, "/pids/", config_.host_id) : config_.run_dir + "/pids";
  return absl::StrCat(dir, "/rank-", rank);
}

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
  id.round = round_;
  id.role = rank >= 0 ? store_keys::MemberId::Role::kRank : store_keys::MemberId::Role::kStandby;
  id.index = rank >= 0 ? rank : standby_index;
  child->member_id = store_keys::EncodeMemberId(id);
  WorkerSpec spec;
  spec.label = child->Label();
  spec.argv = config_.command;
  spec.env = ChildEnvironment(*child);
  spec.log_path = absl::StrCat(
      config_.run_dir, "/logs/", MultiHost() ? config_.host_id + "/" : "",
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
  const bool standby_host = MultiHost() && spawned_ && group_rank_ < 0 && config_.restart_all < 0;
  return (config_.standby > 0 || standby_host) && !replacement_policy_.standbys_exhausted();
}

void Job::SignalGroup(const Child& child, int sig) {
  (void)supervisor_->Signal(child.worker, sig);  // refused once it has exited: nothing to reach
}

void Job::OnExit(Child& child, const WorkerExit& exit) {
  const std::string how = exit.Describe();
  if (exit_code_ >= 0) return;  // stopping: exits are expected
  if (child.rank < 0) return OnStandbyExit(child, how);
  if (exit.succeeded()) {
    ++ranks_finished_;
    Say(absl::StrFormat("%s (pid %d) finished", child.Label(), child.pid));
    if (MultiHost()) {
      (void)store_->Set(store_keys::AgentFinished(round_, child.rank), child.member_id,
                        kStoreTimeout);
    }
    return;
  }
  Say(absl::StrFormat("%s (pid %d, member %s) %s", child.Label(), child.pid, child.member_id, how));
  // On several hosts the coordinator records the death, from the report below.
  if (!MultiHost()) failures_.Record({child.Label(), how, child.Cause()});
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
  // The coordinator, maybe on another host, decides.
  if (MultiHost()) return host_agent_->ReportDeath(child, how);
  const absl::Time now = clock_->Now();
  bool formed = false;
  {
    // A rank that exits right after joining may be reaped before the helper thread has reported
    // the generation it joined: give it a moment rather than call the death premature.
    MutexLock lock(&formed_mu_);
    formed_mu_.AwaitWithTimeout(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return formed_.has_value(); }, absl::Seconds(5));
    formed = formed_.has_value() && formed_->ok();
  }
  if (!formed && config_.restart_all >= 0 && restarts_ > 0) {
    // The job formed before this restart, so the command works: a rank lost while the restarted
    // ranks start (a slow interpreter start is a long window) is a fault like any other.
    restart_pending_ = absl::StrCat(child.Label(), " ", how, " before the restarted job formed");
    return;
  }
  if (!formed) {
    return Fail(absl::StrCat(child.Label(), " died before generation 0 formed (", how, ")"));
  }
  const ReplacementPolicy::Decision decision =
      replacement_policy_.OnRankDeath(child.rank, how, now);
  if (const auto* restart = std::get_if<ReplacementPolicy::RestartAll>(&decision)) {
    restart_pending_ = restart->why;
    return;
  }
  if (const auto* fail = std::get_if<ReplacementPolicy::Fail>(&decision)) return Fail(fail->why);
  const auto& replace = std::get<ReplacementPolicy::Replace>(decision);
  if (!replace.message.empty()) Say(replace.message);
  job_coordinator_->QueueRankReplacement(child.rank, how, now, replace.not_before);
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
  if (MultiHost()) {  // the standby's own agent relabels it (FollowGeneration)
    Say(absl::StrFormat("generation %d: rank %d taken by %s", generation, rank, member));
    return;
  }
  Record(rank, EventKind::kRankReplaced,
         absl::StrFormat("rank %d taken by %s in generation %d", rank, member, generation),
         {{"member", member}});
  for (auto& c : children_) {
    if (c->member_id == member && c->running) host_agent_->TakeRank(*c, rank, generation);
  }
  if (CanSpawnStandby()) {
    if (absl::Status s = Spawn(-1, standbys_spawned_); !s.ok()) Say(s.ToString());
  }
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
  for (const char* name : {"TRAINGUARD_TP", "TRAINGUARD_CP", "TRAINGUARD_PP",
                           "TRAINGUARD_BACKUP_COPIES", "TRAINGUARD_BACKUP_EVICT",
                           "TRAINGUARD_BACKUP_RACKS"}) {
    const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): never set after start
    if (v != nullptr) vars[name] = v;
  }
  absl::StatusOr<Options> o = Options::FromEnvironment(vars);
  if (!o.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("backup placement: ", o.status().message()));
  }
  if (o->backup_copies <= 1 || training_hosts < 2) return std::nullopt;
  absl::StatusOr<Topology> topology =
      Topology::Create({.world_size = training_hosts * config_.nproc, .tp = o->tp, .cp = o->cp,
                        .pp = o->pp, .ranks_per_host = config_.nproc});
  if (!topology.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("backup placement: ", topology.status().message()));
  }
  absl::StatusOr<std::vector<EvictionClass>> classes = ParseEvictionClasses(o->backup_evict);
  if (!classes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--backup-evict: ", classes.status().message()));
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

void Job::DescribeBackups(int training_hosts) {
  absl::StatusOr<std::optional<Placement>> placement = ComputePlacement(training_hosts);
  if (!placement.ok()) return Fail(std::string(placement.status().message()));
  if (!placement->has_value()) return;
  for (absl::string_view line :
       absl::StrSplit(DescribePlacement((*placement)->spec, (*placement)->placement), '\n',
                      absl::SkipEmpty())) {
    Say(std::string(line));
  }
}

void Job::ReportProtection() {
  absl::StatusOr<std::string> value =
      ranks_store()->Get("ckpt/protected", absl::Milliseconds(500));
  if (!value.ok()) return;
  std::pair<std::string, std::string> parts = absl::StrSplit(*value, absl::MaxSplits(' ', 1));
  if (parts.second == protected_epoch_ || !coordinating()) return;
  Say(absl::StrFormat("the job is protected%s: every rank's snapshot of step %s is in memory with "
                      "all its backups (epoch %s)",
                      protected_epoch_.empty() ? "" : " again", parts.first, parts.second));
  protected_epoch_ = parts.second;
}

// A rank that could not write a checkpoint to disk keeps training (the step stays uncommitted on
// disk), so the only trace would be its event file: say it here, once per rank and step.
void Job::ReportPersistFailures() {
  absl::StatusOr<std::vector<std::string>> keys =
      ranks_store()->ListKeys(kPersistFailedPrefix, absl::Milliseconds(500));
  if (!keys.ok()) return;
  for (const std::string& key : *keys) {
    if (persist_failures_.count(key) != 0) continue;
    absl::StatusOr<std::string> what = ranks_store()->Get(key, absl::Milliseconds(500));
    if (!what.ok()) continue;
    if (!coordinating()) return;
    Say(absl::StrCat("checkpoint not persisted: ", *what));
    persist_failures_[key] = *what;
  }
}

bool Job::EveryRankResumed(int64_t generation) {
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r) {
    keys.push_back(store_keys::Resumed(generation, r));
  }
  absl::StatusOr<std::vector<std::optional<std::string>>> values =
      ranks_store()->MultiGet(keys, kStoreTimeout);
  if (!values.ok()) return false;
  for (const auto& v : *values) {
    if (!v.has_value()) return false;
  }
  return true;
}

void Job::CheckRecoveries() {
  for (auto it = recoveries().begin(); it != recoveries().end();) {
    // A second fault before every rank resumed supersedes the generation: this recovery ends when
    // the newest one has resumed.
    it->generation = std::max(it->generation, coordinator_->generation());
    if (!EveryRankResumed(it->generation)) {
      ++it;
      continue;
    }
    if (!coordinating()) return;
    const double took = absl::ToDoubleSeconds(clock_->Now() - it->died);
    std::vector<std::pair<std::string, std::string>> attributes = {
        {"took_ms", absl::StrCat(std::llround(took * 1000))}};
    if (!it->host.empty()) attributes.emplace_back("host", it->host);
    Record(it->rank, EventKind::kRecovered,
           absl::StrFormat("every rank completed its first step of generation %d", it->generation),
           std::move(attributes));
    if (!it->host.empty()) {
      Say(absl::StrFormat("recovered from the loss of host %s in %.3f s (its last heartbeat -> "
                          "every rank completed its first step of generation %d)",
                          it->host, took, it->generation));
    } else if (it->rank < 0) {
      Say(
          absl::StrFormat("recovered with the same ranks in %.3f s (first request for a new "
                          "generation -> every rank completed its first step of generation %d)",
                          took, it->generation));
    } else {
      Say(
          absl::StrFormat("recovered from the loss of rank %d in %.3f s (death seen -> every rank "
                          "completed its first step of generation %d)",
                          it->rank, took, it->generation));
    }
    it = recoveries().erase(it);
  }
}

void Job::KillRanksWithStaleHeartbeats() {
  const absl::Time now = clock_->Now();
  if (now < next_liveness_check_) return;
  next_liveness_check_ = now + absl::Milliseconds(500);
  absl::StatusOr<std::vector<int>> stale =
      coordinator_->RanksWithStaleHeartbeats(config_.heartbeat_timeout, kStoreTimeout);
  if (!stale.ok()) return;  // the store is briefly unreachable: look again next time
  if (!coordinating()) return;
  if (!stale->empty()) ReportLaggards();
  if (MultiHost()) {
    const Membership current = coordinator_->current();
    for (int rank : *stale) {
      KillMember(current.members[rank], EventKind::kRankUnresponsive,
                 absl::StrFormat("rank %d has not sent a heartbeat for %s", rank,
                                 absl::FormatDuration(config_.heartbeat_timeout)));
    }
    return;
  }
  for (int rank : *stale) {
    Child* c = RunningHolder(rank);
    if (c == nullptr) continue;
    Say(absl::StrFormat("%s (pid %d) has not sent a heartbeat for %s: killing it", c->Label(),
                        c->pid, absl::FormatDuration(config_.heartbeat_timeout)));
    Record(rank, EventKind::kRankUnresponsive,
           absl::StrFormat("%s (pid %d) has not sent a heartbeat for %s", c->Label(), c->pid,
                           absl::FormatDuration(config_.heartbeat_timeout)),
           {{"pid", absl::StrCat(c->pid)}});
    c->killed_for_liveness = true;
    c->kill_reason = absl::StrFormat("the launcher killed it: no heartbeat for %s",
                                     absl::FormatDuration(config_.heartbeat_timeout));
    SignalGroup(*c, SIGKILL);  // reaped and replaced like any dead rank
  }
}

void Job::KillMembersStoppedInFormation() {
  std::optional<std::map<int, std::string>> stopped =
      StoppedMembers(store_.get(), coordinator_->current(), kStoreTimeout);
  if (!stopped.has_value()) return;  // the store is briefly unreachable: look again next time
  const absl::Time now = clock_->Now();
  const int64_t generation = coordinator_->generation();
  std::map<std::string, absl::Time> still;
  for (const auto& [rank, member] : *stopped) {
    if (stopped_members_killed_.count(member) != 0) continue;
    auto seen = stopped_members_since_.find(member);
    const absl::Time since = seen == stopped_members_since_.end() ? now : seen->second;
    still[member] = since;
    if (now - since < config_.host_timeout) continue;
    // A rank that completed a step of this generation is in training: a stop there is a hang,
    // which the watchdog and the diagnosis name.
    if (ranks_store()
            ->Get(store_keys::Resumed(generation, rank), kStoreTimeout)
            .ok()) {
      continue;
    }
    stopped_members_killed_.insert(member);
    const absl::Duration stood = absl::Trunc(now - since, absl::Milliseconds(1));
    KillAndReplaceStoppedMember(
        rank, member, EventKind::kRankUnresponsive,
        absl::StrFormat("rank %d is stopped (its agent says) for %s while generation %d "
                        "waits for it",
                        rank, absl::FormatDuration(stood), generation));
  }
  stopped_members_since_ = std::move(still);
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
  if (!MultiHost()) {
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
  if (MultiHost()) (void)store_->Set(kJobFailedKey, message, absl::Seconds(2));
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
  if (MultiHost()) {
    Say(absl::StrFormat("job %s: host %s (%s) joined as %s; %d ranks per host, store %s, run dir %s",
                        config_.job_id, config_.host_id, config_.local_addr,
                        config_.standby_host ? "a standby host" : "a worker", config_.nproc,
                        store_url_, config_.run_dir));
  } else {
    Say(absl::StrFormat("job %s: %d ranks, %d standbys, store %s, run dir %s", config_.job_id,
                        config_.nproc, config_.standby, store_url_, config_.run_dir));
  }
  for (int r = 0; r < config_.nproc && !MultiHost(); ++r) {
    if (absl::Status s = Spawn(r, -1); !s.ok()) {
      Say(absl::StrCat("cannot start the job: ", s.message()));
      StopAll(config_.stop_grace);
      return kExitLaunchError;
    }
  }
  for (int i = 0; i < config_.standby && !MultiHost(); ++i) {
    if (absl::Status s = Spawn(-1, i); !s.ok()) {
      Say(absl::StrCat("cannot start the job: ", s.message()));
      StopAll(config_.stop_grace);
      return kExitLaunchError;
    }
  }
  if (!MultiHost()) StartForming();

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
    if (MultiHost() && exit_code_ < 0) AgentTick();
    if (restart_pending_.has_value() && exit_code_ < 0) {
      if (MultiHost()) {
        const std::string why = *restart_pending_;
        restart_pending_.reset();
        if (coordinating()) PublishRestartRound(why, "");
      } else {
        RestartAll();
      }
    }
    if (!formed_reported_) {
      MutexLock lock(&formed_mu_);
      if (formed_.has_value()) {
        formed_reported_ = true;
        if (formed_->ok()) {
          Say(absl::StrFormat("generation 0 formed with %d ranks", world_size_));
        } else if (RestartsOnHosts() && round_ > 0 && coordinating()) {
          // A restarted job that did not form (a rank stopped while it started): restart again.
          restart_pending_ = absl::StrCat("restart round ", round_,
                                          " did not form: ", formed_->ToString());
        } else {
          Fail(absl::StrCat("generation 0 did not form: ", formed_->ToString()));
        }
      }
    }
    // One host: for the ranks' peer waits (on several hosts, each agent's tick does it).
    if (!MultiHost() && formed_reported_ && exit_code_ < 0) host_agent_->ReportStoppedWorkers();
    // The gate before each act, not once for all: an act may wait on the store for longer than
    // the lease lasts.
    if (exit_code_ < 0 && coordinating()) job_coordinator_->TryReplacements(clock_->Now());
    if (coordinating()) CheckRecoveries();
    if (formed_reported_ && exit_code_ < 0 && replacements().empty() && coordinating()) {
      KillRanksWithStaleHeartbeats();
    }
    if (!RestartsOnHosts() && formed_reported_ && exit_code_ < 0 && coordinating()) {
      KillMembersStoppedInFormation();
    }
    if (formed_reported_ && exit_code_ < 0 && coordinating()) hang_coordinator_->Poll();
    if (formed_reported_ && exit_code_ < 0 && coordinating()) RenewGenerationWhenAsked();
    if (exit_code_ < 0) WatchJobStop();
    if (exit_code_ < 0) RespawnStandbys();
    if (coordinating() && clock_->Now() >= next_persist_check_) {
      next_persist_check_ = clock_->Now() + absl::Milliseconds(500);
      ReportPersistFailures();
      if (MultiHost()) ReportProtection();
    }
    if (exit_code_ < 0 && !MultiHost() && ranks_finished_ == config_.nproc) exit_code_ = 0;
  }
  StopAll(config_.stop_grace);
  stop_forming_.store(true);
  if (former_.joinable()) former_.join();
  if (MultiHost()) LeaveJob();
  if (coordinating()) ReportPersistFailures();  // what the ranks reported just before they ended
  if (exit_code_ == 0) {
    // The ranks' snapshot arenas outlive them so that a replacement (or a restarted job) on this
    // machine restores without disk; once the job is done they only hold memory.
    // The same for the flight-recorder rings, the evidence of a hung or dead rank.
    for (const auto& c : children_) {
      if (c->rank < 0) continue;
      (void)Snapshotter::RemoveArena(RanksJobId(), c->rank);
      (void)FlightRecorder::Remove(RanksJobId(), c->rank);
    }
    // The backups this host's ranks held for their sources (peer backups).
    if (MultiHost()) {
      for (int s = 0; s < world_size_; ++s) (void)BackupService::RemoveArenas(RanksJobId(), {s});
    }
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
// reports, the job's end, its fence) are host_agent_'s (sdk/host_agent/host_agent.h).
namespace {
// Every host that joined, in join order (a malformed entry is skipped).
absl::StatusOr<std::vector<store_keys::JoinRecord>> ReadJoinedHosts(Store* store,
                                                                    absl::Duration timeout) {
  absl::StatusOr<std::vector<std::string>> keys =
      store->ListKeys(store_keys::kAgentJoins.prefix(), timeout);
  if (!keys.ok()) return keys.status();
  absl::StatusOr<std::vector<std::optional<std::string>>> values = store->MultiGet(*keys, timeout);
  if (!values.ok()) return values.status();
  std::vector<store_keys::JoinRecord> hosts;
  for (size_t i = 0; i < keys->size(); ++i) {
    absl::StatusOr<store_keys::JoinRecord> j =
        store_keys::DecodeJoinRecord((*keys)[i], (*values)[i].value_or(""));
    if (j.ok()) hosts.push_back(*std::move(j));
  }
  std::sort(hosts.begin(), hosts.end(),
            [](const store_keys::JoinRecord& a, const store_keys::JoinRecord& b) {
              return a.seq < b.seq;
            });
  return hosts;
}
}  // namespace

absl::Status Job::JoinAsHost() {
  absl::StatusOr<int64_t> seq = store_->Add(store_keys::kAgentSeq, 1, kStoreTimeout);
  if (!seq.ok()) return seq.status();
  const std::string value = store_keys::EncodeJoinRecord(
      {config_.host_id, *seq, config_.standby_host, config_.local_addr, master_port_});
  absl::StatusOr<CompareAndSetResult> joined = store_->CompareAndSet(
      store_keys::kAgentJoins.Key(config_.host_id), std::nullopt, value, kStoreTimeout);
  if (!joined.ok()) return joined.status();
  if (!joined->swapped) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "host id %s already joined job %s (%s): give every host its own --host-id",
        config_.host_id, config_.job_id, joined->current.value_or("")));
  }
  return absl::OkStatus();
}

void Job::AgentTick() {
  const absl::Time now = clock_->Now();
  if (now < next_agent_tick_) return;
  next_agent_tick_ = now + config_.host_timeout / 12;
  if (std::optional<std::string> lost = host_agent_->Heartbeat(); lost.has_value()) {
    return Fail(*lost);
  }
  // The job's end first: an agent that would leave this tick must not take over the lease the
  // leaving coordinator released, and announce itself and the job's protection once more.
  if (std::optional<AgentExit> end = host_agent_->WatchJobEnd(); end.has_value()) {
    if (end->code != 0) failure_ = end->failure;
    exit_code_ = end->code;
    return;
  }
  UpdateLease();
  if (!spawned_) FollowPlan();
  if (exit_code_ < 0) FollowGeneration();
  if (exit_code_ < 0) host_agent_->ExecuteKillRequests();
  if (exit_code_ < 0) host_agent_->ReportStoppedWorkers();
  if (exit_code_ < 0 && RestartsOnHosts()) KillRanksStoppedBeforeFormation();
  if (exit_code_ < 0 && coordinating()) CoordinateHosts();
  if (exit_code_ < 0 && config_.fail_slow != LaunchConfig::FailSlowPolicy::kOff) {
    SampleHost();
    if (coordinating()) DetectFailSlow();
  }
}

bool Job::coordinating() {
  if (!MultiHost()) return true;
  if (lease_ == nullptr) return false;
  if (lease_->held()) return true;
  // Claimed but not renewed by the renewal deadline: nobody may have taken it yet, but someone may
  // soon. What was decided stays queued (replacements(), recoveries()): it is still this agent's to
  // act on if its next renewal succeeds (nobody took the lease meanwhile), and dropped if it is
  // deposed.
  if (said_coordinating_ && lease_->claimed()) {
    Say(absl::StrFormat("no longer coordinating (lease term %d was not renewed in time: %s)",
                        lease_->term(), lease_->CheckHeld().message()));
  }
  said_coordinating_ = false;
  return false;
}

void Job::UpdateLease() {
  const bool was = lease_->claimed();
  absl::StatusOr<bool> held = lease_->Update(AgentCallTimeout(config_.host_timeout));
  if (lease_->claimed() == was) {
    if (was && !said_coordinating_ && lease_->held()) {
      // Renewed after its deadline passed, and nobody took it meanwhile: nothing was decided by
      // another coordinator, so what this one had queued still holds.
      said_coordinating_ = true;
      Say(absl::StrFormat("coordinating the job again (lease term %d renewed; generation %d)",
                          lease_->term(), coordinator_->generation()));
    }
    return;
  }
  if (!lease_->claimed()) {
    const std::string& holder = lease_->last_holder();
    if (said_coordinating_) {
      Say(absl::StrFormat("no longer coordinating (%s)",
                          holder.empty() || holder == CoordinatorLease::kReleasedHolder
                              ? std::string("the lease is released")
                          : holder == config_.host_id
                              ? absl::StrFormat("lease term %d expired unrenewed", lease_->term())
                              : absl::StrCat("the lease is ", holder, "'s now")));
    }
    said_coordinating_ = false;
    job_coordinator_->Depose();  // its queue and its recoveries
    return;
  }
  said_coordinating_ = true;
  // Taking over: the membership and every fact the old coordinator acted on are in the store.
  absl::Status resumed = coordinator_->Resume(kStoreTimeout);
  Say(absl::StrFormat("coordinating the job (lease term %d; generation %d)", lease_->term(),
                      coordinator_->generation()));
  if (!resumed.ok() && !absl::IsNotFound(resumed)) Say(resumed.ToString());
  // The hangs of earlier generations were the old coordinator's to diagnose, and on several hosts
  // none can be acted on once its generation moved on: diagnosing them again, each waiting out
  // the dumps' grace for ranks long replaced, held up the current generation's hang by seconds.
  hang_coordinator_->Reset(coordinator_->generation());
  // Every host's bound starts afresh, the previous holder's too; the dead hosts are the store's.
  job_coordinator_->TakeOver(kStoreTimeout);
  (void)held;
}

// The coordinator assigns group ranks once enough hosts joined: the first nnodes_max workers in
// join order train (at least nnodes_min), every other host is a standby host.
void Job::PublishPlan() {
  const absl::Duration timeout = AgentCallTimeout(config_.host_timeout);
  absl::StatusOr<std::vector<store_keys::JoinRecord>> hosts =
      ReadJoinedHosts(store_.get(), timeout);
  if (!hosts.ok()) return;
  int workers = 0;
  for (const store_keys::JoinRecord& j : *hosts) workers += j.standby ? 0 : 1;
  if (workers < config_.nnodes_min ||
      hosts->size() < static_cast<size_t>(config_.nnodes_min + config_.standby_nodes)) {
    return;  // not yet
  }
  // Between MIN and MAX, torchrun's "last call": more workers may join for rdzv_last_call.
  if (workers < config_.nnodes_max) {
    const absl::Time now = clock_->Now();
    if (!min_reached_.has_value()) {
      min_reached_ = now;
      Say(absl::StrFormat("%d of at most %d hosts joined: forming in %s unless all join", workers,
                          config_.nnodes_max, absl::FormatDuration(config_.rdzv_last_call)));
    }
    if (now - *min_reached_ < config_.rdzv_last_call) return;
  }
  const int training = std::min(workers, config_.nnodes_max);
  store_keys::Plan plan;
  plan.training_hosts = training;
  plan.ranks_per_host = config_.nproc;
  int group = 0;
  for (const store_keys::JoinRecord& j : *hosts) {
    const bool trains = !j.standby && group < training;
    if (trains && group == 0) {
      plan.master_addr = j.addr;
      plan.master_port = j.port;
    }
    plan.hosts.push_back({j.host, trains ? group : -1});
    if (trains) ++group;
  }
  if (!coordinating()) return;
  absl::StatusOr<CompareAndSetResult> published = store_->CompareAndSet(
      store_keys::kAgentPlan, std::nullopt, store_keys::EncodePlan(plan), timeout);
  if (published.ok() && published->swapped) {
    Say(absl::StrFormat("%d host(s) train, %d are standby hosts", training,
                        hosts->size() - training));
    DescribeBackups(training);
  }
}

// Starts this host's processes once the plan names its group rank: its N ranks (and --standby
// spare processes), or N standbys on a standby host and on a host that joined after the plan.
void Job::FollowPlan() {
  int hosts = 0;
  if (!ReadPlan(&hosts)) return;
  spawned_ = true;
  SpawnPlannedProcesses(hosts);
}

bool Job::ReadPlan(int* hosts) {
  absl::StatusOr<std::string> value =
      store_->Get(store_keys::kAgentPlan, AgentCallTimeout(config_.host_timeout));
  if (!value.ok()) {
    if (absl::IsNotFound(value.status()) && coordinating()) PublishPlan();
    return false;
  }
  absl::StatusOr<store_keys::Plan> plan = store_keys::DecodePlan(*value);
  if (!plan.ok()) {
    Fail(absl::StrCat("malformed plan: ", plan.status().message()));
    return false;
  }
  if (plan->ranks_per_host != config_.nproc) {
    Fail(absl::StrFormat("host %s has --nproc-per-node %d but the job has %d per host",
                         config_.host_id, config_.nproc, plan->ranks_per_host));
    return false;
  }
  *hosts = plan->training_hosts;
  master_addr_ = plan->master_addr;
  master_port_ = plan->master_port;
  world_size_ = *hosts * plan->ranks_per_host;
  job_coordinator_->set_world_size(world_size_);
  hang_coordinator_->set_world_size(world_size_);
  group_rank_ = plan->GroupOf(config_.host_id);
  return true;
}

void Job::SpawnPlannedProcesses(int hosts) {
  const int per_host = config_.nproc;
  const bool trains = group_rank_ >= 0;
  // Under --restart-all a standby host holds no processes until a restart gives it a group rank.
  const int standbys = config_.restart_all >= 0 ? 0 : trains ? config_.standby : per_host;
  Say(trains ? absl::StrFormat("host %s is group %d of %d: ranks %d..%d%s", config_.host_id,
                               group_rank_, hosts, group_rank_ * per_host,
                               group_rank_ * per_host + per_host - 1,
                               round_ > 0 ? absl::StrCat(" (restart round ", round_, ")") : "")
             : absl::StrFormat("host %s is a standby host: %d standbys", config_.host_id,
                               standbys));
  for (int i = 0; trains && i < per_host; ++i) {
    if (absl::Status s = Spawn(group_rank_ * per_host + i, -1); !s.ok()) {
      return Fail(absl::StrCat("cannot start the job: ", s.message()));
    }
  }
  for (int i = 0; i < standbys; ++i) {
    if (absl::Status s = Spawn(-1, i); !s.ok()) {
      return Fail(absl::StrCat("cannot start the job: ", s.message()));
    }
  }
}

// ---- Multi-host --restart-all: restart rounds ----
//
// torchrun's elastic agent answers any failure by stopping the whole worker group and starting
// it again through a new rendezvous round; these are the same rounds on trainguard's agents. The
// coordinator publishes "<round> <why>" at agents/restart (and, for a host fault, a plan that
// gives the dead host's group rank to a standby host); every agent, the coordinator's own first,
// kills its processes and starts its ranks under the round's job id, whose store namespace holds
// nothing yet: generation 0 forms anew there, and with no snapshot committed in the store, no
// arena and no peer backup of the round, every rank restores the newest checkpoint on disk.

void Job::PublishRestartRound(const std::string& why, const std::string& dead_host,
                              absl::Time since) {
  const absl::Duration timeout = AgentCallTimeout(config_.host_timeout);
  if (!coordinating()) return;
  RestartRoundRequest request;
  request.round = round_;
  request.limit = config_.restart_all;
  request.why = why;
  request.dead_host = dead_host;
  request.own_host = config_.host_id;
  request.master_addr = master_addr_;
  request.master_port = master_port_;
  RestartRoundDecision::Action action = DecideRestartRound(request);
  if (std::holds_alternative<RestartRoundDecision::ReadHosts>(action)) {
    absl::StatusOr<RestartRoundHosts> hosts = ReadRestartRoundHosts(timeout);
    if (!hosts.ok()) {
      return Fail(absl::StrFormat("restart round %d (%s): cannot read the plan and the hosts: %s",
                                  round_ + 1, why, hosts.status().ToString()));
    }
    request.hosts = *std::move(hosts);
    action = DecideRestartRound(request);
  }
  if (const auto* fail = std::get_if<RestartRoundDecision::Fail>(&action)) return Fail(fail->why);
  const auto* start = std::get_if<RestartRoundDecision::Start>(&action);
  if (start == nullptr) return;  // not reached: with the hosts read, it is Fail or Start
  const int64_t next = start->round;
  if (!start->taker.empty()) Say(start->taker);
  if (start->plan.has_value()) {
    store_keys::Plan new_plan;
    new_plan.training_hosts = start->plan->training_hosts;
    new_plan.ranks_per_host = config_.nproc;
    new_plan.master_addr = start->plan->master_addr;
    new_plan.master_port = start->plan->master_port;
    for (const RestartRoundPlan::Host& h : start->plan->hosts) {
      new_plan.hosts.push_back({h.host, h.group});
    }
    if (!coordinating()) return;
    if (absl::Status s =
            store_->Set(store_keys::kAgentPlan, store_keys::EncodePlan(new_plan), timeout);
        !s.ok()) {
      return Fail(absl::StrFormat("restart round %d (%s): publishing its plan: %s", next, why,
                                  s.ToString()));
    }
  }
  if (!coordinating()) return;
  if (absl::Status s = store_->Set(store_keys::kAgentRestart,
                                   store_keys::EncodeRestartRound({next, why}), timeout);
      !s.ok()) {
    return Fail(absl::StrFormat("restart round %d (%s): publishing it: %s", next, why,
                                s.ToString()));
  }
  Say(absl::StrFormat("restarting every rank on every host (restart %d of at most %d): %s", next,
                      config_.restart_all, why));
  std::vector<std::pair<std::string, std::string>> attributes = {
      {"restart", absl::StrCat(next)}};
  if (!dead_host.empty()) attributes.emplace_back("host", dead_host);
  Record(-1, EventKind::kRestartAll, why, std::move(attributes));
  const absl::Time fault = since == absl::InfinitePast() ? clock_->Now() : since;
  StartRound(next);
  recoveries().push_back({-1, 0, fault, dead_host});
}

absl::StatusOr<RestartRoundHosts> Job::ReadRestartRoundHosts(absl::Duration timeout) {
  absl::StatusOr<std::string> value = store_->Get(store_keys::kAgentPlan, timeout);
  absl::StatusOr<store_keys::Plan> plan =
      value.ok() ? store_keys::DecodePlan(*value) : value.status();
  absl::StatusOr<std::vector<store_keys::JoinRecord>> joined =
      ReadJoinedHosts(store_.get(), timeout);
  absl::StatusOr<std::vector<std::string>> left =
      store_->ListKeys(store_keys::kAgentsLeft.prefix(), timeout);
  if (!plan.ok()) return plan.status();
  if (!joined.ok()) return joined.status();
  if (!left.ok()) return left.status();
  RestartRoundHosts hosts;
  hosts.groups = plan->Groups();
  const absl::Time now = clock_->Now();
  for (const store_keys::JoinRecord& j : *joined) {
    hosts.joined.push_back({j.host, j.addr, j.port});
    if (job_coordinator_->IsSilent(j.host, now)) hosts.silent.insert(j.host);
  }
  for (std::string& host : store_keys::kAgentsLeft.Names(*left)) hosts.left.insert(std::move(host));
  hosts.dead = job_coordinator_->dead_hosts();
  return hosts;
}

void Job::FollowRestartRound() {
  if (!RestartsOnHosts()) return;
  absl::StatusOr<std::string> value =
      store_->Get(store_keys::kAgentRestart, AgentCallTimeout(config_.host_timeout));
  if (!value.ok()) return;
  absl::StatusOr<store_keys::RestartRound> restart = store_keys::DecodeRestartRound(*value);
  if (!restart.ok() || restart->round <= round_) return;
  Say(absl::StrFormat("restart round %d: %s", restart->round, restart->why));
  StartRound(restart->round);
}

void Job::KillRanksStoppedBeforeFormation() {
  {
    MutexLock lock(&formed_mu_);
    if (formed_.has_value() || round_ == 0) return;
  }
  host_agent_->KillRanksStoppedFor(config_.heartbeat_timeout,
                                   absl::StrFormat("before restart round %d formed", round_));
}

void Job::StartRound(int64_t round) {
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
  const std::string old_id = RanksJobId();
  for (int r = 0; r < world_size_; ++r) {
    (void)Snapshotter::RemoveArena(old_id, r);
    (void)FlightRecorder::Remove(old_id, r);
    (void)BackupService::RemoveArenas(old_id, {r});
  }
  Say(absl::StrFormat("restart round %d: stopped %s; shared memory of job id %s removed", round,
                      stopped.empty() ? "no process" : absl::StrJoin(stopped, ", "), old_id));
  round_ = round;
  job_coordinator_->set_round(round_);
  restarts_ = static_cast<int>(round);
  restarted_at_ = clock_->Now();
  OpenStoreOptions store_options;
  store_options.source_address = config_.local_addr;
  absl::StatusOr<std::unique_ptr<Store>> store =
      OpenStore(store_url_, RanksJobId(), token_, kStoreTimeout, store_options);
  if (!store.ok()) {
    return Fail(absl::StrFormat("restart round %d: connecting to the store as %s: %s", round,
                                RanksJobId(), store.status().ToString()));
  }
  coordinator_.reset();
  round_store_ = *std::move(store);
  coordinator_ = std::make_unique<RendezvousCoordinator>(ranks_store(), clock_,
                                                         config_.host_id, lease_.get());
  job_coordinator_->set_rendezvous(coordinator_.get());
  // A coordinator that follows a round another published (it took the lease over meanwhile) acts
  // on the round's membership if it formed already (NotFound: not yet).
  if (coordinating()) {
    if (absl::Status s = coordinator_->Resume(kStoreTimeout); !s.ok() && !absl::IsNotFound(s)) {
      Say(s.ToString());
    }
  }
  followed_generation_ = -1;
  replacements().clear();
  hang_coordinator_->Reset(0);
  renewal_policy_.Reset();
  ranks_finished_ = 0;
  next_liveness_check_ = clock_->Now() + config_.heartbeat_timeout;
  int hosts = 0;
  if (!ReadPlan(&hosts)) {
    if (exit_code_ < 0) {
      Fail(absl::StrFormat("restart round %d: no plan at %s", round, store_keys::kAgentPlan));
    }
    return;
  }
  SpawnPlannedProcesses(hosts);
}

// Follows the published generations (HostAgent::FollowMembership: a standby of this host that took
// a rank is relabelled; a process of this host that lost its rank while alive, declared dead or
// stale, is killed), and a host that was declared dead (partitioned, then back) stops, fenced out
// (HostAgent::CheckFenced).
void Job::FollowGeneration() {
  const absl::Duration timeout = AgentCallTimeout(config_.host_timeout);
  // Only this host ends: the job goes on without it, so nothing is published for the others.
  if (std::optional<AgentExit> fenced = host_agent_->CheckFenced(); fenced.has_value()) {
    failure_ = fenced->failure;
    exit_code_ = fenced->code;
    return;
  }
  FollowRestartRound();
  if (exit_code_ >= 0) return;
  // The newest published generation, read as a coordinator taking over reads it (on an agent
  // that does not hold the lease, its coordinator only keeps it up to date).
  if (!coordinator_->Resume(timeout).ok()) return;
  const Membership current = coordinator_->current();
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
  // One host: every member is this launcher's child (and there is no lease to fence a request by).
  if (!MultiHost() || absl::StartsWith(member, HostPrefix())) {
    for (auto& c : children_) {
      if (c->member_id != member || !c->running || c->killed_for_liveness) continue;
      KillForLiveness(*c, what, absl::StrCat(": ", why));
    }
    return;
  }
  const std::string host = store_keys::MemberHost(member);
  Say(absl::StrFormat("asking host %s to kill %s: %s", host, member, why));
  // Fenced by this coordinator's lease term: the agent ignores it once a newer term exists.
  (void)store_->Set(
      store_keys::AgentKill(host, member),
      store_keys::EncodeKillRequest({lease_->term(), std::string(EventKindName(what)), why}),
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
  // death; queueing it here too would replace the rank twice.
  if (!MultiHost() || RestartsOnHosts() || job_coordinator_->DeathTaken(member)) return;
  (void)job_coordinator_->QueueDeadMember(
      rank, member,
      absl::StrCat("is stopped, its agent says, and is being killed (",
                   std::string(EventKindName(what)), ")"));
}

std::vector<std::string> Job::PreferredStandbys(const std::string& dead_host,
                                                const std::vector<int>& ranks) {
  if (!MultiHost()) return {};  // one host: any parked standby, in member-id order
  absl::StatusOr<std::vector<std::string>> parked =
      coordinator_->ParkedStandbys(AgentCallTimeout(config_.host_timeout));
  if (!parked.ok()) return {};
  std::set<std::string> unsafe;
  for (int rank : ranks) unsafe.merge(HostsSharingBackups(rank));
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
  const absl::Time now = clock_->Now();
  if (now < next_host_sample_ || !spawned_) return;
  next_host_sample_ = now + absl::Seconds(1);
  if (!gpus_probed_) {
    // Once per agent: a host without an NVIDIA driver collects no GPU metric, and says so once.
    gpus_probed_ = true;
    absl::StatusOr<std::unique_ptr<GpuMetricsSource>> gpus = NvmlGpuMetricsSource::Open();
    if (gpus.ok()) {
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");  // NOLINT(concurrency-mt-unsafe)
      Say(absl::StrCat("fail-slow: GPU metrics through NVML (", (*gpus)->device_count(),
                       " GPU(s) on this host)"));
      host_sampler_ = HostSampler(*std::move(gpus), visible != nullptr
                                                        ? std::optional<std::string>(visible)
                                                        : std::nullopt);
    } else {
      Say(absl::StrCat("fail-slow: no GPU metrics: ", gpus.status().message()));
    }
  }
  const absl::Duration timeout = AgentCallTimeout(config_.host_timeout);
  std::vector<HostSampler::RankProcess> ranks;
  std::vector<std::string> keys;
  for (const auto& c : children_) {
    if (c->rank < 0 || !c->running) continue;
    ranks.push_back({c->rank, c->pid, std::nullopt, c->rank % std::max(1, config_.nproc)});
    keys.push_back(RankWorkKey(c->rank));
  }
  if (ranks.empty()) return;  // a standby host: nothing to compare until its standbys take ranks
  absl::StatusOr<std::vector<std::optional<std::string>>> records = store_->MultiGet(keys, timeout);
  if (records.ok()) {
    for (size_t i = 0; i < ranks.size(); ++i) ranks[i].work_record = (*records)[i];
  }
  std::optional<HostMetricsRecord> sample = host_sampler_.Sample(now, ranks);
  if (!sample.has_value()) return;
  (void)store_->Set(HostMetricsKey(config_.host_id), EncodeHostMetricsRecord(*sample), timeout);
}

void Job::DetectFailSlow() {
  const absl::Time now = clock_->Now();
  if (now < next_fail_slow_check_ || world_size_ == 0) return;
  next_fail_slow_check_ = now + absl::Seconds(1);
  const absl::Duration timeout = AgentCallTimeout(config_.host_timeout);
  if (fail_slow_ == nullptr) {
    FailSlowOptions options;
    options.continuity = config_.fail_slow_continuity_s;
    options.denoise_window = config_.fail_slow_window_s;
    options.max_fill = config_.fail_slow_window_s;
    absl::StatusOr<FailSlowDetector> detector = FailSlowDetector::Create(options);
    if (!detector.ok()) {
      Say(absl::StrCat("fail-slow detection is off: ", detector.status().ToString()));
      config_.fail_slow = LaunchConfig::FailSlowPolicy::kOff;
      return;
    }
    fail_slow_ = std::make_unique<FailSlowMonitor>(*std::move(detector));
  }
  // The hosts that hold ranks now, and are not dead: a standby host is compared once it trains.
  const Membership current = coordinator_->current();
  std::set<std::string> training;
  for (const std::string& member : current.members) {
    std::string host = store_keys::MemberHost(member);
    if (job_coordinator_->dead_hosts().count(host) == 0) training.insert(std::move(host));
  }
  std::vector<std::string> keys;
  for (const std::string& host : training) keys.push_back(HostMetricsKey(host));
  absl::StatusOr<std::vector<std::optional<std::string>>> values = store_->MultiGet(keys, timeout);
  if (!values.ok()) return;
  std::map<std::string, std::string> records;
  size_t i = 0;
  for (const std::string& host : training) {
    if ((*values)[i].has_value()) records[host] = *(*values)[i];
    ++i;
  }
  ++fail_slow_second_;
  fail_slow_history_.Record(fail_slow_second_, records);
  if (!config_.fail_slow_trace.empty()) {
    if (std::FILE* trace = std::fopen(config_.fail_slow_trace.c_str(), "a"); trace != nullptr) {
      for (const auto& [host, record] : records) {
        std::fprintf(trace, "%lld %s %s\n", static_cast<long long>(fail_slow_second_), host.c_str(),
                     record.c_str());
      }
      std::fclose(trace);
    }
  }
  for (const SuspectVerdict& verdict : fail_slow_->Observe(fail_slow_second_, records)) {
    ActOnSuspect(verdict);
  }
}

void Job::ActOnSuspect(const SuspectVerdict& v) {
  // Parked standbys on other hosts: evicting into nothing would fail a job that was only slow.
  int spare = 0;
  if (config_.fail_slow == LaunchConfig::FailSlowPolicy::kEvict ||
      config_.fail_slow == LaunchConfig::FailSlowPolicy::kEvictRepeated) {
    if (absl::StatusOr<std::vector<std::string>> parked =
            coordinator_->ParkedStandbys(AgentCallTimeout(config_.host_timeout));
        parked.ok()) {
      for (const std::string& member : *parked) {
        if (!absl::StartsWith(member, v.host + ":")) ++spare;
      }
    }
  }
  const FailSlowDecision decision = DecideFailSlowAction(
      config_.fail_slow, v.windows, fail_slow_evictions_,
      std::max(1, world_size_ / std::max(1, config_.nproc)), config_.fail_slow_max_evict_share,
      spare, config_.nproc);
  const std::string& action = decision.action;
  const bool evict = decision.evict;
  const std::string evidence = absl::StrFormat(
      "%s %.3g vs the hosts' median %.3g (%.0f%% off its peers), z %.2f among %d hosts, for %d "
      "continuity window(s) of %d s",
      v.metric, v.value, v.peers_median, 100 * v.deviation, v.z, v.hosts, v.windows,
      config_.fail_slow_continuity_s);
  if (!coordinating()) return;
  // Before it is said: whoever reads the line or the event finds the dump already there.
  WriteSuspectDump(v, action);
  Say(absl::StrFormat("suspect host %s: %s; action: %s", v.host, evidence, action));
  Event event;
  event.type = EventType::kSuspectHost;
  event.rank = -1;
  event.generation = coordinator_->generation();
  event.message = absl::StrFormat("suspect host %s: %s", v.host, evidence);
  event.attributes = {{"host", v.host},
                      {"metric", v.metric},
                      {"z", absl::StrFormat("%.3f", v.z)},
                      {"deviation", absl::StrFormat("%.3f", v.deviation)},
                      {"value", absl::StrFormat("%.6g", v.value)},
                      {"peers_median", absl::StrFormat("%.6g", v.peers_median)},
                      {"windows", absl::StrCat(v.windows)},
                      {"continuity_s", absl::StrCat(config_.fail_slow_continuity_s)},
                      {"hosts", absl::StrCat(v.hosts)},
                      {"action", action}};
  AppendAgentEvent(std::move(event));
  if (!evict) return;
  ++fail_slow_evictions_;
  fail_slow_->Forget(v.host);
  job_coordinator_->DeclareHostDead(
      v.host, clock_->Now(),
      absl::StrFormat("fail-slow: %s %.0f%% off its peers for %d s", v.metric, 100 * v.deviation,
                      v.windows * config_.fail_slow_continuity_s));
}

void Job::WriteSuspectDump(const SuspectVerdict& v, const std::string& action) {
  FailSlowDumpHeader header;
  header.host = v.host;
  header.metric = v.metric;
  header.z = v.z;
  header.deviation = v.deviation;
  header.windows = v.windows;
  header.second = fail_slow_second_;
  header.unix_second = absl::ToUnixSeconds(clock_->Now());
  header.action = action;
  absl::StatusOr<std::string> path =
      WriteFailSlowDump(Env::Default(), FailSlowDumpDir(config_.run_dir), header,
                        fail_slow_history_.Lines(), kMaxFailSlowDumps);
  if (!path.ok() && !fail_slow_dump_failed_) {
    fail_slow_dump_failed_ = true;  // a full disk would say it every window
    Say(absl::StrCat("cannot write the metrics around the suspect (said once): ",
                     path.status().ToString()));
  }
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

void Job::LeaveJob() {
  lease_->Release(absl::Seconds(1));
  host_agent_->Leave(exit_code_);
  // The agent that serves the store stays until the others left (bounded), so they see the end.
  if (server_ != nullptr) {
    (void)host_agent_->WaitForOthersToLeave(2 * config_.host_timeout + absl::Seconds(5));
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
  if (!persist_failures_.empty()) {
    // The newest checkpoint on disk is older than it should be: a job that "succeeded" must say so.
    absl::StrAppendFormat(&counts, "; %d checkpoint(s) not persisted (last: %s)",
                          persist_failures_.size(), persist_failures_.rbegin()->second);
  }
  if (exit_code_ == 0) {
    if (MultiHost()) {
      return absl::StrFormat("job %s succeeded: every rank finished; host %s: %d rank(s) finished "
                             "here, %s",
                             config_.job_id, config_.host_id, ranks_finished_, counts);
    }
    return absl::StrFormat("job %s succeeded: %d ranks finished, %s", config_.job_id, config_.nproc,
                           counts);
  }
  return absl::StrFormat("job %s ended (exit status %d): %s; %s", config_.job_id, exit_code_,
                         failure_, counts);
}

absl::StatusOr<int> ParseCount(const std::string& flag, const std::string& value, int minimum) {
  int n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < minimum) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s '%s': need an integer >= %d", flag, value, minimum));
  }
  return n;
}

}  // namespace

std::string RunUsage() {
  return "usage: trainguard run --nproc N [--standby K] [--max-replacements M]\n"
         "                      [--store tcp://HOST:PORT --token-file F | --store "
         "etcd://HOST:PORT]\n"
         "                      [--job-id ID] [--run-dir DIR] [--rendezvous-timeout SECONDS]\n"
         "                      [--heartbeat-timeout SECONDS] [--restart-backoff SECONDS]\n"
         "                      [--restart-all M]\n"
         "                      -- COMMAND [ARGS...]\n"
         "       trainguard run --nnodes MIN[:MAX] --nproc-per-node N --rdzv-endpoint URL "
         "--job-id ID\n"
         "                      [--standby-nodes K | --role standby] [--local-addr ADDR] "
         "[--host-id ID]\n"
         "                      [--host-timeout SECONDS (default 3; 10 with etcd://)] "
         "[--rdzv-last-call SECONDS]\n"
         "                      [--spread-standbys]\n"
         "                      [--backup-copies M] [--backup-evict host,rack,tp,cp,dp,pp] "
         "[--backup-racks R0,R1,...]\n"
         "                      [--backup-rate MIB_S] [--backup-budget MIB]\n"
         "                      [--fail-slow off|alert|evict|evict-repeated] "
         "[--fail-slow-max-evict-share F]\n"
         "                      [--fail-slow-continuity SECONDS] [--fail-slow-window SECONDS]\n"
         "                      [--fail-slow-trace FILE]\n"
         "                      [--token-file F] [--standby K] [...as above] -- COMMAND "
         "[ARGS...]\n";
}

absl::Duration DefaultHostTimeout(std::string_view store_url) {
  return store_url.starts_with("etcd://") ? absl::Seconds(10) : absl::Seconds(3);
}

absl::StatusOr<LaunchConfig> ParseRunArguments(const std::vector<std::string>& args) {
  LaunchConfig config;
  bool host_timeout_given = false;
  size_t i = 0;
  for (; i < args.size() && args[i] != "--"; ++i) {
    const std::string& flag = args[i];
    if (flag == "--spread-standbys") {  // the one flag without a value
      config.spread_standbys = true;
      continue;
    }
    if (i + 1 >= args.size() || args[i + 1] == "--") {
      return absl::InvalidArgumentError(absl::StrCat(flag, " needs a value"));
    }
    const std::string& value = args[++i];
    absl::StatusOr<int> n = 0;
    if (flag == "--nproc" || flag == "--nproc-per-node") {
      n = ParseCount(flag, value, 1);
      config.nproc = n.value_or(0);
    } else if (flag == "--standby") {
      n = ParseCount(flag, value, 0);
      config.standby = n.value_or(0);
    } else if (flag == "--max-replacements") {
      n = ParseCount(flag, value, 0);
      config.max_replacements = n.value_or(0);
    } else if (flag == "--restart-all") {
      n = ParseCount(flag, value, 0);
      config.restart_all = n.value_or(0);
    } else if (flag == "--restart-backoff") {
      n = ParseCount(flag, value, 0);
      config.restart_backoff = absl::Seconds(n.value_or(0));
    } else if (flag == "--heartbeat-timeout") {
      n = ParseCount(flag, value, 1);
      config.heartbeat_timeout = absl::Seconds(n.value_or(1));
    } else if (flag == "--rendezvous-timeout") {
      n = ParseCount(flag, value, 1);
      config.rendezvous_timeout = absl::Seconds(n.value_or(1));
    } else if (flag == "--store" || flag == "--rdzv-endpoint") {
      config.store = value;
    } else if (flag == "--token-file") {
      config.token_file = value;
    } else if (flag == "--job-id") {
      config.job_id = value;
    } else if (flag == "--run-dir") {
      config.run_dir = value;
    } else if (flag == "--nnodes") {
      std::vector<std::string> range = absl::StrSplit(value, ':');
      if (range.size() > 2 || !absl::SimpleAtoi(range[0], &config.nnodes_min) ||
          config.nnodes_min < 1 ||
          (range.size() == 2 && !absl::SimpleAtoi(range[1], &config.nnodes_max)) ||
          (range.size() == 2 && config.nnodes_max < config.nnodes_min)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("--nnodes '%s': need MIN or MIN:MAX with 1 <= MIN <= MAX", value));
      }
      if (range.size() == 1) config.nnodes_max = config.nnodes_min;
    } else if (flag == "--standby-nodes") {
      n = ParseCount(flag, value, 0);
      config.standby_nodes = n.value_or(0);
    } else if (flag == "--role") {
      if (value != "standby" && value != "worker") {
        return absl::InvalidArgumentError(
            absl::StrFormat("--role '%s': need worker or standby", value));
      }
      config.standby_host = value == "standby";
    } else if (flag == "--local-addr") {
      config.local_addr = value;
    } else if (flag == "--host-id") {
      config.host_id = value;
    } else if (flag == "--host-timeout") {
      double seconds = 0;
      if (!absl::SimpleAtod(value, &seconds) || !(seconds >= 0.5) || seconds > 3600) {
        return absl::InvalidArgumentError(
            absl::StrFormat("--host-timeout '%s': need seconds in [0.5, 3600]", value));
      }
      config.host_timeout = absl::Seconds(seconds);
      host_timeout_given = true;
    } else if (flag == "--backup-copies" || flag == "--backup-rate" ||
               flag == "--backup-budget") {
      n = ParseCount(flag, value, flag == "--backup-copies" ? 1 : 0);
      const char* name = flag == "--backup-copies" ? "TRAINGUARD_BACKUP_COPIES"
                         : flag == "--backup-rate" ? "TRAINGUARD_BACKUP_RATE_MIB_S"
                                                   : "TRAINGUARD_BACKUP_MEMORY_BUDGET_MIB";
      config.backup_env.emplace_back(name, value);
    } else if (flag == "--backup-evict") {
      absl::StatusOr<std::vector<EvictionClass>> classes = ParseEvictionClasses(value);
      if (!classes.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--backup-evict: ", classes.status().message()));
      }
      config.backup_env.emplace_back("TRAINGUARD_BACKUP_EVICT", value);
    } else if (flag == "--backup-racks") {
      config.backup_env.emplace_back("TRAINGUARD_BACKUP_RACKS", value);
    } else if (flag == "--rdzv-last-call") {
      n = ParseCount(flag, value, 0);
      config.rdzv_last_call = absl::Seconds(n.value_or(0));
    } else if (flag == "--fail-slow") {
      using Policy = LaunchConfig::FailSlowPolicy;
      if (value == "off") {
        config.fail_slow = Policy::kOff;
      } else if (value == "alert") {
        config.fail_slow = Policy::kAlert;
      } else if (value == "evict") {
        config.fail_slow = Policy::kEvict;
      } else if (value == "evict-repeated") {
        config.fail_slow = Policy::kEvictRepeated;
      } else {
        return absl::InvalidArgumentError(absl::StrFormat(
            "--fail-slow '%s': need off, alert, evict or evict-repeated", value));
      }
    } else if (flag == "--fail-slow-max-evict-share") {
      double share = 0;
      if (!absl::SimpleAtod(value, &share) || !(share >= 0) || share > 1) {
        return absl::InvalidArgumentError(
            absl::StrFormat("--fail-slow-max-evict-share '%s': need a fraction in [0, 1]", value));
      }
      config.fail_slow_max_evict_share = share;
    } else if (flag == "--fail-slow-continuity") {
      n = ParseCount(flag, value, 1);
      config.fail_slow_continuity_s = n.value_or(1);
    } else if (flag == "--fail-slow-trace") {
      config.fail_slow_trace = value;
    } else if (flag == "--fail-slow-window") {
      n = ParseCount(flag, value, 1);
      config.fail_slow_window_s = n.value_or(1);
      if (n.ok() && *n % 2 == 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "--fail-slow-window '%s': need an odd number of seconds (a median that a rise and a "
            "fall move alike)",
            value));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", flag));
    }
    if (!n.ok()) return n.status();
  }
  if (!host_timeout_given) config.host_timeout = DefaultHostTimeout(config.store);
  if (i < args.size()) config.command.assign(args.begin() + i + 1, args.end());
  if (config.nproc < 1) return absl::InvalidArgumentError("--nproc N is required");
  if (config.command.empty()) return absl::InvalidArgumentError("no command after --");
  if (config.restart_all >= 0 && config.nnodes_min == 0 && !config.store.empty()) {
    return absl::InvalidArgumentError(
        "--restart-all needs one host and the launcher's own store (no --store), or --nnodes "
        "(one agent per host, every one with --restart-all)");
  }
  if (config.restart_all >= 0 && config.nnodes_min > 0) {
    // torchrun has no warm spares: a restart starts every rank anew, and a standby host joins
    // with no process (it takes a dead host's group rank in the restart).
    if (config.standby > 0) {
      return absl::InvalidArgumentError(
          "--restart-all with --nnodes starts every rank anew: no --standby spare processes");
    }
    for (const auto& [name, value] : config.backup_env) {
      if (name == "TRAINGUARD_BACKUP_COPIES" && value != "1") {
        return absl::InvalidArgumentError(
            "--restart-all restores from the disk only: no --backup-copies (peer backups)");
      }
    }
    // The rounds' job ids, "<job id>.round<K>", must be valid job ids too.
    if (config.job_id.size() > 180) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--restart-all: --job-id '%s' is too long (at most 180 characters: the restart rounds "
          "run as <job id>.round<K>)",
          config.job_id));
    }
  }
  if (config.nnodes_min > 0 || config.standby_host || config.standby_nodes > 0) {
    if (config.nnodes_min == 0) {
      return absl::InvalidArgumentError("--role standby and --standby-nodes need --nnodes");
    }
    if (config.store.empty()) {
      return absl::InvalidArgumentError(
          "--nnodes needs --rdzv-endpoint etcd://HOST:PORT or tcp://HOST:PORT (the agents meet "
          "there)");
    }
    if (config.job_id.empty()) {
      return absl::InvalidArgumentError("--nnodes needs --job-id (the same on every host)");
    }
    if (absl::StartsWith(config.store, "tcp://") && config.token_file.empty()) {
      return absl::InvalidArgumentError(
          "--rdzv-endpoint tcp:// needs --token-file F (the same token on every host)");
    }
    if (config.host_id.empty()) config.host_id = HostName();
    for (char c : config.host_id) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' &&
          c != '.') {
        return absl::InvalidArgumentError(absl::StrFormat(
            "host id '%s': only letters, digits, '-', '_' and '.' (set --host-id)",
            config.host_id));
      }
    }
    if (config.local_addr.empty()) config.local_addr = "127.0.0.1";
  }
  if (config.job_id.empty()) config.job_id = absl::StrCat("job-", getpid());
  if (config.run_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");  // NOLINT(concurrency-mt-unsafe): before any thread
    config.run_dir =
        absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/trainguard/", config.job_id);
  }
  return config;
}

std::vector<std::string> ChooseStandbys(const std::vector<std::string>& parked,
                                        const std::set<std::string>& dead_hosts,
                                        const std::string& dead_host, size_t needed,
                                        const std::set<std::string>& unsafe_hosts) {
  std::map<std::string, std::vector<std::pair<int, std::string>>> by_host;
  for (const std::string& member : parked) {
    // A parked member whose id is not a standby's of ours is preferred nowhere.
    const absl::StatusOr<store_keys::MemberId> id = store_keys::DecodeMemberId(member);
    if (!id.ok() || id->role != store_keys::MemberId::Role::kStandby) continue;
    if (dead_hosts.count(id->host) != 0) continue;
    by_host[id->host].push_back({id->index, member});
  }
  const std::vector<std::pair<int, std::string>>* best = nullptr;
  if (needed == 1) {
    // One rank: a spare process on its own host, else one on a host sharing no backups with it.
    if (by_host.count(dead_host) != 0) {
      best = &by_host[dead_host];
    } else if (!unsafe_hosts.empty()) {
      for (const auto& [host, standbys] : by_host) {
        if (unsafe_hosts.count(host) != 0) continue;
        if (best == nullptr || standbys.size() < best->size()) best = &standbys;
      }
    }
  } else {
    // A host's ranks: the standby host with the most parked standbys, one sharing no backups with
    // them first.
    for (const bool safe_only : {true, false}) {
      for (const auto& [host, standbys] : by_host) {
        if (safe_only && unsafe_hosts.count(host) != 0) continue;
        if (standbys.size() >= needed && (best == nullptr || standbys.size() > best->size())) {
          best = &standbys;
        }
      }
      if (best != nullptr) break;
    }
  }
  std::vector<std::string> preferred;
  if (best != nullptr) {
    std::vector<std::pair<int, std::string>> sorted = *best;
    std::sort(sorted.begin(), sorted.end());
    for (const auto& [index, member] : sorted) preferred.push_back(member);
  }
  return preferred;
}

int RunJob(const LaunchConfig& config) {
  // Before any thread: the ranks inherit these, and DescribeBackups reads them.
  for (const auto& [name, value] : config.backup_env) setenv(name.c_str(), value.c_str(), 1);
  // Multi-host --restart-all: no peer backups, so that a restart restores from the disk only.
  if (config.restart_all >= 0 && config.nnodes_min > 0) {
    setenv("TRAINGUARD_BACKUP_COPIES", "1", 1);
  }
  Job job(config);
  return job.Run();
}

}  // namespace trainguard::tools
