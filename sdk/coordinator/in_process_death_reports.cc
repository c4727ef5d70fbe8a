#include "sdk/coordinator/in_process_death_reports.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace trainguard {

absl::Status InProcessDeathReports::Deliver(const store_keys::DeathReport& report) {
  // The instant of the death, before any wait for generation 0's word: the crash-loop backoff
  // counts from it.
  const absl::Time now = clock_->Now();
  const std::string label = absl::StrCat("rank ", report.rank);  // as the launcher names it
  failures_->Record({label, report.how, report.cause});
  strategy_->OnRankDeath({report.rank, label, report.how}, formed_(), now);
  return absl::OkStatus();
}

}  // namespace trainguard
