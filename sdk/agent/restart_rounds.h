// Restart rounds of `trainguard run --restart-all=M` on several hosts: whether the job may restart
// once more, and, when a host died, the round's plan.
//
// torchrun's elastic agent answers any failure by stopping the whole worker group and starting it
// again through a new rendezvous round; trainguard's agents do the same in restart rounds. The
// coordinator publishes round K + 1 for the job's (K + 1)-th fault, and fails the job at the
// (M + 1)-th instead ("<why>; --restart-all=M reached"). When the fault is a host's death and that
// host held a group rank, the rank goes to the first other host, in join order, that holds none and
// is neither dead, nor left, nor silent (the coordinator's own host is never silent to itself; a
// host whose heartbeat the coordinator has not read yet counts as live: its own loss, if it is
// lost, restarts the job again). With no such host the job fails, naming the dead host, why and its
// group rank. The round's plan then names every joined host, in join order, with its group rank,
// and rank 0 listens where group rank 0's host said it would (its join record's address and port).
//
// Pure: plain values in (the current plan's groups, the joined hosts, the hosts known dead, left or
// silent), a decision out; no store, no clock. The launcher reads the store, converts the plan to
// and from its store record (sdk/core/agent_keys.h's Plan), publishes the round and starts it.
//
// Thread safety: pure functions; any thread may call them.
#ifndef TRAINGUARD_SDK_AGENT_RESTART_ROUNDS_H_
#define TRAINGUARD_SDK_AGENT_RESTART_ROUNDS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace trainguard {

// What the coordinator read for a host's death: the current plan and the hosts.
struct RestartRoundHosts {
  // The current plan's host -> group rank (-1: a standby host). A host missing from it (one that
  // joined after the plan) holds none.
  std::map<std::string, int> groups;
  struct Joined {
    std::string host;
    std::string addr;  // where its rank 0 would listen, were it group rank 0's host
    int port = 0;
  };
  std::vector<Joined> joined;    // every host that joined, in join order
  std::set<std::string> left;    // hosts whose agent left the job
  std::set<std::string> dead;    // hosts the coordinator declared dead
  std::set<std::string> silent;  // hosts whose heartbeat the coordinator finds silent now
};

struct RestartRoundRequest {
  int64_t round = 0;  // the current round; 0: the job's first start
  int limit = 0;      // --restart-all=M: at most M rounds
  std::string why;    // the fault: "rank 1 (h2:41:rank1) exited with status 1"
  // The host whose death this is; empty: a rank's fault (no new plan).
  std::string dead_host;
  std::string own_host;  // the coordinator's: never silent to itself
  // The current plan's master address and port: kept when no joined host holds group rank 0.
  std::string master_addr;
  int master_port = 0;
  // With dead_host: what the coordinator read; nullopt: not read yet (DecideRestartRound asks for
  // it with ReadHosts).
  std::optional<RestartRoundHosts> hosts;
};

// The plan of a restart round (the store's Plan, less ranks_per_host, which does not change).
struct RestartRoundPlan {
  int training_hosts = 0;  // hosts with a group rank
  std::string master_addr;
  int master_port = 0;
  struct Host {
    std::string host;
    int group = -1;  // -1: a standby host
  };
  std::vector<Host> hosts;  // every joined host, in join order
};

struct RestartRoundDecision {
  // Fail the job for `why`.
  struct Fail {
    std::string why;
  };
  // A host died: read the plan and the hosts into RestartRoundRequest::hosts and ask again.
  struct ReadHosts {};
  // Publish and start round `round`.
  struct Start {
    int64_t round = 0;
    // A host's death: the round's plan, published before the round. nullopt: a rank's fault, the
    // plan stays.
    std::optional<RestartRoundPlan> plan;
    // When a host takes the dead host's group rank: "restart round 2: host h3 takes host h2's group
    // rank 1". Empty otherwise (the dead host held none: a standby host).
    std::string taker;
  };
  using Action = std::variant<Fail, ReadHosts, Start>;
};

// What follows the fault `request` describes.
RestartRoundDecision::Action DecideRestartRound(const RestartRoundRequest& request);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_AGENT_RESTART_ROUNDS_H_
