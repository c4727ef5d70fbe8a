// Specification of the chaos report's arithmetic (tools/chaos_report.h) on hand-made event streams,
// and of the chaos schedule (tools/chaos_command.h): exact and deterministic, no processes.
#include "tools/chaos_report.h"

#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/core/event_log.h"
#include "tests/support/temp_dir.h"
#include "tools/chaos_command.h"
#include "sdk/health/fail_slow_dump.h"
#include "trainguard/env.h"
#include "trainguard/events.h"

namespace trainguard::tools {
namespace {

using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

absl::Time At(double seconds) { return kT0 + absl::Seconds(seconds); }

// An event of `kind`, as its writer makes it (EventOfKind), then `more` attributes.
Event Custom(double at, int rank, EventKind kind,
             std::vector<std::pair<std::string, std::string>> more = {}) {
  Event e = EventOfKind(kind);
  e.time = At(at);
  e.rank = rank;
  e.attributes.insert(e.attributes.end(), more.begin(), more.end());
  return e;
}

// A launcher event about the process `pid` (the one Inject() hits unless told otherwise).
Event Launcher(double at, int rank, EventKind kind, const std::string& pid = "4242") {
  return Custom(at, rank, kind, {{"source", "launcher"}, {"pid", pid}});
}

// A rank's event of `type` (a hang, a step fault) with `attributes`.
Event Ranks(double at, int rank, EventType type,
            std::vector<std::pair<std::string, std::string>> attributes = {}) {
  Event e;
  e.time = At(at);
  e.rank = rank;
  e.type = type;
  e.attributes = std::move(attributes);
  return e;
}

Event StepDone(double at, int64_t step, int64_t generation, const std::string& pid) {
  Event e = Custom(at, 0, EventKind::kStepDone, {{"pid", pid}});
  e.step = step;
  e.generation = generation;
  return e;
}

Event Inject(double at, int rank, const std::string& kind, const std::string& pid = "4242") {
  return Custom(at, rank, EventKind::kChaosInject,
                {{"kind", kind}, {"pid", pid}, {"source", "chaos"}});
}

// Steps first..last done one per second from `from`, by one process in one generation.
void AddSteps(std::vector<Event>& events, int64_t first, int64_t last, double from,
              int64_t generation, const std::string& pid) {
  for (int64_t s = first; s <= last; ++s) {
    events.push_back(StepDone(from + static_cast<double>(s - first), s, generation, pid));
  }
}

TEST(ChaosReport, AKillRecoveredInPlaceCountsEveryKeptStepButTheFirstAfterTheRecovery) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart, {{"mode", "trainguard"}})};
  AddSteps(events, 0, 9, 1, 0, "100");  // steps 0..9 at 1..10 s
  events.push_back(Inject(10.5, 2, "kill"));
  events.push_back(Launcher(10.6, 2, EventKind::kRankDied));
  AddSteps(events, 10, 12, 12, 1, "100");  // generation 1: steps 10..12 at 12..14 s
  events.push_back(Custom(15, -1, EventKind::kChaosRunEnd));

  const RunAnalysis run = AnalyzeRun(events);
  EXPECT_EQ(run.mode, "trainguard");
  EXPECT_EQ(run.wall, absl::Seconds(15));
  // Steps 1..9 (9 s) and 11..12 (2 s); step 0 has no interval, step 10 carries the recovery.
  EXPECT_EQ(run.productive, absl::Seconds(11));
  EXPECT_DOUBLE_EQ(run.ettr, 11.0 / 15.0);
  EXPECT_EQ(run.steps_kept, 13);
  EXPECT_EQ(run.last_step, 12);
  EXPECT_EQ(run.median_step, absl::Seconds(1));
  EXPECT_EQ(run.longest_unproductive, absl::Seconds(2));  // 10 s .. 12 s
  EXPECT_EQ(run.longest_unproductive_from, absl::Seconds(10));
  ASSERT_EQ(run.faults.size(), 1u);
  const FaultOutcome& f = run.faults[0];
  EXPECT_EQ(f.kind, "kill");
  EXPECT_EQ(f.rank, 2);
  EXPECT_EQ(f.pid, 4242);
  EXPECT_EQ(f.injected_at, absl::Milliseconds(10500));
  EXPECT_EQ(f.detection_latency, absl::Milliseconds(100));
  EXPECT_EQ(f.detected_by, EventKindName(EventKind::kRankDied));
  EXPECT_EQ(f.culprit_named, 2);
  EXPECT_TRUE(f.culprit_correct());
  EXPECT_EQ(f.time_to_recovery, absl::Milliseconds(1500));  // step 10 at 12 s
  EXPECT_EQ(f.steps_lost, 0);
}

TEST(ChaosReport, StepsRolledBackByARestartAreNotKeptAndCountAsLost) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart, {{"mode", "baseline"}})};
  AddSteps(events, 0, 9, 1, 0, "100");  // steps 0..9 at 1..10 s
  events.push_back(Inject(10.2, 1, "stop"));
  Event hang;  // a waiting rank declares the hang first: detected, but it names no culprit
  hang.time = At(14);
  hang.rank = 0;
  hang.type = EventType::kHang;
  events.push_back(hang);
  events.push_back(Launcher(15.2, 1, EventKind::kRankUnresponsive));
  events.push_back(Launcher(15.3, 1, EventKind::kRankDied));
  events.push_back(Launcher(15.4, -1, EventKind::kRestartAll));
  AddSteps(events, 5, 12, 20, 0, "200");  // a new process from the checkpoint of step 4
  events.push_back(Custom(28, -1, EventKind::kChaosRunEnd));

  const RunAnalysis run = AnalyzeRun(events);
  // Kept: 0..4 of the first process (intervals of 1..4: 4 s) and 5..12 of the second (6..12: 7 s).
  EXPECT_EQ(run.steps_kept, 13);
  EXPECT_EQ(run.productive, absl::Seconds(11));
  EXPECT_DOUBLE_EQ(run.ettr, 11.0 / 28.0);
  EXPECT_EQ(run.longest_unproductive, absl::Seconds(15));  // 5 s .. 20 s
  EXPECT_EQ(run.longest_unproductive_from, absl::Seconds(5));
  ASSERT_EQ(run.faults.size(), 1u);
  const FaultOutcome& f = run.faults[0];
  EXPECT_EQ(f.detection_latency, absl::Milliseconds(3800));
  EXPECT_EQ(f.detected_by, "hang");
  EXPECT_EQ(f.culprit_named, 1);
  EXPECT_TRUE(f.culprit_correct());
  EXPECT_EQ(f.time_to_recovery, absl::Milliseconds(14800));  // step 10 at 25 s
  EXPECT_EQ(f.steps_lost, 5);                                // 5..9 done again
}

