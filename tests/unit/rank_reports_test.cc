// The way a rank's death or finish goes from its host's agent to the coordinator's decision, one
// host and several through the same agent code (HostAgent::ReportDeath, ReportFinished): on several
// hosts the report is written to the store (StoreRankReports) and the coordinator reads it
// (JobCoordinator::ReadDeathReports, its job/done); on one host the coordinator runs in the agent's
// process and takes it at once (InProcessRankReports: no store call). An in-memory store, a ManualClock, a real JobCoordinator
// and RendezvousCoordinator, the recovery strategy the launcher chooses (StandbyReplacement) and a
// FakeProcessSupervisor whose workers are not processes: no processes, no sleeps.
#include "sdk/coordinator/in_process_rank_reports.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/agent/failure_history.h"
#include "sdk/agent/process_supervisor.h"
#include "sdk/agent/renewal_policy.h"
#include "sdk/agent/replacement_policy.h"
#include "sdk/coordinator/job_coordinator.h"
#include "sdk/coordinator/standby_replacement.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/rank_reports.h"
#include "sdk/core/store_keys.h"
#include "sdk/host_agent/host_agent.h"
#include "sdk/rendezvous/rendezvous.h"
#include "tests/support/agent_fixtures.h"
#include "tests/support/fake_process_supervisor.h"
#include "trainguard/clock.h"
#include "trainguard/events.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::RankMember;

constexpr absl::Duration kCall = absl::Seconds(1);
constexpr absl::Duration kBackoff = absl::Seconds(1);  // --restart-backoff
constexpr absl::Duration kStandbyWait = absl::Seconds(16);

enum class Layout { kOneHost, kSeveralHosts };

// The coordinator's own host h0 runs ranks 0 and 1 (the agent's pid 100); on several hosts h1
// runs ranks 2 and 3 elsewhere. Generation 0 formed unless a test says otherwise.
class RankReportsTest : public ::testing::TestWithParam<Layout> {
 protected:
  bool several() const { return GetParam() == Layout::kSeveralHosts; }
  int world() const { return several() ? 4 : 2; }

  void SetUp() override {
    ReplacementPolicyOptions policy;
    policy.restart_backoff = kBackoff;
    policy.has_standbys = true;
    policy_.emplace(policy);
    RenewalPolicyOptions renewal;
    renewal.multi_host = several();
    renewal_.emplace(renewal);
    JobCoordinatorOptions options;
    options.host_id = "h0";
    options.call_timeout = kCall;
    options.standby_wait = kStandbyWait;
    options.replace_timeout = kCall;
    coordinator_ = std::make_unique<JobCoordinator>(
        &store_, &clock_, &rendezvous_, &*policy_, &*renewal_, &failures_, options,
        testing::QuietJobCoordinatorHooks(&said_, &failed_));
    coordinator_->set_world_size(world());
    strategy_ = testing::UseStandbyReplacement(coordinator_.get(), &*policy_, &said_, &failed_);

    HostAgentOptions agent_options;
    agent_options.host_id = "h0";
    agent_options.call_timeout = kCall;
    agent_options.report_timeout = kCall;
    HostAgent::Hooks ah;
    ah.workers = testing::WorkersIn(&workers_);
    ah.say = [this](const std::string& line) { said_.push_back(line); };
    ah.record = [](int, EventKind, const std::string&, HostAgent::Attributes) {};
    ah.latest_term = [] { return int64_t{1}; };
    ah.pid_file = [](int rank) { return absl::StrCat("/run/job/pids/rank-", rank); };
    ah.rank_taken = [](HostWorker&) {};
    agent_ = std::make_unique<HostAgent>(&store_, &clock_, &supervisor_, agent_options,
                                         std::move(ah));
    // The wiring the launcher does on one host: its coordinator takes the reports in process.
    if (!several()) {
      InProcessRankReports::Hooks hooks;
      hooks.formed = [this] { return formed_; };
      hooks.every_rank_finished = [this] { ++job_done_; };
      in_process_ = std::make_unique<InProcessRankReports>(&failures_, strategy_.get(), &clock_,
                                                           world(), std::move(hooks));
      agent_->set_rank_reports(in_process_.get());
    }
    for (int r = 0; r < 2; ++r) Start(r);
  }

