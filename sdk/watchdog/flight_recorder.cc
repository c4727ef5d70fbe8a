// FlightRecorder: the shared-memory ring (sdk/watchdog/flight_recorder.h; layout in
// docs/FORMATS.md).
//
// Memory model. A slot is 16 64-bit words, every one of them accessed through std::atomic_ref by
// writers and readers alike, so a reader racing a writer is never a data race. Any number of
// threads append at once without a lock. A writer
//     claims seq := header.next_seq++ (fetch_add, relaxed): seqs are unique, never reused;
//     claims its slot (seq - 1) % capacity by a compare-and-swap of word 0 from the published seq
//         it holds to kSlotBeingWritten (acquire), only when that seq is older than its own;
//     stores words 1..15 := the record (release);
//     publishes word 0 := seq (release).
// The compare-and-swap makes a slot's writers take turns: a second writer can claim the slot only
// from a published seq, and its acquire orders the previous writer's words before its own. A writer
// that finds its slot being written or holding a newer record (possible only when it was preempted
// between its fetch_add and its compare-and-swap for a whole wrap of the ring, or lost the
// compare-and-swap to such a writer) drops its record and counts it in header.dropped: it never
// waits. Seqs are published out of order when writers race (n + 1 may be visible before n).
//
// A reader copies a slot as
//     s1 := word 0 (acquire); words 1..15 (acquire); s2 := word 0 (relaxed); keep iff s1 == s2.
// If the reader's copy took any word of a later write, that word's release store carries the
// earlier compare-and-swap of word 0 to kSlotBeingWritten with it, so s2 cannot be s1 any more (a
// slot's seqs only grow): the reader drops the slot. If s1 is a seq and s2 is the same seq, every
// word read was written before that seq was published and after the previous one. The release and
// acquire orders cost nothing on x86-64 (plain moves) and, unlike a stand-alone fence,
// ThreadSanitizer models them exactly.
#include "sdk/watchdog/flight_recorder.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/arena.h"
#include "sdk/core/errno_error.h"
#include "sdk/core/job_id.h"
#include "sdk/core/proto_json.h"
#include "sdk/core/scoped_fd.h"
#include "sdk/proto/flight_recorder.pb.h"
#include "trainguard/env.h"

namespace trainguard {
namespace {

constexpr uint64_t kMagic = 0x3143455252464754;  // "TGFRREC1" read as a little-endian u64
constexpr uint32_t kFormatVersion = 1;
constexpr uint32_t kDumpFormatVersion = 1;
constexpr size_t kHeaderBytes = 128;
constexpr size_t kRecordWords = sizeof(FlightRecord) / sizeof(uint64_t);
constexpr int kMinCapacity = 16;
constexpr int kMaxCapacity = 1 << 24;  // 2 GiB of records
// Word 0 of a slot while the writer changes the other words. Never a real seq.
constexpr uint64_t kSlotBeingWritten = ~uint64_t{0};
constexpr char kShmDir[] = "/dev/shm";

static_assert(std::atomic_ref<uint64_t>::is_always_lock_free);
static_assert(std::is_trivially_copyable_v<FlightRecord>);
static_assert(offsetof(FlightRecord, seq) == 0);
static_assert(offsetof(FlightRecord, name) + sizeof(FlightRecord::name) == sizeof(FlightRecord));

// The first kHeaderBytes of the segment. Every field but next_seq and dropped is written once,
// before magic.
struct SegmentHeader {
  uint64_t magic;  // kMagic, stored last (release) when the segment is created
  uint32_t format_version;
  uint32_t header_bytes;  // where slot 0 begins
  uint32_t record_bytes;  // sizeof(FlightRecord)
  uint32_t capacity;
  int32_t writer_pid;
  int32_t rank;
  // The seq the next Append claims (fetch_add), before it writes its record. Writers before the
  // multi-writer ring stored it after each record; either way a reader takes the larger of it and
  // the newest seq it copied, plus one.
  uint64_t next_seq;
  uint64_t segment_bytes;
  // Records Append gave up (fetch_add): their slot was being written or held a newer record. Zero
  // in segments of writers before the multi-writer ring, which never dropped a record.
  uint64_t dropped;
  uint8_t reserved[kHeaderBytes - 56];
};
static_assert(sizeof(SegmentHeader) == kHeaderBytes);

uint64_t LoadWord(const uint64_t& word, std::memory_order order) {
  // atomic_ref needs a non-const object; loading from a read-only mapping only reads it.
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(word)).load(order);
}
uint32_t LoadWord32(const uint32_t& word) {
  return std::atomic_ref<uint32_t>(const_cast<uint32_t&>(word)).load(std::memory_order_relaxed);
}
int32_t LoadWord32(const int32_t& word) {
  return std::atomic_ref<int32_t>(const_cast<int32_t&>(word)).load(std::memory_order_relaxed);
}

int64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

size_t SegmentBytes(uint64_t capacity) { return kHeaderBytes + capacity * sizeof(FlightRecord); }

const uint64_t* SlotWords(const void* segment, uint64_t slot) {
  return reinterpret_cast<const uint64_t*>(static_cast<const char*>(segment) + kHeaderBytes) +
         slot * kRecordWords;
}
uint64_t* SlotWords(void* segment, uint64_t slot) {
  return reinterpret_cast<uint64_t*>(static_cast<char*>(segment) + kHeaderBytes) +
         slot * kRecordWords;
}

// Word `i` of `record`, as it is laid out in a slot.
uint64_t RecordWord(const FlightRecord& record, size_t i) {
  uint64_t word;
  std::memcpy(&word, reinterpret_cast<const char*>(&record) + i * sizeof(word), sizeof(word));
  return word;
}

constexpr std::string_view kSegment = "flight recorder segment";

// An Env error about a ring's segment, saying it is the flight recorder's.
absl::Status InSegment(const absl::Status& status, std::string_view what) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("flight recorder ", std::string(what), what.empty() ? "" : " ",
                                   std::string(status.message())));
}

