// `trainguard run`: starts a job's ranks and warm standbys on this machine, hosts its store, and
// replaces a rank that dies with a standby while the other ranks keep their processes.
//
//   trainguard run --nproc N [--standby K] [--max-replacements M] [--store URL --token-file F]
//                  [--job-id ID] [--run-dir DIR] [--rendezvous-timeout SECONDS] -- ./trainer
//                  args...
//
// Exit status: 0 every rank finished with status 0; 1 the job failed (a rank failed and could not
// be replaced, a rank was replaced more than M times, or generation 0 did not form); 2 bad usage;
// 3 the launcher could not start the job (store, run dir, spawn); 128+N interrupted by signal N
// (the ranks got SIGTERM first).
#ifndef TRAINGUARD_TOOLS_LAUNCHER_H_
#define TRAINGUARD_TOOLS_LAUNCHER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainguard::tools {

struct LaunchConfig {
  int nproc = 0;
  int standby = 0;
  // Replacements allowed over the job's life; -1: as many as standbys can be spawned.
  int max_replacements = -1;
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
};

inline constexpr int kExitJobFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitLaunchError = 3;

// Parses the arguments after "run". InvalidArgument names the flag.
absl::StatusOr<LaunchConfig> ParseRunArguments(const std::vector<std::string>& args);
std::string RunUsage();

// Runs the job to completion; returns the exit status above.
int RunJob(const LaunchConfig& config);

}  // namespace trainguard::tools

#endif  // TRAINGUARD_TOOLS_LAUNCHER_H_
