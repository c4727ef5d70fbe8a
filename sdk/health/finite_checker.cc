// FiniteChecker: a fixed table of checks, each tied to one result slot. A slot is taken by Check(),
// freed by the Collect() that reports it finished (or by Reset()), and, for a CUDA check, tied to
// an event recorded after its kernel: Collect() asks the event, never the stream, whether the
// kernel is done, so it cannot block.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "trainguard/checkpoint.h"
#include "trainguard/health.h"

#if defined(TRAINGUARD_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "sdk/health/finite_kernels.h"
#endif

namespace trainguard {
namespace {

// The result slot's layout without CUDA (with CUDA, health_internal::FiniteSlot is the same).
struct HostSlot {
  unsigned int kinds;
  unsigned int reserved;
  unsigned long long nonfinite;
  unsigned long long first_bad;
};

enum class SlotState {
  kFree,
  kDone,       // a host check: `result` holds its outcome
  kQueued,     // a CUDA check: its kernel's outcome lands in the slot once `event` completes
  kAbandoned,  // a CUDA check dropped by Reset(): free once `event` completes
};

bool IsFloat(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 ||
         dtype == DType::kF64;
}

}  // namespace

struct FiniteChecker::Slots {
  struct Entry {
    SlotState state = SlotState::kFree;
    std::string buffer_name;
    DType dtype = DType::kF32;
    Device device;
    size_t count = 0;
    FiniteCheckResult result;
    void* event = nullptr;  // a cudaEvent_t, created on first use on `event_device`
    int event_device = -1;
  };

  std::vector<Entry> entries;
  std::vector<int> order;  // entries not yet collected, in the order of their Check()
  HostSlot* host_slots = nullptr;
  bool pinned = false;              // host_slots came from cudaHostAlloc
  std::vector<int> max_blocks;      // per CUDA device ordinal: grid bound for the kernels
  std::unique_ptr<HostSlot[]> own;  // host_slots when not pinned

  ~Slots();
  // The index of a free entry, reclaiming abandoned ones whose kernels have finished; -1 if none.
  int FreeEntry();
  // Whether the CUDA work before `entry.event` is done (true for an entry with no event).
  absl::StatusOr<bool> Finished(const Entry& entry) const;
};

#if defined(TRAINGUARD_HAVE_CUDA)
namespace {

absl::Status CudaError(cudaError_t error, std::string_view operation, std::string_view buffer,
                       int ordinal) {
  return absl::InternalError(
      absl::StrFormat("finite check of buffer '%s' on CUDA device %d: %s: %s (%s)", buffer, ordinal,
                      operation, cudaGetErrorName(error), cudaGetErrorString(error)));
}

health_internal::FiniteFormat FormatOf(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return health_internal::FiniteFormat::kF16;
    case DType::kBF16:
      return health_internal::FiniteFormat::kBF16;
    case DType::kF64:
      return health_internal::FiniteFormat::kF64;
    default:
      return health_internal::FiniteFormat::kF32;
  }
}

// Makes `ordinal` the current device for the scope and restores the caller's afterwards.
class ScopedDevice {
 public:
  explicit ScopedDevice(int ordinal) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != ordinal) {
      status_ = cudaSetDevice(ordinal);
      restore_ = status_ == cudaSuccess;
    }
  }
  ~ScopedDevice() {
    if (restore_) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = 0;
  bool restore_ = false;
  cudaError_t status_ = cudaSuccess;
};

}  // namespace
#endif

FiniteChecker::Slots::~Slots() {
  bool running = false;
  for (Entry& entry : entries) {
    if (entry.event == nullptr) continue;
    absl::StatusOr<bool> finished = Finished(entry);
    // A failed query means a broken context: no kernel of it will write any more.
    if (finished.ok() && !*finished) running = true;
#if defined(TRAINGUARD_HAVE_CUDA)
    // Released by CUDA once the event completes, even if it has not yet.
    cudaEventDestroy(static_cast<cudaEvent_t>(entry.event));
#endif
  }
#if defined(TRAINGUARD_HAVE_CUDA)
  // Freeing pinned memory a kernel still writes to would corrupt whatever reuses it; a hung stream
  // costs these few bytes instead.
  if (pinned && !running) cudaFreeHost(host_slots);
#else
  (void)running;
#endif
}

int FiniteChecker::Slots::FreeEntry() {
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].state == SlotState::kFree) return static_cast<int>(i);
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].state != SlotState::kAbandoned) continue;
    absl::StatusOr<bool> finished = Finished(entries[i]);
    if (!finished.ok() || *finished) {
      entries[i].state = SlotState::kFree;
      return static_cast<int>(i);
    }
  }
  return -1;
}

