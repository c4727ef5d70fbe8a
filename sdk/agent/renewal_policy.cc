#include "sdk/agent/renewal_policy.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"

namespace trainguard {
namespace {

// "rank 1 asks for a new generation: <why>", of the lowest rank that asked.
std::string AskedLine(const std::map<int, std::string>& asked) {
  return absl::StrFormat("rank %d asks for a new generation: %s", asked.begin()->first,
                         asked.begin()->second);
}

// A wait that only a change in what the launcher observes ends.
RenewalPolicy::Wait Unbounded(RenewalPolicy::Wait::For what) {
  RenewalPolicy::Wait wait;
  wait.what = what;
  return wait;
}

}  // namespace

RenewalPolicy::Action RenewalPolicy::Decide(const RenewalObservations& observed, absl::Time now) {
  if (observed.death_pending || observed.hang_pending || observed.killed_rank_unreaped) {
    return Unbounded(Wait::For::kBlocked);
  }
  if (!observed.requests.has_value()) return ReadRequests{};
  const std::map<int, std::string>& asked = *observed.requests;
  if (asked.empty()) return Unbounded(Wait::For::kRequests);

  std::string first_ask;
  if (!first_asked_.has_value() || first_asked_->generation != observed.generation) {
    first_asked_ = FirstAsked{observed.generation, now};
    // Under --restart-all the restart says it instead.
    if (!options_.restart_all) first_ask = AskedLine(asked);
  }
  const absl::Time until = first_asked_->since + grace();
  const bool everyone = asked.size() >= static_cast<size_t>(observed.world_size);
  if (options_.restart_all) {
    if (options_.multi_host && !everyone && now < until) {
      return Wait{Wait::For::kGrace, until, std::move(first_ask)};
    }
    return RestartAll{AskedLine(asked), first_asked_->since};
  }
  if (!everyone && now < until) return Wait{Wait::For::kGrace, until, std::move(first_ask)};
  Renew renew{{}, first_asked_->since, std::move(first_ask)};
  for (const auto& [rank, why] : asked) renew.asked_by.push_back(rank);
  return renew;
}

}  // namespace trainguard
