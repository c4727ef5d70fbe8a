// `trainguard run`'s flags (launcher.h): parsed into a LaunchConfig, which the agent in
// sdk/launch (RunLaunchAgent) carries out.
#include "tools/launcher.h"

#include <unistd.h>

#include <string>
#include <string_view>
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
#include "sdk/checkpoint/backup_placement.h"
#include "sdk/launch/launch_agent.h"
#include "sdk/launch/launch_config.h"

namespace trainguard::tools {
namespace {

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
    if (config.host_id.empty()) config.host_id = MachineName();
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

int RunJob(const LaunchConfig& config) { return RunLaunchAgent(config); }

}  // namespace trainguard::tools
