// The one rule for job ids (private to sdk/; any subsystem may include it, sdk/core being the
// bottom layer).
//
// A job id becomes a path component (run and checkpoint directories), part of POSIX shared-memory
// segment names ("/trainguard.<job_id>.fr.rank<R>", at most NAME_MAX bytes), one level of the
// etcd key space and a field of the TcpStore handshake. So it is 1 to kMaxJobIdBytes characters of
// A-Z a-z 0-9 . _ -, and neither "." nor "..". Options::Validate, the FlightRecorder, the
// Snapshotter, the EtcdStore and both ends of the TcpStore check it with ValidateJobId, so an id
// accepted by one is accepted by all.
#ifndef TRAINGUARD_SDK_CORE_JOB_ID_H_
#define TRAINGUARD_SDK_CORE_JOB_ID_H_

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"

namespace trainguard {

// Leaves room for the longest segment-name decoration within NAME_MAX (255).
inline constexpr size_t kMaxJobIdBytes = 200;

// InvalidArgument naming the offending character and its position (or the length) unless
// `job_id` follows the rule above. The message starts with "job_id"; callers prefix their context.
// A rejected id is quoted C-escaped, so bytes received from the network print safely.
absl::Status ValidateJobId(std::string_view job_id);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CORE_JOB_ID_H_
