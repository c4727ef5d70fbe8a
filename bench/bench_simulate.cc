// bench_simulate: the scale simulator of issue 37. A job of R ranks on R/8 hosts (--ranks_per_host)
// and a standby host per fault, with the real host agents and the real coordinator, against the
// real TcpStore server in a process of its own (bench/scale_server.h); faults injected, the
// recovery timed, and the result checked for correctness.
//
//   bench_simulate [--ranks=8,64,512,4096] [--ranks_per_host=8]
//                  [--faults=rank,host,partition,hang,slow,coordinator]
//                  [--host_timeout_ms=2000] [--heartbeat_ms=0] [--steady_s=10]
//                  [--agent_threads=4] [--timeout_s=120] [--store=tcp|etcd]
//                  [--hang_records=1024] [--hang_dump_grace_ms=3000] [--fail_slow=evict|alert]
//                  [--json=FILE]
//
// --store=etcd puts the job's store on a 3-member etcd cluster on loopback
// (tests/support/etcd_cluster.h), every member and agent an EtcdStore client; the server's counters
// and CPU are then not measured.
//
// What is real: every host's agent is the library's, as `trainguard run --nnodes` wires it: a
// HostAgent and its StoreHostMembership (join, heartbeat, fence, job end, kill requests, stop
// reports, death reports), a CoordinatorLease and LeaseKeeper on every host, the plan read and the
// generations followed (HostAgent::ReadPlan, FollowMembership) through a RendezvousCoordinator of
// its own, each agent on a store connection of its own (a control connection, as the launcher's:
// TcpStoreOptions::control). The coordinating host (the first to join, which takes the lease)
// runs the PlanPublisher, JobCoordinator, StandbyReplacement and RankWatch, in the order of the
// launcher's loop (Job::Run), and forms generation 0 on a thread of its own (Job::StartForming).
// Every rank and standby is a real RendezvousMember on a store connection of its own, which joins
// (JoinInitial, ParkAsStandby), waits for the next generation's table (AwaitNewerGeneration, as a
// rank's generation watcher) and follows it (AwaitGeneration), and announces each generation it
// holds at its first beat in it (PublishResumed, as a rank does after its first step).
//
// What is simulated: the processes. A host's workers are spawned through the fake process
// supervisor (tests/support/fake_process_supervisor.h, one per agent thread), whose "process" is a
// simulated member on a thread of the simulator. There is no trainer, no collective and no
// watchdog: a hang is declared for one, and a slow host's work records are made up (below). With
// the hang fault, every member watches its generation's hang key as a rank's generation watcher
// does, and the coordinator polls the real HangCoordinator in the launcher loop's place, from the
// start (the steady state includes both). The
// shape that fits 16,384 ranks in this machine (pid_max 32,768, 20,000 file descriptors): one
// thread and one connection per member, whose heartbeat (RendezvousMember::Beat, every
// --heartbeat_ms, by default the library's RankHeartbeatInterval for the job's size) is beaten by
// its own thread between its waits for the next generation, instead of a heartbeat thread and a
// second connection, on a grid of its own (a phase drawn from the member's id, as a heartbeat
// thread started with its process: not in step with the other members); the agents are turned by
// --agent_threads threads (a HostAgent is used by one thread), each turning its slice of the hosts
// at the launcher's cadence (--host_timeout / 12), and the coordinating host by a thread of its
// own; as in the launcher, each host's heartbeat and lease renewal run on two threads of its
// agent's own (HostAgent::StartBeating, LeaseKeeper::StartRenewing), so a host whose agent thread
// is slow to turn it is not declared dead for that. Each agent's store client holds one connection
// (TcpStoreOptions::max_connections 1): its turn, its heartbeat and its renewal take turns on it,
// so that 16,384 ranks' and 2,052 agents' connections fit this machine's 20,000 file descriptors
// (uncapped, a client opens a second connection whenever its turn and its heartbeat overlap).
// Where the descriptors do not hold even that, the agents beat and renew in their turns instead,
// as the library does without those threads, and the simulator says so.
//
// Faults (--faults), each after the previous one recovered:
//  - rank: one rank's process dies: its member goes silent and its fake worker exits with status
//    1; its agent reports the death (HostAgent::ReportDeath) and the coordinator gives the rank to
//    a parked standby. Figure: the death to every live member holding the new generation.
//  - host: a whole training host dies: its agent stops turning, its heartbeat and renewal threads
//    stop, and its members go silent at once;
//    the coordinator declares it dead after --host_timeout_ms and a standby host's members take
//    its ranks. Figure: its agent's last heartbeat to every live member holding the new
//    generation, minus the host timeout (the bound).
//  - partition: a training host is cut off: its agent stops turning and its members make no store
//    call, as for its death, but they live on; once its ranks are replaced (figure as for a host)
//    the link heals, and each cut-off member must learn from its next wait that its rank was given
//    away (it ends replaced; figure: the heal to the last of them), its writes are refused and
//    its agent finds itself fenced out.
//  - coordinator: the coordinating host dies. Another agent takes the lease once it lapses (the
//    host timeout after the last renewal; figure: from its last heartbeat, beyond that bound),
//    gives every host a full host timeout from then (JobCoordinator::TakeOver) and replaces the
//    dead host's ranks. Figure: its last heartbeat to every live member holding the new
//    generation, minus two host timeouts.
//    The simulator makes the coordinator's parts of a host that takes the lease over then (the
//    launcher's agent holds them from its start).
//  - hang: rank R/2 + 3 stops in its collective (its ring shows the all_reduce not entered, the
//    others' show it entered: bench/hang_dumps.h, --hang_records records each, this process's
//    stacks); rank 0 declares the hang through the store (the hang key, its dump, its abort after
//    hang_dump_wait_ms), every member sees the key, reads the declaration and puts its real dump
//    and digest into the run dir (/dev/shm, removed after the size); the HangCoordinator names
//    the suspects and has them killed through their agents, and a standby takes the rank. Each
//    rank's dump is written (staged) before the declaration, and its member renames it into the
//    run dir when it sees the key: each rank of a real job writes its own in milliseconds on its
//    own host, where this machine's two cores would take seconds beside the server for 16,384,
//    past the arbiter's --hang_dump_grace_ms (its 3 s), after which it diagnoses with the dumps
//    in. Figures: the declaration to the suspects named, to the last dump published, to every
//    live member in the new generation.
//    Correct when the one suspect is the stopped rank, every rank dumped, and the check passes.
//  - slow: as `trainguard run --fail-slow` (evict; --fail_slow=alert only names): every rank
//    writes its work record once a second (health/rank/<rank>: steps of 7 ms of compute and 3 ms
//    of transfer), every agent publishes its host's sample (HostAgent::PublishHostSample) and the
//    coordinator runs the real FailSlowCoordinator with the launcher's defaults. 6 s without
//    and 12 s with the watch measure its cost (its Poll's CPU, the store requests it adds); then a
//    training host's ranks compute 30 % longer (the others wait for them in their collectives).
//    Figures: the slowdown to the host named, and, once evicted (a standby host takes its ranks),
//    to every live member in the new generation. Correct when the slow host is named and no
//    other, and once evicted its members learn they were replaced, their writes are refused and
//    its agent finds itself fenced out. On fewer than 3 training hosts it is skipped (the
//    detector names none).
// Where each recovery's time went (printed as "phases:", and in the JSON as
// <rank|host|partition>_phase_<name>_s, each from the previous one's end, summing to the figure):
// death_reported (the fault to its agent's report written; a rank's only), report_taken or
// declared_beyond_bound (to the coordinator holding the replacement queued: a report read, or the
// host declared dead, past its bound), replacing (to the coordinator's loop turning to replace
// it), first_member_adopted and last_member_adopted (to the first and the last live member
// holding the new generation); besides, <fault>_publication_s (the coordinator's replacement and
// publication, which the members' adoption overlaps) and the store's requests and bytes from the
// fault to the recovery (<fault>_recovery_requests, _bytes).
// After each fault the simulator checks, and prints "correct: ..." or what is wrong: every live
// member holds the store's current generation and the rank the store's table gives it, no rank is
// held by two members and every rank by one, and the dead members' writes are refused (their
// heartbeat fails with FailedPrecondition: the generation's fence); after a host-wide fault, its
// agent, turned again, finds itself fenced out.
//
// Steady state (--steady_s, before the faults): the store's requests and the bytes its process
// received and sent per second, per rank and per host (the server's counters), the server
// process's CPU, the coordinating agent's thread's CPU per second (CLOCK_THREAD_CPUTIME_ID), both
// processes' resident memory, and the longest wait of a host for its agent thread's turn: near the
// host timeout, the simulator itself (this machine's CPU) loses hosts, and its figures are not the
// job's.
//
// A size the machine cannot hold (threads, file descriptors) is said and skipped. The exit status
// is 1 when any size failed to form, recover or pass its check.
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/hang_dumps.h"
#include "bench/scale_server.h"
#include "sdk/agent/failure_history.h"
#include "sdk/agent/renewal_policy.h"
#include "sdk/agent/replacement_policy.h"
#include "sdk/coordinator/fail_slow_coordinator.h"
#include "sdk/coordinator/hang_coordinator.h"
#include "sdk/coordinator/job_coordinator.h"
#include "sdk/coordinator/lease_keeper.h"
#include "sdk/coordinator/plan_publisher.h"
#include "sdk/coordinator/rank_watch.h"
#include "sdk/coordinator/standby_replacement.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/mutex.h"
#include "sdk/core/store_keys.h"
#include "sdk/health/fail_slow_metrics.h"
#include "sdk/host_agent/host_agent.h"
#include "sdk/host_agent/host_membership.h"
#include "sdk/host_agent/host_sampler.h"
#include "sdk/launch/launch_config.h"
#include "sdk/rendezvous/coordinator_lease.h"
#include "sdk/rendezvous/etcd_store.h"
#include "sdk/rendezvous/rendezvous.h"
#include "sdk/rendezvous/tcp_store.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/fake_process_supervisor.h"
#include "trainguard/clock.h"
#include "trainguard/options.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using bench::Connect;
using bench::ProcessUsage;
using bench::ServerProcess;
using testing::FakeProcessSupervisor;
using testing::FakeProcessSupervisorOptions;

constexpr int kDefaultRanksPerHost = 8;
// How long one store call of a member or a check may take, and a replacement's (as the launcher's
// kStoreTimeout).
constexpr absl::Duration kStoreTimeout = absl::Seconds(10);

struct Flags {
  std::vector<int> ranks = {8, 64, 512, 4096};
  int ranks_per_host = kDefaultRanksPerHost;  // --ranks_per_host: a host's ranks (and standbys)
  std::vector<std::string> faults = {"rank", "host", "partition", "hang", "slow", "coordinator"};
  absl::Duration host_timeout = absl::Seconds(2);
  absl::Duration heartbeat = absl::ZeroDuration();  // 0: RankHeartbeatInterval(ranks)
  absl::Duration steady = absl::Seconds(10);
  int agent_threads = 4;
  absl::Duration timeout = absl::Seconds(120);
  std::string json;
  // "tcp": the TcpStore server in a process of its own; "etcd": a 3-member etcd cluster on
  // loopback (tests/support/etcd_cluster.h), each member and agent an EtcdStore client.
  std::string store = "tcp";
  bool verbose = false;  // every line the agents and the coordinator say
  // The records of each rank's flight-recorder ring that its hang dump holds (a rank's default:
  // 4,096, Options::flight_recorder_records).
  int hang_records = 1024;
  // How long the hang's arbiter waits for the ranks' dumps before it diagnoses with those in
  // (HangArbiterOptions::dump_grace, 3 s). A rank writes its own in milliseconds; the simulator
  // stages every rank's before the declaration (HangScenario).
  absl::Duration hang_dump_grace = HangArbiterOptions{}.dump_grace;
  // What the fail-slow coordinator does with the slow host it names (--fail-slow).
  FailSlowPolicy fail_slow = FailSlowPolicy::kEvict;
};

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

int64_t ThreadCpuNanos() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

// What went wrong in a size that no single call returned: said at the end of the size, and fails
// it. Thread-safe.
class Problems {
 public:
  void Add(const std::string& what) {
    MutexLock lock(&mu_);
    if (problems_.size() < 20) problems_.push_back(what);
    ++count_;
  }
  std::vector<std::string> Take() {
    MutexLock lock(&mu_);
    return std::exchange(problems_, {});
  }
  int count() {
    MutexLock lock(&mu_);
    return count_;
  }

 private:
  Mutex mu_;
  std::vector<std::string> problems_ ABSL_GUARDED_BY(mu_);
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};

// A new connection to the job's store, as a rank's or an agent's (Flags::store).
using StoreConnector = std::function<absl::StatusOr<std::unique_ptr<Store>>()>;
// The connections an agent's TcpStore client holds (its turn, heartbeat and renewal share them);
// the first coordinator's holds the default cap's.
constexpr int kAgentStoreConnections = 1;

// The hang fault's shared state: each rank's dump, staged before the declaration (StageHangDumps),
// which its member publishes into the run dir when it sees the hang key (as a rank's
// HangResponder writes its own), and how many did.
//
// Staged, because this machine's two cores are not the job's 2,048 hosts: each rank of a real job
// writes its dump on its own host in milliseconds, while the simulator writing 16,384 of them at
// the declaration takes seconds of both cores beside the server, past the arbiter's dump grace.
// A member publishes its dump by renaming the staged dump, then its digest, into the run dir (two
// system calls, no descriptor held), so the diagnosis sees each dump appear as it would.
struct HangScenario {
  std::string dump_dir;                 // <run dir>/flight_recorder, as the launcher's
  std::string staged_dir;               // <run dir>/staged_dumps: each rank's, before the hang
  FlightRecorderContents waiting_ring;  // a rank waiting in the hung all_reduce
  FlightRecorderContents culprit_ring;  // the rank that never entered it
  bench::Stacks stacks;
  std::atomic<int> culprit{-1};  // the rank that stopped progressing
  // Each rank's staged dump's path (its digest beside it: HangDumpDigestPath) and the reason it
  // holds; written by StageHangDumps before the declaration, read by the members after it (the
  // store orders the two, which TSan does not see: hence the mutex).
  struct Staged {
    std::string path;
    std::string reason;
  };
  Mutex staged_mu;
  std::vector<Staged> staged ABSL_GUARDED_BY(staged_mu);
  std::atomic<int> dumps{0};  // dumps published (and failed) since the declaration
  std::atomic<int> dump_errors{0};
  std::atomic<int64_t> last_dump_ns{0};  // when the latest dump was published (Unix ns)
  Mutex first_error_mu;
  std::string first_error ABSL_GUARDED_BY(first_error_mu);  // of dump_errors
};

// What the hang and slow-host faults change in every member (Sim::faults).
struct SimFaults {
  std::unique_ptr<HangScenario> hang;  // null: no hang fault (the members watch no hang key)
  // The ranks write their work records (health/rank/<rank>) once a second, and the agents sample
  // them, as under `trainguard run --fail-slow` (the slow fault's).
  std::atomic<bool> work_records{false};
  // One host's ranks are slow (SimMember::Slow): every rank's step takes longer.
  std::atomic<bool> slowdown{false};
};

// How many members adopted each generation (SimMember::Adopt): AwaitConvergence scans the members
// only once enough of them adopted a newer one. A scan of 16,384 members (each one's lock) takes
// milliseconds of this machine's CPU: every 5 ms, it took 7 % of the machine's CPU in a run of
// 16,384 ranks, from the members and the server whose recovery it timed.
class Adoptions {
 public:
  void Add(int64_t generation) {
    MutexLock lock(&mu_);
    ++by_generation_[generation];
  }
  // Adoptions of generations after `after`: at least the live ranks, once they converged.
  int After(int64_t after) {
    MutexLock lock(&mu_);
    int n = 0;
    for (auto it = by_generation_.upper_bound(after); it != by_generation_.end(); ++it) {
      n += it->second;
    }
    return n;
  }

 private:
  Mutex mu_;
  std::map<int64_t, int> by_generation_ ABSL_GUARDED_BY(mu_);
};