absl::Status CheckJobId(std::string_view job_id, int rank) {
  if (absl::Status s = ValidateJobId(job_id); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("flight recorder: ", s.message()));
  }
  if (rank < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("flight recorder: rank %d < 0", rank));
  }
  return absl::OkStatus();
}

// Copies the records out of `capacity` slots that a writer may be changing: untorn ones only,
// the newest `capacity` of them, oldest first.
std::vector<FlightRecord> CopyRecords(const void* segment, uint64_t capacity) {
  std::vector<FlightRecord> records;
  records.reserve(capacity);
  for (uint64_t slot = 0; slot < capacity; ++slot) {
    const uint64_t* words = SlotWords(segment, slot);
    uint64_t copy[kRecordWords];
    copy[0] = LoadWord(words[0], std::memory_order_acquire);
    if (copy[0] == 0 || copy[0] == kSlotBeingWritten) continue;
    for (size_t i = 1; i < kRecordWords; ++i) {
      copy[i] = LoadWord(words[i], std::memory_order_acquire);
    }
    // Changed while copied: torn, or overwritten by a newer record.
    if (LoadWord(words[0], std::memory_order_relaxed) != copy[0]) continue;
    // Not where this writer puts that seq: the slot is damaged.
    if ((copy[0] - 1) % capacity != slot) continue;
    FlightRecord& record = records.emplace_back();
    std::memcpy(&record, copy, sizeof(record));
    record.name[sizeof(record.name) - 1] = '\0';
  }
  std::sort(records.begin(), records.end(),
            [](const FlightRecord& a, const FlightRecord& b) { return a.seq < b.seq; });
  // A reader racing the writer may hold a record that was overwritten after it was copied while a
  // later slot was copied after the wrap: keep the window of the newest `capacity` seqs only.
  if (!records.empty()) {
    const uint64_t newest = records.back().seq;
    std::erase_if(records, [&](const FlightRecord& r) { return r.seq + capacity <= newest; });
  }
  return records;
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

std::string_view FlightRecordTypeName(FlightRecordType type) {
  switch (type) {
    case FlightRecordType::kStepBegin:
      return "step_begin";
    case FlightRecordType::kStepEnd:
      return "step_end";
    case FlightRecordType::kPhaseBegin:
      return "phase_begin";
    case FlightRecordType::kPhaseEnd:
      return "phase_end";
    case FlightRecordType::kTick:
      return "tick";
    case FlightRecordType::kCollectiveBegin:
      return "collective_begin";
    case FlightRecordType::kCollectiveEnd:
      return "collective_end";
    case FlightRecordType::kHang:
      return "hang";
    case FlightRecordType::kMark:
      return "mark";
    case FlightRecordType::kCommunicator:
      return "communicator";
  }
  return "unknown";
}

std::string_view FlightRecord::Name() const { return std::string_view(name, strnlen(name, 64)); }

struct FlightRecorder::Segment {
  SegmentHeader header;
  // Followed by `capacity` slots of kRecordWords words.
};

absl::StatusOr<std::unique_ptr<FlightRecorder>> FlightRecorder::Create(std::string_view job_id,
                                                                       int rank, int capacity,
                                                                       Env* env) {
  if (absl::Status s = CheckJobId(job_id, rank); !s.ok()) return s;
  if (capacity < kMinCapacity || capacity > kMaxCapacity) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "flight recorder: capacity %d is outside [%d, %d]", capacity, kMinCapacity, kMaxCapacity));
  }
  const std::string name = SegmentName(job_id, rank);
  if (env == nullptr) env = Env::Default();
  // A segment left by a dead process of this rank is replaced, never reused: its writer may have
  // had another capacity, and readers attached to it keep their own mapping.
  // Another process creating the same name between the unlink and the create (a second process
  // of the same job and rank) is retried a few times; the newest creator owns the name.
  absl::StatusOr<int> created = absl::AlreadyExistsError(name);
  for (int attempt = 0; attempt < 5 && absl::IsAlreadyExists(created.status()); ++attempt) {
    if (absl::Status s = env->RemoveSharedMemory(name); !s.ok() && !absl::IsNotFound(s)) {
      return InSegment(s, "(stale segment)");
    }
    created = env->CreateSharedMemory(name);
  }
  if (!created.ok()) return InSegment(created.status(), "");
  ScopedFd fd(*created);
  auto fail = [&](absl::Status status) {
    (void)env->RemoveSharedMemory(name);
    return InSegment(status, "");
  };
  const size_t bytes = SegmentBytes(static_cast<uint64_t>(capacity));
  // Reserve the memory now: a full /dev/shm fails here, not with SIGBUS inside Append.
  if (absl::Status s = env->ReserveSharedMemory(fd.get(), name, bytes); !s.ok()) return fail(s);
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (base == MAP_FAILED) return fail(ErrnoError(errno, kSegment, name, "mmap"));
  auto* segment = static_cast<Segment*>(base);
  SegmentHeader& h = segment->header;
  h.format_version = kFormatVersion;
  h.header_bytes = kHeaderBytes;
  h.record_bytes = sizeof(FlightRecord);
  h.capacity = static_cast<uint32_t>(capacity);
  h.writer_pid = static_cast<int32_t>(getpid());
  h.rank = rank;
  std::atomic_ref<uint64_t>(h.next_seq).store(1, std::memory_order_relaxed);
  h.segment_bytes = bytes;
  std::atomic_ref<uint64_t>(h.dropped).store(0, std::memory_order_relaxed);
  // The magic last: a segment whose creator died before this line is recognised as unusable.
  std::atomic_ref<uint64_t>(h.magic).store(kMagic, std::memory_order_release);
  return std::unique_ptr<FlightRecorder>(new FlightRecorder(name, segment, bytes, capacity, env));
}

