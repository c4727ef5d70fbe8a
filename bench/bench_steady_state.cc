// bench_steady_state: what an uneventful training rank costs the store, per second, by kind of
// request (issue 37: "each rank a bounded number of store operations per second that does not
// grow with the job").
//
//   bench_steady_state [--ranks=8] [--seconds=10] [--step_ms=50] [--records_wanted=0]
//
// --ranks real Runtimes (Runtime::Create, as a trainer makes them: the default options, a
// watchdog, the rendezvous' heartbeat, the generation watcher, the duty thread publishing the
// progress and work records), each on a thread of its own with its own client of one in-memory
// store, wrapped in a CountingStore (tests/support/counting_store.h); a RendezvousCoordinator
// forms generation 0. Each rank then runs guarded steps of --step_ms (a sleep: no collectives)
// for --seconds, and the requests its client sent meanwhile are printed as requests per second
// per rank, by verb and key family (digits written N), with the total. Nothing fails and nothing
// is replaced: the figure is the polling and publishing floor of every rank. --records_wanted=1
// first asks the ranks for their records, as a host agent of `trainguard run --fail-slow` does
// (health/work_wanted) and a rank whose collective ran past its bound does for its generation
// (hang/gen<G>/progress_wanted).
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "sdk/core/store_keys.h"
#include "sdk/health/fail_slow_metrics.h"
#include "sdk/rendezvous/rendezvous.h"
#include "tests/support/counting_store.h"
#include "tests/support/temp_dir.h"
#include "trainguard/sdk.h"

namespace trainguard {
namespace {

struct Flags {
  int ranks = 8;
  int seconds = 10;
  int step_ms = 50;
  int records_wanted = 0;
};

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    int* target = nullptr;
    if (absl::ConsumePrefix(&arg, "--ranks=")) {
      target = &flags.ranks;
    } else if (absl::ConsumePrefix(&arg, "--seconds=")) {
      target = &flags.seconds;
    } else if (absl::ConsumePrefix(&arg, "--step_ms=")) {
      target = &flags.step_ms;
    } else if (absl::ConsumePrefix(&arg, "--records_wanted=")) {
      target = &flags.records_wanted;
    }
    const int minimum = target == &flags.records_wanted ? 0 : 1;
    if (target == nullptr || !absl::SimpleAtoi(arg, target) || *target < minimum) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown or bad flag '", argv[i],
                       "'; usage: bench_steady_state [--ranks=8] [--seconds=10] [--step_ms=50] "
                       "[--records_wanted=0]"));
    }
  }
  return flags;
}

int Run(const Flags& flags) {
  const absl::Duration timeout = absl::Seconds(60);
  testing::TempDir dir;
  InMemoryStore shared;
  std::unique_ptr<Store> coordinator_store = shared.NewClient();
  RendezvousCoordinator coordinator(coordinator_store.get());
  std::vector<std::unique_ptr<Store>> clients;
  std::vector<std::unique_ptr<testing::CountingStore>> counted;
  std::vector<Options> options;
  for (int r = 0; r < flags.ranks; ++r) {
    clients.push_back(shared.NewClient());
    counted.push_back(std::make_unique<testing::CountingStore>(clients.back().get()));
    Options o;
    o.job_id = absl::StrCat("steady-", getpid());
    o.world_size = flags.ranks;
    o.rank = r;
    o.role = "rank";
    o.member_id = absl::StrCat("m", r);
    o.run_dir = dir.path();
    o.store_client = counted.back().get();
    options.push_back(o);
  }

  // Generation 0: every rank's Create joins while the coordinator forms it; then Start.
  std::vector<std::unique_ptr<Runtime>> runtimes(flags.ranks);
  std::vector<absl::Status> failures(flags.ranks);
  {
    std::vector<std::thread> creating;
    for (int r = 0; r < flags.ranks; ++r) {
      creating.emplace_back([&, r] {
        absl::StatusOr<std::unique_ptr<Runtime>> rt = Runtime::Create(options[r]);
        if (!rt.ok()) {
          failures[r] = rt.status();
          return;
        }
        runtimes[r] = *std::move(rt);
        failures[r] = runtimes[r]->Start().status();
      });
    }
    const absl::Status formed = coordinator.FormInitialGeneration(flags.ranks, timeout).status();
    for (std::thread& t : creating) t.join();
    if (!formed.ok()) {
      std::fprintf(stderr, "forming generation 0: %s\n", formed.ToString().c_str());
      return 1;
    }
  }
  for (int r = 0; r < flags.ranks; ++r) {
    if (!failures[r].ok()) {
      std::fprintf(stderr, "rank %d: %s\n", r, failures[r].ToString().c_str());
      return 1;
    }
  }

  // The uneventful part: every rank steps; its requests are counted from here.
  std::atomic<bool> stop{false};
  std::vector<std::thread> training;
  for (int r = 0; r < flags.ranks; ++r) {
    training.emplace_back([&, r] {
      Runtime& rt = *runtimes[r];
      for (int64_t step = rt.resume_step(); !stop.load(); ++step) {
        StepResult result =
            guard(rt, step, [&](Step&) { absl::SleepFor(absl::Milliseconds(flags.step_ms)); });
        if (!result.ok()) {
          std::fprintf(stderr, "rank %d step %lld failed: %s\n", r, static_cast<long long>(step),
                       result.status.ToString().c_str());
          return;
        }
      }
    });
  }
  if (flags.records_wanted != 0) {
    for (const std::string& key :
         {store_keys::HangProgressWanted(0), std::string(kRankWorkWantedKey)}) {
      if (absl::Status s = coordinator_store->Set(key, "0 0", timeout); !s.ok()) {
        std::fprintf(stderr, "asking for records: %s\n", s.ToString().c_str());
        return 1;
      }
    }
  }
  absl::SleepFor(absl::Seconds(1));  // past the first step's one-off writes (resumed, records)
  for (auto& c : counted) c->Reset();
  const absl::Time begin = absl::Now();
  absl::SleepFor(absl::Seconds(flags.seconds));
  std::vector<testing::CountingStore::Counts> counts;
  for (auto& c : counted) counts.push_back(c->counts());
  const double seconds = absl::ToDoubleSeconds(absl::Now() - begin);
  stop = true;
  for (std::thread& t : training) t.join();
  runtimes.clear();

  std::map<std::pair<std::string, std::string>, int64_t> total;
  int64_t all = 0;
  for (const testing::CountingStore::Counts& c : counts) {
    for (const auto& [kind, n] : c) {
      total[kind] += n;
      all += n;
    }
  }
  const double per = seconds * flags.ranks;
  std::printf(
      "ranks=%d seconds=%.1f step_ms=%d records_wanted=%d: store requests per second per rank, by "
      "kind\n",
      flags.ranks, seconds, flags.step_ms, flags.records_wanted);
  for (const auto& [kind, n] : total) {
    std::printf("  %-10s %-60s %7.2f\n", kind.first.c_str(), kind.second.c_str(), n / per);
  }
  std::printf("  %-71s %7.2f\n", "total", all / per);
  return 0;
}

}  // namespace
}  // namespace trainguard

int main(int argc, char** argv) {
  absl::StatusOr<trainguard::Flags> flags = trainguard::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "%s\n", flags.status().ToString().c_str());
    return 2;
  }
  return trainguard::Run(*flags);
}
