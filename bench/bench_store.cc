// bench_store: throughput and latency of Store backends, and the time of a rendezvous-shaped
// barrier, over loopback.
//
//   bench_store [--backends=tcp,etcd,in_memory] [--workloads=ops,rendezvous] [--clients=1,16,64]
//               [--ops=2000] [--value_bytes=64] [--rendezvous=64,256,1024] [--repeat=3]
//               [--busy_poll_us=N]
//
// ops: for each client count C and each operation (set, get, add), C threads, each with its own
// client, issue --ops operations back to back; reported: total operations per second and the p50
// and p99 latency of one operation. `add` hits one shared counter (the contended case of a
// barrier); `set` and `get` use a key per client.
//
// rendezvous: for each N, a fresh service and N threads that each connect, Set their own key, Add
// 1 to a counter, the one that brings it to N sets "done", and all Wait for "done": the time from
// the start signal until every thread has returned (the best and the median of --repeat runs).
//
// --busy_poll_us sets the tcp backend's TcpStoreOptions::busy_poll and
// TcpStoreServerOptions::busy_poll (0: every wait sleeps at once; unset: their defaults), to
// measure what polling buys.
//
// A backend is a name and a function that starts the service and returns a client factory (see
// Backends()). `etcd` starts a real /usr/bin/etcd (scripts/setup.sh installs it) per measurement.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "sdk/rendezvous/etcd_store.h"
#include "sdk/rendezvous/tcp_store.h"
#include "tests/support/etcd_process.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);

// A running service and its clients.
class BackendInstance {
 public:
  virtual ~BackendInstance() = default;
  virtual absl::StatusOr<std::unique_ptr<Store>> NewClient() = 0;
};

struct Flags {
  std::vector<std::string> backends = {"tcp"};
  std::vector<std::string> workloads = {"ops", "rendezvous"};
  std::vector<int> clients = {1, 16, 64};
  int ops = 2000;
  int value_bytes = 64;
  std::vector<int> rendezvous = {64, 256, 1024};
  int repeat = 3;
  // Both sides' busy_poll; unset: each side's default.
  std::optional<absl::Duration> busy_poll;
};

struct Backend {
  std::string name;
  std::function<absl::StatusOr<std::unique_ptr<BackendInstance>>(const Flags&)> start;
};

class TcpBackend final : public BackendInstance {
 public:
  static absl::StatusOr<std::unique_ptr<BackendInstance>> Start(const Flags& flags) {
    TcpStoreServerOptions options;
    options.job_token = "bench-token";
    if (flags.busy_poll.has_value()) options.busy_poll = *flags.busy_poll;
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start(options);
    if (!server.ok()) return server.status();
    return std::unique_ptr<BackendInstance>(new TcpBackend(*std::move(server), flags.busy_poll));
  }
  absl::StatusOr<std::unique_ptr<Store>> NewClient() override {
    TcpStoreOptions options;
    options.port = server_->port();
    options.job_id = "bench";
    options.job_token = "bench-token";
    options.connect_timeout = kTimeout;
    if (busy_poll_.has_value()) options.busy_poll = *busy_poll_;
    absl::StatusOr<std::unique_ptr<TcpStore>> client = TcpStore::Connect(options);
    if (!client.ok()) return client.status();
    return std::unique_ptr<Store>(*std::move(client));
  }

 private:
  TcpBackend(std::unique_ptr<TcpStoreServer> server, std::optional<absl::Duration> busy_poll)
      : server_(std::move(server)), busy_poll_(busy_poll) {}
  std::unique_ptr<TcpStoreServer> server_;
  const std::optional<absl::Duration> busy_poll_;
};

// A real etcd (tests/support/etcd_process.h: /usr/bin/etcd on loopback, its data in a fresh
// temporary directory on disk) and EtcdStore clients through its JSON gateway.
class EtcdBackend final : public BackendInstance {
 public:
  static absl::StatusOr<std::unique_ptr<BackendInstance>> Start(const Flags&) {
    absl::StatusOr<std::unique_ptr<testing::EtcdProcess>> etcd = testing::EtcdProcess::Start();
    if (!etcd.ok()) return etcd.status();
    return std::unique_ptr<BackendInstance>(new EtcdBackend(*std::move(etcd)));
  }
  absl::StatusOr<std::unique_ptr<Store>> NewClient() override {
    EtcdStoreOptions options;
    options.endpoints = {etcd_->endpoint()};
    options.job_id = "bench";
    options.connect_timeout = kTimeout;
    absl::StatusOr<std::unique_ptr<EtcdStore>> client = EtcdStore::Connect(options);
    if (!client.ok()) return client.status();
    return std::unique_ptr<Store>(*std::move(client));
  }

