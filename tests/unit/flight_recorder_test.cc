// Specification of the flight recorder (sdk/watchdog/flight_recorder.h): a ring of records in
// POSIX shared memory that another process reads while the writer runs, is stopped, or is dead.
#include "sdk/watchdog/flight_recorder.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <latch>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/full_shm_env.h"
#include "tests/support/own_process.h"
#include "tests/support/temp_dir.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::SignalOwnProcess;
using testing::TempDir;

// A record whose every field is derived from `seq`, so that a reader can tell a torn one.
FlightRecord RecordFor(uint64_t seq) {
  FlightRecord r;
  r.step = static_cast<int64_t>(seq / 10);
  r.type = static_cast<FlightRecordType>(1 + seq % 9);
  r.flags = static_cast<uint16_t>(seq & 0xFFFF);
  r.peer = static_cast<int32_t>(seq % 7);
  r.comm_id = seq * 3;
  r.comm_seq = static_cast<int64_t>(seq);
  r.bytes = seq * 8;
  r.value = static_cast<int64_t>(seq);
  std::snprintf(r.name, sizeof(r.name), "op-%llu", static_cast<unsigned long long>(seq));
  return r;
}

// Empty when `r` was appended as RecordFor(n) and is whole (any positive time); otherwise what
// differs.
std::string PayloadInconsistency(const FlightRecord& r, uint64_t n) {
  const FlightRecord want = RecordFor(n);
  if (r.seq == 0 || r.step != want.step || r.type != want.type || r.flags != want.flags ||
      r.peer != want.peer || r.comm_id != want.comm_id || r.comm_seq != want.comm_seq ||
      r.bytes != want.bytes || r.value != want.value || r.Name() != want.Name() || r.time_ns <= 0) {
    return absl::StrFormat("torn record: seq %d step %d comm_seq %d bytes %d value %d name %s",
                           r.seq, r.step, r.comm_seq, r.bytes, r.value, r.Name());
  }
  return "";
}

// Empty when `r` is the record RecordFor(r.seq) appended; otherwise what differs.
std::string Inconsistency(const FlightRecord& r) { return PayloadInconsistency(r, r.seq); }

// Empty when `r` is whole, whatever seq the recorder gave it: writers racing each other cannot know
// their seqs in advance, so they append RecordFor(n) for numbers n of their own (its comm_seq).
std::string PayloadInconsistency(const FlightRecord& r) {
  return PayloadInconsistency(r, static_cast<uint64_t>(r.comm_seq));
}

std::vector<uint64_t> Seqs(const std::vector<FlightRecord>& records) {
  std::vector<uint64_t> seqs;
  for (const FlightRecord& r : records) seqs.push_back(r.seq);
  return seqs;
}

// Waits (at most a minute: a bound for a broken test, not a timing expectation) for one byte.
bool WaitForByte(int fd) {
  pollfd p{fd, POLLIN, 0};
  char c;
  return poll(&p, 1, 60'000) == 1 && read(fd, &c, 1) == 1;
}

class FlightRecorderTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (int rank = 0; rank < 4; ++rank) FlightRecorder::Remove(job_, rank).IgnoreError();
  }
  // Unique per test and process: tests of several builds run at the same time on one host.
  const std::string job_ = absl::StrFormat(
      "frtest-%d-%s", getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
};

TEST_F(FlightRecorderTest, AppendedRecordsReadBackFieldForFieldOldestFirst) {
  auto fr = FlightRecorder::Create(job_, 1, 64);
  ASSERT_TRUE(fr.ok()) << fr.status();
  for (uint64_t seq = 1; seq <= 5; ++seq) (*fr)->Append(RecordFor(seq));

  std::vector<FlightRecord> records = (*fr)->Snapshot();
  ASSERT_THAT(Seqs(records), ElementsAre(1, 2, 3, 4, 5));
  for (const FlightRecord& r : records) EXPECT_EQ(Inconsistency(r), "");

  absl::StatusOr<FlightRecorderContents> read = ReadFlightRecorder(job_, 1);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->segment, "/trainguard." + job_ + ".fr.rank1");
  EXPECT_EQ(read->writer_pid, getpid());
  EXPECT_EQ(read->capacity, 64);
  EXPECT_EQ(read->next_seq, 6u);
  ASSERT_EQ(read->records.size(), 5u);
  EXPECT_EQ(std::memcmp(read->records.data(), records.data(), 5 * sizeof(FlightRecord)), 0);
}

TEST_F(FlightRecorderTest, TheSegmentIsNamedAfterJobAndRankAndOnlyItsOwnerMayOpenIt) {
  auto fr = FlightRecorder::Create(job_, 3, 16);
  ASSERT_TRUE(fr.ok()) << fr.status();
  EXPECT_EQ(FlightRecorder::SegmentName(job_, 3), "/trainguard." + job_ + ".fr.rank3");
  struct stat st;
  ASSERT_EQ(stat(("/dev/shm/trainguard." + job_ + ".fr.rank3").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(static_cast<size_t>(st.st_size), 128 + 16 * sizeof(FlightRecord));
}

TEST_F(FlightRecorderTest, AFullDevShmFailsCreateWithResourceExhaustedAndLeavesNoSegment) {
  testing::FullShmEnv env(/*capacity=*/4096);
  auto fr = FlightRecorder::Create(job_, 2, 1024, &env);
  ASSERT_EQ(fr.status().code(), absl::StatusCode::kResourceExhausted) << fr.status();
  EXPECT_THAT(fr.status().message(), HasSubstr(FlightRecorder::SegmentName(job_, 2)));
  EXPECT_THAT(fr.status().message(), HasSubstr("flight recorder"));
  EXPECT_EQ(env.refusals(), 1);
  EXPECT_THAT(env.left_behind(), ::testing::IsEmpty());
  EXPECT_TRUE(absl::IsNotFound(ReadFlightRecorder(job_, 2).status()));
  // The same Env with room: the ring is created, and removed through it.
  testing::FullShmEnv roomy(/*capacity=*/1 << 30);
  {
    auto ok = FlightRecorder::Create(job_, 2, 1024, &roomy);
    ASSERT_TRUE(ok.ok()) << ok.status();
    EXPECT_EQ(roomy.left_behind().size(), 1u);
  }
  EXPECT_THAT(roomy.left_behind(), ::testing::IsEmpty());
}

TEST_F(FlightRecorderTest, AppendStampsTheTimeOnlyWhenTheCallerLeftItZero) {
  auto fr = FlightRecorder::Create(job_, 0, 16);
  ASSERT_TRUE(fr.ok()) << fr.status();
  FlightRecord stamped = RecordFor(1);
  FlightRecord given = RecordFor(2);
  given.time_ns = 42;
  (*fr)->Append(stamped);
  (*fr)->Append(given);
  std::vector<FlightRecord> records = (*fr)->Snapshot();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_GT(records[0].time_ns, 42);
  EXPECT_EQ(records[1].time_ns, 42);
}

TEST_F(FlightRecorderTest, ANameOfSixtyFourBytesIsCutToSixtyThreeAndTerminated) {
  auto fr = FlightRecorder::Create(job_, 0, 16);
  ASSERT_TRUE(fr.ok()) << fr.status();
  FlightRecord r;
  std::memset(r.name, 'x', sizeof(r.name));  // no terminator at all
  (*fr)->Append(r);
  std::vector<FlightRecord> records = (*fr)->Snapshot();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].Name(), std::string(63, 'x'));
}

