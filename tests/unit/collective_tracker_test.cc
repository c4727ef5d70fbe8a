// The CollectiveTracker: per-communicator sequence numbers, learned in-flight bounds, overdue
// collectives reported by the Watchdog, communicator aborts, flight-recorder records, and the GPU
// path's polling logic (with fake CUDA events; the real ones run in tests/gpu).
#include <unistd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/watchdog/collective_tracker_impl.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/gpu_events.h"
#include "tests/support/poll_until_hang.h"
#include "trainguard/clock.h"
#include "trainguard/collectives.h"
#include "trainguard/watchdog.h"

namespace trainguard {

// Reaches the tracker's private seam for fake GPU events.
class CollectiveTrackerTestPeer {
 public:
  static absl::Status UseGpuEvents(CollectiveTracker& tracker,
                                   std::unique_ptr<watchdog_internal::GpuEvents> events) {
    return tracker.impl_->UseGpuEvents(std::move(events));
  }
};

namespace {

using ::testing::HasSubstr;
using watchdog_internal::GpuEventState;

constexpr uint64_t kDp = 7;
constexpr uint64_t kTp = 9;

std::unique_ptr<CollectiveTracker> MakeTracker(ManualClock* clock,
                                               FlightRecorder* recorder = nullptr,
                                               int max_in_flight = 16) {
  CollectiveTrackerOptions options;
  options.clock = clock;
  options.recorder = recorder;
  options.max_in_flight = max_in_flight;
  options.max_communicators = 2;
  auto tracker = CollectiveTracker::Create(options);
  EXPECT_TRUE(tracker.ok()) << tracker.status();
  return *std::move(tracker);
}

TEST(CollectiveTracker, SequenceNumbersCountPerCommunicator) {
  ManualClock clock;
  auto tracker = MakeTracker(&clock);
  ASSERT_TRUE(tracker->RegisterCommunicator(kDp, "dp", nullptr).ok());
  ASSERT_TRUE(tracker->RegisterCommunicator(kTp, "tp", nullptr).ok());
  std::vector<int64_t> dp, tp;
  for (int i = 0; i < 3; ++i) {
    CollectiveHandle a = tracker->Begin("all_reduce", kDp, 1024);
    CollectiveHandle b = tracker->Begin("all_gather", kTp, 512);
    CollectiveHandle c = tracker->Begin("reduce_scatter", kTp, 512);
    dp.push_back(a.comm_seq);
    tp.push_back(b.comm_seq);
    tp.push_back(c.comm_seq);
    tracker->End(c);
    tracker->End(a);
    tracker->End(b);
  }
  EXPECT_THAT(dp, ::testing::ElementsAre(0, 1, 2));
  EXPECT_THAT(tp, ::testing::ElementsAre(0, 1, 2, 3, 4, 5));
  std::vector<CommunicatorProgress> progress = tracker->Progress();
  ASSERT_EQ(progress.size(), 2u);
  EXPECT_EQ(progress[0].name, "dp");
  EXPECT_EQ(progress[0].begun, 3);
  EXPECT_EQ(progress[0].completed, 3);
  EXPECT_EQ(progress[1].begun, 6);
  EXPECT_EQ(tracker->usage_errors(), 0);
}

TEST(CollectiveTracker, CompletedTimeAndBytesSumTheCompletedCollectivesOnly) {
  ManualClock clock;
  auto tracker = MakeTracker(&clock);
  ASSERT_TRUE(tracker->RegisterCommunicator(kDp, "dp", nullptr).ok());
  CollectiveHandle a = tracker->Begin("all_reduce", kDp, 1000);
  CollectiveHandle b = tracker->Begin("all_gather", kDp, 250);
  clock.Advance(absl::Milliseconds(3));
  tracker->End(a);
  clock.Advance(absl::Milliseconds(2));
  tracker->End(b);
  (void)tracker->Begin("all_reduce", kDp, 4000);  // still in flight: not counted
  EXPECT_EQ(tracker->completed_time(), absl::Milliseconds(3 + 5));
  EXPECT_EQ(tracker->completed_bytes(), 1250);
}

TEST(CollectiveTracker, MisuseIsCountedAndNeverCrashes) {
  ManualClock clock;
  auto tracker = MakeTracker(&clock, nullptr, /*max_in_flight=*/2);
  CollectiveHandle unknown = tracker->Begin("all_reduce", 42, 8);
  EXPECT_FALSE(unknown.valid());
  EXPECT_THAT(std::string(tracker->usage_status().message()), HasSubstr("communicator 42"));
  tracker->End(unknown);  // ignored: Begin already counted it
  EXPECT_EQ(tracker->usage_errors(), 1);

  ASSERT_TRUE(tracker->RegisterCommunicator(kDp, "dp", nullptr).ok());
  CollectiveHandle a = tracker->Begin("all_reduce", kDp, 8);
  CollectiveHandle b = tracker->Begin("all_reduce", kDp, 8);
  EXPECT_FALSE(tracker->Begin("all_reduce", kDp, 8).valid()) << "the slot table is full";
  tracker->End(a);
  tracker->End(a);  // twice
  tracker->End(b);
  EXPECT_EQ(tracker->usage_errors(), 3);
  EXPECT_FALSE(tracker->BeginOnStream("all_reduce", kDp, 8, -1, nullptr).valid())
      << "GPU tracking was never enabled";
  EXPECT_EQ(tracker->usage_errors(), 4);
}

TEST(CollectiveTracker, RegistrationIsBoundedAndUnique) {
  ManualClock clock;
  auto tracker = MakeTracker(&clock);
  ASSERT_TRUE(tracker->RegisterCommunicator(kDp, "dp", nullptr).ok());
  EXPECT_EQ(tracker->RegisterCommunicator(kDp, "again", nullptr).code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(tracker->RegisterCommunicator(kTp, "tp", nullptr).ok());
  absl::Status full = tracker->RegisterCommunicator(3, "pp", nullptr);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()), HasSubstr("max_communicators"));
  ASSERT_TRUE(tracker->UnregisterCommunicator(kTp).ok());
  EXPECT_EQ(tracker->UnregisterCommunicator(kTp).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(tracker->RegisterCommunicator(3, "pp", nullptr).ok()) << "the freed slot is reused";
  EXPECT_EQ(tracker->Begin("send", 3, 8, 1).comm_seq, 0);
}

TEST(CollectiveTracker, LearnsAnInFlightBoundPerOp) {
  ManualClock clock;
  auto tracker = MakeTracker(&clock);
  ASSERT_TRUE(tracker->RegisterCommunicator(kDp, "dp", nullptr).ok());
  for (int i = 0; i < 5; ++i) {
    ScopedCollective c(tracker.get(), "all_reduce", kDp, 1 << 20);
    clock.Advance(absl::Seconds(1 + i));
  }
  EXPECT_EQ(tracker->BoundFor("all_reduce"), absl::Seconds(15));
  EXPECT_EQ(tracker->BoundFor("broadcast"), absl::Minutes(10)) << "never seen: warm-up";
}

struct WatchedTracker {
  WatchedTracker() {
    tracker = MakeTracker(&clock);
    WatchdogOptions options;
    options.poll_period = absl::ZeroDuration();
    options.clock = &clock;
    options.tracker = tracker.get();
    auto created = Watchdog::Create(options);
    EXPECT_TRUE(created.ok()) << created.status();
    wd = *std::move(created);
  }
  std::optional<absl::Duration> RunUntilHang(absl::Duration step, absl::Duration limit) {
    return testing::PollUntilHang(clock, *wd, step, limit);
  }
  ManualClock clock;
  std::unique_ptr<CollectiveTracker> tracker;
  std::unique_ptr<Watchdog> wd;
};

// While a hang's handlers run (a rank waits for its peers' dumps), the training thread may leave
// the hung collective by itself (a peer died), rendezvous and register the next generation's
// communicator. The hang aborts the communicators registered when it was declared, not that one.
TEST(CollectiveTracker, AHangAbortsOnlyTheCommunicatorsRegisteredWhenItWasDeclared) {
  WatchedTracker w;
  std::vector<std::string> aborted;
  ASSERT_TRUE(w.tracker->RegisterCommunicator(kDp, "dp", [&] { aborted.push_back("dp"); }).ok());
  constexpr uint64_t kNext = 8;
  w.wd->AddHangHandler([&](const HangReport&) {
    ASSERT_TRUE(w.tracker->UnregisterCommunicator(kDp).ok());
    ASSERT_TRUE(
        w.tracker->RegisterCommunicator(kNext, "next", [&] { aborted.push_back("next"); }).ok());
  });
  w.wd->BeginPhase("train");
  CollectiveHandle stuck = w.tracker->Begin("all_reduce", kDp, 1024, /*peer=*/1);
  ASSERT_TRUE(w.RunUntilHang(absl::Seconds(1), absl::Hours(1)).has_value());
  EXPECT_THAT(aborted, ::testing::IsEmpty())
      << "dp was unregistered before the abort, and next was registered after the declaration";
  w.tracker->End(stuck);
  w.wd->EndPhase();
  EXPECT_EQ(w.tracker->AbortCommunicators(), 1) << "next is still live and not aborted";
  EXPECT_THAT(aborted, ::testing::ElementsAre("next"));
}

// AbortCommunicators(ids) aborts only those, once each.
TEST(CollectiveTracker, AbortCommunicatorsByIdAbortsThoseOnlyAndOnce) {
  ManualClock clock;
  std::unique_ptr<CollectiveTracker> tracker = MakeTracker(&clock);
  std::vector<uint64_t> aborted;
  for (uint64_t id : {1, 2}) {
    ASSERT_TRUE(
        tracker->RegisterCommunicator(id, absl::StrCat("c", id), [&, id] { aborted.push_back(id); })
            .ok());
  }
  EXPECT_EQ(tracker->AbortCommunicators({2, 9}), 1);
  EXPECT_THAT(aborted, ::testing::ElementsAre(2));
  EXPECT_EQ(tracker->AbortCommunicators({2}), 0) << "already aborted";
  EXPECT_EQ(tracker->AbortCommunicators(), 1);
  EXPECT_THAT(aborted, ::testing::ElementsAre(2, 1));
}

TEST(CollectiveTracker, ACollectiveInFlightPastItsBoundIsAHangNamingIt) {
  WatchedTracker w;
  int aborts = 0;
  ASSERT_TRUE(w.tracker->RegisterCommunicator(kDp, "dp", [&] { ++aborts; }).ok());
  ASSERT_TRUE(w.tracker->RegisterCommunicator(kTp, "tp", nullptr).ok());
  // Warm up: the "train" phase runs 10 s (bound 30 s); its all-reduces take 100 ms (bound 2 s).
  for (int step = 0; step < 5; ++step) {
    ScopedPhase phase(w.wd.get(), "train");
    for (int i = 0; i < 10; ++i) {
      ScopedCollective c(w.tracker.get(), "all_reduce", kDp, 4 << 20);
      w.clock.Advance(absl::Milliseconds(100));
    }
    w.clock.Advance(absl::Seconds(9));
    ASSERT_EQ(w.wd->PollOnce(), 0);
  }
  ASSERT_EQ(w.tracker->BoundFor("all_reduce"), absl::Seconds(2));
  w.wd->SetStep(5);
  w.wd->BeginPhase("train");
  CollectiveHandle stuck = w.tracker->Begin("all_reduce", kDp, 4 << 20, /*peer=*/3);
  std::optional<absl::Duration> at = w.RunUntilHang(absl::Milliseconds(100), absl::Minutes(5));
  ASSERT_TRUE(at.has_value());
  EXPECT_LT(*at, w.wd->BoundsFor("train").duration) << "inside a phase within its own bound";
  std::optional<HangReport> hang = w.wd->TakeHang();
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->cause, HangReport::Cause::kCollective);
  EXPECT_EQ(hang->phase, "train");
  ASSERT_TRUE(hang->collective.has_value());
  EXPECT_EQ(hang->collective->op, "all_reduce");
  EXPECT_EQ(hang->collective->comm_id, kDp);
  EXPECT_EQ(hang->collective->comm_name, "dp");
  EXPECT_EQ(hang->collective->comm_seq, 50);
  EXPECT_EQ(hang->collective->bytes, 4u << 20);
  EXPECT_EQ(hang->collective->peer, 3);
  EXPECT_EQ(hang->collective->step, 5);
  EXPECT_GT(hang->collective->age, absl::Seconds(2));
  EXPECT_EQ(hang->Evidence("comm/dp"), "begun=51 completed=50");
  EXPECT_THAT(hang->ToString(), HasSubstr("all_reduce on comm \"dp\" (id 7) seq 50"));
  EXPECT_EQ(aborts, 1);

