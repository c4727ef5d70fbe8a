// DirectWriter: the data path of the Persister. It copies segments of a shard into aligned buffers
// and writes them at aligned offsets of a file opened with O_DIRECT, then makes them durable
// (fdatasync). Two implementations produce identical files: io_uring with registered buffers and
// WRITE_FIXED at a queue depth, and pwritev on the same descriptor (the fallback where the kernel
// or a container profile refuses io_uring). Private to sdk/checkpoint; tests substitute their own
// through ScopedDirectWriterFactoryForTesting to inject I/O errors and short writes.
//
// Thread safety: a DirectWriter is used by one thread at a time.
#ifndef TRAINGUARD_SDK_CHECKPOINT_DIRECT_WRITER_H_
#define TRAINGUARD_SDK_CHECKPOINT_DIRECT_WRITER_H_

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainguard::checkpoint {

// `data` is written at `offset` (a multiple of 4096), zero-padded to a multiple of 4096.
struct WriteSegment {
  uint64_t offset = 0;
  absl::string_view data;  // REQUIRES: size() <= DirectWriterOptions::buffer_bytes
};

struct DirectWriterOptions {
  size_t buffer_bytes = 4 << 20;  // multiple of 4096: the largest segment
  int queue_depth = 16;           // buffers, hence writes in flight
};

class DirectWriter {
 public:
  DirectWriter() = default;
  DirectWriter(const DirectWriter&) = delete;
  DirectWriter& operator=(const DirectWriter&) = delete;
  virtual ~DirectWriter() = default;

  // Writes every segment into `fd` and fdatasyncs it. Any failed write fails the whole call (a
  // later successful fdatasync proves nothing about it); errors name `path`, the operation and the
  // file offset. ENOSPC reads ResourceExhausted.
  virtual absl::Status WriteAndSync(int fd, const std::string& path,
                                    const std::vector<WriteSegment>& segments) = 0;
  virtual bool using_io_uring() const = 0;
};

// Unavailable (with the reason) where io_uring_queue_init fails with EPERM or ENOSYS; other
// failures as they come.
absl::StatusOr<std::unique_ptr<DirectWriter>> NewIoUringWriter(const DirectWriterOptions& options);

// `pwritev_fn` replaces ::pwritev (tests inject short writes and errors; it returns -1 and sets
// errno, as pwritev does).
using PwritevFunction =
    std::function<ssize_t(int fd, const struct iovec* iov, int iovcnt, off_t offset)>;
absl::StatusOr<std::unique_ptr<DirectWriter>> NewPwritevWriter(
    const DirectWriterOptions& options, PwritevFunction pwritev_fn = nullptr);

// While one of these lives, every Persister created gets its data path from `factory` instead of
// io_uring/pwritev. Tests only; not nestable.
using DirectWriterFactory =
    std::function<absl::StatusOr<std::unique_ptr<DirectWriter>>(const DirectWriterOptions&)>;
class ScopedDirectWriterFactoryForTesting {
 public:
  explicit ScopedDirectWriterFactoryForTesting(DirectWriterFactory factory);
  ~ScopedDirectWriterFactoryForTesting();
  ScopedDirectWriterFactoryForTesting(const ScopedDirectWriterFactoryForTesting&) = delete;
  ScopedDirectWriterFactoryForTesting& operator=(const ScopedDirectWriterFactoryForTesting&) =
      delete;
};
// The factory installed by a live ScopedDirectWriterFactoryForTesting, or null.
DirectWriterFactory DirectWriterFactoryForTesting();

}  // namespace trainguard::checkpoint

#endif  // TRAINGUARD_SDK_CHECKPOINT_DIRECT_WRITER_H_
