// What the decision-level tests of the coordinator share: member ids built the way the rendezvous
// encodes them, and a JobCoordinator's hooks that take part in nothing but the lines it says and
// the job's failure (every other hook inert). A test overrides the hooks its decision reaches
// (the gate, the restart-all strategy, the standby choice, ...) after taking these.
//
// Header-only; the hooks hold the vectors they write by pointer: REQUIRES they outlive the
// coordinator. Not thread-safe (the tests call the coordinator from one thread).
#ifndef TRAINGUARD_TESTS_SUPPORT_JOB_COORDINATOR_HOOKS_H_
#define TRAINGUARD_TESTS_SUPPORT_JOB_COORDINATOR_HOOKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "sdk/coordinator/job_coordinator.h"
#include "sdk/core/store_keys.h"
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

// Hooks of a coordinator that always coordinates, appends each line it says to `said` and each
// failure of the job to `failed`, records no event, prefers no standby, sees none starting, and
// ignores a taken rank and every restart-all hook.
inline JobCoordinator::Hooks QuietJobCoordinatorHooks(std::vector<std::string>* said,
                                                      std::vector<std::string>* failed) {
  JobCoordinator::Hooks hooks;
  hooks.coordinating = [] { return true; };
  hooks.say = [said](const std::string& line) { said->push_back(line); };
  hooks.record = [](int, EventKind, const std::string&, JobCoordinator::Attributes) {};
  hooks.fail = [failed](const std::string& why) { failed->push_back(why); };
  hooks.restart_host_death = [](const std::string&, bool, bool, const std::string&, absl::Time) {};
  hooks.restart_rank_death = [](const RankDeath&, bool) {};
  hooks.preferred_standbys = [](const std::string&, const std::vector<int>&) {
    return std::vector<std::string>{};
  };
  hooks.standby_starting = [] { return false; };
  hooks.rank_taken = [](int, const std::string&, int64_t) {};
  hooks.request_restart = [](const std::string&) {};
  return hooks;
}

}  // namespace testing
}  // namespace trainguard

#endif  // TRAINGUARD_TESTS_SUPPORT_JOB_COORDINATOR_HOOKS_H_