 private:
  explicit EtcdBackend(std::unique_ptr<testing::EtcdProcess> etcd) : etcd_(std::move(etcd)) {}
  std::unique_ptr<testing::EtcdProcess> etcd_;
};

// The cost of the Store semantics alone, without a network: a floor for the others.
class InMemoryBackend final : public BackendInstance {
 public:
  absl::StatusOr<std::unique_ptr<Store>> NewClient() override { return store_.NewClient(); }

 private:
  InMemoryStore store_;
};

std::vector<Backend> Backends() {
  return {
      {"tcp", &TcpBackend::Start},
      {"etcd", &EtcdBackend::Start},
      {"in_memory",
       [](const Flags&) -> absl::StatusOr<std::unique_ptr<BackendInstance>> {
         return std::unique_ptr<BackendInstance>(new InMemoryBackend);
       }},
  };
}

[[noreturn]] void Usage(const std::string& error, int exit_code = 2) {
  std::fprintf(exit_code == 0 ? stdout : stderr,
               "bench_store: %s\nusage: bench_store [--backends=tcp,etcd,in_memory] "
               "[--workloads=ops,rendezvous] [--clients=1,16,64] [--ops=2000] [--value_bytes=64] "
               "[--rendezvous=64,256,1024] [--repeat=3] [--busy_poll_us=N]\n",
               error.c_str());
  std::exit(exit_code);
}

std::vector<int> ParseInts(const std::string& flag, const std::string& text) {
  std::vector<int> values;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0)
      Usage(absl::StrCat(flag, ": bad number '", part, "'"));
    values.push_back(v);
  }
  return values;
}

Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help") Usage("store benchmarks (see the comment atop bench/bench_store.cc)", 0);
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) Usage("bad argument " + arg);
    const std::string name = arg.substr(2, eq - 2);
    const std::string value = arg.substr(eq + 1);
    if (name == "backends") {
      flags.backends = absl::StrSplit(value, ',');
    } else if (name == "workloads") {
      flags.workloads = absl::StrSplit(value, ',');
    } else if (name == "clients") {
      flags.clients = ParseInts(name, value);
    } else if (name == "ops") {
      flags.ops = ParseInts(name, value).front();
    } else if (name == "value_bytes") {
      flags.value_bytes = ParseInts(name, value).front();
    } else if (name == "rendezvous") {
      flags.rendezvous = ParseInts(name, value);
    } else if (name == "repeat") {
      flags.repeat = ParseInts(name, value).front();
    } else if (name == "busy_poll_us") {
      int us = 0;
      if (!absl::SimpleAtoi(value, &us) || us < 0) Usage("--busy_poll_us: bad number " + value);
      flags.busy_poll = absl::Microseconds(us);
    } else {
      Usage("unknown flag --" + name);
    }
  }
  return flags;
}

