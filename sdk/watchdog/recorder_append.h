// AppendToRecorder: FlightRecorder::Append for the watchdog's two writers (private to
// sdk/watchdog).
//
// FlightRecorder::Append is single-writer. The Watchdog and CollectiveTracker append from the
// training thread (phases, collectives entered and left) and from the watchdog's monitor thread
// (kHang, and kCollectiveEnd for GPU collectives, whose completion only the monitor's event polling
// sees). Every append of this folder goes through this function, which serialises them with one
// process-wide spin lock held for the O(1) copy of one 128-byte record. The monitor appends rarely
// (a hang, a finished GPU collective), so the training thread almost never waits for it. Other
// writers of the same recorder (the guard's step records) must take part in this serialisation or
// the FlightRecorder must become multi-writer.
//
// Thread safety: any thread.
#ifndef TRAINGUARD_SDK_WATCHDOG_RECORDER_APPEND_H_
#define TRAINGUARD_SDK_WATCHDOG_RECORDER_APPEND_H_

#include <cstdint>
#include <string_view>

#include "trainguard/flight_recorder.h"

namespace trainguard {
namespace watchdog_internal {

// Appends `record` to `recorder` (no-op when null).
void AppendToRecorder(FlightRecorder* recorder, const FlightRecord& record);

// Copies `name` into record.name, truncated to 63 bytes, NUL-terminated.
void SetRecordName(FlightRecord& record, std::string_view name);

}  // namespace watchdog_internal
}  // namespace trainguard

#endif  // TRAINGUARD_SDK_WATCHDOG_RECORDER_APPEND_H_
