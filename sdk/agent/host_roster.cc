#include "sdk/agent/host_roster.h"

namespace trainguard {

std::set<std::string> HostsStillInJob(const std::set<std::string>& joined,
                                      const std::set<std::string>& left,
                                      const std::set<std::string>& dead) {
  std::set<std::string> in_job;
  for (const std::string& host : joined) {
    if (left.count(host) == 0 && dead.count(host) == 0) in_job.insert(host);
  }
  return in_job;
}

}  // namespace trainguard
