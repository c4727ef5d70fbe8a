// Runtime as a rendezvous member: joining generation 0, a standby Runtime taking over a dead rank,
// and survivors' recover() meeting it in the next generation. Each "process" is a thread with its
// own store client (its own writer generation), as separate processes with their own connections
// are.
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/core/store_keys.h"
#include "sdk/health/fail_slow_metrics.h"
#include "sdk/rendezvous/rendezvous.h"
#include "tests/support/job_shm.h"
#include "tests/support/store_communicator.h"
#include "tests/support/temp_dir.h"
#include "trainguard/sdk.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(20);

// Keeps what Start() and recover() reported.
class RecoveryLog : public StepObserver {
 public:
  void OnStepBegin(int64_t) override {}
  void OnStepEnd(const StepResult&) override {}
  void OnRecovery(const RecoveryReport& report) override { reports.push_back(report); }
  std::vector<RecoveryReport> reports;
};

class RuntimeRendezvous : public ::testing::Test {
 protected:
  Options OptionsFor(const std::string& role, int rank, const std::string& member) {
    clients_.push_back(shared_.NewClient());
    Options o;
    o.job_id = job_id_;  // shm segments are named by job
    o.world_size = kWorld;
    o.rank = rank;
    o.role = role;
    o.member_id = member;
    o.run_dir = dir_.path();
    o.store_client = clients_.back().get();
    o.rendezvous_timeout_ms = 20'000;
    o.heartbeat_interval_ms = 20;
    if (superseded_step_exit_ms_ >= 0) o.superseded_step_exit_ms = superseded_step_exit_ms_;
    if (watchdog_poll_ms_ >= 0) o.watchdog_poll_ms = watchdog_poll_ms_;
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

  // Prepares every rank of StartJob() and runs their Start() together (it is collective); their
  // results, by rank.
  std::vector<absl::StatusOr<int64_t>> PrepareAndStartAll() {
    std::vector<absl::StatusOr<int64_t>> start(kWorld);
    std::vector<std::thread> starting;
    for (int r = 0; r < kWorld; ++r) {
      Prepare(*ranks_[r], r);
      starting.emplace_back([&, r] { start[r] = ranks_[r]->Start(); });
    }
    for (std::thread& t : starting) t.join();
    return start;
  }

  // Gives `rt` (process `slot`: a rank, or kWorld for the standby) its state, 8 floats, and the
  // StoreCommunicator factory, which fails in the generations listed in failing_generations_.
  void Prepare(Runtime& rt, int slot) {
    ASSERT_TRUE(rt.state()
                    .Register({"w",
                               "model",
                               state_[slot].data(),
                               state_[slot].size() * sizeof(float),
                               DType::kF32,
                               {static_cast<int64_t>(state_[slot].size())},
                               {}})
                    .ok());
    rt.AddObserver(&logs_[slot]);
    rt.SetCommunicatorFactory(
        [this,
         slot](const CommunicatorSpec& spec) -> absl::StatusOr<std::unique_ptr<Communicator>> {
          EXPECT_NE(spec.store, nullptr);
          EXPECT_EQ(spec.comm_id, static_cast<uint64_t>(spec.generation) + 1);
          MutexLock lock(&comms_mu_);
          if (failing_generations_.count(spec.generation) > 0) {
            return absl::UnavailableError(absl::StrCat(
                "rank ", spec.rank, ": a peer of generation ", spec.generation, " is gone"));
          }
          auto aborted = std::make_shared<std::atomic<bool>>(false);
          aborted_[{slot, spec.generation}] = aborted;
          return std::make_unique<testing::StoreCommunicator>(spec, aborted, kTimeout);
        });
  }

  bool Aborted(int slot, int64_t generation) {
    MutexLock lock(&comms_mu_);
    auto it = aborted_.find({slot, generation});
    return it != aborted_.end() && it->second->load();
  }

  // Acts as the launcher for ranks whose communicators fail while none dies: renews the
  // generation each time every rank asked, until `done` ranks have returned.
  void RenewWhileAsked(const std::atomic<int>& done) {
    const absl::Time deadline = absl::Now() + 3 * kTimeout;
    while (done.load() < kWorld && absl::Now() < deadline) {
      absl::StatusOr<std::map<int, std::string>> asked =
          coordinator_.NewGenerationRequests(kTimeout);
      if (asked.ok() && static_cast<int>(asked->size()) == kWorld) {
        ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

  std::optional<std::string> JobStop() {
    absl::StatusOr<std::vector<std::optional<std::string>>> v =
        coordinator_store_->MultiGet({Runtime::kJobStopKey}, kTimeout);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? (*v)[0] : std::nullopt;
  }

  // See AStepThatOutlivesItsGenerationExitsTheProcessSoAStandbyTakesTheRank.
  void ExpectAStepThatOutlivesItsGenerationToExit(int watchdog_poll_ms);

  static constexpr int kWorld = 3;
  int superseded_step_exit_ms_ = -1;  // -1: the default
  int watchdog_poll_ms_ = -1;         // -1: the default
  std::array<std::vector<float>, kWorld + 1> state_ = {
      std::vector<float>(8, 0.0f), std::vector<float>(8, 0.0f), std::vector<float>(8, 0.0f),
      std::vector<float>(8, -1.0f)};
  // Destroyed last, after the ranks: what they left (a rank that exited, a ring kept for its
  // successor).
  testing::JobSharedMemoryCleanup shm_cleanup_{absl::StrCat("rdzv-", getpid())};
  std::string job_id_ = absl::StrCat("rdzv-", getpid());
  std::array<RecoveryLog, kWorld + 1> logs_;
  Mutex comms_mu_;
  std::set<int64_t> failing_generations_ ABSL_GUARDED_BY(comms_mu_);
  std::map<std::pair<int, int64_t>, std::shared_ptr<std::atomic<bool>>> aborted_
      ABSL_GUARDED_BY(comms_mu_);
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
  // decisions. The replaced rank 1 still runs in this test (a real one is dead), and its
  // generation watcher may write generation 0's generation_superseded to the same file after the
  // standby's start: the events are looked for by type, not by position.
  auto last_of_type = [](const std::vector<Event>& events, EventType type) -> const Event* {
    for (auto it = events.rbegin(); it != events.rend(); ++it) {
      if (it->type == type) return &*it;
    }
    return nullptr;
  };
  auto rank1 = ReadEventLog(Env::Default(), EventLogPath(dir_.path(), 1));
  ASSERT_TRUE(rank1.ok());
  const Event* started_event = last_of_type(rank1->events, EventType::kRuntimeStarted);
  ASSERT_NE(started_event, nullptr);
  const Event& started = *started_event;
  EXPECT_EQ(started.generation, 1);
  EXPECT_EQ(started.Attribute("replaced_rank"), "1");
  EXPECT_THAT(started.message, HasSubstr("standby spare0 replaced rank 1"));
  auto rank0 = ReadEventLog(Env::Default(), EventLogPath(dir_.path(), 0));
  ASSERT_TRUE(rank0.ok());
  const Event* decision_event = last_of_type(rank0->events, EventType::kRecoveryDecision);
  ASSERT_NE(decision_event, nullptr);
  const Event& decision = *decision_event;
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
  // A replaced rank is a machine's fault, not the job's: it does not stop the job.
  EXPECT_EQ(JobStop(), std::nullopt);
}

// When a newer generation is published, every rank of the old one learns it from the store (the
// generation watcher waits for the next generation's table): it calls the trainer's superseded
// handlers once and writes the event. It leaves the factory's communicator alone (a rank waiting in
// its collective declares the hang that names a stopped peer). Then the ranks meet in the new
// generation.
TEST_F(RuntimeRendezvous, ARankLearnsThatItsGenerationWasSupersededAndCallsItsHandlersOnce) {
  StartJob();
  std::vector<absl::StatusOr<int64_t>> start = PrepareAndStartAll();
  Mutex mu;
  std::vector<std::vector<int64_t>> called(kWorld);  // guarded by mu
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(start[r].ok()) << start[r].status();
    ranks_[r]->AddSupersededHandler([&, r](int64_t generation) {
      MutexLock lock(&mu);
      called[r].push_back(generation);
    });
  }

  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  auto all_told = [&] {
    MutexLock lock(&mu);
    for (int r = 0; r < kWorld; ++r) {
      if (called[r].empty()) return false;
    }
    return true;
  };
  for (absl::Time end = absl::Now() + kTimeout; absl::Now() < end && !all_told();) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(all_told());
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(ranks_[r]->superseded_generation(), 0);
    EXPECT_FALSE(Aborted(r, 0));
  }

  std::vector<absl::StatusOr<int64_t>> next(kWorld);
  std::vector<std::thread> recovering;
  for (int r = 0; r < kWorld; ++r) {
    recovering.emplace_back([&, r] { next[r] = ranks_[r]->recover(CommunicationFailure(5)); });
  }
  for (std::thread& t : recovering) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(next[r].ok()) << next[r].status();
    EXPECT_EQ(ranks_[r]->generation(), 1);
    EXPECT_EQ(ranks_[r]->superseded_generation(), -1);
    EXPECT_FALSE(Aborted(r, 1));
  }
  ranks_.clear();  // joins the watchers: no handler call after this
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_THAT(called[r], ElementsAre(0));  // once, for generation 0
    auto events = ReadEventLog(Env::Default(), EventLogPath(dir_.path(), r));
    ASSERT_TRUE(events.ok()) << events.status();
    int superseded = 0;
    for (const Event& e : events->events) {
      if (KindOf(e) != EventKind::kGenerationSuperseded) continue;
      ++superseded;
      EXPECT_EQ(e.generation, 0);
      EXPECT_THAT(e.message, HasSubstr("generation 0 was superseded"));
      EXPECT_THAT(e.message, HasSubstr("1 handler called"));
    }
    EXPECT_EQ(superseded, 1) << "rank " << r;
  }
}