// A rank writes its hang event once it has dumped its stacks: the detection is the declaration,
// dump_ms before the event.
TEST(ChaosReport, AHangIsDetectedWhenDeclaredNotWhenItsDumpWasWritten) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart)};
  AddSteps(events, 0, 9, 1, 0, "100");  // steps 0..9 at 1..10 s
  events.push_back(Inject(10.2, 1, "stop"));
  events.push_back(Ranks(12, 0, EventType::kHang, {{"dump_ms", "450"}}));
  events.push_back(Launcher(12.1, 1, EventKind::kHangSuspect));
  AddSteps(events, 10, 11, 13, 0, "200");
  events.push_back(Custom(15, -1, EventKind::kChaosRunEnd));

  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.faults.size(), 1u);
  EXPECT_EQ(run.faults[0].detection_latency, absl::Milliseconds(1350));  // 11.55 s - 10.2 s
  EXPECT_EQ(run.faults[0].detected_by, "hang");
  EXPECT_EQ(run.faults[0].culprit_named, 1);

  // A hang declared before the injection (10.05 s), its event written after it (10.3 s), is not
  // the stop's detection: the launcher's naming of the suspect is.
  for (Event& e : events) {
    if (e.type == EventType::kHang) e = Ranks(10.3, 0, EventType::kHang, {{"dump_ms", "250"}});
  }
  const RunAnalysis early = AnalyzeRun(events);
  ASSERT_EQ(early.faults.size(), 1u);
  EXPECT_EQ(early.faults[0].detection_latency, absl::Milliseconds(1900));  // 12.1 s - 10.2 s
  EXPECT_EQ(early.faults[0].detected_by, EventKindName(EventKind::kHangSuspect));
}

// A rank publishes its hang before it symbolises and writes its dump, and the launcher kills a
// stopped suspect at once: the hang event comes after the launcher's naming and after the kill,
// but it detected first (its time less dump_ms), and it is the detection.
TEST(ChaosReport,
     AHangEventWrittenAfterTheStoppedRankWasReplacedIsTheDetectionWhenItDeclaredFirst) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart)};
  AddSteps(events, 0, 9, 1, 0, "100");  // steps 0..9 at 1..10 s
  events.push_back(Inject(10.2, 1, "stop", "101"));
  events.push_back(Launcher(11.1, 1, EventKind::kHangSuspect, "101"));
  events.push_back(Launcher(11.15, 1, EventKind::kRankDied, "101"));
  events.push_back(Ranks(11.4, 0, EventType::kHang, {{"capture_ms", "20"}, {"dump_ms", "400"}}));
  AddSteps(events, 10, 11, 12, 1, "200");
  events.push_back(Custom(15, -1, EventKind::kChaosRunEnd));

  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.faults.size(), 1u);
  EXPECT_EQ(run.faults[0].detection_latency, absl::Milliseconds(800));  // 11.0 s - 10.2 s
  EXPECT_EQ(run.faults[0].detected_by, "hang");
  EXPECT_EQ(run.faults[0].culprit_named, 1);

  // Declared after the kill (its time less dump_ms is 11.2 s): the launcher's naming detected it.
  for (Event& e : events) {
    if (e.type == EventType::kHang) e = Ranks(11.4, 0, EventType::kHang, {{"dump_ms", "200"}});
  }
  const RunAnalysis late = AnalyzeRun(events);
  ASSERT_EQ(late.faults.size(), 1u);
  EXPECT_EQ(late.faults[0].detection_latency, absl::Milliseconds(900));  // 11.1 s - 10.2 s
  EXPECT_EQ(late.faults[0].detected_by, EventKindName(EventKind::kHangSuspect));
}

// A rank stopped after its last collective of step 5 lets the others finish it (at 6 s, 0.25 s
// after the stop); the job stalls at step 6 until the hang is detected (7.8 s) and the stopped rank
// is replaced. The recovery is the first step done after the detection, not step 5.
TEST(ChaosReport, AStopIsRecoveredByTheFirstStepDoneAfterItsDetectionNotTheStepInFlight) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart)};
  AddSteps(events, 0, 4, 1, 0, "100");  // steps 0..4 at 1..5 s
  events.push_back(Inject(5.75, 1, "stop"));
  events.push_back(StepDone(6.0, 5, 0, "100"));
  Event hang;
  hang.time = At(7.8);
  hang.rank = 0;
  hang.type = EventType::kHang;
  events.push_back(hang);
  events.push_back(Launcher(8.0, 1, EventKind::kHangSuspect));
  AddSteps(events, 6, 8, 9, 1, "100");  // generation 1: steps 6..8 at 9..11 s
  events.push_back(Custom(12, -1, EventKind::kChaosRunEnd));

  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.faults.size(), 1u);
  const FaultOutcome& f = run.faults[0];
  EXPECT_EQ(f.detection_latency, absl::Milliseconds(2050));
  EXPECT_EQ(f.culprit_named, 1);
  EXPECT_EQ(f.time_to_recovery, absl::Milliseconds(3250));  // step 6 at 9 s
  EXPECT_EQ(f.steps_lost, 0);
}

