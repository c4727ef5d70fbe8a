// DeathReports: where a host's agent sends the deaths of its ranks' processes (HostAgent::
// ReportDeath) for the job's coordinator to decide what each leads to. On several hosts the
// coordinator may be another host's agent and reads them from the store (StoreDeathReports,
// agents/deaths/<member>, read by JobCoordinator::ReadDeathReports); on one host it runs in the
// agent's own process and takes them at once (sdk/coordinator/in_process_death_reports.h), so that
// no store round trip lies on the way to a rank's replacement. The agent's code is the same for
// both.
//
// Thread safety: an implementation says; the agent's loop calls one from one thread.
#ifndef TRAINGUARD_SDK_CORE_DEATH_REPORTS_H_
#define TRAINGUARD_SDK_CORE_DEATH_REPORTS_H_

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "sdk/core/agent_keys.h"
#include "trainguard/store.h"

namespace trainguard {

class DeathReports {
 public:
  virtual ~DeathReports() = default;
  // Hands `report` to the coordinator. An error when it was not delivered: the agent says so, and
  // does not count the death as reported.
  virtual absl::Status Deliver(const store_keys::DeathReport& report) = 0;
};

// Through the store: agents/deaths/<member> = the encoded report, each write bounded by `timeout`.
// The report names the member, so a death reported twice, or after the rank was given to someone
// else, is handled once by the coordinator that reads it.
class StoreDeathReports final : public DeathReports {
 public:
  // REQUIRES: `store` outlives this.
  StoreDeathReports(Store* store, absl::Duration timeout) : store_(store), timeout_(timeout) {}

  absl::Status Deliver(const store_keys::DeathReport& report) override {
    return store_->Set(store_keys::kAgentDeaths.Key(report.member),
                       store_keys::EncodeDeathReport(report), timeout_);
  }

 private:
  Store* const store_;
  const absl::Duration timeout_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CORE_DEATH_REPORTS_H_
