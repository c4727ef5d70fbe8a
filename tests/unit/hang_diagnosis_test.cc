// Specification of the cross-rank hang diagnosis (sdk/watchdog/hang_diagnosis.h) and of the
// stack text it reads (ParseThreadStacks in stack_trace.h), on dumps built here and written to
// files. The end-to-end case, real ranks with one stalled inside a collective, is launcher_test's
// ARankStalledInsideACollectiveIsNamedFromTheRanksStacksAndReplaced.
#include "sdk/watchdog/hang_diagnosis.h"

#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/stack_trace.h"
#include "tests/support/temp_dir.h"

namespace trainguard {
namespace {

using ::testing::_;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using testing::TempDir;

constexpr int kPidBase = 1000;

// Frames as CaptureThreadStacks writes them: a blocked gloo allreduce (in a receive or a send, as
// the ranks of a ring are), and a sleep inside one.
std::vector<std::string> WaitingFrames(int call_offset, const char* wait = "waitRecv") {
  return {"__futex_abstimed_wait_common (/lib/x86_64-linux-gnu/libc.so.6+0x8a0d6)",
          "pthread_cond_timedwait+0x2c (/lib/x86_64-linux-gnu/libc.so.6+0x8cc3c)",
          absl::StrFormat("gloo::transport::tcp::UnboundBuffer::%s+0x%x "
                          "(/usr/lib/libgloo.so.0+0x63d41)",
                          wait, call_offset),
          "0x7f3e0a1b2c3 (/usr/lib/libgloo.so.0+0x338f7)",
          "gloo::allreduce(gloo::AllreduceOptions&) (/usr/lib/libgloo.so.0+0x2c4e1)",
          "0x55d0c0a1b2c3 (/build/cpp_trainer+0x41b2c3)", "main (/build/cpp_trainer+0x1f00)"};
}
std::vector<std::string> SleepingFrames() {
  return {"clock_nanosleep+0x57 (/lib/x86_64-linux-gnu/libc.so.6+0xd7bd7)",
          "AbslInternalSleepFor (/usr/lib/libabsl_synchronization.so+0x4b21)",
          "cpp_trainer::GlooDataParallel::AllreduceSum() (/build/cpp_trainer+0x41a000)",
          "main (/build/cpp_trainer+0x1f00)"};
}

// A training thread that had already left the step: its collective failed and it waits for the
// next generation.
std::vector<std::string> RecoveringFrames() {
  return {"__poll+0x4f (/lib/x86_64-linux-gnu/libc.so.6+0xf7c2f)",
          "trainguard::TcpStore::Wait() (/build/libtrainguard.so+0x9a010)",
          "trainguard::RendezvousMember::AwaitGeneration() (/build/libtrainguard.so+0x8b200)",
          "trainguard::Runtime::ReRendezvous() (/build/libtrainguard.so+0x7c300)",
          "main (/build/cpp_trainer+0x1f00)"};
}

FlightRecord Collective(FlightRecordType type, int64_t seq) {
  FlightRecord r;
  r.type = type;
  r.comm_id = 1;
  r.comm_seq = seq;
  std::snprintf(r.name, sizeof(r.name), "all_reduce");
  return r;
}

// Rank `rank`'s dump of generation `generation`: its ring entered all_reduce #0..entered-1 and left
// all but the last; its training thread (tid = pid + 1, named in "step_thread") has `frames`.
FlightRecorderDump MakeDump(int rank, int64_t generation, int entered,
                            const std::vector<std::string>& frames) {
  FlightRecorderDump d;
  d.rank = rank;
  d.contents.segment = FlightRecorder::SegmentName("diagnosis-test", rank);
  d.contents.writer_pid = kPidBase + rank;
  for (int s = 0; s < entered; ++s) {
    d.contents.records.push_back(Collective(FlightRecordType::kCollectiveBegin, s));
    if (s + 1 < entered) {
      d.contents.records.push_back(Collective(FlightRecordType::kCollectiveEnd, s));
    }
  }
  ThreadStack main_thread;  // not the training thread here: it is ignored
  main_thread.tid = d.contents.writer_pid;
  main_thread.name = "cpp_trainer";
  main_thread.answered = true;
  main_thread.frames = {absl::StrCat("rank_specific_", rank, " (/build/cpp_trainer+0x10)")};
  ThreadStack training;
  training.tid = d.contents.writer_pid + 1;
  training.name = "train";
  training.answered = true;
  training.frames = frames;
  ThreadStack blocked;
  blocked.tid = d.contents.writer_pid + 2;
  blocked.name = "io";
  blocked.note = "signal blocked";
  d.evidence = {{"reason", "hang"},
                {"generation", absl::StrCat(generation)},
                {"step_thread", absl::StrCat(training.tid)},
                {"stacks", FormatThreadStacks({main_thread, training, blocked})}};
  return d;
}

TEST(ParseThreadStacks, ReadsBackWhatFormatThreadStacksWrote) {
  ThreadStack a;
  a.tid = 12;
  a.name = "with \"quotes\": odd";
  a.answered = true;
  a.frames = {"f(int) (/x/lib.so+0x1)", "0x7f00 (?)"};
  ThreadStack b;
  b.tid = 13;
  b.name = "tg-watchdog";
  b.note = "no answer within 2s";
  absl::StatusOr<std::vector<ThreadStack>> parsed = ParseThreadStacks(FormatThreadStacks({a, b}));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[0].tid, 12);
  EXPECT_EQ((*parsed)[0].name, a.name);
  EXPECT_TRUE((*parsed)[0].answered);
  EXPECT_EQ((*parsed)[0].frames, a.frames);
  EXPECT_EQ((*parsed)[1].tid, 13);
  EXPECT_FALSE((*parsed)[1].answered);
  EXPECT_EQ((*parsed)[1].note, b.note);
  EXPECT_THAT((*parsed)[1].frames, IsEmpty());
}

TEST(ParseThreadStacks, NamesTheLineThatIsNeitherAThreadNorAFrame) {
  absl::StatusOr<std::vector<ThreadStack>> parsed =
      ParseThreadStacks("thread 1 \"a\":\n  #0 f (m+0x1)\ngarbage here\n");
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), HasSubstr("line 3"));
  EXPECT_EQ(ParseThreadStacks("  #0 f (m)\n").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FrameModule, IsTheModulesFileNameWithoutOffset) {
  EXPECT_EQ(FrameModule("pthread_cond_timedwait+0x2c (/lib/libc.so.6+0x8cc3c)"), "libc.so.6");
  EXPECT_EQ(FrameModule("f(int (*)(int)) (/build/cpp_trainer+0x41)"), "cpp_trainer");
  EXPECT_EQ(FrameModule("0x55d0c0a1b2c3 (?)"), "?");
  EXPECT_EQ(FrameModule("no module at all"), "?");
}

