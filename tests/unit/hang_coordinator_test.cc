// HangCoordinator (sdk/coordinator/hang_coordinator.h): what the coordinator does about a declared
// hang, on an in-memory store at instants a ManualClock sets, with a real RendezvousCoordinator and
// JobCoordinator on that store and the ranks' dumps written to a temp dir as the Runtime writes
// them: no processes, no sleeps. One host: the test plays the host's view of its processes
// (Hooks::local_holder). Several hosts: the agents' side (heartbeats, stop reports) is written into
// the store as the agents write it.
#include "sdk/coordinator/hang_coordinator.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/agent/failure_history.h"
#include "sdk/agent/renewal_policy.h"
#include "sdk/agent/replacement_policy.h"
#include "sdk/coordinator/job_coordinator.h"
#include "sdk/coordinator/standby_replacement.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/mutex.h"
#include "sdk/core/store_keys.h"
#include "sdk/rendezvous/rendezvous.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/hang_diagnosis.h"
#include "sdk/watchdog/stack_trace.h"
#include "tests/support/agent_fixtures.h"
#include "tests/support/forwarding_store.h"
#include "tests/support/temp_dir.h"
#include "trainguard/clock.h"
#include "trainguard/env.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr absl::Duration kCall = absl::Seconds(1);
constexpr absl::Duration kHostTimeout = absl::Seconds(3);
constexpr absl::Duration kTick = absl::Milliseconds(250);  // the agents' loop: host timeout / 12
constexpr char kDeclaration[] = "rank 0: hang (collective) at step 12: all_reduce #7 ran 9s";

// Frames as CaptureThreadStacks writes them: a training thread blocked in a gloo allreduce, and
// one asleep inside the step (not where the others wait).
std::vector<std::string> WaitingFrames() {
  return {"__futex_abstimed_wait_common (/lib/x86_64-linux-gnu/libc.so.6+0x8a0d6)",
          "gloo::transport::tcp::UnboundBuffer::waitRecv+0x41 (/usr/lib/libgloo.so.0+0x63d41)",
          "gloo::allreduce(gloo::AllreduceOptions&) (/usr/lib/libgloo.so.0+0x2c4e1)",
          "main (/build/cpp_trainer+0x1f00)"};
}
std::vector<std::string> SleepingFrames() {
  return {"clock_nanosleep+0x57 (/lib/x86_64-linux-gnu/libc.so.6+0xd7bd7)",
          "AbslInternalSleepFor (/usr/lib/libabsl_synchronization.so+0x4b21)",
          "main (/build/cpp_trainer+0x1f00)"};
}

FlightRecord Collective(FlightRecordType type, int64_t seq) {
  FlightRecord r;
  r.type = type;
  r.comm_id = 1;
  r.comm_seq = seq;
  std::snprintf(r.name, sizeof(r.name), "all_reduce");
  return r;
}

// Rank `rank`'s ring: it entered all_reduce #0..entered-1 and left all but the last.
FlightRecorderContents Ring(int rank, int entered) {
  FlightRecorderContents contents;
  contents.segment = FlightRecorder::SegmentName("hang-coordinator-test", rank);
  contents.writer_pid = 1000 + rank;
  for (int s = 0; s < entered; ++s) {
    contents.records.push_back(Collective(FlightRecordType::kCollectiveBegin, s));
    if (s + 1 < entered) contents.records.push_back(Collective(FlightRecordType::kCollectiveEnd, s));
  }
  return contents;
}

// An Env that counts the reads of each file (what the coordinator reads of the dump dir), can
// make each read take a while (on_read advances the test's clock), and lists a directory in name
// order whatever the file system's.
class ReadCountingEnv : public EnvWrapper {
 public:
  using EnvWrapper::EnvWrapper;
  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override {
    absl::StatusOr<std::vector<std::string>> names = target()->GetChildren(dir);
    if (names.ok()) std::sort(names->begin(), names->end());
    return names;
  }
  absl::StatusOr<std::string> ReadFileToString(const std::string& path) override {
    {
      MutexLock lock(&mu_);  // the coordinator's reader may read on several threads
      ++reads_[path];
    }
    if (on_read_) on_read_();
    return target()->ReadFileToString(path);
  }
  std::map<std::string, int> reads() const {
    MutexLock lock(&mu_);
    return reads_;
  }
  // Only with one reading thread (read_threads_ 1): it runs on the thread that reads.
  void set_on_read(std::function<void()> on_read) { on_read_ = std::move(on_read); }

 private:
  mutable Mutex mu_;
  std::map<std::string, int> reads_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_read_;
};

// The ranks' store, recording the keys of every MultiGet sent through it.
class MultiGetRecordingStore : public testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  absl::StatusOr<std::vector<std::optional<std::string>>> MultiGet(
      const std::vector<std::string>& keys, absl::Duration timeout) override {
    multi_gets_.push_back(keys);
    return ForwardingStore::MultiGet(keys, timeout);
  }
  std::vector<std::vector<std::string>>& multi_gets() { return multi_gets_; }

 private:
  std::vector<std::vector<std::string>> multi_gets_;
};

// A kill the coordinator asked for.
struct Kill {
  int rank;
  std::string member;  // empty: this host's process (kill_local)
  bool queued;         // kill_and_replace_stopped: its replacement queued at once
};

std::vector<int> Ranks(const std::vector<Kill>& kills) {
  std::vector<int> ranks;
  for (const Kill& k : kills) ranks.push_back(k.rank);
  return ranks;
}

class HangCoordinatorTest : public ::testing::Test {
 protected:

  // A job of `hosts` hosts of `per_host` ranks each, generation 0 formed; host h0's agent
  // coordinates. `one_host`: h0 is the only host and sees every rank's process (local_holder).
  void Start(int hosts, int per_host, bool one_host) {
    world_size_ = hosts * per_host;
    for (int h = 0; h < hosts; ++h) {
      const std::string host = absl::StrCat("h", h);
      ASSERT_TRUE(store_
                      .Set(store_keys::kAgentJoins.Key(host),
                           store_keys::EncodeJoinRecord({host, h + 1, false, "10.0.0.1", 29500}),
                           kCall)
                      .ok());
      for (int l = 0; l < per_host; ++l) {
        const int rank = h * per_host + l;
        members_.push_back(store_keys::EncodeMemberId(
            {host, 100 * (h + 1), 0, store_keys::MemberId::Role::kRank, rank}));
        ASSERT_TRUE(store_.Set(store_keys::RdzvJoin(rank), members_.back(), kCall).ok());
      }
    }
    ASSERT_TRUE(rendezvous_.FormInitialGeneration(world_size_, kCall).ok());
    BeatAll();

    JobCoordinatorOptions job_options;
    job_options.host_id = "h0";
    job_options.host_timeout = kHostTimeout;
    job_options.call_timeout = kCall;
    job_options.replace_timeout = kCall;
    JobCoordinator::Hooks job_hooks = testing::QuietJobCoordinatorHooks(&said_, &failed_);
    job_hooks.coordinating = [this] { return Gate(); };
    job_ = std::make_unique<JobCoordinator>(&store_, &clock_, &rendezvous_, &policy_, &renewal_,
                                            &failures_, job_options, std::move(job_hooks));
    job_->set_world_size(world_size_);
    strategy_ = testing::UseStandbyReplacement(job_.get(), &policy_, &said_, &failed_);

    HangCoordinatorOptions options;
    options.dump_dir = dumps_.path();
    options.heartbeat_timeout = absl::Seconds(600);
    options.host_quiet = kHostTimeout / 3;
    options.max_hold_off = 2 * kHostTimeout;
    options.store_timeout = kCall;
    options.poll_interval = absl::ZeroDuration();  // every Poll looks: the instants are the test's
    options.dump_read_budget = dump_read_budget_;
    options.read_threads = read_threads_;
    HangCoordinator::Hooks hooks;
    hooks.coordinating = [this] { return Gate(); };
    hooks.say = [this](const std::string& line) { said_.push_back(line); };
    hooks.ranks_store = [this] { return &ranks_store_; };
    hooks.rendezvous = [this] { return &rendezvous_; };
    hooks.restarted_at = [] { return absl::InfinitePast(); };
    hooks.live_rings = [this] { return live_rings_; };
    if (one_host) {
      for (int rank = 0; rank < world_size_; ++rank) {
        LocalHolder& holder = holders_[rank];
        holder.here = true;
        holder.running = true;
        holder.label = absl::StrCat("rank ", rank);
        holder.pid = 100 + rank;
      }
      hooks.local_holder = [this](int rank) { return holders_.at(rank); };
      hooks.kill_local = [this](int rank, int64_t) {
        kills_.push_back({rank, "", false});
        holders_.at(rank).running = false;
      };
    }
    hooks.kill_member = [this](const std::string& member, EventKind kind, const std::string&) {
      EXPECT_EQ(kind, EventKind::kHangSuspect);
      kills_.push_back({RankOf(member), member, false});
    };
    hooks.kill_and_replace_stopped = [this](int rank, const std::string& member, EventKind kind,
                                            const std::string&) {
      EXPECT_EQ(kind, EventKind::kHangSuspect);
      kills_.push_back({rank, member, true});
    };
    hangs_ = std::make_unique<HangCoordinator>(&store_, &clock_, &env_, job_.get(), options,
                                               std::move(hooks));
    hangs_->set_world_size(world_size_);
  }

  bool Gate() { return coordinating_; }
  absl::Duration Elapsed() { return clock_.Now() - start_; }
  int RankOf(const std::string& member) {
    auto it = std::find(members_.begin(), members_.end(), member);
    return it == members_.end() ? -1 : static_cast<int>(it - members_.begin());
  }

  // Rank `rank` writes its dump of generation `generation`'s hang, as the Runtime does: its ring
  // (entered all_reduce #0..entered-1) and its training thread's `frames`.
  void Dump(int rank, int64_t generation, int entered, const std::vector<std::string>& frames,
            const std::string& reason = "hang") {
    ThreadStack training;
    training.tid = 1000 + rank + 1;
    training.name = "train";
    training.answered = true;
    training.frames = frames;
    const std::vector<std::pair<std::string, std::string>> evidence = {
        {"reason", reason},
        {"generation", absl::StrCat(generation)},
        {"step_thread", absl::StrCat(training.tid)},
        {"stacks", FormatThreadStacks({training})}};
    const int number = ++dump_numbers_[rank];
    if (digests_) {
      // With its digest beside it, as the Runtime writes it (WriteHangDump).
      absl::StatusOr<std::string> path =
          WriteHangDump(Ring(rank, entered), rank, evidence,
                        dumps_.File(absl::StrFormat("rank-%05d.", rank)), number);
      ASSERT_TRUE(path.ok()) << path.status();
      ASSERT_EQ(*path, dumps_.File(absl::StrFormat("rank-%05d.%d.pb", rank, number)));
      return;
    }
    // Without: as a rank of a version before the digests wrote it.
    ASSERT_TRUE(
        WriteFlightRecorderDump(Ring(rank, entered), rank, evidence,
                                dumps_.File(absl::StrFormat("rank-%05d.%d.pb", rank, number)))
            .ok());
  }
  void Declare(int64_t generation, const std::string& declaration = kDeclaration) {
    ASSERT_TRUE(store_.Set(store_keys::Hang(generation), declaration, kCall).ok());
  }
  void Abort(int64_t generation, int rank) {
    ASSERT_TRUE(store_.Set(store_keys::HangAborted(generation, rank), "aborted", kCall).ok());
  }
  void Beat(const std::string& host) {
    ASSERT_TRUE(
        store_.Set(store_keys::kAgentHeartbeats.Key(host), absl::StrCat(++beats_[host]), kCall)
            .ok());
  }
  void BeatAll() {
    for (const std::string& member : members_) Beat(store_keys::MemberHost(member));
  }
  // Agent ticks (the hosts of `beating` beating, the coordinator's host duties) and hang polls,
  // every kTick for `d`.
  void Run(absl::Duration d, const std::vector<std::string>& beating) {
    for (absl::Duration t = absl::ZeroDuration(); t < d; t += kTick) {
      clock_.Advance(kTick);
      for (const std::string& host : beating) Beat(host);
      job_->CoordinateHosts();
      hangs_->Poll();
    }
  }
  bool SaidLine(const std::string& part) {
    return std::any_of(said_.begin(), said_.end(),
                       [&](const std::string& line) { return absl::StrContains(line, part); });
  }
  std::string Said() { return absl::StrJoin(said_, "\n"); }

