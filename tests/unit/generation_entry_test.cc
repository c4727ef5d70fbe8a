// Generation entry (sdk/runtime/generation_entry.h): its decisions, as pure functions on
// hand-made outcomes; then GenerationEntry carrying them out, each rank a thread with its own
// store client and RendezvousMember on one InMemoryStore, the test acting as the launcher
// (RendezvousCoordinator), a communicator that broadcasts through the generation's store
// (tests/support/store_communicator.h), the restore a hook that says what the checkpointer found,
// and the tracker on a ManualClock.
#include "sdk/runtime/generation_entry.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/core/mutex.h"
#include "sdk/rendezvous/rendezvous.h"
#include "tests/support/store_communicator.h"
#include "trainguard/checkpoint.h"
#include "trainguard/clock.h"
#include "trainguard/collectives.h"
#include "trainguard/membership.h"
#include "trainguard/runtime.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using Action = EntryRetryDecision::Action;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kMax = Runtime::kMaxGenerationAttempts;

RecoveryPlan PlanWithSource(int source) {
  RecoveryPlan plan;
  plan.generation = 2;
  plan.resume_step = 40;
  plan.state_source_rank = source;
  return plan;
}

// A rank holds its place in a generation without the member ids; they are read once per
// generation, on the first use, by the training thread or the watchdog's, whichever comes first.
TEST(RankGeneration, TheMemberIdsAreReadOncePerGenerationOnFirstUse) {
  RankGeneration current;
  int reads = 0;
  bool unreachable = false;
  auto read = [&](int64_t generation) -> absl::StatusOr<Membership> {
    ++reads;
    if (unreachable) return absl::UnavailableError("store unreachable");
    Membership table;
    table.generation = generation;
    table.world_size = 2;
    table.members = {"m0", absl::StrCat("m1-", generation)};
    return table;
  };
  Membership place;
  place.generation = 3;
  place.world_size = 2;
  place.rank = 1;
  current.Adopt(place, std::nullopt);
  EXPECT_TRUE(current.membership().members.empty());
  EXPECT_TRUE(current.MemberIdsOf(3).empty());
  EXPECT_THAT(current.MembershipWithIds(read).members, ::testing::ElementsAre("m0", "m1-3"));
  EXPECT_THAT(current.MembershipWithIds(read).members, ::testing::ElementsAre("m0", "m1-3"));
  EXPECT_EQ(current.MembershipWithIds(read).rank, 1);
  EXPECT_EQ(reads, 1);
  EXPECT_TRUE(current.membership().members.empty());  // a communicator's spec points at it
  EXPECT_THAT(current.MemberIdsOf(3), ::testing::ElementsAre("m0", "m1-3"));

  // The watchdog's thread read generation 4's ids first: the training thread takes them.
  place.generation = 4;
  current.Adopt(place, std::nullopt);
  current.SetMemberIds(3, {"stale", "stale"});  // not the generation held: ignored
  EXPECT_TRUE(current.MemberIdsOf(4).empty());
  current.SetMemberIds(4, {"m0", "m1-4"});
  EXPECT_THAT(current.MembershipWithIds(read).members, ::testing::ElementsAre("m0", "m1-4"));
  EXPECT_EQ(reads, 1);

  // A read that fails leaves the ids out, and is tried again at the next use.
  place.generation = 5;
  current.Adopt(place, std::nullopt);
  unreachable = true;
  EXPECT_TRUE(current.MembershipWithIds(read).members.empty());
  unreachable = false;
  EXPECT_THAT(current.MembershipWithIds(read).members, ::testing::ElementsAre("m0", "m1-5"));
  EXPECT_EQ(reads, 3);
}

TEST(GenerationEntry, NothingCommittedIsAFreshJobNotAFailure) {
  EXPECT_EQ(ClassifyRestore(absl::NotFoundError("no committed checkpoint"), false),
            RestoreOutcome::kNothingCommitted);
  EXPECT_EQ(ClassifyRestore(absl::OkStatus(), false), RestoreOutcome::kRestored);
}

TEST(GenerationEntry, ARestoreAbortedIsTriedAgainOnlyWhenANewerGenerationExists) {
  const absl::Status aborted = absl::AbortedError("a peer left the collective restore");
  EXPECT_EQ(ClassifyRestore(aborted, /*superseded=*/true), RestoreOutcome::kSupersededMeanwhile);
  EXPECT_EQ(ClassifyRestore(aborted, /*superseded=*/false), RestoreOutcome::kFailed);
  // A write the store refused because a newer generation fenced this one out (a rank still
  // starting up as a replacement's generation forms): met in the newer generation too.
  const absl::Status fenced =
      absl::FailedPreconditionError("stale generation 0 < fence 1: write rejected");
  EXPECT_EQ(ClassifyRestore(fenced, /*superseded=*/true), RestoreOutcome::kSupersededMeanwhile);
  EXPECT_EQ(ClassifyRestore(fenced, /*superseded=*/false), RestoreOutcome::kFailed);
  // Committed state that cannot be read ends the entry, superseded or not: starting without it
  // would lose the job's progress.
  EXPECT_EQ(ClassifyRestore(absl::DataLossError("bad checksum"), true), RestoreOutcome::kFailed);
}

