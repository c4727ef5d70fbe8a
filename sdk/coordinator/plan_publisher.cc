#include "sdk/coordinator/plan_publisher.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace trainguard {

absl::StatusOr<std::vector<store_keys::JoinRecord>> ReadJoinedHosts(Store* store,
                                                                    absl::Duration timeout) {
  absl::StatusOr<std::vector<std::string>> keys =
      store->ListKeys(store_keys::kAgentJoins.prefix(), timeout);
  if (!keys.ok()) return keys.status();
  absl::StatusOr<std::vector<std::optional<std::string>>> values = store->MultiGet(*keys, timeout);
  if (!values.ok()) return values.status();
  std::vector<store_keys::JoinRecord> hosts;
  for (size_t i = 0; i < keys->size(); ++i) {
    absl::StatusOr<store_keys::JoinRecord> j =
        store_keys::DecodeJoinRecord((*keys)[i], (*values)[i].value_or(""));
    if (j.ok()) hosts.push_back(*std::move(j));
  }
  std::sort(hosts.begin(), hosts.end(),
            [](const store_keys::JoinRecord& a, const store_keys::JoinRecord& b) {
              return a.seq < b.seq;
            });
  return hosts;
}

PlanPublisher::PlanPublisher(Store* store, Clock* clock, PlanOptions options, Hooks hooks)
    : store_(store), clock_(clock), options_(std::move(options)), hooks_(std::move(hooks)) {}

std::optional<store_keys::Plan> PlanPublisher::PublishWhenReady() {
  const absl::Duration timeout = options_.call_timeout;
  absl::StatusOr<std::vector<store_keys::JoinRecord>> hosts = ReadJoinedHosts(store_, timeout);
  if (!hosts.ok()) return std::nullopt;
  int workers = 0;
  for (const store_keys::JoinRecord& j : *hosts) workers += j.standby ? 0 : 1;
  if (workers < options_.nnodes_min ||
      hosts->size() < static_cast<size_t>(options_.nnodes_min + options_.standby_nodes)) {
    return std::nullopt;  // not yet
  }
  // Between MIN and MAX, torchrun's "last call": more workers may join for last_call.
  if (workers < options_.nnodes_max) {
    const absl::Time now = clock_->Now();
    if (!min_reached_.has_value()) {
      min_reached_ = now;
      hooks_.say(absl::StrFormat("%d of at most %d hosts joined: forming in %s unless all join",
                                 workers, options_.nnodes_max,
                                 absl::FormatDuration(options_.last_call)));
    }
    if (now - *min_reached_ < options_.last_call) return std::nullopt;
  }
  const int training = std::min(workers, options_.nnodes_max);
  store_keys::Plan plan;
  plan.training_hosts = training;
  plan.ranks_per_host = options_.ranks_per_host;
  int group = 0;
  for (const store_keys::JoinRecord& j : *hosts) {
    const bool trains = !j.standby && group < training;
    if (trains && group == 0) {
      plan.master_addr = j.addr;
      plan.master_port = j.port;
    }
    plan.hosts.push_back({j.host, trains ? group : -1});
    if (trains) ++group;
  }
  if (!hooks_.coordinating()) return std::nullopt;
  absl::StatusOr<CompareAndSetResult> published = store_->CompareAndSet(
      store_keys::kAgentPlan, std::nullopt, store_keys::EncodePlan(plan), timeout);
  if (!published.ok() || !published->swapped) return std::nullopt;
  hooks_.say(absl::StrFormat("%d host(s) train, %d are standby hosts", training,
                             hosts->size() - training));
  absl::StatusOr<std::vector<std::string>> backups = hooks_.backup_lines(training);
  if (!backups.ok()) {
    hooks_.fail(std::string(backups.status().message()));
  } else {
    for (const std::string& line : *backups) hooks_.say(line);
  }
  return plan;
}

}  // namespace trainguard
