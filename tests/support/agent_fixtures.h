// What the decision-level tests of the agent and the coordinator share: member ids built the way
// the rendezvous encodes them, a host's process started on the fake supervisor as the launcher
// starts it, a JobCoordinator's hooks that take part in nothing but the lines it says and the
// job's failure (every other hook inert), and the default recovery strategy (StandbyReplacement)
// set on a coordinator. A test overrides the hooks its decision reaches (the gate, the standby
// choice, ...) after taking these.
//
// Header-only; the hooks hold the vectors they write by pointer: REQUIRES they outlive the
// coordinator. Not thread-safe (the tests call the agent and the coordinator from one thread).
#ifndef TRAINGUARD_TESTS_SUPPORT_AGENT_FIXTURES_H_
#define TRAINGUARD_TESTS_SUPPORT_AGENT_FIXTURES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "sdk/agent/process_supervisor.h"
#include "sdk/agent/replacement_policy.h"
#include "sdk/coordinator/job_coordinator.h"
#include "sdk/coordinator/standby_replacement.h"
#include "sdk/core/store_keys.h"
#include "sdk/host_agent/host_agent.h"
#include "tests/support/fake_process_supervisor.h"
#include "trainguard/events.h"

namespace trainguard {
namespace testing {

// Rank `rank`'s member id: its process `pid` on `host`, in restart round `round`.
inline std::string RankMember(const std::string& host, int64_t pid, int rank, int64_t round = 0) {
  return store_keys::EncodeMemberId({host, pid, round, store_keys::MemberId::Role::kRank, rank});
}

// Standby `index`'s member id: its process `pid` on `host`.
inline std::string StandbyMember(const std::string& host, int64_t pid, int index) {
  return store_keys::EncodeMemberId({host, pid, 0, store_keys::MemberId::Role::kStandby, index});
}

// Starts the process of `rank` (or of standby `standby_index`, rank -1) known as `member_id` on
// `supervisor`, as the launcher starts a host's processes, and keeps it in `workers`; the kept one.
inline HostWorker& StartHostWorker(FakeProcessSupervisor& supervisor,
                                   std::vector<std::unique_ptr<HostWorker>>& workers, int rank,
                                   std::string member_id, int standby_index = -1) {
  auto w = std::make_unique<HostWorker>();
  w->rank = rank;
  w->standby_index = standby_index;
  w->member_id = std::move(member_id);
  WorkerSpec spec;
  spec.label = w->Label();
  spec.argv = {"python3", "train.py"};
  absl::StatusOr<WorkerId> worker = supervisor.Spawn(spec);
  EXPECT_TRUE(worker.ok()) << worker.status();
  if (worker.ok()) {
    w->worker = *worker;
    w->pid = supervisor.pid(*worker);
  }
  workers.push_back(std::move(w));
  return *workers.back();
}

// The options of test host `id`'s agent: every store call bounded by `call`, a failed job's exit
// status `failed_exit_code`, the job's store at tcp://10.0.0.1:29400, lost past `store_loss_bound`.
inline HostAgentOptions TestHostAgentOptions(const std::string& id, absl::Duration call,
                                             int failed_exit_code,
                                             absl::Duration store_loss_bound) {
  HostAgentOptions options;
  options.host_id = id;
  options.call_timeout = call;
  options.report_timeout = call;
  options.failed_exit_code = failed_exit_code;
  options.store_url = "tcp://10.0.0.1:29400";
  options.store_loss_bound = store_loss_bound;
  return options;
}

// HostAgent::Hooks::workers: the processes kept in `workers` (StartHostWorker), as the launcher
// hands its children to its agent.
inline std::function<std::vector<HostWorker*>()> WorkersIn(
    const std::vector<std::unique_ptr<HostWorker>>* workers) {
  return [workers] {
    std::vector<HostWorker*> all;
    for (const auto& w : *workers) all.push_back(w.get());
    return all;
  };
}

// Hooks of a coordinator that always coordinates, appends each line it says to `said` and each
// failure of the job to `failed`, records no event, prefers no standby, sees none starting, and
// ignores a taken rank.
inline JobCoordinator::Hooks QuietJobCoordinatorHooks(std::vector<std::string>* said,
                                                      std::vector<std::string>* failed) {
  JobCoordinator::Hooks hooks;
  hooks.coordinating = [] { return true; };
  hooks.say = [said](const std::string& line) { said->push_back(line); };
  hooks.record = [](int, EventKind, const std::string&, JobCoordinator::Attributes) {};
  hooks.fail = [failed](const std::string& why) { failed->push_back(why); };
  hooks.preferred_standbys = [](const std::string&, const std::vector<int>&) {
    return std::vector<std::string>{};
  };
  hooks.standby_starting = [] { return false; };
  hooks.rank_taken = [](int, const std::string&, int64_t) {};
  return hooks;
}

// The default recovery strategy, StandbyReplacement, counting deaths with `policy` (the one
// `coordinator` was made with), saying to `said` and failing the job to `failed`, set as
// `coordinator`'s strategy: the faults it finds are queued for replacement as the launcher's are.
// REQUIRES: the returned strategy outlives the coordinator's use of it.
inline std::unique_ptr<StandbyReplacement> UseStandbyReplacement(JobCoordinator* coordinator,
                                                                 ReplacementPolicy* policy,
                                                                 std::vector<std::string>* said,
                                                                 std::vector<std::string>* failed) {
  StandbyReplacement::Hooks hooks;
  hooks.say = [said](const std::string& line) { said->push_back(line); };
  hooks.fail = [failed](const std::string& why) { failed->push_back(why); };
  auto strategy = std::make_unique<StandbyReplacement>(policy, coordinator, std::move(hooks));
  coordinator->set_recovery_strategy(strategy.get());
  return strategy;
}

}  // namespace testing
}  // namespace trainguard

#endif  // TRAINGUARD_TESTS_SUPPORT_AGENT_FIXTURES_H_