  // An hour before now: the dumps carry the wall clock, and a withdrawal's instant is this clock's.
  const absl::Time start_ = absl::Now() - absl::Hours(1);
  ManualClock clock_{start_};
  InMemoryStore store_{&clock_};  // its keys' ages by the same clock
  RendezvousCoordinator rendezvous_{&store_, &clock_, "h0"};
  ReplacementPolicy policy_{ReplacementPolicyOptions{}};
  RenewalPolicy renewal_{RenewalPolicyOptions{}};
  FailureHistory failures_;
  testing::TempDir dumps_;
  ReadCountingEnv env_{Env::Default()};
  MultiGetRecordingStore ranks_store_{&store_};
  std::unique_ptr<JobCoordinator> job_;
  std::unique_ptr<StandbyReplacement> strategy_;
  std::unique_ptr<HangCoordinator> hangs_;
  int world_size_ = 0;
  absl::Duration dump_read_budget_ = HangCoordinatorOptions{}.dump_read_budget;
  std::vector<std::string> members_;
  std::map<int, LocalHolder> holders_;
  std::map<int, FlightRecorderContents> live_rings_;
  std::map<std::string, int64_t> beats_;
  std::map<int, int> dump_numbers_;
  bool digests_ = false;  // Dump writes each dump's digest beside it
  // One: every dump is read on the polling thread, in name order, as the budget tests count them.
  int read_threads_ = 1;
  bool coordinating_ = true;
  std::vector<std::string> said_;
  std::vector<std::string> failed_;
  std::vector<Kill> kills_;
};

// One host, four ranks: ranks 0, 2, 3 entered all_reduce #4 and wait in it; rank 1 never did. Every
// rank dumped and the declaring rank aborted: the diagnosis names rank 1 and its process is killed.
// A rank of a large job beats less often (RankHeartbeatInterval): its heartbeat counts as standing
// still only after two and a half of its periods, never later than --heartbeat-timeout.
TEST(SilentHeartbeatTest, AtLeastTwoAndAHalfOfTheJobsHeartbeatPeriodsAtMostTheTimeout) {
  HangCoordinatorOptions options;  // silent 2.5 s, timeout 30 s
  EXPECT_EQ(SilentHeartbeat(options, 8), absl::Milliseconds(2500));
  EXPECT_EQ(SilentHeartbeat(options, 4096), absl::Milliseconds(2500));
  EXPECT_EQ(SilentHeartbeat(options, 16384), absl::Seconds(10));            // beats every 4 s
  EXPECT_EQ(SilentHeartbeat(options, 1 << 20), absl::Milliseconds(12500));  // every 5 s
  options.heartbeat_timeout = absl::Seconds(6);
  EXPECT_EQ(SilentHeartbeat(options, 16384), absl::Seconds(6));
  options.silent_heartbeat = absl::Seconds(1);
  EXPECT_EQ(SilentHeartbeat(options, 8), absl::Milliseconds(2500));
}

TEST_F(HangCoordinatorTest, TheSuspectIsTheRankThatNeverEnteredTheCollective) {
  Start(1, 4, /*one_host=*/true);
  Declare(0);
  for (int rank : {0, 2, 3}) Dump(rank, 0, 5, WaitingFrames());
  Dump(1, 0, 4, WaitingFrames());
  Abort(0, 0);
  hangs_->Poll();
  EXPECT_FALSE(hangs_->pending());
  EXPECT_THAT(said_, Contains(absl::StrCat("hang in generation 0: ", kDeclaration)));
  EXPECT_THAT(said_, Contains("hang diagnosis: suspects: rank 1")) << Said();
  EXPECT_TRUE(SaidLine("hang diagnosis: rank 1 never entered all_reduce #4")) << Said();
  EXPECT_THAT(said_, Contains("rank 1 (pid 101) is the hang's suspect: killing it"));
  EXPECT_THAT(Ranks(kills_), ElementsAre(1));
}

// The ranks wrote each dump's digest beside it (as the Runtime does): the coordinator reads the
// digests, not the dumps, and names the same suspects for the same reasons as from the dumps
// (TheSuspectIsTheRankThatNeverEnteredTheCollective, TheSuspectIsTheRankWhoseStackIsElsewhere).
TEST_F(HangCoordinatorTest, TheDigestsBesideTheDumpsAreReadInsteadOfTheDumps) {
  digests_ = true;
  Start(1, 5, /*one_host=*/true);
  Declare(0);
  for (int rank : {0, 3, 4}) Dump(rank, 0, 5, WaitingFrames());
  Dump(1, 0, 4, WaitingFrames());
  Dump(2, 0, 5, SleepingFrames());
  Abort(0, 0);
  hangs_->Poll();
  EXPECT_FALSE(hangs_->pending());
  EXPECT_THAT(said_, Contains("hang diagnosis: suspects: ranks 1,2")) << Said();
  EXPECT_TRUE(SaidLine("hang diagnosis: rank 1 never entered all_reduce #4")) << Said();
  EXPECT_TRUE(SaidLine("hang diagnosis: rank 2's training thread is elsewhere")) << Said();
  EXPECT_THAT(Ranks(kills_), ElementsAre(1, 2));
  ASSERT_EQ(env_.reads().size(), 5u);
  for (const auto& [path, reads] : env_.reads()) {
    EXPECT_TRUE(absl::EndsWith(path, ".digest")) << path;
    EXPECT_EQ(reads, 1) << path;
  }
}

