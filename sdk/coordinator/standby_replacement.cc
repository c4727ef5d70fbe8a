#include "sdk/coordinator/standby_replacement.h"

#include <string>
#include <variant>

#include "absl/strings/str_cat.h"

namespace trainguard {

std::string RoundJobId(const std::string& job_id, int64_t round) {
  return round == 0 ? job_id : absl::StrCat(job_id, ".round", round);
}

void StandbyReplacement::OnRankDeath(const RankDeath& death, bool formed, absl::Time now) {
  if (!formed) {
    return hooks_.fail(
        absl::StrCat(death.label, " died before generation 0 formed (", death.how, ")"));
  }
  const ReplacementPolicy::Decision decision = policy_->OnRankDeath(death.rank, death.how, now);
  if (const auto* fail = std::get_if<ReplacementPolicy::Fail>(&decision)) {
    return hooks_.fail(fail->why);
  }
  const auto& replace = std::get<ReplacementPolicy::Replace>(decision);
  if (!replace.message.empty()) hooks_.say(replace.message);
  coordinator_->QueueRankReplacement(death.rank, death.how, now, replace.not_before);
}

void StandbyReplacement::OnNotFormed(const absl::Status& why) {
  hooks_.fail(absl::StrCat("generation 0 did not form: ", why.ToString()));
}

}  // namespace trainguard
