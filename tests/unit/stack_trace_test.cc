// Specification of stack capture (sdk/watchdog/stack_trace.h): every thread of the process,
// asked by signal, including threads blocked in system calls, from a thread that is not main.
#include "sdk/watchdog/stack_trace.h"

#include <dirent.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/core/mutex.h"
#include "sdk/core/proc_stat.h"

namespace trainguard {

// Outside the anonymous namespace and never inlined, so the frame has this name. Blocks in read(2)
// until a byte arrives; returns what read returned (1 unless the signal broke the read).
__attribute__((noinline)) ssize_t BlockedInPipeReadForStackTest(int fd) {
  char c;
  ssize_t n = read(fd, &c, 1);
  asm volatile("" ::: "memory");  // no tail call: this frame stays on the stack during the read
  return n;
}

__attribute__((noinline)) void BlockedInConditionWaitForStackTest(Notification* release) {
  while (!release->WaitForNotificationWithTimeout(absl::Seconds(60))) {
  }
  asm volatile("" ::: "memory");
}

namespace {

using ::testing::HasSubstr;

// ThreadSanitizer runs a signal handler only when the thread enters or leaves one of its
// interceptors or waits in one it treats as blocking; GCC 12's does not treat read(2) as blocking,
// so under it a thread blocked in read answers only once the read returns.
#if defined(__SANITIZE_THREAD__)
constexpr bool kReadDefersSignals = true;
#else
constexpr bool kReadDefersSignals = false;
#endif

int Tid() { return static_cast<int>(syscall(SYS_gettid)); }

const ThreadStack* Find(const std::vector<ThreadStack>& stacks, int tid) {
  for (const ThreadStack& t : stacks) {
    if (t.tid == tid) return &t;
  }
  return nullptr;
}

bool HasFrame(const ThreadStack& t, const std::string& function) {
  for (const std::string& frame : t.frames) {
    if (frame.find(function) != std::string::npos) return true;
  }
  return false;
}

// A thread blocked in BlockedInPipeReadForStackTest until Release().
class PipeReader {
 public:
  PipeReader() {
    if (pipe(fds_) != 0) std::abort();
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "tg-pipe-reader");
      tid_.store(Tid());
      result_.store(BlockedInPipeReadForStackTest(fds_[0]));
    });
    while (tid_.load() == 0) std::this_thread::yield();
  }
  ~PipeReader() {
    Join();
    close(fds_[0]);
    close(fds_[1]);
  }
  int tid() const { return tid_.load(); }
  // Lets the read complete; returns what it returned.
  ssize_t Join() {
    if (thread_.joinable()) {
      if (write(fds_[1], "x", 1) != 1) std::abort();
      thread_.join();
    }
    return result_.load();
  }

 private:
  int fds_[2];
  std::thread thread_;
  std::atomic<int> tid_{0};
  std::atomic<ssize_t> result_{-2};
};

// Captures until `tid`'s stack has `function` (the thread may not be inside it yet), at most 500
// times: bounded polling.
std::vector<ThreadStack> CaptureUntil(int tid, const std::string& function) {
  std::vector<ThreadStack> stacks;
  for (int attempt = 0; attempt < 500; ++attempt) {
    absl::StatusOr<std::vector<ThreadStack>> captured = CaptureThreadStacks(absl::Seconds(10));
    if (!captured.ok()) {
      ADD_FAILURE() << captured.status();
      return stacks;
    }
    stacks = *std::move(captured);
    const ThreadStack* t = Find(stacks, tid);
    if (t != nullptr && HasFrame(*t, function)) return stacks;
    usleep(2000);
  }
  return stacks;
}

TEST(StackTraceTest, AThreadBlockedInAPipeReadShowsTheFunctionItIsBlockedIn) {
  if (kReadDefersSignals) GTEST_SKIP() << "ThreadSanitizer defers signals during read(2)";
  PipeReader reader;
  std::vector<ThreadStack> stacks = CaptureUntil(reader.tid(), "BlockedInPipeReadForStackTest");
  const ThreadStack* t = Find(stacks, reader.tid());
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->answered) << t->note;
  EXPECT_EQ(t->name, "tg-pipe-reader");
  EXPECT_TRUE(HasFrame(*t, "BlockedInPipeReadForStackTest")) << FormatThreadStacks(stacks);
  // The read it interrupted resumed (SA_RESTART) and got its byte.
  EXPECT_EQ(reader.Join(), 1);
}

