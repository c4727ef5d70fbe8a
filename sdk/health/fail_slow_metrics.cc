#include "sdk/health/fail_slow_metrics.h"

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace trainguard {

std::string RankWorkKey(int rank) { return absl::StrCat("health/rank/", rank); }

std::string EncodeRankWorkRecord(const RankWorkRecord& r) {
  std::string out =
      absl::StrFormat("v1 %d %d %d %d", r.steps, r.step_ns, r.collective_ns, r.collective_bytes);
  for (const auto& [name, ns] : r.phase_ns) {
    std::string safe = name;
    for (char& c : safe) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-' &&
          c != '/') {
        c = '_';
      }
    }
    if (!safe.empty()) absl::StrAppend(&out, " ", safe, "=", ns);
  }
  return out;
}

absl::StatusOr<RankWorkRecord> ParseRankWorkRecord(std::string_view text) {
  const std::vector<absl::string_view> f =
      absl::StrSplit(absl::string_view(text.data(), text.size()), ' ', absl::SkipEmpty());
  RankWorkRecord r;
  auto bad = [&]() {
    return absl::InvalidArgumentError(
        absl::StrCat("rank work record \"", std::string(text),
                     "\": want \"v1 <steps_completed> <step_ns_total> <collective_ns_total> "
                     "[<collective_bytes_total> [<phase>=<ns> ...]]\""));
  };
  if (f.size() < 4 || f[0] != "v1" || !absl::SimpleAtoi(f[1], &r.steps) ||
      !absl::SimpleAtoi(f[2], &r.step_ns) || !absl::SimpleAtoi(f[3], &r.collective_ns) ||
      (f.size() >= 5 && !absl::SimpleAtoi(f[4], &r.collective_bytes))) {
    return bad();
  }
  for (size_t i = 5; i < f.size(); ++i) {
    const size_t eq = f[i].find('=');
    int64_t ns = 0;
    if (eq == absl::string_view::npos || eq == 0 || !absl::SimpleAtoi(f[i].substr(eq + 1), &ns)) {
      return bad();
    }
    r.phase_ns.emplace_back(std::string(f[i].substr(0, eq)), ns);
  }
  return r;
}

std::string HostMetricsKey(std::string_view host) { return store_keys::kAgentMetrics.Key(host); }

std::string EncodeHostMetricsRecord(const HostMetricsRecord& r) {
  std::string out = absl::StrFormat("v1 %d %.6g", r.seq, r.work);
  for (const auto& [name, value] : r.metrics) absl::StrAppendFormat(&out, " %s=%.6g", name, value);
  return out;
}

absl::StatusOr<HostMetricsRecord> ParseHostMetricsRecord(std::string_view text) {
  const std::vector<absl::string_view> f =
      absl::StrSplit(absl::string_view(text.data(), text.size()), ' ', absl::SkipEmpty());
  HostMetricsRecord r;
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("host metrics record \"", std::string(text), "\": ", what));
  };
  if (f.size() < 3 || f[0] != "v1") return bad("want \"v1 <seq> <work> <metric>=<value> ...\"");
  if (!absl::SimpleAtoi(f[1], &r.seq)) return bad("seq is not an integer");
  if (!absl::SimpleAtod(f[2], &r.work)) return bad("work is not a number");
  for (size_t i = 3; i < f.size(); ++i) {
    const size_t eq = f[i].find('=');
    double value = 0;
    if (eq == absl::string_view::npos || eq == 0 ||
        !absl::SimpleAtod(f[i].substr(eq + 1), &value)) {
      return bad(absl::StrCat("field ", i, " is not <metric>=<number>"));
    }
    r.metrics.emplace_back(std::string(f[i].substr(0, eq)), value);
  }
  return r;
}

}  // namespace trainguard
