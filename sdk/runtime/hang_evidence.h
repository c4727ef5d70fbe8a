// HangEvidenceSource: what a rank leaves behind about a hang (private to sdk/runtime): every thread's
// stack and the flight recorder's ring, captured at one moment and written as a dump file that the
// launcher's diagnosis reads (DiagnoseHang) across ranks.
//
// Capture and write are apart: the capture (every thread's program counters and the ring:
// milliseconds, no file read) is taken while the rank still waits where the hang found it, and the
// symbolising and the write (which read the modules' symbol tables: slow with large libraries
// loaded) may come after the hang is published or the rank was let go.
//
// FlightRecorderEvidence is the rank's own; HangResponder (hang_responder.h) takes the interface,
// so that a test counts the dumps it asks for. (Not named HangEvidence: that is what the diagnosis
// reads, sdk/watchdog/hang_diagnosis.h, and two types of one name in one library broke the
// coordinator's hang diagnosis under AddressSanitizer: an ODR violation.)
//
// Thread safety: Capture and Write may be called from any thread; the HangResponder serialises
// them. Not copyable or movable.
#ifndef TRAINGUARD_SDK_RUNTIME_HANG_EVIDENCE_H_
#define TRAINGUARD_SDK_RUNTIME_HANG_EVIDENCE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/stack_trace.h"
#include "trainguard/clock.h"
#include "trainguard/env.h"

namespace trainguard {

// The stacks and the ring, as captured.
struct CapturedEvidence {
  absl::StatusOr<std::vector<RawThreadStack>> stacks;
  absl::StatusOr<FlightRecorderContents> ring;
};

class HangEvidenceSource {
 public:
  HangEvidenceSource() = default;
  virtual ~HangEvidenceSource() = default;
  HangEvidenceSource(const HangEvidenceSource&) = delete;
  HangEvidenceSource& operator=(const HangEvidenceSource&) = delete;

  // Every thread's stack, then the ring.
  virtual CapturedEvidence Capture() = 0;
  // Writes `captured` as a new dump labelled with `reason` and `generation`: the one the hang (or
  // failure) happened in, read before the capture. The generation may move on while the stacks
  // are captured (the launcher replaces a stopped peer without waiting for this dump), and a dump
  // labelled with the next one would count as that generation's evidence. Returns the dump's path
  // ("" if it failed). The stacks' text goes to *stacks_out and the symbolising's milliseconds to
  // *symbolize_ms, if given.
  virtual std::string Write(const CapturedEvidence& captured, const std::string& reason,
                            int64_t generation, std::string* stacks_out, int64_t* symbolize_ms) = 0;
};

struct FlightRecorderEvidenceOptions {
  std::string job_id;  // whose ring is read (the rank's own, ReadFlightRecorder)
  int rank = 0;
  std::string run_dir;  // dumps go to <run_dir>/flight_recorder/rank-RRRRR.N
  Env* env = nullptr;
  Clock* clock = nullptr;  // times the symbolising
  // The thread whose stack the diagnosis compares across ranks (Watchdog::phase_thread_id; 0 when
  // unknown).
  std::function<int()> step_thread;
};

class FlightRecorderEvidence final : public HangEvidenceSource {
 public:
  // REQUIRES: env and clock set, and outlive the object.
  explicit FlightRecorderEvidence(FlightRecorderEvidenceOptions options);

  CapturedEvidence Capture() override;
  std::string Write(const CapturedEvidence& captured, const std::string& reason, int64_t generation,
                    std::string* stacks_out, int64_t* symbolize_ms) override;
  // Dumps this process wrote (Runtime::hang_dumps).
  int64_t dumps() const { return dumps_.load(); }

 private:
  const FlightRecorderEvidenceOptions options_;
  std::atomic<int64_t> dumps_{0};
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RUNTIME_HANG_EVIDENCE_H_