TEST_F(FlightRecorderTest, WrapAroundKeepsTheNewestCapacityRecordsOldestFirst) {
  auto fr = FlightRecorder::Create(job_, 0, 16);
  ASSERT_TRUE(fr.ok()) << fr.status();
  for (uint64_t seq = 1; seq <= 16 * 3 + 5; ++seq) (*fr)->Append(RecordFor(seq));
  std::vector<uint64_t> want;
  for (uint64_t seq = 38; seq <= 53; ++seq) want.push_back(seq);
  EXPECT_EQ(Seqs((*fr)->Snapshot()), want);
  absl::StatusOr<FlightRecorderContents> read = ReadFlightRecorder(job_, 0);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(Seqs(read->records), want);
  EXPECT_EQ(read->next_seq, 54u);
  for (const FlightRecord& r : read->records) EXPECT_EQ(Inconsistency(r), "");
}

TEST_F(FlightRecorderTest, CreateRefusesACapacityBelowSixteenAndAJobIdWithASlash) {
  EXPECT_EQ(FlightRecorder::Create(job_, 0, 15).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FlightRecorder::Create("a/b", 0, 16).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FlightRecorder::Create("", 0, 16).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(FlightRecorderTest, CreateReplacesASegmentLeftBehindByAnEarlierProcess) {
  {
    auto old = FlightRecorder::Create(job_, 0, 32);
    ASSERT_TRUE(old.ok()) << old.status();
    (*old)->set_remove_on_destroy(false);
    for (uint64_t seq = 1; seq <= 10; ++seq) (*old)->Append(RecordFor(seq));
  }
  auto fr = FlightRecorder::Create(job_, 0, 16);
  ASSERT_TRUE(fr.ok()) << fr.status();
  absl::StatusOr<FlightRecorderContents> read = ReadFlightRecorder(job_, 0);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->capacity, 16);
  EXPECT_TRUE(read->records.empty());
}

TEST_F(FlightRecorderTest, TheDestructorRemovesTheSegmentUnlessToldToKeepIt) {
  { ASSERT_TRUE(FlightRecorder::Create(job_, 0, 16).ok()); }
  EXPECT_EQ(ReadFlightRecorder(job_, 0).status().code(), absl::StatusCode::kNotFound);
  {
    auto fr = FlightRecorder::Create(job_, 0, 16);
    ASSERT_TRUE(fr.ok()) << fr.status();
    (*fr)->set_remove_on_destroy(false);
    (*fr)->Append(RecordFor(1));
  }
  absl::StatusOr<FlightRecorderContents> read = ReadFlightRecorder(job_, 0);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(Seqs(read->records), ElementsAre(1));
}

TEST_F(FlightRecorderTest, RemoveDeletesTheSegmentAndSaysNotFoundTheSecondTime) {
  auto fr = FlightRecorder::Create(job_, 2, 16);
  ASSERT_TRUE(fr.ok()) << fr.status();
  (*fr)->set_remove_on_destroy(false);
  EXPECT_TRUE(FlightRecorder::Remove(job_, 2).ok());
  EXPECT_EQ(ReadFlightRecorder(job_, 2).status().code(), absl::StatusCode::kNotFound);
  absl::Status again = FlightRecorder::Remove(job_, 2);
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(again.message(), HasSubstr(FlightRecorder::SegmentName(job_, 2)));
}

TEST_F(FlightRecorderTest, AMissingSegmentIsNotFoundNamingIt) {
  absl::Status s = ReadFlightRecorder(job_, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(FlightRecorder::SegmentName(job_, 0)));
}

TEST_F(FlightRecorderTest, ASegmentWithoutTheMagicIsDataLossNamingIt) {
  const std::string name = FlightRecorder::SegmentName(job_, 0);
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  const std::string garbage(128 + 16 * 128, 'g');
  ASSERT_EQ(write(fd, garbage.data(), garbage.size()), static_cast<ssize_t>(garbage.size()));
  close(fd);
  absl::Status s = ReadFlightRecorder(job_, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(name));
  EXPECT_THAT(s.message(), HasSubstr("bad magic"));
}

TEST_F(FlightRecorderTest, ASegmentShorterThanItsHeaderOrItsCapacityIsDataLoss) {
  const std::string name = FlightRecorder::SegmentName(job_, 0);
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "TGFRREC1", 8), 8);
  close(fd);
  EXPECT_EQ(ReadFlightRecorder(job_, 0).status().code(), absl::StatusCode::kDataLoss);

  auto fr = FlightRecorder::Create(job_, 1, 16);
  ASSERT_TRUE(fr.ok()) << fr.status();
  fd = shm_open(FlightRecorder::SegmentName(job_, 1).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 128 + 15 * 128), 0);  // one slot cut off
  close(fd);
  absl::Status s = ReadFlightRecorder(job_, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(FlightRecorder::SegmentName(job_, 1)));
}