// A dump whose digest is missing (its rank was killed between the two) or unreadable is read
// whole; one whose digest names another rank is too. The suspects are the same.
TEST_F(HangCoordinatorTest, ADumpWithoutAReadableDigestOfItsRankIsReadWhole) {
  digests_ = true;
  Start(1, 4, /*one_host=*/true);
  Declare(0);
  for (int rank : {0, 2, 3}) Dump(rank, 0, 5, WaitingFrames());
  Dump(1, 0, 4, WaitingFrames());
  ASSERT_EQ(std::remove(dumps_.File("rank-00000.1.digest").c_str()), 0);
  std::ofstream(dumps_.File("rank-00001.1.digest"), std::ios::trunc) << "not a digest";
  ASSERT_EQ(std::rename(dumps_.File("rank-00002.1.digest").c_str(),
                        dumps_.File("rank-00003.1.digest").c_str()),
            0);
  Abort(0, 0);
  hangs_->Poll();
  EXPECT_FALSE(hangs_->pending());
  EXPECT_THAT(said_, Contains("hang diagnosis: suspects: rank 1")) << Said();
  EXPECT_TRUE(SaidLine("hang diagnosis: rank 1 never entered all_reduce #4")) << Said();
  EXPECT_THAT(Ranks(kills_), ElementsAre(1));
  std::vector<std::string> read;
  for (const auto& [path, reads] : env_.reads()) read.push_back(path.substr(dumps_.path().size()));
  EXPECT_THAT(read, ElementsAre("/rank-00000.1.pb", "/rank-00001.1.digest", "/rank-00001.1.pb",
                                "/rank-00002.1.pb", "/rank-00003.1.digest", "/rank-00003.1.pb"));
}

// A coordinator reading on several threads (as by default) reads every dump once, its digest or
// the dump whole, and names the same suspects as one reading on its own.
TEST_F(HangCoordinatorTest, DumpsReadOnSeveralThreadsAreEachReadOnceAndDiagnosedAlike) {
  read_threads_ = 3;
  Start(1, 16, /*one_host=*/true);
  Declare(0);
  for (int rank = 0; rank < 16; ++rank) {
    digests_ = rank % 2 == 0;  // half the ranks of an older version: no digests
    if (rank == 5) {
      Dump(rank, 0, 4, WaitingFrames());
    } else if (rank == 10) {
      Dump(rank, 0, 5, SleepingFrames());
    } else {
      Dump(rank, 0, 5, WaitingFrames());
    }
  }
  Abort(0, 0);
  hangs_->Poll();
  EXPECT_FALSE(hangs_->pending());
  EXPECT_THAT(said_, Contains("hang diagnosis: suspects: ranks 5,10")) << Said();
  EXPECT_TRUE(SaidLine("hang diagnosis: rank 5 never entered all_reduce #4")) << Said();
  EXPECT_TRUE(SaidLine("hang diagnosis: rank 10's training thread is elsewhere")) << Said();
  EXPECT_THAT(Ranks(kills_), ElementsAre(5, 10));
  const std::map<std::string, int> reads = env_.reads();
  ASSERT_EQ(reads.size(), 16u);
  for (const auto& [path, count] : reads) {
    EXPECT_EQ(count, 1) << path;
    const int rank = std::stoi(path.substr(dumps_.path().size() + 6, 5));
    EXPECT_TRUE(absl::EndsWith(path, rank % 2 == 0 ? ".digest" : ".pb")) << path;
  }
}

// Ranks 1 and 2 of four never entered all_reduce #4: half the job waiting on the other half says
// nothing of which half is at fault, so no one is killed; the ranks' own timeouts decide.
TEST_F(HangCoordinatorTest, SuspectsNamedByTheDumpsAloneAreReplacedOnlyAsAMinority) {
  Start(1, 4, /*one_host=*/true);
  Declare(0);
  for (int rank : {0, 3}) Dump(rank, 0, 5, WaitingFrames());
  for (int rank : {1, 2}) Dump(rank, 0, 4, WaitingFrames());
  Abort(0, 0);
  hangs_->Poll();
  EXPECT_THAT(said_, Contains("hang diagnosis: suspects: ranks 1,2")) << Said();
  EXPECT_THAT(said_,
              Contains("hang diagnosis: too many suspects to replace; the ranks' own timeouts "
                       "decide"));
  EXPECT_THAT(kills_, IsEmpty());
}

// Every rank entered all_reduce #7; ranks 0, 1, 3 wait in it, rank 2's training thread sleeps
// inside the step: rank 2 is named from its stack and killed.
TEST_F(HangCoordinatorTest, TheSuspectIsTheRankWhoseStackIsElsewhere) {
  Start(1, 4, /*one_host=*/true);
  Declare(0);
  for (int rank : {0, 1, 3}) Dump(rank, 0, 8, WaitingFrames());
  Dump(2, 0, 8, SleepingFrames());
  Abort(0, 0);
  hangs_->Poll();
  EXPECT_THAT(said_, Contains("hang diagnosis: suspects: rank 2")) << Said();
  EXPECT_TRUE(SaidLine("hang diagnosis: rank 2's training thread is elsewhere")) << Said();
  EXPECT_THAT(Ranks(kills_), ElementsAre(2));
}

