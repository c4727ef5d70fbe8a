#include "sdk/launch/launch_config.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/store_keys.h"

namespace trainguard {

std::string MachineName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

HostLayout LayoutOf(const LaunchConfig& config, const std::string& host_name) {
  HostLayout layout;
  if (config.nnodes_min == 0) {  // one host
    layout.host_label = host_name;
    layout.events_file = absl::StrCat(config.run_dir, "/events/launcher.tgev");
    layout.pid_dir = absl::StrCat(config.run_dir, "/pids");
    layout.log_dir = absl::StrCat(config.run_dir, "/logs");
    layout.standby_wait = config.rendezvous_timeout;
    layout.restart_scope = "every rank";
    layout.clears_stale_job_keys = !config.store.empty();
    layout.start_line = absl::StrFormat("job %s: %d ranks, %d standbys", config.job_id,
                                        config.nproc, config.standby);
    return layout;
  }
  layout.several_hosts = true;
  layout.host_label = config.host_id;
  layout.events_file = absl::StrCat(config.run_dir, "/events/launcher-", config.host_id, ".tgev");
  layout.pid_dir = absl::StrCat(config.run_dir, "/pids/", config.host_id);
  layout.log_dir = absl::StrCat(config.run_dir, "/logs/", config.host_id);
  layout.source_address = config.local_addr;
  layout.on_host = config.host_id;
  layout.host_addr = config.local_addr;
  std::vector<std::string> endpoint =
      absl::StrSplit(absl::StripPrefix(config.store, "tcp://"), absl::MaxSplits(':', 1));
  int port = 0;
  if (absl::StartsWith(config.store, "tcp://") && endpoint.size() == 2 &&
      endpoint[0] == config.local_addr && absl::SimpleAtoi(endpoint[1], &port)) {
    layout.serve_store_port = port;
  }
  layout.standby_wait = 2 * config.host_timeout + absl::Seconds(10);
  const int64_t host_timeout_ms = absl::ToInt64Milliseconds(config.host_timeout);
  if (2 * host_timeout_ms > 10'000)
    layout.superseded_step_exit = absl::Milliseconds(2 * host_timeout_ms);
  layout.restart_scope = "every rank on every host";
  layout.queues_killed_stopped_ranks = true;
  layout.start_line = absl::StrFormat(
      "job %s: host %s (%s) joined as %s; %d ranks per host", config.job_id, config.host_id,
      config.local_addr, config.standby_host ? "a standby host" : "a worker", config.nproc);
  return layout;
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

}  // namespace trainguard