  EXPECT_FALSE(w.RunUntilHang(absl::Seconds(1), absl::Minutes(20)).has_value())
      << "reported once: the phase instance and the collective";
  EXPECT_EQ(aborts, 1) << "a communicator is aborted once per registration";
  w.tracker->End(stuck);
  w.wd->EndPhase();
  EXPECT_EQ(w.tracker->BoundFor("all_reduce"), absl::Seconds(2))
      << "the hung collective stays out of the op's history";
}

// An overdue collective that completes while the hang's handler waits (every rank was slowed at
// once, and caught up): the hang is withdrawn and its communicator is not aborted.
TEST(CollectiveTracker, ACollectiveThatCompletesWhileTheHangHandlerWaitsIsNotAborted) {
  WatchedTracker w;
  int aborts = 0;
  ASSERT_TRUE(w.tracker->RegisterCommunicator(kDp, "dp", [&] { ++aborts; }).ok());
  CollectiveHandle slow;
  bool withdrawn = false;
  w.wd->AddHangHandler([&](const HangReport& r) {
    EXPECT_EQ(r.cause, HangReport::Cause::kCollective);
    EXPECT_FALSE(w.wd->WithdrawHangIfEnded()) << "still in flight";
    w.tracker->End(slow);
    withdrawn = w.wd->WithdrawHangIfEnded();
  });
  slow = w.tracker->Begin("all_reduce", kDp, 1024);
  ASSERT_TRUE(w.RunUntilHang(absl::Seconds(1), absl::Hours(1)).has_value());
  EXPECT_TRUE(withdrawn);
  EXPECT_EQ(aborts, 0);
  EXPECT_FALSE(w.wd->TakeHang().has_value());
}

TEST(CollectiveTracker, ACollectiveOutsideAnyPhaseIsReportedOnce) {
  WatchedTracker w;
  ASSERT_TRUE(w.tracker->RegisterCommunicator(kDp, "dp", nullptr).ok());
  CollectiveHandle first = w.tracker->Begin("barrier", kDp, 0);
  ASSERT_TRUE(w.RunUntilHang(absl::Seconds(1), absl::Minutes(20)).has_value());
  std::optional<HangReport> hang = w.wd->TakeHang();
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->phase, "");
  EXPECT_EQ(hang->collective->op, "barrier");
  EXPECT_FALSE(w.RunUntilHang(absl::Seconds(10), absl::Hours(1)).has_value());
  // A later collective stuck separately is a separate hang.
  CollectiveHandle second = w.tracker->Begin("barrier", kDp, 0);
  ASSERT_TRUE(w.RunUntilHang(absl::Seconds(1), absl::Minutes(20)).has_value());
  EXPECT_EQ(w.wd->TakeHang()->collective->comm_seq, 1);
  w.tracker->End(first);
  w.tracker->End(second);
}

