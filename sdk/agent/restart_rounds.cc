#include "sdk/agent/restart_rounds.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"

namespace trainguard {
namespace {

// Whether `j` may take the dead host's group rank: not that host, not dead, not left, and not
// silent unless it is the coordinator's own host.
bool MayTake(const RestartRoundRequest& request, const RestartRoundHosts::Joined& j) {
  const RestartRoundHosts& hosts = *request.hosts;
  return j.host != request.dead_host && hosts.dead.count(j.host) == 0 &&
         hosts.left.count(j.host) == 0 &&
         (j.host == request.own_host || hosts.silent.count(j.host) == 0);
}

}  // namespace

RestartRoundDecision::Action DecideRestartRound(const RestartRoundRequest& request) {
  using Decision = RestartRoundDecision;
  if (request.round >= request.limit) {
    return Decision::Fail{
        absl::StrFormat("%s; --restart-all=%d reached", request.why, request.limit)};
  }
  Decision::Start start;
  start.round = request.round + 1;
  if (request.dead_host.empty()) return start;
  if (!request.hosts.has_value()) return Decision::ReadHosts{};
  const RestartRoundHosts& hosts = *request.hosts;

  std::map<std::string, int> group = hosts.groups;
  const auto held = group.find(request.dead_host);
  const int lost = held != group.end() ? held->second : -1;
  group[request.dead_host] = -1;
  if (lost >= 0) {
    const RestartRoundHosts::Joined* taker = nullptr;
    for (const RestartRoundHosts::Joined& j : hosts.joined) {
      const auto g = group.find(j.host);
      if (MayTake(request, j) && (g == group.end() || g->second < 0)) {
        taker = &j;
        break;
      }
    }
    if (taker == nullptr) {
      return Decision::Fail{absl::StrFormat(
          "host %s died (%s) and no standby host is left to take its group rank %d in a restart",
          request.dead_host, request.why, lost)};
    }
    group[taker->host] = lost;
    start.taker = absl::StrFormat("restart round %d: host %s takes host %s's group rank %d",
                                  start.round, taker->host, request.dead_host, lost);
  }
  RestartRoundPlan plan;
  plan.master_addr = request.master_addr;
  plan.master_port = request.master_port;
  for (const RestartRoundHosts::Joined& j : hosts.joined) {
    const auto g_it = group.find(j.host);
    const int g = g_it != group.end() ? g_it->second : -1;
    if (g == 0) {
      plan.master_addr = j.addr;
      plan.master_port = j.port;
    }
    if (g >= 0) ++plan.training_hosts;
    plan.hosts.push_back({j.host, g});
  }
  start.plan = std::move(plan);
  return start;
}

}  // namespace trainguard