// A rank whose loop runs no collective would train on alone in a superseded generation: nothing
// fails. The guard of a step entered after the rank learnt of the newer generation fails before the
// body runs, as a communication failure, so recover() takes the rank to the new generation.
TEST_F(RuntimeRendezvous, AStepEnteredAfterTheGenerationWasSupersededFailsWithoutRunningItsBody) {
  StartJob();
  std::vector<absl::StatusOr<int64_t>> start = PrepareAndStartAll();
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(start[r].ok()) << start[r].status();

  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  for (absl::Time end = absl::Now() + kTimeout;
       absl::Now() < end && ranks_[0]->superseded_generation() != 0;) {
    absl::SleepFor(absl::Milliseconds(1));  // bounded polling: the generation watcher tells it
  }
  ASSERT_EQ(ranks_[0]->superseded_generation(), 0);
  bool ran = false;
  StepResult r = guard(*ranks_[0], 7, [&] { ran = true; });
  EXPECT_FALSE(ran);
  EXPECT_EQ(r.fault, FaultKind::kCommunicationFailure);
  EXPECT_EQ(r.action, StepAction::kReRendezvous);
  EXPECT_THAT(std::string(r.status.message()),
              HasSubstr("generation 0 was superseded before step 7 began"));

  std::vector<absl::StatusOr<int64_t>> next(kWorld);
  std::vector<std::thread> recovering;
  for (int k = 0; k < kWorld; ++k) {
    recovering.emplace_back([&, k] {
      next[k] = ranks_[k]->recover(k == 0 ? r : CommunicationFailure(7));
    });
  }
  for (std::thread& t : recovering) t.join();
  for (int k = 0; k < kWorld; ++k) ASSERT_TRUE(next[k].ok()) << next[k].status();
  EXPECT_EQ(ranks_[0]->generation(), 1);
  ran = false;
  EXPECT_TRUE(guard(*ranks_[0], *next[0], [&] { ran = true; }).ok());
  EXPECT_TRUE(ran);
}

