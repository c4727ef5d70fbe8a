#include "sdk/coordinator/in_process_rank_reports.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace trainguard {

absl::Status InProcessRankReports::Death(const store_keys::DeathReport& report) {
  // The instant of the death, before any wait for generation 0's word: the crash-loop backoff
  // counts from it.
  const absl::Time now = clock_->Now();
  const std::string label = absl::StrCat("rank ", report.rank);  // as the launcher names it
  failures_->Record({label, report.how, report.cause});
  strategy_->OnRankDeath({report.rank, label, report.how}, hooks_.formed(), now);
  return absl::OkStatus();
}

absl::Status InProcessRankReports::Finished(int64_t round, int rank, const std::string& /*member*/) {
  std::set<int>& finished = finished_[round];
  const bool counted = finished.insert(rank).second;
  if (counted && static_cast<int>(finished.size()) == world_size_) hooks_.every_rank_finished();
  return absl::OkStatus();
}

}  // namespace trainguard
