// Rendezvous: who is rank r of the job, in which generation, and how a warm standby takes over a
// dead rank without the survivors restarting.
//
// A job's membership is a sequence of generations. Generation 0 is formed by the N initial ranks.
// When a rank dies, the RendezvousCoordinator (run by the launcher, which sees its children die)
// publishes generation g+1 in which a parked standby holds the dead rank's id, raises the store's
// fence to g+1 so that nothing of generation g can write any more, and the survivors and the
// standby meet again:
//
//   survivor:  guard fails (peer gone) -> member.AwaitGeneration(g + 1) -> rebuild communicators
//   standby:   member.ParkAsStandby() returns generation g+1 with its new rank -> build
//              communicators
//   both:      member.AgreeOnResume(...) (or Barrier(...)) before the first step of the new
//              generation
//
// When the communicators fail and no rank died (a dropped connection, a hang declared on a healthy
// job), the ranks ask for a new generation (RequestNewGeneration) and the coordinator renews the
// current one: generation g+1 with the same members (RenewGeneration), and they meet again alike.
//
// Store keys (under the job's PrefixStore; built in sdk/core/store_keys.h). A member's writes carry
// the generation it adopted last, so a member of a superseded generation finds every write
// rejected, its heartbeat included, and superseded() turns true; a replaced member (declared dead
// while still running) stays shut out:
//   rdzv/join/<rank>               member id of the initial rank (generation 0)
//   rdzv/standby/<member>          "parked", or "taken" once the coordinator claimed it (by CAS)
//   rdzv/assign/<member>           "<generation> <rank>": a standby's assignment
//   rdzv/gen/<g>/table             the rank table of generation g: text lines "<g>", "<world
//                                  size>", then one member id per rank. O(world size) bytes: read
//                                  by the coordinators and the host agents, and by a rank only
//                                  where it needs the member ids (ReadRankTable)
//   rdzv/gen/<g>/changes           what generation g changed: "<g>", "<world size>", then "<rank>
//                                  <member id>" for each rank taken by another member than in g-1
//                                  (generation 0: none, its table is the registrations). A rank
//                                  learns its place in g from it: its rank is its registration's
//                                  (initial), its assignment's (standby) or the one it held, unless
//                                  the changes give that rank to another member (it was replaced)
//   rdzv/current                   the newest published generation
//   rdzv/claim/<g>                 the coordinator that published generation g (compare-and-set
//                                  from absent: of two coordinators, only one publishes each g)
//   rdzv/gen/<g>/barrier/<name>/arrived  the count of ranks that arrived at the barrier
//   rdzv/gen/<g>/barrier/<name>/passed   set by the rank whose arrival completed the count
//   rdzv/gen/<g>/progress/<rank>   the step a rank's state is ready to run next (-1: no state)
//   rdzv/gen/<g>/agreed            the count of ranks whose progress is written
//   rdzv/gen/<g>/plan              the RecoveryPlan of generation g, computed from every rank's
//                                  progress by the rank whose count completed it; "superseded by
//                                  <g+1>" when the coordinator published g+1 before it was
//   rdzv/gen/<g>/resumed/<rank>    the first step a rank completed in generation g (Runtime,
//                                  PublishResumed)
//   rdzv/gen/<g>/resumed_count     how many ranks wrote theirs (the coordinator's one read per
//                                  turn while a recovery is measured)
//   rdzv/gen/<g>/renew/<rank>      a rank of generation g asks for g+1 with the same members; the
//                                  value says why
//   rdzv/hb/<member>               heartbeat counter, advanced by each member's heartbeat thread
//                                  (or its owner's Beat());
//                                  the coordinator reports ranks whose counter stopped (liveness on
//                                  any store, TcpStore or etcd alike). "left" once the member was
//                                  destroyed (its Runtime closed): the process is exiting, and is
//                                  given kLeftGrace to do so before it counts as stale
//   rdzv/wake/<member>/<nonce>     written by a Runtime's generation watcher as it stops, to end
//                                  its own parked wait (AwaitNewerGenerationOr) at once
//
// Cost. A rank's calls read and write O(1) keys of O(1) bytes each (O(ranks changed) for the
// changes, O(runs of new ranks) for the plan), whatever the world size, but for the one rank per
// agreement that reads every rank's progress: joining, learning a new generation and agreeing on
// the resume step cost the store O(world size) in all, not per rank.
// The Membership a rank gets therefore carries no member ids (members is empty); ReadRankTable
// reads them, O(world size) bytes, where they are needed.
// A member that waits for a key in order to read it (generation 0's or the next generation's
// changes, its assignment, the agreed plan) does both in one Store::WaitAndRead, and a rank writes
// its progress and counts it in one Store::SetAndAdd (its first step, once, in one
// Store::CreateAndAdd): one round trip each on a TcpStore, whose cost, times every rank, is what
// forming, replacing and agreeing take at scale. The coordinator publishes a generation as its
// claim and one Store::WriteBatch (table, changes, assignments, fence, the previous plan's mark,
// rdzv/current), so that the ranks it wakes find all of it and never queue ahead of its last
// writes, and a member's wait for the next table reads the announcement and the changes with it.
//
// Thread safety: RendezvousMember and RendezvousCoordinator may be called from any thread; each
// owns at most one background thread (the heartbeat), stopped and joined by its destructor.
#ifndef TRAINGUARD_SDK_RENDEZVOUS_RENDEZVOUS_H_
#define TRAINGUARD_SDK_RENDEZVOUS_RENDEZVOUS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/core/mutex.h"
#include "sdk/core/store_keys.h"
#include "trainguard/clock.h"
#include "trainguard/membership.h"
#include "trainguard/store.h"

