// InProcessDeathReports: the death reports of a host agent whose coordinator runs in its own
// process (`trainguard run` on one host), handed to the coordinator's decision at once rather than
// through the store: the death is kept in the job's FailureHistory (the message that fails the job
// names the first fault) and the RecoveryStrategy decides what it leads to (a standby takes the
// rank, every rank restarts, or the job fails), as JobCoordinator::ReadDeathReports does with the
// reports it reads from the store on several hosts. No store call and no wait of its own: a rank's
// replacement on one host starts in the same turn of the agent's loop that saw its death.
//
// Thread safety: not thread-safe; the agent's loop (or a test) uses an instance.
#ifndef TRAINGUARD_SDK_COORDINATOR_IN_PROCESS_DEATH_REPORTS_H_
#define TRAINGUARD_SDK_COORDINATOR_IN_PROCESS_DEATH_REPORTS_H_

#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "sdk/agent/failure_history.h"
#include "sdk/coordinator/recovery_strategy.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/death_reports.h"
#include "trainguard/clock.h"

namespace trainguard {

class InProcessDeathReports final : public DeathReports {
 public:
  // REQUIRES: `failures`, `strategy` and `clock` outlive this. `formed` says whether the current
  // round's generation 0 formed when a death is delivered (the launcher's generation 0 forms on a
  // thread of its own, and it may give that thread a moment to say so).
  InProcessDeathReports(FailureHistory* failures, RecoveryStrategy* strategy, Clock* clock,
                        std::function<bool()> formed)
      : failures_(failures), strategy_(strategy), clock_(clock), formed_(std::move(formed)) {}
  InProcessDeathReports(const InProcessDeathReports&) = delete;
  InProcessDeathReports& operator=(const InProcessDeathReports&) = delete;

  // Records the death ("rank R", its how and cause) and hands it to the strategy at the clock's
  // instant of delivery. Never fails: nothing crosses a process.
  absl::Status Deliver(const store_keys::DeathReport& report) override;

 private:
  FailureHistory* const failures_;
  RecoveryStrategy* const strategy_;
  Clock* const clock_;
  const std::function<bool()> formed_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_COORDINATOR_IN_PROCESS_DEATH_REPORTS_H_
