#include "sdk/host_agent/host_membership.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/store_keys.h"

namespace trainguard {

std::vector<std::string> AgentTurnKeys(const std::string& host, bool following,
                                       bool ranks_on_agents_store, bool restart_all) {
  std::vector<std::string> keys = {store_keys::kAgentsDead.Key(host), store_keys::kJobFailed,
                                   store_keys::kJobDone, store_keys::AgentKillCount(host),
                                   store_keys::kCoordLease};
  if (!following) keys.push_back(store_keys::kAgentPlan);
  if (following && ranks_on_agents_store) {
    keys.push_back(store_keys::kRdzvCurrent);
    keys.push_back(store_keys::kJobStop);
  }
  if (restart_all) keys.push_back(store_keys::kAgentRestart);
  return keys;
}

StoreHostMembership::StoreHostMembership(Store* store, Clock* clock, HostAgent* agent,
                                         TurnReadStore* turn_reads,
                                         StoreHostMembershipOptions options, Hooks hooks)
    : store_(store),
      clock_(clock),
      agent_(agent),
      turn_reads_(turn_reads),
      options_(std::move(options)),
      hooks_(std::move(hooks)) {}

absl::Status StoreHostMembership::Join() {
  const absl::Duration timeout = options_.join_timeout;
  absl::StatusOr<int64_t> seq = store_->Add(store_keys::kAgentSeq, 1, timeout);
  if (!seq.ok()) return seq.status();
  const std::string value = store_keys::EncodeJoinRecord(
      {options_.host_id, *seq, options_.standby_host, options_.local_addr, options_.master_port});
  // The record, then its count (together on a store that can): the coordinator lists the joins
  // again only when the count changed, and finds every record counted.
  const std::string key = store_keys::kAgentJoins.Key(options_.host_id);
  absl::StatusOr<bool> joined =
      store_->CreateAndAdd(key, value, store_keys::kAgentJoinCount, 1, timeout);
  if (!joined.ok()) return joined.status();
  if (!*joined) {
    absl::StatusOr<std::string> current = store_->Get(key, timeout);
    return absl::AlreadyExistsError(
        absl::StrFormat("host id %s already joined job %s (%s): give every host its own --host-id",
                        options_.host_id, options_.job_id, current.value_or("")));
  }
  return absl::OkStatus();
}

std::optional<AgentExit> StoreHostMembership::Tick() {
  const absl::Time now = clock_->Now();
  if (now < next_tick_) return std::nullopt;
  next_tick_ = now + options_.tick_interval;
  // What the turn reads, in one request; answered from it until the turn ends (a failed read:
  // every Get goes to the store, as before).
  (void)turn_reads_->BeginTurn(hooks_.turn_keys(), options_.call_timeout);
  absl::Cleanup end_turn = [this] { turn_reads_->EndTurn(); };
  if (std::optional<std::string> lost = agent_->Heartbeat(); lost.has_value()) {
    hooks_.fail(*lost);
    return std::nullopt;
  }
  // A fenced host first: its ranks were given to others, so a job that ended meanwhile ended
  // without it, and it leaves saying it was fenced out, not that the job succeeded. Only this host
  // ends: the job goes on without it, so nothing is published for the others.
  if (std::optional<AgentExit> fenced = agent_->CheckFenced(); fenced.has_value()) return fenced;
  // Then the job's end: an agent that would leave this turn must not take over the lease the
  // leaving coordinator released, and announce itself and the job's protection once more.
  if (std::optional<AgentExit> end = agent_->WatchJobEnd(); end.has_value()) return end;
  hooks_.update_lease();
  hooks_.follow();
  if (!hooks_.ended()) agent_->ExecuteKillRequests();
  if (!hooks_.ended()) agent_->ReportStoppedWorkers();
  if (!hooks_.ended()) hooks_.coordinate();
  return std::nullopt;
}

absl::Status StoreHostMembership::StartRound(int64_t /*round*/) { return hooks_.start_planned(); }

void StoreHostMembership::AnnounceFailure(const std::string& message) {
  // Every other host's agent stops its processes too, and says why (HostAgent::WatchJobEnd).
  (void)store_->Set(store_keys::kJobFailed, message, absl::Seconds(2));
}

void StoreHostMembership::Leave(int exit_code) {
  hooks_.release_lease();
  agent_->Leave(exit_code);
  // The agent that serves the store stays until the others left (bounded), so they see the end.
  if (options_.serves_store) (void)agent_->WaitForOthersToLeave(options_.leave_wait);
}

std::string StoreHostMembership::DescribeSuccess(int ranks_finished_here) const {
  return absl::StrFormat("every rank finished; host %s: %d rank(s) finished here", options_.host_id,
                         ranks_finished_here);
}

std::optional<AgentExit> OneHostMembership::Tick() {
  if (hooks_.formed()) agent_->ReportStoppedWorkers();
  return std::nullopt;
}

std::string OneHostMembership::DescribeSuccess(int /*ranks_finished_here*/) const {
  // Success means every rank of the job finished (InProcessRankReports), all of them here.
  return absl::StrFormat("%d ranks finished", ranks_);
}

}  // namespace trainguard