// Rank 3 wrote no dump (it runs, but its training thread is stuck where it cannot dump): the
// diagnosis waits out the dumps' grace, then names it from its live ring.
TEST_F(HangCoordinatorTest, TheSuspectIsTheRankThatWroteNoDumpOnceTheGraceIsOver) {
  Start(1, 4, /*one_host=*/true);
  live_rings_[3] = Ring(3, 7);
  Declare(0);
  for (int rank : {0, 1, 2}) Dump(rank, 0, 8, WaitingFrames());
  Abort(0, 0);
  hangs_->Poll();
  EXPECT_TRUE(hangs_->pending()) << "rank 3 may still dump";
  EXPECT_THAT(kills_, IsEmpty());
  clock_.Advance(HangArbiterOptions{}.dump_grace - absl::Nanoseconds(1));
  hangs_->Poll();
  EXPECT_THAT(kills_, IsEmpty()) << "1 ns before the grace ends";
  clock_.Advance(absl::Nanoseconds(1));
  hangs_->Poll();
  EXPECT_FALSE(hangs_->pending());
  EXPECT_THAT(said_, Contains("hang diagnosis: suspects: rank 3")) << Said();
  EXPECT_TRUE(SaidLine("rank 3 wrote no dump")) << Said();
  EXPECT_THAT(Ranks(kills_), ElementsAre(3));
}

// The declaring rank's own wait ended before it aborted (a machine-wide stall): the hang is
// withdrawn, its key deleted, and no one is replaced, though the dumps name a suspect.
TEST_F(HangCoordinatorTest, AWithdrawnHangReplacesNoOne) {
  Start(1, 4, /*one_host=*/true);
  Declare(0);
  for (int rank : {0, 2, 3}) Dump(rank, 0, 5, WaitingFrames());
  Dump(1, 0, 4, WaitingFrames());
  ASSERT_TRUE(store_
                  .Set(store_keys::HangWithdrawn(0, 0), "rank 0: its wait ended after 9.5s",
                       kCall)
                  .ok());
  hangs_->Poll();
  EXPECT_FALSE(hangs_->pending());
  EXPECT_THAT(said_, ElementsAre("hang in generation 0 withdrawn: rank 0: its wait ended after "
                                 "9.5s; no one replaced"));
  EXPECT_THAT(kills_, IsEmpty());
  EXPECT_TRUE(absl::IsNotFound(store_.Get(store_keys::Hang(0), kCall).status()));
  EXPECT_TRUE(absl::IsNotFound(store_.Get(store_keys::HangWithdrawn(0, 0), kCall).status()));
  clock_.Advance(absl::Seconds(10));
  hangs_->Poll();
  EXPECT_THAT(kills_, IsEmpty()) << "settled: not taken up again";
}

// The hang waits for rank 1's dump over several polls: each dump is read once, when it appears,
// not at every poll (a job of thousands of ranks dumps hundreds of kilobytes each).
TEST_F(HangCoordinatorTest, EachDumpIsReadOnceHoweverManyPollsTheHangWaits) {
  Start(1, 4, /*one_host=*/true);
  Declare(0);
  for (int rank : {0, 2, 3}) Dump(rank, 0, 5, WaitingFrames());
  Abort(0, 0);
  for (int poll = 0; poll < 5; ++poll) {
    hangs_->Poll();
    clock_.Advance(absl::Milliseconds(100));
  }
  ASSERT_TRUE(hangs_->pending()) << "rank 1 may still dump";
  Dump(1, 0, 4, WaitingFrames());
  hangs_->Poll();
  EXPECT_FALSE(hangs_->pending());
  EXPECT_THAT(said_, Contains("hang diagnosis: suspects: rank 1")) << Said();
  ASSERT_EQ(env_.reads().size(), 4u);
  for (const auto& [path, reads] : env_.reads()) EXPECT_EQ(reads, 1) << path;
}

// Reading the dumps takes a while (100 ms each here): one Poll reads for dump_read_budget (the
// coordinator's loop has other duties), the next ones go on, and the hang is decided on only once
// every dump is read.
TEST_F(HangCoordinatorTest, DumpsAreReadWithinABudgetPerPollAndDecidedOnOnceAllAreRead) {
  dump_read_budget_ = absl::Milliseconds(150);
  Start(1, 4, /*one_host=*/true);
  env_.set_on_read([this] { clock_.Advance(absl::Milliseconds(100)); });
  Declare(0);
  for (int rank : {0, 2, 3}) Dump(rank, 0, 5, WaitingFrames());
  Dump(1, 0, 4, WaitingFrames());
  Abort(0, 0);
  hangs_->Poll();
  EXPECT_EQ(env_.reads().size(), 2u) << "the second read ends past the budget";
  EXPECT_TRUE(hangs_->pending());
  EXPECT_THAT(kills_, IsEmpty()) << "not decided on two dumps of four";
  hangs_->Poll();
  EXPECT_EQ(env_.reads().size(), 4u);
  EXPECT_FALSE(hangs_->pending());
  EXPECT_THAT(said_, Contains("hang diagnosis: suspects: rank 1")) << Said();
  EXPECT_THAT(Ranks(kills_), ElementsAre(1));
}

// A superseded generation whose dumps are not all read yet is not settled: its hang may be in one
// of them.
TEST_F(HangCoordinatorTest, ASupersededGenerationIsNotSettledWhileItsDumpsRemainToBeRead) {
  dump_read_budget_ = absl::Milliseconds(50);
  Start(1, 4, /*one_host=*/true);
  ASSERT_TRUE(rendezvous_.RenewGeneration(kCall).ok());
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(store_.Set(store_keys::Resumed(1, rank), "1", kCall).ok());
  }
  env_.set_on_read([this] { clock_.Advance(absl::Milliseconds(100)); });
  for (int rank : {0, 1, 3}) Dump(rank, 0, 8, WaitingFrames(), "peer hang");
  Dump(2, 0, 8, SleepingFrames(), "hang: hang (phase) at step 40");
  // One dump a poll, in name order: rank 2's hang dump is the third read.
  for (int poll = 0; poll < 2; ++poll) {
    hangs_->Poll();
    EXPECT_FALSE(hangs_->pending());
  }
  hangs_->Poll();
  EXPECT_TRUE(hangs_->pending()) << "found in the third dump read";
  hangs_->Poll();
  EXPECT_EQ(env_.reads().size(), 4u);
  Run(HangArbiterOptions{}.verdict_wait, {});
  EXPECT_FALSE(hangs_->pending());
  EXPECT_THAT(said_, Contains("hang in generation 0: rank 2: hang (phase) at step 40 (its dump; "
                              "generation 0 was superseded before it could publish the hang)"))
      << Said();
  EXPECT_THAT(said_, Contains("hang diagnosis: suspects: rank 2")) << Said();
}