TEST(GenerationEntry, TheStateComesFromTheSourceRankUnlessRestoredAndIsLostWithoutOne) {
  EXPECT_EQ(DecideStateSource(/*restored=*/false, std::nullopt), StateSource::kOwn);
  EXPECT_EQ(DecideStateSource(/*restored=*/true, std::nullopt), StateSource::kOwn);
  EXPECT_EQ(DecideStateSource(false, PlanWithSource(1)), StateSource::kBroadcast);
  EXPECT_EQ(DecideStateSource(true, PlanWithSource(1)), StateSource::kOwn);
  // Every rank of the generation is new, and nothing was restored.
  EXPECT_EQ(DecideStateSource(false, PlanWithSource(-1)), StateSource::kLost);
  EXPECT_EQ(DecideStateSource(true, PlanWithSource(-1)), StateSource::kOwn);
}

TEST(GenerationEntry, OnlyTheRootOfAFailedBroadcastStillHasStateToOffer) {
  EXPECT_EQ(BroadcastFailure(/*rank=*/0, /*root=*/0), EntryFailure::kRetry);
  EXPECT_EQ(BroadcastFailure(/*rank=*/3, /*root=*/0), EntryFailure::kRetryWithoutState);
  const EntryRetryDecision root = DecideAfterFailedTry(EntryFailure::kRetry, true, 1, kMax, 40);
  EXPECT_EQ(root.action, Action::kRetry);
  EXPECT_EQ(root.offered_step, 40);
  const EntryRetryDecision other =
      DecideAfterFailedTry(EntryFailure::kRetryWithoutState, true, 1, kMax, 40);
  EXPECT_EQ(other.action, Action::kRetry);
  EXPECT_EQ(other.offered_step, -1);
}

TEST(GenerationEntry, FailedTriesAreRetriedUpToTheLimitThenGivenUp) {
  for (int attempts = 1; attempts < kMax; ++attempts) {
    EXPECT_EQ(DecideAfterFailedTry(EntryFailure::kRetry, true, attempts, kMax, 7).action,
              Action::kRetry)
        << attempts;
  }
  EXPECT_EQ(DecideAfterFailedTry(EntryFailure::kRetry, true, kMax, kMax, 7).action,
            Action::kGiveUp);
  EXPECT_EQ(DecideAfterFailedTry(EntryFailure::kRetryWithoutState, true, kMax, kMax, 7).action,
            Action::kGiveUp);
}

TEST(GenerationEntry, AStaticJobNeverRetriesAndALostStateStopsTheJobWhateverTheAttempts) {
  // Without a store there is no next generation to meet in.
  EXPECT_EQ(DecideAfterFailedTry(EntryFailure::kRetry, /*has_store=*/false, 1, kMax, 7).action,
            Action::kFail);
  EXPECT_EQ(DecideAfterFailedTry(EntryFailure::kFinal, true, 1, kMax, 7).action, Action::kFail);
  for (int attempts = 1; attempts <= kMax; ++attempts) {
    EXPECT_EQ(DecideAfterFailedTry(EntryFailure::kStopJob, true, attempts, kMax, 7).action,
              Action::kStopJob);
    EXPECT_EQ(DecideAfterFailedTry(EntryFailure::kStopJob, false, attempts, kMax, 7).action,
              Action::kStopJob);
  }
}

// ---------------------------------------------------------------------------------------------
// GenerationEntry, carried out.

constexpr absl::Duration kTimeout = absl::Seconds(20);

StepResult CommunicationFailure(int64_t step) {
  StepResult r;
  r.step = step;
  r.fault = FaultKind::kCommunicationFailure;
  r.action = StepAction::kReRendezvous;
  r.status = absl::UnavailableError("peer gone");
  return r;
}

