// The one reader of /proc/<pid>/stat (private to sdk/ and tools/; sdk/core is the bottom layer).
//
// The launcher, the chaos tool, the fail-slow sampler, the launcher watch and the tests' process
// checks all need a few fields of it: the state letter (is the process stopped? a zombie?), the
// parent pid (is it our child?), the CPU time (utime + stime) and the start time (with the pid, it
// names a process for good). Field 2, the command name, is in parentheses and may itself hold
// spaces and parentheses, so the fields are counted from its last ')'.
//
// Thread safety: plain functions.
#ifndef TRAINGUARD_SDK_CORE_PROC_STAT_H_
#define TRAINGUARD_SDK_CORE_PROC_STAT_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace trainguard {

struct ProcStat {
  char state = '?';               // field 3: R, S, D, T (stopped), t (traced), Z (zombie), ...
  pid_t ppid = -1;                // field 4
  uint64_t flags = 0;             // field 9: the kernel's PF_* flags of the task
  int64_t utime_ticks = 0;        // field 14, clock ticks (sysconf(_SC_CLK_TCK))
  int64_t stime_ticks = 0;        // field 15
  uint64_t start_time_ticks = 0;  // field 22, clock ticks since boot

  bool stopped() const { return state == 'T' || state == 't'; }
  // An io_uring worker (PF_IO_WORKER: "iou-wrk-*", "iou-sqp-*"): a kernel thread in the process's
  // thread group that runs no user code and takes no signal.
  bool io_worker() const { return (flags & 0x10) != 0; }
  int64_t cpu_ticks() const { return utime_ticks + stime_ticks; }
};

// Parses the text of a stat file. InvalidArgument naming `where` (the file) and the field that
// does not parse.
absl::StatusOr<ProcStat> ParseProcStat(std::string_view text, std::string_view where);

// Reads and parses /proc/<pid>/stat. NotFound when there is no such process (any more).
absl::StatusOr<ProcStat> ReadProcStat(pid_t pid);

// The same for a thread of this process: /proc/self/task/<tid>/stat.
absl::StatusOr<ProcStat> ReadThreadStat(pid_t tid);

// A signal mask of a /proc status file (/proc/<pid>/status, /proc/self/task/<tid>/status):
// `field` is "SigBlk" (blocked), "SigIgn" (ignored) or "SigCgt" (caught by a handler); bit N-1 is
// signal N. NotFound when the file (the process) or the field is missing.
absl::StatusOr<uint64_t> ReadStatusSignalMask(const std::string& status_path,
                                              std::string_view field);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CORE_PROC_STAT_H_