TEST_F(FlightRecorderTest, ARankKilledWithSigkillLeavesEveryRecordItWrote) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto fr = FlightRecorder::Create(job_, 0, 64);
    if (!fr.ok()) _exit(3);
    for (uint64_t seq = 1; seq <= 50; ++seq) (*fr)->Append(RecordFor(seq));
    if (write(ready[1], "r", 1) != 1) _exit(4);
    while (true) pause();
  }
  close(ready[1]);
  ASSERT_TRUE(WaitForByte(ready[0]));
  close(ready[0]);
  ASSERT_EQ(SignalOwnProcess(child, SIGKILL), absl::OkStatus());
  int status;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));

  absl::StatusOr<FlightRecorderContents> read = ReadFlightRecorder(job_, 0);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->writer_pid, child);
  EXPECT_EQ(read->next_seq, 51u);
  ASSERT_EQ(read->records.size(), 50u);
  for (size_t i = 0; i < read->records.size(); ++i) {
    EXPECT_EQ(read->records[i].seq, i + 1);
    EXPECT_EQ(Inconsistency(read->records[i]), "");
  }
}

TEST_F(FlightRecorderTest, ARankStoppedMidLoopLeavesAConsistentRunOfItsNewestRecords) {
  constexpr int kCapacity = 32;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto fr = FlightRecorder::Create(job_, 0, kCapacity);
    if (!fr.ok()) _exit(3);
    for (uint64_t seq = 1;; ++seq) (*fr)->Append(RecordFor(seq));
  }
  // Bounded polling until the child has wrapped its ring many times.
  bool wrapped = false;
  for (int attempt = 0; attempt < 60'000 && !wrapped; ++attempt) {
    absl::StatusOr<FlightRecorderContents> read = ReadFlightRecorder(job_, 0);
    wrapped = read.ok() && read->next_seq > 10 * kCapacity;
    if (!wrapped) usleep(1000);
  }
  ASSERT_EQ(SignalOwnProcess(child, SIGSTOP), absl::OkStatus());
  int status;
  ASSERT_EQ(waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  ASSERT_TRUE(wrapped);

  absl::StatusOr<FlightRecorderContents> first = ReadFlightRecorder(job_, 0);
  absl::StatusOr<FlightRecorderContents> second = ReadFlightRecorder(job_, 0);
  ASSERT_EQ(SignalOwnProcess(child, SIGKILL), absl::OkStatus());
  waitpid(child, &status, 0);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(Seqs(first->records), Seqs(second->records));  // a stopped writer changes nothing
  // The slot it was writing, if any, is left out; every other slot holds a whole record.
  ASSERT_GE(first->records.size(), static_cast<size_t>(kCapacity - 1));
  for (size_t i = 0; i < first->records.size(); ++i) {
    EXPECT_EQ(Inconsistency(first->records[i]), "");
    if (i > 0) {
      EXPECT_EQ(first->records[i].seq, first->records[i - 1].seq + 1);
    }
  }
  EXPECT_GE(first->next_seq, first->records.back().seq + 1);
}

TEST_F(FlightRecorderTest, ReadersRacingTheWriterNeverSeeATornRecord) {
  // The writer goes on until each reader has copied the ring this many times while it wrote (or,
  // bounding a broken test, until kMaxRecords).
  constexpr int64_t kSnapshotsPerReader = 200;
  constexpr uint64_t kMinRecords = 20'000, kMaxRecords = 100'000'000;
  auto fr = FlightRecorder::Create(job_, 0, 16);
  ASSERT_TRUE(fr.ok()) << fr.status();
  std::atomic<bool> done{false};
  std::atomic<int64_t> torn{0}, out_of_order{0};
  std::atomic<int64_t> same_snapshots{0}, own_snapshots{0};
  auto check = [&](const std::vector<FlightRecord>& records, std::atomic<int64_t>& snapshots) {
    for (size_t i = 0; i < records.size(); ++i) {
      if (!Inconsistency(records[i]).empty()) torn.fetch_add(1);
      if (i > 0 &&
          (records[i].seq <= records[i - 1].seq || records[i].seq - records[0].seq >= 16)) {
        out_of_order.fetch_add(1);
      }
    }
    snapshots.fetch_add(1);
  };
  // One reader through the writer's own mapping (ThreadSanitizer sees both sides), one through a
  // mapping of its own, as another process would.
  std::thread same_mapping([&] {
    while (!done.load()) check((*fr)->Snapshot(), same_snapshots);
  });
  std::thread own_mapping([&] {
    while (!done.load()) {
      absl::StatusOr<FlightRecorderContents> read = ReadFlightRecorder(job_, 0);
      if (read.ok()) check(read->records, own_snapshots);
    }
  });
  uint64_t seq = 1;
  for (; seq <= kMaxRecords; ++seq) {
    if (seq > kMinRecords &&
        same_snapshots.load(std::memory_order_relaxed) >= kSnapshotsPerReader &&
        own_snapshots.load(std::memory_order_relaxed) >= kSnapshotsPerReader) {
      break;
    }
    (*fr)->Append(RecordFor(seq));
  }
  done.store(true);
  same_mapping.join();
  own_mapping.join();
  EXPECT_EQ(torn.load(), 0);
  EXPECT_EQ(out_of_order.load(), 0);
  EXPECT_GE(same_snapshots.load(), kSnapshotsPerReader);
  EXPECT_GE(own_snapshots.load(), kSnapshotsPerReader);
  std::vector<FlightRecord> last = (*fr)->Snapshot();
  ASSERT_EQ(last.size(), 16u);
  EXPECT_EQ(last.back().seq, seq - 1);
}