// One rank process as generation entry sees it: its store client and rendezvous member (none in a
// static job), its state (8 floats), its tracker, the generation it holds, its entry, and what its
// hooks were asked. The hooks run on the rank's own thread; the test reads them after joining it.
struct EntryRank {
  EntryRank(InMemoryStore& shared, Clock* clock, int rank, int world, float value,
            const std::string& member_id, bool with_member, int max_attempts = kMax)
      : store(shared.NewClient()), weights(8, value) {
    if (with_member) {
      member = std::make_unique<RendezvousMember>(store.get(), member_id, absl::Milliseconds(20));
    }
    EXPECT_TRUE(state
                    .Register({"w",
                               "model",
                               weights.data(),
                               weights.size() * sizeof(float),
                               DType::kF32,
                               {8},
                               {}})
                    .ok());
    CollectiveTrackerOptions to;
    to.clock = clock;
    tracker = *CollectiveTracker::Create(to);
    entry = std::make_unique<GenerationEntry>(GenerationEntryOptions{
        .rank = rank,
        .world_size = world,
        .store = store.get(),
        .member = member.get(),
        .tracker = tracker.get(),
        .state = &state,
        .current = &current,
        .rendezvous_timeout = kTimeout,
        .max_attempts = max_attempts,
        .hooks = {
            .checkpointing = [] { return true; },
            .restore = [this]() -> absl::StatusOr<RestoreResult> {
              ++restores;
              if (restore) return restore();
              return absl::NotFoundError("no committed checkpoint");
            },
            .loss_window = [this] { return window; },
            .load_loss_window =
                [this](std::string_view w) {
                  loaded_window = std::string(w);
                  return absl::OkStatus();
                },
            .emit = [this](Event event) { events.push_back(std::move(event)); },
            .stop_job =
                [this](const std::string& reason, RecoveryReport& report) {
                  stop_reason = reason;
                  report.job_stopped = true;
                  return absl::FailedPreconditionError(reason);
                },
            .adopted = [this] { ++adopted; },
            .replaced = [this](std::string reason) { replaced_reason = std::move(reason); },
        }});
  }

  // Its place in generation 0 (JoinInitial: blocks until the coordinator forms it).
  void JoinInitial(int rank, int world) {
    absl::StatusOr<Membership> m = member->JoinInitial(rank, world, kTimeout);
    ASSERT_TRUE(m.ok()) << m.status();
    current.Adopt(*std::move(m), std::nullopt);
  }

  std::vector<Event> EntryFailures() const {
    std::vector<Event> out;
    for (const Event& e : events) {
      if (KindOf(e) == EventKind::kGenerationEntryFailed) out.push_back(e);
    }
    return out;
  }

  // In the order they are built; the entry last, destroyed first (it closes its communicator).
  std::unique_ptr<Store> store;
  std::vector<float> weights;
  std::unique_ptr<RendezvousMember> member;
  StateRegistry state;
  std::unique_ptr<CollectiveTracker> tracker;
  RankGeneration current;
  std::function<absl::StatusOr<RestoreResult>()> restore;  // unset: nothing committed
  std::string window;                                      // this rank's loss-spike window
  // What the hooks were asked.
  int restores = 0;
  int adopted = 0;
  std::optional<std::string> loaded_window;
  std::vector<Event> events;
  std::optional<std::string> stop_reason;
  std::optional<std::string> replaced_reason;
  std::unique_ptr<GenerationEntry> entry;
};

class GenerationEntryRun : public ::testing::Test {
 protected:
  // Generation 0 of `world` ranks, each with its member id "m<rank>" and its weights all `rank`.
  void StartJob(int world, int max_attempts = kMax) {
    for (int r = 0; r < world; ++r) {
      ranks_.push_back(std::make_unique<EntryRank>(shared_, &clock_, r, world, float(r),
                                                   absl::StrCat("m", r), true, max_attempts));
    }
    std::vector<std::thread> joining;
    for (int r = 0; r < world; ++r) {
      joining.emplace_back([&, r] { ranks_[r]->JoinInitial(r, world); });
    }
    ASSERT_TRUE(coordinator_.FormInitialGeneration(world, kTimeout).ok());
    for (std::thread& t : joining) t.join();
  }

  // The communicator factory of `rank`: StoreCommunicators, except in the generations listed in
  // failing_generations_, where the build fails as when a peer is gone, and in those listed in
  // failing_broadcasts_, where every broadcast fails (a communicator aborted from the start).
  void GiveFactory(EntryRank& rank, int slot) {
    rank.entry->SetCommunicatorFactory(
        [this,
         slot](const CommunicatorSpec& spec) -> absl::StatusOr<std::unique_ptr<Communicator>> {
          MutexLock lock(&mu_);
          built_[slot].push_back(spec.generation);
          if (failing_generations_.count(spec.generation) > 0) {
            return absl::UnavailableError(absl::StrCat("the gloo pair to rank ", 1 - spec.rank,
                                                       " of generation ", spec.generation,
                                                       " refused the connection"));
          }
          auto aborted =
              std::make_shared<std::atomic<bool>>(failing_broadcasts_.count(spec.generation) > 0);
          aborted_[{slot, spec.generation}] = aborted;
          return std::make_unique<testing::StoreCommunicator>(spec, aborted, kTimeout);
        });
  }

  bool Aborted(int slot, int64_t generation) {
    MutexLock lock(&mu_);
    auto it = aborted_.find({slot, generation});
    return it != aborted_.end() && it->second->load();
  }

  std::vector<int64_t> Built(int slot) {
    MutexLock lock(&mu_);
    return built_[slot];
  }

