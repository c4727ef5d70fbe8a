#include "sdk/checkpoint/direct_writer.h"

#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "sdk/core/mutex.h"
#include "trainguard/env.h"

namespace trainguard::checkpoint {
namespace {

constexpr uint64_t kAlignment = 4096;
// A write or fsync that makes no progress for this long fails the shard instead of hanging the
// trainer (a wedged device or NFS server).
constexpr int kStallSeconds = 120;

uint64_t AlignUp(uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

// Buffers aligned for O_DIRECT, freed on destruction.
class AlignedBuffers {
 public:
  AlignedBuffers() = default;
  AlignedBuffers(const AlignedBuffers&) = delete;
  AlignedBuffers& operator=(const AlignedBuffers&) = delete;
  ~AlignedBuffers() {
    for (char* b : buffers_) std::free(b);
  }
  absl::Status Allocate(int count, size_t bytes) {
    for (int i = 0; i < count; ++i) {
      void* p = nullptr;
      if (int rc = posix_memalign(&p, kAlignment, bytes); rc != 0) {
        return ErrnoToStatus(
            rc, absl::StrFormat("posix_memalign of %d bytes for the shard writer", bytes));
      }
      buffers_.push_back(static_cast<char*>(p));
    }
    bytes_ = bytes;
    return absl::OkStatus();
  }
  // Copies `data` into buffer `i`, zero-padded; returns the padded length.
  size_t Fill(int i, absl::string_view data) {
    const size_t padded = AlignUp(data.size());
    std::memcpy(buffers_[i], data.data(), data.size());
    std::memset(buffers_[i] + data.size(), 0, padded - data.size());
    return padded;
  }
  char* at(int i) const { return buffers_[i]; }
  int count() const { return static_cast<int>(buffers_.size()); }
  size_t bytes() const { return bytes_; }

 private:
  std::vector<char*> buffers_;
  size_t bytes_ = 0;
};

absl::Status CheckSegments(const std::vector<WriteSegment>& segments, size_t buffer_bytes,
                           const std::string& path) {
  for (const WriteSegment& s : segments) {
    if (s.offset % kAlignment != 0 || s.data.size() > buffer_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "write %s: segment at offset %d of %d bytes is unaligned or larger than the %d-byte "
          "buffer",
          path, s.offset, s.data.size(), buffer_bytes));
    }
  }
  return absl::OkStatus();
}

class PwritevWriter final : public DirectWriter {
 public:
  explicit PwritevWriter(PwritevFunction fn) : pwritev_(std::move(fn)) {}
  absl::Status Init(const DirectWriterOptions& options) {
    return buffers_.Allocate(1, options.buffer_bytes);
  }

  absl::Status WriteAndSync(int fd, const std::string& path,
                            const std::vector<WriteSegment>& segments) override {
    if (absl::Status s = CheckSegments(segments, buffers_.bytes(), path); !s.ok()) return s;
    for (const WriteSegment& segment : segments) {
      const size_t length = buffers_.Fill(0, segment.data);
      size_t done = 0;
      while (done < length) {
        struct iovec iov = {buffers_.at(0) + done, length - done};
        const ssize_t n = pwritev_
                              ? pwritev_(fd, &iov, 1, static_cast<off_t>(segment.offset + done))
                              : ::pwritev(fd, &iov, 1, static_cast<off_t>(segment.offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          return ErrnoToStatus(errno, absl::StrFormat("pwritev %s at offset %d (%d bytes)", path,
                                                    segment.offset + done, length - done));
        }
        if (n == 0) {
          return absl::DataLossError(absl::StrFormat("pwritev %s at offset %d wrote 0 of %d bytes",
                                                     path, segment.offset + done, length - done));
        }
        done += static_cast<size_t>(n);  // a short write: resubmit the rest
      }
    }
    if (::fdatasync(fd) != 0) return ErrnoToStatus(errno, absl::StrFormat("fdatasync %s", path));
    return absl::OkStatus();
  }
  bool using_io_uring() const override { return false; }

 private:
  PwritevFunction pwritev_;
  AlignedBuffers buffers_;
};

class IoUringWriter final : public DirectWriter {
 public:
  explicit IoUringWriter(const DirectWriterOptions& options) : options_(options) {}
  ~IoUringWriter() override { CloseRing(); }