// What is wrong with a copy of a ring of `capacity` that RaceWriters(.., per_writer, ..) writes: a
// torn record, seqs not ascending or spanning more than the ring, a writer's records out of the
// order it appended them. Empty when nothing.
std::string RacedCopyProblem(const std::vector<FlightRecord>& records, uint64_t capacity,
                             uint64_t per_writer) {
  if (records.size() > capacity) return absl::StrFormat("%d records", records.size());
  std::map<uint64_t, int64_t> newest_of_writer;
  for (size_t i = 0; i < records.size(); ++i) {
    const FlightRecord& r = records[i];
    if (std::string torn = PayloadInconsistency(r); !torn.empty()) return torn;
    if (i > 0 && r.seq <= records[i - 1].seq) {
      return absl::StrFormat("seq %d after seq %d", r.seq, records[i - 1].seq);
    }
    if (r.seq - records.front().seq >= capacity) {
      return absl::StrFormat("seqs %d to %d in a ring of %d", records.front().seq, r.seq, capacity);
    }
    auto [newest, first] = newest_of_writer.try_emplace(r.comm_seq / per_writer, r.comm_seq);
    if (!first && newest->second >= r.comm_seq) {
      return absl::StrFormat("writer %d: number %d at seq %d, after number %d",
                             r.comm_seq / per_writer, r.comm_seq, r.seq, newest->second);
    }
    newest->second = r.comm_seq;
  }
  return "";
}

// What the reader of RaceWriters saw: a problem per bad copy (RacedCopyProblem), out of `copies`.
struct RaceOutcome {
  std::vector<std::string> problems;
  int64_t copies = 0;
};

// Writers racing each other: writer w of `writers` appends RecordFor(w * per_writer + i) for i = 0,
// 1, ..., per_writer - 1, all of them at once (they start together), while another thread checks
// copies of the ring (of `capacity`) taken meanwhile, and once more after the writers are done.
RaceOutcome RaceWriters(FlightRecorder& fr, int writers, uint64_t per_writer, uint64_t capacity) {
  RaceOutcome outcome;
  std::latch start(writers + 1);
  std::atomic<bool> done{false};
  std::thread reader([&] {
    start.arrive_and_wait();
    bool last = false;
    do {
      last = done.load();
      ++outcome.copies;
      if (std::string p = RacedCopyProblem(fr.Snapshot(), capacity, per_writer); !p.empty()) {
        outcome.problems.push_back(p);
      }
    } while (!last);
  });
  std::vector<std::thread> threads;
  for (int w = 0; w < writers; ++w) {
    threads.emplace_back([&, w] {
      start.arrive_and_wait();
      for (uint64_t i = 0; i < per_writer; ++i) fr.Append(RecordFor(w * per_writer + i));
    });
  }
  for (std::thread& t : threads) t.join();
  done.store(true);
  reader.join();
  return outcome;
}

TEST_F(FlightRecorderTest, ConcurrentWritersLoseNoRecordAndTearNoneWhileTheRingDoesNotWrap) {
  constexpr int kWriters = 4;
  constexpr uint64_t kPerWriter = 2'000, kRecords = kWriters * kPerWriter;
  auto fr = FlightRecorder::Create(job_, 0, static_cast<int>(kRecords));
  ASSERT_TRUE(fr.ok()) << fr.status();
  const RaceOutcome race = RaceWriters(**fr, kWriters, kPerWriter, kRecords);
  EXPECT_THAT(race.problems, ::testing::IsEmpty()) << "in " << race.copies << " copies";

  absl::StatusOr<FlightRecorderContents> read = ReadFlightRecorder(job_, 0);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->dropped, 0u);
  EXPECT_EQ(read->next_seq, kRecords + 1);
  ASSERT_EQ(read->records.size(), kRecords);
  // Seqs 1 to kRecords, each number once.
  std::vector<int> times_seen(kRecords, 0);
  for (size_t i = 0; i < read->records.size(); ++i) {
    const FlightRecord& r = read->records[i];
    ASSERT_EQ(r.seq, i + 1);
    ASSERT_EQ(PayloadInconsistency(r), "");
    ASSERT_LT(static_cast<uint64_t>(r.comm_seq), kRecords);
    ++times_seen[r.comm_seq];
  }
  EXPECT_THAT(times_seen, ::testing::Each(1));
}

TEST_F(FlightRecorderTest, ConcurrentWritersWrappingTheRingLeaveOnlyWholeRecordsOfItsNewestSeqs) {
  constexpr int kWriters = 4;
  constexpr uint64_t kCapacity = 16, kPerWriter = 20'000, kRecords = kWriters * kPerWriter;
  auto fr = FlightRecorder::Create(job_, 0, static_cast<int>(kCapacity));
  ASSERT_TRUE(fr.ok()) << fr.status();
  const RaceOutcome race = RaceWriters(**fr, kWriters, kPerWriter, kCapacity);
  EXPECT_THAT(race.problems, ::testing::IsEmpty()) << "in " << race.copies << " copies";

  absl::StatusOr<FlightRecorderContents> read = ReadFlightRecorder(job_, 0);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->next_seq, kRecords + 1);
  EXPECT_EQ(RacedCopyProblem(read->records, kCapacity, kPerWriter), "");
  ASSERT_FALSE(read->records.empty());
  EXPECT_GT(read->records.front().seq, kRecords - kCapacity);
  // A record is dropped only when a writer was preempted inside Append while the others wrapped the
  // ring; without one, the last kCapacity seqs are all there.
  if (read->dropped == 0) {
    std::vector<uint64_t> newest;
    for (uint64_t seq = kRecords - kCapacity + 1; seq <= kRecords; ++seq) newest.push_back(seq);
    EXPECT_EQ(Seqs(read->records), newest);
  }
}

// Plays, through a mapping of its own, a writer of the segment that claimed a seq and stalls in the
// middle of its record, as a thread preempted inside Append would (layout: docs/FORMATS.md).
class StalledWriter {
 public:
  StalledWriter(const std::string& segment, int capacity)
      : bytes_(128 + static_cast<size_t>(capacity) * sizeof(FlightRecord)), capacity_(capacity) {
    const int fd = shm_open(segment.c_str(), O_RDWR, 0);
    if (fd < 0) return;
    void* base = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base != MAP_FAILED) words_ = static_cast<uint64_t*>(base);
  }
  ~StalledWriter() {
    if (words_ != nullptr) munmap(words_, bytes_);
  }
  bool ok() const { return words_ != nullptr; }

  // Claims the next seq and marks its slot being written; returns the seq.
  uint64_t Claim() {
    seq_ = std::atomic_ref<uint64_t>(words_[4]).fetch_add(1);  // header.next_seq
    Word(0).store(~uint64_t{0});
    return seq_;
  }
  // Writes `record` into the claimed slot and publishes it.
  void Finish(const FlightRecord& record) {
    for (size_t i = 1; i < sizeof(FlightRecord) / 8; ++i) {
      uint64_t word;
      std::memcpy(&word, reinterpret_cast<const char*>(&record) + 8 * i, 8);
      Word(i).store(word);
    }
    Word(0).store(seq_);
  }

 private:
  std::atomic_ref<uint64_t> Word(size_t i) {
    return std::atomic_ref<uint64_t>(words_[16 + ((seq_ - 1) % capacity_) * 16 + i]);
  }
  const size_t bytes_;
  const uint64_t capacity_;
  uint64_t* words_ = nullptr;
  uint64_t seq_ = 0;
};

