// bench_scale: how the job's rendezvous scales with its ranks. The real RendezvousMember and
// RendezvousCoordinator (sdk/rendezvous/rendezvous.h) against a TcpStore server in a process of
// its own, as `trainguard run` runs them: no trainer and no collectives, and no host agents yet.
//
//   bench_scale [--ranks=8,64,512,4096] [--heartbeat_ms=1000] [--timeout_s=300] [--floor]
//               [--busy_poll_us=N]
//
// For each R: a fresh server process; R rank members and one parked standby, each on a thread of
// its own with its own store connection (as a rank's process has) and its RendezvousMember (whose
// heartbeat thread beats every --heartbeat_ms); the coordinator on a connection of its own.
// --heartbeat_ms=0: members without a heartbeat thread, which do not beat: one thread and one
// connection per member instead of two, what lets 16,384 ranks fit in this machine's threads and
// file descriptors (the heartbeats' load, R Adds per interval, is then left out).
//  - generation 0: the members are released together and each calls JoinInitial; measured from
//    the last join call to every member holding generation 0's table (the issue's "last join to
//    every member holding the table"), and from the release.
//  - one rank replaced: rank R/2 is taken as dead (its member takes no part in generation 1), and
//    the coordinator publishes generation 1 in which the standby takes it (ReplaceRank, as
//    JobCoordinator does once the death is decided); measured from the publication's start to
//    every survivor holding generation 1 (AwaitGeneration) and the standby its rank, and to every
//    one of them holding the plan they agreed on (AgreeOnResume), as the survivors and the
//    replacement do before their first step.
// With each figure: the store requests the server served meanwhile, per rank, and the CPU time the
// members' process and the server's used meanwhile (what a phase costs, which the machine's other
// load hardly changes, unlike how long it takes).
//
// --busy_poll_us: the TcpStore's busy polling on the server and every client (unset: their
// defaults; 0: none).
// --floor: before each size, what the kernel alone needs to wake that many threads on this machine,
// a floor under any store's answer to that many parked members: (a) every thread parked on one
// futex, released by one wake-all; (b) every thread blocked reading an eventfd of its own, released
// by one thread writing each in turn (a store server answering each parked Wait with a syscall of
// its own, without the TCP, the framing or the request). Measured from the release to the last
// thread running.
//
// A size the machine cannot hold (two threads and one connection per member: the process's file
// descriptors, the kernel's threads) is said and skipped, never reported as a measurement.
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/scale_server.h"
#include "sdk/core/agent_keys.h"
#include "sdk/rendezvous/rendezvous.h"
#include "sdk/rendezvous/tcp_store.h"
#include "trainguard/clock.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using bench::Connect;
using bench::MachineCannotHold;
using bench::ServerProcess;

constexpr int kRanksPerHost = 8;
// The step every survivor offers in generation 1 (the standby offers -1: it has no state).
constexpr int64_t kResumeStep = 100;

struct Flags {
  std::vector<int> ranks = {8, 64, 512, 4096};
  absl::Duration heartbeat = absl::Seconds(1);
  absl::Duration timeout = absl::Seconds(300);
  bool floor = false;
  // The TcpStore's busy polling, server and clients alike; unset: their defaults.
  std::optional<absl::Duration> busy_poll;
};

std::string MemberOf(int rank, bool standby) {
  store_keys::MemberId id;
  id.host = absl::StrCat("host", rank / kRanksPerHost);
  id.pid = 1000 + rank / kRanksPerHost;
  id.role = standby ? store_keys::MemberId::Role::kStandby : store_keys::MemberId::Role::kRank;
  id.index = standby ? 0 : rank;
  return store_keys::EncodeMemberId(id);
}

struct Member {
  std::unique_ptr<Store> store;
  std::unique_ptr<RendezvousMember> member;
  absl::Time joined;  // when it called JoinInitial (ParkAsStandby)
  absl::Time held;    // when it returned with generation 0 (its rank, for the standby)
  absl::Time held_replacement;
  absl::Time agreed;  // when it returned from AgreeOnResume in generation 1
  absl::Status status;
  absl::Status agreement;  // AgreeOnResume's
};

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// The CPU time (user and system, every thread's, in seconds) process `pid` has used so far, from
// /proc/<pid>/stat; -1 when unreadable. Unlike the time a phase takes, the CPU it costs hardly
// depends on what else the machine runs.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
  const size_t end = text.rfind(')');
  if (end == std::string::npos) return -1;
  std::vector<std::string> fields = absl::StrSplit(text.substr(end + 2), ' ');
  int64_t user = 0;
  int64_t system = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &user) ||
      !absl::SimpleAtoi(fields[12], &system)) {
    return -1;
  }
  return static_cast<double>(user + system) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// The CPU time this process (the members and the coordinator) and the server's have used so far.