  // Generation 0 of the ranks, as their RendezvousMembers register and the coordinator forms it.
  void Form() {
    for (int r = 0; r < world(); ++r) {
      const std::string member = r < 2 ? RankMember("h0", 100, r) : RankMember("h1", 200, r);
      ASSERT_TRUE(store_.Set(store_keys::RdzvJoin(r), member, kCall).ok());
    }
    ASSERT_TRUE(rendezvous_.FormInitialGeneration(world(), kCall).ok());
    formed_ = true;
  }

  HostWorker& Start(int rank) {
    return testing::StartHostWorker(supervisor_, workers_, rank, RankMember("h0", 100, rank));
  }

  // `w` printed `line` and exited with `code`; its agent reports the death as the launcher's
  // OnExit does, and on several hosts the coordinator's next tick reads the report.
  void DiesAndIsReported(HostWorker& w, const std::string& line, int code) {
    supervisor_.Print(w.worker, line);
    supervisor_.Exit(w.worker, WorkerExit::Exited(code));
    for (const WorkerEvent& e : supervisor_.Poll(absl::ZeroDuration())) {
      if (e.worker != w.worker) continue;
      if (e.kind == WorkerEvent::Kind::kOutput) w.printed_cause.Observe(e.line);
      if (e.kind == WorkerEvent::Kind::kExited) w.running = false;
    }
    agent_->ReportDeath(w, WorkerExit::Exited(code).Describe());
    if (several()) coordinator_->ReadDeathReports();
  }

  std::vector<std::string> DeathKeys() {
    absl::StatusOr<std::vector<std::string>> keys =
        store_.ListKeys(store_keys::kAgentDeaths.prefix(), kCall);
    EXPECT_TRUE(keys.ok()) << keys.status();
    return keys.ok() ? *keys : std::vector<std::string>{};
  }

  ManualClock clock_{absl::UnixEpoch()};
  InMemoryStore store_{&clock_};  // its keys' ages by the same clock
  RendezvousCoordinator rendezvous_{&store_, &clock_, "h0"};
  std::optional<ReplacementPolicy> policy_;
  std::optional<RenewalPolicy> renewal_;
  FailureHistory failures_;
  std::unique_ptr<JobCoordinator> coordinator_;
  std::unique_ptr<StandbyReplacement> strategy_;
  testing::FakeProcessSupervisor supervisor_;
  std::vector<std::unique_ptr<HostWorker>> workers_;
  std::unique_ptr<HostAgent> agent_;
  std::unique_ptr<InProcessRankReports> in_process_;
  bool formed_ = false;
  int job_done_ = 0;  // one host: Hooks::every_rank_finished's calls
  std::vector<std::string> said_;
  std::vector<std::string> failed_;
};

INSTANTIATE_TEST_SUITE_P(Layouts, RankReportsTest,
                         ::testing::Values(Layout::kOneHost, Layout::kSeveralHosts),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return info.param == Layout::kOneHost ? "OneHost" : "SeveralHosts";
                         });