// A simulated rank's step (work records): kStepCompute of computation, then its collective,
// kStepTransfer of transfer. A slow host computes kSlowdown longer; the others wait for it in the
// collective.
constexpr double kStepComputeNs = 7e6;
constexpr double kStepTransferNs = 3e6;
constexpr double kSlowdown = 0.3;
constexpr int64_t kStepBytes = 100 << 20;

// One simulated process of a host: a rank or a standby, on a thread of its own with its own store
// connection and its RendezvousMember (see the header comment for what it does).
class SimMember {
 public:
  struct Place {
    int64_t generation = -1;
    int rank = -1;
    absl::Time since = absl::InfinitePast();  // when it adopted `generation`
    bool replaced = false;                    // a newer generation gave its rank to another member
    absl::Status error;                       // what ended it otherwise (the store's error)
  };

  // `rank` -1: a standby. REQUIRES: `faults` and `adoptions` outlive the member.
  SimMember(std::string id, int rank, int world_size, SimFaults* faults, Adoptions* adoptions)
      : id_(std::move(id)),
        rank_(rank),
        world_size_(world_size),
        faults_(faults),
        adoptions_(adoptions) {}
  ~SimMember() { Stop(); }
  SimMember(const SimMember&) = delete;
  SimMember& operator=(const SimMember&) = delete;

  void Start(const StoreConnector& connect, const Flags& flags) {
    thread_ = std::thread([this, &connect, &flags] { Run(connect, flags); });
  }
  // The process died: the member stops beating and waiting, at once, without leaving.
  void Silence() { silenced_.store(true); }
  bool silenced() const { return silenced_.load(); }
  // A partition: the member makes no store call from its next one on (the store hears nothing of
  // it) until Heal, and then goes on as it was: its next heartbeat, or its wait for the next
  // generation, meets what the job did meanwhile (a fence, a table without it).
  void Partition() { partitioned_.store(true); }
  void Heal() { partitioned_.store(false); }
  bool cut_off() const { return partitioned_.load(); }
  // Whether its thread ended (replaced, or the store's error), and no longer holds a rank.
  bool ended() const { return ended_.load(); }
  // Ends its thread (the simulator's end): RequestStop, then Stop, which waits for it (up to a
  // heartbeat interval: its current wait), so that many members end together.
  void RequestStop() { stop_.store(true); }
  void Stop() {
    RequestStop();
    if (thread_.joinable()) thread_.join();
  }

  const std::string& id() const { return id_; }
  Place place() const {
    MutexLock lock(&mu_);
    return place_;
  }
  absl::Time joined() const {
    MutexLock lock(&mu_);
    return joined_;
  }
  // A write of this member after its thread ended (its heartbeat): the fence's answer.
  absl::Status Beat() {
    MutexLock lock(&mu_);
    if (member_ == nullptr) return absl::FailedPreconditionError("never connected");
    return member_->Beat(kStoreTimeout);
  }
  // The fault "its host is slow": its steps compute kSlowdown longer (its work records say so).
  void Slow(bool slow) { slow_.store(slow); }
  // The declaring rank's part of a hang (HangResponder::OnOwnHang): the hang key of `generation`,
  // then its own dump. Returns when the key was written (the declaration).
  absl::StatusOr<absl::Time> DeclareHang(int64_t generation, const std::string& report) {
    Store* store = connected_store();
    if (store == nullptr) return absl::FailedPreconditionError("never connected");
    const int rank = place().rank;
    dumped_generation_.store(generation);
    if (absl::Status s =
            store->Set(store_keys::Hang(generation),
                       store_keys::EncodeHangDeclaration({rank, report}), kStoreTimeout);
        !s.ok()) {
      return s;
    }
    const absl::Time declared = absl::Now();
    WriteHangDump(generation, rank, absl::StrCat("hang: ", report));
    return declared;
  }
  // The declaring rank aborts its communicators once its wait for the others' dumps ran out.
  absl::Status AbortHang(int64_t generation) {
    Store* store = connected_store();
    if (store == nullptr) return absl::FailedPreconditionError("never connected");
    const int rank = place().rank;
    return store->Set(store_keys::HangAborted(generation, rank), absl::StrCat("rank ", rank),
                      kStoreTimeout);
  }

 private:
  bool Ended() const { return stop_.load() || silenced_.load(); }

  void Adopt(const Membership& m) {
    {
      MutexLock lock(&mu_);
      place_.generation = m.generation;
      place_.rank = m.rank;
      place_.since = absl::Now();
    }
    adoptions_->Add(m.generation);
  }
  // As a rank announces its first step of a generation (RuntimeImpl::AnnounceResumed; the
  // coordinator's recovery ends once every rank did): once per generation, at the member's first
  // beat in it. A real rank takes that step only after rebuilding its communicators; announced at
  // the adoption instead, 16,384 members' announcements competed with the generation's own
  // fan-out on the store (docs/PERFORMANCE.md).
  void AnnounceFirstStep(const Membership& m) {
    if (announced_generation_ == m.generation) return;
    announced_generation_ = m.generation;
    (void)PublishResumed(store_.get(), m.generation, m.rank, 0, kStoreTimeout);
  }
  void End(absl::Status error, bool replaced) {
    MutexLock lock(&mu_);
    place_.error = std::move(error);
    place_.replaced = replaced;
    ended_.store(true);
  }
  // Waits out a partition (bounded polling of the simulator's own flag; the store is not asked).
  void WhilePartitioned() {
    while (partitioned_.load() && !Ended()) absl::SleepFor(absl::Milliseconds(10));
  }

  Store* connected_store() {
    MutexLock lock(&mu_);
    return member_ != nullptr ? store_.get() : nullptr;  // store_ is set before member_
  }

  // Waits up to `timeout` for a generation after m's; with a hang fault, for m's generation's hang
  // key too (as a rank's GenerationWatcher) until it appeared, and dumps then (as its
  // HangResponder). Whether a newer generation's table exists.
  absl::StatusOr<bool> AwaitNewer(RendezvousMember* member, const Membership& m,
                                  absl::Duration timeout) {
    if (faults_->hang == nullptr || hang_seen_ == m.generation) {
      return member->AwaitNewerGeneration(timeout);
    }
    absl::StatusOr<RendezvousMember::NewerGenerationOrKey> seen =
        member->AwaitNewerGenerationOr({store_keys::Hang(m.generation)}, timeout);
    if (!seen.ok()) return seen.status();
    if (seen->key.has_value()) {
      hang_seen_ = m.generation;
      if (dumped_generation_.exchange(m.generation) != m.generation) {
        const absl::StatusOr<std::string> declaration =
            store_->Get(store_keys::Hang(m.generation), kStoreTimeout);
        WriteHangDump(m.generation, m.rank,
                      absl::StrCat("a peer declared a hang: ", declaration.value_or("?")));
      }
    }
    return seen->superseded;
  }

  // This rank's dump of `generation`'s hang, as the Runtime writes it (bench/hang_dumps.h),
  // staged before the declaration (HangScenario): published now into the run dir, the dump
  // first, then its digest, as WriteHangDump writes them. An error when none was staged for this
  // rank, or for another reason than the one it declares or read.
  void WriteHangDump(int64_t generation, int rank, const std::string& reason) {
    HangScenario& hang = *faults_->hang;
    HangScenario::Staged staged;
    {
      MutexLock lock(&hang.staged_mu);
      if (rank >= 0 && rank < static_cast<int>(hang.staged.size())) staged = hang.staged[rank];
    }
    absl::Status published;
    if (staged.path.empty()) {
      published = absl::NotFoundError(absl::StrCat("no dump staged for rank ", rank));
    } else if (staged.reason != reason) {
      published = absl::FailedPreconditionError(
          absl::StrCat("rank ", rank, " dumps '", reason, "' of generation ", generation,
                       ", its staged dump says '", staged.reason, "'"));
    } else {
      const std::string& path = staged.path;
      const std::string name = std::filesystem::path(path).filename().string();
      const std::string to = absl::StrCat(hang.dump_dir, "/", name);
      published = Env::Default()->RenameFile(path, to);
      if (published.ok()) {
        published = Env::Default()->RenameFile(HangDumpDigestPath(path), HangDumpDigestPath(to));
      }
    }
    if (!published.ok()) {
      if (hang.dump_errors++ == 0) {
        MutexLock lock(&hang.first_error_mu);
        hang.first_error = published.ToString();
      }
    }
    ++hang.dumps;
    const int64_t now = absl::ToUnixNanos(absl::Now());
    int64_t last = hang.last_dump_ns.load();
    while (last < now && !hang.last_dump_ns.compare_exchange_weak(last, now)) {
    }
  }

  // Its work record (health/rank/<rank>), as its Runtime writes it once a second under
  // --fail-slow: the steps since the last, each kStepComputeNs of computation and kStepTransferNs
  // of transfer; while a host is slow, every step is as long as its (the job is synchronous): its
  // ranks compute longer, the others wait longer in their collectives.
  void WriteWorkRecord(int rank) {
    const absl::Time now = absl::Now();
    if (work_since_ != absl::InfinitePast()) {
      const double elapsed_ns = absl::ToDoubleNanoseconds(now - work_since_);
      const bool slowed = faults_->slowdown.load();
      const double step_ns = kStepComputeNs * (slowed ? 1 + kSlowdown : 1) + kStepTransferNs;
      const double collective_ns = slow_.load() ? kStepTransferNs : step_ns - kStepComputeNs;
      const double steps = elapsed_ns / step_ns;
      work_steps_ += steps;
      work_.steps = static_cast<int64_t>(work_steps_);
      work_.step_ns += static_cast<int64_t>(elapsed_ns);
      work_.collective_ns += static_cast<int64_t>(steps * collective_ns);
      work_.collective_bytes += static_cast<int64_t>(steps * kStepBytes);
    }
    work_since_ = now;
    (void)store_->Set(RankWorkKey(rank), EncodeRankWorkRecord(work_), kStoreTimeout);
  }

  void Run(const StoreConnector& connect, const Flags& flags) {
    // The rank's heartbeat period: --heartbeat_ms, or by default the library's for this job's size.
    const absl::Duration heartbeat = flags.heartbeat > absl::ZeroDuration()
                                         ? flags.heartbeat
                                         : RankHeartbeatInterval(world_size_);
    absl::StatusOr<std::unique_ptr<Store>> store = connect();
    if (!store.ok()) return End(store.status(), false);
    store_ = *std::move(store);
    RendezvousMember* member = nullptr;
    {
      MutexLock lock(&mu_);
      // A parked standby beats on a thread of its own (few of them); a rank between its waits.
      member_ = std::make_unique<RendezvousMember>(
          store_.get(), id_, rank_ < 0 ? heartbeat : absl::InfiniteDuration());
      member = member_.get();
      joined_ = absl::Now();
    }
    absl::StatusOr<Membership> m = absl::UnavailableError("not joined");
    if (rank_ < 0) {
      // Parked in slices, so that the simulator's end does not wait for the whole timeout.
      do {
        m = member->ParkAsStandby(absl::Seconds(1));
      } while (!Ended() && absl::IsDeadlineExceeded(m.status()));
    } else {
      m = member->JoinInitial(rank_, world_size_, flags.timeout);
    }
    if (!m.ok()) return End(m.status(), false);
    Adopt(*m);
    // The member beats on a grid of its own, at a phase drawn from its id, as a rank's heartbeat
    // thread does from its process's start (the ranks of a job start over seconds): each wait for
    // the next generation ends at the member's next beat, whatever the instant it adopted its
    // generation. Waits that all began at one adoption would end, and beat, in one burst a second.
    const absl::Duration phase =
        heartbeat * static_cast<double>(std::hash<std::string>{}(id_) % 1000) / 1000.0;
    auto next_beat_after = [&](absl::Time t) {
      return t + heartbeat - (t - absl::UnixEpoch() + phase) % heartbeat;
    };
    absl::Time next_beat = next_beat_after(absl::Now());
    while (!Ended()) {
      WhilePartitioned();
      if (Ended()) return;
      absl::StatusOr<bool> newer =
          AwaitNewer(member, *m, std::max(next_beat - absl::Now(), absl::ZeroDuration()));
      WhilePartitioned();
      if (Ended()) return;
      if ((newer.ok() && *newer) || member->superseded()) {
        absl::StatusOr<Membership> next = member->AwaitGeneration(m->generation, flags.timeout);
        if (absl::IsFailedPrecondition(next.status())) return End(next.status(), true);
        if (!next.ok()) return End(next.status(), false);
        m = next;
        Adopt(*m);
        continue;
      }
      AnnounceFirstStep(*m);
      if (faults_->work_records.load()) WriteWorkRecord(m->rank);
      (void)member->Beat(heartbeat);
      // The next grid point: a wait that ended a little early beats once, not twice.
      next_beat += heartbeat;
      if (const absl::Time now = absl::Now(); next_beat <= now) next_beat = next_beat_after(now);
    }
  }

  const std::string id_;
  const int rank_;
  const int world_size_;
  SimFaults* const faults_;
  Adoptions* const adoptions_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> slow_{false};
  std::atomic<int64_t> dumped_generation_{-1};  // the generation whose hang it dumped
  int64_t hang_seen_ = -1;                      // the thread's: the hang key it saw
  int64_t announced_generation_ = -1;           // the thread's: its last first step announced
  RankWorkRecord work_;                         // the thread's: its work so far
  double work_steps_ = 0;
  absl::Time work_since_ = absl::InfinitePast();
  std::atomic<bool> silenced_{false};
  std::atomic<bool> partitioned_{false};
  std::atomic<bool> ended_{false};
  std::unique_ptr<Store> store_;  // the thread's; kept for Beat after it ended
  mutable Mutex mu_;
  std::unique_ptr<RendezvousMember> member_ ABSL_GUARDED_BY(mu_);
  absl::Time joined_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  Place place_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// What a whole size shares: the store's address, the flags, the members and the problems.
struct Sim {
  const Flags* flags = nullptr;
  StoreConnector connect;
  // An agent's, as the launcher's: a control connection (TcpStoreOptions::control), capped at
  // kAgentStoreConnections; the coordinating host's, a control connection with the default cap.
  StoreConnector connect_agent;
  StoreConnector connect_coordinator;
  std::string store_url;  // as an agent is given it (HostAgentOptions::store_url)
  int ranks = 0;
  int training_hosts = 0;
  int standby_hosts = 0;
  // Whether each agent beats and renews on threads of its own (see the header comment).
  bool agent_beat_threads = true;
  std::string run_dir;  // the hang dumps' and fail-slow dumps' (removed at the size's end)
  SimFaults faults;
  Adoptions adoptions;
  // What the coordinator named: a hang's suspects ("suspects: ..." and when), and each host the
  // fail-slow detector named (its verdict's action, and when).
  struct Named {
    std::string what;
    std::string action;
    absl::Time when;
  };
  Mutex named_mu;
  std::vector<Named> hang_named ABSL_GUARDED_BY(named_mu);
  std::vector<Named> slow_named ABSL_GUARDED_BY(named_mu);
  // The fail-slow coordinator's Poll: its thread's CPU and its calls, summed.
  std::atomic<int64_t> fail_slow_cpu_ns{0};
  std::atomic<int64_t> fail_slow_polls{0};
  Problems problems;
  // The newest takeover of the coordinator's lease by another host than the first (Unix ns; 0:
  // none), and by which host.
  std::atomic<int64_t> took_over_ns{0};
  Mutex took_over_mu;
  std::string took_over_by ABSL_GUARDED_BY(took_over_mu);
  Mutex members_mu;
  // Every member started, by member id.
  std::map<std::string, std::unique_ptr<SimMember>> members ABSL_GUARDED_BY(members_mu);
  std::atomic<bool> stop{false};

