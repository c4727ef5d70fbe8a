// Communicator: the seam through which the Runtime rebuilds a trainer's communicator for each
// membership generation, aborts it on a failure, and brings a replacement's state up to date.
//
// The trainer implements Communicator around its collective library (gloo, NCCL, MPI) and gives
// the Runtime a factory (Runtime::SetCommunicatorFactory). The Runtime then calls the factory
// once per generation: in Runtime::Start() and in recover() after a re-rendezvous. It aborts and
// destroys the previous communicator first, so peers still blocked in one of its collectives fail
// at once; it registers the new one with the rank's CollectiveTracker, so that a hang the watchdog
// declares calls Abort() too; and it uses Broadcast() to copy every registered state buffer
// (Runtime::state()) from the rank the recovery plan names when no checkpoint was restored.
//
//     class MyComm : public sdk::Communicator { ... };
//     rt->SetCommunicatorFactory([&](const sdk::CommunicatorSpec& spec)
//                                    -> absl::StatusOr<std::unique_ptr<sdk::Communicator>> {
//       return MyComm::Connect(spec);   // rendezvous through spec.store, rank spec.rank, ...
//     });
//     absl::StatusOr<int64_t> start = rt->Start();
//     ... inside a guarded step: static_cast<MyComm&>(*rt->communicator()).AllReduce(...);
//
// A trainer that manages its own communicators sets no factory: Start() and recover() then
// restore checkpoints and agree on steps, and building, aborting and syncing is the trainer's
// (docs/GUIDE.md, "Communicators").
//
// Thread safety: Abort() may be called from any thread, also while another thread is blocked in
// a collective of the same communicator. Every other member is called by one thread at a time (the
// training thread).
#ifndef TRAINGUARD_COMMUNICATOR_H_
#define TRAINGUARD_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainguard/checkpoint.h"

namespace trainguard {

class CollectiveTracker;
class Store;
struct Membership;

class Communicator {
 public:
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  // Destroyed by the Runtime after Abort(), on the training thread or, when a hang's abort was
  // still running, on the watchdog thread.
  virtual ~Communicator() = default;

  // Makes every collective blocked in this communicator, on any thread, return an error soon
  // (ncclCommAbort, failing gloo's connections), and every later one fail. Idempotent; must not
  // throw; may be called from any thread.
  virtual void Abort() = 0;

  // Replaces the `bytes` bytes at `data` (in `device` memory) on every rank by those of rank
  // `root`. Collective: every rank calls it with the same sizes in the same order. An error when
  // it failed (a peer died, the communicator was aborted); the buffer of a receiving rank is then
  // undefined. Unimplemented for a device the communicator cannot reach.
  virtual absl::Status Broadcast(void* data, size_t bytes, Device device, int root) = 0;

  // The communicators this one holds besides its own (those of which this rank is a member), each
  // with its own sequence of collectives: a
  // Megatron-style trainer's tensor, pipeline and data-parallel groups, each a communicator over a
  // subset of the ranks, and one per pipeline link (the two stages that send to each other). Each
  // has an id from CommunicatorSpec::GroupId and a name; the Runtime registers them with the
  // CollectiveTracker after the factory returns, with this communicator's Abort() as their abort
  // hook (a hang in any group aborts them all), and unregisters them when it closes this
  // communicator. Record each group's collectives under its id (ScopedCollective): the hang
  // diagnosis then compares ranks only in the groups they are members of, and follows the waits
  // from one group to another to the rank where they end. Called once, after the factory returned.
  struct Group {
    uint64_t comm_id = 0;
    std::string name;  // for logs and the flight recorder, e.g. "tp0", "pp1.link0"
  };
  virtual std::vector<Group> Groups() const { return {}; }
};

// The communicator id of a group's generation: the low 40 bits of the group's id
// (CommunicatorSpec::GroupId), which is the generation's communicator id.
inline uint64_t GenerationOfCommId(uint64_t comm_id) { return comm_id & ((uint64_t{1} << 40) - 1); }

// What the factory is given to build the communicator of one generation.
struct CommunicatorSpec {
  int rank = 0;
  int world_size = 1;
  // The membership generation (0 in a static job; a new one after every re-rendezvous).
  int64_t generation = 0;
  // The job's store scoped to this generation (PrefixStore("comm/gen<G>", Runtime::store())),
  // fresh for every generation so that no key of an earlier one is read: rendezvous the
  // communicator through it (gloo: a GlooStore over it; NCCL: publish the unique id in it).
  // nullptr in a static job (no store): meet some other way (a shared directory, MASTER_ADDR).
  // Valid until the communicator is destroyed.
  Store* store = nullptr;
  // The generation's rank table; generation -1 in a static job. Its members (the member ids) are
  // empty: a rank does not read them to build a communicator (Runtime::membership() does, on first
  // use).
  const Membership* membership = nullptr;
  // Record every collective on it under `comm_id` (ScopedCollective, BeginOnStream), so that the
  // watchdog sees them. The Runtime registers the communicator under `comm_id` itself, with its
  // Abort() as the hang's abort hook: do not register it again.
  CollectiveTracker* tracker = nullptr;
  // Unique per generation and the same on every rank (generation + 1).
  uint64_t comm_id = 0;
  // "comm/gen<G>": a name for logs and the tracker.
  std::string name;

  // The id of the communicator's group `index` (0, 1, ...; Communicator::Groups): unique in the
  // job, and the same on every rank that is a member of that group.
  uint64_t GroupId(int index) const {
    return ((static_cast<uint64_t>(index) + 1) << 40) | GenerationOfCommId(comm_id);
  }
};

// Builds the communicator of a generation. Blocks until every rank of the generation has called it
// (bound the wait: Runtime::options().rendezvous_timeout_ms is a good bound) or fails; an error
// (e.g. Unavailable: a peer died meanwhile) makes the Runtime meet the ranks in a newer generation
// and call it again.
using CommunicatorFactory =
    std::function<absl::StatusOr<std::unique_ptr<Communicator>>(const CommunicatorSpec& spec)>;

}  // namespace trainguard

#endif  // TRAINGUARD_COMMUNICATOR_H_
