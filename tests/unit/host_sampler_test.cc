// The host agent's sample (sdk/host_agent/host_sampler.h): the TCP counters it reads from a rank's
// own sockets, on real loopback connections of this test process; what it makes of the values a
// process probe gives; and HostAgent::PublishHostSample, which publishes it once a second, on an
// in-memory store and a ManualClock with a probe's injected values (no process, no sleep).
#include "sdk/host_agent/host_sampler.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/health/fail_slow_metrics.h"
#include "sdk/host_agent/host_agent.h"
#include "tests/support/fake_process_supervisor.h"
#include "trainguard/clock.h"
#include "trainguard/events.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

RankWorkRecord Work(int64_t steps, int64_t step_ns, int64_t collective_ns, int64_t bytes = 0) {
  RankWorkRecord r;
  r.steps = steps;
  r.step_ns = step_ns;
  r.collective_ns = collective_ns;
  r.collective_bytes = bytes;
  return r;
}

// A connected pair over 127.0.0.1 (client and accepted end) and its listener; closed at scope end.
struct LoopbackPair {
  int listener = -1, client = -1, accepted = -1;
  LoopbackPair() {
    listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(addr);
    if (bind(listener, reinterpret_cast<sockaddr*>(&addr), length) != 0 ||
        listen(listener, 1) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
      return;
    }
    client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(client, reinterpret_cast<sockaddr*>(&addr), length) != 0) return;
    accepted = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);  // queued: returns at once
  }
  ~LoopbackPair() {
    for (int fd : {listener, client, accepted}) {
      if (fd >= 0) close(fd);
    }
  }
  bool ok() const { return accepted >= 0; }
};

TEST(ProcessTcpTotals, CountsAProcesssConnectedTcpSocketsButNotItsListeners) {
  const std::optional<TcpSocketTotals> before = ProcessTcpTotals(getpid());
  const int sockets_before = before.has_value() ? before->sockets : 0;
  LoopbackPair pair;
  ASSERT_TRUE(pair.ok());
  const std::optional<TcpSocketTotals> after = ProcessTcpTotals(getpid());
  ASSERT_TRUE(after.has_value()) << "pidfd_getfd on this process's own sockets was refused";
  EXPECT_EQ(after->sockets, sockets_before + 2);
  EXPECT_EQ(after->retransmits, before.has_value() ? before->retransmits : 0)
      << "a fresh loopback connection retransmits nothing";
}

TEST(ProcessTcpTotals, TheRoundTripIsTheMedianOfTheSocketsThatSentDataLately) {
  LoopbackPair pair;
  ASSERT_TRUE(pair.ok());
  const char byte = 'x';
  ASSERT_EQ(write(pair.client, &byte, 1), 1);
  char got = 0;
  ASSERT_EQ(read(pair.accepted, &got, 1), 1);
  // Sent just now: within any window of a second or more, with the RTT its ACK measured.
  const std::optional<TcpSocketTotals> recent = ProcessTcpTotals(getpid(), 1000);
  ASSERT_TRUE(recent.has_value());
  EXPECT_GE(recent->active_sockets, 1);
  EXPECT_GT(recent->active_rtt_ms, 0.0);
  EXPECT_LE(recent->active_sockets, recent->sockets);
  // No socket sent data less than -1 ms ago: none is active, so no round trip is reported.
  const std::optional<TcpSocketTotals> none = ProcessTcpTotals(getpid(), -1);
  ASSERT_TRUE(none.has_value());
  EXPECT_EQ(none->active_sockets, 0);
  EXPECT_EQ(none->active_rtt_ms, 0.0);
}

TEST(HostSampler, PublishesTheBytesPerSecondOfTheRanksCollectives) {
  HostSampler sampler;
  const absl::Time t0 = absl::Now();
  // Ranks 0 and 1 move 2 MB in 20 ms and 1 MB in 40 ms of collectives: 100 and 25 MB/s.
  const auto record = [](int64_t steps, int64_t ms, int64_t collective_ms, int64_t bytes) {
    return EncodeRankWorkRecord(Work(steps, ms * 1'000'000, collective_ms * 1'000'000, bytes));
  };
  ASSERT_FALSE(sampler
                   .Sample(t0, {{0, getpid(), record(10, 50, 20, 1'000'000)},
                                {1, getpid(), record(10, 50, 20, 1'000'000)}})
                   .has_value());
  const std::optional<HostMetricsRecord> sample =
      sampler.Sample(t0 + absl::Seconds(1), {{0, getpid(), record(20, 100, 40, 3'000'000)},
                                             {1, getpid(), record(20, 100, 60, 2'000'000)}});
  ASSERT_TRUE(sample.has_value());
  std::map<std::string, double> metrics(sample->metrics.begin(), sample->metrics.end());
  ASSERT_EQ(metrics.count("collective_mb_s"), 1u);
  EXPECT_DOUBLE_EQ(metrics["collective_mb_s"], (100.0 + 25.0) / 2);
}