// A peer declared a hang in generation 0 (its hang key) and the generation is superseded before
// the other ranks dumped it: each dumps its evidence as it learns of the new generation, so that
// the launcher's diagnosis of that hang has every rank's dump. Without the watchdog (poll 0) there
// is no hang watcher, so only the generation watcher can dump here.
TEST_F(RuntimeRendezvous, ARankLeavingAGenerationWithAPeersHangDumpsItsEvidenceFirst) {
  watchdog_poll_ms_ = 0;
  StartJob();
  ASSERT_TRUE(
      coordinator_store_->Set("hang/gen0", "rank 0: hang (phase) at step 7", kTimeout).ok());
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  auto all_dumped = [&] {
    for (int r = 0; r < kWorld; ++r) {
      if (ranks_[r]->hang_dumps() < 1) return false;
    }
    return true;
  };
  for (absl::Time end = absl::Now() + kTimeout; absl::Now() < end && !all_dumped();) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(all_dumped());
  ranks_.clear();  // joins the watchers
  for (int r = 0; r < kWorld; ++r) {
    auto events = ReadEventLog(Env::Default(), EventLogPath(dir_.path(), r));
    ASSERT_TRUE(events.ok()) << events.status();
    std::vector<std::string> dumps;
    for (const Event& e : events->events) {
      if (e.type != EventType::kHang) continue;
      EXPECT_EQ(e.generation, 0);
      EXPECT_EQ(e.Attribute("remote"), "true");
      EXPECT_THAT(e.message, HasSubstr("a peer declared a hang: rank 0: hang (phase) at step 7 "
                                       "(dumped as its generation was superseded)"));
      dumps.push_back(std::string(e.Attribute("dump")));
    }
    ASSERT_EQ(dumps.size(), 1u) << "rank " << r;
    EXPECT_TRUE(std::filesystem::exists(dumps[0])) << dumps[0];
  }
}

