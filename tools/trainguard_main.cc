// The `trainguard` command line.
//
//   trainguard version
//   trainguard ckpt list|inspect|verify|export DIR ... checkpoint shards (tools/ckpt_command.h)
//   trainguard flight-recorder show|dump|remove|diagnose ...  a rank's flight recorder, a hang
//                                                      (tools/flight_recorder_command.h)
//   trainguard shm list|remove [--job J | --unused]    segments left in /dev/shm
//                                                      (tools/shm_command.h)
//   trainguard events [--json] FILE|RUN_DIR...    print event files (a run dir means all its
//   ranks')
//   trainguard run ... -- COMMAND...              a job's ranks and standbys (tools/launcher.h)
//   trainguard chaos ... [-- COMMAND...]          a job under a seeded stream of real faults, and
//                                                 its torchrun-style baseline (chaos_command.h)
//   trainguard report RUN_DIR [--json] [--png F]  ETTR, detection and recovery of a chaos run
//                                                 (tools/chaos_report.h)
//
// Every command and verb prints its usage on stdout and exits 0 for --help or -h (tools/usage.h).
// Exit codes: 0 success; 1 a file could not be read or is corrupt (the message names it and the
// offset); 2 bad usage (the usage goes to stderr).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "tools/chaos_command.h"
#include "tools/chaos_report.h"
#include "tools/ckpt_command.h"
#include "tools/flight_recorder_command.h"
#include "tools/launcher.h"
#include "tools/print_json.h"
#include "tools/shm_command.h"
#include "tools/usage.h"
#include "trainguard/sdk.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitDataError = 1;
constexpr int kExitUsage = 2;

using trainguard::tools::AsksForHelp;

constexpr char kUsage[] =
    "usage: trainguard version\n"
    "       trainguard events [--json] FILE|RUN_DIR...\n"
    "       trainguard run --nproc N [--standby K] ... -- COMMAND...\n"
    "       trainguard chaos [--duration 10m] [--mean-interval 20s] [--seed S] ... [-- COMMAND...]\n"
    "       trainguard report RUN_DIR [--json] [--png FILE]\n"
    "       trainguard ckpt list|inspect|verify DIR [--step S] [--json]\n"
    "       trainguard ckpt export DIR [--step S] [--rank R] --out FILE\n"
    "       trainguard flight-recorder show|dump|remove|diagnose ...\n"
    "       trainguard shm list|remove [--job J | --unused]\n";

constexpr char kHelp[] =
    "\n"
    "  version          print the version of trainguard\n"
    "  events           print the events ranks wrote (a run dir: every rank's)\n"
    "  run              start a job's ranks and warm standbys; replace ranks that die\n"
    "  chaos            run a job under seeded real faults, and its restart-all baseline\n"
    "  report           ETTR, detection latency and recovery of a chaos run\n"
    "  ckpt             list, inspect, verify and export persisted checkpoint shards\n"
    "  flight-recorder  read a rank's flight recorder; diagnose a hang\n"
    "  shm              list and remove the shared-memory segments runs left in /dev/shm\n"
    "`trainguard COMMAND --help` describes one command.\n"
    "\n"
    "Exit status: 0 success, 1 a file could not be read or is corrupt, 2 bad usage\n"
    "(`trainguard run` has its own; see `trainguard run --help`).\n";

constexpr char kVersionUsage[] = "usage: trainguard version\n";
constexpr char kVersionHelp[] = "\nPrints the version of trainguard (the library it runs with).\n";

constexpr char kEventsUsage[] = "usage: trainguard events [--json] FILE|RUN_DIR...\n";
constexpr char kEventsHelp[] =
    "\n"
    "Prints the events in event files (*.tgev); a run directory stands for all its ranks' files\n"
    "(RUN_DIR/events), in rank order. --json prints one JSON object per event and line.\n"
    "\n"
    "Exit status: 0 success, 1 a file could not be read or is corrupt, 2 bad usage.\n";

// After RunUsage() (tools/launcher.cc, which lists the flags).
constexpr char kRunHelp[] =
    "\n"
    "Starts N ranks and K warm standbys of COMMAND on this machine, hosts the job's store (or\n"
    "uses --store), and replaces a rank that dies or stops heartbeating with a standby while\n"
    "the other ranks keep their processes. Output is echoed with a [rank N] prefix and kept in\n"
    "the run dir (default: $TMPDIR/trainguard/JOB_ID).\n"
    "\n"
    "With --nnodes, this is one host's agent of a job that spans hosts (run one per host, the\n"
    "same flags): the agents meet at --rdzv-endpoint, get global ranks by host in join order\n"
    "(later hosts and --role standby hosts hold standbys), elect a coordinator through the store\n"
    "(it survives its host), and a host silent for --host-timeout is replaced, all its ranks at\n"
    "once, by a standby host's. docs/GUIDE.md section 8.\n"
    "\n"
    "Fail-slow hosts (multi-host): every agent samples its host once a second; the coordinator\n"
    "names a host that stays apart from its peers for --fail-slow-continuity seconds (30) in a\n"
    "suspect_host event, and with --fail-slow evict|evict-repeated replaces it with a standby\n"
    "host. docs/GUIDE.md, \"Fail-slow hosts\".\n"
    "\n"
    "--restart-all M: recovery the way torchrun does it (the baseline of trainguard chaos): on\n"
    "any fault every rank is stopped and started again as a new process that restores the\n"
    "newest checkpoint on disk; the (M+1)-th fault fails the job. No standbys. On one host\n"
    "with the launcher's own store; with --nnodes give every agent the flag: the coordinator\n"
    "publishes a restart round, every agent kills its ranks and starts them again under the\n"
    "round's job id (JOB_ID.roundK), and a dead host's group rank goes to a standby host\n"
    "(which runs no process until then). docs/GUIDE.md section 12.\n"
    "\n"
    "Exit status: 0 every rank finished with 0; 1 the job failed; 2 bad usage; 3 the job could\n"
    "not be started (store, run dir, spawn); 128+N interrupted by signal N.\n";