namespace trainguard {

class CoordinatorLease;

// How long a member that left (its Runtime closed) may take to exit before it counts as stale.
inline constexpr absl::Duration kLeftGrace = absl::Seconds(30);
inline constexpr char kLeftHeartbeat[] = "left";

// The period of a rank's heartbeat in a job of `world_size` ranks where none is configured
// (Options::heartbeat_interval_ms 0): 1 s up to kRankBeatsPerSecond ranks, then growing with the
// job so that the store takes about that many rank heartbeats a second whatever the job's size
// (16,384 ranks: 4 s), at most kMaxRankHeartbeatInterval (a launcher's bound on a silent rank,
// --heartbeat-timeout, is 30 s by default). A rank's death is its agent's to report at once; the
// heartbeat finds a process that is stopped or frozen whole, in seconds.
inline constexpr int kRankBeatsPerSecond = 4096;
inline constexpr absl::Duration kMaxRankHeartbeatInterval = absl::Seconds(5);
absl::Duration RankHeartbeatInterval(int world_size);

class RendezvousMember {
 public:
  // `member_id` names this process uniquely in the job (e.g. "host:pid:nonce"); `store` is the
  // job's store (already scoped to the job). REQUIRES: `store` outlives the member.
  // `heartbeat_interval`: how often its heartbeat thread beats (Beat). absl::InfiniteDuration():
  // no heartbeat thread; whoever owns the member beats it with Beat() (one timer for many members:
  // a simulator of thousands of ranks in one process, bench/bench_scale), or nobody does.
  RendezvousMember(Store* store, std::string member_id, absl::Duration heartbeat_interval);
  // Stops the heartbeat and marks this member "left" (best effort, bounded by the heartbeat
  // interval, or 1 s without a heartbeat thread): a process whose Runtime closed may take a while
  // to exit (an interpreter's teardown on a loaded machine) and must not be killed as hung for its
  // silence meanwhile.
  ~RendezvousMember();
  RendezvousMember(const RendezvousMember&) = delete;
  RendezvousMember& operator=(const RendezvousMember&) = delete;

