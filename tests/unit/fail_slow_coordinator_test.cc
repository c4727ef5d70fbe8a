// FailSlowCoordinator (sdk/coordinator/fail_slow_coordinator.h): the coordinator's side of
// `trainguard run --fail-slow`, on an in-memory store at instants a ManualClock sets, with a real
// RendezvousCoordinator and JobCoordinator on that store: no processes, no sleeps. The hosts'
// samples are injected as their agents publish them (agents/metrics/<host>, HostMetricsRecord's
// codec), one per second with deterministic noise.
#include "sdk/coordinator/fail_slow_coordinator.h"

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/agent/failure_history.h"
#include "sdk/agent/renewal_policy.h"
#include "sdk/agent/replacement_policy.h"
#include "sdk/coordinator/standby_replacement.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/store_keys.h"
#include "sdk/health/fail_slow_dump.h"
#include "sdk/health/fail_slow_metrics.h"
#include "sdk/rendezvous/rendezvous.h"
#include "tests/support/agent_fixtures.h"
#include "tests/support/temp_dir.h"
#include "trainguard/clock.h"
#include "trainguard/env.h"
#include "trainguard/events.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr absl::Duration kCall = absl::Seconds(1);
constexpr int kHosts = 5;  // h0..h4, one rank each; a standby host s parks two standbys
constexpr int kContinuity = 5;
constexpr int kWindow = 9;  // the denoise window: a change moves its median at its 5th second
constexpr int kSustained = 7;  // FailSlowOptions::sustained (0.75) of kWindow: 7 of its seconds

// The first second the detector names a host slow from second `onset` on: the host is a candidate
// from its kSustained-th slow second, and must stay one for kContinuity seconds.
constexpr int64_t Confirmed(int64_t onset) { return onset + kSustained - 1 + kContinuity - 1; }

// Deterministic noise in [-1, 1] for (host, second).
double Noise(int host, int64_t second) {
  uint64_t x = (static_cast<uint64_t>(host) << 40) ^ static_cast<uint64_t>(second);
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<double>(x >> 11) / static_cast<double>(1ULL << 52) - 1.0;
}

std::string Host(int h) { return absl::StrCat("h", h); }
std::string Member(const std::string& host, int rank) {
  return store_keys::EncodeMemberId({host, 100, 0, store_keys::MemberId::Role::kRank, rank});
}
std::string Standby(const std::string& host, int index) {
  return store_keys::EncodeMemberId({host, 300, 0, store_keys::MemberId::Role::kStandby, index});
}

class FailSlowCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int r = 0; r < kHosts; ++r) {
      ASSERT_TRUE(store_.Set(store_keys::RdzvJoin(r), Member(Host(r), r), kCall).ok());
    }
    ASSERT_TRUE(rendezvous_.FormInitialGeneration(kHosts, kCall).ok());
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(store_.Set(store_keys::RdzvStandby(Standby("s", i)), "parked", kCall).ok());
    }
    policy_.emplace(ReplacementPolicyOptions{});
    RenewalPolicyOptions renewal;
    renewal.multi_host = true;
    renewal_.emplace(renewal);
    JobCoordinatorOptions job_options;
    job_options.host_id = "h0";
    job_options.call_timeout = kCall;
    job_options.replace_timeout = kCall;
    JobCoordinator::Hooks hooks = testing::QuietJobCoordinatorHooks(&said_, &failed_);
    hooks.coordinating = [this] { return coordinating_; };
    job_ = std::make_unique<JobCoordinator>(&store_, &clock_, &rendezvous_, &*policy_, &*renewal_,
                                            &failures_, job_options, std::move(hooks));
    job_->set_world_size(kHosts);
    strategy_ = testing::UseStandbyReplacement(job_.get(), &*policy_, &said_, &failed_);
  }

  void Start(FailSlowPolicy policy, double max_evict_share = 0.1, std::string trace_path = "") {
    FailSlowCoordinatorOptions options;
    options.policy = policy;
    options.detector.metrics = {{"compute_ms", true}};
    options.detector.continuity = kContinuity;
    options.detector.denoise_window = kWindow;
    options.detector.max_fill = kWindow;
    ASSERT_EQ(FailSlowDetector::SecondsToCandidate(options.detector), kSustained);
    options.max_evict_share = max_evict_share;
    options.ranks_per_host = 1;
    options.dump_dir = FailSlowDumpDir(tmp_.path());
    options.call_timeout = kCall;
    options.trace_path = std::move(trace_path);
    FailSlowCoordinator::Hooks hooks;
    hooks.coordinating = [this] { return coordinating_; };
    hooks.say = [this](const std::string& line) { said_.push_back(line); };
    hooks.record = [this](Event event) { events_.push_back(std::move(event)); };
    absl::StatusOr<std::unique_ptr<FailSlowCoordinator>> created = FailSlowCoordinator::Create(
        &store_, &clock_, Env::Default(), job_.get(), options, std::move(hooks));
    ASSERT_TRUE(created.ok()) << created.status();
    fail_slow_ = *std::move(created);
  }

  // Every host's agent publishes its sample of second `second` (100 ms of compute per step, +-3%,
  // times 1.3 for the hosts of `slow`), then a second passes and the coordinator polls.
  void Second(int64_t second, const std::vector<int>& slow) {
    for (int h = 0; h < kHosts; ++h) {
      const bool is_slow = std::find(slow.begin(), slow.end(), h) != slow.end();
      HostMetricsRecord record;
      record.seq = second;
      record.work = 1;
      record.metrics = {
          {"compute_ms", 100.0 * (1 + 0.03 * Noise(h, second)) * (is_slow ? 1.3 : 1)}};
      ASSERT_TRUE(store_.Set(HostMetricsKey(Host(h)), EncodeHostMetricsRecord(record), kCall).ok());
    }
    clock_.Advance(absl::Seconds(1));
    fail_slow_->Poll(kHosts);
  }
  // Seconds `from`..`to` with the hosts of `slow` slow.
  void Seconds(int64_t from, int64_t to, const std::vector<int>& slow) {
    for (int64_t s = from; s <= to; ++s) Second(s, slow);
  }

  std::vector<std::string> Suspects() const {
    std::vector<std::string> lines;
    for (const std::string& line : said_) {
      if (absl::StartsWith(line, "suspect host ")) lines.push_back(line);
    }
    return lines;
  }
  static std::string Attribute(const Event& event, const std::string& name) {
    for (const auto& [key, value] : event.attributes) {
      if (key == name) return value;
    }
    return "";
  }
  std::optional<std::string> Value(const std::string& key) {
    absl::StatusOr<std::string> value = store_.Get(key, kCall);
    if (!value.ok()) return std::nullopt;
    return *value;
  }
  std::vector<std::string> Dumps() {
    return ListFailSlowDumps(Env::Default(), FailSlowDumpDir(tmp_.path()));
  }

  testing::TempDir tmp_;
  ManualClock clock_{absl::FromUnixSeconds(1'800'000'000)};
  InMemoryStore store_{&clock_};  // its keys' ages by the same clock
  RendezvousCoordinator rendezvous_{&store_, &clock_, "h0"};
  std::optional<ReplacementPolicy> policy_;
  std::optional<RenewalPolicy> renewal_;
  FailureHistory failures_;
  std::unique_ptr<JobCoordinator> job_;
  std::unique_ptr<StandbyReplacement> strategy_;
  std::unique_ptr<FailSlowCoordinator> fail_slow_;
  bool coordinating_ = true;
  std::vector<std::string> said_;
  std::vector<Event> events_;
  std::vector<std::string> failed_;
};

TEST_F(FailSlowCoordinatorTest, ASlowHostIsNamedWhenTheDetectorsWindowIsMetAndNotASecondBefore) {
  Start(FailSlowPolicy::kAlert);
  constexpr int64_t kOnset = 20;
  Seconds(1, kOnset - 1, {});
  Seconds(kOnset, Confirmed(kOnset) - 1, {2});
  EXPECT_THAT(Suspects(), IsEmpty());
  EXPECT_THAT(events_, IsEmpty());
  EXPECT_THAT(Dumps(), IsEmpty());
  Second(Confirmed(kOnset), {2});
  ASSERT_THAT(Suspects(), SizeIs(1));
  EXPECT_THAT(Suspects()[0], HasSubstr("suspect host h2: compute_ms"));
  EXPECT_THAT(Suspects()[0], HasSubstr("among 5 hosts, for 1 continuity window(s) of 5 s"));
  EXPECT_THAT(Suspects()[0], HasSubstr("action: alert"));
  ASSERT_THAT(events_, SizeIs(1));
  EXPECT_EQ(events_[0].type, EventType::kSuspectHost);
  EXPECT_EQ(Attribute(events_[0], "host"), "h2");
  EXPECT_EQ(Attribute(events_[0], "windows"), "1");
  EXPECT_EQ(Attribute(events_[0], "action"), "alert");
  EXPECT_EQ(fail_slow_->second(), Confirmed(kOnset));
}

TEST_F(FailSlowCoordinatorTest, ItPollsOnceASecondByTheClock) {
  Start(FailSlowPolicy::kAlert);
  Second(1, {});
  EXPECT_EQ(fail_slow_->second(), 1);
  clock_.Advance(absl::Seconds(1) - absl::Nanoseconds(1));
  fail_slow_->Poll(kHosts);
  EXPECT_EQ(fail_slow_->second(), 1);
  clock_.Advance(absl::Nanoseconds(1));
  fail_slow_->Poll(kHosts);
  EXPECT_EQ(fail_slow_->second(), 2);
  // No plan yet (world size 0): nothing is read.
  clock_.Advance(absl::Seconds(1));
  fail_slow_->Poll(0);
  EXPECT_EQ(fail_slow_->second(), 2);
}

TEST_F(FailSlowCoordinatorTest, TheDumpHoldsEveryHostsHistoryUpToTheDetection) {
  Start(FailSlowPolicy::kAlert);
  constexpr int64_t kOnset = 20;
  Seconds(1, kOnset - 1, {});
  Seconds(kOnset, Confirmed(kOnset), {2});
  const std::vector<std::string> dumps = Dumps();
  ASSERT_THAT(dumps, SizeIs(1));
  EXPECT_THAT(dumps[0], HasSubstr(absl::StrCat(absl::ToUnixSeconds(clock_.Now()), "-h2.trace")));
  absl::StatusOr<std::string> text = Env::Default()->ReadFileToString(dumps[0]);
  ASSERT_TRUE(text.ok()) << text.status();
  absl::StatusOr<FailSlowDump> dump = ParseFailSlowDump(*text);
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_EQ(dump->header.host, "h2");
  EXPECT_EQ(dump->header.metric, "compute_ms");
  EXPECT_EQ(dump->header.second, Confirmed(kOnset));
  EXPECT_EQ(dump->header.action, "alert");
  ASSERT_EQ(dump->hosts.size(), static_cast<size_t>(kHosts));
  for (const auto& [host, points] : dump->hosts) {
    ASSERT_THAT(points, SizeIs(Confirmed(kOnset))) << host;  // every second so far (< 120)
    EXPECT_EQ(points.front().second, 1);
    EXPECT_EQ(points.back().second, Confirmed(kOnset));
  }
  // The slow host's last second as it published it.
  absl::StatusOr<HostMetricsRecord> last =
      ParseHostMetricsRecord(Value(HostMetricsKey("h2")).value_or(""));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_DOUBLE_EQ(dump->hosts["h2"].back().metrics["compute_ms"], last->metrics.at(0).second);
  EXPECT_NEAR(last->metrics.at(0).second, 100.0 * (1 + 0.03 * Noise(2, Confirmed(kOnset))) * 1.3,
              1e-3);
}

TEST_F(FailSlowCoordinatorTest, TheTraceFileHoldsEverySecondsRecordsAsTheDumpsDo) {
  const std::string trace = tmp_.path() + "/trace.txt";
  Start(FailSlowPolicy::kAlert, 0.1, trace);
  Seconds(1, 3, {});
  absl::StatusOr<std::string> text = Env::Default()->ReadFileToString(trace);
  ASSERT_TRUE(text.ok()) << text.status();
  std::vector<std::string> lines = absl::StrSplit(*text, '\n', absl::SkipEmpty());
  ASSERT_THAT(lines, SizeIs(3 * kHosts));
  EXPECT_TRUE(absl::StartsWith(lines[0], "1 h0 v1 1 "));
  EXPECT_TRUE(absl::StartsWith(lines.back(), "3 h4 v1 3 "));
  EXPECT_EQ(lines.back(), absl::StrCat("3 h4 ", *Value(HostMetricsKey("h4"))));
}

TEST_F(FailSlowCoordinatorTest, ReportOnlyNeverEvictsWindowAfterWindow) {
  Start(FailSlowPolicy::kAlert);
  constexpr int64_t kOnset = 20;
  Seconds(1, kOnset - 1, {});
  Seconds(kOnset, Confirmed(kOnset) + 2 * kContinuity, {2});
  ASSERT_THAT(Suspects(), SizeIs(3));  // one line per continuity window
  for (const Event& e : events_) EXPECT_EQ(Attribute(e, "action"), "alert");
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h2")), std::nullopt);
  EXPECT_THAT(job_->replacements(), IsEmpty());
  EXPECT_EQ(fail_slow_->evictions(), 0);
}

TEST_F(FailSlowCoordinatorTest, EvictFencesTheHostAndQueuesItsRanksForReplacement) {
  Start(FailSlowPolicy::kEvict);
  constexpr int64_t kOnset = 20;
  Seconds(1, kOnset - 1, {});
  Seconds(kOnset, Confirmed(kOnset) - 1, {2});
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h2")), std::nullopt);
  Second(Confirmed(kOnset), {2});
  ASSERT_THAT(events_, SizeIs(1));
  EXPECT_EQ(Attribute(events_[0], "action"), "evict");
  const std::optional<std::string> fence = Value(store_keys::kAgentsDead.Key("h2"));
  ASSERT_TRUE(fence.has_value());
  EXPECT_THAT(*fence, HasSubstr("fail-slow: compute_ms"));
  EXPECT_THAT(*fence, HasSubstr("off its peers for 5 s"));
  ASSERT_THAT(job_->replacements(), SizeIs(1));
  EXPECT_EQ(job_->replacements().front().host, "h2");
  EXPECT_THAT(job_->replacements().front().ranks, ::testing::ElementsAre(2));
  EXPECT_EQ(fail_slow_->evictions(), 1);
  // Dead, it is read no more: no second verdict however slow it stays.
  Seconds(Confirmed(kOnset) + 1, Confirmed(kOnset) + 3 * kContinuity, {2});
  EXPECT_THAT(events_, SizeIs(1));
}

TEST_F(FailSlowCoordinatorTest, EvictRepeatedEvictsOnlyAtTheSecondWindowInARow) {
  Start(FailSlowPolicy::kEvictRepeated);
  constexpr int64_t kOnset = 20;
  Seconds(1, kOnset - 1, {});
  Seconds(kOnset, Confirmed(kOnset) + kContinuity - 1, {2});
  ASSERT_THAT(events_, SizeIs(1));
  EXPECT_THAT(Attribute(events_[0], "action"), HasSubstr("evict-repeated"));
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h2")), std::nullopt);
  Second(Confirmed(kOnset) + kContinuity, {2});
  ASSERT_THAT(events_, SizeIs(2));
  EXPECT_EQ(Attribute(events_[1], "action"), "evict");
  EXPECT_TRUE(Value(store_keys::kAgentsDead.Key("h2")).has_value());
}

TEST_F(FailSlowCoordinatorTest, NoMoreThanTheAllowedShareOfHostsIsEvictedTheRestAreReported) {
  // 5 hosts x 0.1 rounds down to 0: one host may go on metrics alone, not a second.
  Start(FailSlowPolicy::kEvict, /*max_evict_share=*/0.1);
  constexpr int64_t kOnset = 20;
  Seconds(1, kOnset - 1, {});
  Seconds(kOnset, Confirmed(kOnset), {2});
  ASSERT_TRUE(Value(store_keys::kAgentsDead.Key("h2")).has_value());
  // Later h3 turns slow among the four hosts left; parked standbys could take its rank.
  constexpr int64_t kSecondOnset = 60;
  Seconds(Confirmed(kOnset) + 1, kSecondOnset - 1, {2});
  Seconds(kSecondOnset, Confirmed(kSecondOnset), {2, 3});
  ASSERT_THAT(events_, SizeIs(2));
  EXPECT_EQ(Attribute(events_[1], "host"), "h3");
  EXPECT_EQ(Attribute(events_[1], "hosts"), "4");
  EXPECT_THAT(Attribute(events_[1], "action"),
              HasSubstr("not evicted: 1 of at most 1 host(s) evicted on metrics alone"));
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h3")), std::nullopt);
  ASSERT_THAT(job_->replacements(), SizeIs(1));
  EXPECT_EQ(job_->replacements().front().host, "h2");
  EXPECT_EQ(fail_slow_->evictions(), 1);
}

TEST_F(FailSlowCoordinatorTest, WithoutParkedStandbysElsewhereTheHostIsOnlyReported) {
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(rendezvous_.ForgetStandby(Standby("s", i), kCall).ok());
  }
  Start(FailSlowPolicy::kEvict);
  constexpr int64_t kOnset = 20;
  Seconds(1, kOnset - 1, {});
  Seconds(kOnset, Confirmed(kOnset), {2});
  ASSERT_THAT(events_, SizeIs(1));
  EXPECT_THAT(Attribute(events_[0], "action"),
              HasSubstr("not evicted: 0 parked standby(s) elsewhere, 1 needed"));
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h2")), std::nullopt);
}

