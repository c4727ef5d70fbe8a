// RenewalPolicy: when `trainguard run` answers the ranks' requests for a new generation
// (RendezvousMember::RequestNewGeneration: their communicators failed, a connection dropped, a hang
// was declared on a healthy job) by renewing the generation with the same ranks, or, under
// --restart-all, by restarting every rank.
//
// When a rank died, its replacement's generation answers the others' requests; otherwise nobody
// would publish one and the job would wait until the heartbeats ran out. So the generation is
// renewed as soon as every rank has asked, or `grace()` after the first request of the generation
// was seen: a rank that does not ask may be dead or stopped, and its death, or the diagnosis of a
// hang, comes first. The grace is 1 s on one host. On several it is host_timeout + 1 s: a rank that
// does not ask may be on a host that died, which its agent's heartbeat tells within host_timeout,
// and the host's replacement answers the requests.
//
// Under --restart-all a request restarts every rank instead (torchrun's answer to any failure): at
// once on one host; on several after the same wait as a renewal, because a host that died makes
// the others ask too, and its loss, declared within the grace, restarts the job once with a standby
// host in its place.
//
// Nothing is decided, and no request counts as seen, while something else comes first: a rank's
// death is pending, a declared hang is pending, or a rank killed for liveness is not reaped yet.
//
// The policy is pure: it does no I/O and reads no clock; the caller passes what it observed and
// when, so tests drive it with explicit instants. It returns the lines the launcher prints; the
// launcher does the rest (reading the requests, renewing the generation, restarting). Its one piece
// of state is when the first request of the current generation was seen: a new generation starts
// it afresh, and Reset forgets it (a restart round, whose generations count from 0 again).
//
// Thread safety: not thread-safe; one thread (the launcher's loop, a test) uses an instance.
#ifndef TRAINGUARD_SDK_AGENT_RENEWAL_POLICY_H_
#define TRAINGUARD_SDK_AGENT_RENEWAL_POLICY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/time/time.h"

namespace trainguard {

struct RenewalPolicyOptions {
  bool multi_host = false;  // --nnodes: the job runs on several hosts
  // --host-timeout (several hosts): how long a dead host takes to be declared dead.
  absl::Duration host_timeout = absl::Seconds(3);
  bool restart_all = false;  // --restart-all: a request restarts every rank
};

// What the launcher saw at one poll.
struct RenewalObservations {
  int64_t generation = -1;  // the current generation
  int world_size = 0;
  // What comes first: while any holds, nothing is decided.
  bool death_pending = false;         // a rank's death waits for its replacement
  bool hang_pending = false;          // a declared hang is being decided
  bool killed_rank_unreaped = false;  // a rank killed for liveness still runs: its death is next
  // The ranks that asked for a new generation in `generation`, with why; nullopt: not read (Decide
  // asks for them with ReadRequests).
  std::optional<std::map<int, std::string>> requests;
};

class RenewalPolicy {
 public:
  // Nothing to do yet: poll again.
  struct Wait {
    enum class For {
      kBlocked,   // a death, a hang or a killed rank comes first
      kRequests,  // no rank asked
      kGrace,     // some ranks asked, not all: the others may still, or be found dead
    };
    For what = For::kRequests;
    absl::Time until = absl::InfiniteFuture();  // kGrace: first request seen + grace
    // The first time a generation's request is seen (not under --restart-all): "rank 1 asks for a
    // new generation: <why>", naming the lowest rank that asked. Empty otherwise.
    std::string first_ask;
  };
  // Read the requests of the current generation into RenewalObservations::requests and ask again.
  struct ReadRequests {};
  // Renew the generation with the same ranks. Asked again (the renewal failed, say the store did
  // not answer), the policy answers the same, without `first_ask`.
  struct Renew {
    std::vector<int> asked_by;  // ascending
    absl::Time first_asked;     // when the first request was seen: where the recovery began
    std::string first_ask;      // as Wait::first_ask, when every rank asked at the first look
  };
  // --restart-all: restart every rank for `why` ("rank 1 asks for a new generation: <why>").
  struct RestartAll {
    std::string why;
    absl::Time first_asked;
  };
  using Action = std::variant<Wait, ReadRequests, Renew, RestartAll>;

  explicit RenewalPolicy(RenewalPolicyOptions options) : options_(options) {}

  // What to do about the requests observed, at `now`. REQUIRES: observed.world_size > 0 once
  // requests are passed; `now` is not before the previous call's.
  Action Decide(const RenewalObservations& observed, absl::Time now);

  // Forgets the first request seen: the next request starts a new wait.
  void Reset() { first_asked_.reset(); }

  // How long after the first request the generation is renewed without the other ranks'.
  absl::Duration grace() const {
    return options_.multi_host ? options_.host_timeout + absl::Seconds(1) : absl::Seconds(1);
  }
  const RenewalPolicyOptions& options() const { return options_; }

 private:
  struct FirstAsked {
    int64_t generation = -1;
    absl::Time since;
  };

  const RenewalPolicyOptions options_;
  std::optional<FirstAsked> first_asked_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_AGENT_RENEWAL_POLICY_H_