FlightRecorder::FlightRecorder(std::string name, Segment* segment, size_t mapped_bytes,
                               int capacity, Env* env)
    : name_(std::move(name)),
      segment_(segment),
      mapped_bytes_(mapped_bytes),
      capacity_(capacity),
      env_(env) {}

FlightRecorder::~FlightRecorder() {
  munmap(segment_, mapped_bytes_);
  if (remove_on_destroy_) (void)env_->RemoveSharedMemory(name_);
}

void FlightRecorder::Append(const FlightRecord& record) {
  // The clock before the seq: the shorter the time between claiming a seq and publishing it, the
  // rarer a later seq published first, or a record dropped.
  const int64_t time_ns = record.time_ns != 0 ? record.time_ns : MonotonicNanos();
  SegmentHeader& header = segment_->header;
  const uint64_t seq =
      std::atomic_ref<uint64_t>(header.next_seq).fetch_add(1, std::memory_order_relaxed);
  uint64_t* slot = SlotWords(segment_, (seq - 1) % static_cast<uint64_t>(capacity_));
  std::atomic_ref<uint64_t> slot_seq(slot[0]);
  // kSlotBeingWritten is larger than every seq: `current < seq` is "older and not being written".
  // Acquire on success: the previous writer's words are ordered before the ones stored below.
  uint64_t current = slot_seq.load(std::memory_order_relaxed);
  if (current >= seq ||
      !slot_seq.compare_exchange_strong(current, kSlotBeingWritten, std::memory_order_acquire,
                                        std::memory_order_relaxed)) {
    std::atomic_ref<uint64_t>(header.dropped).fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Word by word from the caller's record into the slot, without a copy on the stack to patch and
  // read back: that copy cost more than the two atomics above (docs/PERFORMANCE.md, Detection).
  std::atomic_ref<uint64_t>(slot[1]).store(static_cast<uint64_t>(time_ns),
                                           std::memory_order_release);
  for (size_t i = 2; i + 1 < kRecordWords; ++i) {
    std::atomic_ref<uint64_t>(slot[i]).store(RecordWord(record, i), std::memory_order_release);
  }
  // The name is NUL-terminated in the ring even when the caller filled all 64 bytes: its last byte
  // is the last byte of the last word.
  uint64_t last = RecordWord(record, kRecordWords - 1);
  last &= std::endian::native == std::endian::little ? ~(uint64_t{0xFF} << 56) : ~uint64_t{0xFF};
  std::atomic_ref<uint64_t>(slot[kRecordWords - 1]).store(last, std::memory_order_release);
  slot_seq.store(seq, std::memory_order_release);
}

std::vector<FlightRecord> FlightRecorder::Snapshot() const {
  return CopyRecords(segment_, static_cast<uint64_t>(capacity_));
}

std::string FlightRecorder::SegmentName(std::string_view job_id, int rank) {
  return absl::StrFormat("/trainguard.%s.fr.rank%d", job_id, rank);
}

absl::Status FlightRecorder::Remove(std::string_view job_id, int rank, Env* env) {
  if (absl::Status s = CheckJobId(job_id, rank); !s.ok()) return s;
  if (env == nullptr) env = Env::Default();
  return InSegment(env->RemoveSharedMemory(SegmentName(job_id, rank)), "");
}

absl::StatusOr<FlightRecorderContents> ReadFlightRecorder(std::string_view job_id, int rank,
                                                          Env* env) {
  if (absl::Status s = CheckJobId(job_id, rank); !s.ok()) return s;
  if (env == nullptr) env = Env::Default();
  const std::string name = FlightRecorder::SegmentName(job_id, rank);
  absl::StatusOr<int> opened = env->OpenSharedMemory(name, /*writable=*/false);
  if (!opened.ok()) return InSegment(opened.status(), "(read)");
  ScopedFd fd(*opened);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoError(errno, kSegment, name, "fstat");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kHeaderBytes) {
    return absl::DataLossError(absl::StrFormat(
        "flight recorder segment %s: %d bytes, less than its %d-byte header (not a flight "
        "recorder, or its creator died while creating it)",
        name, size, kHeaderBytes));
  }
  void* base = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) return ErrnoError(errno, kSegment, name, "mmap");
  struct Unmap {
    void* base;
    size_t size;
    ~Unmap() { munmap(base, size); }
  } unmap{base, size};
  const SegmentHeader& h = static_cast<const SegmentHeader*>(base)[0];
  const uint64_t magic = LoadWord(h.magic, std::memory_order_acquire);
  if (magic != kMagic) {
    return absl::DataLossError(absl::StrFormat(
        "flight recorder segment %s: bad magic %016x (not a flight recorder, or its creator died "
        "while creating it)",
        name, magic));
  }
  const uint32_t version = LoadWord32(h.format_version);
  if (version != kFormatVersion) {
    return absl::DataLossError(
        absl::StrFormat("flight recorder segment %s: format version %d, this build reads %d", name,
                        version, kFormatVersion));
  }
  const uint32_t header_bytes = LoadWord32(h.header_bytes);
  const uint32_t record_bytes = LoadWord32(h.record_bytes);
  const uint32_t capacity = LoadWord32(h.capacity);
  const uint64_t segment_bytes = LoadWord(h.segment_bytes, std::memory_order_relaxed);
  if (header_bytes != kHeaderBytes || record_bytes != sizeof(FlightRecord) ||
      capacity < static_cast<uint32_t>(kMinCapacity) ||
      capacity > static_cast<uint32_t>(kMaxCapacity) || segment_bytes != SegmentBytes(capacity) ||
      size != segment_bytes) {
    return absl::DataLossError(absl::StrFormat(
        "flight recorder segment %s: inconsistent header (header %d bytes, record %d bytes, "
        "capacity %d, segment %d bytes) for a segment of %d bytes",
        name, header_bytes, record_bytes, capacity, segment_bytes, size));
  }
  FlightRecorderContents contents;
  contents.segment = name;
  contents.writer_pid = LoadWord32(h.writer_pid);
  contents.capacity = static_cast<int>(capacity);
  contents.records = CopyRecords(base, capacity);
  // Read after the records: a writer claims its seq before it publishes the record, so this is at
  // least one past the newest record copied.
  contents.next_seq = LoadWord(h.next_seq, std::memory_order_acquire);
  if (!contents.records.empty()) {
    // A segment of a single-writer build, which advanced next_seq after each record: its writer
    // may have been killed in between.
    contents.next_seq = std::max(contents.next_seq, contents.records.back().seq + 1);
  }
  contents.dropped = LoadWord(h.dropped, std::memory_order_relaxed);
  return contents;
}