  // The Memberships below are this member's place in a generation (generation, world size, rank)
  // without the member ids: members is empty (see Cost above); ReadRankTable reads them.
  //
  // Initial rank `rank` of `world_size`: registers and waits until the coordinator publishes
  // generation 0.
  absl::StatusOr<Membership> JoinInitial(int rank, int world_size, absl::Duration timeout);
  // Registers as a warm standby and waits (up to `timeout`) for an assignment to a rank.
  absl::StatusOr<Membership> ParkAsStandby(absl::Duration timeout);
  // Waits until a generation newer than `after` is published and returns this member's place in it.
  // FailedPrecondition when the new generation does not include this member (it was replaced).
  absl::StatusOr<Membership> AwaitGeneration(int64_t after, absl::Duration timeout);
  // The full rank table of `generation` with this member's rank in it (-1 when it holds none),
  // O(world size) bytes: for the places that need the member ids. NotFound before it is
  // published; DataLoss for a malformed table.
  absl::StatusOr<Membership> ReadRankTable(int64_t generation, absl::Duration timeout);
  // Every rank of `membership` calls it once after joining the generation, with the step its state
  // is ready to run next (-1 for a replacement without state); returns the plan, the same for
  // every rank: the rank whose progress completes the count computes it from every rank's
  // progress, once, and the others read it. Aborted when a newer generation is published meanwhile
  // (a rank died during the rendezvous, possibly the one that was to compute the plan): call
  // AwaitGeneration(membership.generation) and agree again in the newer one.
  absl::StatusOr<RecoveryPlan> AgreeOnResume(const Membership& membership, int64_t next_step,
                                             absl::Duration timeout);
  // Asks the coordinator for a new generation with the same members: this rank's communicators
  // failed and it knows of no dead rank. `why` (e.g. the failure) is kept for the coordinator's
  // report. Ok as well when a newer generation than `membership`'s exists already (it answers the
  // request). Then call AwaitGeneration(membership.generation).
  absl::Status RequestNewGeneration(const Membership& membership, std::string_view why,
                                    absl::Duration timeout);
  // Every rank of `membership` calls it once with the same `name`; returns when all have arrived.
  absl::Status Barrier(const Membership& membership, std::string_view name, absl::Duration timeout);

  // One heartbeat: advances rdzv/hb/<member>, bounded by `timeout`; marks this member superseded
  // when the store refuses it as stale. What the heartbeat thread does every heartbeat interval.
  // Errors (the store briefly unreachable) are the caller's to retry at its next beat.
  absl::Status Beat(absl::Duration timeout);

  const std::string& member_id() const { return member_id_; }
  // True once the store rejected this member's heartbeat as stale, or AwaitNewerGeneration saw a
  // newer generation's table: a newer generation exists. Call
  // AwaitGeneration(): it returns this member's place in it, or FailedPrecondition when this member
  // was replaced (then the process must exit). Adopting a generation clears it.
  bool superseded() const { return superseded_generation_.load() >= 0; }
  // The generation found superseded (superseded() is true), or -1.
  int64_t superseded_generation() const { return superseded_generation_.load(); }
  // The generation this member's writes carry (-1 before it joined one).
  int64_t generation() const;
  // Waits up to `timeout` (a store Wait, parked at the server: no polling) for the table of the
  // generation after the one this member holds, and marks this member superseded when it appears.
  // The coordinator writes a generation's table, changes, fence and announcement as one store
  // batch: a member that waits here learns that the others are leaving for a newer generation as
  // soon as it is published, sooner than from its next heartbeat's refusal, and reads, in the same
  // round trip, what the AwaitGeneration that follows would read first (the announcement and the
  // new generation's changes): that call then costs the store nothing. True when this member's
  // generation is superseded (also when it was already), false when the wait ran out;
  // FailedPrecondition before it joined a generation; the store's error otherwise.
  absl::StatusOr<bool> AwaitNewerGeneration(absl::Duration timeout);
  // What AwaitNewerGenerationOr saw.
  struct NewerGenerationOrKey {
    // The next generation's table exists: this member is marked superseded.
    bool superseded = false;
    // Otherwise: the index in `keys` of one that exists; nullopt when the wait ran out.
    std::optional<size_t> key;
  };
  // AwaitNewerGeneration and a wait for any of `keys`, parked at once as one Store::WaitAny: ends
  // as soon as the next generation's table or one of `keys` exists, so that a watcher waits for
  // the generation, a peer's hang and its own shutdown with one request, without polling (one
  // Store::WaitAnyAndRead: a table found brings the reads AwaitGeneration needs, as above). The
  // table wins when both exist. FailedPrecondition before this member joined a generation; the
  // store's error otherwise.
  absl::StatusOr<NewerGenerationOrKey> AwaitNewerGenerationOr(const std::vector<std::string>& keys,
                                                              absl::Duration timeout);