// A usage error: what was wrong, then the usage, on stderr.
int UsageError(const std::string& what, const std::string& usage) {
  std::fprintf(stderr, "trainguard: %s\n%s", what.c_str(), usage.c_str());
  return kExitUsage;
}

int Help(const std::string& text) {
  std::printf("%s", text.c_str());
  return kExitOk;
}

std::string EventToText(const sdk::Event& e) {
  std::vector<std::string> attributes;
  for (const auto& [k, v] : e.attributes) attributes.push_back(absl::StrCat(k, "=", v));
  return absl::StrFormat("%s rank %d gen %d step %d %-17s %s%s%s",
                         absl::FormatTime("%Y-%m-%d %H:%M:%E3S", e.time, absl::UTCTimeZone()),
                         e.rank, e.generation, e.step, sdk::EventTypeName(e.type), e.message,
                         attributes.empty() ? "" : "  ", absl::StrJoin(attributes, " "));
}

// A run dir expands to its events/*.tgev files, sorted by rank.
std::vector<std::string> ExpandPaths(const std::vector<std::string>& args) {
  sdk::Env* env = sdk::Env::Default();
  std::vector<std::string> paths;
  for (const std::string& arg : args) {
    absl::StatusOr<std::vector<std::string>> children = env->GetChildren(arg + "/events");
    if (!children.ok()) {
      paths.push_back(arg);
      continue;
    }
    std::sort(children->begin(), children->end());
    for (const std::string& name : *children) {
      if (name.size() > 5 && name.substr(name.size() - 5) == ".tgev")
        paths.push_back(arg + "/events/" + name);
    }
  }
  return paths;
}

int Events(const std::vector<std::string>& args) {
  if (AsksForHelp(args)) return Help(absl::StrCat(kEventsUsage, kEventsHelp));
  bool json = false;
  std::vector<std::string> inputs;
  for (const std::string& a : args) {
    if (a == "--json") {
      json = true;
    } else if (!a.empty() && a[0] == '-') {
      return UsageError("events: unknown flag " + a, kEventsUsage);
    } else {
      inputs.push_back(a);
    }
  }
  if (inputs.empty()) return UsageError("events: no FILE or RUN_DIR", kEventsUsage);
  int rc = kExitOk;
  for (const std::string& path : ExpandPaths(inputs)) {
    absl::StatusOr<sdk::EventLogContents> contents = sdk::ReadEventLog(sdk::Env::Default(), path);
    if (!contents.ok()) {
      std::fprintf(stderr, "trainguard events: %s\n", contents.status().ToString().c_str());
      rc = kExitDataError;
      continue;
    }
    for (const sdk::Event& e : contents->events) {
      if (!json) {
        std::printf("%s\n", EventToText(e).c_str());
        continue;
      }
      if (!trainguard::tools::PrintJson(sdk::EventToJson(e), "events")) rc = kExitDataError;
    }
    if (!contents->tail.ok()) {
      std::fprintf(stderr, "trainguard events: %s\n", contents->tail.ToString().c_str());
      rc = kExitDataError;
    }
  }
  return rc;
}

int Run(const std::vector<std::string>& args) {
  namespace tools = trainguard::tools;
  if (AsksForHelp(args)) return Help(tools::RunUsage() + kRunHelp);
  absl::StatusOr<tools::LaunchConfig> config = tools::ParseRunArguments(args);
  if (!config.ok()) {
    std::fprintf(stderr, "trainguard run: %s\n%s", std::string(config.status().message()).c_str(),
                 tools::RunUsage().c_str());
    return tools::kExitUsage;
  }
  return tools::RunJob(*config);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return UsageError("no command", kUsage);
  const std::string verb = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (verb == "--help" || verb == "-h") return Help(absl::StrCat(kUsage, kHelp));
  if (verb == "version") {
    if (AsksForHelp(args)) return Help(absl::StrCat(kVersionUsage, kVersionHelp));
    if (!args.empty()) return UsageError("version takes no arguments", kVersionUsage);
    std::printf("trainguard %s\n", sdk::VersionString());
    return kExitOk;
  }
  if (verb == "events") return Events(args);
  if (verb == "ckpt") return trainguard::tools::RunCkptCommand(args);
  if (verb == "flight-recorder") return trainguard::tools::RunFlightRecorderCommand(args);
  if (verb == "shm") return trainguard::tools::RunShmCommand(args);
  if (verb == "run") return Run(args);
  if (verb == "chaos") return trainguard::tools::RunChaosCommand(args);
  if (verb == "report") return trainguard::tools::RunReportCommand(args);
  return UsageError("unknown command " + verb, kUsage);
}