namespace {

proto::FlightRecorderDump ToProto(const FlightRecorderDump& in) {
  const FlightRecorderContents& contents = in.contents;
  proto::FlightRecorderDump dump;
  dump.set_format_version(kDumpFormatVersion);
  dump.set_segment(contents.segment);
  dump.set_rank(in.rank);
  dump.set_writer_pid(contents.writer_pid);
  dump.set_capacity(static_cast<uint32_t>(contents.capacity));
  dump.set_next_seq(contents.next_seq);
  dump.set_dropped(contents.dropped);
  for (const FlightRecord& r : contents.records) {
    proto::FlightRecordProto* p = dump.add_records();
    p->set_seq(r.seq);
    p->set_time_ns(r.time_ns);
    p->set_step(r.step);
    p->set_type(static_cast<uint32_t>(r.type));
    p->set_flags(r.flags);
    p->set_peer(r.peer);
    p->set_comm_id(r.comm_id);
    p->set_comm_seq(r.comm_seq);
    p->set_bytes(r.bytes);
    p->set_value(r.value);
    p->set_name(std::string(r.Name()));
  }
  for (const auto& [key, value] : in.evidence) {
    proto::DumpEvidence* e = dump.add_evidence();
    e->set_key(key);
    e->set_value(value);
  }
  dump.set_dumped_unix_micros(absl::ToUnixMicros(in.dumped_at));
  dump.set_dumped_monotonic_ns(in.dumped_monotonic_ns);
  return dump;
}

}  // namespace

