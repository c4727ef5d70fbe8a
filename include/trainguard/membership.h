// Membership: which process holds each rank in a generation of the job, and the plan every rank of
// a new generation agreed on before training resumes (Runtime::membership(), recovery_plan()).
//
// Plain values; thread safety as any struct.
#ifndef TRAINGUARD_MEMBERSHIP_H_
#define TRAINGUARD_MEMBERSHIP_H_

#include <cstdint>
#include <string>
#include <vector>

namespace trainguard {

// One generation's assignment of rank ids to member processes.
struct Membership {
  int64_t generation = -1;
  int world_size = 0;
  int rank = -1;  // this member's rank in the generation; -1 in the coordinator's view
  // The member id of each rank. A rank learns its place without them (reading them costs
  // O(world_size) bytes per rank): Runtime::membership() reads them on first use; empty in
  // CommunicatorSpec::membership.
  std::vector<std::string> members;
};

// What every rank of a new generation agreed on before training resumes.
struct RecoveryPlan {
  int64_t generation = -1;
  // The step every rank runs next.
  int64_t resume_step = 0;
  // The rank whose model state every other rank adopts (broadcast) before resuming: the survivor
  // that got furthest, the lowest rank among equals. -1 when no rank has state (every rank is new).
  int state_source_rank = -1;
  // Ranks that joined without state in this generation (replacements), in rank order.
  std::vector<int> new_ranks;
};

}  // namespace trainguard

#endif  // TRAINGUARD_MEMBERSHIP_H_