// A hang is declared between the capture and the symbolising (RuntimeImpl::OnHang): the stacks
// symbolised afterwards are where the threads were at the capture, even once they moved on.
TEST(StackTraceTest, StacksCapturedRawAndSymbolisedLaterShowWhereTheThreadsWereAtTheCapture) {
  if (kReadDefersSignals) GTEST_SKIP() << "ThreadSanitizer defers signals during read(2)";
  PipeReader reader;
  std::vector<RawThreadStack> raw;
  for (int attempt = 0; attempt < 500; ++attempt) {
    absl::StatusOr<std::vector<RawThreadStack>> captured =
        CaptureRawThreadStacks(absl::Seconds(10));
    ASSERT_TRUE(captured.ok()) << captured.status();
    raw = *std::move(captured);
    const std::vector<ThreadStack> now = SymbolizeThreadStacks(raw);
    const ThreadStack* t = Find(now, reader.tid());
    if (t != nullptr && HasFrame(*t, "BlockedInPipeReadForStackTest")) break;
    usleep(2000);
  }
  EXPECT_EQ(reader.Join(), 1);  // the reader got its byte and its thread is gone
  const std::vector<ThreadStack> later = SymbolizeThreadStacks(raw);
  const ThreadStack* t = Find(later, reader.tid());
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->answered) << t->note;
  EXPECT_EQ(t->name, "tg-pipe-reader");
  EXPECT_TRUE(HasFrame(*t, "BlockedInPipeReadForStackTest")) << FormatThreadStacks(later);
}

// The io_uring worker threads of this process (the checkpoint writer's liburing creates them).
std::vector<int> IoWorkers() {
  std::vector<int> workers;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return workers;
  while (dirent* entry = readdir(dir)) {
    const int tid = std::atoi(entry->d_name);
    if (tid <= 0) continue;
    absl::StatusOr<ProcStat> stat = ReadThreadStat(tid);
    if (stat.ok() && stat->io_worker()) workers.push_back(tid);
  }
  closedir(dir);
  return workers;
}

// An io_uring worker blocks every signal for good: the capture names it without asking it (asking
// cost the 50 ms a thread is given to unblock the signal, at every capture).
TEST(StackTraceTest, AnIoUringWorkerIsNamedAsSuchWithoutBeingAsked) {
  io_uring ring;
  if (const int rc = io_uring_queue_init(4, &ring, 0); rc < 0) {
    GTEST_SKIP() << "io_uring_queue_init: " << std::strerror(-rc) << ": no io_uring here";
  }
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  char byte = 0;
  io_uring_sqe* sqe = io_uring_get_sqe(&ring);
  ASSERT_NE(sqe, nullptr);
  io_uring_prep_read(sqe, fds[0], &byte, 1, 0);
  io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);  // run by a worker thread, which blocks in the read
  ASSERT_EQ(io_uring_submit(&ring), 1);
  std::vector<int> workers;
  for (int attempt = 0; attempt < 500 && workers.empty(); ++attempt) {  // bounded polling
    workers = IoWorkers();
    if (workers.empty()) usleep(2000);
  }
  ASSERT_FALSE(workers.empty()) << "no io_uring worker thread appeared";
  absl::StatusOr<std::vector<ThreadStack>> stacks = CaptureThreadStacks(absl::Seconds(10));
  ASSERT_TRUE(stacks.ok()) << stacks.status();
  const ThreadStack* worker = Find(*stacks, workers.front());
  ASSERT_NE(worker, nullptr) << FormatThreadStacks(*stacks);
  EXPECT_FALSE(worker->answered);
  EXPECT_THAT(worker->note, ::testing::HasSubstr("io_uring worker")) << FormatThreadStacks(*stacks);
  ASSERT_EQ(write(fds[1], "x", 1), 1);
  io_uring_cqe* cqe = nullptr;
  __kernel_timespec timeout{.tv_sec = 10, .tv_nsec = 0};
  ASSERT_EQ(io_uring_wait_cqe_timeout(&ring, &cqe, &timeout), 0);
  EXPECT_EQ(cqe->res, 1);
  io_uring_cqe_seen(&ring, cqe);
  io_uring_queue_exit(&ring);
  close(fds[0]);
  close(fds[1]);
}