  // Acts as the launcher for ranks whose communicators fail while none dies: renews the
  // generation each time every rank asked, until `done` ranks have returned (bounded polling).
  void RenewWhileAsked(const std::atomic<int>& done, int world) {
    const absl::Time deadline = absl::Now() + 3 * kTimeout;
    while (done.load() < world && absl::Now() < deadline) {
      absl::StatusOr<std::map<int, std::string>> asked =
          coordinator_.NewGenerationRequests(kTimeout);
      if (asked.ok() && static_cast<int>(asked->size()) == world) {
        ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

  // Every rank's Enter(step) at once (it is collective); their results, by rank. Meanwhile the
  // test renews the generation whenever every rank asked, unless `renew_when_asked` is false (the
  // test drives the coordinator itself).
  std::vector<absl::StatusOr<int64_t>> EnterAll(int64_t step, std::vector<RecoveryReport>& reports,
                                                bool renew_when_asked = true) {
    const int world = static_cast<int>(ranks_.size());
    std::vector<absl::StatusOr<int64_t>> next(world);
    reports.assign(world, RecoveryReport{});
    std::atomic<int> done{0};
    std::vector<std::thread> entering;
    for (int r = 0; r < world; ++r) {
      entering.emplace_back([&, r] {
        next[r] = ranks_[r]->entry->Enter(step, step, reports[r]);
        ++done;
      });
    }
    if (renew_when_asked) RenewWhileAsked(done, world);
    for (std::thread& t : entering) t.join();
    return next;
  }

  ManualClock clock_;
  InMemoryStore shared_;
  std::unique_ptr<Store> coordinator_store_ = shared_.NewClient();
  RendezvousCoordinator coordinator_{coordinator_store_.get(), &clock_};
  Mutex mu_;
  std::set<int64_t> failing_generations_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> failing_broadcasts_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::vector<int64_t>> built_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<int, int64_t>, std::shared_ptr<std::atomic<bool>>> aborted_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<EntryRank>> ranks_;
};

// Before the first commit there is nothing to restore: the standby that takes a dead rank gets the
// state of the survivor that got furthest, by broadcast, and so does the survivor that was behind;
// the standby takes that survivor's loss-spike window too, the survivors keep theirs.
TEST_F(GenerationEntryRun, ARankReplacedBeforeTheFirstCommitGetsTheSurvivorsStateBroadcast) {
  StartJob(3);
  for (int r = 0; r < 3; ++r) {
    GiveFactory(*ranks_[r], r);
    ranks_[r]->window = absl::StrCat("window of rank ", r);
  }
  std::vector<RecoveryReport> reports;
  for (const absl::StatusOr<int64_t>& next : EnterAll(0, reports)) ASSERT_TRUE(next.ok());
  // Training went on without a checkpoint: rank 2 finished step 41, rank 0 did not.
  std::fill(ranks_[0]->weights.begin(), ranks_[0]->weights.end(), 41.0f);
  std::fill(ranks_[2]->weights.begin(), ranks_[2]->weights.end(), 42.0f);

  EntryRank standby(shared_, &clock_, /*rank=*/1, 3, -1.0f, "spare0", true);
  GiveFactory(standby, 3);
  absl::StatusOr<int64_t> standby_next;
  RecoveryReport standby_report;
  std::thread parked([&] {
    absl::StatusOr<Membership> m = standby.member->ParkAsStandby(kTimeout);
    ASSERT_TRUE(m.ok()) << m.status();
    absl::StatusOr<RecoveryPlan> plan = standby.member->AgreeOnResume(*m, -1, kTimeout);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const int64_t resume = plan->resume_step;
    standby.current.Adopt(*std::move(m), *std::move(plan));
    standby_next = standby.entry->Enter(resume, resume, standby_report);
  });
  for (absl::Time end = absl::Now() + kTimeout;
       absl::Now() < end && coordinator_.ParkedStandbys(kTimeout)->empty();) {
    absl::SleepFor(absl::Milliseconds(1));  // bounded polling: the standby parks
  }
  ASSERT_TRUE(coordinator_.ReplaceRank(1, kTimeout).ok());
  std::array<absl::StatusOr<int64_t>, 3> next;
  std::array<RecoveryReport, 3> survived;
  std::vector<std::thread> survivors;
  for (int r : {0, 2}) {
    survivors.emplace_back([&, r] {
      next[r] = ranks_[r]->entry->Recover(CommunicationFailure(41 + r / 2), survived[r]);
    });
  }
  for (std::thread& t : survivors) t.join();
  parked.join();

  ASSERT_TRUE(standby_next.ok()) << standby_next.status();
  EXPECT_EQ(*standby_next, 42);
  EXPECT_EQ(standby.current.generation(), 1);
  EXPECT_EQ(standby_report.state_source_rank, 2);
  EXPECT_EQ(standby_report.restored_from, "");
  for (float w : standby.weights) ASSERT_EQ(w, 42.0f);
  EXPECT_EQ(standby.loaded_window, "window of rank 2");
  for (int r : {0, 2}) {
    ASSERT_TRUE(next[r].ok()) << next[r].status();
    EXPECT_EQ(*next[r], 42);
    EXPECT_EQ(ranks_[r]->current.generation(), 1);
    // The rank learnt its place without the member ids; they are read where they are needed.
    EXPECT_EQ(ranks_[r]->current.membership().rank, r);
    EXPECT_TRUE(ranks_[r]->current.membership().members.empty());
    EXPECT_TRUE(ranks_[r]->current.MemberIdsOf(1).empty());
    RendezvousMember& member = *ranks_[r]->member;
    const Membership& with_ids = ranks_[r]->current.MembershipWithIds(
        [&](int64_t g) { return member.ReadRankTable(g, kTimeout); });
    EXPECT_EQ(with_ids.rank, r);
    EXPECT_THAT(with_ids.members, ElementsAre("m0", "spare0", "m2"));
    EXPECT_EQ(ranks_[r]->current.MemberIdsOf(1), with_ids.members);
    EXPECT_TRUE(ranks_[r]->current.MemberIdsOf(0).empty());
    // What the communicator was built with stays as it was.
    EXPECT_TRUE(ranks_[r]->current.membership().members.empty());
    EXPECT_EQ(ranks_[r]->adopted, 1);
    EXPECT_TRUE(survived[r].joined_generation);
    EXPECT_EQ(survived[r].state_source_rank, 2);
    EXPECT_EQ(survived[r].generation, 1);
    EXPECT_EQ(survived[r].generation_attempts, 1);
    EXPECT_EQ(ranks_[r]->loaded_window, std::nullopt) << "rank " << r << " keeps its own";
    // Generation 0's communicator was aborted before the rendezvous; generation 1's serves.
    EXPECT_TRUE(Aborted(r, 0));
    EXPECT_FALSE(Aborted(r, 1));
    EXPECT_NE(ranks_[r]->entry->communicator(), nullptr);
    for (float w : ranks_[r]->weights) ASSERT_EQ(w, 42.0f) << "rank " << r;
  }
}

// A restored checkpoint is every rank's state: the plan's state source is not broadcast from,
// whichever of the checkpointer's sources served it, and the report names that source.
class GenerationEntryRestore : public GenerationEntryRun,
                               public ::testing::WithParamInterface<const char*> {};

TEST_P(GenerationEntryRestore, ARestoredStateIsKeptAndReportedWithItsSource) {
  const std::string source = GetParam();
  // Generation 3, where rank 1 is new and the plan names rank 0 as the state source.
  for (int r = 0; r < 2; ++r) {
    ranks_.push_back(std::make_unique<EntryRank>(shared_, &clock_, r, 2, 10.0f + r, "", false));
    Membership m;
    m.generation = 3;
    m.rank = r;
    m.world_size = 2;
    m.members = {"m0", "spare0"};
    RecoveryPlan plan;
    plan.generation = 3;
    plan.resume_step = 50;
    plan.state_source_rank = 0;
    plan.new_ranks = {1};
    ranks_[r]->current.Adopt(m, plan);
    ranks_[r]->restore = [source]() -> absl::StatusOr<RestoreResult> {
      RestoreResult result;
      result.step = 30;
      result.source = source;
      result.skipped = {"step 40: rank 1: NotFound"};
      return result;
    };
    GiveFactory(*ranks_[r], r);
  }
  std::vector<RecoveryReport> reports;
  std::vector<absl::StatusOr<int64_t>> next = EnterAll(50, reports);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(next[r].ok()) << next[r].status();
    EXPECT_EQ(*next[r], 30) << "the restored step, not the plan's";
    EXPECT_EQ(reports[r].restored_from, source);
    EXPECT_THAT(reports[r].restore_skipped, ElementsAre("step 40: rank 1: NotFound"));
    EXPECT_EQ(reports[r].state_source_rank, -1);
    EXPECT_EQ(reports[r].generation_attempts, 1);
    EXPECT_NE(ranks_[r]->entry->communicator(), nullptr);
    EXPECT_EQ(ranks_[r]->loaded_window, std::nullopt);
    // The restore hook leaves 10 + r in place here: a broadcast from rank 0 would have made rank
    // 1's weights 10.
    for (float w : ranks_[r]->weights) ASSERT_EQ(w, 10.0f + r) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(FromTheArenaOrDisk, GenerationEntryRestore,
                         ::testing::Values("arena", "disk", "peer host h2"));

// The ranks restore together; a rank dies meanwhile and the launcher publishes a newer generation:
// the restore fails Aborted, and the entry meets the others in the newer generation and enters it
// there, instead of failing or building a communicator in the superseded one.
TEST_F(GenerationEntryRun, ANewerGenerationNoticedMidEntryAbandonsTheEntryAndRetriesInIt) {
  StartJob(2);
  std::once_flag renewed;
  absl::Status renewal;
  for (int r = 0; r < 2; ++r) {
    GiveFactory(*ranks_[r], r);
    EntryRank* rank = ranks_[r].get();
    rank->restore = [this, rank, &renewed, &renewal]() -> absl::StatusOr<RestoreResult> {
      if (rank->restores > 1) return absl::NotFoundError("no committed checkpoint");
      std::call_once(renewed, [&] { renewal = coordinator_.RenewGeneration(kTimeout).status(); });
      // As the checkpointer's superseded check does: the member learns of generation 1.
      absl::StatusOr<bool> superseded = rank->member->AwaitNewerGeneration(kTimeout);
      EXPECT_TRUE(superseded.ok() && *superseded);
      return absl::AbortedError("the restore's vote was abandoned: a peer left generation 0");
    };
  }
  std::vector<RecoveryReport> reports;
  std::vector<absl::StatusOr<int64_t>> next = EnterAll(7, reports, /*renew_when_asked=*/false);
  ASSERT_TRUE(renewal.ok()) << renewal;
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(next[r].ok()) << next[r].status();
    EXPECT_EQ(*next[r], 7);
    EXPECT_EQ(ranks_[r]->current.generation(), 1);
    EXPECT_EQ(reports[r].generation, 1);
    EXPECT_EQ(reports[r].generation_attempts, 2);
    EXPECT_TRUE(reports[r].joined_generation);
    EXPECT_EQ(ranks_[r]->restores, 2);
    // No communicator was built in the superseded generation.
    EXPECT_THAT(Built(r), ElementsAre(1));
    std::vector<Event> failures = ranks_[r]->EntryFailures();
    ASSERT_EQ(failures.size(), 1u);
    EXPECT_THAT(failures[0].message,
                HasSubstr(absl::StrCat("entering generation 0 failed (attempt 1 of ", kMax,
                                       "): rank ", r, ": restoring in generation 0: ")));
    EXPECT_EQ(ranks_[r]->stop_reason, std::nullopt);
  }
}

// A rank still starting up when a replacement's generation is published: its restore writes to
// the store (the backup service's address) and the store refuses the write of the fenced-out
// generation (FailedPrecondition), before any heartbeat has told the member it is superseded. The
// entry finds the newer generation's table in the store and meets the others there, instead of
// failing the rank's start (which spent a standby on each such rank).
TEST_F(GenerationEntryRun, AWriteFencedOutByANewerGenerationDuringTheRestoreRetriesInIt) {
  StartJob(2);
  std::once_flag renewed;
  absl::Status renewal;
  for (int r = 0; r < 2; ++r) {
    GiveFactory(*ranks_[r], r);
    EntryRank* rank = ranks_[r].get();
    rank->restore = [this, rank, &renewed, &renewal]() -> absl::StatusOr<RestoreResult> {
      if (rank->restores > 1) return absl::NotFoundError("no committed checkpoint");
      std::call_once(renewed, [&] { renewal = coordinator_.RenewGeneration(kTimeout).status(); });
      EXPECT_FALSE(rank->member->superseded());  // no heartbeat has told it
      return absl::FailedPreconditionError(
          "peer backups: publishing the address of its backup service: stale generation 0 < "
          "fence 1: write rejected");
    };
  }
  std::vector<RecoveryReport> reports;
  std::vector<absl::StatusOr<int64_t>> next = EnterAll(7, reports, /*renew_when_asked=*/false);
  ASSERT_TRUE(renewal.ok()) << renewal;
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(next[r].ok()) << next[r].status();
    EXPECT_EQ(ranks_[r]->current.generation(), 1);
    EXPECT_EQ(reports[r].generation_attempts, 2);
    EXPECT_EQ(ranks_[r]->restores, 2);
    EXPECT_THAT(Built(r), ElementsAre(1));
    EXPECT_EQ(ranks_[r]->stop_reason, std::nullopt);
  }
}

// The state broadcast of generation 1 fails on both ranks: its root still holds its state and
// offers its step again, the receiver's buffers may be half overwritten and it offers none; in
// generation 2 the receiver takes the root's state, as a rank new in it.
TEST_F(GenerationEntryRun, AFailedBroadcastLeavesOnlyTheRootWithStateToOfferInTheNextGeneration) {
  StartJob(2);
  for (int r = 0; r < 2; ++r) {
    GiveFactory(*ranks_[r], r);
    ranks_[r]->window = absl::StrCat("window of rank ", r);
  }
  {
    MutexLock lock(&mu_);
    failing_broadcasts_ = {1};
  }
  std::fill(ranks_[0]->weights.begin(), ranks_[0]->weights.end(), 10.0f);
  std::array<absl::StatusOr<int64_t>, 2> next;
  std::array<RecoveryReport, 2> reports;
  std::atomic<int> done{0};
  std::vector<std::thread> recovering;
  for (int r = 0; r < 2; ++r) {
    recovering.emplace_back([&, r] {
      // Rank 0 finished step 9, rank 1 failed in it.
      next[r] = ranks_[r]->entry->Recover(CommunicationFailure(r == 0 ? 10 : 9), reports[r]);
      ++done;
    });
  }
  RenewWhileAsked(done, 2);
  for (std::thread& t : recovering) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(next[r].ok()) << next[r].status();
    EXPECT_EQ(*next[r], 10);
    EXPECT_EQ(reports[r].generation, 2);
    EXPECT_EQ(reports[r].generation_attempts, 2);
    EXPECT_EQ(reports[r].state_source_rank, 0);
    ASSERT_TRUE(ranks_[r]->current.plan().has_value());
    EXPECT_THAT(ranks_[r]->current.plan()->new_ranks, ElementsAre(1));
    ASSERT_EQ(ranks_[r]->EntryFailures().size(), 1u);
    EXPECT_THAT(ranks_[r]->EntryFailures()[0].message,
                HasSubstr("entering generation 1 failed (attempt 1 of"));
    EXPECT_THAT(ranks_[r]->EntryFailures()[0].message,
                HasSubstr(absl::StrCat("rank ", r, ": broadcasting state buffer \"w\"")));
    for (float w : ranks_[r]->weights) ASSERT_EQ(w, 10.0f) << "rank " << r;
  }
  EXPECT_EQ(ranks_[0]->loaded_window, std::nullopt);
  EXPECT_EQ(ranks_[1]->loaded_window, "window of rank 0");
}

TEST_F(GenerationEntryRun, ACommunicatorThatFailsToBuildIsBuiltInTheNextGeneration) {
  StartJob(2);
  for (int r = 0; r < 2; ++r) GiveFactory(*ranks_[r], r);
  {
    MutexLock lock(&mu_);
    failing_generations_ = {0};
  }
  std::vector<RecoveryReport> reports;
  std::vector<absl::StatusOr<int64_t>> next = EnterAll(5, reports);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(next[r].ok()) << next[r].status();
    EXPECT_EQ(*next[r], 5);
    EXPECT_EQ(reports[r].generation, 1);
    EXPECT_EQ(reports[r].generation_attempts, 2);
    EXPECT_THAT(Built(r), ElementsAre(0, 1));
    EXPECT_NE(ranks_[r]->entry->communicator(), nullptr);
    ASSERT_EQ(ranks_[r]->EntryFailures().size(), 1u);
    EXPECT_THAT(ranks_[r]->EntryFailures()[0].message,
                HasSubstr("building communicator comm/gen0: the gloo pair to rank"));
  }
}

