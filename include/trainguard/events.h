// Events: the structured, per-rank record of what trainguard saw and decided.
//
// Each rank appends Events to its own file, <run_dir>/events/rank-<RRRRR>.tgev, so a crash of one
// rank never interleaves with another's records and the file survives the process. The on-disk
// format is documented in docs/FORMATS.md: an 8-byte header "TGEVLOG1", then records of
//     [u32 little-endian payload length][u32 little-endian XXH32 of the payload][payload]
// where the payload is a serialized trainguard.proto.Event (sdk/proto/event.proto). A process
// killed in the middle of a write leaves a torn final record: the reader reports it instead of
// misreading it, and the writer (sdk/core/event_log.h) moves it to a side file before appending, so
// one crash never hides later records and no byte is ever destroyed.
//
// Thread safety: ReadEventLog is a free function; Runtime::EmitEvent may be called from any thread.
#ifndef TRAINGUARD_EVENTS_H_
#define TRAINGUARD_EVENTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainguard {

class Env;

enum class EventType {
  kRuntimeStarted = 1,
  kRuntimeStopped = 2,
  kStepFault = 3,         // a guarded step failed; attributes carry the classification and evidence
  kRecoveryDecision = 4,  // what recover() decided for a failed step
  kCustom = 5,            // emitted by the user through Runtime::EmitEvent
  kCheckpoint = 6,        // a checkpoint was saved (or failed to be), or state was restored
  kHang = 7,              // the watchdog declared a hang; attributes carry the evidence
  // The coordinator's fail-slow detector confirmed a degraded host (rank -1; written by the
  // coordinating agent to <run_dir>/events/agent-<host>.tgev): attributes host, metric, z,
  // deviation, value, peers_median, windows, continuity_s, hosts, action.
  kSuspectHost = 8,
};

// "runtime_started", "step_fault", ...
std::string_view EventTypeName(EventType type);

struct Event {
  absl::Time time = absl::InfinitePast();  // InfinitePast: filled in by Runtime::EmitEvent
  int rank = -1;
  int64_t step = -1;  // -1 when not tied to a step
  int64_t generation = 0;
  EventType type = EventType::kCustom;
  std::string message;
  std::vector<std::pair<std::string, std::string>> attributes;

  // The value of attribute `key`, or "" when absent.
  std::string_view Attribute(std::string_view key) const;
};

struct EventLogContents {
  std::vector<Event> events;  // every complete, verified record, in file order
  // OK, or DataLoss "…: torn final record at offset N (M bytes)" when the file ends inside a
  // record.
  absl::Status tail;
};

// Reads every record. A corrupt header or a corrupt record followed by more data fails with
// DataLoss naming the path and byte offset; a torn final record is reported in `tail`.
absl::StatusOr<EventLogContents> ReadEventLog(Env* env, const std::string& path);

// `event` as one line of JSON: its trainguard.proto.Event record in the proto3 JSON mapping
// (docs/FORMATS.md, "JSON output"), as `trainguard events --json` prints it.
absl::StatusOr<std::string> EventToJson(const Event& event);

// <run_dir>/events/rank-<rank, 5 digits>.tgev
std::string EventLogPath(std::string_view run_dir, int rank);

}  // namespace trainguard

#endif  // TRAINGUARD_EVENTS_H_
