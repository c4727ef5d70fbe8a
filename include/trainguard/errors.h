// The exception types a train-step body may throw to tell sdk::guard what kind of failure happened.
//
// The public C++ API of trainguard reports its own errors as absl::Status and never throws. These
// types exist for the user's body: the guard catches them (and anything else) and classifies them:
//
//   RecoverableError      -> FaultKind::kStepFailure            (the step can be skipped or
//   retried) CommunicationError    -> FaultKind::kCommunicationFailure   (peers must re-rendezvous)
//   DeviceError, sticky   -> FaultKind::kFatalDeviceError       (the device context is unusable)
//   DeviceError, other    -> FaultKind::kStepFailure            (e.g. an out-of-memory on one step)
//   anything else         -> FaultKind::kUnclassified           (treated as fatal: unknown is not
//   safe)
//
// TRAINGUARD_CUDA_CHECK and TRAINGUARD_NCCL_CHECK turn CUDA and NCCL return codes into DeviceError
// and CommunicationError. They expand to calls of the CUDA/NCCL API in the caller's translation
// unit, so the caller includes <cuda_runtime_api.h> or <nccl.h> itself; this header does not depend
// on either.
//
// Thread safety: these are plain value types.
#ifndef TRAINGUARD_ERRORS_H_
#define TRAINGUARD_ERRORS_H_

#include <stdexcept>
#include <string>

namespace trainguard {

// Throw this (or a subclass) from a step body for a failure that does not damage the process: a bad
// batch, a transient I/O error of the data loader, a loss that is not finite.
class RecoverableError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective or point-to-point operation failed or timed out. `peer` is the rank blamed, -1 if
// unknown.
class CommunicationError : public std::runtime_error {
 public:
  explicit CommunicationError(const std::string& what, int peer = -1)
      : std::runtime_error(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

// An error returned by a device API (CUDA runtime).
class DeviceError : public std::runtime_error {
 public:
  DeviceError(const std::string& what, int code, bool sticky)
      : std::runtime_error(what), code_(code), sticky_(sticky) {}
  // The cudaError_t value.
  int code() const { return code_; }
  // True when the error corrupts the CUDA context: every later CUDA call in this process fails too,
  // and only a new process recovers (cudaErrorIllegalAddress, cudaErrorLaunchFailure, an
  // uncorrectable ECC error, a device-side assert, ...).
  bool sticky() const { return sticky_; }

 private:
  int code_;
  bool sticky_;
};

// An error returned by NCCL. ncclUnhandledCudaError is a device fault and is classified as fatal;
// the others (system, internal, remote errors) are communication failures.
class NcclError : public CommunicationError {
 public:
  NcclError(const std::string& what, int code) : CommunicationError(what), code_(code) {}
  // The ncclResult_t value.
  int code() const { return code_; }
  bool is_device_fault() const;

 private:
  int code_;
};

// True for the cudaError_t codes that leave the CUDA context unusable. The table is checked against
// the CUDA headers at build time when CUDA is found.
bool IsStickyCudaError(int code);

// Used by the macros below. Always throw.
[[noreturn]] void ThrowCudaError(int code, const char* name, const char* description,
                                 const char* expression, const char* file, int line);
[[noreturn]] void ThrowNcclError(int code, const char* description, const char* expression,
                                 const char* file, int line);

}  // namespace trainguard

// Evaluates a CUDA runtime call; on failure throws trainguard::DeviceError naming the call and
// location. The failure is also taken out of the thread's last-error slot (cudaGetLastError), where
// CUDA leaves a non-sticky error such as an out-of-memory: otherwise the next step's first launch
// check would report it again and fail a step that did nothing wrong.
#define TRAINGUARD_CUDA_CHECK(expr)                                                             \
  do {                                                                                          \
    const cudaError_t trainguard_cuda_status_ = (expr);                                         \
    if (trainguard_cuda_status_ != cudaSuccess) {                                               \
      (void)cudaGetLastError();                                                                 \
      ::trainguard::ThrowCudaError(                                                             \
          static_cast<int>(trainguard_cuda_status_), cudaGetErrorName(trainguard_cuda_status_), \
          cudaGetErrorString(trainguard_cuda_status_), #expr, __FILE__, __LINE__);              \
    }                                                                                           \
  } while (0)

// Evaluates an NCCL call; on failure throws trainguard::NcclError naming the call and location.
#define TRAINGUARD_NCCL_CHECK(expr)                                                              \
  do {                                                                                           \
    const ncclResult_t trainguard_nccl_status_ = (expr);                                         \
    if (trainguard_nccl_status_ != ncclSuccess && trainguard_nccl_status_ != ncclInProgress) {   \
      ::trainguard::ThrowNcclError(static_cast<int>(trainguard_nccl_status_),                    \
                                   ncclGetErrorString(trainguard_nccl_status_), #expr, __FILE__, \
                                   __LINE__);                                                    \
    }                                                                                            \
  } while (0)

#endif  // TRAINGUARD_ERRORS_H_