 private:
  // The place this member holds (its generation, rank and world size).
  Membership Held() const;
  // This member's place after `changes`, the values of the changes of each generation after the
  // one `place` holds, in order: nullopt when one is missing (a coordinator that writes none: read
  // the table), FailedPrecondition when one gives its rank to another member (it was replaced).
  absl::StatusOr<std::optional<Membership>> FollowChanges(
      Membership place, const std::vector<std::optional<std::string>>& changes) const;
  // This member's place in `generation` from its table (it holds no generation yet, or missed too
  // many); FailedPrecondition when the table does not name it (it was replaced).
  absl::StatusOr<Membership> PlaceFromTable(int64_t generation, absl::Duration timeout);
  // The changes of `generation`, waited for (a standby's assignment may be written just before
  // them).
  absl::StatusOr<store_keys::GenerationChanges> ReadChanges(int64_t generation,
                                                            absl::Duration timeout);
  // Waits, in slices, for `key` (written once by a rank of `membership`'s generation) and returns
  // its value; Aborted (`superseded`) when a newer generation is published meanwhile.
  absl::StatusOr<std::string> AwaitAgreedKey(const Membership& membership, const std::string& key,
                                             const absl::Status& superseded, absl::Time deadline);
  // The generation this member holds, whose successor's table the two waits for a newer generation
  // wait on; FailedPrecondition before it joined one.
  absl::StatusOr<int64_t> HeldGeneration() const;
  // Marks `held` superseded, once the next generation's table appeared, and keeps `prefetched`
  // (what the wait read with it: the announcement and the next generation's changes) for
  // AwaitGeneration, unless this member adopted a newer generation meanwhile (AdoptGeneration
  // clears the mark); whether the generation it holds now is superseded.
  bool MarkSuperseded(int64_t held, std::vector<std::optional<std::string>> prefetched);
  void AdoptGeneration(const Membership& place);
  void HeartbeatLoop();

  Store* const store_;
  const std::string member_id_;
  const absl::Duration heartbeat_interval_;
  mutable Mutex mu_;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = -1;
  int rank_ ABSL_GUARDED_BY(mu_) = -1;
  int world_size_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> superseded_generation_{-1};
  // What AwaitNewerGeneration read as the next generation appeared: rdzv/current and the changes of
  // generation `after` + 1, for AwaitGeneration(`after`). Cleared by AdoptGeneration.
  struct Prefetched {
    int64_t after = -1;
    std::vector<std::optional<std::string>> values;
  };
  std::optional<Prefetched> prefetched_ ABSL_GUARDED_BY(mu_);
  Notification stop_;
  std::thread heartbeat_;
};

// GenerationFollower: how a host's agent that does not coordinate follows the published
// generations, as far as its own processes need, without the rank table. An agent needs to know
// which of its ranks lost their rank and which of its standbys took one: generation 0 is its own
// ranks' registrations (rdzv/join/<rank>) and the world size of its changes, every later generation
// its changes (rdzv/gen/<g>/changes). Its Membership names the holder of each of `own_ranks` in
// generation 0 and of every rank a later generation changed; the other entries are empty. It reads
// the newest table only as a fallback (it missed more than 64 generations, or one's changes are
// missing), so a job's agents cost the store O(hosts x ranks per host) to follow generation 0 and
// O(ranks changed) per generation after, not O(hosts x world size) each.
//
// Thread safety: not thread-safe; one thread (the agent's loop) uses an instance.
class GenerationFollower {
 public:
  // REQUIRES: `store` outlives the follower.
  explicit GenerationFollower(Store* store) : store_(store) {}