  SimMember* AddMember(const std::string& id, int rank) {
    auto member = std::make_unique<SimMember>(id, rank, ranks, &faults, &adoptions);
    SimMember* raw = member.get();
    {
      MutexLock lock(&members_mu);
      members[id] = std::move(member);
    }
    raw->Start(connect, *flags);
    return raw;
  }
  std::vector<SimMember*> AllMembers() {
    MutexLock lock(&members_mu);
    std::vector<SimMember*> all;
    all.reserve(members.size());
    for (auto& [id, m] : members) all.push_back(m.get());
    return all;
  }
  // The newest generation a live member holds (-1: none).
  int64_t NewestHeldGeneration() {
    int64_t newest = -1;
    for (SimMember* m : AllMembers()) {
      if (!m->silenced()) newest = std::max(newest, m->place().generation);
    }
    return newest;
  }
};

// What a host sampler reads of the ranks' processes from /proc: nothing, for simulated ones (a
// sample holds their work records only).
class SimulatedProcesses final : public ProcessProbe {
 public:
  int64_t CpuTicks(pid_t) override { return -1; }
  double TicksPerSecond() override { return 100; }
  int64_t RunDelayNs(pid_t) override { return -1; }
  std::optional<TcpSocketTotals> TcpTotals(pid_t) override { return std::nullopt; }
};

// The coordinator's share of `trainguard run`, on the host that holds the lease: the objects
// Job::CreateJobCoordinator, CreateRecoveryStrategy, CreateRankWatch and CreatePlanPublisher make,
// with hooks that say into the simulator's log and record nothing.
struct CoordinatorParts {
  explicit CoordinatorParts(RenewalPolicyOptions renewal) : renewal_policy(renewal) {}

  // The simulator injects a fault after another into one job: a host's loss alone replaces 8
  // ranks, past --max-replacements' default (10), which bounds a crash loop, not these.
  static ReplacementPolicyOptions Replacements() {
    ReplacementPolicyOptions options;
    options.max_replacements = 1000;
    return options;
  }
  ReplacementPolicy replacement_policy{Replacements()};
  RenewalPolicy renewal_policy;
  FailureHistory failures;
  std::unique_ptr<JobCoordinator> job;
  std::unique_ptr<StandbyReplacement> recovery;
  std::unique_ptr<RankWatch> rank_watch;
  std::unique_ptr<PlanPublisher> plan;
  // With the hang fault: Job::CreateHangCoordinator's. With the slow fault, once it starts:
  // Job::DetectFailSlow's.
  std::unique_ptr<HangCoordinator> hang;
  std::unique_ptr<FailSlowCoordinator> fail_slow;
  // Generation 0's formation (Job::StartForming), on a thread of its own.
  std::thread former;
  std::atomic<bool> formed{false};
  absl::Time next_persist_check = absl::InfinitePast();
};

// One host: its agent, as `trainguard run --nnodes` wires it (Job::CreateHostAgent,
// CreateHostMembership, CreateLeaseKeeper), on a store connection of its own.
class SimHost {
 public:
  SimHost(Sim* sim, std::string host_id, bool standby_host, bool coordinator,
          FakeProcessSupervisor* supervisor)
      : sim_(sim),
        host_id_(std::move(host_id)),
        standby_host_(standby_host),
        coordinator_host_(coordinator),
        supervisor_(supervisor) {}
  ~SimHost() {
    StopAgentThreads();
    if (parts_ != nullptr && parts_->former.joinable()) parts_->former.join();
  }

  absl::Status Create() {
    const Flags& flags = *sim_->flags;
    const absl::Duration call_timeout = flags.host_timeout / 4;  // AgentCallTimeout
    // The first coordinator's client as the launcher's (its default cap): its chain of calls (the
    // publication) does not queue behind its heartbeat and renewal.
    absl::StatusOr<std::unique_ptr<Store>> store =
        coordinator_host_ ? sim_->connect_coordinator() : sim_->connect_agent();
    if (!store.ok()) return store.status();
    // As the launcher's agent: every part reads the store through the turn's one read.
    auto turn_reads = std::make_unique<TurnReadStore>(*std::move(store));
    turn_reads_ = turn_reads.get();
    store_ = std::move(turn_reads);
    lease_ = std::make_unique<CoordinatorLease>(store_.get(), host_id_, flags.host_timeout,
                                                Clock::Real(), call_timeout);
    rendezvous_ = std::make_unique<RendezvousCoordinator>(store_.get(), Clock::Real(), host_id_,
                                                          lease_.get());
    follower_ = std::make_unique<GenerationFollower>(store_.get());
    if (coordinator_host_) CreateCoordinatorParts(call_timeout);

    LeaseKeeper::Hooks lease_hooks;
    lease_hooks.say = [this](const std::string& line) { Say(line); };
    lease_hooks.resume = [this] { return rendezvous_->Resume(kStoreTimeout); };
    lease_hooks.generation = [this] { return rendezvous_->generation(); };
    lease_hooks.took_over = [this, call_timeout] {
      // As every launcher's agent holds the coordinator's parts from its start (Job::Run), made
      // here only when needed: thousands of idle copies would be the simulator's memory, not the
      // job's.
      if (parts_ == nullptr) {
        if (!spawned_) {
          sim_->problems.Add(
              absl::StrCat("host ", host_id_, " took the coordinator lease over before the plan"));
          return;
        }
        CreateCoordinatorParts(call_timeout);
        parts_->job->set_world_size(world_size_);
        parts_->rank_watch->set_world_size(world_size_);
        if (parts_->hang != nullptr) parts_->hang->set_world_size(world_size_);
        parts_->formed.store(true);  // generation 0 is the first coordinator's
      }
      // As the launcher: the hangs of earlier generations were the previous coordinator's.
      if (parts_->hang != nullptr) parts_->hang->Reset(rendezvous_->generation());
      parts_->job->TakeOver(kStoreTimeout);
      if (!coordinator_host_) {
        MutexLock lock(&sim_->took_over_mu);
        sim_->took_over_by = host_id_;
        sim_->took_over_ns.store(absl::ToUnixNanos(absl::Now()));
      }
    };
    lease_hooks.deposed = [this] {
      if (parts_ != nullptr) parts_->job->Depose();
    };
    const absl::Duration loop_stall_bound = std::max(absl::Seconds(30), 10 * flags.host_timeout);
    lease_keeper_ =
        std::make_unique<LeaseKeeper>(lease_.get(), call_timeout, lease_hooks, loop_stall_bound);

    HostAgentOptions options;
    options.host_id = host_id_;
    options.call_timeout = call_timeout;
    options.report_timeout = kStoreTimeout;
    options.store_url = sim_->store_url;
    options.store_loss_bound = loop_stall_bound;
    options.loop_stall_bound = loop_stall_bound;
    options.ranks_per_host = sim_->flags->ranks_per_host;
    HostAgent::Hooks hooks;
    hooks.workers = [this] {
      std::vector<HostWorker*> workers;
      for (auto& w : workers_) workers.push_back(w.get());
      return workers;
    };
    hooks.say = [this](const std::string& line) { Say(line); };
    hooks.record = [](int, EventKind, const std::string&, HostAgent::Attributes) {};
    hooks.latest_term = [this] { return lease_->latest_term(); };
    hooks.pid_file = [this](int rank) { return absl::StrCat("/sim/", host_id_, "/rank-", rank); };
    hooks.rank_taken = [](HostWorker&) {};  // a standby host starts no spare in its place
    agent_ = std::make_unique<HostAgent>(store_.get(), Clock::Real(), supervisor_, options, hooks);

    StoreHostMembershipOptions membership;
    membership.host_id = host_id_;
    membership.standby_host = standby_host_;
    membership.local_addr = "127.0.0.1";
    membership.master_port = 29500;
    membership.job_id = bench::kScaleJob;
    membership.join_timeout = kStoreTimeout;
    membership.tick_interval = flags.host_timeout / 12;
    StoreHostMembership::Hooks membership_hooks;
    membership_hooks.fail = [this](const std::string& why) {
      sim_->problems.Add(absl::StrCat("host ", host_id_, " failed the job: ", why));
    };
    membership_hooks.ended = [this] { return ended_.has_value(); };
    membership_hooks.update_lease = [this] { lease_keeper_->Update(); };
    membership_hooks.release_lease = [this] { lease_keeper_->Release(absl::Seconds(1)); };
    membership_hooks.follow = [this] {
      if (!spawned_) SpawnPlanned();
      if (!ended_.has_value()) FollowGeneration();
    };
    membership_hooks.coordinate = [this] {
      if (parts_ != nullptr && coordinating()) CoordinateHosts();
      // As the launcher's --fail-slow (Job::SampleHost, DetectFailSlow), while the slow fault runs.
      if (sim_->faults.work_records.load()) {
        SampleHost();
        if (parts_ != nullptr && parts_->formed.load() && coordinating()) DetectFailSlow();
      }
    };
    membership_hooks.start_planned = [] { return absl::OkStatus(); };  // no --restart-all
    membership_hooks.turn_keys = [this] {
      return AgentTurnKeys(host_id_, spawned_, /*ranks_on_agents_store=*/true,
                           /*restart_all=*/false);
    };
    membership.call_timeout = call_timeout;
    membership_ = std::make_unique<StoreHostMembership>(store_.get(), Clock::Real(), agent_.get(),
                                                        turn_reads_, membership, membership_hooks);
    if (absl::Status s = membership_->Join(); !s.ok()) return s;
    // As the launcher: the heartbeat and the lease's renewal on threads of their own, so that a
    // host whose agent thread is slow to turn it is not declared dead for it (else in its turns).
    if (sim_->agent_beat_threads) {
      agent_->StartBeating(flags.host_timeout / 12);
      lease_keeper_->StartRenewing(flags.host_timeout / 12);
    }
    return absl::OkStatus();
  }

  // This host's agent process dies: its heartbeat and renewal threads stop with it (its loop is
  // stopped by its agent thread: AgentThread::Forget). On this host's agent thread.
  void StopAgentThreads() {
    if (lease_keeper_ != nullptr) lease_keeper_->StopRenewing();
    if (agent_ != nullptr) agent_->StopBeating();
  }

  // One turn of this host's part of the launcher's loop (Job::Run): the membership's tick, then,
  // on the coordinating host, the coordinator's acts in the loop's order.
  void Turn() {
    if (ended_.has_value()) return;
    absl::Time step_start = absl::Now();
    // The coordinating host's steps, each timed (the longest since ResetPhases: StepTimes).
    auto timed = [&](Step step) {
      if (parts_ == nullptr) return;
      const absl::Time now = absl::Now();
      const int64_t took = absl::ToInt64Nanoseconds(now - step_start);
      if (took > longest_step_ns_[step].load()) longest_step_ns_[step].store(took);
      step_start = now;
    };
    std::optional<AgentExit> end = membership_->Tick();
    timed(kTickStep);
    if (end.has_value()) {
      ended_ = end;
      if (end->code != 0 && !may_be_evicted_.load()) {
        sim_->problems.Add(absl::StrCat("host ", host_id_, " ended: ", end->failure));
      }
      return;
    }
    if (parts_ == nullptr || !parts_->formed.load()) return;
    CoordinatorParts& p = *parts_;
    // As the launcher's loop: the agents' death reports and the hosts near their bound at every
    // turn, not only at the tick.
    step_start = absl::Now();
    if (coordinating()) p.job->CoordinateBetweenTicks();
    timed(kBetweenTicksStep);
    StampCoordinatorPhases(/*replacing=*/true);
    p.recovery->Coordinate(absl::Now());
    StampCoordinatorPhases(/*replacing=*/false);
    timed(kReplaceStep);
    if (coordinating()) p.rank_watch->CheckRecoveries(p.job->recoveries());
    if (p.job->replacements().empty() && coordinating())
      p.rank_watch->KillRanksWithStaleHeartbeats();
    timed(kRankHeartbeatsStep);
    if (coordinating()) p.rank_watch->KillMembersStoppedInFormation();
    if (coordinating() && p.hang != nullptr) p.hang->Poll();
    if (coordinating()) p.job->RenewGenerationWhenAsked({});
    if (coordinating() && absl::Now() >= p.next_persist_check) {
      p.next_persist_check = absl::Now() + absl::Milliseconds(500);
      p.rank_watch->ReportPersistFailures();
      p.rank_watch->ReportProtection();
    }
    timed(kOtherStep);
  }

  // The steps of the coordinating host's turn: the agent's tick (its heartbeat, fence, plan,
  // generation, kill requests and the hosts' liveness and reports: CoordinateHosts), the turn's
  // death reports and hosts near their bound (CoordinateBetweenTicks), the replacements (and their
  // publication), the rank heartbeats' check (with the recoveries' end), and the rest.
  enum Step { kTickStep, kBetweenTicksStep, kReplaceStep, kRankHeartbeatsStep, kOtherStep, kSteps };
  static constexpr const char* kStepNames[kSteps] = {"tick", "between_ticks", "replace",
                                                     "rank_heartbeats", "other"};
  // The longest each step took since ResetPhases, in seconds.
  std::vector<double> LongestSteps() const {
    std::vector<double> steps;
    for (const auto& ns : longest_step_ns_) steps.push_back(static_cast<double>(ns.load()) / 1e9);
    return steps;
  }

  // A worker of this host exited (the fake supervisor's event): its member is silent, and a rank's
  // death is reported to the coordinator (Job::OnExit).
  void OnExit(WorkerId id, const WorkerExit& exit) {
    for (auto& w : workers_) {
      if (w->worker != id) continue;
      w->running = false;
      if (SimMember* m = MemberOf(*w); m != nullptr) m->Silence();
      if (w->rank >= 0 && !ended_.has_value()) {
        agent_->ReportDeath(*w, exit.Describe());
        death_reported_ns_.store(absl::ToUnixNanos(absl::Now()));
      }
    }
  }

  // The fault "a rank's process dies": its member goes silent and its worker exits with status 1.
  // Returns the member, nullptr when this host holds no running rank.
  SimMember* KillOneRank() {
    for (auto& w : workers_) {
      if (w->rank < 0 || !w->running) continue;
      SimMember* m = MemberOf(*w);
      m->Silence();
      supervisor_->Exit(w->worker, WorkerExit::Exited(1));
      return m;
    }
    return nullptr;
  }
  // The fault "the host dies": the caller stops turning it; its members go silent at once.
  std::vector<SimMember*> SilenceEveryMember() {
    std::vector<SimMember*> silenced;
    for (auto& w : workers_) {
      if (SimMember* m = MemberOf(*w); m != nullptr && !m->silenced()) {
        m->Silence();
        silenced.push_back(m);
      }
    }
    return silenced;
  }
  // The fault "the host is cut off": its agent stops turning (the caller's) and its members make no
  // store call until HealEveryMember. Returns them.
  std::vector<SimMember*> PartitionEveryMember() {
    std::vector<SimMember*> cut;
    for (auto& w : workers_) {
      if (SimMember* m = MemberOf(*w); m != nullptr && !m->silenced()) {
        m->Partition();
        cut.push_back(m);
      }
    }
    return cut;
  }
  // The fault "this host is slow": its running ranks' steps compute longer from now on, and its
  // agent ending fenced out (evicted) is no problem. Returns its members.
  std::vector<SimMember*> SlowEveryMember() {
    may_be_evicted_.store(true);
    std::vector<SimMember*> slowed;
    for (auto& w : workers_) {
      if (SimMember* m = MemberOf(*w); m != nullptr && w->rank >= 0 && !m->silenced()) {
        m->Slow(true);
        slowed.push_back(m);
      }
    }
    return slowed;
  }
  // For the check after a host's death: this agent, turned once more, finds itself fenced out.
  std::optional<AgentExit> CheckFenced() { return agent_->CheckFenced(); }

  bool coordinating() { return lease_keeper_->Coordinating(); }
  const std::string& host_id() const { return host_id_; }
  bool standby_host() const { return standby_host_; }
  bool spawned() const { return spawned_; }
  // The newest generation its agent followed (-1: none yet).
  int64_t followed_generation() const { return followed_generation_.load(); }
  // When its agent's heartbeat was last taken by the store (Unix ns; its agent's creation before
  // its first beat; 0 before Create).
  int64_t last_beat_ns() const {
    return agent_ != nullptr ? absl::ToUnixNanos(agent_->last_beat_taken()) : 0;
  }
  CoordinatorParts* parts() { return parts_.get(); }
  RendezvousCoordinator* rendezvous() { return rendezvous_.get(); }