  absl::Status Init() {
    if (absl::Status s = buffers_.Allocate(options_.queue_depth, options_.buffer_bytes); !s.ok()) {
      return s;
    }
    return OpenRing();
  }

  absl::Status WriteAndSync(int fd, const std::string& path,
                            const std::vector<WriteSegment>& segments) override {
    if (absl::Status s = CheckSegments(segments, buffers_.bytes(), path); !s.ok()) return s;
    // SINGLE_ISSUER|DEFER_TASKRUN rings belong to the thread that set them up; a Persister may
    // move between threads (one at a time), so the ring follows it. (Should a kernel thread id be
    // reused after a pid wrap, submission fails with EEXIST, the ring is closed, and the next
    // call opens a new one.)
    if (!ring_open_ || owner_ != ::gettid()) {
      CloseRing();
      if (absl::Status s = OpenRing(); !s.ok()) return s;
    }
    if (absl::Status s = WriteAll(fd, path, segments); !s.ok()) return s;
    return Fsync(fd, path);
  }
  bool using_io_uring() const override { return true; }

 private:
  struct Slot {
    uint64_t offset = 0;
    size_t length = 0;
    size_t done = 0;
  };

  absl::Status OpenRing() {
    const unsigned flag_chain[] = {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
                                   IORING_SETUP_COOP_TASKRUN, 0};
    int rc = -EINVAL;
    for (unsigned flags : flag_chain) {
      rc = io_uring_queue_init(static_cast<unsigned>(options_.queue_depth) + 1, &ring_, flags);
      if (rc != -EINVAL) break;  // EINVAL: this kernel lacks the flag; try the next set
    }
    if (rc == -EPERM || rc == -ENOSYS) {
      return absl::UnavailableError(absl::StrFormat("io_uring_queue_init: %s", std::strerror(-rc)));
    }
    if (rc < 0) return ErrnoToStatus(-rc, "io_uring_queue_init");
    ring_open_ = true;
    owner_ = ::gettid();
    std::vector<struct iovec> iovs(buffers_.count());
    for (int i = 0; i < buffers_.count(); ++i) iovs[i] = {buffers_.at(i), buffers_.bytes()};
    // Registration pins the pages (RLIMIT_MEMLOCK); without it plain WRITEs from the same
    // buffers work, a little slower.
    fixed_ =
        io_uring_register_buffers(&ring_, iovs.data(), static_cast<unsigned>(iovs.size())) == 0;
    return absl::OkStatus();
  }

  void CloseRing() {
    if (ring_open_) io_uring_queue_exit(&ring_);
    ring_open_ = false;
  }

  void Queue(int fd, int slot_index, const Slot& slot) {
    struct io_uring_sqe* sqe = io_uring_get_sqe(&ring_);  // never null: entries > queue depth
    char* from = buffers_.at(slot_index) + slot.done;
    const unsigned length = static_cast<unsigned>(slot.length - slot.done);
    if (fixed_) {
      io_uring_prep_write_fixed(sqe, fd, from, length, slot.offset + slot.done, slot_index);
    } else {
      io_uring_prep_write(sqe, fd, from, length, slot.offset + slot.done);
    }
    io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(slot_index));
  }

  // Submits what is queued and waits for at least one completion, within the stall deadline. An
  // error here leaves the ring in an unknown state: it is closed, and reopened on the next call.
  absl::Status SubmitAndWait(const std::string& path, struct io_uring_cqe** cqe) {
    for (;;) {
      int rc = io_uring_submit(&ring_);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        CloseRing();
        return ErrnoToStatus(-rc, absl::StrFormat("io_uring_submit for %s", path));
      }
      struct __kernel_timespec ts = {kStallSeconds, 0};
      rc = io_uring_wait_cqe_timeout(&ring_, cqe, &ts);
      if (rc == 0) return absl::OkStatus();
      if (rc == -EINTR || rc == -EAGAIN) continue;
      CloseRing();
      if (rc == -ETIME) {
        return absl::DeadlineExceededError(
            absl::StrFormat("write %s: no io_uring completion for %d s", path, kStallSeconds));
      }
      return ErrnoToStatus(-rc, absl::StrFormat("io_uring_wait_cqe for %s", path));
    }
  }

