// Stack capture: the call stack of every thread of this process, taken while they run or block, for
// hang reports (a watchdog thread asks; the training thread is stuck in a collective, a read, a
// condition wait).
//
// Mechanism: the threads are listed from /proc/self/task; each is sent a dedicated real-time signal
// (StackCaptureSignal()) with tgkill(2); its handler, which only does async-signal-safe work,
// records backtrace(3) into a slot prepared for it in advance and publishes it with an atomic
// store. The caller waits for every answer up to a deadline and symbolises the frames outside the
// handler. A thread that still blocks the signal 50 ms after it was sent (one that blocks it only
// for a moment, as glibc does around pthread_create, answers late but in the same capture), or a
// stopped process, does not answer: it is reported as such.
//
// The handler is installed (SA_RESTART) on the first capture and stays installed. SA_RESTART makes
// an interrupted read(2), write(2), wait or lock resume transparently; calls that the kernel never
// restarts after a handler (poll, epoll_wait, nanosleep, ... : see signal(7)) return EINTR, as they
// do for any signal, and the caller's retry loop handles it. The capture fails with
// FailedPrecondition if another component already installed a handler for that signal.
//
// Thread safety: CaptureThreadStacks may be called from any thread (the caller's own stack is
// captured too); concurrent calls are serialised.
#ifndef TRAINGUARD_SDK_WATCHDOG_STACK_TRACE_H_
#define TRAINGUARD_SDK_WATCHDOG_STACK_TRACE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainguard {

struct ThreadStack {
  int tid = 0;
  std::string name;       // /proc/self/task/<tid>/comm
  bool answered = false;  // false: no answer before the deadline (signal blocked, process stopped,
                          // thread gone); `frames` is then empty and `note` says which
  std::string note;
  // Innermost first, starting at the instruction the signal interrupted: "function+0xoff (module)",
  // or "0xaddress (module+0xoffset)" where no symbol is known.
  std::vector<std::string> frames;
};

// One thread's answer to a capture before symbolising: program counters only.
struct RawThreadStack {
  ThreadStack thread;            // tid, name, answered, note; `frames` stays empty
  uintptr_t pc = 0;              // the instruction the signal interrupted, where known (else 0)
  std::vector<void*> addresses;  // backtrace(3) from inside the handler, innermost first
};

// The signal number used to ask threads for their stacks (a real-time signal above SIGRTMIN).
int StackCaptureSignal();

// Every thread of this process, in /proc/self/task order (ascending tid). Waits at most `timeout`
// for the threads' answers. REQUIRES: timeout > 0.
absl::StatusOr<std::vector<ThreadStack>> CaptureThreadStacks(absl::Duration timeout);

// Text for a report: per thread a line `thread <tid> "<name>":` then one `  #<i> <frame>` line per
// frame, or `thread <tid> "<name>": no answer (<note>)`.
std::string FormatThreadStacks(const std::vector<ThreadStack>& stacks);

// Reads FormatThreadStacks's text back (e.g. from a flight recorder dump's "stacks" evidence). A
// line that is neither a thread header nor a frame is an InvalidArgument naming its number.
absl::StatusOr<std::vector<ThreadStack>> ParseThreadStacks(std::string_view text);

// CaptureThreadStacks in two parts. The capture itself reads no file and takes milliseconds; the
// symbolising reads the modules' symbol tables and can take hundreds of milliseconds in a process
// with large libraries (libtorch). A hang is declared between the two, so that the stacks show
// every thread as it was when the hang was declared and the declaration is not delayed by the
// symbol lookups. CaptureThreadStacks(t) is SymbolizeThreadStacks(*CaptureRawThreadStacks(t)).
// A frame is looked up once per process: later captures (the same waits, hang after hang) take its
// text from a cache, valid while its module stays mapped at the same base.
absl::StatusOr<std::vector<RawThreadStack>> CaptureRawThreadStacks(absl::Duration timeout);
std::vector<ThreadStack> SymbolizeThreadStacks(const std::vector<RawThreadStack>& raw);

// CaptureThreadStacks formatted by FormatThreadStacks.
absl::StatusOr<std::string> CaptureAllThreadStacks(absl::Duration timeout);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_WATCHDOG_STACK_TRACE_H_
