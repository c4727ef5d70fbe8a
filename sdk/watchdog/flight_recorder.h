// FlightRecorder: the last few thousand things a rank did (steps, phases, progress ticks,
// collectives entered and left), kept in a ring of fixed-size records in a named POSIX
// shared-memory segment, so that another process (the launcher, `trainguard flight-recorder show`,
// a diagnosis tool) can read it while the rank is running, hung, SIGSTOPped or dead.
//
// Segment name: "/trainguard.<job_id>.fr.rank<R>" (FlightRecorder::SegmentName), mode 0600. Layout
// (docs/FORMATS.md): a header (magic, version, capacity, record size, the writer's pid, the next
// sequence number, the count of dropped records) followed by `capacity` FlightRecord slots. Record
// i lives in slot i % capacity.
//
// Writing is lock-free and allocation-free, from any number of threads at once (the training
// thread, the watchdog's monitor thread): an append claims its sequence number with one atomic
// fetch-add and its slot with one compare-and-swap, never waits for another writer, and publishes
// the slot's sequence number last with release order. A reader in another process that races the
// writers sees either the old or the new record of a slot, never a torn one (it drops slots whose
// sequence number changed while it copied them). Racing writers may publish out of order: a reader
// may find record n + 1 before record n is there. An append that finds its slot still being written
// (by a writer preempted for a whole wrap of the ring) or already holding a newer record is dropped
// and counted (FlightRecorderContents::dropped) instead of waiting.
//
// Thread safety: Append() and Snapshot() from any number of threads at once;
// set_remove_on_destroy() from the owner only. The readers below from any thread or process,
// concurrently with the writers.
#ifndef TRAINGUARD_SDK_WATCHDOG_FLIGHT_RECORDER_H_
#define TRAINGUARD_SDK_WATCHDOG_FLIGHT_RECORDER_H_

#include <cstdint>
#include <map>
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

enum class FlightRecordType : uint16_t {
  kStepBegin = 1,
  kStepEnd = 2,
  kPhaseBegin = 3,
  kPhaseEnd = 4,
  kTick = 5,             // progress inside a phase; `value` is the amount
  kCollectiveBegin = 6,  // the rank entered collective (comm_id, comm_seq)
  kCollectiveEnd = 7,    // the rank left it (on GPU: its CUDA event completed)
  kHang = 8,             // the watchdog declared a hang; `name` says what hung
  kMark = 9,             // anything else the trainer wants on record
  // The rank joined communicator comm_id (CollectiveTracker::RegisterCommunicator); `name` is the
  // communicator's name. Which communicators a rank is a member of is what the cross-rank reading
  // below compares it in.
  kCommunicator = 10,
};
// FlightRecord::flags of collective records.
inline constexpr uint16_t kFlightRecordOnGpu = 1;   // a GPU collective
inline constexpr uint16_t kFlightRecordFailed = 2;  // kCollectiveEnd of one that did not complete

// "step_begin", "collective_begin", ...
std::string_view FlightRecordTypeName(FlightRecordType type);

// One record: 128 bytes, trivially copyable, the same layout in every process of a build.
struct FlightRecord {
  uint64_t seq = 0;     // 1-based position in the rank's history; 0: the slot was never written
  int64_t time_ns = 0;  // CLOCK_MONOTONIC nanoseconds (comparable across processes of a host)
  int64_t step = -1;
  FlightRecordType type = FlightRecordType::kMark;
  uint16_t flags = 0;
  int32_t peer = -1;      // for point-to-point operations; -1 otherwise
  uint64_t comm_id = 0;   // the communicator (a caller-chosen id)
  int64_t comm_seq = -1;  // per-communicator sequence number of a collective
  uint64_t bytes = 0;
  int64_t value = 0;   // a tick's amount, a phase's duration at kPhaseEnd, ...
  char name[64] = {};  // op or phase name, NUL-terminated (truncated to 63 bytes)

  std::string_view Name() const;
};
static_assert(sizeof(FlightRecord) == 128);

class FlightRecorder {
 public:
  // Creates (replacing any stale segment of the same name) the rank's ring with `capacity` records.
  // REQUIRES: capacity >= 16. InvalidArgument for a capacity outside [16, 2^24], a job id that
  // Options::job_id would refuse, or a negative rank. The segment is created, sized and removed
  // through `env` (nullptr: Env::Default()), which must outlive the recorder.
  static absl::StatusOr<std::unique_ptr<FlightRecorder>> Create(std::string_view job_id, int rank,
                                                                int capacity, Env* env = nullptr);
  // Unmaps; removes the segment when `remove_on_destroy` (the default, for a normal exit).
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  void set_remove_on_destroy(bool remove) { remove_on_destroy_ = remove; }

