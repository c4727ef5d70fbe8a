// Specification of `trainguard flight-recorder show|dump|remove`: run as a real process on the ring
// of a live process (this one) and of a rank process killed with SIGKILL.
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/watchdog/flight_recorder.h"
#include "tests/support/own_process.h"
#include "tests/support/temp_dir.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::SignalOwnProcess;
using testing::TempDir;

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

class FlightRecorderCli : public ::testing::Test {
 protected:
  void TearDown() override {
    for (int rank = 0; rank < 4; ++rank) FlightRecorder::Remove(job_, rank).IgnoreError();
  }

  Result RunCli(const std::string& args) {
    Result r;
    const std::string err_path = dir_.File("stderr");
    FILE* pipe =
        popen((std::string(TRAINGUARD_CLI_PATH) + " " + args + " 2>" + err_path).c_str(), "r");
    if (pipe == nullptr) return r;
    char buffer[4096];
    size_t n;
    while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) r.out.append(buffer, n);
    const int status = pclose(pipe);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream err(err_path);
    std::stringstream text;
    text << err.rdbuf();
    r.err = text.str();
    return r;
  }

  static FlightRecord Collective(int64_t step, int64_t comm_seq) {
    FlightRecord r;
    r.type = FlightRecordType::kCollectiveBegin;
    r.step = step;
    r.comm_id = 0xabc;
    r.comm_seq = comm_seq;
    r.bytes = 4096;
    r.peer = 3;
    r.value = 7;
    std::snprintf(r.name, sizeof(r.name), "allreduce");
    return r;
  }

  // A rank process that writes `records` records to its ring and is killed with SIGKILL.
  pid_t RunAndKillRank(int rank, int records) {
    int ready[2];
    if (pipe(ready) != 0) return -1;
    const pid_t child = fork();
    if (child < 0) {
      ADD_FAILURE() << "fork: " << std::strerror(errno);
      close(ready[0]);
      close(ready[1]);
      return -1;
    }
    if (child == 0) {
      auto fr = FlightRecorder::Create(job_, rank, 64);
      if (!fr.ok()) _exit(3);
      for (int i = 1; i <= records; ++i) (*fr)->Append(Collective(i / 4, i));
      if (write(ready[1], "r", 1) != 1) _exit(4);
      while (true) pause();
    }
    close(ready[1]);
    pollfd p{ready[0], POLLIN, 0};
    char c;
    const bool ok = poll(&p, 1, 60'000) == 1 && read(ready[0], &c, 1) == 1;
    close(ready[0]);
    const absl::Status killed = SignalOwnProcess(child, SIGKILL);
    EXPECT_EQ(killed, absl::OkStatus());
    int status;
    if (killed.ok()) waitpid(child, &status, 0);
    return ok && killed.ok() ? child : -1;
  }

  const std::string job_ = absl::StrFormat(
      "frcli-%d-%s", getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
  TempDir dir_;
};

TEST_F(FlightRecorderCli, ShowPrintsOneLinePerRecordOfALiveRing) {
  auto fr = FlightRecorder::Create(job_, 1, 16);
  ASSERT_TRUE(fr.ok()) << fr.status();
  for (int i = 1; i <= 3; ++i) (*fr)->Append(Collective(10, i));
  FlightRecord mark;
  mark.step = 10;
  std::snprintf(mark.name, sizeof(mark.name), "checkpoint-saved");
  (*fr)->Append(mark);

  Result r = RunCli(absl::StrFormat("flight-recorder show --job %s --rank 1", job_));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(absl::StrFormat(
                         "segment /trainguard.%s.fr.rank1: rank 1, writer pid %d (running), "
                         "capacity 16, next seq 5, 4 records, 0 dropped",
                         job_, getpid())));
  EXPECT_THAT(r.out, HasSubstr("collective_begin  allreduce"));
  EXPECT_THAT(r.out, HasSubstr("0xabc/3"));
  EXPECT_THAT(r.out, HasSubstr("mark              checkpoint-saved"));
  EXPECT_THAT(r.out, HasSubstr("+0.000000s"));  // the newest record is the time origin
}

