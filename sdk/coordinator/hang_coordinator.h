// HangCoordinator: what the job's coordinator does about a hang a rank declared (store key
// hang/gen<G>), from the moment it sees the declaration to the replacement of the hang's suspects.
//
// At each Poll it looks for a declared hang of a generation not settled yet (the current one, or a
// superseded one whose ranks still wait in its collectives); once it has one, it gathers the
// observations HangArbiter (sdk/agent/hang_arbiter.h) decides on: the ranks' dumps of the hang
// (<run dir>/flight_recorder, read through the Env), which ranks are stopped or gone, the declaring
// rank's verdict (aborted, withdrawn) from the store; and carries out what the arbiter decides:
// replace a stopped minority at once, withdraw (nothing replaced), wait, or diagnose
// (sdk/watchdog/hang_diagnosis.h) and replace the suspects, a minority only unless they are not
// running.
//
// A job of thousands of ranks dumps gigabytes (a rank's ring of 4,096 records is about 200 KB on
// disk): each dump is read once, when it appears, and only its digest is kept (HangDumpDigest);
// the digest the rank wrote beside it (WriteHangDump) is read instead of the dump when it is there,
// a few kilobytes where parsing the dump was most of the work. One Poll reads for at most
// dump_read_budget, on read_threads threads (HangDumpReader, its own among them), and a hang is
// decided on once every dump listed is read, so the coordinator's loop goes on with its other
// duties meanwhile.
//
// What a rank's process is doing is seen in two ways, and one serves where the other cannot:
//  - This host's own processes, through Hooks::local_holder (one host: every rank's): a stopped
//    process is seen stopped, a process that died or whose rank a replacement took is seen gone,
//    in whichever generation, and a hang of a superseded generation is found from its dump.
//  - Any other rank through the store, while the hung generation is current: agents/stopped/
//    <member> (its agent saw it stopped) and its heartbeat standing still.
// A suspect seen locally is killed by Hooks::kill_local after two checks (a replacement that took
// the rank later is not the hung process; one that trained in a later generation is not hung);
// another host's through its agent (Hooks::kill_member, fenced by the lease term), while the hung
// generation is current.
//
// A hang that coincides with a host's partition is not diagnosed while it is unexplained: the
// survivors wait in collectives for the cut-off host's ranks, whose dumps may still reach a shared
// run dir and make a healthy rank look guilty. While a host that holds ranks of the hung generation
// has sent no heartbeat for `host_quiet` (JobCoordinator::HostsQuietFor), the diagnosis holds off;
// it goes on once that host beats again, and once the host is declared dead the death explains the
// hang, whose suspects are then its ranks' replacements' to take over (nothing else is done). A
// view of the hosts younger than `host_quiet` (this agent just took the lease over, every host's
// bound started afresh) cannot tell a host cut off before it yet: the diagnosis waits that long.
//
// Every act that writes to the store, says what it decided or kills checks the gate
// (Hooks::coordinating) right before it: a deposed coordinator does nothing. Every instant is the
// Clock's, so tests drive it with an in-memory store, a ManualClock and dumps written to a temp dir
// (tests/unit/hang_coordinator_test.cc), no process and no sleep.
//
// Thread safety: not thread-safe; one thread (the coordinator's loop, a test) uses an instance. Its
// dump reader's threads read through the Env and the Clock only while a Poll waits for them.
#ifndef TRAINGUARD_SDK_COORDINATOR_HANG_COORDINATOR_H_
#define TRAINGUARD_SDK_COORDINATOR_HANG_COORDINATOR_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "sdk/agent/hang_arbiter.h"
#include "sdk/coordinator/hang_dump_reader.h"
#include "sdk/coordinator/job_coordinator.h"
#include "sdk/coordinator/rank_watch.h"  // StoppedMembers
#include "sdk/rendezvous/rendezvous.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/hang_diagnosis.h"
#include "trainguard/clock.h"
#include "trainguard/env.h"
#include "trainguard/events.h"
#include "trainguard/store.h"

