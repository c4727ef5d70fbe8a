#include "sdk/agent/replacement_policy.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"

namespace trainguard {

absl::Duration ReplacementPolicy::Backoff(int streak) const {
  if (streak < 2) return absl::ZeroDuration();
  absl::Duration delay = options_.restart_backoff;
  for (int i = 2; i < streak && delay < options_.max_backoff; ++i) delay *= 2;
  return std::min(delay, options_.max_backoff);
}

ReplacementPolicy::Decision ReplacementPolicy::OnRankDeath(int rank, std::string_view how,
                                                           absl::Time now) {
  RankHistory& history = ranks_[rank];
  ++history.deaths;
  history.last = std::string(how);
  history.streak = now - history.took_rank < options_.healthy_run ? history.streak + 1 : 1;

  if (!options_.has_standbys) {
    return Fail{absl::StrFormat("rank %d died and the job has no standbys (%s)", rank, how)};
  }
  const std::string deaths = absl::StrFormat("rank %d died %d time%s (last: %s)", rank,
                                             history.deaths, history.deaths == 1 ? "" : "s", how);
  if (replacements_ >= options_.max_replacements) {
    return Fail{
        absl::StrFormat("%s; --max-replacements=%d reached", deaths, options_.max_replacements)};
  }
  Replace replace;
  replace.delay = Backoff(history.streak);
  replace.not_before = now + replace.delay;
  replace.streak = history.streak;
  replace.deaths = history.deaths;
  if (replace.delay > absl::ZeroDuration()) {
    replace.message = absl::StrFormat(
        "%s, %d in a row within %s of taking its rank: replacing it in %s", deaths, history.streak,
        absl::FormatDuration(options_.healthy_run), absl::FormatDuration(replace.delay));
  }
  return replace;
}

void ReplacementPolicy::OnRankTaken(int rank, absl::Time now) { ranks_[rank].took_rank = now; }

ReplacementPolicy::StandbyDecision ReplacementPolicy::OnStandbyDeath(std::string_view how,
                                                                     absl::Time started,
                                                                     absl::Time now) {
  const bool exhausted_before = standbys_exhausted();
  ++standby_deaths_;
  standby_last_death_ = std::string(how);
  standby_streak_ = now - started < options_.healthy_run ? standby_streak_ + 1 : 1;

  StandbyDecision decision;
  if (exhausted_before) return decision;  // said when it was reached
  if (standbys_exhausted()) {
    decision.message = absl::StrFormat(
        "standbys died %d times while parked (last: %s); --max-replacements=%d reached: no more "
        "standbys are started",
        standby_deaths_, how, options_.max_replacements);
    return decision;
  }
  const absl::Duration delay = Backoff(standby_streak_);
  decision.respawn = true;
  decision.not_before = now + delay;
  if (delay > absl::ZeroDuration()) {
    decision.message = absl::StrFormat(
        "standbys died %d times in a row within %s of starting: the next starts in %s",
        standby_streak_, absl::FormatDuration(options_.healthy_run), absl::FormatDuration(delay));
  }
  return decision;
}

RankHistory ReplacementPolicy::history(int rank) const {
  const auto it = ranks_.find(rank);
  return it == ranks_.end() ? RankHistory{} : it->second;
}

}  // namespace trainguard
