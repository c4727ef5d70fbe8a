// Hang diagnosis across ranks: the evidence every rank of a job left for one hang, read together to
// name the rank at fault.
//
// When a rank's watchdog declares a hang, the Runtime dumps its flight recorder and the stacks of
// all its threads to <run_dir>/flight_recorder/rank-RRRRR.N.pb and publishes the hang, so every
// other rank dumps too (docs/GUIDE.md, "Hang detection"). DiagnoseHang reads those dumps three
// ways:
//
//  1. Rings (Mycroft): FindLaggards on the ranks' rings names the members that never entered the
//     collective the others are waiting in, per communicator; FindHangRoots follows the waits
//     across communicators (tensor, pipeline, data-parallel groups) to the ranks where they end.
//  2. Stacks (ByteRobust's stack aggregation): each rank's training thread (the thread that opened
//     the step's phases, recorded in the dump as "step_thread") is reduced to the sequence of
//     modules (shared objects, the executable) its frames run in, innermost first, with repeats
//     collapsed, and the ranks are grouped by that sequence. Modules rather than functions:
//     ranks waiting in one collective wait at different points of the communication library (a
//     ring allreduce has some ranks in a receive, others in a send), but all inside it. When one
//     group is larger than every other, the ranks outside it are outliers: somewhere the others
//     are not (sleeping or computing inside a collective they all entered, stuck in I/O or in the
//     driver). This names a rank that entered the collective and then stalled, which the rings
//     alone cannot tell from the ranks waiting with it. A program linked into one static binary
//     has a single module: its ranks all group together and no outlier is named.
//  3. Silence: a rank of the job that wrote no dump (stopped, dead, or unable to write) is named.
//
// The suspects are the roots of the waits, the stack outliers and the silent ranks. A rank stopped
// or dead writes no dump, so callers that can read the live rings (same host: ReadFlightRecorder)
// pass them in for step 1.
//
// Thread safety: pure functions.
#ifndef TRAINGUARD_SDK_WATCHDOG_HANG_DIAGNOSIS_H_
#define TRAINGUARD_SDK_WATCHDOG_HANG_DIAGNOSIS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "sdk/watchdog/flight_recorder.h"

namespace trainguard {

struct HangEvidence {
  std::vector<FlightRecorderDump> dumps;  // at most one per rank (ReadHangDumps)
  // Rings read live (shared memory) for ranks without a dump: used for the laggard analysis only.
  std::map<int, FlightRecorderContents> live_rings;
  int world_size = 0;  // 0: unknown, no rank is reported missing
};

// Ranks whose training threads run in the same sequence of modules.
struct StackGroup {
  std::vector<int> ranks;            // ascending
  std::vector<std::string> modules;  // the grouping key: module names, innermost first
  // The lowest rank's frames, each reduced by FrameSignature, innermost first: what to show.
  std::vector<std::string> frames;
  // The frames are in trainguard's recovery (Runtime::recover, a re-rendezvous): these ranks had
  // already moved on when they dumped, so their stacks say nothing about where the hang was.
  bool recovering = false;
};

struct HangDiagnosis {
  int64_t generation = -1;   // of the dumps; -1 when there are none
  std::vector<int> dumped;   // ranks with a dump, ascending
  std::vector<int> missing;  // ranks in [0, world_size) without a dump
  std::vector<LaggardReport> laggards;
  // Where the waits between the ranks end (FindHangRoots).
  std::vector<HangRoot> roots;
  std::vector<StackGroup> stack_groups;  // largest first; equal sizes by lowest rank
  // Ranks outside the single largest group of those not recovering, ascending.
  std::vector<int> stack_outliers;
  // The roots, the stack outliers and the missing ranks, ascending.
  std::vector<int> suspects;

