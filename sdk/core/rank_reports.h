// RankReports: where a host's agent reports what became of its ranks' processes for the job's
// coordinator to decide on: a death (HostAgent::ReportDeath; the coordinator decides what it leads
// to) and a rank finished with status 0 (HostAgent::ReportFinished; the coordinator decides when
// the job is done). On several hosts the coordinator may be another host's agent and reads them
// from the store (StoreRankReports: agents/deaths/<member>, read by JobCoordinator::
// ReadDeathReports; agents/[round<K>/]finished/<rank>, counted by JobCoordinator::CoordinateHosts);
// on one host it runs in the agent's own process and takes them at once
// (sdk/coordinator/in_process_rank_reports.h), so that no store round trip lies on the way to a
// rank's replacement. The agent's code is the same for both.
//
// Thread safety: an implementation says; the agent's loop calls one from one thread.
#ifndef TRAINGUARD_SDK_CORE_RANK_REPORTS_H_
#define TRAINGUARD_SDK_CORE_RANK_REPORTS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "sdk/core/agent_keys.h"
#include "trainguard/store.h"

namespace trainguard {

class RankReports {
 public:
  virtual ~RankReports() = default;
  // Hands the death `report` to the coordinator. An error when it was not delivered: the agent
  // says so, and does not count the death as reported.
  virtual absl::Status Death(const store_keys::DeathReport& report) = 0;
  // Tells the coordinator that `member` finished `rank` of restart round `round` (0: the job's
  // first start) with status 0. An error when it was not delivered.
  virtual absl::Status Finished(int64_t round, int rank, const std::string& member) = 0;
};

// Through the store, each write bounded by `timeout`. A death report names the member, so a death
// reported twice, or after the rank was given to someone else, is handled once by the coordinator
// that reads it; a finished rank is keyed by its rank, its value the member.
class StoreRankReports final : public RankReports {
 public:
  // REQUIRES: `store` outlives this.
  StoreRankReports(Store* store, absl::Duration timeout) : store_(store), timeout_(timeout) {}

  absl::Status Death(const store_keys::DeathReport& report) override {
    return store_->Set(store_keys::kAgentDeaths.Key(report.member),
                       store_keys::EncodeDeathReport(report), timeout_);
  }
  absl::Status Finished(int64_t round, int rank, const std::string& member) override {
    return store_->Set(store_keys::AgentFinished(round, rank), member, timeout_);
  }

 private:
  Store* const store_;
  const absl::Duration timeout_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CORE_RANK_REPORTS_H_
