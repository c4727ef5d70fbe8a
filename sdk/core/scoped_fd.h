// ScopedFd: owns a POSIX file descriptor and closes it on scope exit (private to sdk/; any
// subsystem may include it, sdk/core being the bottom layer).
//
// For descriptors whose close error does not matter (a read-only file, a segment already mapped, an
// error path). Where close(2) can report a lost write, release() the descriptor and close it
// explicitly to see the error. Not copyable. Not thread-safe: one owner.
#ifndef TRAINGUARD_SDK_CORE_SCOPED_FD_H_
#define TRAINGUARD_SDK_CORE_SCOPED_FD_H_

#include <unistd.h>

#include <utility>

namespace trainguard {

class ScopedFd {
 public:
  // Takes ownership of `fd`; a negative one (a failed open) is held and never closed.
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;

  int get() const { return fd_; }
  // Gives up ownership: the caller closes the returned descriptor.
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CORE_SCOPED_FD_H_