struct CpuUse {
  double members = 0;
  double server = 0;
};
CpuUse CpuNow(pid_t server) { return {CpuSeconds(getpid()), CpuSeconds(server)}; }

// The floor's two releases of `threads` threads (see the top of the file): the time from each
// release to the last thread running. False when the machine cannot hold them (said why).
bool MeasureWakeFloor(int threads) {
  if (std::optional<std::string> why = MachineCannotHold(threads + 64, threads + 256);
      why.has_value()) {
    std::printf("ranks=%d: floor not measured on this machine: %s\n", threads, why->c_str());
    return false;
  }
  std::vector<int> events(threads, -1);
  for (int i = 0; i < threads; ++i) {
    events[i] = eventfd(0, EFD_CLOEXEC);
    if (events[i] < 0) {
      std::printf("ranks=%d: floor: eventfd: %s\n", threads, strerror(errno));
      for (int fd : events) {
        if (fd >= 0) close(fd);
      }
      return false;
    }
  }
  std::atomic<int> futex{0};
  std::latch parked(threads + 1);
  std::vector<absl::Time> woken_futex(threads);
  std::vector<absl::Time> woken_event(threads);
  std::vector<std::thread> pool;
  pool.reserve(threads);
  const uint64_t one = 1;
  for (int i = 0; i < threads; ++i) {
    try {
      pool.emplace_back([&, i] {
        parked.arrive_and_wait();
        futex.wait(0);
        woken_futex[i] = absl::Now();
        uint64_t value = 0;
        while (read(events[i], &value, sizeof(value)) < 0 && errno == EINTR) {
        }
        woken_event[i] = absl::Now();
      });
    } catch (const std::system_error& e) {
      // The machine's threads ran out (other processes hold them): the ones started are released
      // and the floor is not measured.
      parked.count_down(threads + 1 - i);
      futex.store(1);
      futex.notify_all();
      for (int fd : events) (void)!write(fd, &one, sizeof(one));
      for (std::thread& t : pool) t.join();
      for (int fd : events) close(fd);
      std::printf("ranks=%d: floor not measured: thread %d of %d: %s\n", threads, i, threads,
                  e.what());
      return false;
    }
  }
  parked.arrive_and_wait();
  absl::SleepFor(absl::Milliseconds(200));  // every thread parked on the futex by now (very likely)
  const absl::Time futex_released = absl::Now();
  futex.store(1);
  futex.notify_all();
  absl::SleepFor(absl::Milliseconds(500));  // every thread blocked on its eventfd by now
  const absl::Time events_released = absl::Now();
  for (int fd : events) (void)!write(fd, &one, sizeof(one));
  const absl::Time written = absl::Now();
  for (std::thread& t : pool) t.join();
  for (int fd : events) close(fd);
  std::printf(
      "ranks=%d: floor: %d threads parked on one futex all running %.3f s after the wake-all; "
      "blocked on an eventfd each, all running %.3f s after one thread began writing them (the "
      "writes took %.3f s)\n",
      threads, threads,
      Seconds(*std::max_element(woken_futex.begin(), woken_futex.end()) - futex_released),
      Seconds(*std::max_element(woken_event.begin(), woken_event.end()) - events_released),
      Seconds(written - events_released));
  std::fflush(stdout);
  return true;
}

