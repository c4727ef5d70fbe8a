// Runtime as a rendezvous member: joining generation 0, a standby Runtime taking over a dead rank,
// and survivors' recover() meeting it in the next generation. Each "process" is a thread with its
// own store client (its own writer generation), as separate processes with their own connections
// are.
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/rendezvous/rendezvous.h"
#include "tests/support/temp_dir.h"
#include "trainguard/sdk.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(20);

class RuntimeRendezvous : public ::testing::Test {
 protected:
  Options OptionsFor(const std::string& role, int rank, const std::string& member) {
    clients_.push_back(shared_.NewClient());
    Options o;
    o.job_id = absl::StrCat("rdzv-", getpid());  // shm segments are named by job
    o.world_size = kWorld;
    o.rank = rank;
    o.role = role;
    o.member_id = member;
    o.run_dir = dir_.path();
    o.store_client = clients_.back().get();
    o.rendezvous_timeout_ms = 20'000;
    o.heartbeat_interval_ms = 20;
    return o;
  }

  // Creates the kWorld initial runtimes (one thread each) while the coordinator forms generation 0.
  void StartJob() {
    std::vector<Options> options;
    for (int r = 0; r < kWorld; ++r) options.push_back(OptionsFor("rank", r, absl::StrCat("m", r)));
    ranks_.resize(kWorld);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        auto rt = Runtime::Create(options[r]);
        ASSERT_TRUE(rt.ok()) << rt.status();
        ranks_[r] = *std::move(rt);
      });
    }
    ASSERT_TRUE(coordinator_.FormInitialGeneration(kWorld, kTimeout).ok());
    for (std::thread& t : threads) t.join();
  }

  void AwaitParkedStandbys(size_t n) {
    for (absl::Time end = absl::Now() + kTimeout; absl::Now() < end;) {
      if (coordinator_.ParkedStandbys(kTimeout)->size() >= n) return;
      absl::SleepFor(absl::Milliseconds(1));
    }
    FAIL() << "no standby parked in time";
  }

  static StepResult CommunicationFailure(int64_t step) {
    StepResult r;
    r.step = step;
    r.fault = FaultKind::kCommunicationFailure;
    r.action = StepAction::kReRendezvous;
    r.status = absl::UnavailableError("peer gone");
    return r;
  }

  static constexpr int kWorld = 3;
  testing::TempDir dir_;
  InMemoryStore shared_;
  std::vector<std::unique_ptr<Store>> clients_;
  std::unique_ptr<Store> coordinator_store_ = shared_.NewClient();
  RendezvousCoordinator coordinator_{coordinator_store_.get()};
  std::vector<std::unique_ptr<Runtime>> ranks_;
};

TEST_F(RuntimeRendezvous, InitialRanksJoinGenerationZero) {
  StartJob();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_NE(ranks_[r], nullptr);
    EXPECT_EQ(ranks_[r]->rank(), r);
    EXPECT_EQ(ranks_[r]->generation(), 0);
    EXPECT_EQ(ranks_[r]->resume_step(), 0);
    EXPECT_FALSE(ranks_[r]->recovery_plan().has_value());
    EXPECT_THAT(ranks_[r]->membership().members, ElementsAre("m0", "m1", "m2"));
    EXPECT_NE(ranks_[r]->store(), nullptr);
  }
}

