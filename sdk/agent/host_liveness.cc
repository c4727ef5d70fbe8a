#include "sdk/agent/host_liveness.h"

#include <algorithm>

namespace trainguard {

HostLiveness::HostLiveness(absl::Duration timeout) : HostLiveness(timeout, timeout) {}
HostLiveness::HostLiveness(absl::Duration timeout, absl::Duration recheck)
    : timeout_(timeout), recheck_(recheck) {}

void HostLiveness::StartBoundsAfterGap(absl::Time now) {
  if (now - last_read_ > timeout_ / 3) {
    for (auto& [host, beat] : beats_) beat.since = now;
    bounds_since_ = now;
  }
  last_read_ = now;
}

std::vector<HostLiveness::Silent> HostLiveness::Observe(
    const std::map<std::string, std::string>& beats, absl::Time now) {
  StartBoundsAfterGap(now);
  std::vector<Silent> silent;
  for (const auto& [host, value] : beats) {
    auto [it, inserted] = beats_.try_emplace(host, Beat{value, now});
    if (!inserted && it->second.value != value) it->second = Beat{value, now};
    if (now - it->second.since >= timeout_) {
      silent.push_back(Silent{host, it->second.since, now - it->second.since});
    }
  }
  return silent;
}

std::vector<HostLiveness::Silent> HostLiveness::ObserveAges(
    const std::map<std::string, std::optional<absl::Duration>>& ages, absl::Time now) {
  StartBoundsAfterGap(now);
  std::vector<Silent> silent;
  for (const auto& [host, age] : ages) {
    // First seen: a full timeout from now, whatever its age. Else the later of the bound's start
    // and the write the age dates; a later answer's estimate of the same write, a little earlier
    // by its shorter way back, never moves it back.
    auto [it, inserted] = beats_.try_emplace(host, Beat{"", now});
    if (!inserted && age.has_value()) it->second.since = std::max(it->second.since, now - *age);
    if (now - it->second.since >= timeout_) {
      silent.push_back(Silent{host, it->second.since, now - it->second.since});
    }
  }
  return silent;
}

std::vector<std::string> HostLiveness::DueForRead(absl::Time now) const {
  std::vector<std::string> due;
  for (const auto& [host, beat] : beats_) {
    if (now - beat.since >= recheck_) due.push_back(host);
  }
  return due;
}

void HostLiveness::Forget(const std::string& host) { beats_.erase(host); }

bool HostLiveness::IsSilent(const std::string& host, absl::Time now) const {
  const auto it = beats_.find(host);
  return it != beats_.end() && now - it->second.since >= timeout_;
}

std::vector<HostLiveness::Silent> HostLiveness::QuietFor(absl::Duration quiet,
                                                        absl::Time now) const {
  std::vector<Silent> hosts;
  for (const auto& [host, beat] : beats_) {
    if (now - beat.since >= quiet) hosts.push_back(Silent{host, beat.since, now - beat.since});
  }
  return hosts;
}

}  // namespace trainguard
