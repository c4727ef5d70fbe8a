// What the scale benchmarks (bench_scale_decisions, bench_simulate) give their simulated ranks to
// dump when a hang is declared: a real flight-recorder ring as a training rank's holds it after
// many steps (RealRing), this process's real stacks (RealStacks), and a rank's dump of the hang
// written as the Runtime writes it (WriteRankHangDump: FlightRecorderEvidence::Write's evidence,
// through WriteHangDump, with its digest beside it).
//
// Thread safety: RealRing and RealStacks from one thread at a time (RealStacks captures every
// thread of the process: call it while the process has few); WriteRankHangDump from any thread.
#ifndef TRAINGUARD_BENCH_HANG_DUMPS_H_
#define TRAINGUARD_BENCH_HANG_DUMPS_H_

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "sdk/core/mutex.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/hang_diagnosis.h"
#include "sdk/watchdog/stack_trace.h"
#include "trainguard/env.h"

namespace trainguard::bench {

// A real ring as a training rank's recorder holds it after many steps: each step a forward and a
// backward phase, the backward's gradients reduced in four buckets (all_reduce on comm 1); the
// ring is full, and the newest records are the hung step's: its forward, then (`enters`) the
// first bucket's all_reduce entered and not left, or (the culprit) not entered. Made in job
// `job`'s segment of `rank` (left for the caller to reuse or remove).
inline absl::StatusOr<FlightRecorderContents> RealRing(const std::string& job, int rank,
                                                       int capacity, bool enters) {
  absl::StatusOr<std::unique_ptr<FlightRecorder>> recorder =
      FlightRecorder::Create(job, rank, capacity);
  if (!recorder.ok()) return recorder.status();
  auto record = [&](FlightRecordType type, int64_t step, absl::string_view name,
                    int64_t comm_seq = -1, uint64_t bytes = 0) {
    FlightRecord r;
    r.type = type;
    r.step = step;
    if (comm_seq >= 0) {
      r.comm_id = 1;
      r.comm_seq = comm_seq;
      r.bytes = bytes;
    }
    std::snprintf(r.name, sizeof(r.name), "%.*s", static_cast<int>(name.size()), name.data());
    (*recorder)->Append(r);
  };
  constexpr int kBuckets = 4;
  constexpr uint64_t kBucketBytes = 25 << 20;
  int64_t seq = 0;
  const int steps = 2 * capacity / 14 + 1;  // 14 records a step: the ring wraps
  for (int64_t step = 0; step < steps; ++step) {
    record(FlightRecordType::kStepBegin, step, "step");
    record(FlightRecordType::kPhaseBegin, step, "forward");
    record(FlightRecordType::kPhaseEnd, step, "forward");
    record(FlightRecordType::kPhaseBegin, step, "backward");
    for (int b = 0; b < kBuckets; ++b) {
      record(FlightRecordType::kCollectiveBegin, step, "all_reduce", seq, kBucketBytes);
      record(FlightRecordType::kCollectiveEnd, step, "all_reduce", seq, kBucketBytes);
      ++seq;
    }
    record(FlightRecordType::kPhaseEnd, step, "backward");
    record(FlightRecordType::kStepEnd, step, "step");
  }
  record(FlightRecordType::kStepBegin, steps, "step");
  record(FlightRecordType::kPhaseBegin, steps, "forward");
  record(FlightRecordType::kPhaseEnd, steps, "forward");
  record(FlightRecordType::kPhaseBegin, steps, "backward");
  if (enters) record(FlightRecordType::kCollectiveBegin, steps, "all_reduce", seq, kBucketBytes);
  return ReadFlightRecorder(job, rank);
}

// This process's threads' stacks as a rank's dump holds them (captured, symbolised, formatted),
// with a thread blocked in a wait (a rank in its collective) and one asleep (the culprit, busy
// elsewhere): their thread ids, to name as each dump's training thread.
struct Stacks {
  std::string text;
  int waiting_tid = 0;
  int sleeping_tid = 0;
};
inline absl::StatusOr<Stacks> RealStacks() {
  Stacks stacks;
  Notification release;
  std::atomic<int> waiting_tid{0};
  std::atomic<int> sleeping_tid{0};
  std::thread waiting([&] {
    waiting_tid = static_cast<int>(syscall(SYS_gettid));
    while (!release.WaitForNotificationWithTimeout(absl::Seconds(1))) {
    }
  });
  std::thread sleeping([&] {
    sleeping_tid = static_cast<int>(syscall(SYS_gettid));
    while (!release.HasBeenNotified()) absl::SleepFor(absl::Milliseconds(5));
  });
  while (waiting_tid == 0 || sleeping_tid == 0) absl::SleepFor(absl::Milliseconds(1));
  absl::SleepFor(absl::Milliseconds(20));  // both are where they stay
  absl::StatusOr<std::vector<RawThreadStack>> raw = CaptureRawThreadStacks(absl::Seconds(2));
  release.Notify();
  waiting.join();
  sleeping.join();
  if (!raw.ok()) return raw.status();
  stacks.text = FormatThreadStacks(SymbolizeThreadStacks(*raw));
  stacks.waiting_tid = waiting_tid;
  stacks.sleeping_tid = sleeping_tid;
  return stacks;
}

// Writes `rank`'s dump number `n` of `generation`'s hang into `dir` as the Runtime does
// (FlightRecorderEvidence::Write): `ring` relabelled as this rank's (job `job`'s segment, a pid
// of its own), the reason, the generation, its training thread (the sleeping one for the
// `culprit`, else the waiting one) and the stacks; with its digest beside it when `digest`.
// Returns the dump's path.
inline absl::StatusOr<std::string> WriteRankHangDump(FlightRecorderContents ring,
                                                     const std::string& job, const Stacks& stacks,
                                                     int rank, bool culprit,
                                                     const std::string& reason, int64_t generation,
                                                     const std::string& dir, bool digest,
                                                     int64_t n = 1) {
  ring.segment = FlightRecorder::SegmentName(job, rank);
  ring.writer_pid = 100000 + rank;
  const std::vector<std::pair<std::string, std::string>> evidence = {
      {"reason", reason},
      {"generation", absl::StrCat(generation)},
      {"step_thread", absl::StrCat(culprit ? stacks.sleeping_tid : stacks.waiting_tid)},
      {"stacks", stacks.text}};
  const std::string prefix = absl::StrFormat("%s/rank-%05d.", dir, rank);
  return digest ? WriteHangDump(ring, rank, evidence, prefix, n)
                : WriteNewFlightRecorderDump(ring, rank, evidence, prefix, n);
}

}  // namespace trainguard::bench

#endif  // TRAINGUARD_BENCH_HANG_DUMPS_H_