TEST(FrameSignature, KeepsFunctionNamesAndLoadAddressIndependentModuleOffsets) {
  EXPECT_EQ(FrameSignature("pthread_cond_timedwait+0x2c (/lib/libc.so.6+0x8cc3c)"),
            "pthread_cond_timedwait");
  EXPECT_EQ(FrameSignature("gloo::allreduce(gloo::AllreduceOptions&) (/usr/lib/libgloo.so+0x2c)"),
            "gloo::allreduce(gloo::AllreduceOptions&)");
  EXPECT_EQ(FrameSignature("0x55d0c0a1b2c3 (/build/cpp_trainer+0x41b2c3)"), "cpp_trainer+0x41b2c3");
  EXPECT_EQ(FrameSignature("0x55d0c0a1b2c3 (?)"), "?");
}

TEST(DiagnoseHang, NamesTheRankWhoseTrainingThreadIsNotWhereTheOthersWait) {
  HangEvidence evidence;
  evidence.world_size = 4;
  // Every rank entered all_reduce #7; ranks 0, 1, 3 wait in it (at different points of gloo),
  // rank 2 sleeps inside it.
  evidence.dumps = {MakeDump(0, 3, 8, WaitingFrames(0x41)),
                    MakeDump(1, 3, 8, WaitingFrames(0x99, "waitSend")),
                    MakeDump(2, 3, 8, SleepingFrames()), MakeDump(3, 3, 8, WaitingFrames(0x41))};
  const HangDiagnosis d = DiagnoseHang(evidence);
  EXPECT_EQ(d.generation, 3);
  EXPECT_THAT(d.dumped, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(d.missing, IsEmpty());
  EXPECT_THAT(d.laggards, IsEmpty()) << "every rank entered the collective";
  ASSERT_EQ(d.stack_groups.size(), 2u);
  EXPECT_THAT(d.stack_groups[0].ranks, ElementsAre(0, 1, 3));
  EXPECT_THAT(d.stack_groups[1].ranks, ElementsAre(2));
  EXPECT_THAT(d.stack_groups[0].modules,
              ElementsAre("libc.so.6", "libgloo.so.0", "cpp_trainer"));
  EXPECT_EQ(d.stack_groups[1].frames.front(), "clock_nanosleep");
  EXPECT_THAT(d.stack_groups[1].modules,
              ElementsAre("libc.so.6", "libabsl_synchronization.so", "cpp_trainer"));
  EXPECT_THAT(d.stack_outliers, ElementsAre(2));
  EXPECT_THAT(d.suspects, ElementsAre(2));
  const std::string text = d.ToString();
  EXPECT_THAT(text, HasSubstr("suspects: rank 2\n"));
  EXPECT_THAT(text, HasSubstr("ranks 0,1,3 wait together in: __futex_abstimed_wait_common <- "));
  EXPECT_THAT(text, HasSubstr("rank 2's training thread is elsewhere: clock_nanosleep <- "
                              "AbslInternalSleepFor <- "));
}

// The digests of the dumps (what a coordinator keeps of each) give the same diagnosis as the dumps.
TEST(DiagnoseHang, TheDumpsDigestsGiveTheSameDiagnosisAsTheDumps) {
  HangEvidence evidence;
  evidence.world_size = 5;
  evidence.dumps = {MakeDump(0, 3, 8, WaitingFrames(0x41)), MakeDump(1, 3, 7, WaitingFrames(0x99)),
                    MakeDump(2, 3, 8, SleepingFrames()), MakeDump(3, 3, 8, WaitingFrames(0x41))};
  evidence.live_rings[4] = MakeDump(4, 3, 8, {}).contents;
  std::vector<HangDumpDigest> digests;
  for (const FlightRecorderDump& dump : evidence.dumps) digests.push_back(DigestHangDump(dump));
  EXPECT_EQ(digests[2].rank, 2);
  EXPECT_EQ(digests[2].generation, 3);
  EXPECT_EQ(digests[2].dumped_at, evidence.dumps[2].dumped_at);
  EXPECT_EQ(digests[2].reason, EvidenceOf(evidence.dumps[2], "reason").value_or(""));
  const HangDiagnosis from_dumps = DiagnoseHang(evidence);
  const HangDiagnosis from_digests =
      DiagnoseHang(digests, evidence.live_rings, evidence.world_size);
  EXPECT_EQ(from_digests.ToString(), from_dumps.ToString());
  EXPECT_EQ(from_digests.suspects, from_dumps.suspects);
  EXPECT_THAT(from_dumps.suspects, ElementsAre(1, 2, 4));
}

TEST(DiagnoseHang, AStoppedRankIsNamedAsMissingAndAsTheLaggardFromItsLiveRing) {
  HangEvidence evidence;
  evidence.world_size = 3;
  evidence.dumps = {MakeDump(0, 0, 5, WaitingFrames(0x41)), MakeDump(2, 0, 5, WaitingFrames(0x41))};
  // Rank 1 is stopped: no dump, but its ring (read from shared memory) stops before #4.
  evidence.live_rings[1] = MakeDump(1, 0, 4, {}).contents;
  evidence.live_rings[1].records.push_back(Collective(FlightRecordType::kCollectiveEnd, 3));
  const HangDiagnosis d = DiagnoseHang(evidence);
  EXPECT_THAT(d.missing, ElementsAre(1));
  ASSERT_EQ(d.laggards.size(), 1u);
  EXPECT_THAT(d.laggards[0].laggards, ElementsAre(1));
  EXPECT_THAT(d.laggards[0].waiting, ElementsAre(0, 2));
  EXPECT_THAT(d.stack_outliers, IsEmpty()) << "the two dumped ranks wait together";
  EXPECT_THAT(d.suspects, ElementsAre(1));
  EXPECT_THAT(d.ToString(), HasSubstr("rank 1 wrote no dump"));
  EXPECT_THAT(d.ToString(), HasSubstr("rank 1 never entered all_reduce #4"));
}

// Groups: rank 1 stopped in its send to rank 5 (their pipeline link, comm 31). Rank 0 waits for
// it in their tensor-parallel group (comm 10), rank 4 for rank 5 in theirs (comm 12): rank 5 is a
// laggard there, but it waits for rank 1 in its receive. The suspects are rank 1 (silent, and
// where the waits end), not rank 5; and a collective left by failure (the abort woke rank 4
// before it dumped) still counts as waited in.
TEST(DiagnoseHang, ALaggardThatWaitsForAnotherRankIsNotASuspect) {
  auto ring = [](std::vector<std::tuple<uint64_t, const char*, int, bool>> ops) {
    FlightRecorderContents c;
    for (const auto& [comm, op, n, stuck] : ops) {
      FlightRecord reg;
      reg.type = FlightRecordType::kCommunicator;
      reg.comm_id = comm;
      c.records.push_back(reg);
      for (int seq = 0; seq < n; ++seq) {
        FlightRecord r;
        r.type = FlightRecordType::kCollectiveBegin;
        r.comm_id = comm;
        r.comm_seq = seq;
        std::snprintf(r.name, sizeof(r.name), "%s", op);
        c.records.push_back(r);
        if (stuck && seq + 1 == n) continue;
        r.type = FlightRecordType::kCollectiveEnd;
        c.records.push_back(r);
      }
    }
    return c;
  };
  HangEvidence evidence;
  auto dump = [&](int rank, FlightRecorderContents contents) {
    FlightRecorderDump d = MakeDump(rank, 0, 0, WaitingFrames(0x41));
    d.contents.records = std::move(contents.records);
    return d;
  };
  FlightRecorderContents rank4 = ring({{12, "all_reduce", 3, true}});
  FlightRecord failed = rank4.records.back();  // woken by the abort before it dumped
  failed.type = FlightRecordType::kCollectiveEnd;
  failed.flags = kFlightRecordFailed;
  rank4.records.push_back(failed);
  evidence.dumps = {dump(0, ring({{10, "all_reduce", 5, true}})), dump(4, rank4),
                    dump(5, ring({{12, "all_reduce", 2, false}, {31, "recv", 1, true}}))};
  evidence.live_rings[1] = ring({{10, "all_reduce", 4, false}, {31, "send", 1, true}});
  const HangDiagnosis d = DiagnoseHang(evidence);
  ASSERT_EQ(d.laggards.size(), 2u);
  EXPECT_THAT(d.laggards[1].laggards, ElementsAre(5));
  ASSERT_EQ(d.roots.size(), 1u);
  EXPECT_EQ(d.roots[0].rank, 1);
  EXPECT_THAT(d.suspects, ElementsAre(1));
  EXPECT_THAT(d.ToString(), HasSubstr("rank 1 is where the waits end: rank 0 waits for it in "
                                      "all_reduce #4 (comm 10), rank 5 in recv #0 (comm 31)"));
}

TEST(DiagnoseHang, WithoutALargestGroupNoRankIsAStackOutlier) {
  HangEvidence evidence;
  evidence.dumps = {MakeDump(0, 0, 2, WaitingFrames(0x41)), MakeDump(1, 0, 2, SleepingFrames())};
  const HangDiagnosis d = DiagnoseHang(evidence);
  EXPECT_EQ(d.stack_groups.size(), 2u);
  EXPECT_THAT(d.stack_outliers, IsEmpty());
  EXPECT_THAT(d.suspects, IsEmpty());
  EXPECT_THAT(d.ToString(), HasSubstr("suspects: none found"));
  EXPECT_THAT(d.ToString(), HasSubstr("no majority among the training threads' stacks"));
}

// The rank that declared the hang still sits in the collective it aborted (gloo cannot wake it);
// the others failed at once and were waiting for the next generation when they dumped. They are
// no majority to judge it by: nobody is a stack outlier.
TEST(DiagnoseHang, RanksThatMovedOnToRecoveryAreNeitherTheMajorityNorOutliers) {
  HangEvidence evidence;
  evidence.world_size = 4;
  evidence.dumps = {MakeDump(0, 0, 8, RecoveringFrames()), MakeDump(1, 0, 8, WaitingFrames(0x41)),
                    MakeDump(2, 0, 8, RecoveringFrames()), MakeDump(3, 0, 8, RecoveringFrames())};
  const HangDiagnosis d = DiagnoseHang(evidence);
  ASSERT_EQ(d.stack_groups.size(), 2u);
  EXPECT_THAT(d.stack_groups[0].ranks, ElementsAre(0, 2, 3));
  EXPECT_TRUE(d.stack_groups[0].recovering);
  EXPECT_FALSE(d.stack_groups[1].recovering);
  EXPECT_THAT(d.stack_outliers, IsEmpty());
  EXPECT_THAT(d.suspects, IsEmpty());
  const std::string text = d.ToString();
  EXPECT_THAT(text, HasSubstr("suspects: none found"));
  EXPECT_THAT(text, HasSubstr("ranks 0,2,3 had all moved on to recovery when dumping: __poll <- "
                              "trainguard::TcpStore::Wait() <- "));
  EXPECT_THAT(text, Not(HasSubstr("elsewhere")));

  // Among the ranks still in the step, the odd one out is still named.
  evidence.dumps.push_back(MakeDump(4, 0, 8, WaitingFrames(0x41)));
  evidence.dumps.push_back(MakeDump(5, 0, 8, SleepingFrames()));
  evidence.world_size = 6;
  const HangDiagnosis mixed = DiagnoseHang(evidence);
  EXPECT_THAT(mixed.stack_outliers, ElementsAre(5));
  EXPECT_THAT(mixed.suspects, ElementsAre(5));
  EXPECT_THAT(mixed.ToString(), HasSubstr("ranks 1,4 wait together in: "));
}

TEST(DiagnoseHang, ADumpWithoutStacksFormsItsOwnGroup) {
  HangEvidence evidence;
  FlightRecorderDump bare = MakeDump(2, 0, 2, {});
  bare.evidence = {{"generation", "0"}};
  evidence.dumps = {MakeDump(0, 0, 2, WaitingFrames(0x41)), MakeDump(1, 0, 2, WaitingFrames(0x41)),
                    bare};
  const HangDiagnosis d = DiagnoseHang(evidence);
  EXPECT_THAT(d.stack_outliers, ElementsAre(2));
  EXPECT_THAT(d.ToString(), HasSubstr("(no stacks in the dump)"));
}

// The digest a rank writes beside its dump (WriteHangDump) reads back as the digest of the dump
// read back, whichever way the dump is read: a coordinator that reads the digest instead of the
// dump diagnoses the same.
TEST(WriteHangDump, TheDigestBesideTheDumpReadsBackAsTheDumpsDigest) {
  TempDir dir;
  FlightRecorderDump d = MakeDump(2, 5, 8, SleepingFrames());
  // A reason that is not UTF-8 (a rank's report quotes an op name cut inside a character).
  d.evidence[0].second = "hang: all_reduce \xe2\x82";
  absl::StatusOr<std::string> path =
      WriteHangDump(d.contents, d.rank, d.evidence, dir.File("rank-00002."));
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, dir.File("rank-00002.1.pb"));
  EXPECT_EQ(HangDumpDigestPath(*path), dir.File("rank-00002.1.digest"));
  EXPECT_FALSE(ParseDumpName("rank-00002.1.digest").has_value()) << "not a dump's name";

  absl::StatusOr<HangDumpDigest> digest = ReadHangDumpDigest(HangDumpDigestPath(*path));
  ASSERT_TRUE(digest.ok()) << digest.status();
  absl::StatusOr<FlightRecorderDump> dump = ReadFlightRecorderDump(*path);
  ASSERT_TRUE(dump.ok()) << dump.status();
  absl::StatusOr<FlightRecorderDumpPositions> positions = ReadFlightRecorderDumpPositions(*path);
  ASSERT_TRUE(positions.ok()) << positions.status();
  EXPECT_EQ(*digest, DigestHangDump(*dump));
  EXPECT_EQ(*digest, DigestHangDump(*positions));
  EXPECT_EQ(digest->reason, "hang: all_reduce \xe2\x82");
  EXPECT_EQ(digest->generation, 5);
  EXPECT_THAT(digest->training, ElementsAre(HasSubstr("clock_nanosleep"), _, _, _));
  ASSERT_EQ(digest->positions.count(1), 1u);
  EXPECT_EQ(digest->positions.at(1).entered, 7);
  EXPECT_FALSE(digest->positions.at(1).left);
}

