// HangArbiter: what `trainguard run` does about a hang a rank declared, from the moment it sees the
// declaration to the replacement of the hang's suspects.
//
// A rank's watchdog declares a hang (store key hang/gen<G>); every rank then dumps its flight
// recorder, and the declaring rank waits (hang_dump_wait_ms) before it aborts, or withdraws the
// hang if its own wait ends meanwhile (a machine-wide stall, not a hang). The arbiter decides, each
// time the launcher polls:
//
//  - StoppedToReplaceNow: a rank whose process is seen stopped (SIGSTOP; on several hosts, its
//    agent says so) is replaced at once, before the others' dumps are in, as long as some rank
//    still runs and no rank was replaced so yet for this hang.
//  - Decide: wait while some rank may still dump (for up to dump_grace after the hang was seen);
//    then, when every rank runs and the declaring rank is known, read its verdict and wait for it
//    (up to verdict_wait after the hang was seen): aborted, the suspects are diagnosed; withdrawn,
//    no one is replaced. Otherwise diagnose: the evidence is as complete as it will be.
//  - SuspectsToReplace: of the suspects the diagnosis (sdk/watchdog/hang_diagnosis.h) names, those
//    not running are the ones replaced when others are running; none is when ranks were replaced
//    already for being stopped.
//  - Headline: how the hang is announced. Not when it is first seen: a hang that is withdrawn is
//    one line, and so is one whose suspects all died (the survivors waited in a collective for a
//    rank that was killed; its replacement is the recovery, and nothing else is done about it).
//
// The arbiter is pure: it does no I/O and reads no clock; the caller passes what it observed (the
// dumps read, the processes seen, the store's verdict) and the time, so tests drive it with
// explicit instants. It returns the lines the launcher prints; its caller, HangCoordinator
// (sdk/coordinator/hang_coordinator.h), does the rest (reading the dumps and the store, diagnosing,
// killing and replacing processes). It keeps no state: the pending hang's observations are the
// caller's.
//
// Not decided here: whether a suspect is replaced at all once named (a minority of the job, the
// process that hung still holding the rank): HangCoordinator::ReplaceSuspects and KillSuspect.
//
// Thread safety: const methods on an immutable object; any thread may use an instance.
#ifndef TRAINGUARD_SDK_AGENT_HANG_ARBITER_H_
#define TRAINGUARD_SDK_AGENT_HANG_ARBITER_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "absl/time/time.h"

namespace trainguard {

struct HangArbiterOptions {
  // Ranks dump within hang_dump_wait_ms (1 s by default) of the declaration; one that is stopped or
  // dead never does. After this, the hang is diagnosed with the dumps that are in.
  absl::Duration dump_grace = absl::Seconds(3);
  // How long a hang with every rank running waits for its declaring rank's verdict (aborted or
  // withdrawn, after its hang_dump_wait_ms) before its suspects are replaced all the same.
  absl::Duration verdict_wait = absl::Seconds(5);
};

// The declaring rank's verdict on its hang, as the store holds it.
struct HangVerdict {
  enum class Kind {
    kNone,       // neither yet (or the store did not answer)
    kAborted,    // hang/gen<G>/aborted/<R>
    kWithdrawn,  // hang/gen<G>/withdrawn/<R>, whose value is `withdrawal`
  };
  Kind kind = Kind::kNone;
  std::string withdrawal;  // kWithdrawn: the declarer's reason
};

// What the launcher saw of one declared hang at one poll.
struct HangObservations {
  int64_t generation = -1;  // the hung generation
  absl::Time seen;          // when the launcher first saw the declaration
  int world_size = 0;
  std::set<int> dumped;  // ranks whose dump of this hang is in
  // Ranks not running: stopped (SIGSTOP; on several hosts, their agent says so), sending no
  // heartbeat, or replaced already for being stopped. They will not dump, and of the suspects they
  // are the ones at fault.
  std::set<int> not_running;
  // Ranks that no process of the hung generation holds any more (on one host: the process died, or
  // a replacement took the rank in a later generation). They will not dump either, but say nothing
  // about who is at fault.
  std::set<int> no_longer_held;
  int declarer = -1;  // the rank whose declaration the launcher read; -1: unknown
  // The declarer's verdict; nullopt: not read (Decide asks for it with ReadVerdict when it needs
  // it). A verdict of kAborted read at an earlier poll may be passed again.
  std::optional<HangVerdict> verdict;
};

class HangArbiter {
 public:
  // Nothing to do yet: poll again.
  struct Wait {
    enum class For {
      kDumps,    // some rank may still dump
      kVerdict,  // every rank runs; the declarer's verdict may still come
    };
    For what = For::kDumps;
    absl::Time until;  // when this wait ends whatever comes
  };
  // Read the declarer's verdict from the store into HangObservations::verdict and ask again.
  struct ReadVerdict {};
  // The declarer withdrew the hang: replace no one, forget it (a later hang of the generation is a
  // new one). `message`: "hang in generation 3 withdrawn: <reason>; no one replaced".
  struct Withdraw {
    std::string message;
  };
  // The evidence is as complete as it will be: read the dumps, diagnose, and ask SuspectsToReplace.
  struct Diagnose {};
  using Action = std::variant<Wait, ReadVerdict, Withdraw, Diagnose>;

