// `trainguard run`: starts a job's ranks and warm standbys on this machine, hosts its store, and
// replaces a rank that dies with a standby while the other ranks keep their processes.
//
//   trainguard run --nproc N [--standby K] [--max-replacements M] [--store URL --token-file F]
//                  [--job-id ID] [--run-dir DIR] [--rendezvous-timeout SECONDS] -- ./trainer
//                  args...
//
// Multi-host (torchrun's shape): one `trainguard run` per host is that host's agent.
//
//   trainguard run --nnodes MIN[:MAX] --nproc-per-node N --rdzv-endpoint etcd://H:P|tcp://H:P
//                  --job-id ID [--standby-nodes K | --role standby] [--local-addr A] ...
//
// The agents join through the store; the first MAX (at least MIN) hosts to join train, with global
// ranks assigned by host in join order (host g holds ranks g*N .. g*N+N-1), later ones are standby
// hosts. Exactly one agent coordinates at a time, chosen by a lease in the store
// (sdk/rendezvous/coordinator_lease.h); the others take over when its host dies. Every agent
// heartbeats for its host; the coordinator declares a host dead whose heartbeat has not advanced
// for
// --host-timeout, and replaces all its ranks at once by a standby host's, in one generation. With a
// tcp:// endpoint the agent whose --local-addr is the endpoint's host serves the store: that host
// is the job's single point of failure (an etcd cluster is not).
//
// The launcher records what it sees and does in <run_dir>/events/launcher.tgev (custom events;
// attribute what=rank_died, rank_unresponsive, hang_suspect, rank_replaced, recovered,
// generation_renewed, restart_all), beside the ranks' event files, so that `trainguard report`
// can time detection and recovery against the faults `trainguard chaos` injected. With
// --restart-all (one host or several), any fault restarts every rank from the disk instead
// (LaunchConfig::restart_all).
//
// Exit status: 0 every rank finished with status 0; 1 the job failed (a rank failed and could not
// be replaced, --max-replacements was reached, generation 0 did not form, or a rank stopped the job
// because it cannot go on: store key job/stop); 2 bad usage; 3 the launcher could not start the job
// (store, run dir, a command that cannot be executed); 128+N interrupted by signal N (the ranks got
// SIGTERM first).
//
// Each rank (and standby) runs in its own process group, which the launcher signals as a whole, so
// that the processes a wrapper command (`sh -c 'trainer; true'`, a run.sh) starts go with it. The
// rank's direct child gets SIGKILL when the launcher dies (PR_SET_PDEATHSIG); deeper descendants
// are reached by the Runtime's launcher watch (TRAINGUARD_LAUNCHER_PID, sdk/runtime/
// launcher_watch.h), which also ends a rank whose launcher stays stopped (SIGSTOP) for
// heartbeat_timeout.
#ifndef TRAINGUARD_TOOLS_LAUNCHER_H_
#define TRAINGUARD_TOOLS_LAUNCHER_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/launch/launch_agent.h"
#include "sdk/launch/launch_config.h"

namespace trainguard::tools {

// The agent and its configuration are library code (sdk/launch); the command line parses its
// flags into a LaunchConfig and runs the agent.
using ::trainguard::ChooseStandbys;
using ::trainguard::HostLayout;
using ::trainguard::kExitJobFailed;
using ::trainguard::kExitLaunchError;
using ::trainguard::kExitUsage;
using ::trainguard::LaunchConfig;
using ::trainguard::LayoutOf;

// --host-timeout's default for the store at `store_url`: 10 s for an etcd cluster (etcd://), whose
// leader election stalls every write for about etcd's --election-timeout (1 s by default), longer
// on a loaded machine, and a lapsed lease or a host declared dead costs the job a takeover or a
// whole host's ranks; 3 s for a TcpStore (tcp://, or the launcher's own).
absl::Duration DefaultHostTimeout(std::string_view store_url);

// Parses the arguments after "run". InvalidArgument names the flag.
absl::StatusOr<LaunchConfig> ParseRunArguments(const std::vector<std::string>& args);
std::string RunUsage();

// Runs the job to completion on this host (RunLaunchAgent); returns the exit status above.
int RunJob(const LaunchConfig& config);

}  // namespace trainguard::tools

#endif  // TRAINGUARD_TOOLS_LAUNCHER_H_
