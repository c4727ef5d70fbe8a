// The example trainer (examples/cpp_trainer) as the command of a multi-host job on simulated hosts:
// its command line and the checkpointing environment the multi-host tests and bench_host_recovery
// give it. Plain functions; thread-safe.
#ifndef TRAINGUARD_TESTS_SUPPORT_EXAMPLE_TRAINER_JOB_H_
#define TRAINGUARD_TESTS_SUPPORT_EXAMPLE_TRAINER_JOB_H_

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace trainguard::testing {

// `trainer` (the binary's path) training `steps` steps, printing every `print_every`, with a 10 s
// gloo timeout.
inline std::vector<std::string> ExampleTrainerArgs(const std::string& trainer, int steps,
                                                   int print_every = 50) {
  return {trainer, "--steps", absl::StrCat(steps), "--print-every", absl::StrCat(print_every),
          "--comm-timeout-s", "10"};
}

// A snapshot every `every_steps` steps, persisted every 4th (every 100 steps by default) under
// `dir`/checkpoints: a host that dies takes its snapshots with it, and its replacements restore the
// newest persisted step.
inline std::vector<std::string> ExampleCheckpointEnv(const std::string& dir, int every_steps = 25) {
  return {absl::StrCat("TRAINGUARD_CHECKPOINT_EVERY_STEPS=", every_steps),
          "TRAINGUARD_CHECKPOINT_PERSIST_EVERY=4",
          absl::StrCat("TRAINGUARD_CHECKPOINT_DIR=", dir, "/checkpoints")};
}

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_EXAMPLE_TRAINER_JOB_H_