// Nothing reads a rank's progress records until a peer's collective runs past its bound, nor its
// work records without a host agent's fail-slow sample: the ranks write them only once asked.
TEST_F(RuntimeRendezvous, RanksWriteTheirProgressAndWorkRecordsOnlyOnceAsked) {
  StartJob();
  for (const absl::StatusOr<int64_t>& start : PrepareAndStartAll()) {
    ASSERT_TRUE(start.ok()) << start.status();
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> training;
  for (int r = 0; r < kWorld; ++r) {
    training.emplace_back([&, r] {
      for (int64_t step = ranks_[r]->resume_step(); !stop.load(); ++step) {
        (void)guard(*ranks_[r], step, [] { absl::SleepFor(absl::Milliseconds(2)); });
      }
    });
  }
  std::vector<std::string> records;
  for (int r = 0; r < kWorld; ++r) {
    records.push_back(store_keys::HangProgress(0, r));
    records.push_back(RankWorkKey(r));
  }
  auto written = [&] {
    absl::StatusOr<std::vector<std::optional<std::string>>> v =
        coordinator_store_->MultiGet(records, kTimeout);
    EXPECT_TRUE(v.ok()) << v.status();
    int n = 0;
    if (v.ok()) {
      for (const std::optional<std::string>& value : *v) n += value.has_value() ? 1 : 0;
    }
    return n;
  };
  absl::SleepFor(absl::Milliseconds(500));  // several duty periods of training
  EXPECT_EQ(written(), 0);
  ASSERT_TRUE(coordinator_store_->Set(store_keys::HangProgressWanted(0), "0 1", kTimeout).ok());
  ASSERT_TRUE(coordinator_store_->Set(kRankWorkWantedKey, "host0", kTimeout).ok());
  for (absl::Time end = absl::Now() + kTimeout;
       absl::Now() < end && written() < static_cast<int>(records.size());) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(written(), static_cast<int>(records.size()));
  stop = true;
  for (std::thread& t : training) t.join();
}

// A step that cannot end once its generation is superseded (a collective blocked on a peer that is
// gone without closing its connections) exits the process after superseded_step_exit_ms, so that
// the launcher gives its rank to a standby sooner than its refused heartbeat's timeout would. In a
// child process (a death test): rank 0 enters step 7, which waits (bounded) for nothing, and the
// generation is renewed under it. `watchdog_poll_ms`: -1 the default, 0 the watchdog off.
void RuntimeRendezvous::ExpectAStepThatOutlivesItsGenerationToExit(int watchdog_poll_ms) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        // The child's segments are named by this process (its parent), whose cleanup removes them.
        job_id_ = absl::StrCat("rdzv-", getppid());
        superseded_step_exit_ms_ = 100;
        watchdog_poll_ms_ = watchdog_poll_ms;
        StartJob();
        absl::Notification entered;
        absl::Notification never;
        std::thread step([&] {
          (void)guard(*ranks_[0], 7, [&] {
            entered.Notify();
            never.WaitForNotificationWithTimeout(absl::Seconds(60));
          });
        });
        if (entered.WaitForNotificationWithTimeout(kTimeout) &&
            coordinator_.RenewGeneration(kTimeout).ok()) {
          step.join();  // the process exits first
        } else {
          step.detach();
        }
        std::fprintf(stderr, "rank 0 did not exit\n");
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(Runtime::kSupersededStepExitCode),
      "rank 0: step 7 of generation 0 still running [0-9]+ ms after this rank learned that a newer "
      "generation superseded it: exiting with status 75 so that a standby takes rank 0");
}