  absl::Status WriteAll(int fd, const std::string& path,
                        const std::vector<WriteSegment>& segments) {
    std::vector<Slot> slots(buffers_.count());
    std::vector<int> free_slots;
    for (int i = buffers_.count() - 1; i >= 0; --i) free_slots.push_back(i);
    absl::Status first_error;
    size_t next = 0;
    int in_flight = 0;
    for (;;) {
      while (first_error.ok() && next < segments.size() && !free_slots.empty()) {
        const int i = free_slots.back();
        free_slots.pop_back();
        slots[i] = {segments[next].offset, buffers_.Fill(i, segments[next].data), 0};
        Queue(fd, i, slots[i]);
        ++next;
        ++in_flight;
      }
      if (in_flight == 0) break;
      struct io_uring_cqe* cqe = nullptr;
      if (absl::Status s = SubmitAndWait(path, &cqe); !s.ok()) return s;
      do {
        const int i = static_cast<int>(io_uring_cqe_get_data64(cqe));
        const int res = cqe->res;
        io_uring_cqe_seen(&ring_, cqe);
        Slot& slot = slots[i];
        bool finished = true;
        if (res < 0) {
          if (first_error.ok()) {
            first_error = ErrnoToStatus(
                -res, absl::StrFormat("write %s at offset %d (%d bytes)", path,
                                      slot.offset + slot.done, slot.length - slot.done));
          }
        } else if (res == 0) {
          if (first_error.ok()) {
            first_error = absl::DataLossError(
                absl::StrFormat("write %s at offset %d wrote 0 of %d bytes", path,
                                slot.offset + slot.done, slot.length - slot.done));
          }
        } else {
          slot.done += static_cast<size_t>(res);
          if (slot.done < slot.length && first_error.ok()) {  // a short write: resubmit the rest
            Queue(fd, i, slot);
            finished = false;
          }
        }
        if (finished) {
          free_slots.push_back(i);
          --in_flight;
        }
      } while (io_uring_peek_cqe(&ring_, &cqe) == 0);
    }
    return first_error;
  }

  absl::Status Fsync(int fd, const std::string& path) {
    struct io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
    io_uring_sqe_set_data64(sqe, 0);
    struct io_uring_cqe* cqe = nullptr;
    if (absl::Status s = SubmitAndWait(path, &cqe); !s.ok()) return s;
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    if (res < 0) return ErrnoToStatus(-res, absl::StrFormat("fdatasync %s", path));
    return absl::OkStatus();
  }

  const DirectWriterOptions options_;
  AlignedBuffers buffers_;
  struct io_uring ring_ {};
  bool ring_open_ = false;
  bool fixed_ = false;
  pid_t owner_ = 0;  // kernel thread id: std::thread::id values are reused at once
};

Mutex factory_mu;
DirectWriterFactory* test_factory ABSL_GUARDED_BY(factory_mu) = nullptr;

}  // namespace

absl::StatusOr<std::unique_ptr<DirectWriter>> NewIoUringWriter(const DirectWriterOptions& options) {
  auto writer = std::make_unique<IoUringWriter>(options);
  if (absl::Status s = writer->Init(); !s.ok()) return s;
  return writer;
}

absl::StatusOr<std::unique_ptr<DirectWriter>> NewPwritevWriter(const DirectWriterOptions& options,
                                                               PwritevFunction pwritev_fn) {
  auto writer = std::make_unique<PwritevWriter>(std::move(pwritev_fn));
  if (absl::Status s = writer->Init(options); !s.ok()) return s;
  return writer;
}

ScopedDirectWriterFactoryForTesting::ScopedDirectWriterFactoryForTesting(
    DirectWriterFactory factory) {
  MutexLock lock(&factory_mu);
  test_factory = new DirectWriterFactory(std::move(factory));
}

ScopedDirectWriterFactoryForTesting::~ScopedDirectWriterFactoryForTesting() {
  MutexLock lock(&factory_mu);
  delete test_factory;
  test_factory = nullptr;
}

DirectWriterFactory DirectWriterFactoryForTesting() {
  MutexLock lock(&factory_mu);
  return test_factory == nullptr ? nullptr : *test_factory;
}

}  // namespace trainguard::checkpoint