// The hangs a rank's watchdog declared (not the peers' "remote" dumps of them), those withdrawn,
// and only inside the run: in the text report and the JSON.
TEST(ChaosReport, HangsDeclaredAndWithdrawnAreCountedInsideTheRunOnly) {
  auto hang = [](double at, int rank, bool remote) {
    Event e;
    e.time = At(at);
    e.rank = rank;
    e.type = EventType::kHang;
    if (remote) e.attributes = {{"remote", "true"}};
    return e;
  };
  std::vector<Event> events = {hang(0.5, 0, false), Custom(1, -1, EventKind::kChaosRunStart)};
  AddSteps(events, 0, 4, 2, 0, "100");
  events.push_back(hang(3.0, 0, false));
  events.push_back(hang(3.0, 1, false));
  events.push_back(hang(3.1, 2, true));
  events.push_back(Custom(3.5, 0, EventKind::kHangWithdrawn));
  events.push_back(hang(5.0, 1, false));
  events.push_back(Custom(8, -1, EventKind::kChaosRunEnd));
  events.push_back(Custom(8.5, 1, EventKind::kHangWithdrawn));

  const RunAnalysis run = AnalyzeRun(events);
  EXPECT_EQ(run.hangs_declared, 3);
  EXPECT_EQ(run.hangs_withdrawn, 1);
  EXPECT_THAT(FormatReport({run}), HasSubstr("hangs declared by a rank 3, withdrawn 1 "));
  EXPECT_THAT(ReportJson({run}), HasSubstr("\"hangs_declared\":3,\"hangs_withdrawn\":1,"));
}

TEST(ChaosReport, ANansCulpritIsTheRankThatFoundNonFiniteValuesNotTheRanksThatSkippedWithIt) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart)};
  AddSteps(events, 0, 4, 1, 0, "100");
  events.push_back(Inject(5.5, 3, "nan"));
  Event skipped;
  skipped.time = At(6.0);
  skipped.rank = 0;
  skipped.type = EventType::kStepFault;
  skipped.message = "1 other rank(s) had a non-finite loss; the update is skipped on every rank";
  events.push_back(skipped);
  Event found = skipped;
  found.time = At(6.25);
  found.rank = 3;
  found.message = "non-finite values in buffer \"mlp.gradients\" on rank 3 at step 5: 1 of 1153";
  events.push_back(found);
  AddSteps(events, 6, 8, 7, 0, "100");  // step 5 skipped
  events.push_back(Custom(10, -1, EventKind::kChaosRunEnd));

  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.faults.size(), 1u);
  EXPECT_EQ(run.faults[0].detection_latency, absl::Milliseconds(750));
  EXPECT_EQ(run.faults[0].culprit_named, 3);
  EXPECT_TRUE(run.faults[0].culprit_correct());
  EXPECT_EQ(run.faults[0].time_to_recovery, absl::Milliseconds(1500));  // step 6 at 7 s
  EXPECT_EQ(run.faults[0].steps_lost, 0);
  // Step 6 follows step 4: its interval is not counted. Steps 1..4 and 7..8: 6 s.
  EXPECT_EQ(run.productive, absl::Seconds(6));
}

TEST(ChaosReport, AFaultNobodySawIsUndetectedUnrecoveredAndNamesNoCulprit) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart)};
  AddSteps(events, 0, 2, 1, 0, "100");
  events.push_back(Inject(3.5, 0, "kill"));
  events.push_back(Custom(9, -1, EventKind::kChaosRunEnd));
  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.faults.size(), 1u);
  EXPECT_FALSE(run.faults[0].detection_latency.has_value());
  EXPECT_FALSE(run.faults[0].time_to_recovery.has_value());
  EXPECT_FALSE(run.faults[0].culprit_named.has_value());
  EXPECT_EQ(run.faults_detected(), 0);
  EXPECT_EQ(run.faults_recovered(), 0);
  EXPECT_EQ(run.longest_unproductive, absl::Seconds(6));  // 3 s .. 9 s
  EXPECT_THAT(FormatReport({run}), HasSubstr("faults 1: detected 0, culprit named correctly 0 of "
                                             "1, recovered 0"));
}

TEST(ChaosReport, TheWrongRankKilledForAHangIsReportedAsAWrongCulprit) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart)};
  events.push_back(Inject(1, 1, "stop"));
  events.push_back(Launcher(4, 2, EventKind::kHangSuspect));
  events.push_back(Custom(5, -1, EventKind::kChaosRunEnd));
  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.faults.size(), 1u);
  EXPECT_EQ(run.faults[0].culprit_named, 2);
  EXPECT_FALSE(run.faults[0].culprit_correct());
  EXPECT_THAT(FormatReport({run}), HasSubstr("2 WRONG"));
}

TEST(ChaosReport, ADroppedLinkIsDetectedByTheCommunicationFailureAndNamesNoCulprit) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart)};
  AddSteps(events, 0, 2, 1, 0, "100");
  events.push_back(Inject(3.5, 1, "drop"));
  events.push_back(Ranks(3.75, 2, EventType::kStepFault, {{"fault", "communication_failure"}}));
  events.push_back(Launcher(4, -1, EventKind::kGenerationRenewed));
  AddSteps(events, 3, 4, 5, 1, "100");
  events.push_back(Custom(7, -1, EventKind::kChaosRunEnd));
  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.faults.size(), 1u);
  EXPECT_EQ(run.faults[0].detection_latency, absl::Milliseconds(250));
  EXPECT_EQ(run.faults[0].detected_by, "step_fault");
  EXPECT_FALSE(run.faults[0].culprit_named.has_value());
  EXPECT_EQ(run.faults[0].time_to_recovery, absl::Milliseconds(1500));
}