// A dump read, then removed from the dump dir before the diagnosis, is not the rank's dump any
// more: the rank is named for writing none once the grace is over.
TEST_F(HangCoordinatorTest, ADumpRemovedFromTheDumpDirIsForgotten) {
  Start(1, 4, /*one_host=*/true);
  Declare(0);
  for (int rank : {0, 1, 2, 3}) Dump(rank, 0, 5, WaitingFrames());
  hangs_->Poll();
  ASSERT_TRUE(hangs_->pending()) << "every rank runs: the declarer's verdict is awaited";
  ASSERT_EQ(std::remove(dumps_.File("rank-00001.1.pb").c_str()), 0);
  Abort(0, 0);
  clock_.Advance(absl::Milliseconds(100));
  hangs_->Poll();
  EXPECT_TRUE(hangs_->pending()) << "rank 1 may dump again";
  clock_.Advance(HangArbiterOptions{}.dump_grace);
  hangs_->Poll();
  EXPECT_FALSE(hangs_->pending());
  EXPECT_THAT(said_, Contains("hang diagnosis: suspects: rank 1")) << Said();
  EXPECT_TRUE(SaidLine("rank 1 wrote no dump")) << Said();
}

// A rank's newer dump of the same generation (a later hang of it, after a withdrawal) is the one
// the diagnosis reads, though the older was read first.
TEST_F(HangCoordinatorTest, ARanksNewerDumpIsTheOneDiagnosed) {
  Start(1, 4, /*one_host=*/true);
  Declare(0);
  for (int rank : {0, 1, 2, 3}) Dump(rank, 0, 5, WaitingFrames());
  ASSERT_TRUE(
      store_.Set(store_keys::HangWithdrawn(0, 0), "rank 0: its wait ended after 9.5s", kCall).ok());
  hangs_->Poll();
  ASSERT_FALSE(hangs_->pending());
  ASSERT_THAT(kills_, IsEmpty());
  clock_.Advance(absl::Seconds(1));
  // Ranks 0, 2, 3 entered all_reduce #8 this time, rank 1 stalled at #7. (The first dumps are not
  // set aside by their time here: they carry the wall clock, later than this test's clock.)
  Declare(0);
  for (int rank : {0, 2, 3}) Dump(rank, 0, 9, WaitingFrames());
  Dump(1, 0, 8, WaitingFrames());
  Abort(0, 0);
  hangs_->Poll();
  EXPECT_FALSE(hangs_->pending());
  EXPECT_TRUE(SaidLine("hang diagnosis: rank 1 never entered all_reduce #8")) << Said();
  EXPECT_THAT(Ranks(kills_), ElementsAre(1));
}

// While a superseded generation may still hang, every poll asks whether every rank has resumed in
// the current one: only for the ranks not seen resumed yet.
TEST_F(HangCoordinatorTest, OnlyTheRanksNotSeenResumedAreAskedForAgain) {
  Start(1, 4, /*one_host=*/true);
  ASSERT_TRUE(rendezvous_.RenewGeneration(kCall).ok());
  for (int rank : {0, 2}) {
    ASSERT_TRUE(store_.Set(store_keys::Resumed(1, rank), "1", kCall).ok());
  }
  auto resumed_asked = [this] {
    std::vector<std::vector<std::string>> asked;
    for (const std::vector<std::string>& keys : ranks_store_.multi_gets()) {
      if (!keys.empty() && keys[0].find("/resumed/") != std::string::npos) asked.push_back(keys);
    }
    ranks_store_.multi_gets().clear();
    return asked;
  };
  hangs_->Poll();
  EXPECT_THAT(resumed_asked(),
              ElementsAre(ElementsAre(store_keys::Resumed(1, 0), store_keys::Resumed(1, 1),
                                      store_keys::Resumed(1, 2), store_keys::Resumed(1, 3))));
  ASSERT_TRUE(store_.Set(store_keys::Resumed(1, 1), "1", kCall).ok());
  hangs_->Poll();
  EXPECT_THAT(resumed_asked(),
              ElementsAre(ElementsAre(store_keys::Resumed(1, 1), store_keys::Resumed(1, 3))));
  ASSERT_TRUE(store_.Set(store_keys::Resumed(1, 3), "1", kCall).ok());
  hangs_->Poll();
  EXPECT_THAT(resumed_asked(), ElementsAre(ElementsAre(store_keys::Resumed(1, 3))));
  hangs_->Poll();
  EXPECT_THAT(resumed_asked(), IsEmpty()) << "generation 0 is settled: nothing left to ask";
}

// One host: rank 1's process is seen stopped when the hang is: replaced at once, before the others'
// dumps are in; the diagnosis that follows replaces no one else.
TEST_F(HangCoordinatorTest, AStoppedMinorityIsReplacedAtOnce) {
  Start(1, 4, /*one_host=*/true);
  holders_[1].stopped = true;
  live_rings_[1] = Ring(1, 4);
  Declare(0);
  hangs_->Poll();
  EXPECT_THAT(said_, ElementsAre(absl::StrCat("hang in generation 0: ", kDeclaration),
                                 "hang diagnosis: rank(s) 1 stopped (SIGSTOP): replaced now; the "
                                 "diagnosis follows once the others' dumps are in",
                                 "rank 1 (pid 101) is the hang's suspect: killing it"));
  EXPECT_THAT(Ranks(kills_), ElementsAre(1));
  for (int rank : {0, 2, 3}) Dump(rank, 0, 5, WaitingFrames());
  clock_.Advance(absl::Milliseconds(100));
  hangs_->Poll();
  EXPECT_FALSE(hangs_->pending());
  EXPECT_THAT(said_, Contains("hang diagnosis: rank(s) 1 replaced already (stopped); no one else "
                              "is"))
      << Said();
  EXPECT_THAT(Ranks(kills_), ElementsAre(1)) << "killed once";
}

