// The coordinator's side of --fail-slow: see fail_slow_coordinator.h.
#include "sdk/coordinator/fail_slow_coordinator.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "sdk/core/agent_keys.h"
#include "sdk/health/fail_slow_metrics.h"
#include "sdk/rendezvous/rendezvous.h"

namespace trainguard {

absl::StatusOr<std::unique_ptr<FailSlowCoordinator>> FailSlowCoordinator::Create(
    Store* store, Clock* clock, Env* env, JobCoordinator* job, FailSlowCoordinatorOptions options,
    Hooks hooks) {
  absl::StatusOr<FailSlowDetector> detector = FailSlowDetector::Create(options.detector);
  if (!detector.ok()) return detector.status();
  return std::unique_ptr<FailSlowCoordinator>(new FailSlowCoordinator(
      store, clock, env, job, std::move(options), std::move(hooks), *std::move(detector)));
}

FailSlowCoordinator::FailSlowCoordinator(Store* store, Clock* clock, Env* env, JobCoordinator* job,
                                         FailSlowCoordinatorOptions options, Hooks hooks,
                                         FailSlowDetector detector)
    : store_(store),
      clock_(clock),
      env_(env),
      job_(job),
      options_(std::move(options)),
      hooks_(std::move(hooks)),
      monitor_(std::move(detector)),
      history_(std::max(1, options_.history_seconds)) {}

void FailSlowCoordinator::Poll(int world_size) {
  const absl::Time now = clock_->Now();
  if (now < next_check_ || world_size == 0) return;
  next_check_ = now + absl::Seconds(1);
  // The hosts that hold ranks now, and are not dead: a standby host is compared once it trains.
  const Membership current = job_->rendezvous()->current();
  std::set<std::string> training;
  for (const std::string& member : current.members) {
    std::string host = store_keys::MemberHost(member);
    if (job_->dead_hosts().count(host) == 0) training.insert(std::move(host));
  }
  std::vector<std::string> keys;
  for (const std::string& host : training) keys.push_back(HostMetricsKey(host));
  absl::StatusOr<std::vector<std::optional<std::string>>> values =
      store_->MultiGet(keys, options_.call_timeout);
  if (!values.ok()) return;
  std::map<std::string, std::string> records;
  size_t i = 0;
  for (const std::string& host : training) {
    if ((*values)[i].has_value()) records[host] = *(*values)[i];
    ++i;
  }
  ++second_;
  history_.Record(second_, records);
  if (!options_.trace_path.empty()) AppendTrace(records);
  for (const SuspectVerdict& verdict : monitor_.Observe(second_, records)) {
    Act(verdict, world_size);
  }
}

void FailSlowCoordinator::Act(const SuspectVerdict& v, int world_size) {
  // Parked standbys on other hosts: evicting into nothing would fail a job that was only slow.
  int spare = 0;
  if (MayEvict(options_.policy)) {
    if (absl::StatusOr<std::vector<std::string>> parked =
            job_->rendezvous()->ParkedStandbys(options_.call_timeout);
        parked.ok()) {
      for (const std::string& member : *parked) {
        if (store_keys::MemberHost(member) != v.host) ++spare;
      }
    }
  }
  const int ranks_per_host = std::max(1, options_.ranks_per_host);
  const FailSlowDecision decision = DecideFailSlowAction(
      options_.policy, v.windows, evictions_, std::max(1, world_size / ranks_per_host),
      options_.max_evict_share, spare, ranks_per_host);
  const int continuity = options_.detector.continuity;
  const std::string evidence = absl::StrFormat(
      "%s %.3g vs the hosts' median %.3g (%.0f%% off its peers), z %.2f among %d hosts, for %d "
      "continuity window(s) of %d s",
      v.metric, v.value, v.peers_median, 100 * v.deviation, v.z, v.hosts, v.windows, continuity);
  if (!hooks_.coordinating()) return;
  // Before it is said: whoever reads the line or the event finds the dump already there.
  WriteDump(v, decision.action);
  hooks_.say(absl::StrFormat("suspect host %s: %s; action: %s", v.host, evidence, decision.action));
  Event event;
  event.type = EventType::kSuspectHost;
  event.time = clock_->Now();
  event.rank = -1;
  event.generation = job_->rendezvous()->generation();
  event.message = absl::StrFormat("suspect host %s: %s", v.host, evidence);
  event.attributes = {{"host", v.host},
                      {"metric", v.metric},
                      {"z", absl::StrFormat("%.3f", v.z)},
                      {"deviation", absl::StrFormat("%.3f", v.deviation)},
                      {"value", absl::StrFormat("%.6g", v.value)},
                      {"peers_median", absl::StrFormat("%.6g", v.peers_median)},
                      {"windows", absl::StrCat(v.windows)},
                      {"continuity_s", absl::StrCat(continuity)},
                      {"hosts", absl::StrCat(v.hosts)},
                      {"action", decision.action}};
  hooks_.record(std::move(event));
  if (!decision.evict) return;
  ++evictions_;
  monitor_.Forget(v.host);
  job_->DeclareHostDead(v.host, clock_->Now(),
                        absl::StrFormat("fail-slow: %s %.0f%% off its peers for %d s", v.metric,
                                        100 * v.deviation, v.windows * continuity));
}

void FailSlowCoordinator::WriteDump(const SuspectVerdict& v, const std::string& action) {
  FailSlowDumpHeader header;
  header.host = v.host;
  header.metric = v.metric;
  header.z = v.z;
  header.deviation = v.deviation;
  header.windows = v.windows;
  header.second = second_;
  header.unix_second = absl::ToUnixSeconds(clock_->Now());
  header.action = action;
  absl::StatusOr<std::string> path =
      WriteFailSlowDump(env_, options_.dump_dir, header, history_.Lines(), options_.max_dumps);
  if (!path.ok() && !dump_failed_) {
    dump_failed_ = true;
    hooks_.say(absl::StrCat("cannot write the metrics around the suspect (said once): ",
                            path.status().ToString()));
  }
}

void FailSlowCoordinator::AppendTrace(const std::map<std::string, std::string>& records) {
  absl::StatusOr<std::unique_ptr<WritableFile>> trace =
      env_->NewAppendableFile(options_.trace_path);
  if (!trace.ok()) return;
  (void)(*trace)->Append(FailSlowTraceLines(second_, records));
  (void)(*trace)->Close();
}

}  // namespace trainguard
