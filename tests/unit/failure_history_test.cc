// FailureHistory and CauseLine (sdk/agent/failure_history.h): which death the message that fails
// a job names as its first failure, and with what evidence, on hand-made deaths and output lines:
// no processes.
#include "sdk/agent/failure_history.h"

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/core/agent_keys.h"

namespace trainguard {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kArenaError[] =
    "rank 2 error: cannot start: RESOURCE_EXHAUSTED: snapshot arena /trainguard.j.rank2 needs "
    "64.00 MiB (67108864 bytes: two slots of 32.00 MiB) of shared memory: No space left on device";

TEST(FailureHistory, TheFirstDeathIsKeptAcrossLaterDeaths) {
  FailureHistory history;
  history.Record({"rank 2", "exited with status 1", kArenaError});
  history.Record({"rank 3", "killed by SIGKILL", "has not sent a heartbeat for 30s"});
  history.Record({"rank 4", "killed by SIGKILL", ""});
  EXPECT_EQ(history.deaths(), 3);
  ASSERT_TRUE(history.first().has_value());
  EXPECT_EQ(history.first()->who, "rank 2");
  EXPECT_EQ(history.first()->cause, kArenaError);
}

TEST(FailureHistory, TheFinalMessageNamesTheFirstFailureAndItsCause) {
  FailureHistory history;
  history.Record({"rank 2", "exited with status 1", kArenaError});
  history.Record({"rank 4", "killed by SIGKILL", ""});
  EXPECT_EQ(history.FinalMessage("rank 4 died (killed by SIGKILL) and no standby is available: "
                                 "no standby has parked"),
            absl::StrCat("rank 4 died (killed by SIGKILL) and no standby is available: no "
                         "standby has parked; first failure: rank 2 exited with status 1: ",
                         kArenaError));
}

TEST(FailureHistory, TheOnlyDeathIsNamedWithItsCause) {
  FailureHistory history;
  history.Record({"rank 1", "exited with status 1", "rank 1 error: cannot start: boom"});
  EXPECT_EQ(history.FinalMessage("rank 1 died and the job has no standbys (exited with status 1)"),
            "rank 1 died and the job has no standbys (exited with status 1); first failure: "
            "rank 1 exited with status 1: rank 1 error: cannot start: boom");
}

// The launcher wrote the reason about that very death: a repeat without a cause says nothing.
TEST(FailureHistory, TheOnlyDeathWithoutACauseAddsNothing) {
  FailureHistory history;
  EXPECT_EQ(history.FinalMessage("generation 0 did not form: timeout"),
            "generation 0 did not form: timeout");
  history.Record({"rank 0", "killed by SIGKILL", ""});
  EXPECT_EQ(history.FinalMessage("rank 0 died (killed by SIGKILL) and no standby is available"),
            "rank 0 died (killed by SIGKILL) and no standby is available");
  history.Record({"rank 1", "killed by SIGKILL", ""});
  EXPECT_THAT(history.FinalMessage("x"), EndsWith("; first failure: rank 0 killed by SIGKILL"));
}

TEST(FailureHistory, AHostsDeathIsAFailureWithItsReason) {
  FailureHistory history;
  history.Record({"host h2", "died", "no heartbeat for 3s"});
  history.Record({"rank 0", "exited with status 1", ""});
  EXPECT_THAT(history.FinalMessage("rank 0 died 1 time (last: exited with status 1); "
                                   "--max-replacements=1 reached"),
              EndsWith("; first failure: host h2 died: no heartbeat for 3s"));
}

TEST(FailureHistory, ALongCauseKeepsItsStartAndItsEndOnCharacterBoundaries) {
  FailureHistory history;
  // 'é' is two bytes: a cut at an even offset past "x" would fall inside one.
  std::string middle;
  while (middle.size() < 2 * FailureHistory::kMaxCauseBytes) middle += "é";
  history.Record({"rank 0", "exited with status 1",
                  absl::StrCat("rank 0 error: x", middle, ": No space left on device")});
  const std::string& kept = history.first()->cause;
  EXPECT_LE(kept.size(), FailureHistory::kMaxCauseBytes + 5);
  EXPECT_THAT(kept, StartsWith("rank 0 error: xé"));
  EXPECT_THAT(kept, HasSubstr("é ... é"));
  EXPECT_THAT(kept, EndsWith("é: No space left on device"));
}

// The agent that saw the death is on another host: its report carries the cause, and the
// coordinator's final message names it.
TEST(FailureHistory, ADeathReportFromAnotherHostCarriesItsCauseIntoTheFinalMessage) {
  const std::string member = "h2:57:rank2";
  const std::string value =
      store_keys::EncodeDeathReport({member, 2, "exited with status 1", kArenaError});
  absl::StatusOr<store_keys::DeathReport> report =
      store_keys::DecodeDeathReport(store_keys::kAgentDeaths.Key(member), value);
  ASSERT_TRUE(report.ok()) << report.status();
  FailureHistory history;
  history.Record(
      {absl::StrCat("rank ", report->rank, " (", report->member, ")"), report->how, report->cause});
  history.Record({"rank 4 (h3:60:rank4)", "killed by SIGKILL", ""});
  EXPECT_THAT(history.FinalMessage("rank 4 died (killed by SIGKILL) and no standby is available"),
              HasSubstr(absl::StrCat("; first failure: rank 2 (h2:57:rank2) exited with status 1: ",
                                     kArenaError)));
}

TEST(CauseLine, KeepsTheLastLineThatReadsAsAnErrorNotTheProgressAfterIt) {
  CauseLine cause;
  cause.Observe("rank 2 start world 8 job j");
  EXPECT_EQ(cause.line(), "");
  cause.Observe("rank 2 error: cannot start: No space left on device");
  cause.Observe("rank 2 step 10 loss 0.25");
  EXPECT_EQ(cause.line(), "rank 2 error: cannot start: No space left on device");
  cause.Observe("  RuntimeError: CUDA out of memory  ");
  EXPECT_EQ(cause.line(), "RuntimeError: CUDA out of memory");
}

TEST(CauseLine, ErrorsInWordsAndTheRuntimesOwnReasonsReadAsErrors) {
  for (const char* line :
       {"Traceback: ValueError: bad shape", "FATAL: lost the device",
        "terminate called after throwing an instance of 'std::bad_alloc'",
        "checkpoint write FAILED", "cannot open /data/shard-3", "Segmentation fault (core dumped)",
        "Aborted", "trainguard: rank 3: step 12 waited 30 s: exiting with status 75",
        "trainguard: watchdog: rank 3 is stuck in allreduce"}) {
    EXPECT_TRUE(CauseLine::ReadsAsAnError(line)) << line;
  }
  for (const char* line : {"rank 0 joined generation 0", "step 100 loss 0.01",
                           "trainguard: io_uring unavailable: using pwritev", ""}) {
    EXPECT_FALSE(CauseLine::ReadsAsAnError(line)) << line;
  }
}

}  // namespace
}  // namespace trainguard