namespace trainguard {

// What this host sees of the process that holds a rank (Hooks::local_holder).
struct LocalHolder {
  // The rank is this host's: its process, if any, is in sight. false: another host's rank, seen
  // only through the store.
  bool here = false;
  bool running = false;  // a process of this host holds the rank and is not being killed
  bool stopped = false;  // that process is stopped (SIGSTOP)
  int64_t rank_generation = 0;  // the generation in which it took the rank
  std::string label;            // "rank 3"
  pid_t pid = -1;
};

struct HangCoordinatorOptions {
  std::string dump_dir;  // where the ranks write their dumps: <run dir>/flight_recorder
  // --heartbeat-timeout: a rank's heartbeat standing still for min(this, silent_heartbeat) means
  // its process is not running (stopped or frozen whole): it will not dump (SilentHeartbeat).
  absl::Duration heartbeat_timeout = absl::Seconds(30);
  absl::Duration silent_heartbeat = absl::Milliseconds(2500);
  // A host of the hung generation whose heartbeat stood still this long holds the diagnosis off
  // (--host-timeout / 3: a third of the way to being declared dead).
  absl::Duration host_quiet = absl::Seconds(1);
  // The bound on a hold-off: a quiet host is declared dead by its timeout, but one the
  // coordinator stopped watching (it left) never is. Past this the hang is diagnosed without it
  // (2 x --host-timeout).
  absl::Duration max_hold_off = absl::Seconds(6);
  absl::Duration store_timeout = absl::Seconds(10);
  // How often Poll looks at the store and the dumps (between, it returns at once).
  absl::Duration poll_interval = absl::Milliseconds(50);
  // How long one Poll may spend reading dumps that appeared: the others are read at the next
  // polls, and a hang is decided on once every dump listed is read. A job of thousands of ranks
  // dumps hundreds of megabytes, and the coordinator's loop has other duties every tick (the
  // hosts' liveness among them). At least one dump is read per Poll.
  absl::Duration dump_read_budget = absl::Milliseconds(200);
  // The threads that read them, this poll's among them (HangDumpReader): a dump whose rank wrote
  // no digest beside it is parsed whole, its ring's thousands of records.
  int read_threads = 4;
  HangArbiterOptions arbiter;
};

// How long a rank's heartbeat must stand still in a job of `world_size` ranks for the hang
// diagnosis to count its process as not running: the larger of silent_heartbeat and two and a
// half of the rank's default heartbeat periods (RankHeartbeatInterval), at most heartbeat_timeout.
absl::Duration SilentHeartbeat(const HangCoordinatorOptions& options, int world_size);

class HangCoordinator {
 public:
  struct Hooks {
    // The gate of every act: true while this agent may act as the coordinator.
    std::function<bool()> coordinating;
    // Says one line of the launcher's output (without the "trainguard run: " prefix).
    std::function<void(const std::string&)> say;
    // The ranks' store (their job id's namespace: a restart round's own) and the rendezvous
    // coordinator whose generations they form: the launcher replaces both for a restart.
    std::function<Store*()> ranks_store;
    std::function<RendezvousCoordinator*()> rendezvous;
    // Dumps written before this are an earlier incarnation's (a restart): not this hang's evidence.
    std::function<absl::Time()> restarted_at;
    // The flight-recorder rings this host can read now (a hung or stopped rank's too), by rank.
    std::function<std::map<int, FlightRecorderContents>()> live_rings;
    // This host's view of the process that holds `rank`; null: this host sees no rank's process
    // (every rank is another host's).
    std::function<LocalHolder(int rank)> local_holder;
    // Kills this host's process that holds `rank` (local_holder's), the suspect of `generation`'s
    // hang: recorded (hang_suspect, with its pid) and reaped and replaced like any dead rank.
    std::function<void(int rank, int64_t generation)> kill_local;
    // Kills `member` (another host's) through its agent, recording `kind` there.
    std::function<void(const std::string& member, EventKind kind, const std::string& why)>
        kill_member;
    // Kills `member`, which holds `rank` and its agent reports stopped, and queues its replacement
    // at once (the launcher's KillAndReplaceStoppedMember).
    std::function<void(int rank, const std::string& member, EventKind kind,
                       const std::string& why)>
        kill_and_replace_stopped;
  };

  // REQUIRES: `agents_store`, `clock`, `env` and `hosts` outlive the coordinator; every hook is
  // set but local_holder and kill_local (both or neither). `agents_store` is the job's (the
  // agents': agents/stopped/); `hosts` is the job's coordinator, whose view of the hosts' liveness
  // holds a diagnosis off.
  HangCoordinator(Store* agents_store, Clock* clock, Env* env, const JobCoordinator* hosts,
                  HangCoordinatorOptions options, Hooks hooks);
  HangCoordinator(const HangCoordinator&) = delete;
  HangCoordinator& operator=(const HangCoordinator&) = delete;

  // One turn, every tick of the coordinating agent once generation 0 formed: at most every
  // poll_interval, looks for a declared hang, then gathers its observations and acts on it as the
  // arbiter decides (see the file comment).
  void Poll();

  // Forgets the pending hang; generations below `checked_below` have no hang left to look for (a
  // takeover: the older hangs were the previous coordinator's; a new plan or restart: 0).
  void Reset(int64_t checked_below);

  // A declared hang is being decided (a renewal waits for it).
  bool pending() const { return pending_.has_value(); }
  // The job's world size (0: no plan yet). Set it as it changes.
  void set_world_size(int world_size) {
    if (world_size != world_size_) resumed_.clear();
    world_size_ = world_size;
  }

