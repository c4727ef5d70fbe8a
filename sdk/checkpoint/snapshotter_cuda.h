// DeviceCopier: the CUDA half of the Snapshotter (private to sdk/checkpoint; compiled only when
// trainguard is built with CUDA). It pins the arena's payloads once (cudaHostRegister) and copies
// between device buffers and the arena on one dedicated non-blocking stream per device, each copy
// followed by an event the calling worker polls, with a deadline.
//
// Thread safety: the copy methods may be called from several worker threads at once.
#ifndef TRAINGUARD_SDK_CHECKPOINT_SNAPSHOTTER_CUDA_H_
#define TRAINGUARD_SDK_CHECKPOINT_SNAPSHOTTER_CUDA_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/checkpoint/snapshotter.h"

namespace trainguard {
namespace checkpoint_internal {

class DeviceCopier {
 public:
  // Registers [host, host + bytes) with CUDA and creates a stream on each of `ordinals`.
  static absl::StatusOr<std::unique_ptr<DeviceCopier>> Create(void* host, size_t bytes,
                                                              const std::vector<int>& ordinals);
  // Waits for the streams, destroys them and unregisters the host memory.
  ~DeviceCopier();
  DeviceCopier(const DeviceCopier&) = delete;
  DeviceCopier& operator=(const DeviceCopier&) = delete;

  // Copies `bytes` from device `ordinal` to pinned `host` and returns once they have landed, or
  // DeadlineExceeded after `timeout`.
  absl::Status CopyToHost(int ordinal, void* host, const void* device, size_t bytes,
                          absl::Duration timeout);
  absl::Status CopyToDevice(int ordinal, void* device, const void* host, size_t bytes,
                            absl::Duration timeout);

 private:
  struct Stream;
  DeviceCopier() = default;
  absl::Status Copy(int ordinal, void* dst, const void* src, size_t bytes, bool to_host,
                    absl::Duration timeout);

  void* host_ = nullptr;
  bool registered_ = false;
  std::vector<std::unique_ptr<Stream>> streams_;
};

}  // namespace checkpoint_internal
}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_SNAPSHOTTER_CUDA_H_