TEST(HangDumpDigest, DecodesWhatItEncodedAndNothingElse) {
  HangDumpDigest digest;
  digest.rank = 3;
  digest.generation = -1;
  digest.dumped_at = absl::FromUnixMicros(1'700'000'000'123'456);
  digest.reason = "a peer declared a hang: rank 0: ...";
  digest.positions[1] = {true, 41, "all_reduce", false, true, "dp0"};
  digest.positions[7] = {true, 2, "broadcast", true, false, ""};
  digest.training = {"(no stacks in the dump)"};
  absl::StatusOr<HangDumpDigest> decoded = DecodeHangDumpDigest(EncodeHangDumpDigest(digest));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, digest);

  EXPECT_EQ(DecodeHangDumpDigest("").status().code(), absl::StatusCode::kDataLoss)
      << "an empty file is no digest";
  EXPECT_EQ(DecodeHangDumpDigest("\xff\xff\xff not a protobuf").status().code(),
            absl::StatusCode::kDataLoss);
  TempDir dir;
  std::ofstream(dir.File("rank-00001.1.digest")) << "\xff\xff\xff not a protobuf";
  absl::StatusOr<HangDumpDigest> corrupt = ReadHangDumpDigest(dir.File("rank-00001.1.digest"));
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(corrupt.status().message(), HasSubstr("rank-00001.1.digest"));
  EXPECT_EQ(ReadHangDumpDigest(dir.File("rank-00002.1.digest")).status().code(),
            absl::StatusCode::kNotFound);
}