TEST_F(FlightRecorderTest, AnAppendWhoseSlotIsStillBeingWrittenAWrapLaterIsDroppedAndCounted) {
  constexpr int kCapacity = 16;
  auto fr = FlightRecorder::Create(job_, 0, kCapacity);
  ASSERT_TRUE(fr.ok()) << fr.status();
  for (uint64_t seq = 1; seq <= 3; ++seq) (*fr)->Append(RecordFor(seq));
  StalledWriter stalled(FlightRecorder::SegmentName(job_, 0), kCapacity);
  ASSERT_TRUE(stalled.ok());
  ASSERT_EQ(stalled.Claim(), 4u);

  // Seq 20 belongs in seq 4's slot, still being written: it is dropped, not waited for.
  for (uint64_t seq = 5; seq <= 21; ++seq) (*fr)->Append(RecordFor(seq));
  std::vector<uint64_t> want = {6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 21};
  absl::StatusOr<FlightRecorderContents> read = ReadFlightRecorder(job_, 0);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->dropped, 1u);
  EXPECT_EQ(read->next_seq, 22u);
  EXPECT_EQ(Seqs(read->records), want);
  for (const FlightRecord& r : read->records) EXPECT_EQ(Inconsistency(r), "");

  // Seq 4, published a wrap late, is older than every record a reader keeps: it stays out of sight.
  stalled.Finish(RecordFor(4));
  read = ReadFlightRecorder(job_, 0);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(Seqs(read->records), want);
  EXPECT_EQ(Seqs((*fr)->Snapshot()), want);

  // The slot is free again: seq 36 takes it.
  for (uint64_t seq = 22; seq <= 36; ++seq) (*fr)->Append(RecordFor(seq));
  want.clear();
  for (uint64_t seq = 21; seq <= 36; ++seq) want.push_back(seq);
  read = ReadFlightRecorder(job_, 0);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->dropped, 1u);
  EXPECT_EQ(Seqs(read->records), want);
}

