// The one table of the event kinds trainguard writes (include/trainguard/events.h): each kind's
// `what` and type. The names are part of the event file format (docs/FORMATS.md): old files must
// keep reading the same, so a name is never changed, only added.
#include <array>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "trainguard/events.h"

namespace trainguard {
namespace {

struct KindEntry {
  EventKind kind;
  std::string_view name;
  EventType type;
};

constexpr EventType kCustom = EventType::kCustom;
constexpr EventType kCheckpoint = EventType::kCheckpoint;

// In declaration order: entry i is kind i (checked below), so a lookup by kind is an index.
constexpr std::array kKinds = {
    KindEntry{EventKind::kLauncherLost, "launcher_lost", kCustom},
    KindEntry{EventKind::kGenerationEntryFailed, "generation_entry_failed", kCustom},
    KindEntry{EventKind::kJobStopUnpublished, "job_stop_unpublished", kCustom},
    KindEntry{EventKind::kFlightRecorderUnavailable, "flight_recorder_unavailable", kCustom},
    KindEntry{EventKind::kHangPostponed, "hang_postponed", kCustom},
    KindEntry{EventKind::kHangWithdrawn, "hang_withdrawn", kCustom},
    KindEntry{EventKind::kGenerationSuperseded, "generation_superseded", kCustom},
    KindEntry{EventKind::kSupersededStepExit, "superseded_step_exit", kCustom},
    KindEntry{EventKind::kEvidenceDumped, "evidence_dumped", kCustom},
    KindEntry{EventKind::kSaved, "saved", kCheckpoint},
    KindEntry{EventKind::kSaveFailed, "save_failed", kCheckpoint},
    KindEntry{EventKind::kProtected, "protected", kCheckpoint},
    KindEntry{EventKind::kReprotectFailed, "reprotect_failed", kCheckpoint},
    KindEntry{EventKind::kPlacementClassesDropped, "placement_classes_dropped", kCheckpoint},
    KindEntry{EventKind::kSkipped, "skipped", kCheckpoint},
    KindEntry{EventKind::kFenceFailed, "fence_failed", kCheckpoint},
    KindEntry{EventKind::kRestored, "restored", kCheckpoint},
    KindEntry{EventKind::kNothingToRestore, "nothing_to_restore", kCheckpoint},
    KindEntry{EventKind::kRestoreFailed, "restore_failed", kCheckpoint},
    KindEntry{EventKind::kSilentCorruption, "silent_corruption", kCheckpoint},
    KindEntry{EventKind::kRankDied, "rank_died", kCustom},
    KindEntry{EventKind::kRankUnresponsive, "rank_unresponsive", kCustom},
    KindEntry{EventKind::kHangSuspect, "hang_suspect", kCustom},
    KindEntry{EventKind::kRankReplaced, "rank_replaced", kCustom},
    KindEntry{EventKind::kHostReplaced, "host_replaced", kCustom},
    KindEntry{EventKind::kHostLost, "host_lost", kCustom},
    KindEntry{EventKind::kRecovered, "recovered", kCustom},
    KindEntry{EventKind::kRestartAll, "restart_all", kCustom},
    KindEntry{EventKind::kGenerationRenewed, "generation_renewed", kCustom},
    KindEntry{EventKind::kChaosRunStart, "chaos_run_start", kCustom},
    KindEntry{EventKind::kChaosRunEnd, "chaos_run_end", kCustom},
    KindEntry{EventKind::kChaosInject, "chaos_inject", kCustom},
    KindEntry{EventKind::kChaosSkip, "chaos_skip", kCustom},
    KindEntry{EventKind::kStepDone, "step_done", kCustom},
};

constexpr bool InDeclarationOrder() {
  for (size_t i = 0; i < kKinds.size(); ++i) {
    if (static_cast<size_t>(kKinds[i].kind) != i) return false;
  }
  return static_cast<size_t>(EventKind::kStepDone) + 1 == kKinds.size();
}
static_assert(InDeclarationOrder(), "kKinds must list every EventKind, in declaration order");

constexpr std::array<EventKind, kKinds.size()> AllKinds() {
  std::array<EventKind, kKinds.size()> all{};
  for (size_t i = 0; i < kKinds.size(); ++i) all[i] = kKinds[i].kind;
  return all;
}
constexpr std::array kAllKinds = AllKinds();

const KindEntry& EntryOf(EventKind kind) { return kKinds[static_cast<size_t>(kind)]; }

}  // namespace

std::span<const EventKind> AllEventKinds() { return kAllKinds; }

std::string_view EventKindName(EventKind kind) { return EntryOf(kind).name; }

EventType EventTypeOf(EventKind kind) { return EntryOf(kind).type; }

std::optional<EventKind> ParseEventKind(std::string_view name) {
  for (const KindEntry& e : kKinds) {
    if (e.name == name) return e.kind;
  }
  return std::nullopt;
}

std::optional<EventKind> KindOf(const Event& event) {
  const std::optional<EventKind> kind = ParseEventKind(event.Attribute("what"));
  if (!kind.has_value() || EventTypeOf(*kind) != event.type) return std::nullopt;
  return kind;
}

Event EventOfKind(EventKind kind, std::string message) {
  Event event;
  event.type = EventTypeOf(kind);
  event.message = std::move(message);
  event.attributes = {{"what", std::string(EventKindName(kind))}};
  return event;
}

}  // namespace trainguard
