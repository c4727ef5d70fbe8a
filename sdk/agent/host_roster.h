// Which hosts of a multi-host job are still in it, from the store's three host lists: the hosts
// that joined (agents/join/<host>), those whose agent left (agents/left/<host>, written as it
// exits) and those the coordinator declared dead (agents/dead/<host>). A host fenced out (declared
// dead, then back after a partition or a freeze) is in both of the last two: it counts once. The
// agent that serves the job's store keeps serving it until no other host is still in the job
// (bounded), so that every agent reads the job's end before the store goes.
//
// Pure: names in, names out. Thread-safe (no state).
#ifndef TRAINGUARD_SDK_AGENT_HOST_ROSTER_H_
#define TRAINGUARD_SDK_AGENT_HOST_ROSTER_H_

#include <set>
#include <string>

namespace trainguard {

// The hosts of `joined` that are in neither `left` nor `dead`.
std::set<std::string> HostsStillInJob(const std::set<std::string>& joined,
                                      const std::set<std::string>& left,
                                      const std::set<std::string>& dead);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_AGENT_HOST_ROSTER_H_