 private:
  // A hang seen and not settled yet.
  struct PendingHang {
    int64_t generation;
    absl::Time seen;
    std::map<int, FlightRecorderContents> live_rings;  // read when the hang was seen
    std::set<int> heartbeat_silent;  // ranks already said to send no heartbeat
    std::set<int> agent_stopped;     // ranks already said to be stopped by their agent
    int declarer = -1;     // the rank that wrote the hang key read ("rank R: ..."), if known
    bool aborted = false;  // it aborted (hang/gen<G>/aborted/<R>)
    // Ranks seen stopped while the dumps were still coming in, and replaced then.
    std::set<int> replaced;
    std::string declaration;  // the hang key's value
    bool announced = false;   // "hang in generation G: <declaration>" said (Announce)
    // The hosts that held its ranks (when it was seen in its own generation), and those of them
    // declared dead already then.
    std::set<std::string> hosts;
    std::set<std::string> dead_when_seen;
    std::set<std::string> held_off_by;  // quiet hosts said to hold the diagnosis off
    absl::Time held_off_since = absl::InfiniteFuture();  // the hold-off's start
    bool hold_off_over = false;  // it reached max_hold_off: not held off again
  };
  // What this host sees of the hung generation's ranks, and what the store says of the others.
  struct Seen {
    std::set<int> dumped;
    std::set<int> not_running;  // stopped, silent, or replaced already for being stopped
    std::set<int> stopped;      // of those, seen stopped now
    std::set<int> no_longer_held;
    bool through_agents = false;  // some rank is another host's: its state comes through the store
  };

  // Looks for a declared hang of a generation not settled; true when one is pending now.
  bool FindHang(absl::Time now);
  // A hang declared in `generation` after it was superseded: the store rejects the declaring
  // rank's writes then (they are fenced), but its dump, whose reason begins "hang: ", is in the
  // dump dir. The hang key's text for it; NotFound when there is none of a rank this host sees,
  // Unavailable while dumps remain to be read (the read budget ran out before `deadline`).
  absl::StatusOr<std::string> SupersededHang(int64_t generation, absl::Time deadline);
  // Reads the dumps that appeared in dump_dir since the last call, until `deadline` (at least
  // one), and forgets those removed: true when every dump listed is read. The listing's error
  // when it cannot be listed (NotFound: no dump dir yet).
  absl::StatusOr<bool> RefreshDumps(absl::Time deadline);
  // Of the dumps read, each rank's newest (by dump number) of `generation`, as ReadHangDumps
  // picks them: pointers into known_dumps_, valid until the next RefreshDumps (every poll looks,
  // and a copy of every rank's digest each time would be most of a poll's work). NotFound when
  // there is none.
  absl::StatusOr<std::vector<const HangDumpDigest*>> DumpsOf(int64_t generation) const;
  // Every rank completed a step of `generation` (its resumed key). Asks the store only for the
  // ranks not seen resumed yet: it is asked every poll until they all are.
  bool EveryRankResumed(int64_t generation);
  // True while the hang waits for a quiet host (said once per host), and when a host of the hung
  // generation was declared dead since it was seen (said: it explains the hang, now settled).
  bool HoldOff(absl::Time now);
  Seen Observe(const absl::StatusOr<std::vector<const HangDumpDigest*>>& dumps);
  void ReplaceStoppedRanksNow(const std::set<int>& stopped, bool through_agents);
  void ReplaceSuspects(const std::vector<int>& suspects, int64_t generation,
                       const std::set<int>& not_running);
  // Kills the process that holds `rank`, the suspect of `generation`'s hang (`stopped`: seen
  // stopped, replaced before the diagnosis).
  void KillSuspect(int rank, int64_t generation, bool stopped);
  void Announce();
  LocalHolder Holder(int rank) const {
    return hooks_.local_holder ? hooks_.local_holder(rank) : LocalHolder{};
  }
  absl::Time DumpsSince(int64_t generation) const;
  bool coordinating() const { return hooks_.coordinating(); }
  Store* ranks_store() const { return hooks_.ranks_store(); }
  RendezvousCoordinator* rendezvous() const { return hooks_.rendezvous(); }

  Store* const agents_store_;
  Clock* const clock_;
  Env* const env_;
  const JobCoordinator* const hosts_;
  const HangCoordinatorOptions options_;
  const Hooks hooks_;
  const HangArbiter arbiter_;

  int world_size_ = 0;
  std::optional<PendingHang> pending_;
  // When a hang of a generation was last withdrawn: its dumps are not the next one's.
  std::map<int64_t, absl::Time> withdrawn_at_;
  // The dumps in dump_dir read so far, by file name, reduced to what the diagnosis uses (their
  // digests, read from beside them or made from them): each dump is read once, when it first
  // appears (a dump is linked into place whole, under a name no other dump takes:
  // WriteNewFlightRecorderDump), not at every poll while a hang is pending. A job of thousands of
  // ranks dumps hundreds of kilobytes each; their digests are a few kilobytes.
  struct KnownDump {
    int64_t number = -1;                   // rank-RRRRR.<number>.pb
    std::optional<HangDumpDigest> digest;  // nullopt: not a flight recorder dump (not read again)
  };
  std::map<std::string, KnownDump> known_dumps_;
  int64_t checked_below_ = 0;  // generations below this one have no hang left to look for
  // The ranks seen resumed in generation resumed_generation_ (EveryRankResumed).
  int64_t resumed_generation_ = -1;
  std::set<int> resumed_;
  absl::Time next_check_ = absl::InfinitePast();
  // Last: its threads stop first.
  HangDumpReader reader_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_COORDINATOR_HANG_COORDINATOR_H_