// Several hosts: rank 3 (host h1) is stopped, its agent says (agents/stopped/<member>): the
// coordinator, which cannot see h1's processes, has it killed through h1's agent and queues its
// replacement at once.
TEST_F(HangCoordinatorTest, AStoppedRankOfAnotherHostIsKilledThroughItsAgentAndQueuedAtOnce) {
  Start(2, 2, /*one_host=*/false);
  ASSERT_TRUE(store_.Set(store_keys::kAgentStopped.Key(members_[3]), "T", kCall).ok());
  Declare(0);
  hangs_->Poll();
  EXPECT_THAT(said_, ElementsAre(absl::StrCat("hang in generation 0: ", kDeclaration),
                                 absl::StrCat("hang diagnosis: rank 3 (", members_[3],
                                              ") is stopped, its agent says: it will not dump"),
                                 "hang diagnosis: rank(s) 3 stopped (their agents say): replaced "
                                 "now; the diagnosis follows once the others' dumps are in"));
  ASSERT_EQ(kills_.size(), 1u);
  EXPECT_EQ(kills_[0].member, members_[3]);
  EXPECT_TRUE(kills_[0].queued);
}

// Generation 0 was superseded (renewed) before its hung rank could publish its hang: the store
// fences its writes, but its dump says "hang: ...". The coordinator finds the hang there and, the
// rank still held by the process that hung and not trained since, kills it.
TEST_F(HangCoordinatorTest, ASupersededGenerationsHangIsFoundFromItsDump) {
  Start(1, 4, /*one_host=*/true);
  ASSERT_TRUE(rendezvous_.RenewGeneration(kCall).ok());
  for (int rank : {0, 1, 3}) Dump(rank, 0, 8, WaitingFrames(), "peer hang");
  Dump(2, 0, 8, SleepingFrames(), "hang: hang (phase) at step 40");
  hangs_->Poll();
  ASSERT_TRUE(hangs_->pending());
  // Every rank dumped; the declarer (rank 2) never got to write its verdict: the verdict's wait.
  Run(HangArbiterOptions{}.verdict_wait, {});
  EXPECT_FALSE(hangs_->pending());
  EXPECT_THAT(said_, Contains("hang in generation 0: rank 2: hang (phase) at step 40 (its dump; "
                              "generation 0 was superseded before it could publish the hang)"))
      << Said();
  EXPECT_THAT(said_, Contains("hang diagnosis: suspects: rank 2")) << Said();
  EXPECT_THAT(Ranks(kills_), ElementsAre(2));
}

// The same, but rank 2 completed a step of generation 1 since: it is not hung, and not killed.
TEST_F(HangCoordinatorTest, ASupersededGenerationsSuspectThatTrainedSinceIsNotKilled) {
  Start(1, 4, /*one_host=*/true);
  ASSERT_TRUE(rendezvous_.RenewGeneration(kCall).ok());
  ASSERT_TRUE(store_.Set(store_keys::Resumed(1, 2), "1", kCall).ok());
  for (int rank : {0, 1, 3}) Dump(rank, 0, 8, WaitingFrames(), "peer hang");
  Dump(2, 0, 8, SleepingFrames(), "hang: hang (phase) at step 40");
  hangs_->Poll();
  Run(HangArbiterOptions{}.verdict_wait, {});
  EXPECT_THAT(said_, Contains("rank 2 (pid 102) has trained in generation 1 since: not hung"))
      << Said();
  EXPECT_THAT(kills_, IsEmpty());
}

// Several hosts, and a hang that coincides with a partition: host h1 (ranks 2, 3) is cut off, the
// survivors wait for its ranks and declare a hang, and the cut-off ranks' dumps (which make rank 1
// look like the outlier) still reach the shared run dir. The diagnosis holds off while h1 is
// silent; h1's death explains the hang, and no healthy rank is named or killed.
TEST_F(HangCoordinatorTest, AHangDuringAPartitionWaitsForTheSilentHostWhoseDeathExplainsIt) {
  Start(3, 2, /*one_host=*/false);
  Run(absl::Seconds(1), {"h1", "h2"});
  // h1 goes silent at 1 s; at 2 s rank 0 declares the hang and aborts.
  Run(absl::Seconds(1), {"h2"});
  Declare(0);
  Abort(0, 0);
  for (int rank : {0, 4, 5}) Dump(rank, 0, 8, WaitingFrames());
  Dump(1, 0, 8, SleepingFrames());  // a healthy rank whose step had not reached the collective yet
  for (int rank : {2, 3}) Dump(rank, 0, 8, WaitingFrames());
  Run(kTick, {"h2"});
  EXPECT_THAT(said_, ElementsAre(absl::StrCat("hang in generation 0: ", kDeclaration),
                                 "hang diagnosis: host h1 has sent no heartbeat for 1.25s: the "
                                 "diagnosis waits until it beats again or is declared dead"));
  // Every dump is in and the declarer aborted, h1 still silent: nothing is named.
  Run(absl::Seconds(1.5), {"h2"});
  ASSERT_EQ(Elapsed(), absl::Milliseconds(3750));
  EXPECT_TRUE(hangs_->pending());
  EXPECT_FALSE(SaidLine("suspects")) << Said();
  EXPECT_THAT(kills_, IsEmpty());
  // h1 is declared dead at the host timeout: its death explains the hang.
  Run(kTick, {"h2"});
  EXPECT_THAT(job_->dead_hosts(), Contains("h1"));
  EXPECT_FALSE(hangs_->pending());
  EXPECT_THAT(said_, Contains(absl::StrCat("hang in generation 0 explained by the loss of host h1 "
                                           "(its ranks' replacements take over): ",
                                           kDeclaration)))
      << Said();
  EXPECT_FALSE(SaidLine("suspects")) << Said();
  EXPECT_THAT(kills_, IsEmpty());
  // Settled: later polls do not take it up again.
  Run(absl::Seconds(5), {"h2"});
  EXPECT_THAT(kills_, IsEmpty());
}