TEST(ChaosReport, TheDeathOfOneFaultsProcessIsNotCreditedToAnother) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart)};
  events.push_back(Inject(1, 0, "kill", "1001"));
  events.push_back(Inject(2, 1, "kill", "1002"));
  events.push_back(Launcher(2.5, 1, EventKind::kRankDied, "1002"));
  events.push_back(Custom(3, -1, EventKind::kChaosRunEnd));
  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.faults.size(), 2u);
  EXPECT_FALSE(run.faults[0].detection_latency.has_value());
  EXPECT_EQ(run.faults[1].detection_latency, absl::Milliseconds(500));
}

TEST(ChaosReport, AHangNamedAfterTheNextFaultWasInjectedIsStillCreditedToIt) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart)};
  events.push_back(Inject(1, 2, "stop", "7"));
  events.push_back(Inject(2, 0, "kill", "8"));
  events.push_back(Launcher(2.01, 0, EventKind::kRankDied, "8"));
  Event hang;
  hang.time = At(3);
  hang.rank = 1;
  hang.type = EventType::kHang;
  events.push_back(hang);
  events.push_back(Launcher(3.5, 2, EventKind::kHangSuspect, "7"));
  events.push_back(Launcher(3.51, 2, EventKind::kRankDied, "7"));
  events.push_back(Custom(9, -1, EventKind::kChaosRunEnd));
  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.faults.size(), 2u);
  EXPECT_EQ(run.faults[0].detection_latency, absl::Seconds(2));  // the hang event
  EXPECT_EQ(run.faults[0].culprit_named, 2);
  EXPECT_EQ(run.faults[1].detection_latency, absl::Milliseconds(10));
  EXPECT_EQ(run.faults[1].culprit_named, 0);
}

// The bug PERFORMANCE.md's chaos section recorded: a stop whose process a restart for a later fault
// ended was credited with a hang event of the next epoch (hang events name no process).
TEST(ChaosReport, AHangEventAfterARestartEndedAStoppedProcessIsNotCreditedToThatStop) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart, {{"mode", "baseline"}})};
  events.push_back(Inject(1, 1, "stop", "101"));
  events.push_back(Inject(1.5, 2, "kill", "102"));
  events.push_back(Launcher(1.6, 2, EventKind::kRankDied, "102"));
  events.push_back(
      Launcher(1.7, -1, EventKind::kRestartAll));      // ends 101 too: no event about it follows
  events.push_back(Inject(8, 3, "stop", "203"));       // a process of the next epoch
  Event hang;
  hang.time = At(10);
  hang.rank = 0;
  hang.type = EventType::kHang;
  events.push_back(hang);
  events.push_back(Launcher(13, 3, EventKind::kRankUnresponsive, "203"));
  events.push_back(Custom(20, -1, EventKind::kChaosRunEnd));
  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.faults.size(), 3u);
  EXPECT_FALSE(run.faults[0].detection_latency.has_value());
  EXPECT_EQ(run.faults[0].cleared_by, EventKindName(EventKind::kRestartAll));
  EXPECT_EQ(run.faults[1].detection_latency, absl::Milliseconds(100));
  EXPECT_EQ(run.faults[2].detection_latency, absl::Seconds(2));  // the hang event is this stop's
  EXPECT_EQ(run.faults[2].detected_by, "hang");
  EXPECT_EQ(run.faults[2].culprit_named, 3);
  EXPECT_THAT(FormatReport({run}),
              HasSubstr("cleared:" + std::string(EventKindName(EventKind::kRestartAll))));
}

TEST(ChaosReport, AHangEventBeforeTheStoppedProcessDiedIsStillCreditedToTheStop) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart)};
  events.push_back(Inject(1, 1, "stop", "101"));
  Event hang;
  hang.time = At(3);
  hang.rank = 0;
  hang.type = EventType::kHang;
  events.push_back(hang);
  events.push_back(Launcher(4, -1, EventKind::kRestartAll));
  events.push_back(Custom(9, -1, EventKind::kChaosRunEnd));
  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.faults.size(), 1u);
  EXPECT_EQ(run.faults[0].detection_latency, absl::Seconds(2));
  EXPECT_EQ(run.faults[0].cleared_by, "");
}

Event HostInject(double at, int rank, const std::string& kind, const std::string& host,
                 const std::string& ranks) {
  return Custom(at, rank, EventKind::kChaosInject,
                {{"kind", kind}, {"host", host}, {"ranks", ranks}, {"source", "chaos"}});
}

Event HostLost(double at, const std::string& host, const std::string& ranks) {
  return Custom(at, -1, EventKind::kHostLost,
                {{"source", "launcher"}, {"on_host", "host1"}, {"host", host}, {"ranks", ranks}});
}