// A communicator's groups (a Megatron trainer's tensor, data-parallel and pipeline-link
// communicators) are registered with the rank's tracker beside it, each under its own id, and
// unregistered with it: the next generation's groups have new ids.
TEST_F(GenerationEntryRun, ACommunicatorsGroupsAreRegisteredWithItAndUnregisteredWithIt) {
  StartJob(2);
  std::map<int, std::vector<uint64_t>> ids;  // by rank: the ids its factory gave its groups
  for (int r = 0; r < 2; ++r) {
    ranks_[r]->entry->SetCommunicatorFactory(
        [this, r,
         &ids](const CommunicatorSpec& spec) -> absl::StatusOr<std::unique_ptr<Communicator>> {
          auto comm = std::make_unique<testing::StoreCommunicator>(
              spec, std::make_shared<std::atomic<bool>>(false), kTimeout);
          comm->set_groups({{spec.GroupId(0), "tp0"}, {spec.GroupId(r + 1), "link"}});
          MutexLock lock(&mu_);
          ids[r] = {spec.comm_id, spec.GroupId(0), spec.GroupId(r + 1)};
          return comm;
        });
  }
  std::vector<RecoveryReport> reports;
  std::vector<absl::StatusOr<int64_t>> next = EnterAll(5, reports);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(next[r].ok()) << next[r].status();
    std::vector<std::string> names;
    std::vector<uint64_t> registered;
    for (const CommunicatorProgress& p : ranks_[r]->tracker->Progress()) {
      names.push_back(p.name);
      registered.push_back(p.comm_id);
    }
    EXPECT_THAT(names, ElementsAre("comm/gen0", "tp0", "link"));
    MutexLock lock(&mu_);
    EXPECT_EQ(registered, ids[r]);
    EXPECT_EQ(ids[r][1], ids[0][1]) << "the same group, the same id on every member";
    for (uint64_t id : ids[r]) EXPECT_EQ(GenerationOfCommId(id), ids[r][0]);
  }
  EXPECT_NE(ids[0][2], ids[1][2]);
  for (int r = 0; r < 2; ++r) {
    ranks_[r]->entry->CloseCommunicator();
    EXPECT_TRUE(ranks_[r]->tracker->Progress().empty());
  }
}