TEST(RankWorkRecord, CarriesTheTrainersPhasesWithTheirNamesMadeSafe) {
  RankWorkRecord w = Work(7, 8, 9, 10);
  w.phase_ns = {{"generate", 5'000'000}, {"all=gather me", 3}};
  absl::StatusOr<RankWorkRecord> r = ParseRankWorkRecord(EncodeRankWorkRecord(w));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->phase_ns, ::testing::ElementsAre(::testing::Pair("generate", 5'000'000),
                                                  ::testing::Pair("all_gather_me", 3)));
  EXPECT_FALSE(ParseRankWorkRecord("v1 7 8 9 10 generate=soon").ok());
}

TEST(HostSampler, PublishesTheMillisecondsPerSecondOfEachPhaseOfTheTrainer) {
  HostSampler sampler;
  const absl::Time t0 = absl::Now();
  RankWorkRecord first = Work(10, 50'000'000, 20'000'000);
  first.phase_ns = {{"generate", 100'000'000}};
  ASSERT_FALSE(sampler.Sample(t0, {{0, getpid(), EncodeRankWorkRecord(first)}}).has_value());
  RankWorkRecord second = Work(20, 100'000'000, 40'000'000);
  second.phase_ns = {{"generate", 400'000'000}, {"score", 50'000'000}};  // a phase new this second
  const std::optional<HostMetricsRecord> sample =
      sampler.Sample(t0 + absl::Seconds(2), {{0, getpid(), EncodeRankWorkRecord(second)}});
  ASSERT_TRUE(sample.has_value());
  std::map<std::string, double> metrics(sample->metrics.begin(), sample->metrics.end());
  EXPECT_DOUBLE_EQ(metrics["phase_generate_ms"], 300.0 / 2);
  EXPECT_DOUBLE_EQ(metrics["phase_score_ms"], 50.0 / 2);
}

TEST(RankWorkRecord, RoundTripsWithItsBytesAndReadsARecordWrittenWithoutThem) {
  absl::StatusOr<RankWorkRecord> r = ParseRankWorkRecord(EncodeRankWorkRecord(Work(7, 8, 9, 10)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->steps, 7);
  EXPECT_EQ(r->collective_bytes, 10);
  absl::StatusOr<RankWorkRecord> old = ParseRankWorkRecord("v1 7 8 9");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->collective_ns, 9);
  EXPECT_EQ(old->collective_bytes, 0);
  absl::StatusOr<RankWorkRecord> bad = ParseRankWorkRecord("v1 7 8 9 ten");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("v1 7 8 9 ten"));
}

TEST(ProcessTcpTotals, AProcessThatIsGoneCannotBeRead) {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);  // reaped: the pid names no process now
  EXPECT_FALSE(ProcessTcpTotals(child).has_value());
}

TEST(HostSampler, PublishesTheRanksTcpRetransmissionsPerSecondAndTheirRoundTrip) {
  LoopbackPair pair;
  ASSERT_TRUE(pair.ok());
  const char byte = 'x';
  ASSERT_EQ(write(pair.client, &byte, 1), 1);  // an active connection: its RTT is the rank's
  HostSampler sampler;
  const std::string work = EncodeRankWorkRecord(Work(10, 50'000'000, 20'000'000));
  const absl::Time t0 = absl::Now();
  ASSERT_FALSE(sampler.Sample(t0, {{0, getpid(), work}}).has_value());  // nothing to compare yet
  const std::string later = EncodeRankWorkRecord(Work(20, 100'000'000, 40'000'000));
  const std::optional<HostMetricsRecord> record =
      sampler.Sample(t0 + absl::Seconds(1), {{0, getpid(), later}});
  ASSERT_TRUE(record.has_value());
  std::map<std::string, double> metrics(record->metrics.begin(), record->metrics.end());
  ASSERT_EQ(metrics.count("tcp_retrans"), 1u);
  EXPECT_EQ(metrics["tcp_retrans"], 0.0);
  ASSERT_EQ(metrics.count("tcp_rtt_ms"), 1u);
  EXPECT_GT(metrics["tcp_rtt_ms"], 0.0);
  EXPECT_EQ(record->work, 10);
}