TEST_F(FailSlowCoordinatorTest, ADeposedCoordinatorSaysWritesAndEvictsNothing) {
  Start(FailSlowPolicy::kEvict);
  constexpr int64_t kOnset = 20;
  Seconds(1, kOnset - 1, {});
  Seconds(kOnset, Confirmed(kOnset) - 1, {2});
  coordinating_ = false;  // the lease passed to another agent just before the confirmation
  Second(Confirmed(kOnset), {2});
  EXPECT_THAT(Suspects(), IsEmpty());
  EXPECT_THAT(events_, IsEmpty());
  EXPECT_THAT(Dumps(), IsEmpty());
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h2")), std::nullopt);
  EXPECT_THAT(job_->replacements(), IsEmpty());
  EXPECT_EQ(fail_slow_->evictions(), 0);
}

TEST_F(FailSlowCoordinatorTest, AnOptionOutOfRangeIsRefusedNamingIt) {
  FailSlowCoordinatorOptions options;
  options.detector.continuity = 0;
  absl::StatusOr<std::unique_ptr<FailSlowCoordinator>> created = FailSlowCoordinator::Create(
      &store_, &clock_, Env::Default(), job_.get(), options, FailSlowCoordinator::Hooks{});
  ASSERT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(created.status().message()), HasSubstr("continuity"));
}

}  // namespace
}  // namespace trainguard
