#include "sdk/agent/hang_arbiter.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace trainguard {

HangArbiter::Action HangArbiter::Decide(const HangObservations& observed, absl::Time now) const {
  // A rank that dumped, is not running, or is no longer held by the hung generation's process has
  // said all it will: waiting the grace out for it only delays the replacement of the suspect.
  std::set<int> accounted = observed.dumped;
  accounted.insert(observed.not_running.begin(), observed.not_running.end());
  accounted.insert(observed.no_longer_held.begin(), observed.no_longer_held.end());
  const absl::Time dumps_due = observed.seen + options_.dump_grace;
  if (accounted.size() < static_cast<size_t>(observed.world_size) && now < dumps_due) {
    return Wait{Wait::For::kDumps, dumps_due};
  }
  // Every rank is running: the suspects are slow, maybe not hung; they are replaced only once the
  // declaring rank aborted (or its verdict is overdue). One not running is at fault whatever the
  // verdict. The verdict awaited is that of the rank whose declaration the launcher read (every
  // declaring rank writes the hang key; the last one stays).
  if (!observed.not_running.empty() || observed.declarer < 0) return Diagnose{};
  if (!observed.verdict.has_value()) return ReadVerdict{};
  switch (observed.verdict->kind) {
    case HangVerdict::Kind::kAborted:
      return Diagnose{};
    case HangVerdict::Kind::kWithdrawn:
      return Withdraw{absl::StrCat("hang in generation ", observed.generation, " withdrawn: ",
                                   observed.verdict->withdrawal, "; no one replaced")};
    case HangVerdict::Kind::kNone:
      break;
  }
  const absl::Time verdict_due = observed.seen + options_.verdict_wait;
  if (now < verdict_due) return Wait{Wait::For::kVerdict, verdict_due};
  return Diagnose{};
}

HangArbiter::StoppedReplacement HangArbiter::StoppedToReplaceNow(const std::set<int>& stopped,
                                                                 const std::set<int>& replaced,
                                                                 int world_size,
                                                                 bool multi_host) const {
  // A stopped process is seen stopped, not voted on: that is evidence enough while at least one
  // rank still runs (one stopped rank of two is replaced too).
  StoppedReplacement now;
  if (!replaced.empty() || stopped.empty() || stopped.size() >= static_cast<size_t>(world_size)) {
    return now;
  }
  now.ranks = stopped;
  now.message = absl::StrFormat(
      "hang diagnosis: rank(s) %s stopped (%s): replaced now; the diagnosis follows once the "
      "others' dumps are in",
      absl::StrJoin(stopped, ","), multi_host ? "their agents say" : "SIGSTOP");
  return now;
}

HangArbiter::SuspectReplacement HangArbiter::SuspectsToReplace(const std::vector<int>& suspects,
                                                               const std::set<int>& not_running,
                                                               const std::set<int>& replaced,
                                                               bool multi_host) const {
  SuspectReplacement replacement;
  replacement.suspects = suspects;
  std::vector<int> stopped;
  for (int rank : suspects) {
    if (not_running.count(rank) != 0 || replaced.count(rank) != 0) stopped.push_back(rank);
  }
  if (!stopped.empty() && stopped.size() < suspects.size()) {
    replacement.narrowed = absl::StrFormat(
        "hang diagnosis: of the suspects, rank(s) %s are not running (%s): they are the ones "
        "replaced",
        absl::StrJoin(stopped, ","), multi_host ? "stopped, or no heartbeat" : "stopped, SIGSTOP");
    replacement.suspects = stopped;
  }
  // The stopped ranks were replaced as soon as they were seen (StoppedToReplaceNow); the diagnosis
  // that follows names them, or names the others' view of them, and replaces no one else.
  if (!replaced.empty()) {
    replacement.replaced_already =
        absl::StrCat("hang diagnosis: rank(s) ", absl::StrJoin(replaced, ","),
                     " replaced already (stopped); no one else is");
    return replacement;
  }
  replacement.replace = replacement.suspects;
  return replacement;
}

HangArbiter::Headline HangArbiter::Announce(const HangObservations& observed,
                                            const std::vector<int>& suspects,
                                            const std::string& declaration) const {
  // Only when every suspect died: a living suspect may be truly hung (a hang is often overtaken by
  // another rank's death), and the next generation would wait for it until its heartbeat ran out
  // unless the diagnosis replaces it. A rank not running (stopped, or replaced for it already) is
  // the hang's cause even once its process is gone.
  const bool explained =
      !suspects.empty() && std::all_of(suspects.begin(), suspects.end(), [&](int rank) {
        return observed.no_longer_held.count(rank) != 0 && observed.not_running.count(rank) == 0;
      });
  if (!explained) return Headline{Declared(observed.generation, declaration), false};
  const std::string who = suspects.size() == 1
                              ? absl::StrCat("rank ", suspects[0], "'s death")
                              : absl::StrCat("the deaths of ranks ", absl::StrJoin(suspects, ","));
  return Headline{
      absl::StrCat("hang in generation ", observed.generation, " explained by ", who, " (",
                   suspects.size() == 1 ? "its replacement takes" : "their replacements take",
                   " over): ", declaration),
      true};
}

std::string HangArbiter::Declared(int64_t generation, const std::string& declaration) {
  return absl::StrCat("hang in generation ", generation, ": ", declaration);
}

}  // namespace trainguard