// A probe whose values the test sets per pid: processes that need not exist.
class FakeProcesses final : public ProcessProbe {
 public:
  struct Values {
    int64_t cpu_ticks = -1;
    int64_t run_delay_ns = -1;
    std::optional<TcpSocketTotals> tcp;
  };
  explicit FakeProcesses(std::map<pid_t, Values>* values) : values_(values) {}
  int64_t CpuTicks(pid_t pid) override { return (*values_)[pid].cpu_ticks; }
  double TicksPerSecond() override { return 100; }
  int64_t RunDelayNs(pid_t pid) override { return (*values_)[pid].run_delay_ns; }
  std::optional<TcpSocketTotals> TcpTotals(pid_t pid) override { return (*values_)[pid].tcp; }

 private:
  std::map<pid_t, Values>* values_;
};

TcpSocketTotals Tcp(int64_t retransmits, double rtt_ms) {
  TcpSocketTotals t;
  t.sockets = 2;
  t.retransmits = retransmits;
  t.active_sockets = 1;
  t.active_rtt_ms = rtt_ms;
  return t;
}

std::map<std::string, double> Metrics(const HostMetricsRecord& record) {
  return std::map<std::string, double>(record.metrics.begin(), record.metrics.end());
}

TEST(HostSampler, AveragesWhatItsProbeReadsOfEachRankPerSecond) {
  std::map<pid_t, FakeProcesses::Values> values;
  HostSampler sampler(nullptr, std::nullopt, std::make_unique<FakeProcesses>(&values));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  values[1000] = {0, 0, Tcp(0, 1.0)};
  values[1001] = {0, 0, Tcp(0, 1.0)};
  ASSERT_FALSE(sampler.Sample(t0, {{0, 1000, std::nullopt}, {1, 1001, std::nullopt}}).has_value());
  // Over 2 s: 1 and 3 CPU seconds, 10 and 30 ms runnable but not running, 4 and 0 segments
  // retransmitted; the active connections' round trips are 2 and 4 ms now.
  values[1000] = {100, 10'000'000, Tcp(4, 2.0)};
  values[1001] = {300, 30'000'000, Tcp(0, 4.0)};
  const std::optional<HostMetricsRecord> record =
      sampler.Sample(t0 + absl::Seconds(2), {{0, 1000, std::nullopt}, {1, 1001, std::nullopt}});
  ASSERT_TRUE(record.has_value());
  std::map<std::string, double> metrics = Metrics(*record);
  EXPECT_DOUBLE_EQ(metrics["cpu_util"], (0.5 + 1.5) / 2);
  EXPECT_DOUBLE_EQ(metrics["cpu_wait_ms"], (5.0 + 15.0) / 2);
  EXPECT_DOUBLE_EQ(metrics["tcp_retrans"], (2.0 + 0.0) / 2);
  EXPECT_DOUBLE_EQ(metrics["tcp_rtt_ms"], (2.0 + 4.0) / 2);
  EXPECT_EQ(metrics.count("compute_ms"), 0u) << "no work record, no compute time";
}

TEST(HostSampler, ARankWhoseProcessWasReplacedStartsOver) {
  std::map<pid_t, FakeProcesses::Values> values;
  HostSampler sampler(nullptr, std::nullopt, std::make_unique<FakeProcesses>(&values));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  values[1000] = {0, 0, std::nullopt};
  ASSERT_FALSE(sampler.Sample(t0, {{0, 1000, std::nullopt}}).has_value());
  // Rank 0 is another process now: its counters are not the old one's to subtract from.
  values[2000] = {500, 0, std::nullopt};
  EXPECT_FALSE(sampler.Sample(t0 + absl::Seconds(1), {{0, 2000, std::nullopt}}).has_value());
  values[2000] = {600, 0, std::nullopt};
  const std::optional<HostMetricsRecord> record =
      sampler.Sample(t0 + absl::Seconds(2), {{0, 2000, std::nullopt}});
  ASSERT_TRUE(record.has_value());
  EXPECT_DOUBLE_EQ(Metrics(*record)["cpu_util"], 1.0);
}

