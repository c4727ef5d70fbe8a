// Classification of CUDA and NCCL return codes. The numeric codes are part of CUDA's and NCCL's
// ABI; when their headers are available the table is checked against them at compile time, so a
// renumbering in a new toolkit breaks the build instead of misclassifying a fault.
#include <string>

#include "absl/strings/str_cat.h"
#include "trainguard/errors.h"

#if defined(TRAINGUARD_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif
#if defined(TRAINGUARD_HAVE_NCCL)
#include <nccl.h>
#endif

namespace trainguard {
namespace {

// cudaError_t values after which the CUDA context is corrupt ("sticky" errors: every later call in
// the process returns the same error, see the CUDA runtime API documentation of each).
constexpr int kEccUncorrectable = 214;
constexpr int kHardwareStackError = 714;
constexpr int kIllegalInstruction = 715;
constexpr int kMisalignedAddress = 716;
constexpr int kInvalidAddressSpace = 717;
constexpr int kInvalidPc = 718;
constexpr int kLaunchFailure = 719;
constexpr int kIllegalAddress = 700;
constexpr int kLaunchTimeout = 702;
constexpr int kAssert = 710;
constexpr int kContextIsDestroyed = 709;
constexpr int kUnknown = 999;

#if defined(TRAINGUARD_HAVE_CUDA)
static_assert(kEccUncorrectable == static_cast<int>(cudaErrorECCUncorrectable));
static_assert(kHardwareStackError == static_cast<int>(cudaErrorHardwareStackError));
static_assert(kIllegalInstruction == static_cast<int>(cudaErrorIllegalInstruction));
static_assert(kMisalignedAddress == static_cast<int>(cudaErrorMisalignedAddress));
static_assert(kInvalidAddressSpace == static_cast<int>(cudaErrorInvalidAddressSpace));
static_assert(kInvalidPc == static_cast<int>(cudaErrorInvalidPc));
static_assert(kLaunchFailure == static_cast<int>(cudaErrorLaunchFailure));
static_assert(kIllegalAddress == static_cast<int>(cudaErrorIllegalAddress));
static_assert(kLaunchTimeout == static_cast<int>(cudaErrorLaunchTimeout));
static_assert(kAssert == static_cast<int>(cudaErrorAssert));
static_assert(kContextIsDestroyed == static_cast<int>(cudaErrorContextIsDestroyed));
static_assert(kUnknown == static_cast<int>(cudaErrorUnknown));
#endif

// ncclResult_t values.
constexpr int kNcclUnhandledCudaError = 1;
constexpr int kNcclSystemError = 2;
constexpr int kNcclInternalError = 3;
constexpr int kNcclInvalidArgument = 4;
constexpr int kNcclInvalidUsage = 5;
constexpr int kNcclRemoteError = 6;

#if defined(TRAINGUARD_HAVE_NCCL)
static_assert(kNcclUnhandledCudaError == static_cast<int>(ncclUnhandledCudaError));
static_assert(kNcclSystemError == static_cast<int>(ncclSystemError));
static_assert(kNcclInternalError == static_cast<int>(ncclInternalError));
static_assert(kNcclInvalidArgument == static_cast<int>(ncclInvalidArgument));
static_assert(kNcclInvalidUsage == static_cast<int>(ncclInvalidUsage));
static_assert(kNcclRemoteError == static_cast<int>(ncclRemoteError));
#endif

}  // namespace

bool IsStickyCudaError(int code) {
  switch (code) {
    case kEccUncorrectable:
    case kHardwareStackError:
    case kIllegalInstruction:
    case kMisalignedAddress:
    case kInvalidAddressSpace:
    case kInvalidPc:
    case kLaunchFailure:
    case kIllegalAddress:
    case kLaunchTimeout:
    case kAssert:
    case kContextIsDestroyed:
    case kUnknown:
      return true;
    default:
      return false;
  }
}

bool NcclError::is_device_fault() const { return code_ == kNcclUnhandledCudaError; }

void ThrowCudaError(int code, const char* name, const char* description, const char* expression,
                    const char* file, int line) {
  throw DeviceError(absl::StrCat(expression, " failed at ", file, ":", line, ": ", name, " (", code,
                                 "): ", description),
                    code, IsStickyCudaError(code));
}

void ThrowNcclError(int code, const char* description, const char* expression, const char* file,
                    int line) {
  throw NcclError(absl::StrCat(expression, " failed at ", file, ":", line, ": NCCL error ", code,
                               ": ", description),
                  code);
}

}  // namespace trainguard