TEST(ChaosReport, AKilledHostIsDetectedByItsLossAndTheCulpritIsTheHostDeclaredLost) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart, {{"mode", "trainguard"}})};
  AddSteps(events, 0, 9, 1, 0, "100");  // steps 0..9 at 1..10 s
  events.push_back(HostInject(10.5, 2, "host_kill", "host2", "2,3"));
  events.push_back(HostLost(13.5, "host2", "2,3"));
  events.push_back(
      Custom(14, -1, EventKind::kHostReplaced, {{"source", "launcher"}, {"host", "host2"}}));
  AddSteps(events, 8, 12, 15, 1, "100");  // restored from step 7's snapshot: 8, 9 done again
  events.push_back(Custom(20, -1, EventKind::kChaosRunEnd));
  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.faults.size(), 1u);
  const FaultOutcome& f = run.faults[0];
  EXPECT_EQ(f.kind, "host_kill");
  EXPECT_EQ(f.host, "host2");
  EXPECT_EQ(f.ranks, "2,3");
  EXPECT_EQ(f.detection_latency, absl::Seconds(3));
  EXPECT_EQ(f.detected_by, EventKindName(EventKind::kHostLost));
  EXPECT_EQ(f.culprit_host_named, "host2");
  EXPECT_FALSE(f.culprit_named.has_value());
  EXPECT_TRUE(f.culprit_correct());
  EXPECT_EQ(f.time_to_recovery, absl::Milliseconds(6500));  // step 10 at 17 s
  EXPECT_EQ(f.steps_lost, 2);
  EXPECT_EQ(run.culprits_correct(), 1);
  EXPECT_THAT(FormatReport({run}), HasSubstr("host2 ok"));
  EXPECT_THAT(FormatReport({run}), HasSubstr("host2 (ranks 2,3)"));
  EXPECT_THAT(ReportJson({run}), HasSubstr("\"host\":\"host2\",\"ranks\":\"2,3\","
                                           "\"culprit_host_named\":\"host2\""));
}

TEST(ChaosReport, AHostFaultIsRecoveredByTheFirstNewStepAfterTheLauncherRecoveredFromThatHost) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart)};
  AddSteps(events, 0, 4, 1, 0, "100");  // steps 0..4 at 1..5 s
  events.push_back(HostInject(5.5, 2, "partition", "host2", "2,3"));
  events.push_back(StepDone(5.6, 5, 0, "100"));  // in flight when the host was cut off
  events.push_back(HostLost(8.5, "host2", "2,3"));
  events.push_back(Custom(9.5, -1, EventKind::kRecovered,
                          {{"source", "launcher"}, {"on_host", "host1"}, {"host", "host3"}}));
  events.push_back(Custom(9.6, -1, EventKind::kRecovered,
                          {{"source", "launcher"}, {"on_host", "host1"}, {"host", "host2"}}));
  AddSteps(events, 4, 6, 10, 1, "100");  // restored step 3: 4 at 10 s, 5 at 11 s, 6 at 12 s
  events.push_back(Custom(13, -1, EventKind::kChaosRunEnd));
  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.faults.size(), 1u);
  // Not step 5 at 5.6 s: the first step beyond 4 after the recovery from host2 is step 5 at 11 s.
  EXPECT_EQ(run.faults[0].time_to_recovery, absl::Milliseconds(5500));
  EXPECT_EQ(run.faults[0].steps_lost, 1);  // step 4 (done before the fault) done again
}

TEST(ChaosReport, APartitionWhoseHostIsNotTheOneDeclaredLostIsAWrongCulprit) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart)};
  events.push_back(HostInject(1, 0, "partition", "host1", "0,1"));
  events.push_back(HostLost(4, "host3", "4,5"));
  events.push_back(Custom(9, -1, EventKind::kChaosRunEnd));
  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.faults.size(), 1u);
  EXPECT_EQ(run.faults[0].culprit_host_named, "host3");
  EXPECT_FALSE(run.faults[0].culprit_correct());
  EXPECT_THAT(FormatReport({run}), HasSubstr("host3 WRONG"));
}

TEST(ChaosReport, TwoHostFaultsAreEachCreditedWithTheLossOfTheirOwnHost) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart)};
  events.push_back(HostInject(1, 0, "host_kill", "host1", "0,1"));
  events.push_back(HostInject(2, 2, "partition", "host2", "2,3"));
  events.push_back(HostLost(4, "host2", "2,3"));  // the later fault's host is declared first
  events.push_back(HostLost(5, "host1", "0,1"));
  events.push_back(Custom(9, -1, EventKind::kChaosRunEnd));
  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.faults.size(), 2u);
  EXPECT_EQ(run.faults[0].detection_latency, absl::Seconds(4));
  EXPECT_TRUE(run.faults[0].culprit_correct());
  EXPECT_EQ(run.faults[1].detection_latency, absl::Seconds(2));
  EXPECT_TRUE(run.faults[1].culprit_correct());
}

// On simulated hosts pids are per host: the same pid on two hosts is two processes.
TEST(ChaosReport, TheSamePidOnTwoHostsIsTwoProcesses) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart)};
  events.push_back(
      Custom(1, 0, EventKind::kChaosInject,
             {{"kind", "kill"}, {"pid", "7"}, {"host", "host1"}, {"source", "chaos"}}));
  events.push_back(
      Custom(2, 2, EventKind::kChaosInject,
             {{"kind", "kill"}, {"pid", "7"}, {"host", "host2"}, {"source", "chaos"}}));
  events.push_back(Custom(2.5, 2, EventKind::kRankDied,
                          {{"source", "launcher"}, {"pid", "7"}, {"on_host", "host2"}}));
  events.push_back(Custom(3, -1, EventKind::kChaosRunEnd));
  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.faults.size(), 2u);
  EXPECT_FALSE(run.faults[0].detection_latency.has_value());
  EXPECT_EQ(run.faults[1].detection_latency, absl::Milliseconds(500));
  EXPECT_EQ(run.faults[1].culprit_named, 2);
}

TEST(ChaosReport, AHostLossEndsTheStoppedProcessesOfThatHost) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart)};
  events.push_back(
      Custom(1, 3, EventKind::kChaosInject,
             {{"kind", "stop"}, {"pid", "9"}, {"host", "host2"}, {"source", "chaos"}}));
  events.push_back(HostInject(1.5, 2, "host_kill", "host2", "2,3"));
  events.push_back(HostLost(4, "host2", "2,3"));
  Event hang;  // the survivors' collectives with the dead host hang
  hang.time = At(5);
  hang.rank = 0;
  hang.type = EventType::kHang;
  events.push_back(hang);
  events.push_back(Custom(9, -1, EventKind::kChaosRunEnd));
  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.faults.size(), 2u);
  EXPECT_FALSE(run.faults[0].detection_latency.has_value());
  EXPECT_EQ(run.faults[0].cleared_by, EventKindName(EventKind::kHostLost));
  EXPECT_TRUE(run.faults[1].culprit_correct());
}

