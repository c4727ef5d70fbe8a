// RunLaunchAgent: the agent `trainguard run` runs on each host, carrying out a LaunchConfig
// (launch_config.h) until the job ends. It is one host's agent and, while it holds the lease (one
// host: always), the job's coordinator, in one process: it owns this host's processes (the ranks
// and warm standbys, through a PosixProcessSupervisor), serves or joins the job's store, and wires
// the library's parts together, each of which decides on its own and is tested without processes:
// HostAgent and HostMembership (sdk/host_agent), JobCoordinator, the recovery strategy
// (StandbyReplacement or RestartAll), RankWatch, HangCoordinator, FailSlowCoordinator, the lease
// and the plan (sdk/coordinator), ReplacementPolicy and RenewalPolicy (sdk/agent). docs/
// ARCHITECTURE.md draws who calls whom.
//
// What the agent prints, records (<run dir>/events/launcher*.tgev) and exits with is described at
// the top of tools/launcher.h, the command line that parses its flags.
//
// Thread safety: RunLaunchAgent blocks the calling thread until the job ends; it blocks SIGCHLD,
// SIGINT and SIGTERM in that thread (every thread it starts inherits the mask) and reads them
// itself. One per process.
#ifndef TRAINGUARD_SDK_LAUNCH_LAUNCH_AGENT_H_
#define TRAINGUARD_SDK_LAUNCH_LAUNCH_AGENT_H_

#include "sdk/launch/launch_config.h"

namespace trainguard {

// Runs the job of `config` on this host to completion; returns its exit status (kExitJobFailed,
// kExitLaunchError, 128 + a signal's number, or 0: every rank finished with status 0). Sets the
// backup variables of `config.backup_env` in this process's environment first (the ranks inherit
// them).
int RunLaunchAgent(const LaunchConfig& config);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_LAUNCH_LAUNCH_AGENT_H_
