// The host agent's sample (tools/fail_slow_monitor.h): the TCP counters it reads from a rank's own
// sockets, on real loopback connections of this test process.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <optional>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/health/fail_slow_metrics.h"
#include "tools/fail_slow_monitor.h"

namespace trainguard::tools {
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

}  // namespace
}  // namespace trainguard::tools
