// SetRecordName: fills FlightRecord::name from any string, for the watchdog's kHang records
// (private to sdk/watchdog). Phase and op names come from their NameTable instead, copied whole
// (NameTable::CopyPadded), which is cheaper on the training thread's hot path.
//
// The Watchdog and the CollectiveTracker append straight to the FlightRecorder, from the training
// thread (phases, collectives entered and left) and from the watchdog's monitor thread (kHang, and
// kCollectiveEnd for GPU collectives, whose completion only the monitor's event polling sees):
// FlightRecorder::Append is lock-free and safe for concurrent writers, so neither thread ever waits
// for the other.
//
// Thread safety: any thread (it only writes the record it is given).
#ifndef TRAINGUARD_SDK_WATCHDOG_RECORDER_APPEND_H_
#define TRAINGUARD_SDK_WATCHDOG_RECORDER_APPEND_H_

#include <string_view>

#include "sdk/watchdog/flight_recorder.h"

namespace trainguard {
namespace watchdog_internal {

// Copies `name` into record.name, truncated to 63 bytes, NUL-terminated.
void SetRecordName(FlightRecord& record, std::string_view name);

}  // namespace watchdog_internal
}  // namespace trainguard

#endif  // TRAINGUARD_SDK_WATCHDOG_RECORDER_APPEND_H_
