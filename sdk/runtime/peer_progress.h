// Peer progress records: how a rank waiting in a collective tells "a peer is still working towards
// it" from "the job is hung" (private to sdk/runtime; the Runtime publishes and reads them, the
// Watchdog's peer_progress question is answered from them).
//
// Each rank of a job with a store publishes one record under hang/gen<G>/progress/<rank>, at most
// every watchdog_peer_progress_ms and only when it changed, from the Runtime's duty thread, once a
// rank of generation G asked for them: the first rank whose collective runs past its bound writes
// hang/gen<G>/progress_wanted, every rank's generation watcher sees it, and their records follow
// (until then, no one reads them). The asker takes its peers' first records to be on their way for
// one window after the question (AwaitingFirstRecords). A record is one line of text
// (docs/FORMATS.md):
//
//   v1 <wall_unix_ns> <progress_age_ns> <step> <comm_id>:<begun>[,<comm_id>:<begun>...]
//
// wall_unix_ns is the publisher's wall clock when it wrote the record; progress_age_ns how long
// before that its training thread last made progress (a phase began or ended, or a tick: see
// Watchdog::last_progress_ns), measured on its monotonic clock; step the step it was in; and per
// communicator the number of collectives it had entered (the next sequence number). Ages are
// measured where they happen, so only the wall time of publication is compared across hosts, to
// within the hosts' clock skew.
//
// Thread safety: plain functions and values.
#ifndef TRAINGUARD_SDK_RUNTIME_PEER_PROGRESS_H_
#define TRAINGUARD_SDK_RUNTIME_PEER_PROGRESS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/core/agent_keys.h"

namespace trainguard {
namespace runtime_internal {

struct ProgressRecord {
  absl::Time published;         // the publisher's wall clock
  absl::Duration progress_age;  // since its last progress, as of `published`
  int64_t step = -1;
  // (communicator id, collectives entered), in the publisher's registration order.
  std::vector<std::pair<uint64_t, int64_t>> begun;

  // The publisher's last progress on its wall clock.
  absl::Time last_progress() const { return published - progress_age; }
  // Collectives entered on `comm_id`; -1 when the publisher has no such communicator.
  int64_t BegunOn(uint64_t comm_id) const;
  // Whether the publisher has a communicator of the generation whose communicator id is
  // `generation_comm_id` (GenerationOfCommId): then one of that generation it lacks is a group it
  // is not a member of.
  bool MemberOfGeneration(uint64_t generation_comm_id) const;
};

std::string EncodeProgressRecord(const ProgressRecord& record);
// InvalidArgument naming the field that does not parse.
absl::StatusOr<ProgressRecord> ParseProgressRecord(std::string_view text);

// The store key of `rank`'s record in generation `generation`.
std::string ProgressKey(int64_t generation, int rank);

// The value of hang/gen<G>/progress_wanted: who asked, and when (its wall clock).
std::string EncodeProgressQuestion(int rank, absl::Time asked);
// When the question was asked; InvalidArgument naming the field that does not parse.
absl::StatusOr<absl::Time> ParseProgressQuestion(std::string_view text);
// While the peers' first records may still be on their way after the question asked at `asked`
// (until `window` after it): the excuse that postpones the hang meanwhile, e.g. "the peers were
// asked for their progress records 120ms ago"; nullopt once the window has passed.
std::optional<std::string> AwaitingFirstRecords(absl::Time asked, absl::Time now,
                                                absl::Duration window);

// Where the launcher (sdk/launch/launch_agent.cc: the host's agent, on several hosts) says that one
// of its rank processes is stopped (SIGSTOP, a debugger): agents/stopped/<member id>, written while
// it is (docs/FORMATS.md). A stopped peer makes no progress, whatever its last record says.
inline constexpr const char* kStoppedMemberPrefix = store_keys::kAgentStopped.prefix();

// The answer to "is this rank's wait in collective (comm_id, comm_seq) explained by a peer?":
// `records[r]` is rank r's record as read from the store (nullopt: none published), `self` this
// rank. A peer explains the wait when it has not entered that collective (its begun count on
// comm_id is at most comm_seq; a peer without the communicator has not entered it either, unless it
// has others of the same generation: then it is not a member of that group) and its
// last progress is no older than `window` at `now`, unless `stopped` (indexed by rank, possibly
// shorter than `records`) says its launcher sees its process stopped: a record published just
// before a SIGSTOP looks recent for a whole window. Returns a description of the first such peer,
// e.g. "rank 2 has not entered all_reduce #812 and made progress 40ms ago (step 811)", or nullopt.
// Unparseable records count as no progress (the hang is then declared: failing towards detection).
std::optional<std::string> ExplainWait(const std::vector<std::optional<std::string>>& records,
                                       int self, std::string_view op, uint64_t comm_id,
                                       int64_t comm_seq, absl::Time now, absl::Duration window,
                                       const std::vector<bool>& stopped = {});

}  // namespace runtime_internal
}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RUNTIME_PEER_PROGRESS_H_
