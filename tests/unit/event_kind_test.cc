// Specification of the event kinds trainguard writes (EventKind, include/trainguard/events.h): the
// one table of their names, and how an event file written before the enum existed reads.
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/core/event_log.h"
#include "tests/support/temp_dir.h"
#include "trainguard/env.h"
#include "trainguard/events.h"

namespace trainguard {
namespace {

using testing::TempDir;

TEST(EventKind, EveryKindRoundTripsThroughItsName) {
  std::set<std::string_view> names;
  for (EventKind kind : AllEventKinds()) {
    const std::string_view name = EventKindName(kind);
    EXPECT_FALSE(name.empty());
    EXPECT_TRUE(names.insert(name).second) << "two kinds are named " << name;
    EXPECT_EQ(ParseEventKind(name), kind) << name;
    const Event event = EventOfKind(kind);
    EXPECT_EQ(KindOf(event), kind) << name;
  }
  EXPECT_EQ(names.size(), AllEventKinds().size());
}

// The names and types are the event file format (an older file must read the same, and
// `trainguard events --json` prints them): this list is the one place besides the table that spells
// them, so that renaming a kind fails here rather than in a user's script.
TEST(EventKind, NamesAndTypesAreTheOnesEventFilesHoldSinceBeforeTheEnum) {
  struct Golden {
    EventKind kind;
    std::string_view name;
    EventType type;
  };
  const EventType custom = EventType::kCustom;
  const EventType checkpoint = EventType::kCheckpoint;
  const std::vector<Golden> golden = {
      {EventKind::kLauncherLost, "launcher_lost", custom},
      {EventKind::kGenerationEntryFailed, "generation_entry_failed", custom},
      {EventKind::kJobStopUnpublished, "job_stop_unpublished", custom},
      {EventKind::kFlightRecorderUnavailable, "flight_recorder_unavailable", custom},
      {EventKind::kHangPostponed, "hang_postponed", custom},
      {EventKind::kHangWithdrawn, "hang_withdrawn", custom},
      {EventKind::kGenerationSuperseded, "generation_superseded", custom},
      {EventKind::kSupersededStepExit, "superseded_step_exit", custom},
      {EventKind::kEvidenceDumped, "evidence_dumped", custom},
      {EventKind::kSaved, "saved", checkpoint},
      {EventKind::kSaveFailed, "save_failed", checkpoint},
      {EventKind::kProtected, "protected", checkpoint},
      {EventKind::kReprotectFailed, "reprotect_failed", checkpoint},
      {EventKind::kPlacementClassesDropped, "placement_classes_dropped", checkpoint},
      {EventKind::kSkipped, "skipped", checkpoint},
      {EventKind::kFenceFailed, "fence_failed", checkpoint},
      {EventKind::kRestored, "restored", checkpoint},
      {EventKind::kNothingToRestore, "nothing_to_restore", checkpoint},
      {EventKind::kRestoreFailed, "restore_failed", checkpoint},
      {EventKind::kSilentCorruption, "silent_corruption", checkpoint},
      {EventKind::kRankDied, "rank_died", custom},
      {EventKind::kRankUnresponsive, "rank_unresponsive", custom},
      {EventKind::kHangSuspect, "hang_suspect", custom},
      {EventKind::kRankReplaced, "rank_replaced", custom},
      {EventKind::kHostReplaced, "host_replaced", custom},
      {EventKind::kHostLost, "host_lost", custom},
      {EventKind::kRecovered, "recovered", custom},
      {EventKind::kRestartAll, "restart_all", custom},
      {EventKind::kGenerationRenewed, "generation_renewed", custom},
      {EventKind::kChaosRunStart, "chaos_run_start", custom},
      {EventKind::kChaosRunEnd, "chaos_run_end", custom},
      {EventKind::kChaosInject, "chaos_inject", custom},
      {EventKind::kChaosSkip, "chaos_skip", custom},
      {EventKind::kStepDone, "step_done", custom},
  };
  ASSERT_EQ(golden.size(), AllEventKinds().size());
  for (const Golden& g : golden) {
    EXPECT_EQ(EventKindName(g.kind), g.name);
    EXPECT_EQ(EventTypeOf(g.kind), g.type) << g.name;
  }
}

TEST(EventKind, ANameThatIsNoKindIsAUsersOwnEvent) {
  EXPECT_EQ(ParseEventKind("my_checkpoint_uploaded"), std::nullopt);
  EXPECT_EQ(ParseEventKind(""), std::nullopt);
  EXPECT_EQ(ParseEventKind("Rank_Died"), std::nullopt);  // names are exact
  EXPECT_EQ(ParseEventKind("rank_died "), std::nullopt);
  Event user;  // as Runtime::EmitEvent writes it: custom, any `what`
  user.attributes = {{"what", "my_checkpoint_uploaded"}, {"bucket", "s3://b"}};
  EXPECT_EQ(KindOf(user), std::nullopt);
  user.attributes.clear();
  EXPECT_EQ(KindOf(user), std::nullopt);
}

TEST(EventKind, AKindsNameUnderAnotherTypeIsNotThatKind) {
  // A step fault's `what` is the failure's own text (StepScope::Fail), which may be any word.
  Event fault;
  fault.type = EventType::kStepFault;
  fault.attributes = {{"fault", "step_failure"},
                      {"what", std::string(EventKindName(EventKind::kRankDied))}};
  EXPECT_EQ(KindOf(fault), std::nullopt);
  Event user;  // a custom event spelling a checkpoint kind is the user's, not a restore
  user.attributes = {{"what", std::string(EventKindName(EventKind::kRestored))}};
  EXPECT_EQ(KindOf(user), std::nullopt);
}

TEST(EventKind, AnEventOfAKindStartsWithItsWhatAndHasItsType) {
  Event e = EventOfKind(EventKind::kRestored, "restored the state of step 20 from the arena");
  e.attributes.emplace_back("source", "arena");
  EXPECT_EQ(e.type, EventType::kCheckpoint);
  EXPECT_EQ(e.message, "restored the state of step 20 from the arena");
  ASSERT_EQ(e.attributes.size(), 2u);
  EXPECT_EQ(e.attributes[0].first, "what");
  EXPECT_EQ(e.attributes[0].second, EventKindName(EventKind::kRestored));
  EXPECT_EQ(EventOfKind(EventKind::kRankDied).type, EventType::kCustom);
}

// A record as the writers wrote it before the enum: the type and a `what` spelled by hand.
Event WrittenBeforeTheEnum(EventType type, std::string what, std::string source) {
  Event e;
  e.time = absl::FromUnixMicros(1'700'000'000'000'000);
  e.rank = 2;
  e.step = 20;
  e.type = type;
  e.message = "as an older trainguard wrote it";
  e.attributes = {{"what", std::move(what)}};
  if (!source.empty()) e.attributes.emplace_back("source", std::move(source));
  return e;
}

TEST(EventKind, AnEventFileWrittenBeforeTheEnumReadsAsItsKinds) {
  TempDir dir;
  const std::string path = EventLogPath(dir.path(), 2);
  {
    auto log = EventLog::Open(Env::Default(), path);
    ASSERT_TRUE(log.ok()) << log.status();
    for (const Event& e : {WrittenBeforeTheEnum(EventType::kCheckpoint, "restored", ""),
                           WrittenBeforeTheEnum(EventType::kCustom, "rank_died", "launcher"),
                           WrittenBeforeTheEnum(EventType::kCustom, "step_done", ""),
                           WrittenBeforeTheEnum(EventType::kCustom, "my_own_event", "")}) {
      ASSERT_TRUE((*log)->Append(e).ok());
    }
  }
  auto contents = ReadEventLog(Env::Default(), path);
  ASSERT_TRUE(contents.ok()) << contents.status();
  ASSERT_EQ(contents->events.size(), 4u);
  EXPECT_EQ(KindOf(contents->events[0]), EventKind::kRestored);
  EXPECT_EQ(KindOf(contents->events[1]), EventKind::kRankDied);
  EXPECT_EQ(KindOf(contents->events[2]), EventKind::kStepDone);
  EXPECT_EQ(KindOf(contents->events[3]), std::nullopt);
}

// `trainguard events --json` prints an event of a kind exactly as it printed the hand-spelled one.
TEST(EventKind, TheJsonOfAnEventOfAKindIsTheJsonOfTheRecordWrittenBeforeTheEnum) {
  Event now = EventOfKind(EventKind::kRankDied, "as an older trainguard wrote it");
  now.time = absl::FromUnixMicros(1'700'000'000'000'000);
  now.rank = 2;
  now.step = 20;
  now.attributes.emplace_back("source", "launcher");
  absl::StatusOr<std::string> json = EventToJson(now);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(*json,
            R"({"time_unix_micros":"1700000000000000","rank":2,"step":"20","generation":"0",)"
            R"("type":5,"message":"as an older trainguard wrote it",)"
            R"("attributes":[{"key":"what","value":"rank_died"},)"
            R"({"key":"source","value":"launcher"}]})");
  absl::StatusOr<std::string> before =
      EventToJson(WrittenBeforeTheEnum(EventType::kCustom, "rank_died", "launcher"));
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(*json, *before);
}

}  // namespace
}  // namespace trainguard