absl::StatusOr<std::string> FlightRecorderDumpToJson(const FlightRecorderDump& dump) {
  return ProtoToJson(ToProto(dump));
}

namespace {

// `dump` stamped with the time now, and its bytes as WriteFlightRecorderDump writes them; `path`
// names it in the error.
absl::StatusOr<std::string> StampAndSerialize(FlightRecorderDump& dump, const std::string& path) {
  dump.dumped_at = absl::Now();
  dump.dumped_monotonic_ns = MonotonicNanos();
  std::string bytes;
  if (!ToProto(dump).SerializeToString(&bytes)) {
    return absl::InternalError(absl::StrFormat("flight recorder dump %s: cannot serialize", path));
  }
  return bytes;
}

// The dump's bytes, as WriteFlightRecorderDump writes them; `path` names it in the error.
absl::StatusOr<std::string> SerializeDump(
    const FlightRecorderContents& contents, int rank,
    const std::vector<std::pair<std::string, std::string>>& extra, const std::string& path) {
  FlightRecorderDump in;
  in.rank = rank;
  in.contents = contents;
  in.evidence = extra;
  return StampAndSerialize(in, path);
}

// Writes `bytes` to `temp_path` and syncs it.
absl::Status WriteSynced(Env* env, const std::string& temp_path, const std::string& bytes) {
  absl::StatusOr<std::unique_ptr<WritableFile>> file = env->NewWritableFile(temp_path);
  if (!file.ok()) return file.status();
  if (absl::Status s = (*file)->Append(bytes); !s.ok()) return s;
  if (absl::Status s = (*file)->Sync(); !s.ok()) return s;
  return (*file)->Close();
}

}  // namespace

absl::Status WriteFlightRecorderDump(const FlightRecorderContents& contents, int rank,
                                     const std::vector<std::pair<std::string, std::string>>& extra,
                                     const std::string& path) {
  absl::StatusOr<std::string> bytes = SerializeDump(contents, rank, extra, path);
  if (!bytes.ok()) return bytes.status();
  Env* env = Env::Default();
  const std::string temp_path = absl::StrFormat("%s.tmp.%d", path, getpid());
  absl::Status status = WriteSynced(env, temp_path, *bytes);
  if (status.ok()) status = env->RenameFile(temp_path, path);
  if (!status.ok()) {
    env->RemoveFile(temp_path).IgnoreError();
    return status;
  }
  return env->SyncDir(DirName(path));
}

absl::StatusOr<std::string> WriteNewFlightRecorderDump(
    const FlightRecorderContents& contents, int rank,
    const std::vector<std::pair<std::string, std::string>>& extra, const std::string& prefix,
    int64_t first) {
  FlightRecorderDump dump;
  dump.rank = rank;
  dump.contents = contents;
  dump.evidence = extra;
  return WriteNewFlightRecorderDump(&dump, prefix, first);
}

absl::StatusOr<std::string> WriteNewFlightRecorderDump(FlightRecorderDump* dump,
                                                       const std::string& prefix, int64_t first) {
  absl::StatusOr<std::string> bytes = StampAndSerialize(*dump, prefix + "*.pb");
  if (!bytes.ok()) return bytes.status();
  Env* env = Env::Default();
  // Unique among the hosts sharing the directory, whose pids may be equal (PID namespaces).
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string temp_path =
      absl::StrFormat("%stmp.%s.%d.%d", prefix, host, getpid(), MonotonicNanos());
  if (absl::Status s = WriteSynced(env, temp_path, *bytes); !s.ok()) {
    env->RemoveFile(temp_path).IgnoreError();
    return s;
  }
  constexpr int64_t kMaxTries = 100000;
  std::string path;
  int error = EEXIST;
  for (int64_t n = std::max<int64_t>(first, 1); error == EEXIST && n < first + kMaxTries; ++n) {
    path = absl::StrFormat("%s%d.pb", prefix, n);
    error = link(temp_path.c_str(), path.c_str()) == 0 ? 0 : errno;
  }
  env->RemoveFile(temp_path).IgnoreError();
  if (error != 0) {
    return absl::InternalError(absl::StrFormat("flight recorder dump: linking %s to %s: %s",
                                               temp_path, path, std::strerror(error)));
  }
  if (absl::Status s = env->SyncDir(DirName(path)); !s.ok()) return s;
  return path;
}

