#include "sdk/runtime/hang_evidence.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "sdk/watchdog/hang_diagnosis.h"

namespace trainguard {

FlightRecorderEvidence::FlightRecorderEvidence(FlightRecorderEvidenceOptions options)
    : options_(std::move(options)) {}

CapturedEvidence FlightRecorderEvidence::Capture() {
  // Designated initializers are evaluated in order: the stacks first, then the ring.
  return CapturedEvidence{.stacks = CaptureRawThreadStacks(absl::Seconds(2)),
                          .ring = ReadFlightRecorder(options_.job_id, options_.rank)};
}

std::string FlightRecorderEvidence::Write(const CapturedEvidence& captured,
                                          const std::string& reason, int64_t generation,
                                          std::string* stacks_out, int64_t* symbolize_ms) {
  const int64_t begin_ns = options_.clock->MonotonicNanos();
  const std::string stack_text =
      captured.stacks.ok()
          ? FormatThreadStacks(SymbolizeThreadStacks(*captured.stacks))
          : absl::StrCat("(stack capture failed: ", captured.stacks.status().ToString(), ")");
  if (symbolize_ms != nullptr) {
    *symbolize_ms = (options_.clock->MonotonicNanos() - begin_ns) / 1'000'000;
  }
  if (stacks_out != nullptr) *stacks_out = stack_text;
  const absl::StatusOr<FlightRecorderContents>& contents = captured.ring;
  if (!contents.ok()) return "";
  const std::string dir = absl::StrCat(options_.run_dir, "/flight_recorder");
  if (!options_.env->CreateDirs(dir).ok()) return "";
  // The first number no dump of this rank has: an earlier process of the rank (replaced, or on
  // another host sharing the run dir) may have written some, and they are kept.
  const int64_t n = dumps_.fetch_add(1) + 1;
  // With its digest beside it: what the coordinator reads of every rank's dump (WriteHangDump).
  absl::StatusOr<std::string> path = WriteHangDump(
      *contents, options_.rank,
      {{"reason", reason},
       {"generation", absl::StrCat(generation)},
       // The thread whose stack DiagnoseHang compares across ranks.
       {"step_thread", absl::StrCat(options_.step_thread ? options_.step_thread() : 0)},
       {"stacks", stack_text}},
      absl::StrFormat("%s/rank-%05d.", dir, options_.rank), n, options_.env);
  return path.ok() ? *path : "";
}

}  // namespace trainguard