TEST_F(RuntimeRendezvous, AStandbyReplacesADeadRankAndTheSurvivorsResumeWithIt) {
  StartJob();
  Options standby_options = OptionsFor("standby", 0, "spare0");
  std::unique_ptr<Runtime> standby;
  std::thread parked([&] {
    auto rt = Runtime::Create(standby_options);
    ASSERT_TRUE(rt.ok()) << rt.status();
    standby = *std::move(rt);
  });
  AwaitParkedStandbys(1);

  // Rank 1 "dies" at step 41; ranks 0 and 2 fail in the same step's collective.
  ASSERT_TRUE(coordinator_.ReplaceRank(1, kTimeout).ok());
  std::vector<absl::StatusOr<int64_t>> next(kWorld);
  std::vector<std::thread> survivors;
  for (int r : {0, 2}) {
    survivors.emplace_back(
        [&, r] { next[r] = ranks_[r]->recover(CommunicationFailure(41 + r / 2)); });
  }
  for (std::thread& t : survivors) t.join();
  parked.join();

  ASSERT_NE(standby, nullptr);
  EXPECT_EQ(standby->rank(), 1);
  EXPECT_EQ(standby->generation(), 1);
  // Rank 2 had finished step 41 already (it offers 42); everyone resumes at 42 from rank 2's state.
  EXPECT_EQ(standby->resume_step(), 42);
  ASSERT_TRUE(standby->recovery_plan().has_value());
  EXPECT_EQ(standby->recovery_plan()->state_source_rank, 2);
  EXPECT_THAT(standby->recovery_plan()->new_ranks, ElementsAre(1));
  for (int r : {0, 2}) {
    ASSERT_TRUE(next[r].ok()) << next[r].status();
    EXPECT_EQ(*next[r], 42);
    EXPECT_EQ(ranks_[r]->generation(), 1);
    EXPECT_EQ(ranks_[r]->recovery_plan()->state_source_rank, 2);
    EXPECT_THAT(ranks_[r]->membership().members, ElementsAre("m0", "spare0", "m2"));
  }

  // The replacement is in the events: the standby's start in rank 1's file, the survivors'
  // decisions.
  auto rank1 = ReadEventLog(Env::Default(), EventLogPath(dir_.path(), 1));
  ASSERT_TRUE(rank1.ok());
  const Event& started = rank1->events.back();
  EXPECT_EQ(started.type, EventType::kRuntimeStarted);
  EXPECT_EQ(started.generation, 1);
  EXPECT_EQ(started.Attribute("replaced_rank"), "1");
  EXPECT_THAT(started.message, HasSubstr("standby spare0 replaced rank 1"));
  auto rank0 = ReadEventLog(Env::Default(), EventLogPath(dir_.path(), 0));
  const Event& decision = rank0->events.back();
  EXPECT_EQ(decision.type, EventType::kRecoveryDecision);
  EXPECT_EQ(decision.Attribute("decision"), "re_rendezvous");
  EXPECT_EQ(decision.Attribute("new_ranks"), "1");
  EXPECT_EQ(decision.generation, 1);
}

TEST_F(RuntimeRendezvous, ARankThatWasReplacedLearnsItAndStopsTraining) {
  StartJob();
  std::unique_ptr<Runtime> standby;
  Options standby_options = OptionsFor("standby", 0, "spare0");
  std::thread parked([&] { standby = *Runtime::Create(standby_options); });
  AwaitParkedStandbys(1);
  ASSERT_TRUE(coordinator_.ReplaceRank(1, kTimeout).ok());
  // The survivors complete the new generation's agreement, so the standby's Create returns.
  std::vector<std::thread> survivors;
  for (int r : {0, 2})
    survivors.emplace_back([&, r] { (void)ranks_[r]->recover(CommunicationFailure(9)); });
  for (std::thread& t : survivors) t.join();
  parked.join();

  // Rank 1 was only presumed dead (a partition): it must not come back as a second rank 1.
  absl::StatusOr<int64_t> zombie = ranks_[1]->recover(CommunicationFailure(9));
  EXPECT_TRUE(absl::IsFailedPrecondition(zombie.status())) << zombie.status();
  EXPECT_THAT(std::string(zombie.status().message()), HasSubstr("was replaced"));
  EXPECT_TRUE(ranks_[1]->fatal());
  bool ran = false;
  EXPECT_FALSE(guard(*ranks_[1], 9, [&] { ran = true; }).ok());
  EXPECT_FALSE(ran);
  EXPECT_TRUE(absl::IsFailedPrecondition(ranks_[1]->store()->Set("ckpt/commit", "x", kTimeout)));
}

TEST(RuntimeRendezvousOptions, AStandbyWithoutAStoreIsRejected) {
  Options o;
  o.role = "standby";
  auto rt = Runtime::Create(o);
  EXPECT_TRUE(absl::IsInvalidArgument(rt.status()));
  EXPECT_THAT(std::string(rt.status().message()), HasSubstr("needs a store"));
}

TEST(RuntimeRendezvousOptions, ATcpStoreWithoutATokenFileIsRejected) {
  Options o;
  o.store = "tcp://127.0.0.1:1";
  auto rt = Runtime::Create(o);
  EXPECT_TRUE(absl::IsInvalidArgument(rt.status()));
  EXPECT_THAT(std::string(rt.status().message()), HasSubstr("store_token_file"));
}

}  // namespace
}  // namespace trainguard