  // Stopped ranks to replace before the dumps are in.
  struct StoppedReplacement {
    std::set<int> ranks;  // empty: none now
    // With ranks: "hang diagnosis: rank(s) 1 stopped (SIGSTOP): replaced now; the diagnosis follows
    // once the others' dumps are in".
    std::string message;
  };

  // Who is replaced once the hang is diagnosed.
  struct SuspectReplacement {
    // The diagnosis's suspects, narrowed to those not running when only some of them are: what the
    // diagnosis names when printed.
    std::vector<int> suspects;
    // The suspects to replace: `suspects`, or none when ranks were replaced already.
    std::vector<int> replace;
    // Printed before the diagnosis when the suspects were narrowed: "hang diagnosis: of the
    // suspects, rank(s) 2 are not running (stopped, SIGSTOP): they are the ones replaced". Empty
    // otherwise.
    std::string narrowed;
    // Printed after the diagnosis when ranks were replaced already: "hang diagnosis: rank(s) 2
    // replaced already (stopped); no one else is". Empty otherwise.
    std::string replaced_already;
  };

  HangArbiter() = default;
  explicit HangArbiter(HangArbiterOptions options) : options_(options) {}

  // What to do about the hang observed, at `now`. REQUIRES: observed.world_size > 0.
  Action Decide(const HangObservations& observed, absl::Time now) const;

  // The ranks seen `stopped` now (and not dumped) to replace at once, given the ranks `replaced`
  // already for this hang. None once some were (the diagnosis decides the rest), nor when every
  // rank is stopped: a stopped rank is evidence only while another runs. `multi_host`: the wording
  // (their agents say / SIGSTOP).
  StoppedReplacement StoppedToReplaceNow(const std::set<int>& stopped,
                                         const std::set<int>& replaced, int world_size,
                                         bool multi_host) const;

  // Of the diagnosis's `suspects` (ascending), the ones to replace, given the ranks `not_running`
  // (HangObservations::not_running) and those `replaced` already for being stopped. A suspect that
  // is not running cannot be making progress: when only some suspects are not running, they are
  // the ones. `multi_host`: the wording (stopped, or no heartbeat / stopped, SIGSTOP).
  SuspectReplacement SuspectsToReplace(const std::vector<int>& suspects,
                                       const std::set<int>& not_running,
                                       const std::set<int>& replaced, bool multi_host) const;

  // How a hang is announced once diagnosed (Diagnose), given the diagnosis's `suspects` and the
  // hang key's `declaration` ("rank 0: hang (collective) at step 12 ...").
  struct Headline {
    // "hang in generation 3: <declaration>"; explained by a death: "hang in generation 3 explained
    // by rank 1's death (its replacement takes over): <declaration>".
    std::string line;
    // Every suspect is a rank that no process of the hung generation holds any more
    // (HangObservations::no_longer_held) and that was not seen stopped (not_running, which holds
    // the ranks replaced for it): the hang is its death as the survivors saw it. The diagnosis is
    // neither printed nor acted on.
    bool explained_by_death = false;
  };
  Headline Announce(const HangObservations& observed, const std::vector<int>& suspects,
                    const std::string& declaration) const;

  // "hang in generation 3: <declaration>": the first line of a hang acted on before it is
  // diagnosed (a stopped rank replaced at once), and of a diagnosed hang not explained by a death.
  static std::string Declared(int64_t generation, const std::string& declaration);

  const HangArbiterOptions& options() const { return options_; }

 private:
  HangArbiterOptions options_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_AGENT_HANG_ARBITER_H_
