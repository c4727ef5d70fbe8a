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
#include <optional>
#include <span>
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

// The kinds of event trainguard itself writes as a `custom` or `checkpoint` event, told apart by
// their attribute `what` (docs/GUIDE.md, "Event kinds"). On disk such an event is what it always
// was, type custom (or checkpoint) with what=<EventKindName>, so files written before this enum
// existed read the same and `trainguard events --json` prints the same; in code every writer and
// reader goes through EventOfKind / KindOf instead of spelling the name. A user's own event
// (Runtime::EmitEvent) is custom with any `what`; one whose `what` is not a kind's name has no
// kind. step_done is the one kind the user's trainer writes, through EmitEvent: the progress
// `trainguard report` measures, so its name is a contract with user code (Python spells it as a
// string).
enum class EventKind {
  // The runtime, on a rank (type custom).
  kLauncherLost,           // the launcher that started this rank is gone: the rank leaves
  kGenerationEntryFailed,  // building a generation's communicator failed; attempts go on
  kJobStopUnpublished,     // the rank could not publish why it stops the job
  kFlightRecorderUnavailable,
  kHangPostponed,         // the watchdog waits on: `peer` is still busy
  kHangWithdrawn,         // a declared hang ended by itself (`waited_ms`); nothing aborted
  kGenerationSuperseded,  // a newer generation is published while this rank trains
  kSupersededStepExit,    // a step outlived its superseded generation: the rank exits
  kEvidenceDumped,        // flight recorder and stacks dumped on SIGUSR2 (`dump`)
  // The runtime's checkpointing (type checkpoint).
  kSaved,
  kSaveFailed,
  kProtected,  // every rank's snapshot is in memory with all its backups again
  kReprotectFailed,
  kPlacementClassesDropped,  // backup placement could not honour every eviction class
  kSkipped,                  // a due checkpoint was not taken
  kFenceFailed,
  kRestored,  // `source`, `fingerprint`, `skipped`
  kNothingToRestore,
  kRestoreFailed,
  // A data-parallel group's replicas disagreed at a snapshot (silent data corruption): `group`,
  // `ranks`, `corrupt_rank`, `corrupt_host`, `buffers`, `fingerprint`, `majority` (empty when
  // undecidable), `action` (repair, evict or alert). Written by the rank that judged the ballot.
  kSilentCorruption,
  // The launcher, in <run_dir>/events/launcher.tgev (type custom, source=launcher).
  kRankDied,          // `how`, `pid`, `killed_by_launcher`
  kRankUnresponsive,  // killed: its heartbeat went stale, or stopped in formation
  kHangSuspect,       // killed: the culprit a hang's diagnosis named
  kRankReplaced,
  kHostReplaced,
  kHostLost,           // `host`
  kRecovered,          // the job trains again after a loss
  kRestartAll,         // --restart-all: every rank started again
  kGenerationRenewed,  // the same members met again in a new generation
  // `trainguard chaos`, in <run_dir>/events/chaos.tgev (type custom, source=chaos).
  kChaosRunStart,
  kChaosRunEnd,
  kChaosInject,  // a fault, recorded before it is done: `kind`, `pid`
  kChaosSkip,    // a planned fault that could not be done
  // The trainer, through Runtime::EmitEvent (type custom): a step that succeeded, with `pid`.
  kStepDone,
};

// Every kind, in declaration order.
std::span<const EventKind> AllEventKinds();

// The kind's name: its `what` in event files.
std::string_view EventKindName(EventKind kind);

// The type an event of `kind` is written with: kCheckpoint for the checkpointing kinds, else
// kCustom.
EventType EventTypeOf(EventKind kind);

// The kind named `name` (EventKindName's inverse); nullopt for any other name (a user's `what`).
std::optional<EventKind> ParseEventKind(std::string_view name);

// The kind of `event`: its `what` names a kind and its type is that kind's. nullopt for a user's
// own event and for every event of another type (step_fault, hang, ...).
std::optional<EventKind> KindOf(const Event& event);

// An event of `kind`: its type, and its attributes starting with what=<EventKindName(kind)>. The
// writer fills in the rest (time, step, more attributes after the first).
Event EventOfKind(EventKind kind, std::string message = {});

}  // namespace trainguard

#endif  // TRAINGUARD_EVENTS_H_
