// FlightRecorderEvidence (sdk/runtime/hang_evidence.h): what a rank writes of a hang, from its own
// ring and its threads' stacks: the dump, and its digest beside it, which reads back as the digest
// of the dump (what the coordinator reads instead of the dump, HangCoordinator).
#include "sdk/runtime/hang_evidence.h"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/hang_diagnosis.h"
#include "tests/support/temp_dir.h"
#include "trainguard/clock.h"
#include "trainguard/env.h"

namespace trainguard {
namespace {

TEST(FlightRecorderEvidence, WritesTheDumpWithItsDigestBesideIt) {
  const std::string job = absl::StrCat("hang-evidence-test-", getpid());
  absl::StatusOr<std::unique_ptr<FlightRecorder>> recorder = FlightRecorder::Create(job, 3, 64);
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  FlightRecord record;
  record.type = FlightRecordType::kCollectiveBegin;
  record.comm_id = 1;
  record.comm_seq = 12;
  std::snprintf(record.name, sizeof(record.name), "all_reduce");
  (*recorder)->Append(record);
  testing::TempDir run_dir;
  ManualClock clock(absl::Now());
  FlightRecorderEvidenceOptions options;
  options.job_id = job;
  options.rank = 3;
  options.run_dir = run_dir.path();
  options.env = Env::Default();
  options.clock = &clock;
  options.step_thread = [] { return static_cast<int>(getpid()); };
  FlightRecorderEvidence evidence(options);

  const std::string path = evidence.Write(evidence.Capture(), "hang: test", 4, nullptr, nullptr);
  ASSERT_EQ(path, run_dir.File("flight_recorder/rank-00003.1.pb"));
  absl::StatusOr<HangDumpDigest> digest = ReadHangDumpDigest(HangDumpDigestPath(path));
  ASSERT_TRUE(digest.ok()) << digest.status();
  absl::StatusOr<FlightRecorderDump> dump = ReadFlightRecorderDump(path);
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_EQ(*digest, DigestHangDump(*dump));
  EXPECT_EQ(digest->rank, 3);
  EXPECT_EQ(digest->generation, 4);
  EXPECT_EQ(digest->reason, "hang: test");
  ASSERT_EQ(digest->positions.count(1), 1u);
  EXPECT_EQ(digest->positions.at(1).entered, 12);
  EXPECT_FALSE(digest->training.empty());
}

}  // namespace
}  // namespace trainguard