  // Appends a record; the recorder fills seq and, when time_ns is 0, the time. No allocation, no
  // lock, no system call other than reading the clock (vDSO). Safe to call from several threads at
  // once. The record is dropped (and counted) when its slot is still being written a whole ring
  // later, which takes a writer preempted in the middle of an append.
  void Append(const FlightRecord& record);

  // The records still in the ring, oldest first.
  std::vector<FlightRecord> Snapshot() const;

  static std::string SegmentName(std::string_view job_id, int rank);
  static absl::Status Remove(std::string_view job_id, int rank, Env* env = nullptr);

 private:
  struct Segment;
  FlightRecorder(std::string name, Segment* segment, size_t mapped_bytes, int capacity, Env* env);

  const std::string name_;
  Segment* const segment_;
  const size_t mapped_bytes_;
  const int capacity_;
  Env* const env_;  // the segment's (removed through it)
  bool remove_on_destroy_ = true;
};

// What a reader finds in another process's (or this process's) ring.
struct FlightRecorderContents {
  std::string segment;
  int32_t writer_pid = 0;
  int capacity = 0;
  uint64_t next_seq = 0;
  // Appends given up because their slot was still being written (or held a newer record) a whole
  // ring later; always 0 for a single writer.
  uint64_t dropped = 0;
  std::vector<FlightRecord> records;  // oldest first
};

// Opens a rank's segment read-only and copies its records. NotFound when it does not exist;
// DataLoss when its header is not a flight recorder's.
absl::StatusOr<FlightRecorderContents> ReadFlightRecorder(std::string_view job_id, int rank,
                                                          Env* env = nullptr);

// Serialises contents as a FlightRecorderDump protobuf (sdk/proto/flight_recorder.proto), with
// extra key/value evidence (e.g. "reason", "stacks"), to `path` atomically (temp, fsync, rename).
absl::Status WriteFlightRecorderDump(const FlightRecorderContents& contents, int rank,
                                     const std::vector<std::pair<std::string, std::string>>& extra,
                                     const std::string& path);

// Like WriteFlightRecorderDump, to a new file: `<prefix><n>.pb` for the first n >= `first` that
// names no file, never replacing one, even when processes of several hosts write the same prefix
// into a shared directory at once (each is written to a unique temporary, then hard-linked to its
// name, which fails rather than replace). Returns the path written.
absl::StatusOr<std::string> WriteNewFlightRecorderDump(
    const FlightRecorderContents& contents, int rank,
    const std::vector<std::pair<std::string, std::string>>& extra, const std::string& prefix,
    int64_t first = 1);

// A dump file read back: what WriteFlightRecorderDump was given.
struct FlightRecorderDump {
  int rank = -1;
  FlightRecorderContents contents;
  std::vector<std::pair<std::string, std::string>> evidence;  // in the order written
  absl::Time dumped_at = absl::InfinitePast();  // wall clock when the dump was written
  int64_t dumped_monotonic_ns = 0;  // CLOCK_MONOTONIC then, to compare with the records' time_ns
};

// Like WriteNewFlightRecorderDump above, of `dump` (rank, contents, evidence), whose dumped_at and
// dumped_monotonic_ns it sets to now before writing it: the caller keeps what was written
// (WriteHangDump digests it).
absl::StatusOr<std::string> WriteNewFlightRecorderDump(FlightRecorderDump* dump,
                                                       const std::string& prefix,
                                                       int64_t first = 1);

// `dump` as one line of JSON: the trainguard.proto.FlightRecorderDump that WriteFlightRecorderDump
// would write, in the proto3 JSON mapping (docs/FORMATS.md, "JSON output"), as
// `trainguard flight-recorder show --json` prints it.
absl::StatusOr<std::string> FlightRecorderDumpToJson(const FlightRecorderDump& dump);

// Reads a file written by WriteFlightRecorderDump through `env` (nullptr: Env::Default()).
// NotFound when it does not exist; DataLoss naming the file when it is not a flight recorder dump.
absl::StatusOr<FlightRecorderDump> ReadFlightRecorderDump(const std::string& path,
                                                          Env* env = nullptr);

// The ranks of `job_id` that have a flight recorder segment on this host (live or left behind by a
// dead process), ascending: the names under /dev/shm that match SegmentName(job_id, rank).
absl::StatusOr<std::vector<int>> ListFlightRecorderRanks(std::string_view job_id);