TEST(StackTraceTest, ACaptureFromANonMainThreadSeesEveryThreadIncludingMainAndItself) {
  std::optional<PipeReader> reader;
  if (!kReadDefersSignals) reader.emplace();
  Notification release;
  std::atomic<int> waiter_tid{0};
  std::thread waiter([&] {
    waiter_tid.store(Tid());
    BlockedInConditionWaitForStackTest(&release);
  });
  while (waiter_tid.load() == 0) std::this_thread::yield();
  const int main_tid = Tid();
  std::vector<ThreadStack> stacks;
  int capturer_tid = 0;
  // glibc's pthread_create blocks every signal in the creating thread until the new thread is set
  // up: capturing before main returned from it would find main blocking the signal.
  std::atomic<bool> created{false};
  std::thread watchdog([&] {
    capturer_tid = Tid();
    while (!created.load()) std::this_thread::yield();
    if (reader) CaptureUntil(reader->tid(), "BlockedInPipeReadForStackTest");
    stacks = CaptureUntil(waiter_tid.load(), "BlockedInConditionWaitForStackTest");
  });
  created.store(true);
  watchdog.join();
  release.Notify();
  waiter.join();

  std::vector<int> tids = {main_tid, capturer_tid, waiter_tid.load()};
  if (reader) tids.push_back(reader->tid());
  for (int tid : tids) {
    const ThreadStack* t = Find(stacks, tid);
    ASSERT_NE(t, nullptr) << "thread " << tid << " missing from\n" << FormatThreadStacks(stacks);
    EXPECT_TRUE(t->answered) << t->note;
    EXPECT_FALSE(t->frames.empty());
  }
  EXPECT_TRUE(HasFrame(*Find(stacks, waiter_tid.load()), "BlockedInConditionWaitForStackTest"));
  if (reader) {
    EXPECT_TRUE(HasFrame(*Find(stacks, reader->tid()), "BlockedInPipeReadForStackTest"));
    EXPECT_EQ(reader->Join(), 1);
  }
}

// Blocks (SIG_BLOCK) or unblocks (SIG_UNBLOCK) the capture signal in the calling thread.
void MaskCaptureSignal(int how) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, StackCaptureSignal());
  pthread_sigmask(how, &set, nullptr);
}

TEST(StackTraceTest, AThreadThatBlocksTheSignalIsReportedAsNoAnswerAndAnswersTheNextCapture) {
  Notification blocked, unblock, unblocked, finish;
  std::atomic<int> tid{0};
  std::thread masked([&] {
    tid.store(Tid());
    MaskCaptureSignal(SIG_BLOCK);
    blocked.Notify();
    unblock.WaitForNotificationWithTimeout(absl::Seconds(60));
    // The signal still pending from the first capture is delivered here, after its deadline.
    MaskCaptureSignal(SIG_UNBLOCK);
    unblocked.Notify();
    finish.WaitForNotificationWithTimeout(absl::Seconds(60));
  });
  ASSERT_TRUE(blocked.WaitForNotificationWithTimeout(absl::Seconds(60)));

  absl::StatusOr<std::vector<ThreadStack>> first = CaptureThreadStacks(absl::Milliseconds(100));
  ASSERT_TRUE(first.ok()) << first.status();
  const ThreadStack* t = Find(*first, tid.load());
  ASSERT_NE(t, nullptr);
  EXPECT_FALSE(t->answered);
  EXPECT_TRUE(t->frames.empty());
  EXPECT_THAT(FormatThreadStacks(*first), HasSubstr(absl::StrFormat("thread %d \"", tid.load())));
  EXPECT_EQ(t->note, "the thread blocks the signal");
  EXPECT_THAT(FormatThreadStacks(*first), HasSubstr("no answer (the thread blocks the signal)"));
  const ThreadStack* self = Find(*first, Tid());
  ASSERT_NE(self, nullptr);
  EXPECT_TRUE(self->answered);

  unblock.Notify();
  ASSERT_TRUE(unblocked.WaitForNotificationWithTimeout(absl::Seconds(60)));
  absl::StatusOr<std::vector<ThreadStack>> second = CaptureThreadStacks(absl::Seconds(10));
  finish.Notify();
  masked.join();
  ASSERT_TRUE(second.ok()) << second.status();
  t = Find(*second, tid.load());
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->answered) << t->note;
}