// An event as the writers spelled it before EventKind: the type and `what` by hand.
Event WrittenBeforeTheEnum(double at, int rank, const std::string& what,
                           std::vector<std::pair<std::string, std::string>> more = {}) {
  Event e;
  e.time = At(at);
  e.rank = rank;
  e.type = EventType::kCustom;
  e.attributes = {{"what", what}};
  e.attributes.insert(e.attributes.end(), more.begin(), more.end());
  return e;
}

TEST(ChaosReport, EventFilesWrittenBeforeTheEventKindsAreReportedAsToday) {
  std::vector<Event> today = {Custom(0, -1, EventKind::kChaosRunStart, {{"mode", "trainguard"}})};
  AddSteps(today, 0, 4, 1, 0, "100");  // steps 0..4 at 1..5 s
  today.push_back(Inject(5.5, 2, "kill"));
  today.push_back(Launcher(5.6, 2, EventKind::kRankDied));
  AddSteps(today, 5, 7, 7, 1, "100");  // generation 1: steps 5..7 at 7..9 s
  today.push_back(Custom(10, -1, EventKind::kChaosRunEnd));

  // The same run in event files, as an older trainguard wrote them.
  testing::TempDir tmp;
  const std::string run_dir = tmp.path() + "/run";
  {
    auto chaos = EventLog::Open(Env::Default(), run_dir + "/events/chaos.tgev");
    auto launcher = EventLog::Open(Env::Default(), run_dir + "/events/launcher.tgev");
    auto rank0 = EventLog::Open(Env::Default(), EventLogPath(run_dir, 0));
    ASSERT_TRUE(chaos.ok() && launcher.ok() && rank0.ok());
    ASSERT_TRUE((*chaos)
                    ->Append(WrittenBeforeTheEnum(0, -1, "chaos_run_start",
                                                  {{"source", "chaos"}, {"mode", "trainguard"}}))
                    .ok());
    ASSERT_TRUE(
        (*chaos)
            ->Append(WrittenBeforeTheEnum(5.5, 2, "chaos_inject",
                                          {{"source", "chaos"}, {"kind", "kill"}, {"pid", "4242"}}))
            .ok());
    ASSERT_TRUE((*chaos)
                    ->Append(WrittenBeforeTheEnum(10, -1, "chaos_run_end", {{"source", "chaos"}}))
                    .ok());
    ASSERT_TRUE((*launcher)
                    ->Append(WrittenBeforeTheEnum(5.6, 2, "rank_died",
                                                  {{"source", "launcher"}, {"pid", "4242"}}))
                    .ok());
    for (const Event& e : today) {
      if (KindOf(e) != EventKind::kStepDone) continue;
      Event before = WrittenBeforeTheEnum(0, 0, "step_done", {{"pid", "100"}});
      before.time = e.time;
      before.step = e.step;
      before.generation = e.generation;
      ASSERT_TRUE((*rank0)->Append(before).ok());
    }
  }
  absl::StatusOr<std::vector<Event>> read = ReadRunEvents(run_dir);
  ASSERT_TRUE(read.ok()) << read.status();
  const RunAnalysis old = AnalyzeRun(*read);
  const RunAnalysis now = AnalyzeRun(today);
  EXPECT_EQ(old.steps_kept, 8);
  EXPECT_EQ(old.productive, absl::Seconds(6));  // steps 1..4 and 6..7
  ASSERT_EQ(old.faults.size(), 1u);
  EXPECT_EQ(old.faults[0].detected_by, "rank_died");  // the report's column, as it always read
  EXPECT_EQ(old.faults[0].culprit_named, 2);
  EXPECT_EQ(FormatReport({old}), FormatReport({now}));
  EXPECT_EQ(ReportJson({old}), ReportJson({now}));
}

TEST(ChaosReport, TwoRunsAreReportedSideBySideWithTheirEttrRatio) {
  std::vector<Event> a = {Custom(0, -1, EventKind::kChaosRunStart, {{"mode", "trainguard"}})};
  AddSteps(a, 0, 2, 0, 0, "1");  // 2 s of 4
  a.push_back(Custom(4, -1, EventKind::kChaosRunEnd));
  std::vector<Event> b = {Custom(0, -1, EventKind::kChaosRunStart, {{"mode", "baseline"}})};
  AddSteps(b, 0, 1, 0, 0, "1");  // 1 s of 4
  b.push_back(Custom(4, -1, EventKind::kChaosRunEnd));
  const std::vector<RunAnalysis> runs = {AnalyzeRun(a), AnalyzeRun(b)};
  EXPECT_DOUBLE_EQ(runs[0].ettr, 0.5);
  EXPECT_DOUBLE_EQ(runs[1].ettr, 0.25);
  EXPECT_THAT(FormatReport(runs),
              HasSubstr("ETTR trainguard 50.0% vs baseline 25.0%: ratio 2.000"));
  EXPECT_THAT(ReportJson(runs), HasSubstr("\"ettr_ratio\":2.000000"));
  EXPECT_THAT(ReportJson(runs), HasSubstr("{\"mode\":\"trainguard\",\"ettr\":0.500000,"));
}

TEST(ChaosReport, AnEmptyStreamIsAnEmptyRun) {
  const RunAnalysis run = AnalyzeRun({});
  EXPECT_EQ(run.wall, absl::ZeroDuration());
  EXPECT_EQ(run.ettr, 0);
  EXPECT_TRUE(run.faults.empty());
}