TEST_F(FlightRecorderCli, ShowJsonWithLastPrintsOnlyTheNewestRecords) {
  auto fr = FlightRecorder::Create(job_, 0, 16);
  ASSERT_TRUE(fr.ok()) << fr.status();
  for (int i = 1; i <= 5; ++i) (*fr)->Append(Collective(2, i));
  Result r =
      RunCli(absl::StrFormat("flight-recorder show --json --last 2 --job %s --rank 0", job_));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // The FlightRecorderDump that `dump` would write, in proto3 JSON (docs/FORMATS.md): 64-bit
  // integers are strings, bytes are base64, the type is its number (6: collective_begin).
  EXPECT_THAT(r.out, HasSubstr(absl::StrFormat(
                         R"({"format_version":1,"segment":"/trainguard.%s.fr.rank0","rank":0,)"
                         R"("writer_pid":%d,"capacity":16,"next_seq":"6","records":[)",
                         job_, getpid())));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat(R"("step":"2","type":6,"flags":0,"peer":3,)"
                                            R"("comm_id":"2748","comm_seq":"5","bytes":"4096",)"
                                            R"("value":"7","name":")",
                                            absl::Base64Escape("allreduce"), R"("})")));
  EXPECT_THAT(r.out, HasSubstr(R"({"seq":"4",)"));
  EXPECT_THAT(r.out, Not(HasSubstr(R"({"seq":"3",)")));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat(R"("evidence":[{"key":"writer_state","value":")",
                                            absl::Base64Escape("running"), R"("}])")));
  EXPECT_THAT(r.out, HasSubstr(R"("dropped":"0"})"));
}

TEST_F(FlightRecorderCli, ADeadRanksRingIsShownDumpedAndTheDumpShown) {
  const pid_t dead = RunAndKillRank(2, 100);
  ASSERT_GT(dead, 0);
  Result r = RunCli(absl::StrFormat("flight-recorder show --job %s --rank 2", job_));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(absl::StrFormat("writer pid %d (exited), capacity 64, next seq "
                                               "101, 64 records, 0 dropped",
                                               dead)));
  EXPECT_THAT(r.out, HasSubstr("0xabc/100"));

  const std::string file = dir_.File("rank2.pb");
  r = RunCli(absl::StrFormat("flight-recorder dump --job %s --rank 2 --out %s", job_, file));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(absl::StrFormat("wrote %s: 64 records of /trainguard.%s.fr.rank2",
                                               file, job_)));

  r = RunCli("flight-recorder show " + file);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out,
              HasSubstr(absl::StrFormat("dump %s of segment /trainguard.%s.fr.rank2: rank 2, "
                                        "writer pid %d, capacity 64, next seq 101, 64 "
                                        "records, 0 dropped",
                                        file, job_, dead)));
  EXPECT_THAT(r.out, HasSubstr("0xabc/37"));
  EXPECT_THAT(r.out, HasSubstr("evidence:\n  reason: trainguard flight-recorder dump\n"
                               "  writer_state: exited\n"));

  r = RunCli("flight-recorder show --json --last 1 " + file);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(R"("rank":2,)"));
  EXPECT_THAT(r.out, HasSubstr(R"("records":[{"seq":"100",)"));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat(R"("evidence":[{"key":"reason","value":")",
                                            absl::Base64Escape("trainguard flight-recorder dump"),
                                            R"("},)")));
}