TEST_F(RuntimeRendezvous, AStepThatOutlivesItsGenerationExitsTheProcessSoAStandbyTakesTheRank) {
  ExpectAStepThatOutlivesItsGenerationToExit(-1);
}

// The same without the watchdog (its duty thread publishes records, answers SIGUSR2 and runs this
// check): a rank left blocked in an old generation's collective must not hold the next
// generation's agreement for the collective's whole timeout (Launcher.ARankStoppedWhileANew...
// runs so, and hung once to its bound).
TEST_F(RuntimeRendezvous, WithTheWatchdogOffAStepThatOutlivesItsGenerationStillExitsTheProcess) {
  ExpectAStepThatOutlivesItsGenerationToExit(0);
}

TEST_F(RuntimeRendezvous, AStandbyThatTakesOverBeforeTheFirstCommitStartsAtTheSurvivorsStep) {
  StartJob();
  {
    std::vector<absl::StatusOr<int64_t>> start = PrepareAndStartAll();
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(start[r].ok()) << start[r].status();
      EXPECT_EQ(*start[r], 0);
      EXPECT_NE(ranks_[r]->communicator(), nullptr);
    }
  }
  // Training went on without a checkpoint: rank 2 finished step 41, rank 0 did not.
  std::fill(state_[0].begin(), state_[0].end(), 41.0f);
  std::fill(state_[2].begin(), state_[2].end(), 42.0f);
  // Each rank's CheckLoss window holds its own losses.
  auto window_of = [](double level) {
    LossSpikeDetector detector = *LossSpikeDetector::Create({});
    for (int i = 0; i < 30; ++i) detector.Observe(i, level + 0.01 * (i % 3));
    return detector.SaveState();
  };
  const std::string window0 = window_of(1.0), window2 = window_of(2.0);
  ASSERT_TRUE(ranks_[0]->LoadLossWindow(window0).ok());
  ASSERT_TRUE(ranks_[2]->LoadLossWindow(window2).ok());

  Options standby_options = OptionsFor("standby", 0, "spare0");
  absl::StatusOr<int64_t> standby_start;
  std::unique_ptr<Runtime> standby;
  std::thread parked([&] {
    auto rt = Runtime::Create(standby_options);
    ASSERT_TRUE(rt.ok()) << rt.status();
    standby = *std::move(rt);
    Prepare(*standby, kWorld);
    standby_start = standby->Start();
  });
  AwaitParkedStandbys(1);
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
  ASSERT_TRUE(standby_start.ok()) << standby_start.status();
  EXPECT_EQ(*standby_start, 42);
  EXPECT_EQ(standby->resume_step(), 42);
  for (int r : {0, 2}) {
    ASSERT_TRUE(next[r].ok()) << next[r].status();
    EXPECT_EQ(*next[r], 42);
    // The old communicator was aborted before the re-rendezvous; a new one serves generation 1.
    EXPECT_TRUE(Aborted(r, 0)) << "rank " << r;
    EXPECT_FALSE(Aborted(r, 1)) << "rank " << r;
    EXPECT_NE(ranks_[r]->communicator(), nullptr);
  }
  // Every rank holds rank 2's state: the replacement and the survivor that was behind.
  for (int slot : {0, 2, kWorld}) {
    for (float w : state_[slot]) ASSERT_EQ(w, 42.0f) << "process " << slot;
  }
  // The replacement takes the source's loss window (rank 1's died with it); the survivors keep
  // their own.
  EXPECT_EQ(standby->LossWindowState(), window2);
  EXPECT_EQ(ranks_[0]->LossWindowState(), window0);
  EXPECT_EQ(ranks_[2]->LossWindowState(), window2);
  ASSERT_FALSE(logs_[kWorld].reports.empty());
  const RecoveryReport& started = logs_[kWorld].reports.back();
  EXPECT_EQ(started.decision, "start");
  EXPECT_TRUE(started.joined_generation);
  EXPECT_EQ(started.generation, 1);
  EXPECT_EQ(started.state_source_rank, 2);
  const RecoveryReport& survived = logs_[0].reports.back();
  EXPECT_EQ(survived.decision, "re_rendezvous");
  EXPECT_EQ(survived.failed_step, 41);
  EXPECT_EQ(survived.next_step, 42);
  EXPECT_EQ(survived.state_source_rank, 2);
  EXPECT_EQ(survived.generation_attempts, 1);
}

