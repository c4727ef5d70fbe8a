#include "sdk/agent/posix_process_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "sdk/core/proc_stat.h"
#include "sdk/core/scoped_fd.h"

namespace trainguard {

// How long a failed exec may take to report (a slow file system), and how long the destructor
// waits for a SIGKILLed worker to be reapable.
constexpr int kExecReportMs = 10'000;
constexpr int kReapAfterKillMs = 10'000;

struct PosixProcessSupervisor::Worker {
  pid_t pid = -1;
  std::string label;
  int out_fd = -1;  // the read end of its stdout+stderr; -1 once the pipe ended
  int pidfd = -1;   // -1 without pidfd_open, and once it exited
  std::unique_ptr<WritableFile> log;
  std::string pending;  // output after the last newline
  bool live = true;     // not reaped yet

  ~Worker() {
    if (out_fd >= 0) close(out_fd);
    if (pidfd >= 0) close(pidfd);
  }
};

namespace {

// "ENOENT (No such file or directory)".
std::string DescribeErrno(int err) {
  const char* name = strerrorname_np(err);
  const char* text = strerrordesc_np(err);
  return absl::StrCat(name != nullptr ? name : absl::StrCat("errno ", err), " (",
                      text != nullptr ? text : "unknown error", ")");
}

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

int PollMilliseconds(absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(timeout, absl::Milliseconds(1))), INT_MAX));
}

}  // namespace

PosixProcessSupervisor::PosixProcessSupervisor(PosixProcessSupervisorOptions options)
    : options_(options), env_(options.env != nullptr ? options.env : Env::Default()) {}

PosixProcessSupervisor::~PosixProcessSupervisor() {
  for (auto& [id, worker] : workers_) {
    if (worker->live) KillAndReap(*worker);
  }
}

absl::StatusOr<WorkerId> PosixProcessSupervisor::Spawn(const WorkerSpec& spec) {
  if (spec.argv.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no command to start for ", spec.label));
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> log = env_->NewAppendableFile(spec.log_path);
  if (!log.ok()) return log.status();
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  ScopedFd out_read(pipe_fds[0]);
  ScopedFd out_write(pipe_fds[1]);

  // Everything the child needs is built before fork(): the caller may have threads, so the child
  // may only make async-signal-safe calls until it execs.
  std::vector<std::string> env_strings = spec.env;
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = spec.argv;
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  sigset_t none;
  sigemptyset(&none);
  // The child reports a failed exec through this pipe (its errno); a successful exec closes it.
  int exec_fds[2];
  if (pipe2(exec_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  ScopedFd exec_read(exec_fds[0]);
  ScopedFd exec_write(exec_fds[1]);
  // Workers do not read the launcher's terminal: in their own process groups they would be
  // stopped by SIGTTIN.
  ScopedFd null_fd(open("/dev/null", O_RDONLY | O_CLOEXEC));

  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // the job dies with its launcher
    if (getppid() != parent) _exit(127);
    setpgid(0, 0);  // its own group, signalled as a whole (Signal)
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (null_fd.get() >= 0) dup2(null_fd.get(), STDIN_FILENO);
    dup2(out_write.get(), STDOUT_FILENO);
    dup2(out_write.get(), STDERR_FILENO);
    execvpe(argv[0], argv.data(), envp.data());
    const int err = errno;
    (void)!write(exec_write.get(), &err, sizeof(err));
    _exit(127);
  }
  // Also here, so the group exists before this process may signal it, whichever runs first.
  setpgid(pid, pid);
  close(exec_write.release());
  close(null_fd.release());
  int exec_errno = 0;
  pollfd exec_poll = {exec_read.get(), POLLIN, 0};
  // Bounded: exec either fails at once or closes the pipe.
  const bool answered = poll(&exec_poll, 1, kExecReportMs) == 1;
  const bool exec_failed =
      answered && read(exec_read.get(), &exec_errno, sizeof(exec_errno)) == sizeof(exec_errno);
  if (exec_failed) {
    waitpid(pid, nullptr, 0);  // it _exits right after writing
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot execute the command '%s' for %s: %s", spec.argv[0], spec.label,
                        DescribeErrno(exec_errno)));
  }
  auto worker = std::make_unique<Worker>();
  worker->pid = pid;
  worker->label = spec.label;
  worker->out_fd = out_read.release();
  fcntl(worker->out_fd, F_SETFL, O_NONBLOCK);
  worker->pidfd = PidfdOpen(pid);  // -1 on a kernel without it: exits are found by Poll's sweep
  worker->log = *std::move(log);
  const WorkerId id = next_id_++;
  Worker& started = *worker;
  workers_.emplace(id, std::move(worker));
  if (!spec.pid_file.empty()) {
    if (absl::Status s = WritePidFile(id, spec.pid_file); !s.ok()) {
      // A worker whose pid nobody can read is not left running untracked.
      KillAndReap(started);
      workers_.erase(id);
      return s;
    }
  }
  return id;
}