// The rule a coordinator relies on: the digests the ranks wrote name the same suspects, for the
// same reasons, as the dumps they wrote them beside.
TEST(WriteHangDump, TheDigestsNameTheSameSuspectsAsTheDumps) {
  TempDir dir;
  const std::vector<FlightRecorderDump> written = {
      MakeDump(0, 3, 8, WaitingFrames(0x41)), MakeDump(1, 3, 7, WaitingFrames(0x99)),
      MakeDump(2, 3, 8, SleepingFrames()), MakeDump(3, 3, 8, WaitingFrames(0x41)),
      MakeDump(4, 3, 8, RecoveringFrames())};
  std::vector<HangDumpDigest> digests;
  for (const FlightRecorderDump& d : written) {
    absl::StatusOr<std::string> path = WriteHangDump(
        d.contents, d.rank, d.evidence, dir.File(absl::StrFormat("rank-%05d.", d.rank)));
    ASSERT_TRUE(path.ok()) << path.status();
    absl::StatusOr<HangDumpDigest> digest = ReadHangDumpDigest(HangDumpDigestPath(*path));
    ASSERT_TRUE(digest.ok()) << digest.status();
    digests.push_back(*std::move(digest));
  }
  HangEvidence evidence;
  evidence.world_size = 6;
  absl::StatusOr<std::vector<FlightRecorderDump>> dumps = ReadHangDumps(dir.path(), 3);
  ASSERT_TRUE(dumps.ok()) << dumps.status();
  evidence.dumps = *std::move(dumps);
  const HangDiagnosis from_dumps = DiagnoseHang(evidence);
  const HangDiagnosis from_digests = DiagnoseHang(digests, {}, evidence.world_size);
  EXPECT_EQ(from_digests.suspects, from_dumps.suspects);
  EXPECT_EQ(from_digests.ToString(), from_dumps.ToString());
  EXPECT_THAT(from_dumps.suspects, ElementsAre(1, 2, 5));
}