  // Loads the newest published generation (`own_ranks`: the ranks this host started in generation
  // 0). One read when it is known already. NotFound before generation 0 is published; DataLoss,
  // naming the key, for a malformed generation, table or changes.
  absl::Status Follow(const std::vector<int>& own_ranks, absl::Duration timeout);
  // The newest generation followed (generation -1 before the first), its members as above.
  const Membership& current() const { return current_; }

 private:
  Store* const store_;
  Membership current_;
};

// Says that `rank` completed its first step of `generation`, `step` (Runtime, once per generation):
// writes rdzv/gen/<g>/resumed/<rank> if it is absent and, when it wrote it, adds one to
// rdzv/gen/<g>/resumed_count, so that a retried or repeated call counts once (Store::CreateAndAdd:
// one round trip on a TcpStore). The store's error.
absl::Status PublishResumed(Store* store, int64_t generation, int rank, int64_t step,
                            absl::Duration timeout);

// Decides membership: forms generation 0 and replaces dead ranks with standbys. One acts for a job
// at a time (the launcher, or the host agent that holds the coordinator lease); a coordinator that
// takes over from one that died calls Resume() first. Each generation is claimed in the store
// before it is published, so a deposed coordinator that still acts can never publish a generation
// its successor published: its Publish fails with Aborted and it reloads the current one. Not a
// background thread: the owner calls it when it learns of a death.
class RendezvousCoordinator {
 public:
  // REQUIRES: `store` and `clock` outlive the coordinator. The clock times the heartbeats'
  // staleness (its monotonic time: a wall-clock jump never makes a rank look dead); tests pass a
  // ManualClock. The waits of the other calls are bounded in real time. `name` is written to the
  // claim of each generation it publishes (who published what, for the operator); it must differ
  // between coordinators of one job (a host id), since a claim with its own name counts as its own
  // (an earlier attempt of the same publication that ran out of time).
  //
  // `lease`: the coordinator lease of a multi-host job, whose gate (CoordinatorLease::CheckHeld) is
  // checked right before each publication's claim, a replacement's first claim of a standby and
  // each standby it forgets: once this agent may no longer act as the coordinator they write
  // nothing and return the gate's Aborted, as when another coordinator published first. May be
  // called from another thread than the lease's owner. nullptr: no lease (one host).
  // REQUIRES: `lease`, if any, outlives the coordinator.
  explicit RendezvousCoordinator(Store* store, Clock* clock = Clock::Real(),
                                 std::string name = "coordinator",
                                 const CoordinatorLease* lease = nullptr);

  // Loads the newest published generation from the store (a coordinator taking over, an agent
  // following the generations); one read when it knows that generation already. Holding an older
  // generation (at most 64 behind), it applies the changes published since (rdzv/gen/<g>/changes:
  // O(ranks changed) bytes); else, or where a generation's changes are missing, it reads the
  // newest table (O(world size) bytes). NotFound before generation 0 is published; DataLoss for a
  // malformed table or changes.
  absl::Status Resume(absl::Duration timeout);
  // The newest generation this coordinator knows (generation -1 before generation 0).
  Membership current() const;