// One host's agent with two ranks (pids 1000, 1001) and a standby, as the launcher holds them.
class PublishHostSampleTest : public ::testing::Test {
 protected:
  PublishHostSampleTest() {
    for (int i = 0; i < 3; ++i) {
      auto w = std::make_unique<HostWorker>();
      w->rank = i < 2 ? i : -1;
      w->standby_index = i < 2 ? -1 : 0;
      w->pid = 1000 + i;
      workers_.push_back(std::move(w));
    }
    HostAgentOptions options;
    options.host_id = "h1";
    options.call_timeout = absl::Seconds(1);
    HostAgent::Hooks hooks;
    hooks.workers = [this] {
      std::vector<HostWorker*> all;
      for (auto& w : workers_) all.push_back(w.get());
      return all;
    };
    hooks.say = [](const std::string&) {};
    hooks.record = [](int, EventKind, const std::string&, HostAgent::Attributes) {};
    hooks.latest_term = [] { return int64_t{0}; };
    hooks.pid_file = [](int rank) { return absl::StrCat("/run/job/pids/h1/rank-", rank); };
    hooks.rank_taken = [](HostWorker&) {};
    agent_ = std::make_unique<HostAgent>(&store_, &clock_, &supervisor_, options, std::move(hooks));
    for (pid_t pid : {1000, 1001, 1002}) values_[pid] = {0, 0, std::nullopt};
  }

  // Both ranks' work records: `steps` steps of 100 ms, 40 of them in collectives.
  void Work(int64_t steps) {
    for (int rank : {0, 1}) {
      RankWorkRecord r;
      r.steps = steps;
      r.step_ns = steps * 100'000'000;
      r.collective_ns = steps * 40'000'000;
      ASSERT_TRUE(store_.Set(RankWorkKey(rank), EncodeRankWorkRecord(r), absl::Seconds(1)).ok());
    }
  }
  std::optional<HostMetricsRecord> Published() {
    absl::StatusOr<std::string> text = store_.Get(HostMetricsKey("h1"), absl::Seconds(1));
    if (!text.ok()) return std::nullopt;
    absl::StatusOr<HostMetricsRecord> record = ParseHostMetricsRecord(*text);
    EXPECT_TRUE(record.ok()) << record.status();
    return record.ok() ? std::optional<HostMetricsRecord>(*record) : std::nullopt;
  }

  InMemoryStore store_;
  ManualClock clock_{absl::FromUnixSeconds(1000)};
  testing::FakeProcessSupervisor supervisor_;
  std::vector<std::unique_ptr<HostWorker>> workers_;
  std::map<pid_t, FakeProcesses::Values> values_;
  HostSampler sampler_{nullptr, std::nullopt, std::make_unique<FakeProcesses>(&values_)};
  std::unique_ptr<HostAgent> agent_;
};

TEST_F(PublishHostSampleTest, TheRanksWorkAndProcessesArePublishedOnceASecond) {
  Work(10);
  agent_->PublishHostSample(sampler_, /*ranks_per_host=*/2);
  EXPECT_EQ(Published(), std::nullopt) << "nothing to compare on the first sample";
  clock_.Advance(absl::Seconds(1));
  Work(15);
  values_[1000].cpu_ticks = 100;
  values_[1001].cpu_ticks = 50;
  agent_->PublishHostSample(sampler_, 2);
  std::optional<HostMetricsRecord> first = Published();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->work, 5);
  std::map<std::string, double> metrics = Metrics(*first);
  EXPECT_DOUBLE_EQ(metrics["compute_ms"], 300.0);  // 5 steps x 60 ms outside collectives
  EXPECT_DOUBLE_EQ(metrics["collective_ms"], 200.0);
  EXPECT_DOUBLE_EQ(metrics["cpu_util"], 0.75);  // the standby's process is not the host's work
  // Within the second: not sampled again.
  clock_.Advance(absl::Seconds(1) - absl::Nanoseconds(1));
  Work(30);
  agent_->PublishHostSample(sampler_, 2);
  EXPECT_EQ(Published()->seq, first->seq);
  clock_.Advance(absl::Nanoseconds(1));
  agent_->PublishHostSample(sampler_, 2);
  EXPECT_EQ(Published()->seq, first->seq + 1);
  EXPECT_EQ(Published()->work, 15);
}

TEST_F(PublishHostSampleTest, AHostWithNoRankPublishesNothing) {
  workers_[0]->running = false;
  workers_[1]->rank = -1;  // a standby host: its standbys hold no rank yet
  for (int s = 0; s < 3; ++s) {
    agent_->PublishHostSample(sampler_, 2);
    clock_.Advance(absl::Seconds(1));
  }
  EXPECT_EQ(Published(), std::nullopt);
}

}  // namespace
}  // namespace trainguard