TEST(CollectiveTracker, BeginAndEndAreWrittenToTheFlightRecorder) {
  auto recorder = FlightRecorder::Create(absl::StrCat("ct-test-", getpid()), 0, 64);
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  ManualClock clock;
  auto tracker = MakeTracker(&clock, recorder->get());
  ASSERT_TRUE(tracker->RegisterCommunicator(kDp, "dp", nullptr).ok());
  tracker->SetStep(12);
  clock.Advance(absl::Seconds(1));
  CollectiveHandle h = tracker->Begin("send", kDp, 256, /*peer=*/5);
  clock.Advance(absl::Milliseconds(3));
  tracker->End(h);
  std::vector<FlightRecord> records = (*recorder)->Snapshot();
  ASSERT_EQ(records.size(), 3u);
  // The registration first: which communicators the rank is a member of.
  EXPECT_EQ(records[0].type, FlightRecordType::kCommunicator);
  EXPECT_EQ(records[0].comm_id, kDp);
  EXPECT_EQ(records[0].Name(), "dp");
  records.erase(records.begin());
  EXPECT_EQ(records[0].type, FlightRecordType::kCollectiveBegin);
  EXPECT_EQ(records[1].type, FlightRecordType::kCollectiveEnd);
  for (const FlightRecord& r : records) {
    EXPECT_EQ(r.Name(), "send");
    EXPECT_EQ(r.step, 12);
    EXPECT_EQ(r.comm_id, kDp);
    EXPECT_EQ(r.comm_seq, 0);
    EXPECT_EQ(r.bytes, 256u);
    EXPECT_EQ(r.peer, 5);
  }
  EXPECT_EQ(records[0].time_ns, 1'000'000'000);
  EXPECT_EQ(records[1].value, 3'000'000) << "the time in flight";
}

// A collective left by an exception (gloo threw: a peer died, an abort woke it) is recorded as
// failed, and the ring keeps the rank in it: a hang's diagnosis that reads the ring after the
// failure still sees where the rank waited. One that completes is left.
TEST(CollectiveTracker, ACollectiveLeftByAnExceptionIsRecordedFailedAndKeepsTheRankInIt) {
  auto recorder = FlightRecorder::Create(absl::StrCat("ct-test-failed-", getpid()), 0, 64);
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  ManualClock clock;
  auto tracker = MakeTracker(&clock, recorder->get());
  ASSERT_TRUE(tracker->RegisterCommunicator(kDp, "dp", nullptr).ok());
  { ScopedCollective ok(tracker.get(), "all_reduce", kDp, 8); }
  FlightRecorderContents ring;
  ring.records = (*recorder)->Snapshot();
  EXPECT_TRUE(PositionsOf(ring).at(kDp).left);
  try {
    ScopedCollective failing(tracker.get(), "recv", kDp, 8, /*peer=*/1);
    throw std::runtime_error("Connection reset by peer");
  } catch (const std::runtime_error&) {
  }
  ring.records = (*recorder)->Snapshot();
  ASSERT_EQ(ring.records.size(), 5u);
  EXPECT_EQ(ring.records[4].type, FlightRecordType::kCollectiveEnd);
  EXPECT_EQ(ring.records[4].flags & kFlightRecordFailed, kFlightRecordFailed);
  EXPECT_EQ(ring.records[2].flags & kFlightRecordFailed, 0);
  const CollectivePosition p = PositionsOf(ring).at(kDp);
  EXPECT_EQ(p.entered, 1);
  EXPECT_EQ(p.op, "recv");
  EXPECT_FALSE(p.left);
  EXPECT_EQ(tracker->Progress()[0].completed, 2);
}

TEST(CollectiveTracker, AnOpNameLongerThanARecordHoldsIsRecordedCutToSixtyThreeBytes) {
  auto recorder = FlightRecorder::Create(absl::StrCat("ct-test-long-", getpid()), 0, 64);
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  ManualClock clock;
  auto tracker = MakeTracker(&clock, recorder->get());
  ASSERT_TRUE(tracker->RegisterCommunicator(kDp, "dp", nullptr).ok());
  const std::string op = "all_reduce." + std::string(70, 'g');
  tracker->End(tracker->Begin(op, kDp, 8));
  std::vector<FlightRecord> records = (*recorder)->Snapshot();
  ASSERT_EQ(records.size(), 3u);  // the registration, then the collective
  records.erase(records.begin());
  for (const FlightRecord& r : records) EXPECT_EQ(r.Name(), op.substr(0, 63));
}

// Fake CUDA events: the test decides when each slot's start and end "fire".
class FakeGpuEvents : public watchdog_internal::GpuEvents {
 public:
  struct Slot {
    bool start_recorded = false, end_recorded = false;
    GpuEventState start = GpuEventState::kPending, end = GpuEventState::kPending;
    int64_t elapsed_ns = 0;
  };
  bool RecordStart(int slot, void*) override {
    slots[slot] = Slot{};
    slots[slot].start_recorded = true;
    return true;
  }
  bool RecordEnd(int slot, void*) override {
    slots[slot].end_recorded = true;
    return true;
  }
  GpuEventState QueryStart(int slot) override { return slots[slot].start; }
  GpuEventState QueryEnd(int slot) override { return slots[slot].end; }
  int64_t ElapsedNanos(int slot) override { return slots[slot].elapsed_ns; }
  void BindThread() override {}
  std::map<int, Slot> slots;
};

TEST(CollectiveTracker, GpuCollectivesAreInFlightFromTheirStartEventAndCompleteWhenPolled) {
  auto recorder = FlightRecorder::Create(absl::StrCat("ct-gpu-test-", getpid()), 0, 64);
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  ManualClock clock;
  auto tracker = MakeTracker(&clock, recorder->get());
  auto owned = std::make_unique<FakeGpuEvents>();
  FakeGpuEvents* events = owned.get();
  ASSERT_TRUE(CollectiveTrackerTestPeer::UseGpuEvents(*tracker, std::move(owned)).ok());
  ASSERT_TRUE(tracker->RegisterCommunicator(kDp, "dp", nullptr).ok());

  int fake_stream = 0;
  CollectiveHandle h = tracker->BeginOnStream("all_reduce", kDp, 64, -1, &fake_stream);
  ASSERT_TRUE(h.valid());
  tracker->EndOnStream(h, &fake_stream);
  ASSERT_TRUE(events->slots[h.slot].start_recorded && events->slots[h.slot].end_recorded);
  clock.Advance(absl::Minutes(30));
  CollectivePoll poll = tracker->Poll(clock.MonotonicNanos());
  EXPECT_EQ(poll.in_flight, 0) << "queued behind other work: not started";
  EXPECT_TRUE(poll.overdue.empty());

  events->slots[h.slot].start = GpuEventState::kDone;
  poll = tracker->Poll(clock.MonotonicNanos());
  EXPECT_EQ(poll.in_flight, 1);
  ASSERT_TRUE(poll.oldest.has_value());
  EXPECT_TRUE(poll.oldest->on_gpu);
  EXPECT_EQ(poll.oldest->age, absl::ZeroDuration()) << "counted from the poll that saw it start";

  clock.Advance(absl::Minutes(11));
  poll = tracker->Poll(clock.MonotonicNanos());
  ASSERT_EQ(poll.overdue.size(), 1u) << "past the 10 min warm-up bound";
  EXPECT_EQ(poll.overdue[0].age, absl::Minutes(11));
  EXPECT_TRUE(tracker->Poll(clock.MonotonicNanos()).overdue.empty()) << "reported once";

  events->slots[h.slot].end = GpuEventState::kDone;
  events->slots[h.slot].elapsed_ns = 5;
  clock.Advance(absl::Seconds(1));
  poll = tracker->Poll(clock.MonotonicNanos());
  EXPECT_EQ(poll.gpu_completed, 1);
  EXPECT_EQ(poll.in_flight, 0);
  EXPECT_EQ(tracker->Progress()[0].completed, 1);

  // Five healthy ones teach the bound from their device time (events' elapsed time).
  for (int i = 0; i < 5; ++i) {
    CollectiveHandle g = tracker->BeginOnStream("all_reduce", kDp, 64, -1, &fake_stream);
    tracker->EndOnStream(g, &fake_stream);
    events->slots[g.slot].start = events->slots[g.slot].end = GpuEventState::kDone;
    events->slots[g.slot].elapsed_ns = 1'000'000'000;
    EXPECT_EQ(tracker->Poll(clock.MonotonicNanos()).gpu_completed, 1);
  }
  EXPECT_EQ(tracker->BoundFor("all_reduce"), absl::Seconds(3));

  std::vector<FlightRecord> records = (*recorder)->Snapshot();
  ASSERT_EQ(records.size(), 13u);  // the registration, then 6 collectives
  records.erase(records.begin());
  EXPECT_EQ(records[1].type, FlightRecordType::kCollectiveEnd);
  EXPECT_EQ(records[1].time_ns, absl::ToInt64Nanoseconds(absl::Minutes(41) + absl::Seconds(1)))
      << "completed when the poll saw it";
  EXPECT_EQ(records[1].value, 5);
  EXPECT_EQ(records[1].flags & 1, 1) << "the GPU flag";
}

TEST(CollectiveTracker, AFailedGpuEventCompletesTheCollectiveAsFailed) {
  ManualClock clock;
  auto tracker = MakeTracker(&clock);
  auto owned = std::make_unique<FakeGpuEvents>();
  FakeGpuEvents* events = owned.get();
  ASSERT_TRUE(CollectiveTrackerTestPeer::UseGpuEvents(*tracker, std::move(owned)).ok());
  ASSERT_TRUE(tracker->RegisterCommunicator(kDp, "dp", nullptr).ok());
  CollectiveHandle h = tracker->BeginOnStream("all_reduce", kDp, 64, -1, nullptr);
  tracker->EndOnStream(h, nullptr);
  events->slots[h.slot].start = GpuEventState::kDone;
  events->slots[h.slot].end = GpuEventState::kError;  // e.g. a sticky CUDA error
  EXPECT_EQ(tracker->Poll(clock.MonotonicNanos()).gpu_completed, 1);
  EXPECT_EQ(tracker->Poll(clock.MonotonicNanos()).in_flight, 0);
  EXPECT_EQ(tracker->BoundFor("all_reduce"), absl::Minutes(10)) << "no sample from a failure";
}

TEST(CollectiveTracker, EnableGpuNamesTheDeviceWhenItFails) {
  ManualClock clock;
  auto tracker = MakeTracker(&clock);
  absl::Status s = tracker->EnableGpu(4096);  // no machine has that device
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("4096"));
}

}  // namespace
}  // namespace trainguard
