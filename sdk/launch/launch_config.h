// LaunchConfig: what `trainguard run` is asked to do on this host (tools/launcher.cc parses its
// flags into one), and what follows from it without being behaviour: the exit statuses, the host's
// layout (HostLayout: where the agent keeps its files, how it names itself), and the choice of the
// standbys a dead host's ranks go to. The agent that carries it out is launch_agent.h.
//
// Thread safety: plain values and pure functions.
#ifndef TRAINGUARD_SDK_LAUNCH_LAUNCH_CONFIG_H_
#define TRAINGUARD_SDK_LAUNCH_LAUNCH_CONFIG_H_

#include <cstddef>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "sdk/agent/fail_slow_policy.h"

namespace trainguard {

struct LaunchConfig {
  int nproc = 0;
  int standby = 0;
  // Ranks replaced over the job's life; also how many times a standby that dies while parked is
  // started again. Reaching it ends the job with the dead rank's history as the reason.
  int max_replacements = 10;
  // A rank (or standby) that dies again within 60 s of taking over is in a crash loop: from its
  // second such death on, its replacement waits restart_backoff, doubling with each further one, up
  // to 30 s (sdk/agent/replacement_policy.h).
  absl::Duration restart_backoff = absl::Seconds(1);
  // Empty: host a TcpStore on 127.0.0.1 with a fresh token. Otherwise an existing store's URL.
  std::string store;
  std::string token_file;  // with an external tcp:// store
  std::string job_id;      // default: "job-<launcher pid>"
  std::string run_dir;     // default: $TMPDIR/trainguard/<job_id>
  absl::Duration rendezvous_timeout = absl::Seconds(300);
  // A rank whose rendezvous heartbeat has not advanced for this long (its process is stopped or
  // hung) is killed with SIGKILL and replaced like a rank that died.
  absl::Duration heartbeat_timeout = absl::Seconds(30);
  // How long ranks get between SIGTERM and SIGKILL when the job is stopped.
  absl::Duration stop_grace = absl::Seconds(10);
  std::vector<std::string> command;

  // Multi-host (see above); nnodes_min == 0 is the single-host launcher.
  int nnodes_min = 0;
  int nnodes_max = 0;
  int standby_nodes = 0;      // the job forms once nnodes_min + standby_nodes hosts joined
  bool standby_host = false;  // --role standby: this host only ever holds standbys
  std::string local_addr;     // this host's address; default 127.0.0.1
  std::string host_id;        // default: the host name
  // A host whose agent heartbeat has not advanced for this long is dead; also the coordinator
  // lease's expiry. The agents beat every host_timeout / 12. Without --host-timeout,
  // DefaultHostTimeout(store).
  absl::Duration host_timeout = absl::Seconds(3);
  // A dead host's ranks may be taken by standbys of several hosts when no standby host has enough.
  bool spread_standbys = false;
  // With nnodes_min < nnodes_max: how long the job waits for more workers once nnodes_min joined.
  absl::Duration rdzv_last_call = absl::Seconds(5);
  // Peer backups of the ranks' snapshots (--backup-copies, --backup-evict, --backup-racks,
  // --backup-rate, --backup-budget): shorthands for the TRAINGUARD_BACKUP_* variables every rank
  // reads (include/trainguard/options.h), set in the launcher's environment before the ranks
  // start. The coordinator prints the placement, its proof and its survival odds when the job
  // forms, and says when the job is protected (again).
  std::vector<std::pair<std::string, std::string>> backup_env;