absl::StatusOr<const PosixProcessSupervisor::Worker*> PosixProcessSupervisor::LiveWorker(
    WorkerId id, std::string_view refused) const {
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("no worker ", id, " was started here"));
  }
  const Worker& worker = *it->second;
  if (!worker.live) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s (pid %d) has exited: %s", worker.label, worker.pid, refused));
  }
  return &worker;
}

absl::Status PosixProcessSupervisor::Signal(WorkerId id, int signal) {
  absl::StatusOr<const Worker*> live = LiveWorker(id, "not signalled");
  if (!live.ok()) return live.status();
  const Worker& worker = **live;
  // A group id of 0 or 1 would signal this process's own group or every process: never.
  if (worker.pid <= 1) {
    return absl::InternalError(absl::StrFormat("%s has no pid (%d)", worker.label, worker.pid));
  }
  if (kill(-worker.pid, signal) != 0) {
    return absl::InternalError(
        absl::StrFormat("kill -%d (%s): %s", worker.pid, worker.label, strerror(errno)));
  }
  return absl::OkStatus();
}

std::vector<WorkerEvent> PosixProcessSupervisor::Poll(absl::Duration timeout) {
  std::vector<WorkerEvent> events;
  CollectStateChanges(&events);
  std::vector<pollfd> fds;
  std::vector<WorkerId> readers;  // the worker whose pipe fds[i] is; 0: a wake-up only
  if (options_.wake_fd >= 0) {
    fds.push_back({options_.wake_fd, POLLIN, 0});
    readers.push_back(0);
  }
  for (const auto& [id, worker] : workers_) {
    if (worker->out_fd >= 0) {
      fds.push_back({worker->out_fd, POLLIN, 0});
      readers.push_back(id);
    }
    if (worker->live && worker->pidfd >= 0) {
      fds.push_back({worker->pidfd, POLLIN, 0});
      readers.push_back(0);
    }
  }
  const int wait_ms = events.empty() ? PollMilliseconds(timeout) : 0;
  if (poll(fds.data(), fds.size(), wait_ms) > 0) {
    for (size_t i = 0; i < fds.size(); ++i) {
      if (readers[i] == 0 || fds[i].revents == 0) continue;
      auto it = workers_.find(readers[i]);
      ReadOutput(it->first, *it->second, /*flush=*/false, &events);
    }
  }
  CollectStateChanges(&events);
  return events;
}

