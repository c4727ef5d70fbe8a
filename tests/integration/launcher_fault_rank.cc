// A rank command for launcher_faults_test: joins the job through the Runtime, from the TRAINGUARD_*
// environment `trainguard run` gives it, as a trainer does; then does what its one argument says.
//
//   stop-job      rank 0 publishes the store key job/stop ("rank 0: ...", as a Runtime that
//                 gives up does) and exits 1; the other ranks wait to be stopped.
//   exit-1        exits 1 right after joining (a rank, or a standby once it took a rank): a rank
//                 command that always dies once the job runs.
//   standby-dies  a standby exits 1 before it joins; ranks wait to be stopped.
//   wait          waits to be stopped.
//   die-in-restart-1  for `--restart-all`: rank 1 exits 1 right after joining at the first start;
//                 at restart 1 (TORCHELASTIC_RESTART_COUNT) it exits 1 before joining, while the
//                 others wait in the rendezvous; from restart 2 every rank exits 0 once joined.
//   shm-too-small  the rank 1 the job started with (not a standby that takes rank 1 later)
//                 registers more state than /dev/shm holds and restores, which creates its
//                 snapshot arena: /dev/shm refuses the reservation for real (ENOSPC, at once: tmpfs
//                 refuses a size past its own without filling it); it prints the error and exits
//                 1. Every other process waits to be stopped. Exits 2 where /dev/shm has no size.
// Waiting is bounded: after 120 s it exits 3, so that a stray never outlives a broken test long.
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "trainguard/checkpoint.h"
#include "trainguard/options.h"
#include "trainguard/runtime.h"
#include "trainguard/store.h"

namespace {

int WaitToBeStopped() {
  absl::SleepFor(absl::Seconds(120));
  return 3;
}

// shm-too-small: state 1 GiB larger than /dev/shm, never touched (an unbacked mapping), so only
// the arena's reservation asks for the memory. Returns the exit status.
int RestoreMoreStateThanDevShmHolds(trainguard::Runtime& rt) {
  struct statvfs fs;
  if (statvfs("/dev/shm", &fs) != 0 || fs.f_blocks == 0) {
    std::fprintf(stderr, "rank %d: /dev/shm has no size to exceed\n", rt.rank());
    return 2;
  }
  const uint64_t bytes = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize + (uint64_t{1} << 30);
  void* state = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (state == MAP_FAILED) {
    std::fprintf(stderr, "rank %d: cannot map %llu bytes of state\n", rt.rank(),
                 static_cast<unsigned long long>(bytes));
    return 2;
  }
  if (absl::Status s = rt.state().Register({"model.weights",
                                            "model",
                                            state,
                                            bytes,
                                            trainguard::DType::kU8,
                                            {static_cast<int64_t>(bytes)},
                                            trainguard::Device::Host()});
      !s.ok()) {
    std::fprintf(stderr, "rank %d: registering the state: %s\n", rt.rank(), s.ToString().c_str());
    return 2;
  }
  absl::StatusOr<int64_t> restored = rt.RestoreCheckpoint();
  if (restored.ok()) {
    std::fprintf(stderr, "rank %d: restored state larger than /dev/shm\n", rt.rank());
    return 2;
  }
  std::fprintf(stderr, "rank %d error: cannot start: %s\n", rt.rank(),
               restored.status().ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "wait";
  const char* role = std::getenv("TRAINGUARD_ROLE");
  if (mode == "standby-dies" && role != nullptr && std::string(role) == "standby") {
    std::fprintf(stderr, "standby: dying before it parks\n");
    return 1;
  }
  const char* restart_text = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const int restart = restart_text != nullptr ? std::atoi(restart_text) : 0;
  const char* rank_text = std::getenv("RANK");
  if (mode == "die-in-restart-1" && restart == 1 && rank_text != nullptr &&
      std::string(rank_text) == "1") {
    std::fprintf(stderr, "rank 1: dying before it joins restart 1\n");
    return 1;
  }
  absl::StatusOr<trainguard::Options> options = trainguard::Options::FromEnv();
  if (!options.ok()) {
    std::fprintf(stderr, "options: %s\n", options.status().ToString().c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<trainguard::Runtime>> rt = trainguard::Runtime::Create(*options);
  if (!rt.ok()) {
    std::fprintf(stderr, "runtime: %s\n", rt.status().ToString().c_str());
    return 2;
  }
  const int rank = (*rt)->rank();
  std::printf("rank %d joined generation %lld\n", rank,
              static_cast<long long>((*rt)->generation()));
  std::fflush(stdout);
  if (mode == "exit-1") return 1;
  if (mode == "shm-too-small" && rank == 1 && (role == nullptr || std::string(role) != "standby")) {
    return RestoreMoreStateThanDevShmHolds(**rt);
  }
  if (mode == "die-in-restart-1") {
    if (restart >= 2) return 0;
    if (restart == 0 && rank == 1) return 1;
  }
  if (mode == "stop-job" && rank == 0) {
    absl::StatusOr<trainguard::CompareAndSetResult> set = (*rt)->store()->CompareAndSet(
        "job/stop", std::nullopt, "rank 0: step 7 failed again after 2 rollbacks (limit 2)",
        absl::Seconds(10));
    if (!set.ok()) {
      std::fprintf(stderr, "job/stop: %s\n", set.status().ToString().c_str());
      return 2;
    }
    return 1;
  }
  return WaitToBeStopped();
}