  // The phases of a recovery as this host saw them (Unix ns; 0: not yet), for the figures: when its
  // agent's report of a rank's death was written (ReportDeath returned), and on the coordinating
  // host, since the last ResetPhases, when the coordinator first held a replacement queued (a
  // reported death taken, or a host declared dead), when its loop first turned to replace it
  // (StandbyReplacement::Coordinate) and when that returned with a newer generation than the one it
  // held at ResetPhases (published: the members may hold it before, since the coordinator's last
  // writes, the fence and rdzv/current, follow the changes they read). REQUIRES: ResetPhases on
  // this host's agent thread, and the stamps read once a task of that thread ran after the
  // publication.
  void ResetPhases() {
    death_reported_ns_.store(0);
    queued_ns_.store(0);
    replacing_ns_.store(0);
    published_ns_.store(0);
    for (auto& ns : longest_step_ns_) ns.store(0);
    phases_generation_ = rendezvous_->generation();
  }
  int64_t death_reported_ns() const { return death_reported_ns_.load(); }
  int64_t queued_ns() const { return queued_ns_.load(); }
  int64_t replacing_ns() const { return replacing_ns_.load(); }
  int64_t published_ns() const { return published_ns_.load(); }

 private:
  void Say(const std::string& line) {
    if (sim_->flags->verbose) std::printf("%s: %s\n", host_id_.c_str(), line.c_str());
  }

  // See ResetPhases: read between the coordinator's steps of a turn, so that a death taken and
  // replaced in one turn gets both instants.
  void StampCoordinatorPhases(bool replacing) {
    const int64_t now = absl::ToUnixNanos(absl::Now());
    const bool queued = !parts_->job->replacements().empty();
    if (queued_ns_.load() == 0 && queued) queued_ns_.store(now);
    if (replacing && replacing_ns_.load() == 0 && queued) replacing_ns_.store(now);
    if (!replacing && published_ns_.load() == 0 && rendezvous_->generation() > phases_generation_) {
      published_ns_.store(now);
    }
  }

  SimMember* MemberOf(const HostWorker& w) {
    auto it = members_.find(w.member_id);
    return it == members_.end() ? nullptr : it->second;
  }

  void CreateCoordinatorParts(absl::Duration call_timeout) {
    const Flags& flags = *sim_->flags;
    RenewalPolicyOptions renewal;
    renewal.multi_host = true;
    renewal.host_timeout = flags.host_timeout;
    parts_ = std::make_unique<CoordinatorParts>(renewal);
    CoordinatorParts& p = *parts_;

    JobCoordinatorOptions options;
    options.host_id = host_id_;
    options.host_timeout = flags.host_timeout;
    options.call_timeout = call_timeout;
    options.standby_wait = 2 * flags.host_timeout + absl::Seconds(10);
    options.replace_timeout = kStoreTimeout;
    JobCoordinator::Hooks hooks;
    hooks.coordinating = [this] { return coordinating(); };
    hooks.say = [this](const std::string& line) { Say(line); };
    hooks.record = [](int, EventKind, const std::string&, JobCoordinator::Attributes) {};
    hooks.fail = [this](const std::string& why) {
      sim_->problems.Add(absl::StrCat("the coordinator failed the job: ", why));
    };
    // As the launcher's PreferredStandbys without peer backups: a dead host's ranks go together to
    // one standby host's standbys.
    hooks.preferred_standbys = [this, call_timeout](const std::string& dead_host,
                                                    const std::vector<int>& ranks) {
      absl::StatusOr<std::vector<std::string>> parked = rendezvous_->ParkedStandbys(call_timeout);
      if (!parked.ok()) return std::vector<std::string>{};
      return ChooseStandbys(*parked, parts_->job->dead_hosts(), dead_host, ranks.size(), {});
    };
    hooks.standby_starting = [] { return false; };
    hooks.rank_taken = [](int, const std::string&, int64_t) {};  // the member's agent relabels it
    p.job = std::make_unique<JobCoordinator>(store_.get(), Clock::Real(), rendezvous_.get(),
                                             &p.replacement_policy, &p.renewal_policy, &p.failures,
                                             options, hooks);
    StandbyReplacement::Hooks recovery_hooks;
    recovery_hooks.say = [this](const std::string& line) { Say(line); };
    recovery_hooks.fail = hooks.fail;
    p.recovery =
        std::make_unique<StandbyReplacement>(&p.replacement_policy, p.job.get(), recovery_hooks);
    p.job->set_recovery_strategy(p.recovery.get());

    RankWatchOptions watch;
    watch.host_timeout = flags.host_timeout;
    watch.store_timeout = kStoreTimeout;
    RankWatch::Hooks watch_hooks;
    watch_hooks.coordinating = hooks.coordinating;
    watch_hooks.say = hooks.say;
    watch_hooks.record = [](int, EventKind, const std::string&, RankWatch::Attributes) {};
    // A kill request to the member's agent, fenced by the lease term (Job::KillMember).
    watch_hooks.kill_member = [this, call_timeout](const std::string& member, EventKind what,
                                                   const std::string& why) {
      if (!coordinating()) return;
      sim_->problems.Add(absl::StrCat("the coordinator kills ", member, ": ", why));
      (void)RequestKill(store_.get(), store_keys::MemberHost(member), member,
                        {lease_->term(), std::string(EventKindName(what)), why}, call_timeout);
    };
    watch_hooks.report_laggards = [] {};
    watch_hooks.quiet_hosts = [this, &flags] {
      return parts_->job->QuietHosts(flags.host_timeout / 3, absl::Now());
    };
    watch_hooks.kill_and_replace = [this](int, const std::string& member, EventKind what,
                                          const std::string& why) {
      sim_->problems.Add(absl::StrCat("the coordinator kills ", member, " (",
                                      std::string(EventKindName(what)), "): ", why));
    };
    p.rank_watch = std::make_unique<RankWatch>(store_.get(), store_.get(), Clock::Real(),
                                               rendezvous_.get(), watch, watch_hooks);

    PlanOptions plan;
    plan.nnodes_min = sim_->training_hosts;
    plan.nnodes_max = sim_->training_hosts;
    plan.standby_nodes = sim_->standby_hosts;
    plan.ranks_per_host = sim_->flags->ranks_per_host;
    plan.call_timeout = call_timeout;
    PlanPublisher::Hooks plan_hooks;
    plan_hooks.coordinating = hooks.coordinating;
    plan_hooks.say = hooks.say;
    plan_hooks.backup_lines = [](int) {
      return absl::StatusOr<std::vector<std::string>>(std::vector<std::string>{});
    };
    plan_hooks.fail = hooks.fail;
    p.plan = std::make_unique<PlanPublisher>(store_.get(), Clock::Real(), plan, plan_hooks);
    if (sim_->faults.hang != nullptr) CreateHangCoordinator();
  }

  // Job::CreateHangCoordinator on several hosts: every rank is seen through the store (no local
  // holder), a suspect is killed through its agent (RequestKill, fenced by the lease term), and no
  // flight-recorder segment of another host can be read (no live rings).
  void CreateHangCoordinator() {
    const Flags& flags = *sim_->flags;
    HangCoordinatorOptions options;
    options.dump_dir = sim_->faults.hang->dump_dir;
    options.host_quiet = flags.host_timeout / 3;
    options.max_hold_off = 2 * flags.host_timeout;
    options.store_timeout = kStoreTimeout;
    options.arbiter.dump_grace = flags.hang_dump_grace;
    HangCoordinator::Hooks hooks;
    hooks.coordinating = [this] { return coordinating(); };
    hooks.say = [this](const std::string& line) {
      Say(line);
      constexpr absl::string_view kSuspects = "hang diagnosis: suspects: ";
      if (absl::StartsWith(line, kSuspects)) {
        MutexLock lock(&sim_->named_mu);
        // "suspects: rank R[, ...]"
        sim_->hang_named.push_back(
            {line.substr(std::string_view("hang diagnosis: ").size()), "", absl::Now()});
      }
    };
    hooks.ranks_store = [this] { return store_.get(); };
    hooks.rendezvous = [this] { return rendezvous_.get(); };
    hooks.restarted_at = [] { return absl::InfinitePast(); };
    hooks.live_rings = [] { return std::map<int, FlightRecorderContents>(); };
    hooks.kill_member = [this](const std::string& member, EventKind what, const std::string& why) {
      if (!coordinating()) return;
      (void)RequestKill(store_.get(), store_keys::MemberHost(member), member,
                        {lease_->term(), std::string(EventKindName(what)), why},
                        flags_call_timeout());
    };
    hooks.kill_and_replace_stopped = [this](int, const std::string& member, EventKind,
                                            const std::string& why) {
      sim_->problems.Add(absl::StrCat("the hang coordinator replaces ", member,
                                      ", stopped (no simulated member stops): ", why));
    };
    parts_->hang = std::make_unique<HangCoordinator>(store_.get(), Clock::Real(), Env::Default(),
                                                     parts_->job.get(), options, std::move(hooks));
    parts_->hang->set_world_size(world_size_);
  }
  absl::Duration flags_call_timeout() const { return sim_->flags->host_timeout / 4; }

  // Job::SampleHost: this host's sample of its ranks' work records, published once a second.
  void SampleHost() {
    if (!spawned_ || ended_.has_value()) return;
    if (sampler_ == nullptr) {
      sampler_ = std::make_unique<HostSampler>(nullptr, std::nullopt,
                                               std::make_unique<SimulatedProcesses>());
    }
    agent_->PublishHostSample(*sampler_, sim_->flags->ranks_per_host);
  }

  // Job::DetectFailSlow: the detector on the coordinating host (made at its first call), its
  // Poll's CPU counted (the detector's cost).
  void DetectFailSlow() {
    const Flags& flags = *sim_->flags;
    CoordinatorParts& p = *parts_;
    if (p.fail_slow == nullptr) {
      FailSlowCoordinatorOptions options;
      options.policy = flags.fail_slow;
      const LaunchConfig defaults;
      options.detector.continuity = defaults.fail_slow_continuity_s;
      options.detector.denoise_window = defaults.fail_slow_window_s;
      options.detector.max_fill = defaults.fail_slow_window_s;
      options.max_evict_share = defaults.fail_slow_max_evict_share;
      options.ranks_per_host = sim_->flags->ranks_per_host;
      options.dump_dir = absl::StrCat(sim_->run_dir, "/events/fail_slow");
      options.call_timeout = flags_call_timeout();
      FailSlowCoordinator::Hooks hooks;
      hooks.coordinating = [this] { return coordinating(); };
      hooks.say = [this](const std::string& line) { Say(line); };
      hooks.record = [this](Event event) {
        std::string host, action;
        for (const auto& [key, value] : event.attributes) {
          if (key == "host") host = value;
          if (key == "action") action = value;
        }
        MutexLock lock(&sim_->named_mu);
        sim_->slow_named.push_back({host, action, absl::Now()});
      };
      absl::StatusOr<std::unique_ptr<FailSlowCoordinator>> created =
          FailSlowCoordinator::Create(store_.get(), Clock::Real(), Env::Default(), p.job.get(),
                                      std::move(options), std::move(hooks));
      if (!created.ok()) {
        sim_->problems.Add(absl::StrCat("fail-slow: ", created.status().ToString()));
        return;
      }
      p.fail_slow = *std::move(created);
    }
    const int64_t cpu_before = ThreadCpuNanos();
    p.fail_slow->Poll(world_size_);
    sim_->fail_slow_cpu_ns.fetch_add(ThreadCpuNanos() - cpu_before);
    sim_->fail_slow_polls.fetch_add(1);
  }

  // Job::StartPlannedProcesses: this host's part of the plan, its processes spawned through the
  // supervisor, each a simulated member; the coordinating host publishes the plan first.
  void SpawnPlanned() {
    absl::StatusOr<HostAssignment> assignment = agent_->ReadPlan();
    if (!assignment.ok()) {
      if (absl::IsNotFound(assignment.status()) && parts_ != nullptr && coordinating()) {
        (void)parts_->plan->PublishWhenReady();
      } else if (!absl::IsNotFound(assignment.status()) &&
                 !absl::IsDeadlineExceeded(assignment.status()) &&
                 !absl::IsUnavailable(assignment.status())) {
        sim_->problems.Add(absl::StrCat("host ", host_id_, ": ", assignment.status().ToString()));
      }
      return;
    }
    spawned_ = true;
    world_size_ = assignment->world_size;
    if (parts_ != nullptr) {
      parts_->job->set_world_size(world_size_);
      parts_->rank_watch->set_world_size(world_size_);
      if (parts_->hang != nullptr) parts_->hang->set_world_size(world_size_);
    }
    own_ranks_ = assignment->ranks;
    for (int rank : assignment->ranks) Spawn(rank, -1);
    for (int i = 0; i < assignment->standbys; ++i) Spawn(-1, i);
  }

  // Job::Spawn, with the fake supervisor: the worker's member id, its spec, and its member.
  void Spawn(int rank, int standby_index) {
    WorkerSpec spec;
    spec.argv = {"simulated-member"};
    spec.label = rank >= 0 ? absl::StrCat("rank ", rank) : absl::StrCat("standby ", standby_index);
    absl::StatusOr<WorkerId> worker = supervisor_->Spawn(spec);
    if (!worker.ok()) {
      sim_->problems.Add(absl::StrCat("host ", host_id_, ": ", worker.status().ToString()));
      return;
    }
    auto w = std::make_unique<HostWorker>();
    w->worker = *worker;
    w->pid = supervisor_->pid(*worker);
    w->rank = rank;
    w->standby_index = standby_index;
    store_keys::MemberId id;
    id.host = host_id_;
    id.pid = w->pid;
    id.role = rank >= 0 ? store_keys::MemberId::Role::kRank : store_keys::MemberId::Role::kStandby;
    id.index = rank >= 0 ? rank : standby_index;
    w->member_id = store_keys::EncodeMemberId(id);
    members_[w->member_id] = sim_->AddMember(w->member_id, rank);
    workers_.push_back(std::move(w));
  }

  // Job::FollowGeneration: the newest generation read; this host's standbys named in it take their
  // ranks, its ranks no longer named are killed.
  void FollowGeneration() {
    // As the launcher's agent (Job::FollowGeneration): the coordinator its whole table, another
    // agent only what its own processes need.
    Membership current;
    if (parts_ != nullptr && coordinating()) {
      if (!rendezvous_->Resume(sim_->flags->host_timeout / 4).ok()) return;
      current = rendezvous_->current();
    } else {
      if (!follower_->Follow(own_ranks_, sim_->flags->host_timeout / 4).ok()) return;
      current = follower_->current();
    }
    if (current.generation <= followed_generation_.load()) return;
    followed_generation_.store(current.generation);
    agent_->FollowMembership(current);
  }

  // Job::CoordinateHosts: generation 0's formation started once the plan is known, and the hosts'
  // liveness and reports.
  void CoordinateHosts() {
    if (!spawned_) return;
    CoordinatorParts& p = *parts_;
    // Formed already: a coordinator that took the lease over after generation 0.
    if (!p.formed.load() && !p.former.joinable()) {
      p.former = std::thread([this, &p] {
        const absl::Time deadline = absl::Now() + sim_->flags->timeout;
        absl::StatusOr<Membership> m = absl::DeadlineExceededError("not started");
        while (!sim_->stop.load() && absl::Now() < deadline) {
          m = rendezvous_->FormInitialGeneration(world_size_, absl::Milliseconds(250));
          if (!absl::IsDeadlineExceeded(m.status()) && !absl::IsUnavailable(m.status())) break;
        }
        if (m.ok()) {
          p.formed.store(true);
        } else if (!sim_->stop.load()) {
          sim_->problems.Add(absl::StrCat("generation 0: ", m.status().ToString()));
        }
      });
    }
    p.job->CoordinateHosts();
  }