absl::StatusOr<bool> FiniteChecker::Slots::Finished(const Entry& entry) const {
  if (entry.state != SlotState::kQueued && entry.state != SlotState::kAbandoned) return true;
#if defined(TRAINGUARD_HAVE_CUDA)
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(entry.event));
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) return false;
  return CudaError(e, "cudaEventQuery", entry.buffer_name, entry.device.index);
#else
  return true;
#endif
}

FiniteChecker::FiniteChecker(std::unique_ptr<Slots> slots) : slots_(std::move(slots)) {}
FiniteChecker::~FiniteChecker() = default;

absl::StatusOr<std::unique_ptr<FiniteChecker>> FiniteChecker::Create(int max_checks_per_step) {
  if (max_checks_per_step < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "FiniteChecker: max_checks_per_step must be at least 1, got %d", max_checks_per_step));
  }
  auto slots = std::make_unique<Slots>();
  const size_t n = static_cast<size_t>(max_checks_per_step);
  slots->entries.resize(n);
  slots->order.reserve(n);
#if defined(TRAINGUARD_HAVE_CUDA)
  static_assert(sizeof(HostSlot) == sizeof(health_internal::FiniteSlot));
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    devices = 0;
    cudaGetLastError();  // no driver or no device: not an error for a host-only checker
  }
  if (devices > 0) {
    void* pinned = nullptr;
    if (cudaError_t e = cudaHostAlloc(&pinned, n * sizeof(HostSlot),
                                      cudaHostAllocMapped | cudaHostAllocPortable);
        e != cudaSuccess) {
      return absl::InternalError(
          absl::StrFormat("FiniteChecker: cudaHostAlloc of %d result slots: %s (%s)", n,
                          cudaGetErrorName(e), cudaGetErrorString(e)));
    }
    slots->host_slots = static_cast<HostSlot*>(pinned);
    slots->pinned = true;
    slots->max_blocks.assign(static_cast<size_t>(devices), 0);
    for (int d = 0; d < devices; ++d) {
      int multiprocessors = 0;
      if (cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, d) !=
          cudaSuccess) {
        multiprocessors = 16;
      }
      slots->max_blocks[static_cast<size_t>(d)] = 8 * multiprocessors;
    }
  }
#endif
  if (!slots->pinned) {
    slots->own = std::make_unique<HostSlot[]>(n);
    slots->host_slots = slots->own.get();
  }
  return std::unique_ptr<FiniteChecker>(new FiniteChecker(std::move(slots)));
}

absl::Status FiniteChecker::Check(std::string_view buffer_name, const void* data, size_t count,
                                  DType dtype, Device device, void* cuda_stream) {
  if (data == nullptr && count != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "finite check of buffer '%s': null data for %d elements", buffer_name, count));
  }
  const bool on_cuda = device.kind == Device::Kind::kCuda;
  if (on_cuda && !has_cuda()) {
#if defined(TRAINGUARD_HAVE_CUDA)
    constexpr const char* kWhy = "no CUDA device was present at FiniteChecker::Create()";
#else
    constexpr const char* kWhy = "trainguard was built without CUDA";
#endif
    return absl::FailedPreconditionError(absl::StrFormat(
        "finite check of buffer '%s' on CUDA device %d: %s", buffer_name, device.index, kWhy));
  }
  if (on_cuda &&
      (device.index < 0 || static_cast<size_t>(device.index) >= slots_->max_blocks.size())) {
    return absl::InvalidArgumentError(
        absl::StrFormat("finite check of buffer '%s': no CUDA device %d (%d present)", buffer_name,
                        device.index, slots_->max_blocks.size()));
  }
  const int index = slots_->FreeEntry();
  if (index < 0) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "finite check of buffer '%s': all %d slots hold checks not yet collected (call Collect() "
        "at each step boundary, or create the FiniteChecker with more)",
        buffer_name, capacity()));
  }
  Slots::Entry& entry = slots_->entries[static_cast<size_t>(index)];
  entry.buffer_name.assign(buffer_name.data(), buffer_name.size());
  entry.dtype = dtype;
  entry.device = device;
  entry.count = count;
  entry.result = {};

  if (!on_cuda || count == 0 || !IsFloat(dtype)) {
    if (!on_cuda) entry.result = CheckFiniteHost(data, count, dtype);
    entry.state = SlotState::kDone;
    slots_->order.push_back(index);
    return absl::OkStatus();
  }