TEST(ReadHangDumps, KeepsEachRanksNewestDumpOfTheNewestGeneration) {
  TempDir dir;
  auto write = [&](const FlightRecorderDump& d, int number) {
    const std::string path = dir.File(absl::StrFormat("rank-%05d.%d.pb", d.rank, number));
    ASSERT_TRUE(WriteFlightRecorderDump(d.contents, d.rank, d.evidence, path).ok());
  };
  write(MakeDump(0, 0, 3, WaitingFrames(1)), 1);
  write(MakeDump(1, 0, 3, WaitingFrames(1)), 1);
  write(MakeDump(0, 1, 4, WaitingFrames(1)), 2);
  write(MakeDump(0, 1, 6, SleepingFrames()), 3);  // rank 0's newer dump of generation 1
  std::ofstream(dir.File("notes.txt")) << "not a dump";

  absl::StatusOr<std::vector<FlightRecorderDump>> newest = ReadHangDumps(dir.path());
  ASSERT_TRUE(newest.ok()) << newest.status();
  ASSERT_EQ(newest->size(), 1u);
  EXPECT_EQ((*newest)[0].rank, 0);
  EXPECT_EQ((*newest)[0].contents.records.size(), 11u) << "dump number 3, not 2";

  absl::StatusOr<std::vector<FlightRecorderDump>> first = ReadHangDumps(dir.path(), 0);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->size(), 2u);
  EXPECT_EQ(ReadHangDumps(dir.path(), 7).status().code(), absl::StatusCode::kNotFound);
}

TEST(ReadHangDumps, NamesTheMissingDirectoryAndTheCorruptFile) {
  TempDir dir;
  absl::StatusOr<std::vector<FlightRecorderDump>> none = ReadHangDumps(dir.File("absent"));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("absent"));
  EXPECT_EQ(ReadHangDumps(dir.path()).status().code(), absl::StatusCode::kNotFound);
  std::ofstream(dir.File("rank-00001.1.pb")) << "\xff\xff\xff not a protobuf";
  absl::StatusOr<std::vector<FlightRecorderDump>> corrupt = ReadHangDumps(dir.path());
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(corrupt.status().message(), HasSubstr("rank-00001.1.pb"));
}

}  // namespace
}  // namespace trainguard