Event SuspectHost(double at, const std::string& host, const std::string& action) {
  Event e;
  e.time = At(at);
  e.rank = -1;
  e.type = EventType::kSuspectHost;
  e.attributes = {{"host", host},
                  {"metric", "cpu_wait_ms"},
                  {"z", "1.650"},
                  {"windows", "2"},
                  {"action", action}};
  return e;
}

TEST(ChaosReport, SuspectHostDetectionsAreListedInTheTextAndJsonReports) {
  std::vector<Event> events = {Custom(0, -1, EventKind::kChaosRunStart, {{"mode", "trainguard"}}),
                               SuspectHost(12.5, "host3", "alert"),
                               Custom(20, -1, EventKind::kChaosRunEnd)};
  const RunAnalysis run = AnalyzeRun(events);
  ASSERT_EQ(run.suspects.size(), 1u);
  EXPECT_EQ(run.suspects[0].at, absl::Seconds(12.5));
  EXPECT_EQ(run.suspects[0].host, "host3");
  EXPECT_EQ(run.suspects[0].metric, "cpu_wait_ms");
  EXPECT_DOUBLE_EQ(run.suspects[0].z, 1.65);
  EXPECT_EQ(run.suspects[0].windows, 2);
  EXPECT_EQ(run.suspects[0].action, "alert");
  EXPECT_THAT(FormatReport({run}), HasSubstr("suspect hosts 1:"));
  EXPECT_THAT(FormatReport({run}),
              ::testing::ContainsRegex("12.500 +host3 +cpu_wait_ms +1.65 +2 alert"));
  EXPECT_THAT(ReportJson({run}),
              HasSubstr("\"suspects\":[{\"at_s\":12.500,\"host\":\"host3\",\"metric\":"
                        "\"cpu_wait_ms\",\"z\":1.650,\"windows\":2,\"action\":\"alert\"}]"));
  // A run without any: an empty list, and no table.
  EXPECT_THAT(ReportJson({AnalyzeRun({})}), HasSubstr("\"suspects\":[]"));
  EXPECT_THAT(FormatReport({AnalyzeRun({})}), ::testing::Not(HasSubstr("suspect hosts")));
}

// A hand-made dump: three hosts, host2 computing twice as long per step from second 3.
constexpr char kDump[] =
    "# suspect_host host=host2 metric=compute_ms z=1.41 deviation=1.00 windows=1 second=5 "
    "unix=1700000005 action=alert\n"
    "1 host1 v1 1 10 compute_ms=100 collective_ms=50 cpu_wait_ms=1 cpu_util=0.9\n"
    "1 host2 v1 1 10 compute_ms=100 collective_ms=50 cpu_wait_ms=1 cpu_util=0.9\n"
    "1 host3 v1 1 10 compute_ms=100 collective_ms=50 cpu_wait_ms=1 cpu_util=0.9\n"
    "3 host1 v1 2 5 compute_ms=50 collective_ms=200 cpu_wait_ms=1 cpu_util=0.5\n"
    "3 host2 v1 2 5 compute_ms=100 collective_ms=20 cpu_wait_ms=300 cpu_util=0.5\n"
    "3 host3 v1 2 5 compute_ms=50 collective_ms=200 cpu_wait_ms=1 cpu_util=0.5\n"
    "5 host1 v1 3 0 compute_ms=0 collective_ms=0 cpu_wait_ms=1 cpu_util=0.1\n"
    "5 host2 v1 3 5 compute_ms=100 collective_ms=20 cpu_wait_ms=300 cpu_util=0.5\n"
    "5 host3 v1 3 5 compute_ms=50 collective_ms=200 cpu_wait_ms=1\n";

TEST(FailSlowPlot, TheScriptDrawsOnePanelPerMetricOneLinePerHostTheSuspectInRedAndTheDetection) {
  absl::StatusOr<FailSlowDump> dump = ParseFailSlowDump(kDump);
  ASSERT_TRUE(dump.ok()) << dump.status();
  ASSERT_EQ(dump->hosts.size(), 3u);
  const std::string script = FailSlowPlotScript(*dump, "/d", "/out/x.png");
  EXPECT_THAT(script, HasSubstr("set output \"/out/x.png\""));
  EXPECT_THAT(script, HasSubstr("set multiplot layout 2,2"));
  EXPECT_THAT(script,
              HasSubstr("suspect host host2: compute_ms, z 1.41, 1 window(s), action: alert"));
  // The detection at x = 0 (seconds are drawn relative to it).
  EXPECT_THAT(script, HasSubstr("set arrow 1 from 0, graph 0 to 0, graph 1 nohead"));
  // Panels in the detector's priority order, the per-step ones said so, the detecting one marked.
  const size_t compute = script.find("set title \"compute_ms per step (detected)\"");
  const size_t wait = script.find("set title \"cpu_wait_ms\"");
  const size_t collective = script.find("set title \"collective_ms per step\"");
  const size_t cpu = script.find("set title \"cpu_util\"");
  ASSERT_NE(compute, std::string::npos) << script;
  ASSERT_NE(wait, std::string::npos) << script;
  ASSERT_NE(collective, std::string::npos) << script;
  ASSERT_NE(cpu, std::string::npos) << script;
  EXPECT_LT(compute, wait);
  EXPECT_LT(wait, collective);
  EXPECT_LT(collective, cpu);
  // Column m + 2 of every host's data file (host-<i>.dat, i by host name), the suspect thick red.
  EXPECT_THAT(script, HasSubstr("\"/d/host-1.dat\" using 1:2 with lines lw 3 lc rgb '#d62728' "
                                "title \"host2 (suspect)\""));
  EXPECT_THAT(script, HasSubstr("\"/d/host-0.dat\" using 1:5 with lines lw 1"));
  EXPECT_THAT(script, HasSubstr("\"/d/host-2.dat\" using 1:3 with lines lw 1"));
  size_t plots = 0;
  for (size_t at = script.find("\nplot "); at != std::string::npos;
       at = script.find("\nplot ", at + 1)) {
    ++plots;
  }
  EXPECT_EQ(plots, 4u);
  EXPECT_THAT(script, HasSubstr("unset multiplot"));
}