TEST_F(GenerationEntryRun, ACommunicatorThatNeverBuildsIsGivenUpAtTheLimitNamingEachCause) {
  constexpr int kAttempts = 3;
  StartJob(2, kAttempts);
  for (int r = 0; r < 2; ++r) GiveFactory(*ranks_[r], r);
  {
    MutexLock lock(&mu_);
    failing_generations_ = {0, 1, 2, 3};
  }
  std::vector<RecoveryReport> reports;
  std::vector<absl::StatusOr<int64_t>> next = EnterAll(5, reports);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(absl::IsUnavailable(next[r].status())) << next[r].status();
    const std::string message(next[r].status().message());
    EXPECT_THAT(message, HasSubstr(absl::StrCat("rank ", r,
                                                ": no communicator could be built in 3 "
                                                "generations (limit kMaxGenerationAttempts 3)")));
    for (int g = 0; g < kAttempts; ++g) {
      EXPECT_THAT(message, HasSubstr(absl::StrCat(
                               "generation ", g, ": rank ", r, ": building communicator comm/gen",
                               g, ": the gloo pair to rank ", 1 - r, " of generation ", g,
                               " refused the connection")));
    }
    EXPECT_THAT(Built(r), ElementsAre(0, 1, 2));
    EXPECT_EQ(ranks_[r]->EntryFailures().size(), 3u);
    EXPECT_EQ(ranks_[r]->entry->communicator(), nullptr);
    EXPECT_EQ(ranks_[r]->stop_reason, std::nullopt)
        << "it may be the machines: the launcher decides";
  }
}