  Sim* const sim_;
  const std::string host_id_;
  const bool standby_host_;
  const bool coordinator_host_;
  FakeProcessSupervisor* const supervisor_;
  std::unique_ptr<Store> store_;
  TurnReadStore* turn_reads_ = nullptr;  // store_ itself (Create)
  std::unique_ptr<CoordinatorLease> lease_;
  std::unique_ptr<RendezvousCoordinator> rendezvous_;
  std::unique_ptr<GenerationFollower> follower_;
  std::vector<int> own_ranks_;  // the ranks this host started (its plan's)
  std::unique_ptr<LeaseKeeper> lease_keeper_;
  std::unique_ptr<HostAgent> agent_;
  std::unique_ptr<StoreHostMembership> membership_;
  std::unique_ptr<CoordinatorParts> parts_;
  std::unique_ptr<HostSampler> sampler_;  // SampleHost's
  std::atomic<bool> may_be_evicted_{false};  // SlowEveryMember's
  std::vector<std::unique_ptr<HostWorker>> workers_;
  std::map<std::string, SimMember*> members_;  // by member id
  bool spawned_ = false;
  int world_size_ = 0;
  std::atomic<int64_t> followed_generation_{-1};  // read by the main thread too
  std::optional<AgentExit> ended_;
  std::atomic<int64_t> death_reported_ns_{0};
  std::atomic<int64_t> queued_ns_{0};
  std::atomic<int64_t> replacing_ns_{0};
  std::atomic<int64_t> published_ns_{0};
  int64_t phases_generation_ = -1;  // the agent thread's
  std::atomic<int64_t> longest_step_ns_[kSteps] = {};
};

// A thread that turns a slice of the hosts (a HostAgent is used by one thread at a time), with the
// fake supervisor their workers were spawned through, and runs the tasks posted to it (the faults)
// between its turns.
class AgentThread {
 public:
  AgentThread(Sim* sim, int index)
      : sim_(sim), index_(index), supervisor_(SupervisorOptions(index)) {}
  ~AgentThread() { Stop(); }
  AgentThread(const AgentThread&) = delete;
  AgentThread& operator=(const AgentThread&) = delete;

  FakeProcessSupervisor* supervisor() { return &supervisor_; }
  // REQUIRES: before Start.
  void Add(SimHost* host) { hosts_.push_back(host); }
  const std::vector<SimHost*>& hosts() const { return hosts_; }

  // Creates and joins each host (in order: the plan's groups follow the join order), then turns
  // them until Stop. `joined` is notified once every host joined (or failed to).
  void Start(Notification* joined) {
    thread_ = std::thread([this, joined] {
      // Named for a profiler (perf top -t): thread 0 turns the coordinating host alone.
      const std::string name =
          index_ == 0 ? "sim-coordinator" : absl::StrCat("sim-agents-", index_);
      pthread_setname_np(pthread_self(), name.c_str());
      for (SimHost* h : hosts_) {
        if (absl::Status s = h->Create(); !s.ok()) {
          sim_->problems.Add(
              absl::StrCat("host ", h->host_id(), " could not join: ", s.ToString()));
        }
      }
      joined->Notify();
      Loop();
    });
  }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  // Runs `task` on this thread between two turns, and waits for it, up to the simulator's
  // --timeout_s: `task` refers to the caller's state, so a thread too starved to run it in that
  // time ends the simulator (said), rather than run it after the caller gave up on it.
  void RunOnThread(std::function<void()> task) {
    Notification done;
    {
      MutexLock lock(&mu_);
      tasks_.push_back([&] {
        task();
        done.Notify();
      });
    }
    if (!done.WaitForNotificationWithTimeout(sim_->flags->timeout)) {
      std::printf("agent thread %d did not turn within %s: this machine cannot run this size\n",
                  index_, absl::FormatDuration(sim_->flags->timeout).c_str());
      std::fflush(stdout);
      std::_Exit(1);
    }
  }
  // This thread stops turning `host` (its death).
  void Forget(SimHost* host) { dead_.insert(host); }
  // CPU time of this thread so far (read by itself at each pass).
  int64_t cpu_ns() const { return cpu_ns_.load(); }
  // The longest time between two passes over its hosts since the last call (each host is turned
  // once per pass).
  absl::Duration TakeLongestPass() { return absl::Nanoseconds(longest_pass_ns_.exchange(0)); }

 private:
  static FakeProcessSupervisorOptions SupervisorOptions(int index) {
    FakeProcessSupervisorOptions options;
    options.signals_act = true;  // a kill request's SIGKILL ends the worker
    options.first_pid = 100000 + index * 100000;
    return options;
  }

  void Loop() {
    absl::Time last_pass = absl::Now();
    while (!stop_.load()) {
      // How long its hosts waited for their turn: a pass longer than the host timeout makes the
      // simulator, not the job, lose hosts (this machine's cores are too few for the agents).
      const absl::Time now = absl::Now();
      const int64_t gap = absl::ToInt64Nanoseconds(now - last_pass);
      last_pass = now;
      if (gap > longest_pass_ns_.load()) longest_pass_ns_.store(gap);
      std::deque<std::function<void()>> tasks;
      {
        MutexLock lock(&mu_);
        tasks.swap(tasks_);
      }
      for (auto& task : tasks) task();
      for (const WorkerEvent& event : supervisor_.Poll(absl::ZeroDuration())) {
        if (event.kind != WorkerEvent::Kind::kExited) continue;
        for (SimHost* h : hosts_) {
          if (dead_.count(h) == 0) h->OnExit(event.worker, event.exit);
        }
      }
      for (SimHost* h : hosts_) {
        if (dead_.count(h) == 0) h->Turn();
      }
      cpu_ns_.store(ThreadCpuNanos());
      // The launcher's loop waits up to 50 ms for its workers' events; each host's tick keeps its
      // own cadence (host_timeout / 12).
      absl::SleepFor(absl::Milliseconds(hosts_.size() == 1 ? 50 : 10));
    }
  }

