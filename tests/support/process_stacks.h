// DescribeOwnProcesses: what each process of a multi-process test is doing, for the failure message
// of a test that waited in vain (a job that never ended). A rank blocked in a collective, in a
// store wait or in a rendezvous looks the same from its output, which stops; its threads' stacks
// say which. For every process whose /proc/<pid>/environ holds `environment_entry` (the launcher
// gives its ranks and standbys TRAINGUARD_RUN_DIR=<run dir>): its pid, name, state letter (T:
// stopped), the kernel function it sleeps in (wchan), its role and rank from its environment, and
// every thread's stack as gdb prints it (`gdb -p PID -batch`, each bounded by `timeout 30`), or
// why there is none (no gdb on the machine, no right to ptrace). Works whatever the process's
// own state: a rank whose watchdog is off, or that is stopped, dumps nothing by itself.
//
// For diagnosis only: never assert on its text. Header-only (no gtest). Thread-safe: reads /proc
// and runs gdb in a child; keeps no state.
#ifndef TRAINGUARD_TESTS_SUPPORT_PROCESS_STACKS_H_
#define TRAINGUARD_TESTS_SUPPORT_PROCESS_STACKS_H_

#include <stdio.h>
#include <sys/types.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "sdk/core/proc_stat.h"
#include "tests/support/own_process.h"

namespace trainguard::testing {

namespace process_stacks_internal {

inline std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The variables of `pid`'s environment that say what it is in a job.
inline std::string Role(pid_t pid) {
  std::vector<std::string> said;
  const std::string environ_text = ReadSmallFile(absl::StrCat("/proc/", pid, "/environ"));
  for (absl::string_view e : absl::StrSplit(environ_text, '\0')) {
    if (absl::StartsWith(e, "TRAINGUARD_ROLE=") || absl::StartsWith(e, "TRAINGUARD_RANK=")) {
      said.emplace_back(e);
    }
  }
  std::sort(said.begin(), said.end());
  return absl::StrJoin(said, " ");
}

}  // namespace process_stacks_internal

// What `command`, run by /bin/sh, writes to its stdout (redirect its stderr into it to have both).
// REQUIRES: `command` is built from paths, pids and fixed words, not from untrusted text.
inline std::string CommandOutput(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "(popen failed)\n";
  std::string out;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) out.append(buffer, n);
  pclose(pipe);
  return out;
}

// The pids of the processes whose environment holds `environment_entry`, ascending.
inline std::vector<pid_t> ProcessesWithEnvironmentEntry(absl::string_view environment_entry) {
  std::vector<pid_t> pids;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid) || pid <= 0) continue;
    if (own_process_internal::EnvironmentHolds(pid, environment_entry)) pids.push_back(pid);
  }
  std::sort(pids.begin(), pids.end());
  return pids;
}

// See the file comment.
inline std::string DescribeOwnProcesses(absl::string_view environment_entry) {
  using process_stacks_internal::ReadSmallFile;
  const std::vector<pid_t> pids = ProcessesWithEnvironmentEntry(environment_entry);
  std::string out = absl::StrCat("==== ", pids.size(), " process(es) with ", environment_entry,
                                 " in their environment\n");
  const bool has_gdb = !CommandOutput("command -v gdb 2>/dev/null").empty();
  if (!has_gdb) absl::StrAppend(&out, "(no gdb on this machine: no stacks)\n");
  for (pid_t pid : pids) {
    absl::StatusOr<ProcStat> stat = ReadProcStat(pid);
    const std::string comm(
        absl::StripTrailingAsciiWhitespace(ReadSmallFile(absl::StrCat("/proc/", pid, "/comm"))));
    const std::string wchan = ReadSmallFile(absl::StrCat("/proc/", pid, "/wchan"));
    absl::StrAppend(&out, "=== pid ", pid, " (", comm, ") state ",
                    stat.ok() ? std::string(1, stat->state) : std::string("?"), " wchan ",
                    wchan.empty() ? "-" : wchan, " ", process_stacks_internal::Role(pid), "\n");
    if (!has_gdb) continue;
    // Only the frames and the thread headers: gdb's chatter about symbols is not the story.
    const std::string stacks = CommandOutput(
        absl::StrCat("timeout 30 gdb -p ", pid,
                     " -batch -nx -ex 'set pagination off' -ex 'thread apply all bt 30' 2>&1"));
    bool any = false;
    for (absl::string_view line : absl::StrSplit(stacks, '\n')) {
      if (absl::StartsWith(line, "#") || absl::StartsWith(line, "Thread ")) {
        absl::StrAppend(&out, line, "\n");
        any = true;
      }
    }
    if (!any) absl::StrAppend(&out, "(gdb gave no stack: ", stacks.substr(0, 300), ")\n");
  }
  return out;
}

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_PROCESS_STACKS_H_
