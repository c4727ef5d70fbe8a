#include "sdk/coordinator/restart_all.h"

#include <algorithm>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "sdk/coordinator/plan_publisher.h"

namespace trainguard {

void RestartAll::OnRankDeath(const RankDeath& death, bool formed, absl::Time) {
  if (!formed && round_ == 0) {
    // The command never formed a job: restarting it would only meet the same fault.
    return hooks_.fail(
        absl::StrCat(death.label, " died before generation 0 formed (", death.how, ")"));
  }
  // The job formed before this restart, so the command works: a rank lost while the restarted
  // ranks start (a slow interpreter start is a long window) is a fault like any other.
  RequestRestart(absl::StrCat(death.label, " ", death.how,
                              formed ? "" : " before the restarted job formed"));
}

void RestartAll::OnNotFormed(const absl::Status& why) {
  if (round_ == 0) {
    return hooks_.fail(absl::StrCat("generation 0 did not form: ", why.ToString()));
  }
  // A restarted job that did not form (a rank stopped while it started): restart again.
  RequestRestart(absl::StrCat("restart round ", round_, " did not form: ", why.ToString()));
}

bool RestartAll::OnDeathReported(const ReportedDeath& death, const Membership& current) {
  // A process of an earlier round died of the restart itself (or its peers' deaths). An id that is
  // none of ours names no process of any round.
  const absl::StatusOr<store_keys::MemberId> id = store_keys::DecodeMemberId(death.member);
  if (!id.ok()) {
    hooks_.say(absl::StrCat("ignoring a death report: ", id.status().message()));
    return true;
  }
  if (id->round != round_) return true;
  const std::string rank = death.rank >= 0 ? absl::StrCat("rank ", death.rank) : "a rank";
  OnRankDeath({death.rank, absl::StrFormat("%s (%s)", rank, death.member), death.how},
              current.generation >= 0, clock_->Now());
  return false;
}

void RestartAll::OnHostDeclaredDead(const DeadHost& dead, const Membership& current) {
  // The plan says whether it trains: in a round still forming, the membership names nobody.
  int group = -1;
  if (absl::StatusOr<std::string> value =
          store_->Get(store_keys::kAgentPlan, options_.call_timeout);
      value.ok()) {
    if (absl::StatusOr<store_keys::Plan> plan = store_keys::DecodePlan(*value); plan.ok()) {
      group = plan->GroupOf(dead.host);
    }
  }
  if (group < 0) return;  // a standby host holds no process under --restart-all
  if (current.generation < 0 && round_ == 0) {
    return hooks_.fail(absl::StrFormat("host %s died before generation 0 formed", dead.host));
  }
  RequestRestart(absl::StrFormat("host %s is dead (%s)", dead.host, dead.why), dead.host,
                 dead.last_beat);
}

void RestartAll::RequestRestart(const std::string& why, const std::string& dead_host,
                                absl::Time since) {
  // A rank's fault while another waits is the same fault's: its peers fail in their collectives
  // with it, and one round restarts them all. A host's death is kept: its group rank must move.
  if (dead_host.empty() && !pending_.empty()) return;
  for (const Fault& f : pending_) {
    if (!dead_host.empty() && f.dead_host == dead_host) return;
  }
  pending_.push_back({why, dead_host, since});
}

void RestartAll::Coordinate(absl::Time) {
  std::vector<Fault> faults = std::move(pending_);
  pending_.clear();
  for (const Fault& fault : faults) {
    if (!StartNextRound(fault)) return;
  }
}

bool RestartAll::StartNextRound(const Fault& fault) {
  // A deposed coordinator acts on nothing: the faults are in the store (the death reports, the
  // silent hosts) for the next holder to find.
  if (!hooks_.coordinating()) return false;
  RestartRoundRequest request;
  request.round = round_;
  request.limit = options_.limit;
  request.why = fault.why;
  request.dead_host = fault.dead_host;
  request.own_host = options_.host_id;
  RestartRoundDecision::Action action = DecideRestartRound(request);
  if (std::holds_alternative<RestartRoundDecision::ReadHosts>(action)) {
    absl::StatusOr<RestartRoundHosts> hosts = ReadHosts(&request.master_addr, &request.master_port);
    if (!hosts.ok()) {
      hooks_.fail(absl::StrFormat("restart round %d (%s): cannot read the plan and the hosts: %s",
                                  round_ + 1, fault.why, hosts.status().ToString()));
      return false;
    }
    request.hosts = *std::move(hosts);
    action = DecideRestartRound(request);
  }
  if (const auto* fail = std::get_if<RestartRoundDecision::Fail>(&action)) {
    hooks_.fail(fail->why);
    return false;
  }
  const auto* start = std::get_if<RestartRoundDecision::Start>(&action);
  if (start == nullptr) return false;  // not reached: with the hosts read, it is Fail or Start
  const int64_t next = start->round;
  const absl::Duration timeout = options_.call_timeout;
  if (!start->taker.empty()) hooks_.say(start->taker);
  if (start->plan.has_value()) {
    store_keys::Plan plan;
    plan.training_hosts = start->plan->training_hosts;
    plan.ranks_per_host = options_.ranks_per_host;
    plan.master_addr = start->plan->master_addr;
    plan.master_port = start->plan->master_port;
    for (const RestartRoundPlan::Host& h : start->plan->hosts) plan.hosts.push_back({h.host, h.group});
    if (!hooks_.coordinating()) return false;
    if (absl::Status s = store_->Set(store_keys::kAgentPlan, store_keys::EncodePlan(plan), timeout);
        !s.ok()) {
      hooks_.fail(absl::StrFormat("restart round %d (%s): publishing its plan: %s", next,
                                  fault.why, s.ToString()));
      return false;
    }
  }
  if (!hooks_.coordinating()) return false;
  if (absl::Status s = store_->Set(store_keys::kAgentRestart,
                                   store_keys::EncodeRestartRound({next, fault.why}), timeout);
      !s.ok()) {
    hooks_.fail(absl::StrFormat("restart round %d (%s): publishing it: %s", next, fault.why,
                                s.ToString()));
    return false;
  }
  hooks_.say(absl::StrFormat("restarting %s (restart %d of at most %d): %s", options_.scope, next,
                             options_.limit, fault.why));
  Attributes attributes = {{"restart", absl::StrCat(next)}};
  if (!fault.dead_host.empty()) attributes.emplace_back("host", fault.dead_host);
  hooks_.record(-1, EventKind::kRestartAll, fault.why, std::move(attributes));
  const absl::Time began = fault.since == absl::InfinitePast() ? clock_->Now() : fault.since;
  const int64_t from = round_;
  round_ = next;
  hooks_.start_round(from, next);
  coordinator_->recoveries().push_back({-1, 0, began, fault.dead_host});
  return true;
}

absl::StatusOr<RestartRoundHosts> RestartAll::ReadHosts(std::string* master_addr,
                                                        int* master_port) {
  const absl::Duration timeout = options_.call_timeout;
  absl::StatusOr<std::string> value = store_->Get(store_keys::kAgentPlan, timeout);
  absl::StatusOr<store_keys::Plan> plan =
      value.ok() ? store_keys::DecodePlan(*value) : value.status();
  absl::StatusOr<std::vector<store_keys::JoinRecord>> joined = ReadJoinedHosts(store_, timeout);
  absl::StatusOr<std::vector<std::string>> left =
      store_->ListKeys(store_keys::kAgentsLeft.prefix(), timeout);
  if (!plan.ok()) return plan.status();
  if (!joined.ok()) return joined.status();
  if (!left.ok()) return left.status();
  *master_addr = plan->master_addr;
  *master_port = plan->master_port;
  RestartRoundHosts hosts;
  hosts.groups = plan->Groups();
  const absl::Time now = clock_->Now();
  for (const store_keys::JoinRecord& j : *joined) {
    hosts.joined.push_back({j.host, j.addr, j.port});
    if (coordinator_->IsSilent(j.host, now)) hosts.silent.insert(j.host);
  }
  for (std::string& host : store_keys::kAgentsLeft.Names(*left)) hosts.left.insert(std::move(host));
  hosts.dead = coordinator_->dead_hosts();
  return hosts;
}

void RestartAll::FollowRound() {
  absl::StatusOr<std::string> value = store_->Get(store_keys::kAgentRestart, options_.call_timeout);
  if (!value.ok()) return;
  absl::StatusOr<store_keys::RestartRound> restart = store_keys::DecodeRestartRound(*value);
  if (!restart.ok() || restart->round <= round_) return;
  hooks_.say(absl::StrFormat("restart round %d: %s", restart->round, restart->why));
  // A fault this agent had pending belongs to the round it leaves.
  pending_.clear();
  const int64_t from = round_;
  round_ = restart->round;
  hooks_.start_round(from, round_);
}

void RestartAll::KillStoppedBeforeFormation(bool formed) {
  if (formed || round_ == 0) return;
  hooks_.kill_stopped(options_.heartbeat_timeout,
                      absl::StrFormat("before restart round %d formed", round_));
}

}  // namespace trainguard