// The same hold-off, but the silent host beats again before its timeout (a short stall, not a
// partition): the diagnosis goes on then, with every rank's dump, and names the suspect.
TEST_F(HangCoordinatorTest, AHangHeldOffByASilentHostIsDiagnosedOnceItBeatsAgain) {
  Start(3, 2, /*one_host=*/false);
  Run(absl::Seconds(1), {"h1", "h2"});
  Run(absl::Seconds(1), {"h2"});
  Declare(0);
  Abort(0, 0);
  for (int rank : {0, 2, 3, 4, 5}) Dump(rank, 0, 8, WaitingFrames());
  Dump(1, 0, 8, SleepingFrames());
  Run(absl::Seconds(1), {"h2"});
  EXPECT_TRUE(SaidLine("hang diagnosis: host h1 has sent no heartbeat")) << Said();
  EXPECT_THAT(kills_, IsEmpty());
  Run(kTick, {"h1", "h2"});
  EXPECT_FALSE(hangs_->pending());
  EXPECT_THAT(said_, Contains("hang diagnosis: suspects: rank 1")) << Said();
  ASSERT_EQ(kills_.size(), 1u);
  EXPECT_EQ(kills_[0].member, members_[1]);
  EXPECT_FALSE(kills_[0].queued);
  EXPECT_THAT(job_->dead_hosts(), IsEmpty());
}

// The same partition seen by an agent that has just taken the lease over: its view of the hosts
// starts afresh (every host gets a full timeout), so at first the cut-off host looks no quieter
// than a live one. The diagnosis waits until the view is as old as the quiet time, then holds off
// for the silent host as before.
TEST_F(HangCoordinatorTest, AfterATakeoverAHangWaitsUntilTheNewViewCanTellASilentHost) {
  Start(3, 2, /*one_host=*/false);
  Run(absl::Seconds(1), {"h1", "h2"});
  Run(absl::Seconds(1), {"h2"});  // h1 cut off at 1 s
  job_->TakeOver(kCall);          // at 2 s
  Declare(0);
  Abort(0, 0);
  for (int rank : {0, 2, 3, 4, 5}) Dump(rank, 0, 8, WaitingFrames());
  Dump(1, 0, 8, SleepingFrames());
  Run(absl::Seconds(1), {"h2"});  // the view starts at the first read after the takeover, 2.25 s
  EXPECT_TRUE(hangs_->pending());
  EXPECT_FALSE(SaidLine("suspects")) << Said();
  EXPECT_THAT(kills_, IsEmpty());
  Run(kTick, {"h2"});
  EXPECT_THAT(said_, Contains("hang diagnosis: host h1 has sent no heartbeat for 1s: the diagnosis "
                              "waits until it beats again or is declared dead"))
      << Said();
  Run(absl::Seconds(2), {"h2"});  // h1 declared dead 3 s after the takeover's first read
  EXPECT_THAT(job_->dead_hosts(), Contains("h1"));
  EXPECT_TRUE(SaidLine("hang in generation 0 explained by the loss of host h1")) << Said();
  EXPECT_THAT(kills_, IsEmpty());
}

// A hold-off is bounded: a quiet host that the coordinator no longer watches (it left, so it is
// never declared dead) holds the diagnosis off for max_hold_off (2 x the host timeout) and no longer.
TEST_F(HangCoordinatorTest, AHoldOffEndsAtItsBoundWhenTheQuietHostIsNeverDeclaredDead) {
  Start(3, 2, /*one_host=*/false);
  Run(absl::Seconds(1), {"h1", "h2"});
  ASSERT_TRUE(store_.Set(store_keys::kAgentsLeft.Key("h1"), "0", kCall).ok());
  Run(absl::Seconds(1), {"h2"});
  Declare(0);
  Abort(0, 0);
  for (int rank : {0, 2, 3, 4, 5}) Dump(rank, 0, 8, WaitingFrames());
  Dump(1, 0, 8, SleepingFrames());
  Run(kTick, {"h2"});  // held off from 2.25 s
  EXPECT_TRUE(SaidLine("hang diagnosis: host h1 has sent no heartbeat")) << Said();
  Run(2 * kHostTimeout - kTick, {"h2"});
  EXPECT_TRUE(hangs_->pending());
  EXPECT_THAT(kills_, IsEmpty()) << "1 tick before the bound";
  Run(kTick, {"h2"});
  EXPECT_FALSE(hangs_->pending());
  EXPECT_THAT(said_, Contains("hang diagnosis: held off for 6s: diagnosing without the silent "
                              "host(s)"));
  EXPECT_THAT(job_->dead_hosts(), IsEmpty());
  EXPECT_THAT(Ranks(kills_), ElementsAre(1));
}

// A coordinator whose lease is gone (the gate closed) reads nothing into action: with a declared
// hang, a stopped rank and every dump in, it says nothing, kills no one and deletes no key.
TEST_F(HangCoordinatorTest, ADeposedCoordinatorDoesNothing) {
  Start(1, 4, /*one_host=*/true);
  coordinating_ = false;
  holders_[1].stopped = true;
  Declare(0);
  ASSERT_TRUE(store_.Set(store_keys::HangWithdrawn(0, 0), "its wait ended", kCall).ok());
  for (int rank : {0, 2, 3}) Dump(rank, 0, 5, WaitingFrames());
  for (int i = 0; i < 200; ++i) {
    clock_.Advance(absl::Milliseconds(50));
    hangs_->Poll();
  }
  EXPECT_THAT(said_, IsEmpty());
  EXPECT_THAT(kills_, IsEmpty());
  EXPECT_TRUE(store_.Get(store_keys::Hang(0), kCall).ok());
  EXPECT_TRUE(store_.Get(store_keys::HangWithdrawn(0, 0), kCall).ok());
}

}  // namespace
}  // namespace trainguard