// Cross-rank reading of the rings of a hung job (Mycroft's first question: who is everyone waiting
// for?). For each communicator, the newest collective any rank entered is the one the job is stuck
// in; a member whose ring shows it never entered that collective is a laggard. A rank is a member
// of the communicators its ring shows it registered in (kCommunicator) or entered a collective of:
// a job with tensor, pipeline and data-parallel groups has a communicator per group, and a rank is
// compared only in its own.
struct LaggardReport {
  uint64_t comm_id = 0;
  int64_t comm_seq = -1;      // the collective the other ranks are waiting in
  std::string op;             // its name
  std::vector<int> laggards;  // ranks that never entered it
  std::vector<int> waiting;   // ranks that entered it and have not left it
  std::string ToString()
      const;  // "rank 2 never entered all_reduce #120 (comm 1) that ranks 0,1,3 are waiting in"
};
// `rings[i]` is rank `ranks[i]`'s ring. One report per communicator whose newest collective some
// member never entered; empty when every member entered the newest collective of every
// communicator.
std::vector<LaggardReport> FindLaggards(const std::vector<int>& ranks,
                                        const std::vector<FlightRecorderContents>& rings);

// Where one rank's ring leaves it in one communicator's collectives: all FindLaggards compares of
// the ring, a few bytes however many records it holds, so that a reader of thousands of ranks'
// dumps need not keep their rings.
struct CollectivePosition {
  bool entered_any = false;  // the ring holds a collective_begin of this communicator
  int64_t entered = -1;      // the newest comm_seq it entered
  std::string op;            // that collective's name
  // It left that collective (collective_end) having completed it. One that failed (a peer died, an
  // abort woke it) keeps the rank in it: it was waiting there until the failure came, which is
  // what a hang's diagnosis asks even when the rank dumped after it.
  bool left = false;
  // The ring holds the rank's registration in this communicator (kCommunicator), with its name.
  bool member = false;
  std::string comm_name;

  bool operator==(const CollectivePosition&) const = default;
};
// By communicator id.
using CollectivePositions = std::map<uint64_t, CollectivePosition>;
CollectivePositions PositionsOf(const FlightRecorderContents& ring);
// FindLaggards on the rings' positions: `positions[i]` is PositionsOf(rank `ranks[i]`'s ring).
// The same reports as FindLaggards on the rings themselves.
std::vector<LaggardReport> FindLaggards(const std::vector<int>& ranks,
                                        const std::vector<CollectivePositions>& positions);

// Who waits for whom, across communicators (Mycroft: only the dependency between the groups names
// the culprit). In the newest collective of each communicator, a member that entered it and has not
// left waits for every member that never entered it; in a communicator of two ranks whose newest
// operation is in flight on both ("recv" on one, "send" of the same sequence number on the other),
// the receiver waits for the sender. Followed from every waiting rank, the waits end at the ranks
// that wait for nobody (stopped or stalled outside any collective, or inside a send whose receiver
// is there), or at a cycle of ranks waiting for each other: the roots. A pipeline stage stopped in
// a send leaves the next stage waiting in its receive, its tensor-parallel peers and data-parallel
// replicas waiting in collectives it never entered, and the other stages' peers waiting for those:
// the roots are the stopped stage alone, though the laggards of its neighbours' groups are many.
//
// A point-to-point communicator is one per pair of ranks that send to each other, both issuing the
// same sequence of sends and receives on it (a pipeline's link between two stages), so that the
// sequence numbers of the two sides match.
struct WaitFor {
  int waiter = -1;
  int waited_for = -1;
  uint64_t comm_id = 0;
  std::string comm_name;  // empty when the ring does not hold the registration
  int64_t comm_seq = -1;
  std::string op;  // the waiter's collective
};
struct HangRoot {
  int rank = -1;
  std::vector<WaitFor> waited_by;  // who waits for it directly: the first few (kShown)
  int waited_by_count = 0;         // how many do
  static constexpr int kShown = 6;
  // "rank 1 is where the waits end: rank 0 waits for it in all_reduce #12 (comm 3 "tp0"), rank 5
  // in recv #3 (comm 9 "pp0.link0") and 2 more".
  std::string ToString() const;
};
struct HangDependencies {
  std::vector<int> waiting;     // ranks that wait for some other rank, ascending
  std::vector<HangRoot> roots;  // by rank
};
HangDependencies FindHangRoots(const std::vector<int>& ranks,
                               const std::vector<CollectivePositions>& positions);

// A dump read without its records, which are reduced to their positions as they are parsed: for
// a reader that keeps only what FindLaggards compares (a coordinator reading every rank's dump of
// a hang), at a fraction of the memory and of the time.
struct FlightRecorderDumpPositions {
  FlightRecorderDump dump;        // as ReadFlightRecorderDump reads it, but contents.records empty
  CollectivePositions positions;  // PositionsOf the records
};
// ReadFlightRecorderDump's errors.
absl::StatusOr<FlightRecorderDumpPositions> ReadFlightRecorderDumpPositions(const std::string& path,
                                                                            Env* env = nullptr);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_WATCHDOG_FLIGHT_RECORDER_H_