  Sim* const sim_;
  const int index_;
  FakeProcessSupervisor supervisor_;
  std::vector<SimHost*> hosts_;
  std::set<SimHost*> dead_;  // this thread's only
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> cpu_ns_{0};
  std::atomic<int64_t> longest_pass_ns_{0};
  Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// One figure of one size, for the table and the JSON.
struct Figure {
  std::string name;
  double value = 0;
  std::string unit;
};

// When the live members adopted a generation: the first of them and the last.
struct Adoption {
  absl::Time first = absl::InfiniteFuture();
  absl::Time last = absl::InfinitePast();
};

// Waits until every live member holds a generation after `after` and the same one; returns when
// the first and the last of them adopted it, or nullopt at the deadline.
std::optional<Adoption> AwaitConvergence(Sim& sim, int64_t after, absl::Time deadline) {
  for (; absl::Now() < deadline; absl::SleepFor(absl::Milliseconds(5))) {
    if (sim.adoptions.After(after) < sim.ranks) continue;
    int64_t generation = -2;
    bool converged = true;
    Adoption adoption;
    int holders = 0;
    for (SimMember* m : sim.AllMembers()) {
      // Dead, not hearing the store, or told its rank was given away (an evicted host's).
      if (m->silenced() || m->cut_off() || m->ended()) continue;
      const SimMember::Place place = m->place();
      if (place.rank < 0) continue;  // a parked standby
      ++holders;
      if (place.generation <= after || (generation != -2 && place.generation != generation)) {
        converged = false;
        break;
      }
      generation = place.generation;
      adoption.first = std::min(adoption.first, place.since);
      adoption.last = std::max(adoption.last, place.since);
    }
    if (converged && holders == sim.ranks) return adoption;
  }
  return std::nullopt;
}

// The check after a fault (see the header comment): "correct: ..." or what is wrong; false when
// wrong. `dead`: the members that died (their writes must be refused).
bool CheckCorrect(Sim& sim, const std::vector<SimMember*>& dead, const std::string& what) {
  std::vector<std::string> wrong;
  absl::StatusOr<std::unique_ptr<Store>> store = sim.connect();
  if (!store.ok()) {
    std::printf("  wrong after %s: the check's connection: %s\n", what.c_str(),
                store.status().ToString().c_str());
    return false;
  }
  // The coordinator writes a generation's table, raises the fence, then announces it
  // (rdzv/current): a member may hold it before it is announced, so the store's current generation
  // is read until it is the newest a member holds (bounded).
  const int64_t newest_held = sim.NewestHeldGeneration();
  RendezvousCoordinator reader(store->get(), Clock::Real(), "checker");
  absl::Status read = absl::UnavailableError("not read");
  for (const absl::Time until = absl::Now() + kStoreTimeout; absl::Now() < until;) {
    read = reader.Resume(kStoreTimeout);
    if (read.ok() && reader.current().generation >= newest_held) break;
    if (!read.ok() && !absl::IsNotFound(read)) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (!read.ok()) {
    std::printf("  wrong after %s: reading the current generation: %s\n", what.c_str(),
                read.ToString().c_str());
    return false;
  }
  const Membership current = reader.current();
  std::map<int, std::string> holders;
  int live = 0;
  for (SimMember* m : sim.AllMembers()) {
    if (m->silenced()) continue;
    const SimMember::Place place = m->place();
    if (place.rank < 0) continue;  // a parked standby holds no rank
    ++live;
    if (place.generation != current.generation) {
      wrong.push_back(absl::StrFormat("%s holds generation %d, the store's is %d", m->id(),
                                      place.generation, current.generation));
    }
    const auto named = std::find(current.members.begin(), current.members.end(), m->id());
    const int table_rank =
        named == current.members.end() ? -1 : static_cast<int>(named - current.members.begin());
    if (table_rank != place.rank) {
      wrong.push_back(absl::StrFormat("%s holds rank %d, the store's table gives it %d", m->id(),
                                      place.rank, table_rank));
    }
    if (auto [it, inserted] = holders.emplace(place.rank, m->id()); !inserted) {
      wrong.push_back(
          absl::StrFormat("rank %d is held by %s and %s", place.rank, it->second, m->id()));
    }
  }
  if (static_cast<int>(current.members.size()) != sim.ranks || live != sim.ranks) {
    wrong.push_back(absl::StrFormat("%d live members hold ranks, the table has %d, the job %d",
                                    live, current.members.size(), sim.ranks));
  }
  int refused = 0;
  for (SimMember* m : dead) {
    const absl::Status s = m->Beat();
    if (absl::IsFailedPrecondition(s)) {
      ++refused;
    } else {
      wrong.push_back(
          absl::StrFormat("%s, dead and replaced, wrote its heartbeat: %s", m->id(), s.ToString()));
    }
  }
  for (size_t i = 0; i < wrong.size() && i < 10; ++i) {
    std::printf("  wrong after %s: %s\n", what.c_str(), wrong[i].c_str());
  }
  if (!wrong.empty()) return false;
  std::printf(
      "  correct: after %s every one of %d live members holds generation %lld and its rank of the "
      "store's table, each rank once; %d dead member(s)' writes refused by the fence\n",
      what.c_str(), live, static_cast<long long>(current.generation), refused);
  return true;
}

std::string Uptime() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return absl::StrCat(a, " ", b, " ", c);
}

struct SizeResult {
  int ranks = 0;
  int hosts = 0;
  bool ok = false;
  std::string load;
  std::vector<Figure> figures;
};

// The hang fault's dumps, made before the size's threads start: the rings of a rank waiting in
// the hung all_reduce and of the one that never entered it (--hang_records each), this process's
// stacks, and the run dir's flight_recorder folder they go to.
absl::StatusOr<std::unique_ptr<HangScenario>> PrepareHang(const Flags& flags,
                                                          const std::string& run_dir) {
  auto hang = std::make_unique<HangScenario>();
  hang->dump_dir = absl::StrCat(run_dir, "/flight_recorder");
  hang->staged_dir = absl::StrCat(run_dir, "/staged_dumps");
  for (const std::string& dir : {hang->dump_dir, hang->staged_dir}) {
    if (absl::Status made = Env::Default()->CreateDirs(dir); !made.ok()) return made;
  }
  const std::string job = absl::StrCat("simulate-hang-", getpid());
  absl::StatusOr<FlightRecorderContents> waiting =
      bench::RealRing(job, 0, flags.hang_records, /*enters=*/true);
  absl::StatusOr<FlightRecorderContents> culprit =
      bench::RealRing(job, 1, flags.hang_records, /*enters=*/false);
  (void)FlightRecorder::Remove(job, 0);
  (void)FlightRecorder::Remove(job, 1);
  if (!waiting.ok()) return waiting.status();
  if (!culprit.ok()) return culprit.status();
  hang->waiting_ring = *std::move(waiting);
  hang->culprit_ring = *std::move(culprit);
  absl::StatusOr<bench::Stacks> stacks = bench::RealStacks();
  if (!stacks.ok()) return stacks.status();
  hang->stacks = *std::move(stacks);
  return hang;
}

// Writes every rank's dump of `generation`'s hang into the staged dir (HangScenario), each with the
// reason its rank will give: the declaring rank's own report, the others' the declaration they
// read. On kStagingThreads threads, joined before it returns. Returns the bytes staged.
constexpr int kStagingThreads = 2;
absl::StatusOr<int64_t> StageHangDumps(HangScenario& hang, int ranks, int64_t generation,
                                       int culprit_rank, int declarer_rank,
                                       const std::string& report) {
  const std::string declaration = store_keys::EncodeHangDeclaration({declarer_rank, report});
  std::vector<HangScenario::Staged> staged_dumps(ranks);
  std::atomic<int> next{0};
  std::atomic<int64_t> bytes{0};
  Mutex error_mu;
  absl::Status error;
  auto stage = [&] {
    for (int r = next++; r < ranks; r = next++) {
      HangScenario::Staged& staged = staged_dumps[r];
      staged.reason = r == declarer_rank ? absl::StrCat("hang: ", report)
                                         : absl::StrCat("a peer declared a hang: ", declaration);
      const bool culprit = r == culprit_rank;
      absl::StatusOr<std::string> path = bench::WriteRankHangDump(
          culprit ? hang.culprit_ring : hang.waiting_ring, bench::kScaleJob, hang.stacks, r,
          culprit, staged.reason, generation, hang.staged_dir, /*digest=*/true);
      absl::StatusOr<uint64_t> size =
          path.ok() ? Env::Default()->GetFileSize(*path) : absl::StatusOr<uint64_t>(path.status());
      if (!size.ok()) {
        MutexLock lock(&error_mu);
        if (error.ok()) error = size.status();
        continue;
      }
      staged.path = *std::move(path);
      bytes += static_cast<int64_t>(*size);
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kStagingThreads; ++t) threads.emplace_back(stage);
  for (std::thread& t : threads) t.join();
  {
    MutexLock lock(&error_mu);
    if (!error.ok()) return error;
  }
  MutexLock lock(&hang.staged_mu);
  hang.staged = std::move(staged_dumps);
  return bytes.load();
}

// What the hang and slow-host faults need of their size (MeasureSize's).
struct FaultContext {
  FaultContext(Sim& s, const Flags& f) : sim(s), flags(f) {}
  Sim& sim;
  const Flags& flags;
  std::vector<SimHost*> hosts;  // every host, in order: the training hosts first
  int training_hosts = 0;
  int first_spared_host = 1;  // the host and partition faults took the hosts below it
  AgentThread* coordinator_thread = nullptr;  // the first host's, alone
  bool coordinator_lost = false;              // the first host's: its thread's CPU is no one's
  std::function<AgentThread*(int host)> thread_of;
  std::function<void(const std::string& name, double value, const std::string& unit)> figure;
  std::function<absl::StatusOr<ServerProcess::Counts>()> counters;
};

// The fault "a hang": the rank Culprit stops progressing in its collective (its ring shows the
// all_reduce not entered) while the others wait in it; another rank declares the hang through
// the store as a rank's HangResponder does, dumps, and aborts a second later
// (hang_dump_wait_ms); every rank sees the hang key (its generation watch) and writes its dump
// and digest; the coordinator's real HangCoordinator reads them, names the suspects, and has the
// suspect killed through its agent, which reports the death: a standby takes its rank. Figures:
// the declaration to the suspects named, to the last dump written, and to every live member in
// the new generation. Correct when the one suspect named is the culprit, every live rank dumped,
// and the check after it passes.
bool RunHangFault(FaultContext& c) {
  Sim& sim = c.sim;
  HangScenario& hang = *sim.faults.hang;
  const int64_t generation = sim.NewestHeldGeneration();
  const int culprit_rank = std::min(sim.ranks - 1, sim.ranks / 2 + 3);
  const int declarer_rank = culprit_rank == 0 ? 1 : 0;
  SimMember* culprit = nullptr;
  SimMember* declarer = nullptr;
  for (SimMember* m : sim.AllMembers()) {
    if (m->silenced() || m->cut_off() || m->ended()) continue;
    const SimMember::Place place = m->place();
    if (place.generation != generation) continue;
    if (place.rank == culprit_rank) culprit = m;
    if (place.rank == declarer_rank) declarer = m;
  }
  if (culprit == nullptr || declarer == nullptr) {
    std::printf("  hang: no live member holds rank %d or %d in generation %lld\n", culprit_rank,
                declarer_rank, static_cast<long long>(generation));
    return false;
  }
  hang.culprit.store(culprit_rank);
  hang.dumps.store(0);
  hang.dump_errors.store(0);
  hang.last_dump_ns.store(0);
  {
    MutexLock lock(&sim.named_mu);
    sim.hang_named.clear();
  }
  const std::string what = absl::StrFormat("a hang of rank %d (%s)", culprit_rank, culprit->id());
  const std::string report = absl::StrFormat(
      "hang (collective) at step 587: all_reduce #2348 (comm 1) ran 60s, bound 60s; rank %d never "
      "entered it",
      culprit_rank);
  const absl::Time staging = absl::Now();
  const absl::StatusOr<int64_t> staged =
      StageHangDumps(hang, sim.ranks, generation, culprit_rank, declarer_rank, report);
  if (!staged.ok()) {
    std::printf("  %s: staging the ranks' dumps: %s\n", what.c_str(),
                staged.status().ToString().c_str());
    return false;
  }
  std::printf("  %s: every rank's dump staged before its declaration (%.1f MB in %.2f s)\n",
              what.c_str(), *staged / 1e6, Seconds(absl::Now() - staging));
  const absl::StatusOr<absl::Time> declared = declarer->DeclareHang(generation, report);
  if (!declared.ok()) {
    std::printf("  %s: declaring it: %s\n", what.c_str(), declared.status().ToString().c_str());
    return false;
  }
  const absl::Duration dump_wait = absl::Milliseconds(Options{}.hang_dump_wait_ms);
  bool aborted = false;
  std::optional<Sim::Named> named;
  for (const absl::Time until = *declared + c.flags.timeout; absl::Now() < until;) {
    if (!aborted && absl::Now() >= *declared + dump_wait) {
      aborted = true;
      if (absl::Status s = declarer->AbortHang(generation); !s.ok()) {
        std::printf("  %s: the declaring rank's abort: %s\n", what.c_str(), s.ToString().c_str());
      }
    }
    {
      MutexLock lock(&sim.named_mu);
      if (!sim.hang_named.empty()) named = sim.hang_named.front();
    }
    if (named.has_value()) break;
    absl::SleepFor(absl::Milliseconds(2));
  }
  if (!named.has_value()) {
    std::printf("  %s: no suspect named within %s of its declaration (%d dumps written)\n",
                what.c_str(), absl::FormatDuration(c.flags.timeout).c_str(), hang.dumps.load());
    return false;
  }
  const double to_named = Seconds(named->when - *declared);
  c.figure("hang_suspects_named_s", to_named, "s");
  std::printf("  %s: %s named %.3f s after its declaration\n", what.c_str(), named->what.c_str(),
              to_named);
  bool ok = true;
  if (named->what != absl::StrCat("suspects: rank ", culprit_rank)) {
    std::printf("  wrong after %s: the coordinator named %s, not rank %d\n", what.c_str(),
                named->what.c_str(), culprit_rank);
    ok = false;
  }
  // The dumps in by the diagnosis (the arbiter's dump grace after the declaration): a rank whose
  // dump is missing is among the suspects.
  const int dumps_at_naming = hang.dumps.load();
  c.figure("hang_dumps_at_naming", dumps_at_naming, "1");
  std::printf("  %s: %d dumps published by the suspects' naming (the arbiter waits %s for them)\n",
              what.c_str(), dumps_at_naming, absl::FormatDuration(c.flags.hang_dump_grace).c_str());
  // Too many suspects are replaced by no one: nothing to wait for.
  std::optional<Adoption> adopted =
      ok ? AwaitConvergence(sim, generation, absl::Now() + c.flags.timeout) : std::nullopt;
  // Every rank dumped once it saw the key: by now, long after the diagnosis read them all.
  const int dumps = hang.dumps.load();
  c.figure("hang_dumps", dumps, "1");
  if (hang.last_dump_ns.load() > 0) {
    c.figure("hang_last_dump_s", Seconds(absl::FromUnixNanos(hang.last_dump_ns.load()) - *declared),
             "s");
  }
  std::printf(
      "  %s: %d ranks' dumps published (%d failed), the last %.3f s after the declaration\n",
      what.c_str(), dumps, hang.dump_errors.load(),
      Seconds(absl::FromUnixNanos(hang.last_dump_ns.load()) - *declared));
  if (dumps != sim.ranks || hang.dump_errors.load() != 0) {
    std::string first_error;
    {
      MutexLock lock(&hang.first_error_mu);
      first_error = hang.first_error;
    }
    std::printf("  wrong after %s: %d dumps of %d ranks written, %d failed%s%s\n", what.c_str(),
                dumps, sim.ranks, hang.dump_errors.load(), first_error.empty() ? "" : ": ",
                first_error.c_str());
    ok = false;
  }
  if (!adopted.has_value()) {
    if (ok) {
      std::printf("  %s: not recovered within %s\n", what.c_str(),
                  absl::FormatDuration(c.flags.timeout).c_str());
    }
    for (const std::string& p : sim.problems.Take()) std::printf("  %s\n", p.c_str());
    return false;
  }
  const double recovered = Seconds(adopted->last - *declared);
  c.figure("hang_recovered_s", recovered, "s");
  std::printf("  %s: every live member in the new generation %.3f s after its declaration\n",
              what.c_str(), recovered);
  return CheckCorrect(sim, {culprit}, what) && ok;
}

// The slow host's choice: a training host the earlier faults spared, that does not coordinate.
SimHost* ChooseSlowHost(FaultContext& c) {
  std::string took_over_by;
  {
    MutexLock lock(&c.sim.took_over_mu);
    took_over_by = c.sim.took_over_by;
  }
  for (int h = c.training_hosts - 1; h >= std::max(1, c.first_spared_host); --h) {
    SimHost* host = c.hosts[h];
    if (host->spawned() && host->host_id() != took_over_by) return host;
  }
  return nullptr;
}

// The fault "a slow host", as `trainguard run --fail-slow` sees one: from its start every rank
// writes its work record once a second and every agent publishes its host's sample
// (HostAgent::PublishHostSample), and the coordinator runs the real FailSlowCoordinator
// (--fail-slow, evict by default). First a healthy period (kHealthyPeriod): the detector's cost
// (its Poll's CPU per second, the store's requests per second against the steady state's); then
// one training host's ranks compute kSlowdown longer. Figures: the slowdown to the host named
// and, when the coordinator evicts it (a standby host takes its ranks), to every live member in
// the new generation. Correct when the host named is the slow one, no other host is named, and,
// once evicted, its members learn they were replaced, their writes are refused and its agent
// finds itself fenced out.
bool RunSlowHostFault(FaultContext& c) {
  // The detector's window filled; half of it before, without the watch, for the store's baseline.
  constexpr absl::Duration kHealthyPeriod = absl::Seconds(12);
  Sim& sim = c.sim;
  if (c.training_hosts < 3) {
    std::printf("  slow fault: the detector compares hosts, and names none among fewer than 3\n");
    return true;
  }
  SimHost* victim = ChooseSlowHost(c);
  if (victim == nullptr) {
    std::printf("  slow fault: needs a training host the earlier faults spared\n");
    return true;
  }
  {
    MutexLock lock(&sim.named_mu);
    sim.slow_named.clear();
  }
  const int64_t before = sim.NewestHeldGeneration();
  // The store's requests just before, without the watch: what it adds is the difference.
  const absl::StatusOr<ServerProcess::Counts> baseline_from = c.counters();
  const absl::Time baseline_start = absl::Now();
  absl::SleepFor(kHealthyPeriod / 2);
  const absl::StatusOr<ServerProcess::Counts> counts_before = c.counters();
  const double baseline_s = Seconds(absl::Now() - baseline_start);
  const int64_t cpu_before = sim.fail_slow_cpu_ns.load();
  const int64_t coordinator_cpu_before = c.coordinator_thread->cpu_ns();
  const absl::Time watch_from = absl::Now();
  sim.faults.work_records.store(true);
  absl::SleepFor(kHealthyPeriod);
  const double watched = Seconds(absl::Now() - watch_from);
  const absl::StatusOr<ServerProcess::Counts> counts_after = c.counters();
  const double detector_cpu =
      static_cast<double>(sim.fail_slow_cpu_ns.load() - cpu_before) / 1e9 / watched;
  c.figure("slow_detector_cpu_per_s", detector_cpu, "s/s");
  std::string said =
      absl::StrFormat("the fail-slow detector's Poll %.3f%% of a core", 100 * detector_cpu);
  if (!c.coordinator_lost) {
    const double coordinator_cpu =
        static_cast<double>(c.coordinator_thread->cpu_ns() - coordinator_cpu_before) / 1e9 /
        watched;
    c.figure("slow_watch_coordinator_cpu_per_s", coordinator_cpu, "s/s");
    absl::StrAppendFormat(&said, ", the coordinator's thread %.2f%%", 100 * coordinator_cpu);
  }
  if (counts_before.ok() && counts_after.ok()) {
    const double requests =
        static_cast<double>(counts_after->requests - counts_before->requests) / watched;
    c.figure("slow_watch_requests_per_s", requests, "1/s");
    c.figure("slow_watch_requests_per_rank_s", requests / sim.ranks, "1/s");
    absl::StrAppendFormat(&said, ", %.0f store requests/s (%.2f per rank)", requests,
                          requests / sim.ranks);
    if (baseline_from.ok()) {
      const double baseline =
          static_cast<double>(counts_before->requests - baseline_from->requests) / baseline_s;
      c.figure("slow_watch_added_requests_per_s", requests - baseline, "1/s");
      absl::StrAppendFormat(&said, ", %.0f/s more than the %.1f s before it", requests - baseline,
                            baseline_s);
    }
  }
  std::printf("  fail-slow watch on %d hosts, healthy, over %.1f s: %s\n", c.training_hosts,
              watched, said.c_str());

  std::vector<SimMember*> slowed;
  absl::Time onset;
  c.thread_of(static_cast<int>(std::find(c.hosts.begin(), c.hosts.end(), victim) - c.hosts.begin()))
      ->RunOnThread([&] {
        slowed = victim->SlowEveryMember();
        sim.faults.slowdown.store(true);
        onset = absl::Now();
      });
  const std::string what = absl::StrCat("host ", victim->host_id(), " slow");
  std::optional<Sim::Named> named;
  const absl::Duration patience = std::max(c.flags.timeout, absl::Seconds(120));
  for (const absl::Time until = onset + patience; absl::Now() < until && !named.has_value();) {
    absl::SleepFor(absl::Milliseconds(20));
    MutexLock lock(&sim.named_mu);
    if (!sim.slow_named.empty()) named = sim.slow_named.front();
  }
  auto stop_watching = [&] {
    sim.faults.work_records.store(false);
    sim.faults.slowdown.store(false);
    for (SimMember* m : slowed) m->Slow(false);
  };
  if (!named.has_value()) {
    stop_watching();
    std::printf("  %s: not named within %s\n", what.c_str(),
                absl::FormatDuration(patience).c_str());
    return false;
  }
  const double to_named = Seconds(named->when - onset);
  c.figure("slow_host_named_s", to_named, "s");
  std::printf("  %s: %s named %.3f s after the slowdown (action: %s)\n", what.c_str(),
              named->what.c_str(), to_named, named->action.c_str());
  bool ok = named->what == victim->host_id();
  const bool evicted = named->action == "evict";
  std::vector<SimMember*> dead;
  if (evicted) {
    std::optional<Adoption> adopted = AwaitConvergence(sim, before, absl::Now() + c.flags.timeout);
    if (!adopted.has_value()) {
      stop_watching();
      std::printf("  %s: evicted, not recovered within %s\n", what.c_str(),
                  absl::FormatDuration(c.flags.timeout).c_str());
      for (const std::string& p : sim.problems.Take()) std::printf("  %s\n", p.c_str());
      return false;
    }
    c.figure("slow_host_evicted_s", Seconds(adopted->last - onset), "s");
    std::printf(
        "  %s: evicted, every live member in the new generation %.3f s after the "
        "slowdown\n",
        what.c_str(), Seconds(adopted->last - onset));
    // Its members learn from their next wait that their ranks were given away.
    for (const absl::Time until = absl::Now() + c.flags.timeout; absl::Now() < until;) {
      if (std::all_of(slowed.begin(), slowed.end(),
                      [](SimMember* m) { return m->ended() || m->silenced(); })) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    for (SimMember* m : slowed) {
      if (!m->silenced() && !(m->ended() && m->place().replaced)) {
        std::printf("  wrong after %s evicted: %s still holds its rank\n", what.c_str(),
                    m->id().c_str());
        ok = false;
      }
      m->Silence();  // from here on as dead: its writes must be refused
      dead.push_back(m);
    }
  }
  stop_watching();
  {
    MutexLock lock(&sim.named_mu);
    for (const Sim::Named& n : sim.slow_named) {
      if (n.what != victim->host_id()) {
        std::printf("  wrong after %s: healthy host %s named (%s)\n", what.c_str(), n.what.c_str(),
                    n.action.c_str());
        ok = false;
      }
    }
  }
  if (!ok) return false;
  if (!evicted) {
    std::printf("  correct: %s named, no other host; not evicted (%s)\n", what.c_str(),
                named->action.c_str());
    return true;
  }
  ok = CheckCorrect(sim, dead, what);
  AgentThread* thread = c.thread_of(
      static_cast<int>(std::find(c.hosts.begin(), c.hosts.end(), victim) - c.hosts.begin()));
  std::optional<AgentExit> fenced;
  thread->RunOnThread([&] {
    fenced = victim->CheckFenced();
    thread->Forget(victim);  // its agent leaves, fenced out
    victim->StopAgentThreads();
  });
  if (!fenced.has_value()) {
    std::printf("  wrong after %s evicted: its agent does not find itself fenced out\n",
                what.c_str());
    return false;
  }
  std::printf(
      "  correct: %s named, no other host; its agent, turned again, ends fenced out "
      "(exit code %d)\n",
      what.c_str(), fenced->code);
  return ok;
}

// One size: returns its figures (ok false when it could not be measured, formed, recovered or
// checked: said why).
SizeResult MeasureSize(const Flags& flags, int ranks) {
  SizeResult result;
  result.ranks = ranks;
  result.load = Uptime();
  const int training_hosts = (ranks + flags.ranks_per_host - 1) / flags.ranks_per_host;
  // A standby host per fault that will run and needs one (each takes a whole host's ranks, or a
  // rank's); "host" and "partition" each take a training host besides the coordinator's.
  int standby_hosts = 0;
  int victims = training_hosts - 1;
  for (const std::string& fault : flags.faults) {
    if (fault == "host" || fault == "partition") {
      if (victims-- > 0) ++standby_hosts;
    } else if (fault == "rank" || fault == "coordinator" || fault == "hang" || fault == "slow") {
      ++standby_hosts;  // the hang's suspect's replacement; the slow host's, evicted
    }
  }
  standby_hosts = std::max(standby_hosts, 1);
  const int hosts = training_hosts + standby_hosts;
  result.hosts = training_hosts;
  if (ranks % flags.ranks_per_host != 0) {
    std::printf("ranks=%d: not a multiple of %d ranks per host\n", ranks, flags.ranks_per_host);
    return result;
  }
  const int members = ranks + standby_hosts * flags.ranks_per_host;
  // A thread and a connection per member (a standby's heartbeat thread and its second connection
  // besides), per agent its heartbeat and lease renewal threads and its client's capped
  // connections (the coordinator's waits, a few more), and the checks'. The server's connection
  // cap is sized from it: a cap below what the clients hold refuses connections, and their
  // retries become a storm.
  bool agent_beat_threads = true;
  int threads =
      members + standby_hosts * flags.ranks_per_host + 2 * hosts + flags.agent_threads + 64;
  int files = members + standby_hosts * flags.ranks_per_host + kAgentStoreConnections * hosts + 256;
  if (std::optional<std::string> why = bench::MachineCannotHold(threads, files); why.has_value()) {
    const int threads_in_turns = threads - 2 * hosts;
    const int files_in_turns = files;
    if (bench::MachineCannotHold(threads_in_turns, files_in_turns).has_value()) {
      std::printf("ranks=%d: not measured on this machine: %s\n", ranks, why->c_str());
      return result;
    }
    std::printf(
        "ranks=%d: the agents beat and renew in their turns, not on threads of their own (%s)\n",
        ranks, why->c_str());
    agent_beat_threads = false;
    threads = threads_in_turns;
    files = files_in_turns;
  }
  // The store: the TcpStore server (its counters and CPU are figures) or an etcd cluster. Declared
  // before the simulation, so that it outlives the members' last calls at their end.
  std::unique_ptr<ServerProcess> server;
  std::unique_ptr<testing::EtcdCluster> etcd;
  Sim sim;
  sim.flags = &flags;
  sim.run_dir = absl::StrCat("/dev/shm/trainguard-simulate-", getpid(), "-", ranks);
  // Removed at the size's end, whatever path it takes out of here.
  struct RunDir {
    std::string path;
    ~RunDir() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  } run_dir{sim.run_dir};
  if (std::find(flags.faults.begin(), flags.faults.end(), "hang") != flags.faults.end()) {
    // Before the members' threads: the stacks a rank dumps are this process's few threads'.
    absl::StatusOr<std::unique_ptr<HangScenario>> hang = PrepareHang(flags, sim.run_dir);
    if (!hang.ok()) {
      std::printf("ranks=%d: preparing the hang's dumps: %s\n", ranks,
                  hang.status().ToString().c_str());
      return result;
    }
    sim.faults.hang = *std::move(hang);
  }
  if (flags.store == "etcd") {
    absl::StatusOr<std::unique_ptr<testing::EtcdCluster>> started = testing::EtcdCluster::Start(3);
    if (!started.ok()) {
      std::printf("ranks=%d: %s\n", ranks, started.status().ToString().c_str());
      return result;
    }
    etcd = *std::move(started);
    sim.store_url = etcd->StoreUrl();
    sim.connect = [endpoints = etcd->endpoints()]() -> absl::StatusOr<std::unique_ptr<Store>> {
      EtcdStoreOptions options;
      options.endpoints = endpoints;
      options.job_id = bench::kScaleJob;
      options.connect_timeout = kStoreTimeout;
      absl::StatusOr<std::unique_ptr<EtcdStore>> client = EtcdStore::Connect(options);
      if (!client.ok()) return client.status();
      return std::unique_ptr<Store>(*std::move(client));
    };
    sim.connect_agent = sim.connect;
    sim.connect_coordinator = sim.connect;
  } else {
    absl::StatusOr<std::unique_ptr<ServerProcess>> started =
        // With room for a reconnection per agent: a connection its client closed after a call
        // timed out counts until the server reads its end, and a cap met refuses the
        // reconnections into a storm.
        ServerProcess::Start(std::max(TcpStoreServerOptions{}.max_connections, files + 64 + hosts));
    if (!started.ok()) {
      std::printf("ranks=%d: %s\n", ranks, started.status().ToString().c_str());
      return result;
    }
    server = *std::move(started);
    const int port = server->port();
    sim.store_url = absl::StrCat("tcp://127.0.0.1:", port);
    sim.connect = [port] { return Connect(port, kStoreTimeout); };
    sim.connect_agent = [port] {
      return Connect(port, kStoreTimeout, std::nullopt, kAgentStoreConnections, /*control=*/true);
    };
    sim.connect_coordinator = [port] {
      return Connect(port, kStoreTimeout, std::nullopt, std::nullopt, /*control=*/true);
    };
  }
  // What the store's server process received and sent: the TcpStore's counters (none for etcd).
  auto counters = [&]() -> absl::StatusOr<ServerProcess::Counts> {
    if (server == nullptr) return absl::UnimplementedError("etcd: no server counters");
    return server->Counters();
  };
  sim.ranks = ranks;
  sim.training_hosts = training_hosts;
  sim.standby_hosts = standby_hosts;
  sim.agent_beat_threads = agent_beat_threads;

  // The coordinating host on a thread of its own (its CPU is the coordinator's), the others in
  // slices over the agent threads; the standby hosts join last.
  std::vector<std::unique_ptr<AgentThread>> agents;
  const int agent_threads = std::max(1, std::min(flags.agent_threads, hosts - 1));
  for (int t = 0; t <= agent_threads; ++t) {
    agents.push_back(std::make_unique<AgentThread>(&sim, t));
  }
  // The thread that turns host h.
  auto thread_of = [&](int h) {
    return h == 0 ? agents[0].get() : agents[1 + (h - 1) % agent_threads].get();
  };
  std::vector<std::unique_ptr<SimHost>> all_hosts;
  for (int h = 0; h < hosts; ++h) {
    const bool standby = h >= training_hosts;
    AgentThread* thread = thread_of(h);
    all_hosts.push_back(
        std::make_unique<SimHost>(&sim, absl::StrFormat("%s%05d", standby ? "standby" : "host", h),
                                  standby, h == 0, thread->supervisor()));
    thread->Add(all_hosts.back().get());
  }
  SimHost* coordinator = all_hosts[0].get();
  const absl::Time started = absl::Now();
  // The coordinating host joins first and takes the lease before the others join.
  std::vector<Notification> joined(agents.size());
  agents[0]->Start(&joined[0]);
  joined[0].WaitForNotificationWithTimeout(flags.timeout);
  for (const absl::Time until = absl::Now() + flags.timeout; absl::Now() < until;) {
    bool held = false;
    agents[0]->RunOnThread([&] { held = coordinator->coordinating(); });
    if (held) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (size_t t = 1; t < agents.size(); ++t) agents[t]->Start(&joined[t]);

  auto stop_everything = [&] {
    sim.stop.store(true);
    for (auto& t : agents) t->Stop();
    for (SimMember* m : sim.AllMembers()) m->RequestStop();
    for (SimMember* m : sim.AllMembers()) m->Stop();
  };
  // The longest wait of a host for its agent thread's turn, since the last call: above the host
  // timeout, a host lost is the simulator's starvation (this machine's CPU), not the job's.
  auto longest_pass = [&] {
    absl::Duration longest = absl::ZeroDuration();
    for (auto& t : agents) longest = std::max(longest, t->TakeLongestPass());
    return longest;
  };
  auto fail = [&](const std::string& why) {
    std::printf(
        "ranks=%d: %s (the longest wait of a host for its agent thread's turn: %s, the "
        "host timeout %s)\n",
        ranks, why.c_str(), absl::FormatDuration(longest_pass()).c_str(),
        absl::FormatDuration(flags.host_timeout).c_str());
    for (const std::string& p : sim.problems.Take()) std::printf("  %s\n", p.c_str());
    stop_everything();
    return result;
  };
  auto figure = [&](const std::string& name, double value, const std::string& unit) {
    result.figures.push_back({name, value, unit});
  };

  // Generation 0: every rank holding it.
  const absl::Time deadline = started + flags.timeout;
  std::optional<absl::Time> held;
  if (std::optional<Adoption> zero = AwaitConvergence(sim, -1, deadline); zero.has_value()) {
    held = zero->last;
  }
  if (!held.has_value()) return fail("generation 0 did not form in time");
  absl::Time last_join = absl::InfinitePast();
  for (SimMember* m : sim.AllMembers()) last_join = std::max(last_join, m->joined());
  figure("generation0_after_last_join_s", Seconds(*held - last_join), "s");
  figure("generation0_after_start_s", Seconds(*held - started), "s");
  std::printf("ranks=%d hosts=%d (+%d standby hosts, load %s):\n", ranks, training_hosts,
              standby_hosts, result.load.c_str());
  std::printf(
      "  generation 0 held by every rank %.3f s after the last join (%.3f s after the "
      "start)\n",
      Seconds(*held - last_join), Seconds(*held - started));
  bool ok = CheckCorrect(sim, {}, "generation 0");

  // Every agent follows generation 0: from its own ranks' registrations (GenerationFollower; the
  // coordinator holds the table it published), later generations from their changes. Measured
  // apart, so that the steady state below is the job's uneventful training only.
  {
    absl::StatusOr<ServerProcess::Counts> before = counters();
    const absl::Time from = absl::Now();
    auto every_host_followed = [&] {
      for (const auto& h : all_hosts) {
        if (h->followed_generation() < 0) return false;
      }
      return true;
    };
    while (!every_host_followed() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
    absl::StatusOr<ServerProcess::Counts> after = counters();
    if (!every_host_followed()) return fail("the agents did not follow generation 0 in time");
    const double followed = Seconds(absl::Now() - from);
    figure("agents_followed_generation0_s", followed, "s");
    if (before.ok() && after.ok()) {
      const double bytes = static_cast<double>(after->bytes_received + after->bytes_sent -
                                               before->bytes_received - before->bytes_sent);
      figure("agents_followed_generation0_bytes", bytes, "B");
      std::printf("  every agent followed generation 0 %.3f s later: %.1f MB through the server\n",
                  followed, bytes / 1e6);
    } else {
      std::printf("  every agent followed generation 0 %.3f s later\n", followed);
    }
  }

  // Steady state.
  if (flags.steady > absl::ZeroDuration()) {
    (void)longest_pass();
    absl::StatusOr<ServerProcess::Counts> before = counters();
    const ProcessUsage server_before = server != nullptr ? server->Usage() : ProcessUsage{};
    const int64_t cpu_before = agents[0]->cpu_ns();
    const absl::Time from = absl::Now();
    absl::SleepFor(flags.steady);
    absl::StatusOr<ServerProcess::Counts> after = counters();
    const ProcessUsage server_after = server != nullptr ? server->Usage() : ProcessUsage{};
    const int64_t cpu_after = agents[0]->cpu_ns();
    const double seconds = Seconds(absl::Now() - from);
    const ProcessUsage self = bench::ReadProcessUsage("self");
    const double coordinator_cpu = static_cast<double>(cpu_after - cpu_before) / 1e9 / seconds;
    figure("steady_coordinator_cpu_per_s", coordinator_cpu, "s/s");
    figure("steady_longest_agent_pass_s", Seconds(longest_pass()), "s");
    figure("simulator_rss_bytes", static_cast<double>(self.rss_bytes), "B");
    if (before.ok() && after.ok()) {
      const double requests = static_cast<double>(after->requests - before->requests) / seconds;
      const double bytes = static_cast<double>(after->bytes_received + after->bytes_sent -
                                               before->bytes_received - before->bytes_sent) /
                           seconds;
      const double server_cpu = (server_after.cpu_seconds - server_before.cpu_seconds) / seconds;
      figure("steady_requests_per_s", requests, "1/s");
      figure("steady_requests_per_rank_s", requests / ranks, "1/s");
      figure("steady_requests_per_host_s", requests / training_hosts, "1/s");
      figure("steady_bytes_per_s", bytes, "B/s");
      figure("steady_bytes_per_rank_s", bytes / ranks, "B/s");
      figure("steady_server_cpu_per_s", server_cpu, "s/s");
      figure("server_rss_bytes", static_cast<double>(server_after.rss_bytes), "B");
      std::printf(
          "  steady state over %.1f s: %.0f store requests/s (%.2f per rank, %.1f per host), "
          "%.0f KB/s through the server (%.0f B/s per rank); coordinator thread %.2f%% of a "
          "core, server %.1f%%; RSS server %.0f MB, simulator %.0f MB\n",
          seconds, requests, requests / ranks, requests / training_hosts, bytes / 1e3,
          bytes / ranks, 100 * coordinator_cpu, 100 * server_cpu, server_after.rss_bytes / 1e6,
          self.rss_bytes / 1e6);
    } else {
      std::printf(
          "  steady state over %.1f s: coordinator thread %.2f%% of a core; RSS simulator %.0f MB "
          "(no server counters with %s)\n",
          seconds, 100 * coordinator_cpu, self.rss_bytes / 1e6, flags.store.c_str());
    }
  }

  // The training hosts a host-wide fault may take, in order: never the coordinator's but for the
  // fault that is its loss.
  int next_victim = 1;
  bool coordinator_lost = false;  // the first host's, that the timing reads
  for (const std::string& fault : flags.faults) {
    if (fault == "hang" || fault == "slow") {
      FaultContext context(sim, flags);
      for (const auto& h : all_hosts) context.hosts.push_back(h.get());
      context.training_hosts = training_hosts;
      context.first_spared_host = next_victim;
      context.coordinator_thread = agents[0].get();
      context.coordinator_lost = coordinator_lost;
      context.thread_of = thread_of;
      context.figure = figure;
      context.counters = counters;
      ok = (fault == "hang" ? RunHangFault(context) : RunSlowHostFault(context)) && ok;
      continue;
    }
    // Every live member holds the same generation here (the previous step converged).
    const int64_t before = sim.NewestHeldGeneration();
    // Where the recovery's time goes is timed on the coordinating host, the first one's as long as
    // it coordinates: not for the loss of its host, nor after.
    const bool timed = !coordinator_lost && fault != "coordinator";
    if (timed) {
      agents[0]->RunOnThread([&] { coordinator->ResetPhases(); });
      (void)agents[0]->TakeLongestPass();
    }
    absl::StatusOr<ServerProcess::Counts> counts_before = counters();
    std::vector<SimMember*> dead;
    absl::Time from;
    absl::Duration minus = absl::ZeroDuration();
    std::string what;
    SimHost* victim = nullptr;
    AgentThread* victim_thread = nullptr;
    SimHost* reporter = nullptr;  // the host whose agent reports the death (a rank's)
    if (fault == "rank") {
      // A rank of the last training host (not the coordinator's) dies.
      SimHost* host = all_hosts[training_hosts - 1].get();
      reporter = host;
      thread_of(training_hosts - 1)->RunOnThread([&] {
        if (host != coordinator) host->ResetPhases();
        from = absl::Now();
        if (SimMember* m = host->KillOneRank(); m != nullptr) dead.push_back(m);
      });
      what = absl::StrCat("a rank's death on ", host->host_id());
    } else if (fault == "host" || fault == "partition") {
      if (next_victim >= training_hosts) {
        std::printf(
            "  %s fault: needs a training host besides the coordinator's (and the earlier "
            "faults')\n",
            fault.c_str());
        continue;
      }
      victim = all_hosts[next_victim].get();
      victim_thread = thread_of(next_victim);
      ++next_victim;
      victim_thread->RunOnThread([&] {
        // Cut off or dead, its agent reaches the store no more: its loop, its heartbeat and its
        // lease renewal (a cut-off agent, healed, is turned once more below).
        victim_thread->Forget(victim);
        victim->StopAgentThreads();
        dead = fault == "host" ? victim->SilenceEveryMember() : victim->PartitionEveryMember();
        from = absl::FromUnixNanos(victim->last_beat_ns());
      });
      minus = flags.host_timeout;
      what = fault == "host" ? absl::StrCat("the death of host ", victim->host_id())
                             : absl::StrCat("host ", victim->host_id(), " cut off");
    } else if (fault == "coordinator") {
      // The coordinating host dies (its agent and members at once): another agent takes the lease
      // over once it lapses (the host timeout after its last renewal), gives every host a full
      // host timeout from then (JobCoordinator::TakeOver), and declares the dead one: two bounds.
      victim = coordinator;
      victim_thread = thread_of(0);
      victim_thread->RunOnThread([&] {
        victim_thread->Forget(victim);
        victim->StopAgentThreads();
        dead = victim->SilenceEveryMember();
        from = absl::FromUnixNanos(victim->last_beat_ns());
      });
      minus = 2 * flags.host_timeout;
      what = absl::StrCat("the death of the coordinator's host ", victim->host_id());
      coordinator_lost = true;
    } else {
      std::printf("  unknown fault '%s'\n", fault.c_str());
      ok = false;
      continue;
    }
    std::optional<Adoption> adopted = AwaitConvergence(sim, before, absl::Now() + flags.timeout);
    std::optional<absl::Time> recovered;
    if (adopted.has_value()) recovered = adopted->last;
    if (!recovered.has_value()) {
      std::printf("  %s: not recovered within %s\n", what.c_str(),
                  absl::FormatDuration(flags.timeout).c_str());
      for (const std::string& p : sim.problems.Take()) std::printf("  %s\n", p.c_str());
      ok = false;
      break;
    }
    const double took = Seconds(*recovered - from - minus);
    if (fault == "rank") {
      figure("rank_replaced_s", took, "s");
      std::printf("  %s: every live member in the new generation %.3f s after the death\n",
                  what.c_str(), took);
    } else if (fault == "coordinator") {
      const int64_t took_over_ns = sim.took_over_ns.load();
      std::string by;
      {
        MutexLock lock(&sim.took_over_mu);
        by = sim.took_over_by;
      }
      if (took_over_ns == 0) {
        std::printf("  wrong after %s: no other host took the lease over\n", what.c_str());
        ok = false;
      } else {
        const double lease = Seconds(absl::FromUnixNanos(took_over_ns) - from - flags.host_timeout);
        figure("coordinator_lease_taken_beyond_bound_s", lease, "s");
        std::printf(
            "  %s: %s took the coordinator's lease %.3f s after the dead host's last heartbeat + "
            "the lease (the host timeout; its renewals run on a thread of their own, and under "
            "load the last may be older than the last heartbeat)\n",
            what.c_str(), by.c_str(), lease);
      }
      figure("coordinator_host_replaced_beyond_bounds_s", took, "s");
      std::printf(
          "  %s: every live member in the new generation %.3f s after its last heartbeat + two "
          "host timeouts (the lease's, then the new coordinator's for every host)\n",
          what.c_str(), took);
    } else {
      figure(fault == "host" ? "host_replaced_beyond_bound_s"
                             : "partitioned_host_replaced_beyond_bound_s",
             took, "s");
      std::printf(
          "  %s: every live member in the new generation %.3f s after its last heartbeat + the "
          "host timeout (%s)\n",
          what.c_str(), took, absl::FormatDuration(flags.host_timeout).c_str());
    }
    // Where the recovery's time went, each phase from the previous one's end (see
    // PrintPhases): the fault's figure is their sum, less the host timeout for a host.
    if (timed) {
      absl::StatusOr<ServerProcess::Counts> counts_after = counters();
      agents[0]->RunOnThread([] {});  // the coordinator's turn that published has ended
      const absl::Time reported =
          reporter == nullptr ? from + minus : absl::FromUnixNanos(reporter->death_reported_ns());
      const absl::Time queued = absl::FromUnixNanos(coordinator->queued_ns());
      const absl::Time replacing = absl::FromUnixNanos(coordinator->replacing_ns());
      const absl::Time published = absl::FromUnixNanos(coordinator->published_ns());
      const std::string prefix = absl::StrCat(fault, "_");
      std::vector<std::pair<std::string, double>> phases;
      if (reporter != nullptr) phases.push_back({"death_reported", Seconds(reported - from)});
      phases.push_back({reporter != nullptr ? "report_taken" : "declared_beyond_bound",
                        Seconds(queued - reported)});
      phases.push_back({"replacing", Seconds(replacing - queued)});
      phases.push_back({"first_member_adopted", Seconds(adopted->first - replacing)});
      phases.push_back({"last_member_adopted", Seconds(adopted->last - adopted->first)});
      std::vector<std::string> said;
      for (const auto& [name, value] : phases) {
        figure(absl::StrCat(prefix, "phase_", name, "_s"), value, "s");
        said.push_back(absl::StrFormat("%s +%.3f s", name, value));
      }
      // How long the coordinator's loop took to come round (its ticks and turns are that far
      // apart at worst): a bound on how late it can read a death or a host's last beat.
      const absl::Duration coordinator_pass = agents[0]->TakeLongestPass();
      figure(absl::StrCat(prefix, "coordinator_longest_pass_s"), Seconds(coordinator_pass), "s");
      said.push_back(
          absl::StrFormat("(the coordinator's longest pass %.3f s", Seconds(coordinator_pass)));
      const std::vector<double> steps = coordinator->LongestSteps();
      for (int i = 0; i < SimHost::kSteps; ++i) {
        figure(absl::StrCat(prefix, "coordinator_longest_", SimHost::kStepNames[i], "_s"), steps[i],
               "s");
        said.back() += absl::StrFormat(", %s %.3f s", SimHost::kStepNames[i], steps[i]);
      }
      said.back() += ")";
      // Not a phase of the sum: the members adopt the generation as its publication goes on.
      figure(absl::StrCat(prefix, "publication_s"), Seconds(published - replacing), "s");
      said.push_back(absl::StrFormat("(the publication %.3f s)", Seconds(published - replacing)));
      if (counts_before.ok() && counts_after.ok()) {
        const double requests =
            static_cast<double>(counts_after->requests - counts_before->requests);
        const double bytes =
            static_cast<double>(counts_after->bytes_received + counts_after->bytes_sent -
                                counts_before->bytes_received - counts_before->bytes_sent);
        figure(absl::StrCat(prefix, "recovery_requests"), requests, "1");
        figure(absl::StrCat(prefix, "recovery_bytes"), bytes, "B");
        said.push_back(absl::StrFormat("%.0f store requests, %.1f MB", requests, bytes / 1e6));
      }
      std::printf("  phases: %s\n", absl::StrJoin(said, ", ").c_str());
    }
    if (fault == "partition") {
      // The link heals: the cut-off members go on, and each must learn from the store that its
      // rank was given away (its next wait finds a table without it) rather than train on.
      const absl::Time healed = absl::Now();
      for (SimMember* m : dead) m->Heal();
      bool every_one_learned = true;
      for (const absl::Time until = healed + flags.timeout;;) {
        every_one_learned =
            std::all_of(dead.begin(), dead.end(), [](SimMember* m) { return m->ended(); });
        if (every_one_learned || absl::Now() >= until) break;
        absl::SleepFor(absl::Milliseconds(5));
      }
      int replaced = 0;
      for (SimMember* m : dead) {
        const SimMember::Place place = m->place();
        if (m->ended() && place.replaced) {
          ++replaced;
        } else {
          std::printf("  wrong after %s healed: %s %s\n", what.c_str(), m->id().c_str(),
                      m->ended() ? absl::StrCat("ended: ", place.error.ToString()).c_str()
                                 : "still holds its rank");
          ok = false;
        }
      }
      if (every_one_learned) {
        std::printf(
            "  correct: healed, each of its %d members learned it was replaced within %.3f "
            "s\n",
            replaced, Seconds(absl::Now() - healed));
        figure("partitioned_members_learned_replaced_s", Seconds(absl::Now() - healed), "s");
      }
      // From here on they are as dead for the checks: their writes must be refused.
      for (SimMember* m : dead) m->Silence();
    }
    ok = CheckCorrect(sim, dead, what) && ok;
    if (victim != nullptr) {
      // Its agent, back, finds itself fenced out.
      std::optional<AgentExit> fenced;
      victim_thread->RunOnThread([&] { fenced = victim->CheckFenced(); });
      if (!fenced.has_value()) {
        std::printf("  wrong after %s: its agent does not find itself fenced out\n", what.c_str());
        ok = false;
      } else {
        std::printf("  correct: its agent, turned again, ends fenced out (exit code %d)\n",
                    fenced->code);
      }
    }
  }
  // Connections the server closed at once (its cap or its descriptors): each is a client's retry.
  if (absl::StatusOr<ServerProcess::Counts> counts = counters(); counts.ok()) {
    figure("server_connections_refused", static_cast<double>(counts->refused), "1");
    if (counts->refused > 0) {
      std::printf("  the server refused %lld connection(s) (its cap or its descriptors)\n",
                  static_cast<long long>(counts->refused));
    }
  }
  stop_everything();
  const int problems = sim.problems.count();
  for (const std::string& p : sim.problems.Take()) std::printf("  problem: %s\n", p.c_str());
  result.ok = ok && problems == 0;
  std::fflush(stdout);
  return result;
}

void WriteJson(const std::string& path, const std::vector<SizeResult>& results) {
  std::ofstream out(path);
  out << "{\"benchmark\": \"bench_simulate\", \"sizes\": [";
  for (size_t i = 0; i < results.size(); ++i) {
    const SizeResult& r = results[i];
    out << (i == 0 ? "" : ", ") << "{\"ranks\": " << r.ranks << ", \"hosts\": " << r.hosts
        << ", \"ok\": " << (r.ok ? "true" : "false") << ", \"loadavg\": \"" << r.load << "\"";
    for (const Figure& f : r.figures) out << ", \"" << f.name << "\": " << f.value;
    out << "}";
  }
  out << "]}\n";
}

void PrintTable(const std::vector<SizeResult>& results) {
  std::set<std::string> names;
  for (const SizeResult& r : results) {
    for (const Figure& f : r.figures) names.insert(f.name);
  }
  std::printf("\n%-34s", "figure \\ ranks");
  for (const SizeResult& r : results) std::printf(" %12d", r.ranks);
  std::printf("\n");
  for (const std::string& name : names) {
    std::printf("%-34s", name.c_str());
    for (const SizeResult& r : results) {
      auto it = std::find_if(r.figures.begin(), r.figures.end(),
                             [&](const Figure& f) { return f.name == name; });
      if (it == r.figures.end()) {
        std::printf(" %12s", "-");
      } else {
        std::printf(" %12.4g", it->value);
      }
    }
    std::printf("\n");
  }
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  auto milliseconds = [](absl::string_view value, const char* name,
                         absl::Duration* out) -> absl::Status {
    int ms = 0;
    if (!absl::SimpleAtoi(value, &ms) || ms < 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": '", value, "'"));
    }
    *out = absl::Milliseconds(ms);
    return absl::OkStatus();
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    absl::string_view value = arg;
    absl::Status s;
    if (arg == "--help" || arg == "-h") {
      return absl::CancelledError(
          "usage: bench_simulate [--ranks=8,64,512,4096] [--ranks_per_host=8] "
          "[--faults=rank,host,partition,hang,slow,coordinator] "
          "[--host_timeout_ms=2000] [--heartbeat_ms=0] [--steady_s=10] [--agent_threads=4] "
          "[--timeout_s=120] [--store=tcp|etcd] [--hang_records=1024] [--hang_dump_grace_ms=3000] "
          "[--fail_slow=evict|alert] "
          "[--json=FILE] [--verbose]");
    } else if (absl::ConsumePrefix(&value, "--ranks=")) {
      flags.ranks.clear();
      for (absl::string_view r : absl::StrSplit(value, ',')) {
        int n = 0;
        if (!absl::SimpleAtoi(r, &n) || n < 1) {
          return absl::InvalidArgumentError(absl::StrCat("--ranks: '", r, "' is not positive"));
        }
        flags.ranks.push_back(n);
      }
    } else if (absl::ConsumePrefix(&value, "--ranks_per_host=")) {
      if (!absl::SimpleAtoi(value, &flags.ranks_per_host) || flags.ranks_per_host < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--ranks_per_host: '", value, "' is not positive"));
      }
    } else if (absl::ConsumePrefix(&value, "--faults=")) {
      flags.faults = absl::StrSplit(value, ',', absl::SkipEmpty());
    } else if (absl::ConsumePrefix(&value, "--host_timeout_ms=")) {
      s = milliseconds(value, "--host_timeout_ms", &flags.host_timeout);
    } else if (absl::ConsumePrefix(&value, "--heartbeat_ms=")) {
      s = milliseconds(value, "--heartbeat_ms", &flags.heartbeat);
    } else if (absl::ConsumePrefix(&value, "--steady_s=")) {
      int seconds = 0;
      if (!absl::SimpleAtoi(value, &seconds) || seconds < 0) {
        return absl::InvalidArgumentError(absl::StrCat("--steady_s: '", value, "'"));
      }
      flags.steady = absl::Seconds(seconds);
    } else if (absl::ConsumePrefix(&value, "--agent_threads=")) {
      if (!absl::SimpleAtoi(value, &flags.agent_threads) || flags.agent_threads < 1) {
        return absl::InvalidArgumentError(absl::StrCat("--agent_threads: '", value, "'"));
      }
    } else if (absl::ConsumePrefix(&value, "--timeout_s=")) {
      int seconds = 0;
      if (!absl::SimpleAtoi(value, &seconds) || seconds < 1) {
        return absl::InvalidArgumentError(absl::StrCat("--timeout_s: '", value, "'"));
      }
      flags.timeout = absl::Seconds(seconds);
    } else if (absl::ConsumePrefix(&value, "--store=")) {
      if (value != "tcp" && value != "etcd") {
        return absl::InvalidArgumentError(absl::StrCat("--store: '", value, "' (tcp or etcd)"));
      }
      flags.store = std::string(value);
    } else if (absl::ConsumePrefix(&value, "--hang_records=")) {
      if (!absl::SimpleAtoi(value, &flags.hang_records) || flags.hang_records < 16) {
        return absl::InvalidArgumentError(absl::StrCat("--hang_records: '", value, "' (>= 16)"));
      }
    } else if (absl::ConsumePrefix(&value, "--hang_dump_grace_ms=")) {
      s = milliseconds(value, "--hang_dump_grace_ms", &flags.hang_dump_grace);
    } else if (absl::ConsumePrefix(&value, "--fail_slow=")) {
      if (value == "evict") {
        flags.fail_slow = FailSlowPolicy::kEvict;
      } else if (value == "alert") {
        flags.fail_slow = FailSlowPolicy::kAlert;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--fail_slow: '", value, "' (evict or alert)"));
      }
    } else if (arg == "--verbose") {
      flags.verbose = true;
    } else if (absl::ConsumePrefix(&value, "--json=")) {
      flags.json = std::string(value);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown argument '", arg, "' (--help)"));
    }
    if (!s.ok()) return s;
  }
  for (int n : flags.ranks) {
    if (n < flags.ranks_per_host || n % flags.ranks_per_host != 0) {
      return absl::InvalidArgumentError(absl::StrCat("--ranks: ", n,
                                                     " is not a positive multiple of ",
                                                     flags.ranks_per_host, " (--ranks_per_host)"));
    }
  }
  if (flags.heartbeat < absl::ZeroDuration() || flags.host_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--heartbeat_ms must not be negative and --host_timeout_ms must be positive");
  }
  return flags;
}

}  // namespace
}  // namespace trainguard

int main(int argc, char** argv) {
  absl::StatusOr<trainguard::Flags> flags = trainguard::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "%s\n", std::string(flags.status().message()).c_str());
    return absl::IsCancelled(flags.status()) ? 0 : 2;
  }
  trainguard::bench::RaiseFileLimit();
  signal(SIGPIPE, SIG_IGN);
  // Line by line, so that what a size said survives the simulator's end at any point.
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::vector<trainguard::SizeResult> results;
  int failed = 0;
  for (int ranks : flags->ranks) {
    results.push_back(trainguard::MeasureSize(*flags, ranks));
    if (!results.back().ok) ++failed;
  }
  trainguard::PrintTable(results);
  if (!flags->json.empty()) trainguard::WriteJson(flags->json, results);
  std::printf("%s\n", failed == 0 ? "every size formed, recovered and checked correct"
                                  : "some size failed (see above)");
  return failed == 0 ? 0 : 1;
}