  // Waits for the `world_size` initial ranks to register, then publishes generation 0.
  absl::StatusOr<Membership> FormInitialGeneration(int world_size, absl::Duration timeout);
  // Publishes generation current+1 in which a parked standby (the first in member-id order) takes
  // `dead_rank`. FailedPrecondition when no standby is parked (the caller then stops the job).
  absl::StatusOr<Membership> ReplaceRank(int dead_rank, absl::Duration timeout);
  // Publishes one generation current+1 in which every rank of `dead_ranks` is taken by a parked
  // standby: those of `preferred` first (in that order, e.g. every standby of one standby host,
  // local rank by local rank), then any other parked standby when `any_standby`, read (a ListKeys
  // and a MultiGet) only once the preferred ones run out (taken or gone). A whole host's ranks are
  // thus replaced at once. FailedPrecondition (naming the ranks) when there are not
  // enough standbys; the ones claimed meanwhile are parked again.
  absl::StatusOr<Membership> ReplaceRanks(const std::vector<int>& dead_ranks,
                                          const std::vector<std::string>& preferred,
                                          bool any_standby, absl::Duration timeout);
  // The ranks of the current generation that asked for a new one (RequestNewGeneration), in rank
  // order, with the reason each gave.
  absl::StatusOr<std::map<int, std::string>> NewGenerationRequests(absl::Duration timeout);
  // Publishes generation current+1 with the same members, for ranks whose communicators failed
  // while none died: they all meet again in it, agree on the resume step and go on.
  absl::StatusOr<Membership> RenewGeneration(absl::Duration timeout);
  // Forgets a parked standby that died (the launcher saw it exit), so it is never picked. Any
  // agent may, holding the lease or not: the agent that saw the exit is the standby's own.
  absl::Status ForgetStandby(const std::string& member_id, absl::Duration timeout);
  // Standbys parked now, in member-id order.
  absl::StatusOr<std::vector<std::string>> ParkedStandbys(absl::Duration timeout);
  // The ranks of the current generation whose heartbeat counter has not advanced for `timeout` of
  // this coordinator's time, measured from its last write (or its last change, on a store without
  // ages) or from this coordinator's first call in the current generation (until a member adopts
  // a new generation its beats are fenced out). A stopped or hung process stops beating:
  // its heartbeat thread stops with it. A member that left (its Runtime closed: the process is
  // exiting) counts as stale only after max(10 x `timeout`, kLeftGrace). Call it periodically.
  // Where the store dates its writes (Store::MultiGetWithAges), a call reads only the ranks whose
  // beat is `timeout` / 4 old or older (none: no request), so that a job of 16,384 ranks is not
  // read whole twice a second; elsewhere every rank's value at every call.
  absl::StatusOr<std::vector<int>> RanksWithStaleHeartbeats(absl::Duration timeout,
                                                            absl::Duration store_timeout);
  // The newest published generation (-1 before generation 0).
  int64_t generation() const;

 private:
  // Publishes `next` (its table, and its changes from `previous`, the generation before it; none
  // for generation 0) and assigns each standby of `assignments` (member id -> rank) in the same
  // step. Aborted when another coordinator claimed next.generation first (this one then reloads).
  absl::StatusOr<Membership> Publish(const Membership& previous, Membership next,
                                     const std::map<std::string, int>& assignments,
                                     absl::Duration timeout);

  // OK unless the lease's gate is closed (see the constructor).
  absl::Status CheckLease() const;

  Store* const store_;
  Clock* const clock_;
  const std::string name_;
  const CoordinatorLease* const lease_;
  mutable Mutex mu_;
  Membership current_ ABSL_GUARDED_BY(mu_);
  // Judges the ranks `ranks` of `generation` by the ages read for them (RanksWithStaleHeartbeats).
  std::vector<int> JudgeAgedBeats(int64_t generation, const std::vector<size_t>& ranks,
                                  const std::vector<std::optional<Store::AgedValue>>& aged,
                                  absl::Duration timeout);

  // Per rank of generation beats_generation_: the last heartbeat value seen and since when it
  // stands (clock_'s monotonic ns): when the store last wrote it, or when this coordinator first
  // saw the value (without ages), and not before this coordinator's first call in the generation.
  // By rank, not by member id: a generation's members do not change.
  struct Beat {
    std::string value;
    int64_t since_ns = 0;
    bool read = false;  // read in this generation yet
  };
  std::vector<Beat> beats_ ABSL_GUARDED_BY(mu_);
  int64_t beats_generation_ ABSL_GUARDED_BY(mu_) = -1;
  // The heartbeat keys of beats_generation_'s members, by rank: built once per generation and
  // shared with the read in flight, not built (O(world size) strings) at every read.
  std::shared_ptr<const std::vector<std::string>> heartbeat_keys_ ABSL_GUARDED_BY(mu_);
  // Whether the store answers MultiGetWithAges (false: Unimplemented, as etcd: values from then
  // on); unknown until the first call.
  std::optional<bool> ages_supported_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RENDEZVOUS_RENDEZVOUS_H_
