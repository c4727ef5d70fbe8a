// Stack capture by signal (sdk/watchdog/stack_trace.h).
//
// The handler's slots live in static storage and are never freed, so a handler that runs late (a
// thread that unblocks the signal after the deadline) writes into memory that still exists. Each
// slot's state word carries the capture's generation next to the state, and a handler claims a
// slot only with a compare-and-swap from "pending" of that exact word, so a late handler cannot
// claim a slot that has since been handed to another capture by mistake; if it finds its own
// thread's slot pending in a newer capture, it answers that one, with a stack that is current.
#include "sdk/watchdog/stack_trace.h"

#include <cxxabi.h>
#include <dirent.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/debugging/symbolize.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "sdk/core/mutex.h"
#include "sdk/core/proc_stat.h"

namespace trainguard {
namespace {

constexpr int kMaxThreads = 1024;
constexpr int kMaxFrames = 64;
// After the deadline, how long to wait for a handler that has claimed its slot but not finished
// (it is in backtrace(), which takes microseconds unless the thread is descheduled).
constexpr absl::Duration kFinishGrace = absl::Milliseconds(200);
// How long a thread may block the capture signal before the capture gives up on it.
constexpr absl::Duration kBlockedGrace = absl::Milliseconds(50);

// The low two bits of a slot's word; the rest is the generation of the capture.
enum SlotState : uint64_t { kIdle = 0, kPending = 1, kWriting = 2, kDone = 3 };
constexpr uint64_t kStateMask = 3;

struct StackSlot {
  std::atomic<uint64_t> word{0};
  std::atomic<int> tid{0};
  std::atomic<uintptr_t> pc{0};  // the interrupted instruction, from the signal's context
  int depth = 0;                 // written by the handler before it stores kDone (release)
  void* frames[kMaxFrames];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int>::is_always_lock_free);

StackSlot g_slots[kMaxThreads];
std::atomic<int> g_slots_in_use{0};  // the handler scans g_slots[0, g_slots_in_use)

uintptr_t InterruptedPc(void* context) {
  if (context == nullptr) return 0;
#if defined(__x86_64__)
  return static_cast<uintptr_t>(static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<uintptr_t>(static_cast<ucontext_t*>(context)->uc_mcontext.pc);
#else
  return 0;
#endif
}

// Async-signal-safe: atomics, gettid, and backtrace() (safe once libgcc_s is loaded, which
// InstallHandler makes sure of).
void StackCaptureHandler(int, siginfo_t*, void* context) {
  const int saved_errno = errno;
  const int self = static_cast<int>(syscall(SYS_gettid));
  const int in_use = g_slots_in_use.load(std::memory_order_acquire);
  for (int i = 0; i < in_use; ++i) {
    StackSlot& slot = g_slots[i];
    uint64_t word = slot.word.load(std::memory_order_acquire);
    if ((word & kStateMask) != kPending || slot.tid.load(std::memory_order_relaxed) != self) {
      continue;
    }
    const uint64_t generation = word & ~kStateMask;
    if (!slot.word.compare_exchange_strong(word, generation | kWriting,
                                           std::memory_order_acq_rel)) {
      continue;  // abandoned at the deadline, or reused by a newer capture
    }
    slot.pc.store(InterruptedPc(context), std::memory_order_relaxed);
    slot.depth = backtrace(slot.frames, kMaxFrames);
    slot.word.store(generation | kDone, std::memory_order_release);
    break;
  }
  errno = saved_errno;
}

Mutex& CaptureMutex() {
  static Mutex* mu = new Mutex;  // never destroyed: a capture may run while the process exits
  return *mu;
}

// Installs the handler unless it is there. Checked at every capture: another library may have
// taken the signal since. REQUIRES: CaptureMutex() held.
absl::Status InstallHandler() {
  const int sig = StackCaptureSignal();
  struct sigaction old {};
  if (sigaction(sig, nullptr, &old) != 0) {
    return absl::InternalError(
        absl::StrFormat("stack capture: sigaction(%d): %s", sig, std::strerror(errno)));
  }
  if ((old.sa_flags & SA_SIGINFO) != 0 && old.sa_sigaction == StackCaptureHandler) {
    return absl::OkStatus();
  }
  const bool default_action =
      (old.sa_flags & SA_SIGINFO) == 0 && (old.sa_handler == SIG_DFL || old.sa_handler == SIG_IGN);
  if (!default_action) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "stack capture: signal %d (SIGRTMIN+%d) already has a handler installed by someone else",
        sig, sig - SIGRTMIN));
  }
  // The first backtrace() loads libgcc_s (dlopen, malloc): never inside the handler.
  void* warm_up[4];
  backtrace(warm_up, 4);
  struct sigaction action {};
  action.sa_sigaction = StackCaptureHandler;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  if (sigaction(sig, &action, nullptr) != 0) {
    return absl::InternalError(
        absl::StrFormat("stack capture: sigaction(%d): %s", sig, std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::vector<int> ListThreads() {
  std::vector<int> tids;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return tids;
  while (dirent* entry = readdir(dir)) {
    int tid;
    if (absl::SimpleAtoi(entry->d_name, &tid) && tid > 0) tids.push_back(tid);
  }
  closedir(dir);
  std::sort(tids.begin(), tids.end());
  return tids;
}

std::string ThreadName(int tid) {
  std::ifstream comm(absl::StrFormat("/proc/self/task/%d/comm", tid));
  std::string name;
  std::getline(comm, name);
  return name;
}

// Whether `tid` blocks `sig` now (SigBlk in /proc/self/task/<tid>/status). Such a thread cannot
// answer until it unblocks; waiting for it would only use up the deadline.
bool BlocksSignal(int tid, int sig) {
  absl::StatusOr<uint64_t> mask =
      ReadStatusSignalMask(absl::StrFormat("/proc/self/task/%d/status", tid), "SigBlk");
  return mask.ok() && ((*mask >> (sig - 1)) & 1) != 0;
}

// Where the kernel holds a thread that did not answer: "state D, wchan <function>".
std::string KernelWait(int tid) {
  absl::StatusOr<ProcStat> stat = ReadThreadStat(tid);
  if (!stat.ok()) return "the thread is gone";
  std::ifstream wchan_file(absl::StrFormat("/proc/self/task/%d/wchan", tid));
  std::string wchan;
  std::getline(wchan_file, wchan);
  return absl::StrFormat("state %c, wchan %s", stat->state, wchan.empty() ? "-" : wchan);
}

std::string Demangle(const char* symbol) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(symbol, nullptr, nullptr, &status);
  if (status != 0 || demangled == nullptr) return symbol;
  std::string out = demangled;
  std::free(demangled);
  return out;
}

// The frames already symbolised in this process, kept across captures: a process's hang dumps
// show the same waits again and again (a pool's threads, the training thread in a collective), and
// each absl::Symbolize in a large library (libtorch) scans its symbol table. An entry stays valid
// while the module that held its address is mapped at the same base, which every use checks with
// dladdr (a walk of the loaded modules, no file read). Bounded: emptied when it reaches
// kMaxEntries.
class FrameCache {
 public:
  static FrameCache& Get() {
    static FrameCache* cache = new FrameCache;  // never destroyed: a capture may run at exit
    return *cache;
  }

  // The cached text of (pc, is_return_address) in the module mapped at `base`, if any.
  std::optional<std::string> Find(void* pc, bool is_return_address, const void* base) {
    MutexLock lock(&mu_);
    auto it = frames_.find(std::make_pair(pc, is_return_address));
    if (it == frames_.end() || it->second.base != base) return std::nullopt;
    return it->second.text;
  }

  void Insert(void* pc, bool is_return_address, const void* base, const std::string& text) {
    MutexLock lock(&mu_);
    if (frames_.size() >= kMaxEntries) frames_.clear();
    frames_.insert_or_assign(std::make_pair(pc, is_return_address), Entry{base, text});
  }

 private:
  static constexpr size_t kMaxEntries = 1 << 16;
  struct Entry {
    const void* base;
    std::string text;
  };
  Mutex mu_;
  absl::flat_hash_map<std::pair<void*, bool>, Entry> frames_ ABSL_GUARDED_BY(mu_);
};

// "function (module+0xoffset)". A return address is looked up one byte back, inside the call: the
// instruction after a call to a noreturn function may belong to the next function.
std::string SymbolizeFrame(void* pc, bool is_return_address) {
  void* lookup = static_cast<char*>(pc) - (is_return_address ? 1 : 0);
  Dl_info info{};
  const bool have_module = dladdr(lookup, &info) != 0 && info.dli_fname != nullptr;
  // An address outside every module (JIT code) is not cached: its text has no module to check.
  if (have_module) {
    std::optional<std::string> cached =
        FrameCache::Get().Find(pc, is_return_address, info.dli_fbase);
    if (cached.has_value()) return *std::move(cached);
  }
  const std::string module = have_module
                                 ? absl::StrFormat("%s+0x%x", info.dli_fname,
                                                   reinterpret_cast<uintptr_t>(pc) -
                                                       reinterpret_cast<uintptr_t>(info.dli_fbase))
                                 : "?";
  std::string text;
  char symbol[2048];
  // absl::Symbolize reads the ELF symbol tables, so it names static and non-exported functions too.
  if (absl::Symbolize(lookup, symbol, sizeof(symbol))) {
    // Abseil's demangler gives up on some names (ABI tags): those come back mangled.
    const std::string name = std::strncmp(symbol, "_Z", 2) == 0 ? Demangle(symbol) : symbol;
    text = absl::StrFormat("%s (%s)", name, module);
  } else if (have_module && info.dli_sname != nullptr) {
    text = absl::StrFormat(
        "%s+0x%x (%s)", Demangle(info.dli_sname),
        reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(info.dli_saddr), module);
  } else {
    text = absl::StrFormat("%p (%s)", pc, module);
  }
  if (have_module) FrameCache::Get().Insert(pc, is_return_address, info.dli_fbase, text);
  return text;
}

// Frames from the interrupted instruction outwards: the handler's own frames (and, under
// sanitizers, their runtime's) and the signal trampoline are dropped.
std::vector<std::string> SymbolizeStack(void* const* frames, int depth, uintptr_t interrupted_pc) {
  int first = std::min(1, depth);  // without the context's pc: skip the handler itself
  if (interrupted_pc != 0) {
    for (int i = 0; i < depth; ++i) {
      if (reinterpret_cast<uintptr_t>(frames[i]) == interrupted_pc) {
        first = i;
        break;
      }
    }
  }
  std::vector<std::string> out;
  for (int i = first; i < depth; ++i) {
    const bool exact = i == first && interrupted_pc != 0 &&
                       reinterpret_cast<uintptr_t>(frames[i]) == interrupted_pc;
    out.push_back(SymbolizeFrame(frames[i], !exact));
  }
  return out;
}

struct Request {
  int tid;
  int slot = -1;      // -1: not asked
  uint64_t word = 0;  // the slot's word while pending
  std::string note;
};

// Takes back a request nobody answered. False when the handler claimed it meanwhile: the answer is
// then there, or about to be.
bool Withdraw(const Request& r, uint64_t generation) {
  uint64_t expected = r.word;
  return g_slots[r.slot].word.compare_exchange_strong(expected, generation | kIdle);
}

void PollAnswers(std::vector<Request>& requests, absl::Time deadline) {
  absl::Duration pause = absl::Microseconds(50);
  while (true) {
    bool waiting = false;
    for (const Request& r : requests) {
      if (r.slot < 0) continue;
      const uint64_t word = g_slots[r.slot].word.load(std::memory_order_acquire);
      if ((word & kStateMask) != kDone) waiting = true;
    }
    if (!waiting || absl::Now() >= deadline) return;
    absl::SleepFor(std::min(pause, std::max(deadline - absl::Now(), absl::ZeroDuration())));
    pause = std::min(pause * 2, absl::Milliseconds(5));
  }
}

}  // namespace

int StackCaptureSignal() { return SIGRTMIN + 6; }

absl::StatusOr<std::vector<RawThreadStack>> CaptureRawThreadStacks(absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("stack capture: the timeout must be positive");
  }
  std::vector<Request> requests;
  std::vector<RawThreadStack> answers;
  {
    MutexLock lock(&CaptureMutex());
    if (absl::Status s = InstallHandler(); !s.ok()) return s;
    static uint64_t generation = 0;
    const uint64_t gen = ++generation << 2;
    for (int tid : ListThreads())
      requests.push_back(Request{.tid = tid, .slot = -1, .word = 0, .note = ""});
    // Hand out slots; one still being written by a late handler of an earlier capture is skipped.
    int next_slot = 0;
    for (Request& r : requests) {
      // An io_uring worker (liburing's, for the checkpoint writes) blocks every signal for good:
      // asking it would cost kBlockedGrace at every capture for a thread with no user stack.
      if (absl::StatusOr<ProcStat> stat = ReadThreadStat(r.tid); stat.ok() && stat->io_worker()) {
        r.note = "an io_uring worker: a kernel thread, no user stack";
        continue;
      }
      while (next_slot < kMaxThreads &&
             (g_slots[next_slot].word.load(std::memory_order_acquire) & kStateMask) == kWriting) {
        ++next_slot;
      }
      if (next_slot == kMaxThreads) {
        r.note = absl::StrFormat("not asked: more than %d threads", kMaxThreads);
        continue;
      }
      StackSlot& slot = g_slots[next_slot];
      slot.tid.store(r.tid, std::memory_order_relaxed);
      slot.pc.store(0, std::memory_order_relaxed);
      r.word = gen | kPending;
      slot.word.store(r.word, std::memory_order_release);
      r.slot = next_slot++;
    }
    if (next_slot > g_slots_in_use.load(std::memory_order_relaxed)) {
      g_slots_in_use.store(next_slot, std::memory_order_release);
    }
    const pid_t pid = getpid();
    for (Request& r : requests) {
      if (r.slot < 0) continue;
      if (syscall(SYS_tgkill, pid, r.tid, StackCaptureSignal()) != 0) {
        r.note = errno == ESRCH ? "the thread exited"
                                : absl::StrFormat("tgkill: %s", std::strerror(errno));
        Withdraw(r, gen);
        r.slot = -1;
      }
    }
    // A thread that blocks the signal leaves it pending. It may block it only for a moment (glibc
    // blocks every signal around pthread_create; a handler blocks its own signal while it runs),
    // so only a thread that still blocks it after kBlockedGrace, without having answered, is
    // given up on; one that blocks it for good would otherwise cost the whole timeout.
    const absl::Time blocked_deadline = absl::Now() + std::min(timeout, kBlockedGrace);
    while (true) {
      bool blocked = false;
      for (Request& r : requests) {
        if (r.slot < 0) continue;
        const uint64_t word = g_slots[r.slot].word.load(std::memory_order_acquire);
        if (word != r.word) continue;  // answered or answering
        if (!BlocksSignal(r.tid, StackCaptureSignal())) continue;
        if (absl::Now() < blocked_deadline) {
          blocked = true;
        } else if (Withdraw(r, gen)) {
          r.note = "the thread blocks the signal";
          r.slot = -1;
        }
      }
      if (!blocked) break;
      absl::SleepFor(absl::Milliseconds(1));
    }
    PollAnswers(requests, absl::Now() + timeout);
    // Withdraw every unanswered request; a handler that already claimed its slot gets a grace.
    for (Request& r : requests) {
      if (r.slot >= 0 && Withdraw(r, gen)) {
        r.note = absl::StrFormat(
            "no answer within %s: %s (an uninterruptible wait, e.g. in a driver; a stopped "
            "process; "
            "or, under ThreadSanitizer, a system call it does not treat as blocking)",
            absl::FormatDuration(timeout), KernelWait(r.tid));
        r.slot = -1;
      }
    }
    PollAnswers(requests, absl::Now() + kFinishGrace);
    answers.resize(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      Request& r = requests[i];
      if (r.slot < 0) continue;
      StackSlot& slot = g_slots[r.slot];
      if ((slot.word.load(std::memory_order_acquire) & kStateMask) != kDone) {
        r.note = "its answer was not finished in time";
        r.slot = -1;  // left in kWriting: later captures skip it until the handler finishes
        continue;
      }
      answers[i].pc = slot.pc.load(std::memory_order_relaxed);
      answers[i].addresses.assign(slot.frames, slot.frames + std::clamp(slot.depth, 0, kMaxFrames));
      slot.word.store(gen | kIdle, std::memory_order_release);
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    ThreadStack& t = answers[i].thread;
    t.tid = requests[i].tid;
    t.name = ThreadName(t.tid);
    t.answered = requests[i].slot >= 0;
    t.note = requests[i].note;
  }
  return answers;
}

std::vector<ThreadStack> SymbolizeThreadStacks(const std::vector<RawThreadStack>& raw) {
  std::vector<ThreadStack> stacks;
  for (const RawThreadStack& r : raw) {
    ThreadStack& t = stacks.emplace_back(r.thread);
    if (t.answered) {
      t.frames = SymbolizeStack(r.addresses.data(), static_cast<int>(r.addresses.size()), r.pc);
    }
  }
  return stacks;
}

absl::StatusOr<std::vector<ThreadStack>> CaptureThreadStacks(absl::Duration timeout) {
  absl::StatusOr<std::vector<RawThreadStack>> raw = CaptureRawThreadStacks(timeout);
  if (!raw.ok()) return raw.status();
  return SymbolizeThreadStacks(*raw);
}

std::string FormatThreadStacks(const std::vector<ThreadStack>& stacks) {
  std::string out;
  for (const ThreadStack& t : stacks) {
    if (!t.answered) {
      absl::StrAppendFormat(&out, "thread %d \"%s\": no answer (%s)\n", t.tid, t.name, t.note);
      continue;
    }
    absl::StrAppendFormat(&out, "thread %d \"%s\":\n", t.tid, t.name);
    for (size_t i = 0; i < t.frames.size(); ++i) {
      absl::StrAppendFormat(&out, "  #%d %s\n", i, t.frames[i]);
    }
  }
  return out;
}

absl::StatusOr<std::vector<ThreadStack>> ParseThreadStacks(std::string_view text) {
  std::vector<ThreadStack> stacks;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_number;
    if (line.empty()) continue;
    if (absl::ConsumePrefix(&line, "  #")) {
      const size_t space = line.find(' ');
      if (stacks.empty() || space == absl::string_view::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("thread stacks, line ", line_number, ": a frame outside a thread"));
      }
      stacks.back().frames.emplace_back(line.substr(space + 1));
      continue;
    }
    // thread <tid> "<name>":  or  thread <tid> "<name>": no answer (<note>)
    ThreadStack t;
    const bool header = absl::ConsumePrefix(&line, "thread ");
    const size_t open_quote = line.find(" \"");
    const size_t close_quote = line.rfind("\":");
    if (!header || open_quote == absl::string_view::npos ||
        close_quote == absl::string_view::npos || close_quote <= open_quote ||
        !absl::SimpleAtoi(line.substr(0, open_quote), &t.tid)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "thread stacks, line ", line_number, ": expected 'thread <tid> \"<name>\":' or a frame"));
    }
    t.name = std::string(line.substr(open_quote + 2, close_quote - open_quote - 2));
    absl::string_view rest = line.substr(close_quote + 2);
    t.answered = !absl::ConsumePrefix(&rest, " no answer (");
    if (!t.answered) {
      absl::ConsumeSuffix(&rest, ")");
      t.note = std::string(rest);
    }
    stacks.push_back(std::move(t));
  }
  return stacks;
}

absl::StatusOr<std::string> CaptureAllThreadStacks(absl::Duration timeout) {
  absl::StatusOr<std::vector<ThreadStack>> stacks = CaptureThreadStacks(timeout);
  if (!stacks.ok()) return stacks.status();
  return FormatThreadStacks(*stacks);
}

}  // namespace trainguard