// A thread may block the signal for a moment (glibc blocks every signal around pthread_create; a
// handler blocks its own signal while it runs): once it unblocks it, the pending signal is handled
// and the same capture gets its answer.
TEST(StackTraceTest, AThreadThatBlocksTheSignalForAMomentAnswersTheSameCapture) {
  Notification blocked, finish;
  std::atomic<int> tid{0};
  std::thread masked([&] {
    tid.store(Tid());
    MaskCaptureSignal(SIG_BLOCK);
    blocked.Notify();
    // Bounded polling until the capture's signal is pending; then the "moment": 5 ms, well past
    // the capture's first look at the thread's signal mask and well within its 50 ms grace.
    for (absl::Time end = absl::Now() + absl::Seconds(60); absl::Now() < end;) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, StackCaptureSignal()) == 1) break;
      std::this_thread::yield();
    }
    absl::SleepFor(absl::Milliseconds(5));
    MaskCaptureSignal(SIG_UNBLOCK);
    finish.WaitForNotificationWithTimeout(absl::Seconds(60));
  });
  ASSERT_TRUE(blocked.WaitForNotificationWithTimeout(absl::Seconds(60)));
  absl::StatusOr<std::vector<ThreadStack>> stacks = CaptureThreadStacks(absl::Seconds(10));
  finish.Notify();
  masked.join();
  ASSERT_TRUE(stacks.ok()) << stacks.status();
  const ThreadStack* t = Find(*stacks, tid.load());
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->answered) << t->note;
  EXPECT_FALSE(t->frames.empty());
}

TEST(StackTraceTest, TheFormattedCaptureNamesEveryThreadAndListsItsFrames) {
  Notification release;
  std::atomic<int> tid{0};
  std::thread waiter([&] {
    pthread_setname_np(pthread_self(), "tg-waiter");
    tid.store(Tid());
    BlockedInConditionWaitForStackTest(&release);
  });
  while (tid.load() == 0) std::this_thread::yield();
  CaptureUntil(tid.load(), "BlockedInConditionWaitForStackTest");
  absl::StatusOr<std::string> text = CaptureAllThreadStacks(absl::Seconds(10));
  release.Notify();
  waiter.join();
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_THAT(*text, HasSubstr(absl::StrFormat("thread %d \"tg-waiter\":\n  #0 ", tid.load())));
  EXPECT_THAT(*text, HasSubstr("BlockedInConditionWaitForStackTest"));
}

TEST(StackTraceTest, ANonPositiveTimeoutIsInvalid) {
  EXPECT_EQ(CaptureThreadStacks(absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StackTraceTest, ASignalHandlerInstalledBySomeoneElseIsNotReplaced) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Another library's handler for the same signal, installed before or after ours.
    struct sigaction other {};
    other.sa_handler = [](int) {};
    sigaction(StackCaptureSignal(), &other, nullptr);
    absl::StatusOr<std::vector<ThreadStack>> stacks = CaptureThreadStacks(absl::Seconds(1));
    _exit(stacks.status().code() == absl::StatusCode::kFailedPrecondition ? 0 : 1);
  }
  int status;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace trainguard