TEST_F(RuntimeRendezvous, WhenTheRebuildFailsRecoverMeetsTheRanksInTheNextGenerationItself) {
  StartJob();
  for (int r = 0; r < kWorld; ++r) Prepare(*ranks_[r], r);
  {
    MutexLock lock(&comms_mu_);
    failing_generations_ = {1};  // a peer vanishes while generation 1's communicator is built
  }
  std::atomic<int> done{0};
  std::vector<absl::StatusOr<int64_t>> next(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      next[r] = ranks_[r]->recover(CommunicationFailure(10));
      ++done;
    });
  }
  RenewWhileAsked(done);
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(next[r].ok()) << next[r].status();
    EXPECT_EQ(*next[r], 10);
    EXPECT_EQ(ranks_[r]->generation(), 2);
    EXPECT_NE(ranks_[r]->communicator(), nullptr);
    const RecoveryReport& report = logs_[r].reports.back();
    EXPECT_EQ(report.decision, "re_rendezvous");
    EXPECT_EQ(report.generation, 2);
    EXPECT_EQ(report.generation_attempts, 2);
  }
  EXPECT_EQ(JobStop(), std::nullopt);
}

TEST_F(RuntimeRendezvous, ARebuildThatKeepsFailingGivesUpAfterTheLimitNamingEveryAttempt) {
  StartJob();
  for (int r = 0; r < kWorld; ++r) Prepare(*ranks_[r], r);
  {
    MutexLock lock(&comms_mu_);
    failing_generations_ = {1, 2, 3, 4, 5, 6};
  }
  std::atomic<int> done{0};
  std::vector<absl::StatusOr<int64_t>> next(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      next[r] = ranks_[r]->recover(CommunicationFailure(10));
      ++done;
    });
  }
  RenewWhileAsked(done);
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(absl::IsUnavailable(next[r].status())) << next[r].status();
    const std::string message(next[r].status().message());
    EXPECT_THAT(message, HasSubstr(absl::StrCat("rank ", r, ": no communicator could be built in ",
                                                Runtime::kMaxGenerationAttempts, " generations")));
    EXPECT_THAT(message, HasSubstr("generation 1: "));
    EXPECT_THAT(message,
                HasSubstr(absl::StrCat("generation ", Runtime::kMaxGenerationAttempts, ": ")));
    EXPECT_EQ(ranks_[r]->communicator(), nullptr);
  }
  EXPECT_EQ(JobStop(), std::nullopt);  // it may be the machines: the launcher decides
}