TEST_F(FlightRecorderCli, RemoveWithoutARankRemovesEveryRankOfTheJobOnly) {
  for (int rank : {0, 1, 3}) ASSERT_GT(RunAndKillRank(rank, 5), 0);
  auto other = FlightRecorder::Create(job_ + "x", 0, 16);  // another job: must survive
  ASSERT_TRUE(other.ok()) << other.status();

  Result r = RunCli("flight-recorder remove --job " + job_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (int rank : {0, 1, 3}) {
    EXPECT_THAT(r.out,
                HasSubstr(absl::StrFormat("removed /trainguard.%s.fr.rank%d\n", job_, rank)));
    EXPECT_EQ(ReadFlightRecorder(job_, rank).status().code(), absl::StatusCode::kNotFound);
  }
  EXPECT_TRUE(ReadFlightRecorder(job_ + "x", 0).ok());

  r = RunCli("flight-recorder remove --job " + job_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(job_));
}

TEST_F(FlightRecorderCli, RemoveWithARankRemovesThatRankOnly) {
  for (int rank : {0, 1}) ASSERT_GT(RunAndKillRank(rank, 5), 0);
  Result r = RunCli(absl::StrFormat("flight-recorder remove --job %s --rank 1", job_));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadFlightRecorder(job_, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(ReadFlightRecorder(job_, 0).ok());
  r = RunCli(absl::StrFormat("flight-recorder remove --job %s --rank 1", job_));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(absl::StrFormat("/trainguard.%s.fr.rank1", job_)));
}

TEST_F(FlightRecorderCli, AMissingSegmentOrABadFileExitsOneNamingIt) {
  Result r = RunCli(absl::StrFormat("flight-recorder show --job %s --rank 0", job_));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(absl::StrFormat("/trainguard.%s.fr.rank0", job_)));

  const std::string bad = dir_.File("bad.pb");
  std::ofstream(bad) << "not a dump";
  r = RunCli("flight-recorder show " + bad);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(bad));

  r = RunCli(
      absl::StrFormat("flight-recorder dump --job %s --rank 0 --out %s", job_, dir_.File("x.pb")));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(absl::StrFormat("/trainguard.%s.fr.rank0", job_)));
}

// A run dir with the hang dumps of ranks 0 and 1, both waiting in allreduce #9; rank 2 was killed
// before it: its ring (left in shared memory) ends at #8, and it wrote no dump.
TEST_F(FlightRecorderCli, DiagnoseNamesTheRankThatNeverEnteredAndWroteNoDump) {
  ASSERT_GT(RunAndKillRank(2, 8), 0);
  ASSERT_TRUE(std::filesystem::create_directories(dir_.File("run/flight_recorder")));
  for (int rank : {0, 1}) {
    FlightRecorderContents ring;
    ring.segment = FlightRecorder::SegmentName(job_, rank);
    ring.writer_pid = 100 + rank;
    for (int i = 1; i <= 9; ++i) ring.records.push_back(Collective(i / 4, i));
    ASSERT_TRUE(WriteFlightRecorderDump(
                    ring, rank,
                    {{"reason", "hang"},
                     {"generation", "0"},
                     {"step_thread", absl::StrCat(ring.writer_pid)},
                     {"stacks", absl::StrFormat("thread %d \"train\":\n  #0 wait (/lib/libc.so.6+0x1)\n",
                                                ring.writer_pid)}},
                    dir_.File(absl::StrFormat("run/flight_recorder/rank-%05d.1.pb", rank)))
                    .ok());
  }
  Result r = RunCli(absl::StrFormat("flight-recorder diagnose %s --job %s --world-size 3",
                                    dir_.File("run"), job_));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("suspects: rank 2\n"));
  EXPECT_THAT(r.out, HasSubstr("rank 2 never entered allreduce #9 (comm 2748) that ranks 0,1 are "
                               "waiting in"));
  EXPECT_THAT(r.out, HasSubstr("rank 2 wrote no dump"));

  r = RunCli(absl::StrFormat("flight-recorder diagnose --json %s --world-size 3", dir_.File("run")));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(R"("suspects":[2],"dumped":[0,1],"missing":[2],)"));

  r = RunCli("flight-recorder diagnose " + dir_.File("empty"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(dir_.File("empty")));
}

TEST_F(FlightRecorderCli, BadUsageExitsTwo) {
  for (const char* args :
       {"flight-recorder", "flight-recorder show", "flight-recorder show --job j",
        "flight-recorder show --job j --rank 0 file.pb", "flight-recorder dump --job j --rank 0",
        "flight-recorder remove", "flight-recorder show --job j --rank x",
        "flight-recorder frobnicate", "flight-recorder diagnose",
        "flight-recorder diagnose dir --rank 1", "flight-recorder show --job j --rank 0 --world-size 2"}) {
    Result r = RunCli(args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_THAT(r.err, HasSubstr("usage: trainguard flight-recorder")) << args;
  }
}

}  // namespace
}  // namespace trainguard
