// InProcessRankReports: the reports of a host agent whose coordinator runs in its own process
// (`trainguard run` on one host), handed to the coordinator's decisions at once rather than
// through the store. A death is kept in the job's FailureHistory (the message that fails the job
// names the first fault) and the RecoveryStrategy decides what it leads to (a standby takes the
// rank, every rank restarts, or the job fails), as JobCoordinator::ReadDeathReports does with the
// reports it reads from the store on several hosts; no store call and no wait of its own, so a
// rank's replacement on one host starts in the same turn of the agent's loop that saw its death.
// A rank finished is counted for its restart round, and the job is done once every rank of a
// round finished (Hooks::every_rank_finished, once), as JobCoordinator publishes job/done.
//
// Thread safety: not thread-safe; the agent's loop (or a test) uses an instance.
#ifndef TRAINGUARD_SDK_COORDINATOR_IN_PROCESS_RANK_REPORTS_H_
#define TRAINGUARD_SDK_COORDINATOR_IN_PROCESS_RANK_REPORTS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "sdk/agent/failure_history.h"
#include "sdk/coordinator/recovery_strategy.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/rank_reports.h"
#include "trainguard/clock.h"

namespace trainguard {

class InProcessRankReports final : public RankReports {
 public:
  struct Hooks {
    // Whether the current round's generation 0 formed when a death is delivered (the launcher's
    // generation 0 forms on a thread of its own, and it may give that thread a moment to say so).
    std::function<bool()> formed;
    // Every rank of a round finished with status 0: the job is done.
    std::function<void()> every_rank_finished;
  };

  // REQUIRES: `failures`, `strategy` and `clock` outlive this; every hook is set. `world_size`:
  // the ranks of a round (--nproc).
  InProcessRankReports(FailureHistory* failures, RecoveryStrategy* strategy, Clock* clock,
                       int world_size, Hooks hooks)
      : failures_(failures),
        strategy_(strategy),
        clock_(clock),
        world_size_(world_size),
        hooks_(std::move(hooks)) {}
  InProcessRankReports(const InProcessRankReports&) = delete;
  InProcessRankReports& operator=(const InProcessRankReports&) = delete;

  // Records the death ("rank R", its how and cause) and hands it to the strategy at the clock's
  // instant of delivery. Never fails: nothing crosses a process.
  absl::Status Death(const store_keys::DeathReport& report) override;
  // Counts `rank` finished in `round` (a rank counted once however often it is reported); the
  // round's last calls Hooks::every_rank_finished. Never fails.
  absl::Status Finished(int64_t round, int rank, const std::string& member) override;

 private:
  FailureHistory* const failures_;
  RecoveryStrategy* const strategy_;
  Clock* const clock_;
  const int world_size_;
  const Hooks hooks_;
  std::map<int64_t, std::set<int>> finished_;  // by round
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_COORDINATOR_IN_PROCESS_RANK_REPORTS_H_