TEST_F(RuntimeRendezvous, AGiveUpBecauseTheJobCannotGoOnPublishesJobStopFirstWriterWins) {
  StartJob();
  auto failed = [](int64_t step) {
    StepResult r;
    r.step = step;
    r.fault = FaultKind::kStepFailure;
    r.action = StepAction::kSkip;
    r.status = absl::InternalError("loss is not finite");
    return r;
  };
  absl::StatusOr<int64_t> next;
  for (int64_t step = 20; step < 24; ++step) next = ranks_[2]->recover(failed(step));
  ASSERT_TRUE(absl::IsFailedPrecondition(next.status())) << next.status();
  const std::string reason(next.status().message());
  EXPECT_THAT(reason, ::testing::StartsWith("rank 2: 4 consecutive steps failed (limit 3: "
                                            "max_consecutive_step_failures), the last at step 23"));
  EXPECT_EQ(JobStop(), reason);

  // Rank 0 reaches the same verdict later: the launcher keeps the first reason.
  for (int64_t step = 20; step < 24; ++step) next = ranks_[0]->recover(failed(step));
  ASSERT_TRUE(absl::IsFailedPrecondition(next.status())) << next.status();
  EXPECT_THAT(std::string(next.status().message()), ::testing::StartsWith("rank 0: "));
  EXPECT_EQ(JobStop(), reason);
}

TEST_F(RuntimeRendezvous, AFatalDeviceErrorDoesNotStopTheJob) {
  StartJob();
  StepResult r;
  r.step = 5;
  r.fault = FaultKind::kFatalDeviceError;
  r.action = StepAction::kFatal;
  r.status = absl::InternalError("rank 0 step 5: cudaErrorIllegalAddress");
  EXPECT_EQ(ranks_[0]->recover(r).status(), r.status);
  EXPECT_EQ(JobStop(), std::nullopt);  // the launcher replaces the machine
}

TEST_F(RuntimeRendezvous, WhenEveryRankIsNewAndNothingIsCommittedStartRefusesToBeginAtZero) {
  StartJob();
  // Every rank of generation 0 dies; three standbys take over one after the other.
  std::vector<std::unique_ptr<Runtime>> standbys(kWorld);
  std::vector<absl::StatusOr<int64_t>> start(kWorld);
  std::vector<Options> options;
  for (int s = 0; s < kWorld; ++s)
    options.push_back(OptionsFor("standby", 0, absl::StrCat("spare", s)));
  std::vector<std::thread> parked;
  for (int s = 0; s < kWorld; ++s) {
    parked.emplace_back([&, s] {
      auto rt = Runtime::Create(options[s]);
      ASSERT_TRUE(rt.ok()) << rt.status();
      standbys[s] = *std::move(rt);
      start[s] = standbys[s]->Start();
    });
  }
  AwaitParkedStandbys(kWorld);
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(coordinator_.ReplaceRank(r, kTimeout).ok());
  for (std::thread& t : parked) t.join();
  for (int s = 0; s < kWorld; ++s) {
    EXPECT_TRUE(absl::IsFailedPrecondition(start[s].status())) << start[s].status();
    EXPECT_THAT(std::string(start[s].status().message()),
                HasSubstr("is new (no survivor holds the model state) and no checkpoint is "
                          "committed"));
  }
  std::optional<std::string> stop = JobStop();
  ASSERT_TRUE(stop.has_value());
  EXPECT_THAT(*stop, HasSubstr("the job's progress is lost"));
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