TEST_F(GenerationEntryRun, AStaticJobWhoseCommunicatorFailsFailsAtOnce) {
  ranks_.push_back(std::make_unique<EntryRank>(shared_, &clock_, 0, 1, 0.0f, "", false));
  GiveFactory(*ranks_[0], 0);
  {
    MutexLock lock(&mu_);
    failing_generations_ = {0};
  }
  RecoveryReport report;
  absl::StatusOr<int64_t> next = ranks_[0]->entry->Enter(0, 0, report);
  EXPECT_TRUE(absl::IsUnavailable(next.status())) << next.status();
  EXPECT_EQ(report.generation_attempts, 1);
  EXPECT_TRUE(ranks_[0]->EntryFailures().empty());
  // Nor can a step's communication failure meet anyone: there is no store to meet in.
  absl::StatusOr<int64_t> recovered = ranks_[0]->entry->Recover(CommunicationFailure(3), report);
  EXPECT_TRUE(absl::IsUnavailable(recovered.status()));
  EXPECT_THAT(std::string(recovered.status().message()), HasSubstr("this job has no store"));
}

TEST_F(GenerationEntryRun, EveryRankNewAndNothingRestoredStopsTheJobInsteadOfStartingAtZero) {
  ranks_.push_back(std::make_unique<EntryRank>(shared_, &clock_, 0, 1, 0.0f, "", false));
  GiveFactory(*ranks_[0], 0);
  Membership m;
  m.generation = 4;
  m.world_size = 1;
  m.members = {"spare0"};
  RecoveryPlan plan;
  plan.generation = 4;
  plan.state_source_rank = -1;
  plan.new_ranks = {0};
  ranks_[0]->current.Adopt(m, plan);
  RecoveryReport report;
  absl::StatusOr<int64_t> next = ranks_[0]->entry->Enter(0, 0, report);
  EXPECT_TRUE(absl::IsFailedPrecondition(next.status())) << next.status();
  ASSERT_TRUE(ranks_[0]->stop_reason.has_value());
  EXPECT_THAT(*ranks_[0]->stop_reason,
              HasSubstr("rank 0: every rank of generation 4 is new (no survivor holds the model "
                        "state) and no checkpoint is committed: the job's progress is lost"));
  EXPECT_TRUE(report.job_stopped);
  EXPECT_TRUE(Built(0).empty()) << "no communicator for a job that cannot go on";
}