// One size: returns false when it could not be measured (said why).
bool MeasureSize(const Flags& flags, int ranks) {
  const int members = ranks + 1;  // and one standby
  // A member's heartbeat thread beats while its other thread waits in the rendezvous: a thread and
  // a connection more each.
  const bool beating = flags.heartbeat != absl::ZeroDuration();
  const int per_member = beating ? 2 : 1;
  if (std::optional<std::string> why =
          MachineCannotHold(per_member * members + 64, per_member * members + 256);
      why.has_value()) {
    std::printf("ranks=%d: not measured on this machine: %s\n", ranks, why->c_str());
    return false;
  }
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(
      std::max(TcpStoreServerOptions{}.max_connections, per_member * members + 64),
      flags.busy_poll);
  if (!server.ok()) {
    std::printf("ranks=%d: %s\n", ranks, server.status().ToString().c_str());
    return false;
  }
  absl::StatusOr<std::unique_ptr<Store>> coordinator_store =
      Connect((*server)->port(), flags.timeout, flags.busy_poll);
  if (!coordinator_store.ok()) {
    std::printf("ranks=%d: coordinator: %s\n", ranks,
                coordinator_store.status().ToString().c_str());
    return false;
  }
  RendezvousCoordinator coordinator(coordinator_store->get(), Clock::Real(), "bench");

  // Every member's connection and member object first, so that the measured part is the
  // rendezvous, not the connections' handshakes.
  std::vector<Member> all(members);
  for (int i = 0; i < members; ++i) {
    absl::StatusOr<std::unique_ptr<Store>> store =
        Connect((*server)->port(), flags.timeout, flags.busy_poll);
    if (!store.ok()) {
      std::printf("ranks=%d: member %d: %s\n", ranks, i, store.status().ToString().c_str());
      return false;
    }
    all[i].store = *std::move(store);
    all[i].member =
        std::make_unique<RendezvousMember>(all[i].store.get(), MemberOf(i, i == ranks),
                                           beating ? flags.heartbeat : absl::InfiniteDuration());
  }

  const int dead = ranks / 2;
  std::latch release(members + 1);
  std::latch in_generation0(members);  // every rank holding generation 0, the standby parked
  std::vector<std::thread> threads;
  threads.reserve(members);
  for (int i = 0; i < members; ++i) {
    threads.emplace_back([&, i] {
      Member& m = all[i];
      release.arrive_and_wait();
      m.joined = absl::Now();
      if (i == ranks) {  // the standby: parked until it takes the dead rank
        in_generation0.count_down();
        absl::StatusOr<Membership> taken = m.member->ParkAsStandby(flags.timeout);
        m.held_replacement = absl::Now();
        m.status = taken.status();
        if (!taken.ok()) return;
        m.agreement = m.member->AgreeOnResume(*taken, /*next_step=*/-1, flags.timeout).status();
        m.agreed = absl::Now();
        return;
      }
      absl::StatusOr<Membership> g0 = m.member->JoinInitial(i, ranks, flags.timeout);
      m.held = absl::Now();
      m.status = g0.status();
      in_generation0.count_down();
      if (!g0.ok() || i == dead) return;  // the dead rank waits for nothing more
      absl::StatusOr<Membership> g1 = m.member->AwaitGeneration(g0->generation, flags.timeout);
      m.held_replacement = absl::Now();
      m.status = g1.status();
      if (!g1.ok()) return;
      m.agreement = m.member->AgreeOnResume(*g1, kResumeStep, flags.timeout).status();
      m.agreed = absl::Now();
    });
  }
  absl::StatusOr<ServerProcess::Counts> before = (*server)->Counters();
  const CpuUse cpu_before = CpuNow((*server)->pid());
  release.arrive_and_wait();
  const absl::Time released = absl::Now();
  absl::StatusOr<Membership> g0 = coordinator.FormInitialGeneration(ranks, flags.timeout);
  in_generation0.wait();
  const CpuUse cpu_g0 = CpuNow((*server)->pid());
  absl::StatusOr<ServerProcess::Counts> after_g0 = (*server)->Counters();

  // One rank replaced, as the coordinator does once its death is decided.
  const absl::Time replace_start = absl::Now();
  absl::StatusOr<Membership> g1 = g0.ok() ? coordinator.ReplaceRank(dead, flags.timeout)
                                          : absl::StatusOr<Membership>(g0.status());
  if (!g1.ok()) {
    // Nobody publishes generation 1: the survivors' waits end at their timeout.
    std::printf("ranks=%d: replacement: %s\n", ranks, g1.status().ToString().c_str());
  }
  for (std::thread& t : threads) t.join();
  const CpuUse cpu_g1 = CpuNow((*server)->pid());
  absl::StatusOr<ServerProcess::Counts> after_g1 = (*server)->Counters();

  absl::Time last_join = absl::InfinitePast();
  absl::Time last_held = absl::InfinitePast();
  absl::Time last_replaced = absl::InfinitePast();
  absl::Time last_agreed = absl::InfinitePast();
  int failed = 0;
  int disagreed = 0;
  for (int i = 0; i < members; ++i) {
    if (!all[i].status.ok()) {
      if (failed++ == 0) {
        std::printf("ranks=%d: member %d: %s\n", ranks, i, all[i].status.ToString().c_str());
      }
      continue;
    }
    last_join = std::max(last_join, all[i].joined);
    if (i < ranks) last_held = std::max(last_held, all[i].held);
    if (i != dead) {
      last_replaced = std::max(last_replaced, all[i].held_replacement);
      last_agreed = std::max(last_agreed, all[i].agreed);
      if (!all[i].agreement.ok() && disagreed++ == 0) {
        std::printf("ranks=%d: member %d: %s\n", ranks, i, all[i].agreement.ToString().c_str());
      }
    }
  }
  if (!g0.ok() || failed > 0) {
    std::printf("ranks=%d: generation 0: %s; %d member(s) failed\n", ranks,
                g0.status().ToString().c_str(), failed);
    return false;
  }
  std::printf(
      "ranks=%d hosts=%d: generation 0 held by every member %.3f s after the last join (%.3f s "
      "after the release)",
      ranks, (ranks + kRanksPerHost - 1) / kRanksPerHost, Seconds(last_held - last_join),
      Seconds(last_held - released));
  if (before.ok() && after_g0.ok()) {
    std::printf(", %.1f store requests per rank",
                static_cast<double>(after_g0->requests - before->requests) / ranks);
  }
  if (g1.ok()) {
    std::printf(
        "; one rank replaced: every member in generation 1 %.3f s after the publication's "
        "start",
        Seconds(last_replaced - replace_start));
    if (disagreed == 0) {
      std::printf(", and agreed on the resume step %.3f s after it",
                  Seconds(last_agreed - replace_start));
    } else {
      std::printf(", and %d member(s) failed to agree on the resume step", disagreed);
    }
    if (after_g0.ok() && after_g1.ok()) {
      std::printf(" (%.1f store requests per rank)",
                  static_cast<double>(after_g1->requests - after_g0->requests) / ranks);
    }
  }
  std::printf(
      "; CPU: generation 0 %.2f s (server %.2f s), the replacement and agreement %.2f s (server "
      "%.2f s)",
      cpu_g0.members + cpu_g0.server - cpu_before.members - cpu_before.server,
      cpu_g0.server - cpu_before.server,
      cpu_g1.members + cpu_g1.server - cpu_g0.members - cpu_g0.server,
      cpu_g1.server - cpu_g0.server);
  if (after_g1.ok() && after_g1->refused > 0) {
    std::printf("; the server refused %lld connections", static_cast<long long>(after_g1->refused));
  }
  if (!beating) std::printf(" (no heartbeats)");
  std::printf("\n");
  std::fflush(stdout);
  return g1.ok() && disagreed == 0;
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      return absl::CancelledError(
          "usage: bench_scale [--ranks=8,64,512,4096] [--heartbeat_ms=1000] [--timeout_s=300] "
          "[--floor] [--busy_poll_us=N]");
    }
    absl::string_view value = arg;
    if (absl::ConsumePrefix(&value, "--ranks=")) {
      flags.ranks.clear();
      for (absl::string_view r : absl::StrSplit(value, ',')) {
        int n = 0;
        if (!absl::SimpleAtoi(r, &n) || n < 2) {
          return absl::InvalidArgumentError(absl::StrCat("--ranks: '", r, "' is not a count >= 2"));
        }
        flags.ranks.push_back(n);
      }
    } else if (absl::ConsumePrefix(&value, "--heartbeat_ms=")) {
      int ms = 0;
      if (!absl::SimpleAtoi(value, &ms) || ms < 0) {
        return absl::InvalidArgumentError(absl::StrCat("--heartbeat_ms: '", value, "'"));
      }
      flags.heartbeat = absl::Milliseconds(ms);
    } else if (absl::ConsumePrefix(&value, "--busy_poll_us=")) {
      int us = 0;
      if (!absl::SimpleAtoi(value, &us) || us < 0) {
        return absl::InvalidArgumentError(absl::StrCat("--busy_poll_us: '", value, "'"));
      }
      flags.busy_poll = absl::Microseconds(us);
    } else if (arg == "--floor") {
      flags.floor = true;
    } else if (absl::ConsumePrefix(&value, "--timeout_s=")) {
      int s = 0;
      if (!absl::SimpleAtoi(value, &s) || s < 1) {
        return absl::InvalidArgumentError(absl::StrCat("--timeout_s: '", value, "'"));
      }
      flags.timeout = absl::Seconds(s);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown argument '", arg, "' (--help)"));
    }
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
  int failed = 0;
  for (int ranks : flags->ranks) {
    if (flags->floor && !trainguard::MeasureWakeFloor(ranks)) ++failed;
    if (!trainguard::MeasureSize(*flags, ranks)) ++failed;
  }
  return failed == 0 ? 0 : 1;
}