// Whichever way it goes, the coordinator queues the rank for a standby at the death's instant
// (a first death: no backoff), counts it, and keeps its evidence for the job's last line. On one
// host nothing crosses the store on the way.
TEST_P(RankReportsTest, ARanksDeathReachesTheCoordinatorsDecisionWithItsCause) {
  Form();
  clock_.Advance(absl::Seconds(5));
  DiesAndIsReported(*workers_[1], "RuntimeError: CUDA error: illegal memory access", 1);

  ASSERT_EQ(coordinator_->replacements().size(), 1u);
  const PendingReplacement& queued = coordinator_->replacements().front();
  EXPECT_EQ(queued.rank, 1);
  EXPECT_EQ(queued.how, "exited with status 1");
  EXPECT_EQ(queued.died, absl::UnixEpoch() + absl::Seconds(5));
  EXPECT_EQ(queued.not_before, absl::UnixEpoch() + absl::Seconds(5));
  EXPECT_EQ(queued.give_up, absl::UnixEpoch() + absl::Seconds(5) + kStandbyWait);
  EXPECT_EQ(policy_->history(1).deaths, 1);
  ASSERT_TRUE(failures_.first().has_value());
  EXPECT_THAT(failures_.first()->who, HasSubstr("rank 1"));
  EXPECT_EQ(failures_.first()->how, "exited with status 1");
  EXPECT_EQ(failures_.first()->cause, "RuntimeError: CUDA error: illegal memory access");
  EXPECT_THAT(failed_, IsEmpty());
  EXPECT_TRUE(workers_[1]->death_reported);
  if (several()) {
    EXPECT_THAT(DeathKeys(), ElementsAre(store_keys::kAgentDeaths.Key(RankMember("h0", 100, 1))));
  } else {
    EXPECT_THAT(DeathKeys(), IsEmpty());
  }
}

// A worker's death is reported once: a second report of the same worker (the launcher sees one
// exit, but a caller may repeat) is not counted again.
TEST_P(RankReportsTest, ADeathIsReportedOnce) {
  Form();
  DiesAndIsReported(*workers_[0], "error: boom", 1);
  agent_->ReportDeath(*workers_[0], "exited with status 1");
  if (several()) coordinator_->ReadDeathReports();

  EXPECT_EQ(policy_->history(0).deaths, 1);
  EXPECT_EQ(failures_.deaths(), 1);
  EXPECT_EQ(coordinator_->replacements().size(), 1u);
}

// A rank that dies before generation 0 formed fails the job (its command cannot start), naming it
// and how it died; nothing is queued for a standby.
TEST_P(RankReportsTest, ADeathBeforeGenerationZeroFormedFailsTheJob) {
  DiesAndIsReported(*workers_[0], "error: cannot import torch", 1);

  ASSERT_EQ(failed_.size(), 1u);
  EXPECT_THAT(failed_[0], HasSubstr("died before generation 0 formed (exited with status 1)"));
  EXPECT_THAT(coordinator_->replacements(), IsEmpty());
  ASSERT_TRUE(failures_.first().has_value());
  EXPECT_EQ(failures_.first()->cause, "error: cannot import torch");
}

// The job ends once every rank of the round finished, and not before: on several hosts the
// coordinator publishes job/done (once) when the agents' reports of every rank are in the store,
// on one host the coordinator in the agent's process says so once. A rank reported twice counts
// once.
TEST_P(RankReportsTest, TheJobIsDoneOnceEveryRankFinishedAndNotBefore) {
  Form();
  const auto done = [&] {
    if (several()) {
      coordinator_->CoordinateHosts();
      return coordinator_->done_published() ? 1 : 0;
    }
    return job_done_;
  };
  agent_->ReportFinished(*workers_[0], /*round=*/0);
  agent_->ReportFinished(*workers_[0], /*round=*/0);  // the same rank again
  EXPECT_EQ(done(), 0);
  if (several()) {
    // h1's agent reports its ranks 2 and 3 the same way, through the store.
    StoreRankReports h1(&store_, kCall);
    ASSERT_TRUE(h1.Finished(0, 2, RankMember("h1", 200, 2)).ok());
    ASSERT_TRUE(h1.Finished(0, 3, RankMember("h1", 200, 3)).ok());
    EXPECT_EQ(done(), 0);
  }
  agent_->ReportFinished(*workers_[1], /*round=*/0);
  EXPECT_EQ(done(), 1);
  if (several()) {
    absl::StatusOr<std::string> job_done = store_.Get(store_keys::kJobDone, kCall);
    EXPECT_TRUE(job_done.ok()) << job_done.status();
  } else {
    EXPECT_EQ(job_done_, 1);
    // A rank finished in an earlier restart round counts for none of the later.
    agent_->ReportFinished(*workers_[1], /*round=*/1);
    EXPECT_EQ(job_done_, 1);
  }
}

}  // namespace
}  // namespace trainguard