#if defined(TRAINGUARD_HAVE_CUDA)
  ScopedDevice scoped(device.index);
  if (scoped.status() != cudaSuccess) {
    return CudaError(scoped.status(), "cudaSetDevice", buffer_name, device.index);
  }
  if (entry.event == nullptr || entry.event_device != device.index) {
    if (entry.event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(entry.event));
    entry.event = nullptr;
    cudaEvent_t event = nullptr;
    if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
        e != cudaSuccess) {
      return CudaError(e, "cudaEventCreateWithFlags", buffer_name, device.index);
    }
    entry.event = event;
    entry.event_device = device.index;
  }
  volatile HostSlot* slot = &slots_->host_slots[index];
  slot->kinds = 0;
  slot->nonfinite = 0;
  slot->first_bad = health_internal::kNoBadIndex;
  // The slot is reset before the launch: the driver's launch path fences the CPU's stores before it
  // rings the device's doorbell; the compiler must not sink the volatile stores past the call
  // either. (A thread fence here is also refused by GCC under ThreadSanitizer.)
  std::atomic_signal_fence(std::memory_order_seq_cst);
  auto* stream = static_cast<cudaStream_t>(cuda_stream);
  // With unified addressing (every 64-bit platform CUDA supports) a mapped, portable allocation
  // has the same address on the host and on every device.
  auto* device_slot = reinterpret_cast<health_internal::FiniteSlot*>(&slots_->host_slots[index]);
  if (cudaError_t e = health_internal::LaunchFiniteCheck(
          data, count, FormatOf(dtype), device_slot,
          slots_->max_blocks[static_cast<size_t>(device.index)], stream);
      e != cudaSuccess) {
    return CudaError(
        e, absl::StrFormat("launching the check of %d %s elements", count, DTypeName(dtype)),
        buffer_name, device.index);
  }
  if (cudaError_t e = cudaEventRecord(static_cast<cudaEvent_t>(entry.event), stream);
      e != cudaSuccess) {
    // The kernel is queued but cannot be tracked: keep the slot out of use until the process ends
    // rather than let a later check share it.
    entry.state = SlotState::kAbandoned;
    return CudaError(e, "cudaEventRecord", buffer_name, device.index);
  }
  entry.state = SlotState::kQueued;
  slots_->order.push_back(index);
  return absl::OkStatus();
#else
  (void)cuda_stream;
  return absl::InternalError("unreachable: a CUDA check without CUDA");
#endif
}

absl::StatusOr<std::vector<BufferCheck>> FiniteChecker::Collect() {
  // First ask every event, so that an error leaves the finished checks to the next Collect().
  std::vector<BufferCheck> checks;
  checks.reserve(slots_->order.size());
  for (auto it = slots_->order.begin(); it != slots_->order.end(); ++it) {
    Slots::Entry& entry = slots_->entries[static_cast<size_t>(*it)];
    absl::StatusOr<bool> finished = slots_->Finished(entry);
    if (!finished.ok()) {
      entry.state = SlotState::kFree;
      slots_->order.erase(it);
      return finished.status();
    }
    BufferCheck check;
    check.buffer_name = entry.buffer_name;
    check.dtype = entry.dtype;
    check.device = entry.device;
    check.count = entry.count;
    check.pending = !*finished;
    if (entry.state == SlotState::kDone) {
      check.result = entry.result;
    } else if (*finished) {
      const volatile HostSlot& slot = slots_->host_slots[*it];
      check.result.nonfinite_count = static_cast<size_t>(slot.nonfinite);
      if (check.result.nonfinite_count != 0) {
        check.result.first_bad_index = static_cast<int64_t>(slot.first_bad);
      }
      check.result.has_nan = (slot.kinds & 1u) != 0;
      check.result.has_inf = (slot.kinds & 2u) != 0;
    }
    checks.push_back(std::move(check));
  }
  size_t kept = 0;
  for (size_t i = 0; i < checks.size(); ++i) {
    const int index = slots_->order[i];
    if (checks[i].pending) {
      slots_->order[kept++] = index;
    } else {
      slots_->entries[static_cast<size_t>(index)].state = SlotState::kFree;
    }
  }
  slots_->order.resize(kept);
  return checks;
}

void FiniteChecker::Reset() {
  for (int index : slots_->order) {
    Slots::Entry& entry = slots_->entries[static_cast<size_t>(index)];
    entry.state = entry.state == SlotState::kQueued ? SlotState::kAbandoned : SlotState::kFree;
  }
  slots_->order.clear();
}

int FiniteChecker::outstanding() const { return static_cast<int>(slots_->order.size()); }
int FiniteChecker::capacity() const { return static_cast<int>(slots_->entries.size()); }
bool FiniteChecker::has_cuda() const { return slots_->pinned; }

}  // namespace trainguard
