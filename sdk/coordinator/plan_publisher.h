// PlanPublisher: the coordinator's first duty in a job of several hosts, the plan (agents/plan):
// once enough hosts joined (--nnodes MIN[:MAX] workers, and --standby-nodes more), the first MAX
// workers in join order train, group 0 first (its address and port are the job's master), and
// every other host is a standby host. Between MIN and MAX workers it waits --rdzv-last-call for
// more to join (torchrun's "last call"), said once. The plan is published once, by a compare-and-
// set on an absent key: a coordinator that took the lease over meanwhile finds it there. What the
// plan means for one host (its ranks, its standbys) is the host's own agent's to read
// (HostAgent::ReadPlan).
//
// The publication checks the gate (Hooks::coordinating: the coordinator lease) right before it, so
// a deposed coordinator publishes nothing; the last call is timed by the Clock. Tests drive it
// with an in-memory store and a ManualClock (tests/unit/plan_publisher_test.cc).
//
// Thread safety: not thread-safe; one thread (the agent's loop, a test) uses an instance.
#ifndef TRAINGUARD_SDK_COORDINATOR_PLAN_PUBLISHER_H_
#define TRAINGUARD_SDK_COORDINATOR_PLAN_PUBLISHER_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/core/agent_keys.h"
#include "trainguard/clock.h"
#include "trainguard/store.h"

namespace trainguard {

// Every host that joined the job (agents/join/<host>), in join order; a malformed record is
// skipped.
absl::StatusOr<std::vector<store_keys::JoinRecord>> ReadJoinedHosts(Store* store,
                                                                    absl::Duration timeout);

struct PlanOptions {
  int nnodes_min = 1;      // --nnodes MIN: workers needed to start
  int nnodes_max = 1;      // --nnodes ...:MAX: workers that train at most
  int standby_nodes = 0;   // --standby-nodes: standby hosts needed to start
  int ranks_per_host = 1;  // --nproc-per-node
  // --rdzv-last-call: how long to wait for more workers once MIN joined, while fewer than MAX did.
  absl::Duration last_call = absl::ZeroDuration();
  // How long one store call may take.
  absl::Duration call_timeout = absl::Milliseconds(750);
};

class PlanPublisher {
 public:
  struct Hooks {
    // The gate of the publication: true while this agent may act as the coordinator.
    std::function<bool()> coordinating;
    // Says one line of the launcher's output (without the "trainguard run: " prefix).
    std::function<void(const std::string&)> say;
    // The lines that describe the backup placement of a job of `training_hosts` hosts (said after
    // the plan; none without peer backups), or why there is none (then the job fails).
    std::function<absl::StatusOr<std::vector<std::string>>(int training_hosts)> backup_lines;
    // Fails the job for `why`.
    std::function<void(const std::string& why)> fail;
  };

  // REQUIRES: `store` (the job's, the agents') and `clock` outlive the publisher; every hook set.
  PlanPublisher(Store* store, Clock* clock, PlanOptions options, Hooks hooks);
  PlanPublisher(const PlanPublisher&) = delete;
  PlanPublisher& operator=(const PlanPublisher&) = delete;

  // Reads the joined hosts and publishes the plan when they suffice (see above). Returns the plan
  // this call published ("<T> host(s) train, <S> are standby hosts" said, then the backup
  // placement); nullopt when it is not time yet, the store did not answer, the gate is closed, or
  // the plan was there already.
  std::optional<store_keys::Plan> PublishWhenReady();

 private:
  Store* const store_;
  Clock* const clock_;
  const PlanOptions options_;
  const Hooks hooks_;
  std::optional<absl::Time> min_reached_;  // when nnodes_min workers had joined
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_COORDINATOR_PLAN_PUBLISHER_H_