TEST(FailSlowPlot, APngIsWrittenFromADumpWhenGnuplotIsInstalled) {
  if (access("/usr/bin/gnuplot", X_OK) != 0) GTEST_SKIP() << "gnuplot is not installed";
  absl::StatusOr<FailSlowDump> dump = ParseFailSlowDump(kDump);
  ASSERT_TRUE(dump.ok()) << dump.status();
  testing::TempDir tmp;
  const std::string png = tmp.File("curves.png");
  ASSERT_TRUE(PlotFailSlowDump(*dump, png).ok());
  absl::StatusOr<std::string> bytes = Env::Default()->ReadFileToString(png);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_TRUE(absl::StartsWith(*bytes, "\x89PNG\r\n\x1a\n"));
  // Columns in priority order (compute_ms, cpu_wait_ms, collective_ms, cpu_util), the per-step ones
  // divided by the second's work; host1 did no step in the detection second: those are missing.
  absl::StatusOr<std::string> host1 = Env::Default()->ReadFileToString(png + ".data/host-0.dat");
  ASSERT_TRUE(host1.ok());
  EXPECT_EQ(*host1, "-4 10 1 5 0.9\n-2 10 1 40 0.5\n0 - 1 - 0.1\n");
}

TEST(FailSlowPlot, TheDumpsPngIsNamedAfterTheReportsPngAndTheDump) {
  EXPECT_EQ(FailSlowPngPath("/o/run.png", "/r/events/fail_slow/1700000005-host2.trace"),
            "/o/run-fail-slow-1700000005-host2.png");
  EXPECT_EQ(FailSlowPngPath("plot", "1-h.trace"), "plot-fail-slow-1-h.png");
}

TEST(ChaosSchedule, TheSameSeedGivesTheSameFaultsAtTheSameTimes) {
  const std::vector<std::pair<std::string, int>> mix = {{"kill", 2}, {"stop", 1}, {"nan", 1}};
  const std::vector<PlannedFault> a = PlanFaults(7, absl::Seconds(20), absl::Minutes(10), mix, 4);
  const std::vector<PlannedFault> b = PlanFaults(7, absl::Seconds(20), absl::Minutes(10), mix, 4);
  const std::vector<PlannedFault> c = PlanFaults(8, absl::Seconds(20), absl::Minutes(10), mix, 4);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  bool differs = a.size() != c.size();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].at, b[i].at);
    EXPECT_EQ(a[i].kind, b[i].kind);
    EXPECT_EQ(a[i].rank, b[i].rank);
    EXPECT_LT(a[i].at, absl::Minutes(10));
    if (i > 0) {
      EXPECT_GT(a[i].at, a[i - 1].at);
    }
    EXPECT_GE(a[i].rank, 0);
    EXPECT_LT(a[i].rank, 4);
    if (!differs && (a[i].at != c[i].at || a[i].rank != c[i].rank)) differs = true;
  }
  EXPECT_TRUE(differs) << "seeds 7 and 8 planned the same schedule";
}

TEST(ChaosSchedule, OnlyKindsOfTheMixAreDrawn) {
  const std::vector<PlannedFault> plan =
      PlanFaults(3, absl::Seconds(1), absl::Minutes(5), {{"stop", 1}}, 2);
  ASSERT_FALSE(plan.empty());
  for (const PlannedFault& f : plan) EXPECT_EQ(f.kind, "stop");
}

TEST(ChaosSchedule, AMixWithAnUnknownKindOrABadWeightIsRejectedByName) {
  EXPECT_THAT(ParseMix("kill=2,partition=1").status().message(), HasSubstr("'partition'"));
  EXPECT_THAT(ParseMix("kill=x").status().message(), HasSubstr("'kill=x'"));
  EXPECT_FALSE(ParseMix("kill=0").ok());
  absl::StatusOr<std::vector<std::pair<std::string, int>>> mix = ParseMix("kill=2,stop=1,nan=0");
  ASSERT_TRUE(mix.ok());
  EXPECT_EQ(*mix, (std::vector<std::pair<std::string, int>>{{"kill", 2}, {"stop", 1}}));
}

TEST(ChaosSchedule, BothModesRunTrainguardFirstAndAnUnknownModeIsRejectedByName) {
  EXPECT_EQ(*ParseModes("both"), (std::vector<std::string>{"trainguard", "baseline"}));
  EXPECT_EQ(*ParseModes("baseline"), std::vector<std::string>{"baseline"});
  EXPECT_THAT(ParseModes("torchrun").status().message(), HasSubstr("'torchrun'"));
}

TEST(ChaosSchedule, HostKindsAreAcceptedOnlyWhereThereAreHostsAndTheRefusalSaysWhere) {
  EXPECT_THAT(ParseMix("host_kill=1").status().message(), HasSubstr("bench_chaos_hosts"));
  absl::StatusOr<std::vector<std::pair<std::string, int>>> mix =
      ParseMix("host_kill=2,partition=1,kill=1", /*host_kinds=*/true);
  ASSERT_TRUE(mix.ok()) << mix.status();
  EXPECT_EQ(*mix, (std::vector<std::pair<std::string, int>>{
                      {"host_kill", 2}, {"partition", 1}, {"kill", 1}}));
  EXPECT_THAT(ParseMix("flood=1", true).status().message(), HasSubstr("host_kill, partition"));
}

}  // namespace
}  // namespace trainguard::tools