namespace {

// One record of a ring, in ring order, into where the ring leaves its rank (PositionsOf).
void AddPosition(CollectivePositions& positions, FlightRecordType type, uint16_t flags,
                 uint64_t comm_id, int64_t comm_seq, std::string_view name) {
  if (type == FlightRecordType::kCollectiveBegin) {
    CollectivePosition& p = positions[comm_id];
    // The name of the first record of the newest collective entered (a later one of the same seq
    // is the same collective).
    if (comm_seq > p.entered) p.op = std::string(name);
    p.entered_any = true;
    if (comm_seq >= p.entered) {
      p.entered = comm_seq;
      p.left = false;
    }
  } else if (type == FlightRecordType::kCollectiveEnd) {
    CollectivePosition& p = positions[comm_id];
    if (comm_seq == p.entered && (flags & kFlightRecordFailed) == 0) p.left = true;
  } else if (type == FlightRecordType::kCommunicator) {
    CollectivePosition& p = positions[comm_id];
    p.member = true;
    p.comm_name = std::string(name);
  }
}

// ReadFlightRecorderDump; with `positions`, the records are not kept but reduced into it.
absl::StatusOr<FlightRecorderDump> ReadDump(const std::string& path, Env* env,
                                            CollectivePositions* positions) {
  if (env == nullptr) env = Env::Default();
  absl::StatusOr<std::string> bytes = env->ReadFileToString(path);
  if (!bytes.ok()) return bytes.status();
  // Parsed on an arena: a dump's thousands of records are a message (and a name) each, whose
  // allocations and destructions took most of a read's time without one. A coordinator reads
  // every rank's dump of a hang (HangCoordinator).
  google::protobuf::Arena arena;
  proto::FlightRecorderDump& dump =
      *google::protobuf::Arena::CreateMessage<proto::FlightRecorderDump>(&arena);
  if (!dump.ParseFromString(*bytes) || dump.format_version() != kDumpFormatVersion ||
      dump.segment().empty()) {
    return absl::DataLossError(absl::StrFormat(
        "flight recorder dump %s: not a flight recorder dump (%d bytes that do not parse as "
        "format version %d of trainguard.proto.FlightRecorderDump)",
        path, bytes->size(), kDumpFormatVersion));
  }
  FlightRecorderDump out;
  out.rank = dump.rank();
  out.contents.segment = dump.segment();
  out.contents.writer_pid = dump.writer_pid();
  out.contents.capacity = static_cast<int>(dump.capacity());
  out.contents.next_seq = dump.next_seq();
  out.contents.dropped = dump.dropped();
  if (positions != nullptr) {
    for (const proto::FlightRecordProto& p : dump.records()) {
      // The name as the ring holds it (FlightRecord::Name): at most 63 bytes, up to a NUL.
      std::string_view name(p.name().data(),
                            std::min(p.name().size(), sizeof(FlightRecord::name) - 1));
      name = name.substr(0, name.find('\0'));
      AddPosition(*positions, static_cast<FlightRecordType>(p.type()),
                  static_cast<uint16_t>(p.flags()), p.comm_id(), p.comm_seq(), name);
    }
  } else {
    out.contents.records.reserve(dump.records_size());
    for (const proto::FlightRecordProto& p : dump.records()) {
      FlightRecord& r = out.contents.records.emplace_back();
      r.seq = p.seq();
      r.time_ns = p.time_ns();
      r.step = p.step();
      r.type = static_cast<FlightRecordType>(p.type());
      r.flags = static_cast<uint16_t>(p.flags());
      r.peer = p.peer();
      r.comm_id = p.comm_id();
      r.comm_seq = p.comm_seq();
      r.bytes = p.bytes();
      r.value = p.value();
      std::memcpy(r.name, p.name().data(), std::min(p.name().size(), sizeof(r.name) - 1));
    }
  }
  for (const proto::DumpEvidence& e : dump.evidence()) {
    out.evidence.emplace_back(e.key(), e.value());
  }
  out.dumped_at = absl::FromUnixMicros(dump.dumped_unix_micros());
  out.dumped_monotonic_ns = dump.dumped_monotonic_ns();
  return out;
}

}  // namespace

absl::StatusOr<FlightRecorderDump> ReadFlightRecorderDump(const std::string& path, Env* env) {
  return ReadDump(path, env, /*positions=*/nullptr);
}

absl::StatusOr<FlightRecorderDumpPositions> ReadFlightRecorderDumpPositions(const std::string& path,
                                                                            Env* env) {
  FlightRecorderDumpPositions read;
  absl::StatusOr<FlightRecorderDump> dump = ReadDump(path, env, &read.positions);
  if (!dump.ok()) return dump.status();
  read.dump = *std::move(dump);
  return read;
}