void PosixProcessSupervisor::ReadOutput(WorkerId id, Worker& worker, bool flush,
                                        std::vector<WorkerEvent>* events) {
  char buffer[1 << 14];
  while (worker.out_fd >= 0) {
    const ssize_t n = read(worker.out_fd, buffer, sizeof(buffer));
    if (n > 0) {
      // A log that cannot be written does not stop the job; its output still reaches the caller.
      (void)worker.log->Append(absl::string_view(buffer, static_cast<size_t>(n)));
      worker.pending.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {  // the worker and everything it started closed the pipe
      close(worker.out_fd);
      worker.out_fd = -1;
      flush = true;
    }
    break;
  }
  size_t begin = 0;
  for (size_t end; (end = worker.pending.find('\n', begin)) != std::string::npos; begin = end + 1) {
    WorkerEvent event;
    event.kind = WorkerEvent::Kind::kOutput;
    event.worker = id;
    event.line = worker.pending.substr(begin, end - begin);
    events->push_back(std::move(event));
  }
  worker.pending.erase(0, begin);
  if (flush && !worker.pending.empty()) {
    WorkerEvent event;
    event.kind = WorkerEvent::Kind::kOutput;
    event.worker = id;
    event.line = std::exchange(worker.pending, std::string());
    events->push_back(std::move(event));
  }
}

void PosixProcessSupervisor::CollectStateChanges(std::vector<WorkerEvent>* events) {
  for (auto& [id, worker] : workers_) {
    while (worker->live) {
      int status = 0;
      const pid_t changed = waitpid(worker->pid, &status, WNOHANG | WUNTRACED | WCONTINUED);
      if (changed < 0 && errno == EINTR) continue;
      if (changed != worker->pid) break;  // no change (or not our child: see REQUIRES)
      WorkerEvent event;
      event.worker = id;
      if (WIFSTOPPED(status)) {
        ReadOutput(id, *worker, /*flush=*/false, events);  // what it wrote before it stopped
        event.kind = WorkerEvent::Kind::kStopped;
        event.stop_signal = WSTOPSIG(status);
        events->push_back(std::move(event));
        continue;
      }
      if (WIFCONTINUED(status)) {
        event.kind = WorkerEvent::Kind::kContinued;
        events->push_back(std::move(event));
        continue;
      }
      worker->live = false;
      // The group outlives its leader while a process the command started is still in it; once
      // the group is empty, the id belongs to nobody (ESRCH), and it is not reused while the
      // group exists. Nothing signals the group after this.
      kill(-worker->pid, SIGKILL);
      if (worker->pidfd >= 0) {
        close(worker->pidfd);
        worker->pidfd = -1;
      }
      ReadOutput(id, *worker, /*flush=*/true, events);
      event.kind = WorkerEvent::Kind::kExited;
      event.exit = WorkerExit::FromWaitStatus(status);
      events->push_back(std::move(event));
    }
  }
}

void PosixProcessSupervisor::KillAndReap(Worker& worker) {
  if (worker.pid > 1) kill(-worker.pid, SIGKILL);
  const absl::Time deadline = absl::Now() + absl::Milliseconds(kReapAfterKillMs);
  while (worker.live) {
    const pid_t reaped = waitpid(worker.pid, nullptr, WNOHANG);
    if (reaped == worker.pid || (reaped < 0 && errno != EINTR)) {
      worker.live = false;
      break;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;  // left to PDEATHSIG and init
    if (worker.pidfd >= 0) {
      pollfd exited = {worker.pidfd, POLLIN, 0};
      poll(&exited, 1, PollMilliseconds(left));
    } else {
      poll(nullptr, 0, 10);  // no pidfd to wait on: look again shortly
    }
  }
}

bool PosixProcessSupervisor::IsStopped(WorkerId id) {
  auto it = workers_.find(id);
  if (it == workers_.end() || !it->second->live) return false;
  absl::StatusOr<ProcStat> stat = ReadProcStat(it->second->pid);
  return stat.ok() && stat->stopped();
}

absl::Status PosixProcessSupervisor::WritePidFile(WorkerId id, const std::string& path) {
  absl::StatusOr<const Worker*> live = LiveWorker(id, absl::StrCat("no pid file ", path));
  if (!live.ok()) return live.status();
  const Worker& worker = **live;
  // Written to a temporary file and renamed over `path`: a reader (a test, a script about to send
  // a signal) sees the old contents or the new, never an empty or half-written file, which would
  // read as no pid or a wrong one.
  const std::string temp = absl::StrCat(path, ".tmp.", getpid());
  absl::StatusOr<std::unique_ptr<WritableFile>> file = env_->NewWritableFile(temp);
  if (!file.ok()) return file.status();
  absl::Status written = (*file)->Append(absl::StrCat(worker.pid, "\n"));
  const absl::Status closed = (*file)->Close();
  if (written.ok()) written = closed;
  if (written.ok()) written = env_->RenameFile(temp, path);
  if (!written.ok()) (void)env_->RemoveFile(temp);
  return written;
}

pid_t PosixProcessSupervisor::pid(WorkerId id) const {
  auto it = workers_.find(id);
  return it == workers_.end() ? -1 : it->second->pid;
}

absl::Status PosixProcessSupervisor::Release(WorkerId id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("no worker ", id, " was started here"));
  }
  if (it->second->live) {
    return absl::FailedPreconditionError(absl::StrFormat("%s (pid %d) is still live: not released",
                                                         it->second->label, it->second->pid));
  }
  workers_.erase(it);
  return absl::OkStatus();
}

}  // namespace trainguard