  // Fail-slow hosts (multi-host only; docs/GUIDE.md, "Fail-slow hosts"). Every agent samples its
  // host once a second; the coordinator runs the detector (sdk/coordinator/fail_slow_coordinator.h)
  // and, for a host it confirms, writes a suspect_host event and then, by policy: kAlert nothing
  // more; kEvict replaces the host with a standby host at the first confirmation; kEvictRepeated at
  // the second continuity window in a row. kOff: no sampling, no detection.
  using FailSlowPolicy = ::trainguard::FailSlowPolicy;  // sdk/agent/fail_slow_policy.h
  FailSlowPolicy fail_slow = FailSlowPolicy::kAlert;
  // At most max(1, floor(share x training hosts)) hosts are evicted on metrics alone over the
  // job's life (0: none); past it, and without a standby host to take over, a confirmation only
  // alerts.
  double fail_slow_max_evict_share = 0.1;
  int fail_slow_continuity_s = 30;  // FailSlowOptions::continuity
  int fail_slow_window_s = 9;       // FailSlowOptions::denoise_window (odd)
  // --fail-slow-trace FILE: the coordinator appends every host's record of every second to FILE,
  // "<second> <host> <record>" per line (bench/bench_fail_slow replays such traces).
  std::string fail_slow_trace;
  // --restart-all M (-1: off): recovery the way torchrun does it, the baseline `trainguard chaos`
  // and bench_chaos_hosts measure against. On any fault (a rank's death; a hang's suspect and a
  // rank with a stale heartbeat are killed first; a rank's request for a new generation) every
  // process of the job is stopped, the ranks' shared memory is removed, and all ranks start again
  // as fresh processes that restore the newest checkpoint on disk. The job fails at the (M+1)-th
  // such fault. No standbys: --standby must be 0.
  // One host (the launcher's own store) and several (--nnodes; give every agent the flag) alike
  // (sdk/coordinator/restart_all.h): the coordinator publishes a restart round (store key
  // agents/restart, "<round> <why>"); every agent SIGKILLs its processes, removes the
  // snapshot arenas, flight recorders and peer-backup segments they held, and starts its ranks
  // again under the round's own job id "<job id>.round<K>" (a fresh namespace of store keys and
  // shared memory; generation 0 forms anew in it). A host fault (a host declared dead) restarts
  // the job too, its group rank given to a standby host in the round's plan, as torchrun's spare
  // node joins the re-rendezvous; standby hosts hold no processes. Peer backups are off
  // (TRAINGUARD_BACKUP_COPIES=1): nothing of the old processes' memory can serve a restore.
  int restart_all = -1;
};

inline constexpr int kExitJobFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitLaunchError = 3;

// This machine's name (gethostname), "localhost" when it has none: one host's label and a
// multi-host agent's default --host-id.
std::string MachineName();

// The parked standbys (member ids "<host>:<pid>[:round<K>]:standby<N>") that the coordinator gives
// a dead host's ranks, or one dead rank, first; empty: any parked standby. `unsafe_hosts`: the
// hosts that run a rank holding the dead ranks' backups or whose backups they hold (a host lost
// would take a snapshot and its only backup together). For `needed` > 1 ranks, those of the host
// with the most parked standbys (at least `needed`), one outside `unsafe_hosts` first, in
// standby-index order, so local rank i stays local rank i. For one rank: a spare process on its own
// host `dead_host`; else, when `unsafe_hosts` is not empty, those of the host outside it with the
// fewest parked standbys (keeping fuller standby hosts whole for host faults). Hosts in
// `dead_hosts` are never chosen, nor a parked member whose id is not a standby's
// (store_keys::DecodeMemberId).
std::vector<std::string> ChooseStandbys(const std::vector<std::string>& parked,
                                        const std::set<std::string>& dead_hosts,
                                        const std::string& dead_host, size_t needed,
                                        const std::set<std::string>& unsafe_hosts);

// What differs between one host's launcher and one of several hosts' agents without being
// behaviour: where this agent keeps its files, how it names itself, its processes and its store
// connections. Worked out once at start (LayoutOf) so that the launcher's behaviour reads the same
// code for both.
struct HostLayout {
  // Whether other hosts' agents are in the job (--nnodes). Read by the wiring only, once: the
  // coordinator acts under the job's lease (another agent's takes over), this host is in the job
  // through the store (StoreHostMembership, else OneHostMembership), and the hang coordinator finds
  // and kills a suspect through its agent rather than among this process's children.
  bool several_hosts = false;
  // This host in member ids and agents/stopped/: --host-id; one host: the machine's name.
  std::string host_label;
  // The launcher's event file: <run dir>/events/launcher-<host>.tgev; one host: launcher.tgev.
  std::string events_file;
  // Where the pid files of this host's ranks go: <run dir>/pids/<host> (several hosts may share
  // the run dir, and a pid means something only on its own host); one host: <run dir>/pids.
  std::string pid_dir;
  // Where the logs of this host's ranks and standbys go: <run dir>/logs/<host>; one host:
  // <run dir>/logs.
  std::string log_dir;
  // The address every store connection of this agent leaves from (--local-addr), so that a
  // partition between hosts (by address) cuts this agent off too; empty: any (one host).
  std::string source_address;
  // The events' on_host attribute (a pid names a process only with its host); empty: none (one
  // host).
  std::string on_host;
  // TRAINGUARD_HOST_ADDR for the ranks (where their peers reach this host); empty: not set (one
  // host: every peer is local).
  std::string host_addr;
  // The port of the job's tcp:// store this agent serves: torchrun's c10d rule, the agent on the
  // endpoint's host (--local-addr) serves it; 0: none (one host runs a store of its own, or uses
  // the external one it is given).
  int serve_store_port = 0;
  // How long a queued replacement waits for a standby still starting (JobCoordinatorOptions::
  // standby_wait): one host, as long as generation 0 may take to form (--rendezvous-timeout);
  // several, for a standby host's agent to join, start and park its standbys.
  absl::Duration standby_wait;
  // TRAINGUARD_SUPERSEDED_STEP_EXIT_MS for the ranks unless the user set it: a step stuck after its
  // generation was superseded must outlast the time a stopped peer takes to be killed
  // (--host-timeout), so twice --host-timeout where that is more than the runtime's 10 s default;
  // zero: the default.
  absl::Duration superseded_step_exit;
  // What --restart-all restarts, in its lines: "every rank" or "every rank on every host".
  std::string restart_scope;
  // Whether this agent clears the launcher's keys an earlier run of the job id left in the store it
  // was given (job/stop, job/persist_failed/...): one host with an external store, which starts the
  // job afresh; never an agent of several hosts, which may join a job whose others run already.
  bool clears_stale_job_keys = false;
  // The first line the launcher says, before ", store <url>, run dir <dir>": "job <id>: N ranks, K
  // standbys"; several hosts: "job <id>: host <id> (<address>) joined as a worker|a standby host;
  // N ranks per host".
  std::string start_line;
  // Whether the coordinator queues a rank it kills because its agent reports it stopped for
  // replacement at once (several hosts: its death would reach the coordinator only through its
  // agent's report in the store, an agent turn and a coordinator turn later, and SIGKILL ends a
  // stopped process without it running again); one host: never, the kill's exit reaches the
  // coordinator in this process at once, and queueing it too would replace the rank twice.
  bool queues_killed_stopped_ranks = false;
};

// The layout of `config`'s agent on the machine named `host_name` (gethostname).
HostLayout LayoutOf(const LaunchConfig& config, const std::string& host_name);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_LAUNCH_LAUNCH_CONFIG_H_