TEST_F(FlightRecorderTest, ADumpReadsBackWithEveryRecordAndItsEvidence) {
  TempDir dir;
  auto fr = FlightRecorder::Create(job_, 2, 16);
  ASSERT_TRUE(fr.ok()) << fr.status();
  for (uint64_t seq = 1; seq <= 20; ++seq) (*fr)->Append(RecordFor(seq));
  absl::StatusOr<FlightRecorderContents> contents = ReadFlightRecorder(job_, 2);
  ASSERT_TRUE(contents.ok()) << contents.status();
  const std::string path = dir.File("rank2.pb");
  const std::string stacks = "thread 1 \"trainer\":\n  #0 read\n";
  ASSERT_TRUE(WriteFlightRecorderDump(*contents, 2,
                                      {{"reason", "hang in allreduce"}, {"stacks", stacks}}, path)
                  .ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp." + std::to_string(getpid())));

  absl::StatusOr<FlightRecorderDump> dump = ReadFlightRecorderDump(path);
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_EQ(dump->rank, 2);
  EXPECT_EQ(dump->contents.segment, contents->segment);
  EXPECT_EQ(dump->contents.writer_pid, getpid());
  EXPECT_EQ(dump->contents.capacity, 16);
  EXPECT_EQ(dump->contents.next_seq, 21u);
  ASSERT_EQ(dump->contents.records.size(), 16u);
  EXPECT_EQ(std::memcmp(dump->contents.records.data(), contents->records.data(),
                        16 * sizeof(FlightRecord)),
            0);
  EXPECT_THAT(dump->evidence,
              ElementsAre(std::pair<std::string, std::string>("reason", "hang in allreduce"),
                          std::pair<std::string, std::string>("stacks", stacks)));
  EXPECT_GT(dump->dumped_monotonic_ns, dump->contents.records.back().time_ns);
  EXPECT_GT(dump->dumped_at, absl::UnixEpoch());
}

// Read without its records, a dump gives the positions its records give, and the rest as read
// with them (a name of the full 64 bytes is cut as the ring cuts it).
TEST_F(FlightRecorderTest, ADumpReadForItsPositionsGivesWhatItsRecordsGive) {
  TempDir dir;
  FlightRecorderContents contents;
  contents.segment = FlightRecorder::SegmentName(job_, 3);
  contents.writer_pid = 77;
  contents.capacity = 16;
  auto collective = [](FlightRecordType type, uint64_t comm, int64_t seq, std::string name) {
    FlightRecord r;
    r.type = type;
    r.comm_id = comm;
    r.comm_seq = seq;
    std::memcpy(r.name, name.data(), std::min(name.size(), sizeof(r.name) - 1));
    return r;
  };
  using T = FlightRecordType;
  contents.records = {collective(T::kCollectiveBegin, 1, 0, "all_reduce"),
                      collective(T::kCollectiveEnd, 1, 0, "all_reduce"),
                      collective(T::kCollectiveBegin, 2, 5, std::string(70, 'x')),
                      collective(T::kCollectiveBegin, 1, 1, "all_gather"),
                      collective(T::kCollectiveEnd, 3, 4, "broadcast")};
  const std::string path = dir.File("rank-00003.1.pb");
  ASSERT_TRUE(WriteFlightRecorderDump(contents, 3, {{"reason", "hang"}}, path).ok());
  absl::StatusOr<FlightRecorderDump> whole = ReadFlightRecorderDump(path);
  ASSERT_TRUE(whole.ok()) << whole.status();
  absl::StatusOr<FlightRecorderDumpPositions> read = ReadFlightRecorderDumpPositions(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->dump.contents.records.empty());
  EXPECT_EQ(read->dump.rank, whole->rank);
  EXPECT_EQ(read->dump.contents.writer_pid, whole->contents.writer_pid);
  EXPECT_EQ(read->dump.evidence, whole->evidence);
  EXPECT_EQ(read->dump.dumped_at, whole->dumped_at);
  const CollectivePositions from_records = PositionsOf(whole->contents);
  ASSERT_EQ(read->positions.size(), from_records.size());
  for (const auto& [comm, p] : from_records) {
    const CollectivePosition& q = read->positions.at(comm);
    EXPECT_EQ(q.entered_any, p.entered_any) << comm;
    EXPECT_EQ(q.entered, p.entered) << comm;
    EXPECT_EQ(q.op, p.op) << comm;
    EXPECT_EQ(q.left, p.left) << comm;
  }
  EXPECT_EQ(read->positions.at(1).op, "all_gather");
  EXPECT_EQ(read->positions.at(2).op, std::string(63, 'x'));
  EXPECT_FALSE(read->positions.at(3).entered_any);
  EXPECT_EQ(ReadFlightRecorderDumpPositions(dir.File("absent.pb")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(FlightRecorderTest, ANewDumpTakesTheFirstFreeNumberAndReplacesNoEarlierDump) {
  // A replaced rank's old process, or a process of another host sharing the run dir, wrote
  // rank-00002.1.pb; a new process of rank 2 starts counting at 1 again.
  TempDir dir;
  auto fr = FlightRecorder::Create(job_, 2, 16);
  ASSERT_TRUE(fr.ok()) << fr.status();
  (*fr)->Append(RecordFor(1));
  absl::StatusOr<FlightRecorderContents> contents = ReadFlightRecorder(job_, 2);
  ASSERT_TRUE(contents.ok()) << contents.status();
  const std::string prefix = dir.File("rank-00002.");
  absl::StatusOr<std::string> earlier =
      WriteNewFlightRecorderDump(*contents, 2, {{"reason", "earlier process"}}, prefix);
  ASSERT_TRUE(earlier.ok()) << earlier.status();
  EXPECT_EQ(*earlier, prefix + "1.pb");
  absl::StatusOr<std::string> later =
      WriteNewFlightRecorderDump(*contents, 2, {{"reason", "replacement"}}, prefix, 1);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(*later, prefix + "2.pb");
  absl::StatusOr<std::string> hinted =
      WriteNewFlightRecorderDump(*contents, 2, {{"reason", "hinted"}}, prefix, 5);
  ASSERT_TRUE(hinted.ok()) << hinted.status();
  EXPECT_EQ(*hinted, prefix + "5.pb");

  for (const auto& [path, reason] : std::vector<std::pair<std::string, std::string>>{
           {*earlier, "earlier process"}, {*later, "replacement"}, {*hinted, "hinted"}}) {
    absl::StatusOr<FlightRecorderDump> dump = ReadFlightRecorderDump(path);
    ASSERT_TRUE(dump.ok()) << dump.status();
    EXPECT_THAT(dump->evidence, ElementsAre(std::pair<std::string, std::string>("reason", reason)))
        << path;
  }
  // No temporary is left, and every name still parses as a dump of rank 2.
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("rank-00002.1.pb", "rank-00002.2.pb",
                                                     "rank-00002.5.pb"));
}

TEST_F(FlightRecorderTest, ANewDumpIntoAMissingDirectoryFailsNamingIt) {
  TempDir dir;
  auto fr = FlightRecorder::Create(job_, 0, 16);
  ASSERT_TRUE(fr.ok()) << fr.status();
  absl::StatusOr<FlightRecorderContents> contents = ReadFlightRecorder(job_, 0);
  ASSERT_TRUE(contents.ok()) << contents.status();
  absl::StatusOr<std::string> written =
      WriteNewFlightRecorderDump(*contents, 0, {}, dir.File("absent/rank-00000."));
  ASSERT_FALSE(written.ok());
  EXPECT_THAT(written.status().message(), HasSubstr(dir.File("absent/rank-00000.")));
}

TEST_F(FlightRecorderTest, AFileThatIsNotADumpIsDataLossNamingIt) {
  TempDir dir;
  const std::string path = dir.File("not-a-dump.pb");
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("this is not a protobuf \xff\xff\xff", f);
  std::fclose(f);
  absl::Status s = ReadFlightRecorderDump(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_EQ(ReadFlightRecorderDump(dir.File("missing.pb")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(FlightRecorderTest, ListingFindsEveryRankOfTheJobAndNoOtherJobs) {
  auto r0 = FlightRecorder::Create(job_, 0, 16);
  auto r3 = FlightRecorder::Create(job_, 3, 16);
  auto other = FlightRecorder::Create(job_ + ".x", 1, 16);  // a job whose id extends this one's
  ASSERT_TRUE(r0.ok() && r3.ok() && other.ok());
  absl::StatusOr<std::vector<int>> ranks = ListFlightRecorderRanks(job_);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_THAT(*ranks, ElementsAre(0, 3));
}

TEST(FlightRecordTypeTest, EveryTypeHasASnakeCaseName) {
  EXPECT_EQ(FlightRecordTypeName(FlightRecordType::kStepBegin), "step_begin");
  EXPECT_EQ(FlightRecordTypeName(FlightRecordType::kCollectiveBegin), "collective_begin");
  EXPECT_EQ(FlightRecordTypeName(FlightRecordType::kCollectiveEnd), "collective_end");
  EXPECT_EQ(FlightRecordTypeName(FlightRecordType::kHang), "hang");
  EXPECT_EQ(FlightRecordTypeName(FlightRecordType::kMark), "mark");
}

}  // namespace
}  // namespace trainguard

namespace trainguard {
namespace {

FlightRecord Collective(FlightRecordType type, uint64_t comm, int64_t seq) {
  FlightRecord r;
  r.type = type;
  r.comm_id = comm;
  r.comm_seq = seq;
  std::snprintf(r.name, sizeof(r.name), "all_reduce");
  return r;
}

// The rank's registration in communicator `comm`, as CollectiveTracker::RegisterCommunicator
// writes it.
FlightRecord Registration(uint64_t comm, const char* name) {
  FlightRecord r;
  r.type = FlightRecordType::kCommunicator;
  r.comm_id = comm;
  std::snprintf(r.name, sizeof(r.name), "%s", name);
  return r;
}

TEST(FindLaggardsTest, TheRankThatNeverEnteredTheNewestCollectiveIsNamed) {
  using T = FlightRecordType;
  FlightRecorderContents waiting, stuck;
  for (int64_t seq = 0; seq < 5; ++seq) {
    waiting.records.push_back(Collective(T::kCollectiveBegin, 7, seq));
    if (seq < 4) waiting.records.push_back(Collective(T::kCollectiveEnd, 7, seq));
    if (seq < 4) {
      stuck.records.push_back(Collective(T::kCollectiveBegin, 7, seq));
      stuck.records.push_back(Collective(T::kCollectiveEnd, 7, seq));
    }
  }
  std::vector<LaggardReport> reports = FindLaggards({0, 1, 2}, {waiting, stuck, waiting});
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].comm_id, 7u);
  EXPECT_EQ(reports[0].comm_seq, 4);
  EXPECT_EQ(reports[0].laggards, std::vector<int>{1});
  EXPECT_EQ(reports[0].waiting, (std::vector<int>{0, 2}));
  EXPECT_EQ(reports[0].ToString(),
            "rank 1 never entered all_reduce #4 (comm 7) that ranks 0,2 are waiting in");
}

// A ring reduced to its positions (what a reader of thousands of dumps keeps of each) gives the
// same reports as the ring: per communicator, the newest collective entered, its name, and
// whether it was left; a communicator seen only leaving counts as never entered, and one the ring
// shows the rank registered in (a member) without entering any collective of it too.
TEST(FindLaggardsTest, PositionsGiveTheSameReportsAsTheRings) {
  using T = FlightRecordType;
  FlightRecorderContents waiting, stuck, left_only;
  for (FlightRecorderContents* ring : {&stuck, &left_only}) {
    ring->records.push_back(Registration(9, "dp0"));
  }
  for (int64_t seq = 0; seq < 5; ++seq) {
    waiting.records.push_back(Collective(T::kCollectiveBegin, 7, seq));
    waiting.records.push_back(Collective(T::kCollectiveBegin, 9, seq));
    if (seq < 4) waiting.records.push_back(Collective(T::kCollectiveEnd, 7, seq));
    waiting.records.push_back(Collective(T::kCollectiveEnd, 9, seq));
    if (seq < 4) {
      stuck.records.push_back(Collective(T::kCollectiveBegin, 7, seq));
      stuck.records.push_back(Collective(T::kCollectiveEnd, 7, seq));
    }
  }
  waiting.records.push_back(Collective(T::kCollectiveBegin, 9, 5));
  std::snprintf(waiting.records.back().name, sizeof(waiting.records.back().name), "all_gather");
  left_only.records.push_back(Collective(T::kCollectiveEnd, 7, 4));
  const std::vector<int> ranks = {0, 1, 2, 3};
  const std::vector<FlightRecorderContents> rings = {waiting, stuck, left_only, waiting};
  std::vector<CollectivePositions> positions;
  for (const FlightRecorderContents& ring : rings) positions.push_back(PositionsOf(ring));
  EXPECT_EQ(positions[0].at(9).entered, 5);
  EXPECT_EQ(positions[0].at(9).op, "all_gather");
  EXPECT_FALSE(positions[0].at(9).left);
  EXPECT_FALSE(positions[2].at(7).entered_any);
  std::vector<std::string> from_rings;
  for (const LaggardReport& r : FindLaggards(ranks, rings)) from_rings.push_back(r.ToString());
  std::vector<std::string> from_positions;
  for (const LaggardReport& r : FindLaggards(ranks, positions)) {
    from_positions.push_back(r.ToString());
  }
  EXPECT_EQ(from_positions, from_rings);
  EXPECT_THAT(from_rings,
              ::testing::ElementsAre(
                  "ranks 1,2 never entered all_reduce #4 (comm 7) that ranks 0,3 are waiting in",
                  "ranks 1,2 never entered all_gather #5 (comm 9) that ranks 0,3 are waiting in"));
}

// Ranks are compared in the communicators they are members of: a rank that neither registered in
// nor entered a communicator is not its laggard (a tensor-parallel group's collectives are not
// the other groups' business), one that registered and never entered is.
TEST(FindLaggardsTest, OnlyMembersOfACommunicatorAreItsLaggards) {
  using T = FlightRecordType;
  FlightRecorderContents waiting, member, outsider;
  waiting.records = {Registration(3, "tp1"), Collective(T::kCollectiveBegin, 3, 0)};
  member.records = {Registration(3, "tp1")};
  outsider.records = {Registration(2, "tp0"), Collective(T::kCollectiveBegin, 2, 0),
                      Collective(T::kCollectiveEnd, 2, 0)};
  std::vector<LaggardReport> reports = FindLaggards({0, 1, 2}, {waiting, member, outsider});
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].ToString(),
            "rank 1 never entered all_reduce #0 (comm 3) that rank 0 is waiting in");
  CollectivePositions positions = PositionsOf(member);
  EXPECT_TRUE(positions.at(3).member);
  EXPECT_EQ(positions.at(3).comm_name, "tp1");
  EXPECT_FALSE(positions.at(3).entered_any);
}

// A ring in the order the example trainer's ranks write it: registration, then per collective
// a begin and (unless it is stuck) an end.
struct RingBuilder {
  FlightRecorderContents ring;
  RingBuilder& Member(uint64_t comm, const char* name) {
    ring.records.push_back(Registration(comm, name));
    return *this;
  }
  // Ops 0..n-1 of `comm`, all left except the last when `stuck`.
  RingBuilder& Ops(uint64_t comm, int n, const char* op, bool stuck) {
    for (int seq = 0; seq < n; ++seq) {
      FlightRecord begin = Collective(FlightRecordType::kCollectiveBegin, comm, seq);
      std::snprintf(begin.name, sizeof(begin.name), "%s", op);
      ring.records.push_back(begin);
      if (!stuck || seq + 1 < n) {
        FlightRecord end = begin;
        end.type = FlightRecordType::kCollectiveEnd;
        ring.records.push_back(end);
      }
    }
    return *this;
  }
};

// Mycroft's case: a pipeline of 2 stages x 2 tensor-parallel ranks x 2 data-parallel replicas
// (ranks 0-3 stage 0, 4-7 stage 1; tp groups {0,1} {2,3} {4,5} {6,7}; dp groups {0,2} {1,3}
// {4,6} {5,7}; links 0-4, 1-5, 2-6, 3-7). Rank 1 stopped in its send of activations to rank 5:
// rank 5 waits in the matching receive; rank 0 waits for rank 1 in their tensor-parallel
// allreduce, rank 3 in their data-parallel reduce-scatter; rank 4 waits for rank 5 in theirs, and
// so rank 5 is a laggard too, of tp {4,5}. The waits end at rank 1 alone.
TEST(FindHangRootsTest, AStageStoppedInASendIsTheRootThoughItsNeighboursAreLaggardsToo) {
  constexpr uint64_t kTp0 = 10, kTp2 = 12, kDp1 = 21, kDp3 = 23, kLink1 = 31;
  std::vector<RingBuilder> rings(8);
  rings[0].Member(kTp0, "tp0").Ops(kTp0, 5, "all_reduce", true);
  rings[1].Member(kTp0, "tp0").Ops(kTp0, 4, "all_reduce", false);
  rings[1].Member(kDp1, "dp1").Member(kLink1, "pp1.link0").Ops(kLink1, 1, "send", true);
  rings[3].Member(kDp1, "dp1").Ops(kDp1, 1, "reduce_scatter", true);
  rings[5].Member(kLink1, "pp1.link0").Ops(kLink1, 1, "recv", true);
  rings[5].Member(kTp2, "tp2").Ops(kTp2, 2, "all_reduce", false);
  rings[4].Member(kTp2, "tp2").Ops(kTp2, 3, "all_reduce", true);
  rings[7].Member(kDp3, "dp3").Ops(kDp3, 1, "reduce_scatter", true);
  rings[5].Member(kDp3, "dp3");
  std::vector<int> ranks;
  std::vector<CollectivePositions> positions;
  for (int r : {0, 1, 3, 4, 5, 7}) {
    ranks.push_back(r);
    positions.push_back(PositionsOf(rings[r].ring));
  }
  std::vector<std::string> laggards;
  for (const LaggardReport& r : FindLaggards(ranks, positions)) laggards.push_back(r.ToString());
  EXPECT_THAT(laggards,
              ::testing::ElementsAre(
                  "rank 1 never entered all_reduce #4 (comm 10) that rank 0 is waiting in",
                  "rank 5 never entered all_reduce #2 (comm 12) that rank 4 is waiting in",
                  "rank 1 never entered reduce_scatter #0 (comm 21) that rank 3 is "
                  "waiting in",
                  "rank 5 never entered reduce_scatter #0 (comm 23) that rank 7 is "
                  "waiting in"));
  HangDependencies d = FindHangRoots(ranks, positions);
  ASSERT_EQ(d.roots.size(), 1u);
  EXPECT_EQ(d.roots[0].rank, 1);
  EXPECT_EQ(
      d.roots[0].ToString(),
      "rank 1 is where the waits end: rank 0 waits for it in all_reduce #4 (comm 10 \"tp0\"), "
      "rank 3 in reduce_scatter #0 (comm 21 \"dp1\"), rank 5 in recv #0 (comm 31 "
      "\"pp1.link0\")");
  EXPECT_THAT(d.waiting, ::testing::ElementsAre(0, 3, 4, 5, 7));
}

// The mirror case: a stage stopped in its receive after the sender left its send. The receiver
// waits for nobody (its data is there), the sender's next receive of gradients waits for it.
TEST(FindHangRootsTest, AReceiverStoppedAfterItsSenderLeftIsTheRoot) {
  constexpr uint64_t kLink = 31;
  RingBuilder sender, receiver;
  sender.Member(kLink, "pp0.link0").Ops(kLink, 2, "send", false);
  // op #2: the sender waits in its receive of gradients, which the receiver never entered.
  FlightRecord recv = Collective(FlightRecordType::kCollectiveBegin, kLink, 2);
  std::snprintf(recv.name, sizeof(recv.name), "recv");
  sender.ring.records.push_back(recv);
  receiver.Member(kLink, "pp0.link0").Ops(kLink, 2, "recv", true);
  HangDependencies d =
      FindHangRoots({0, 1}, {PositionsOf(sender.ring), PositionsOf(receiver.ring)});
  ASSERT_EQ(d.roots.size(), 1u);
  EXPECT_EQ(d.roots[0].rank, 1);
  EXPECT_THAT(d.waiting, ::testing::ElementsAre(0));
}

// Two ranks waiting for each other in two communicators (entered in opposite orders): the cycle
// is the root, both its ranks.
TEST(FindHangRootsTest, RanksWaitingForEachOtherAreAllRoots) {
  RingBuilder a, b;
  a.Member(1, "x").Member(2, "y").Ops(1, 1, "all_reduce", true);
  b.Member(1, "x").Member(2, "y").Ops(2, 1, "all_reduce", true);
  HangDependencies d = FindHangRoots({0, 1}, {PositionsOf(a.ring), PositionsOf(b.ring)});
  ASSERT_EQ(d.roots.size(), 2u);
  EXPECT_EQ(d.roots[0].rank, 0);
  EXPECT_EQ(d.roots[1].rank, 1);
  EXPECT_TRUE(d.waiting.empty());
  // Nobody waiting: no roots.
  EXPECT_TRUE(FindHangRoots({0, 1}, {PositionsOf(RingBuilder().Member(1, "x").ring),
                                     PositionsOf(RingBuilder().Member(1, "x").ring)})
                  .roots.empty());
}

TEST(FindLaggardsTest, WhenEveryRankEnteredTheCollectiveNoRankIsBlamed) {
  using T = FlightRecordType;
  FlightRecorderContents a;
  a.records.push_back(Collective(T::kCollectiveBegin, 1, 0));
  EXPECT_TRUE(FindLaggards({0, 1}, {a, a}).empty());
}

}  // namespace
}  // namespace trainguard