absl::StatusOr<std::vector<int>> ListFlightRecorderRanks(std::string_view job_id) {
  if (absl::Status s = CheckJobId(job_id, 0); !s.ok()) return s;
  // SegmentName without its leading '/', up to the rank.
  const std::string prefix = FlightRecorder::SegmentName(job_id, 0).substr(1);
  const std::string_view stem = std::string_view(prefix).substr(0, prefix.size() - 1);
  DIR* dir = opendir(kShmDir);
  if (dir == nullptr) {
    return absl::InternalError(
        absl::StrFormat("flight recorder: cannot list %s: %s", kShmDir, std::strerror(errno)));
  }
  std::vector<int> ranks;
  while (dirent* entry = readdir(dir)) {
    std::string_view name = entry->d_name;
    int rank;
    if (!name.starts_with(stem)) continue;
    name.remove_prefix(stem.size());
    if (name.empty() || name.find_first_not_of("0123456789") != std::string_view::npos ||
        !absl::SimpleAtoi(absl::string_view(name.data(), name.size()), &rank) ||
        FlightRecorder::SegmentName(job_id, rank) != absl::StrFormat("/%s", entry->d_name)) {
      continue;  // another job's, another kind of segment, or a rank with leading zeros
    }
    ranks.push_back(rank);
  }
  closedir(dir);
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

std::string LaggardReport::ToString() const {
  return absl::StrFormat("rank%s %s never entered %s #%d (comm %d) that rank%s %s %s waiting in",
                         laggards.size() == 1 ? "" : "s", absl::StrJoin(laggards, ","), op,
                         comm_seq, comm_id, waiting.size() == 1 ? "" : "s",
                         absl::StrJoin(waiting, ","), waiting.size() == 1 ? "is" : "are");
}

CollectivePositions PositionsOf(const FlightRecorderContents& ring) {
  CollectivePositions positions;
  for (const FlightRecord& r : ring.records) {
    AddPosition(positions, r.type, r.flags, r.comm_id, r.comm_seq, r.Name());
  }
  return positions;
}

std::vector<LaggardReport> FindLaggards(const std::vector<int>& ranks,
                                        const std::vector<FlightRecorderContents>& rings) {
  std::vector<CollectivePositions> positions;
  positions.reserve(rings.size());
  for (const FlightRecorderContents& ring : rings) positions.push_back(PositionsOf(ring));
  return FindLaggards(ranks, positions);
}

namespace {

// One communicator's newest collective (the one its members are stuck in) and who stands where
// in it: what FindLaggards reports and FindHangRoots follows.
struct CommunicatorWaits {
  uint64_t comm_id = 0;
  int64_t newest = -1;  // its sequence number
  std::string op;       // its name, as the first member (in `positions` order) to enter it has it
  int members = 0;      // the positions that show the communicator (registered or entered)
  // Indices into `positions`: members that never entered it, and members in it that have not left.
  std::vector<int> laggards;
  std::vector<int> waiting;
};

// Per communicator any position shows, by id; those no member entered a collective of are left
// out.
std::vector<CommunicatorWaits> WaitsPerCommunicator(
    const std::vector<CollectivePositions>& positions) {
  std::map<uint64_t, CommunicatorWaits> by_comm;
  for (const CollectivePositions& rank_positions : positions) {
    for (const auto& [comm, p] : rank_positions) {
      CommunicatorWaits& w = by_comm[comm];
      w.comm_id = comm;
      ++w.members;
      if (p.entered_any && p.entered > w.newest) {
        w.newest = p.entered;
        w.op = p.op;
      }
    }
  }
  std::vector<CommunicatorWaits> out;
  for (auto& [comm, w] : by_comm) {
    if (w.newest < 0) continue;
    for (size_t i = 0; i < positions.size(); ++i) {
      auto it = positions[i].find(comm);
      if (it == positions[i].end()) continue;  // not a member of this communicator
      if (it->second.entered < w.newest) {
        w.laggards.push_back(static_cast<int>(i));
      } else if (!it->second.left) {
        w.waiting.push_back(static_cast<int>(i));
      }
    }
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace

std::vector<LaggardReport> FindLaggards(const std::vector<int>& ranks,
                                        const std::vector<CollectivePositions>& positions) {
  std::vector<LaggardReport> out;
  for (const CommunicatorWaits& w : WaitsPerCommunicator(positions)) {
    if (w.laggards.empty() || w.waiting.empty()) continue;
    LaggardReport report{w.comm_id, w.newest, w.op, {}, {}};
    for (int i : w.laggards) report.laggards.push_back(ranks[i]);
    for (int i : w.waiting) report.waiting.push_back(ranks[i]);
    out.push_back(std::move(report));
  }
  return out;
}

namespace {

// The wait-for graph of FindHangRoots: nodes [0, ranks) are the ranks (by index), the nodes after
// them one per communicator whose waiting members wait for its laggards (waiters -> hub ->
// laggards: linear in the members, where an edge per pair would be quadratic).
struct WaitGraph {
  std::vector<std::vector<int>> out;
  int ranks = 0;
};

// Tarjan's strongly connected components, iteratively; component[v] per node, and which
// components have an edge leaving them.
void SinkComponents(const WaitGraph& g, std::vector<int>& component, std::vector<bool>& leaves) {
  const int n = static_cast<int>(g.out.size());
  std::vector<int> index(n, -1), low(n, 0), stack;
  std::vector<bool> on_stack(n, false);
  component.assign(n, -1);
  int next_index = 0;
  int components = 0;
  std::vector<std::pair<int, size_t>> frames;  // node, next edge
  for (int root = 0; root < n; ++root) {
    if (index[root] >= 0) continue;
    frames.push_back({root, 0});
    index[root] = low[root] = next_index++;
    stack.push_back(root);
    on_stack[root] = true;
    while (!frames.empty()) {
      auto& [v, edge] = frames.back();
      if (edge < g.out[v].size()) {
        const int w = g.out[v][edge++];
        if (index[w] < 0) {
          index[w] = low[w] = next_index++;
          stack.push_back(w);
          on_stack[w] = true;
          frames.push_back({w, 0});
        } else if (on_stack[w]) {
          low[v] = std::min(low[v], index[w]);
        }
        continue;
      }
      const int done = v;
      frames.pop_back();
      if (!frames.empty()) low[frames.back().first] = std::min(low[frames.back().first], low[done]);
      if (low[done] != index[done]) continue;
      while (true) {
        const int w = stack.back();
        stack.pop_back();
        on_stack[w] = false;
        component[w] = components;
        if (w == done) break;
      }
      ++components;
    }
  }
  leaves.assign(components, false);
  for (int v = 0; v < n; ++v) {
    for (int w : g.out[v]) {
      if (component[w] != component[v]) leaves[component[v]] = true;
    }
  }
}

std::string DescribeComm(uint64_t comm_id, const std::string& name) {
  return name.empty() ? absl::StrFormat("comm %d", comm_id)
                      : absl::StrFormat("comm %d \"%s\"", comm_id, name);
}

}  // namespace

HangDependencies FindHangRoots(const std::vector<int>& ranks,
                               const std::vector<CollectivePositions>& positions) {
  WaitGraph g;
  g.ranks = static_cast<int>(ranks.size());
  g.out.resize(ranks.size());
  std::vector<bool> has_in(ranks.size(), false);
  // rank index -> who waits for it directly: the first few, and how many.
  std::map<int, std::vector<WaitFor>> waited_by;
  std::map<int, int> waited_by_count;
  auto note = [&](int waiter, int waited, uint64_t comm, const CollectivePosition& p) {
    if (waited_by[waited].size() < HangRoot::kShown) {
      waited_by[waited].push_back(
          {ranks[waiter], ranks[waited], comm, p.comm_name, p.entered, p.op});
    }
  };
  for (const CommunicatorWaits& cw : WaitsPerCommunicator(positions)) {
    const uint64_t comm = cw.comm_id;
    const std::vector<int>& laggards = cw.laggards;
    const std::vector<int>& waiters = cw.waiting;
    if (!laggards.empty() && !waiters.empty()) {
      const int hub = static_cast<int>(g.out.size());
      g.out.emplace_back(laggards.begin(), laggards.end());
      for (int w : waiters) g.out[w].push_back(hub);
      for (int l : laggards) {
        has_in[l] = true;
        waited_by_count[l] += static_cast<int>(waiters.size());
        for (int w : waiters) {
          if (waited_by[l].size() >= HangRoot::kShown) break;
          note(w, l, comm, positions[w].at(comm));
        }
      }
    }
    // A receive matched by a send still in flight waits for the sender: on a pipeline link, a
    // communicator of two ranks whose sequence numbers pair each send with its receive.
    if (cw.members != 2) continue;
    for (int w : waiters) {
      const CollectivePosition& p = positions[w].at(comm);
      if (p.op != "recv") continue;
      for (int s : waiters) {
        if (s != w && positions[s].at(comm).op == "send") {
          g.out[w].push_back(s);
          has_in[s] = true;
          ++waited_by_count[s];
          note(w, s, comm, p);
        }
      }
    }
  }
  std::vector<int> component;
  std::vector<bool> leaves;
  SinkComponents(g, component, leaves);
  HangDependencies out;
  std::vector<std::pair<int, int>> by_rank;  // (rank, index)
  for (int v = 0; v < g.ranks; ++v) by_rank.push_back({ranks[v], v});
  std::sort(by_rank.begin(), by_rank.end());
  for (const auto& [rank, v] : by_rank) {
    if (!g.out[v].empty() && leaves[component[v]]) out.waiting.push_back(rank);
    // A root: waited for, and its waits (if any) lead nowhere else.
    if (leaves[component[v]] || !has_in[v]) continue;
    HangRoot root;
    root.rank = rank;
    root.waited_by = std::move(waited_by[v]);
    root.waited_by_count = waited_by_count[v];
    out.roots.push_back(std::move(root));
  }
  return out;
}

std::string HangRoot::ToString() const {
  std::string out = absl::StrFormat("rank %d is where the waits end:", rank);
  for (size_t i = 0; i < waited_by.size(); ++i) {
    const WaitFor& w = waited_by[i];
    absl::StrAppendFormat(&out, "%s rank %d %sin %s #%d (%s)", i == 0 ? "" : ",", w.waiter,
                          i == 0 ? "waits for it " : "", w.op, w.comm_seq,
                          DescribeComm(w.comm_id, w.comm_name));
  }
  if (waited_by_count > static_cast<int>(waited_by.size())) {
    absl::StrAppendFormat(&out, " and %d more", waited_by_count - waited_by.size());
  }
  return out;
}

}  // namespace trainguard
