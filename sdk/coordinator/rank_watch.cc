#include "sdk/coordinator/rank_watch.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/store_keys.h"
#include "trainguard/membership.h"

namespace trainguard {

RankWatch::RankWatch(Store* agents_store, Store* ranks_store, Clock* clock,
                     RendezvousCoordinator* rendezvous, RankWatchOptions options, Hooks hooks)
    : agents_store_(agents_store),
      ranks_store_(ranks_store),
      clock_(clock),
      rendezvous_(rendezvous),
      options_(std::move(options)),
      hooks_(std::move(hooks)) {}

void RankWatch::KillRanksWithStaleHeartbeats() {
  const absl::Time now = clock_->Now();
  if (now < next_heartbeat_check_) return;
  next_heartbeat_check_ = now + options_.heartbeat_check_period;
  absl::StatusOr<std::vector<int>> stale =
      rendezvous_->RanksWithStaleHeartbeats(options_.heartbeat_timeout, options_.store_timeout);
  if (!stale.ok()) return;  // the store is briefly unreachable: look again next time
  if (!coordinating()) return;
  if (stale->empty()) return;
  const Membership current = rendezvous_->current();
  const std::vector<int> to_kill = StaleRanksToKill(*stale, current, hooks_.quiet_hosts());
  if (to_kill.empty()) return;
  hooks_.report_laggards();
  for (int rank : to_kill) {
    hooks_.kill_member(current.members[rank], EventKind::kRankUnresponsive,
                       absl::StrFormat("rank %d has not sent a heartbeat for %s", rank,
                                       absl::FormatDuration(options_.heartbeat_timeout)));
  }
}

std::vector<int> StaleRanksToKill(const std::vector<int>& stale, const Membership& current,
                                  const std::set<std::string>& quiet_hosts) {
  std::vector<int> kill;
  for (int rank : stale) {
    if (rank < 0 || rank >= static_cast<int>(current.members.size())) continue;
    if (quiet_hosts.count(store_keys::MemberHost(current.members[rank])) != 0) continue;
    kill.push_back(rank);
  }
  return kill;
}

namespace {

// The members whose agents say their process is stopped (agents/stopped/<member>), any
// generation's; nullopt when the store does not answer.
std::optional<std::vector<std::string>> ReportedStopped(Store* agents_store,
                                                        absl::Duration timeout) {
  absl::StatusOr<std::vector<std::string>> keys =
      agents_store->ListKeys(store_keys::kAgentStopped.prefix(), timeout);
  if (!keys.ok()) return std::nullopt;
  return store_keys::kAgentStopped.Names(*keys);
}

// Those of `reported` that hold a rank of `current`, by rank.
std::map<int, std::string> HoldingRanks(const std::vector<std::string>& reported,
                                        const Membership& current) {
  std::map<int, std::string> stopped;
  for (const std::string& member : reported) {
    auto held = std::find(current.members.begin(), current.members.end(), member);
    if (held == current.members.end()) continue;  // an earlier generation's process
    stopped[static_cast<int>(held - current.members.begin())] = member;
  }
  return stopped;
}

}  // namespace

std::optional<std::map<int, std::string>> StoppedMembers(Store* agents_store,
                                                         const Membership& current,
                                                         absl::Duration timeout) {
  std::optional<std::vector<std::string>> reported = ReportedStopped(agents_store, timeout);
  if (!reported.has_value()) return std::nullopt;
  return HoldingRanks(*reported, current);
}

std::optional<std::map<int, std::string>> RankWatch::StoppedMembers() {
  std::optional<std::vector<std::string>> reported =
      ReportedStopped(agents_store_, options_.store_timeout);
  if (!reported.has_value()) return std::nullopt;
  // Read at every turn of the coordinator's loop, and almost always empty: the current membership
  // (O(world size) member ids to copy) only when some process is reported stopped.
  if (reported->empty()) return std::map<int, std::string>{};
  return HoldingRanks(*reported, rendezvous_->current());
}

void RankWatch::KillMembersStoppedInFormation() {
  std::optional<std::map<int, std::string>> stopped = StoppedMembers();
  if (!stopped.has_value()) return;  // the store is briefly unreachable: look again next time
  const absl::Time now = clock_->Now();
  const int64_t generation = rendezvous_->generation();
  std::map<std::string, absl::Time> still;
  for (const auto& [rank, member] : *stopped) {
    if (stopped_killed_.count(member) != 0) continue;
    auto seen = stopped_since_.find(member);
    const absl::Time since = seen == stopped_since_.end() ? now : seen->second;
    still[member] = since;
    if (now - since < options_.host_timeout) continue;
    // A rank that completed a step of this generation is in training: a stop there is a hang,
    // which the watchdog and the diagnosis name.
    if (ranks_store_->Get(store_keys::Resumed(generation, rank), options_.store_timeout).ok()) {
      continue;
    }
    if (!coordinating()) break;
    stopped_killed_.insert(member);
    const absl::Duration stood = absl::Trunc(now - since, absl::Milliseconds(1));
    hooks_.kill_and_replace(
        rank, member, EventKind::kRankUnresponsive,
        absl::StrFormat("rank %d is stopped (its agent says) for %s while generation %d "
                        "waits for it",
                        rank, absl::FormatDuration(stood), generation));
  }
  stopped_since_ = std::move(still);
}

bool RankWatch::EveryRankResumed(int64_t generation) {
  if (world_size_ <= 0) return false;
  // One key, whatever the world size: the ranks count themselves (PublishResumed).
  absl::StatusOr<std::string> count =
      ranks_store_->Get(store_keys::ResumedCount(generation), options_.store_timeout);
  int64_t resumed = 0;
  return count.ok() && absl::SimpleAtoi(*count, &resumed) && resumed >= world_size_;
}

void RankWatch::CheckRecoveries(std::vector<Recovery>& recoveries) {
  for (auto it = recoveries.begin(); it != recoveries.end();) {
    // A second fault before every rank resumed supersedes the generation: this recovery ends when
    // the newest one has resumed.
    it->generation = std::max(it->generation, rendezvous_->generation());
    if (!EveryRankResumed(it->generation)) {
      ++it;
      continue;
    }
    if (!coordinating()) return;
    const double took = absl::ToDoubleSeconds(clock_->Now() - it->died);
    Attributes attributes = {{"took_ms", absl::StrCat(std::llround(took * 1000))}};
    if (!it->host.empty()) attributes.emplace_back("host", it->host);
    hooks_.record(
        it->rank, EventKind::kRecovered,
        absl::StrFormat("every rank completed its first step of generation %d", it->generation),
        std::move(attributes));
    if (!it->host.empty()) {
      hooks_.say(
          absl::StrFormat("recovered from the loss of host %s in %.3f s (its last heartbeat "
                          "-> every rank completed its first step of generation %d)",
                          it->host, took, it->generation));
    } else if (it->rank < 0) {
      hooks_.say(
          absl::StrFormat("recovered with the same ranks in %.3f s (first request for a new "
                          "generation -> every rank completed its first step of generation %d)",
                          took, it->generation));
    } else {
      hooks_.say(
          absl::StrFormat("recovered from the loss of rank %d in %.3f s (death seen -> every rank "
                          "completed its first step of generation %d)",
                          it->rank, took, it->generation));
    }
    it = recoveries.erase(it);
  }
}

void RankWatch::ReportProtection() {
  absl::StatusOr<std::string> value =
      ranks_store_->Get(store_keys::kCkptProtected, options_.report_timeout);
  if (!value.ok()) return;
  std::pair<std::string, std::string> parts = absl::StrSplit(*value, absl::MaxSplits(' ', 1));
  if (parts.second == protected_epoch_ || !coordinating()) return;
  hooks_.say(absl::StrFormat(
      "the job is protected%s: every rank's snapshot of step %s is in memory with all its "
      "backups (epoch %s)",
      protected_epoch_.empty() ? "" : " again", parts.first, parts.second));
  protected_epoch_ = parts.second;
}

void RankWatch::ReportSilentCorruption() {
  absl::StatusOr<std::string> value =
      ranks_store_->Get(store_keys::kJobSilentCorruption, options_.report_timeout);
  if (!value.ok()) return;
  std::vector<std::string> lines = absl::StrSplit(*value, '\n', absl::SkipEmpty());
  if (lines.empty() || lines[0] == corruption_said_ || !coordinating()) return;
  for (size_t i = 1; i < lines.size(); ++i)
    hooks_.say(absl::StrCat("silent corruption: ", lines[i]));
  corruption_said_ = lines[0];
}

void RankWatch::ReportPersistFailures() {
  absl::StatusOr<std::vector<std::string>> keys =
      ranks_store_->ListKeys(store_keys::kJobPersistFailedPrefix, options_.report_timeout);
  if (!keys.ok()) return;
  for (const std::string& key : *keys) {
    if (persist_failures_.count(key) != 0) continue;
    absl::StatusOr<std::string> what = ranks_store_->Get(key, options_.report_timeout);
    if (!what.ok()) continue;
    if (!coordinating()) return;
    hooks_.say(absl::StrCat("checkpoint not persisted: ", *what));
    persist_failures_[key] = *what;
  }
}

}  // namespace trainguard