  // Several lines: the suspects first ("suspects: rank 2"), then why, e.g.
  //   "rank 2's training thread is elsewhere: clock_nanosleep <- absl::SleepFor <- ..."
  //   "ranks 0,1,3 wait together in: futex_wait <- ... <- gloo::allreduce <- ..."
  std::string ToString() const;
};

// One stack frame as FormatThreadStacks writes it, reduced for display: "function+0xoff
// (module+0xoff)" -> "function"; "0x7f0012 (/usr/lib/libfoo.so+0x1234)" -> "libfoo.so+0x1234".
std::string FrameSignature(const std::string& frame);
// The module of such a frame, without its directory or offset: "libfoo.so"; "?" when unknown.
std::string FrameModule(const std::string& frame);

// A dump's value of evidence `key` (the first such entry); nullopt when it has none.
std::optional<std::string> EvidenceOf(const FlightRecorderDump& dump, absl::string_view key);
// The generation a dump's "generation" evidence names; -1 when it names none.
int64_t DumpGeneration(const FlightRecorderDump& dump);
// A dump's file name as Runtime writes it: "rank-00002.3.pb" -> (rank 2, dump 3); nullopt for any
// other name (a temporary "rank-00002.tmp.<host>.<pid>.<ns>" too). Numbers grow across the
// processes of a rank: a new dump takes the first free one (WriteNewFlightRecorderDump).
std::optional<std::pair<int, int64_t>> ParseDumpName(absl::string_view name);

// Reads the dumps (*.pb, as Runtime names them) in `dir` through `env` (nullptr: Env::Default())
// and keeps, per rank, the newest one (by dump number) of `generation`; generation -1 picks the
// newest generation any dump names. NotFound when `dir` holds no dump; DataLoss naming the file for
// one that is not a flight recorder dump.
absl::StatusOr<std::vector<FlightRecorderDump>> ReadHangDumps(const std::string& dir,
                                                              int64_t generation = -1,
                                                              Env* env = nullptr);

HangDiagnosis DiagnoseHang(const HangEvidence& evidence);

// What DiagnoseHang uses of one rank's dump, and what a coordinator decides on before it: a few
// kilobytes however long the rank's ring and however many threads its stacks show (a dump of a
// ring of 4,096 records is about 200 KB), so that a coordinator can read each dump of a job of
// thousands of ranks once, as it appears, and keep what it needs of every one (HangCoordinator).
struct HangDumpDigest {
  int rank = -1;
  int64_t generation = -1;  // DumpGeneration
  absl::Time dumped_at = absl::InfinitePast();
  std::string reason;                 // its "reason" evidence; empty when it has none
  CollectivePositions positions;      // PositionsOf its ring
  std::vector<std::string> training;  // its training thread's frames, as the stacks hold them

  bool operator==(const HangDumpDigest&) const = default;
};
HangDumpDigest DigestHangDump(const FlightRecorderDump& dump);
// The same, of a dump read without its records (ReadFlightRecorderDumpPositions).
HangDumpDigest DigestHangDump(const FlightRecorderDumpPositions& read);

// A rank's dump of a hang comes with its digest beside it (rank-RRRRR.N.pb, rank-RRRRR.N.digest),
// written by the rank, which has the ring and the stacks in memory: a coordinator then reads a few
// kilobytes per rank where parsing the dump of a ring of 4,096 records is most of its work at
// thousands of ranks. The dump stays the evidence (a rank counts as dumped once its dump is there),
// and a coordinator that finds no digest beside a dump (written by an older version, or not yet),
// or one it cannot read, reads the dump: the digest read back is DigestHangDump of the dump read
// back, field for field.

// The digest's path beside the dump at `dump_path`: "<dir>/rank-00002.3.pb" ->
// "<dir>/rank-00002.3.digest". Not a dump name (ParseDumpName).
std::string HangDumpDigestPath(absl::string_view dump_path);
// The digest's bytes (a trainguard.proto.HangDumpDigestProto, sdk/proto/flight_recorder.proto),
// and back. DataLoss when `bytes` are not a digest.
std::string EncodeHangDumpDigest(const HangDumpDigest& digest);
absl::StatusOr<HangDumpDigest> DecodeHangDumpDigest(absl::string_view bytes);
// Writes the rank's dump as WriteNewFlightRecorderDump does (`evidence` as its extra), then its
// digest beside it through `env` (nullptr: Env::Default()), synced and renamed into place. Returns
// the dump's path; a digest that cannot be written is left out (its coordinator reads the dump).
absl::StatusOr<std::string> WriteHangDump(
    const FlightRecorderContents& contents, int rank,
    const std::vector<std::pair<std::string, std::string>>& evidence, const std::string& prefix,
    int64_t first = 1, Env* env = nullptr);
// Reads a digest WriteHangDump wrote. NotFound when there is none; DataLoss naming the file for one
// that does not decode.
absl::StatusOr<HangDumpDigest> ReadHangDumpDigest(const std::string& path, Env* env = nullptr);

// DiagnoseHang on digests: `dumps` at most one per rank; `live_rings` as HangEvidence's. The same
// diagnosis as DiagnoseHang on the dumps the digests were made of.
HangDiagnosis DiagnoseHang(const std::vector<HangDumpDigest>& dumps,
                           const std::map<int, FlightRecorderContents>& live_rings, int world_size);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_WATCHDOG_HANG_DIAGNOSIS_H_