void Check(const absl::Status& status, const std::string& what) {
  if (status.ok()) return;
  std::fprintf(stderr, "bench_store: %s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}

// 1024 clients and as many server-side sockets need more than the usual 1024 descriptors.
void RaiseFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<int64_t>& sorted_ns, double p) {
  if (sorted_ns.empty()) return 0;
  const size_t index = std::min(sorted_ns.size() - 1,
                                static_cast<size_t>(p * static_cast<double>(sorted_ns.size())));
  return static_cast<double>(sorted_ns[index]) / 1e3;
}

void RunOps(const Backend& backend, const Flags& flags) {
  const std::string value(flags.value_bytes, 'v');
  std::printf("\n%-10s %-4s %7s %12s %10s %10s\n", "backend", "op", "clients", "ops/s", "p50_us",
              "p99_us");
  for (const char* op : {"set", "get", "add"}) {
    for (int clients : flags.clients) {
      absl::StatusOr<std::unique_ptr<BackendInstance>> instance = backend.start(flags);
      Check(instance.status(), "starting " + backend.name);
      std::vector<std::unique_ptr<Store>> stores;
      for (int c = 0; c < clients; ++c) {
        absl::StatusOr<std::unique_ptr<Store>> store = (*instance)->NewClient();
        Check(store.status(), "connecting");
        Check((*store)->Set(absl::StrCat("bench/get/", c), value, kTimeout), "populating");
        stores.push_back(*std::move(store));
      }
      std::vector<std::vector<int64_t>> latencies(clients);
      std::latch start(clients + 1);
      std::vector<std::thread> threads;
      for (int c = 0; c < clients; ++c) {
        threads.emplace_back([&, c] {
          Store& store = *stores[c];
          std::vector<int64_t>& mine = latencies[c];
          mine.reserve(flags.ops);
          const std::string own_key = absl::StrCat("bench/get/", c);
          const std::string set_prefix = absl::StrCat("bench/set/", c, "/");
          start.arrive_and_wait();
          for (int i = 0; i < flags.ops; ++i) {
            const Clock::time_point t0 = Clock::now();
            absl::Status s;
            if (op[0] == 's') {
              s = store.Set(absl::StrCat(set_prefix, i % 1000), value, kTimeout);
            } else if (op[0] == 'g') {
              s = store.Get(own_key, kTimeout).status();
            } else {
              s = store.Add("bench/counter", 1, kTimeout).status();
            }
            mine.push_back(
                std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
            Check(s, op);
          }
        });
      }
      // Read before the release: a fast backend's clients may finish before this thread resumes.
      const Clock::time_point t0 = Clock::now();
      start.arrive_and_wait();
      for (std::thread& t : threads) t.join();
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      std::vector<int64_t> all;
      for (const std::vector<int64_t>& l : latencies) all.insert(all.end(), l.begin(), l.end());
      std::sort(all.begin(), all.end());
      std::printf("%-10s %-4s %7d %12.0f %10.1f %10.1f\n", backend.name.c_str(), op, clients,
                  static_cast<double>(all.size()) / seconds, Percentile(all, 0.50),
                  Percentile(all, 0.99));
      std::fflush(stdout);
    }
  }
}

// One barrier of n clients; the seconds from the start signal until every client is through.
double RunBarrier(const Backend& backend, const Flags& flags, int n) {
  absl::StatusOr<std::unique_ptr<BackendInstance>> instance = backend.start(flags);
  Check(instance.status(), "starting " + backend.name);
  std::latch ready(n + 1);
  std::atomic<bool> go{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      ready.count_down();
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      absl::StatusOr<std::unique_ptr<Store>> store = (*instance)->NewClient();
      if (!store.ok()) {
        std::fprintf(stderr, "client %d: %s\n", i, store.status().ToString().c_str());
        ++failures;
        return;
      }
      absl::Status s = (*store)->Set(absl::StrCat("rank/", i), "here", kTimeout);
      absl::StatusOr<int64_t> arrived = (*store)->Add("arrived", 1, kTimeout);
      if (s.ok()) s = arrived.status();
      if (s.ok() && *arrived == n) s = (*store)->Set("done", "1", kTimeout);
      if (s.ok()) s = (*store)->Wait({"done"}, kTimeout);
      if (!s.ok()) {
        std::fprintf(stderr, "client %d: %s\n", i, s.ToString().c_str());
        ++failures;
      }
    });
  }
  ready.arrive_and_wait();
  const Clock::time_point t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (std::thread& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (failures.load() > 0) {
    std::fprintf(stderr, "bench_store: %d of %d rendezvous clients failed\n", failures.load(), n);
    std::exit(1);
  }
  return seconds;
}

void RunRendezvous(const Backend& backend, const Flags& flags) {
  std::printf("\n%-10s %7s %10s %10s   (connect + Set + Add + Wait, %d runs)\n", "backend",
              "clients", "best_ms", "median_ms", flags.repeat);
  for (int n : flags.rendezvous) {
    std::vector<double> runs;
    for (int r = 0; r < flags.repeat; ++r) runs.push_back(RunBarrier(backend, flags, n));
    std::sort(runs.begin(), runs.end());
    std::printf("%-10s %7d %10.1f %10.1f\n", backend.name.c_str(), n, runs.front() * 1e3,
                runs[runs.size() / 2] * 1e3);
    std::fflush(stdout);
  }
}

int Main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  RaiseFileLimit();
  const std::vector<Backend> backends = Backends();
  for (const std::string& name : flags.backends) {
    auto it = std::find_if(backends.begin(), backends.end(),
                           [&](const Backend& b) { return b.name == name; });
    if (it == backends.end()) Usage("unknown backend " + name);
    for (const std::string& workload : flags.workloads) {
      if (workload == "ops") {
        RunOps(*it, flags);
      } else if (workload == "rendezvous") {
        RunRendezvous(*it, flags);
      } else {
        Usage("unknown workload " + workload);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace trainguard

int main(int argc, char** argv) { return trainguard::Main(argc, argv); }