// A rank presumed dead (a partition) meets a generation that gave its rank to a standby: it learns
// it was replaced and must not come back as a second holder of its rank.
TEST_F(GenerationEntryRun, ARankThatWasReplacedLearnsItWhenItMeetsTheNextGeneration) {
  StartJob(2);
  EntryRank standby(shared_, &clock_, 0, 2, 0.0f, "spare0", true);
  std::thread parked([&] { (void)standby.member->ParkAsStandby(kTimeout); });
  for (absl::Time end = absl::Now() + kTimeout;
       absl::Now() < end && coordinator_.ParkedStandbys(kTimeout)->empty();) {
    absl::SleepFor(absl::Milliseconds(1));  // bounded polling: the standby parks
  }
  ASSERT_TRUE(coordinator_.ReplaceRank(1, kTimeout).ok());
  parked.join();
  RecoveryReport report;
  absl::StatusOr<int64_t> next = ranks_[1]->entry->Recover(CommunicationFailure(9), report);
  EXPECT_TRUE(absl::IsFailedPrecondition(next.status())) << next.status();
  ASSERT_TRUE(ranks_[1]->replaced_reason.has_value());
  EXPECT_THAT(*ranks_[1]->replaced_reason, HasSubstr("was replaced"));
  EXPECT_EQ(ranks_[1]->current.generation(), 0);
  EXPECT_EQ(ranks_[1]->adopted, 0);
}

}  // namespace
}  // namespace trainguard
