// The `trainguard` command line.
//
//   trainguard version
//   trainguard ckpt list|inspect|verify DIR [--json]   checkpoint shards (tools/ckpt_command.h)
//   trainguard flight-recorder show|dump|remove|diagnose ...  a rank's flight recorder, a hang
//                                                      (tools/flight_recorder_command.h)
//   trainguard events [--json] FILE|RUN_DIR...    print event files (a run dir means all its
//   ranks')
//
// Exit codes: 0 success; 1 a file could not be read or is corrupt (the message names it and the
// offset); 2 bad usage.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "tools/ckpt_command.h"
#include "tools/flight_recorder_command.h"
#include "tools/launcher.h"
#include "tools/print_json.h"
#include "trainguard/sdk.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitDataError = 1;
constexpr int kExitUsage = 2;

int Usage() {
  std::fprintf(stderr,
               "usage: trainguard version\n"
               "       trainguard events [--json] FILE|RUN_DIR...\n"
               "       trainguard run --nproc N [--standby K] ... -- COMMAND...\n"
               "       trainguard ckpt list|inspect|verify DIR [--step S] [--json]\n"
               "       trainguard flight-recorder show|dump|remove|diagnose ... (flight-recorder --help)\n");
  return kExitUsage;
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
  bool json = false;
  std::vector<std::string> inputs;
  for (const std::string& a : args) {
    if (a == "--json") {
      json = true;
    } else if (!a.empty() && a[0] == '-') {
      return Usage();
    } else {
      inputs.push_back(a);
    }
  }
  if (inputs.empty()) return Usage();
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage();
  const std::string verb = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (verb == "version") {
    std::printf("trainguard %s\n", sdk::VersionString());
    return kExitOk;
  }
  if (verb == "events") return Events(args);
  if (verb == "ckpt") return trainguard::tools::RunCkptCommand(args);
  if (verb == "flight-recorder") return trainguard::tools::RunFlightRecorderCommand(args);
  if (verb == "run") {
    absl::StatusOr<trainguard::tools::LaunchConfig> config =
        trainguard::tools::ParseRunArguments(args);
    if (!config.ok()) {
      std::fprintf(stderr, "trainguard run: %s\n%s", std::string(config.status().message()).c_str(),
                   trainguard::tools::RunUsage().c_str());
      return trainguard::tools::kExitUsage;
    }
    return trainguard::tools::RunJob(*config);
  }
  return Usage();
}
