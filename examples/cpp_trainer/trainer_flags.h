// TrainerFlags: the command line of the example trainer (cpp_trainer --help prints it).
//
// Rank, world size, job id and run directory are not flags: they come from trainguard's Options
// (TRAINGUARD_* environment variables), like in any trainguard trainer.
//
// Thread safety: plain value types and a pure function.
#ifndef TRAINGUARD_EXAMPLES_CPP_TRAINER_TRAINER_FLAGS_H_
#define TRAINGUARD_EXAMPLES_CPP_TRAINER_TRAINER_FLAGS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cpp_trainer {

struct TrainerFlags {
  int64_t steps = 200;
  float learning_rate = 0.1f;
  int batch_size = 32;  // examples per rank per step; the global batch is batch_size * world_size
  int print_every = 10;
  uint64_t model_seed = 1234;  // the same on every rank: replicas start identical
  uint64_t data_seed = 42;     // with the rank and step, picks each rank's shard
  // Names this launch's gloo rendezvous; every rank must pass the same value. Empty means
  // $CPP_TRAINER_RENDEZVOUS_ID, or "<job_id>-gen<generation>" when that is unset too.
  std::string rendezvous_id;
  absl::Duration comm_timeout = absl::Seconds(60);
  // Fault injection for demos and tests: the rank corrupts one input of its batch at that step, so
  // its loss is NaN. -1: off.
  int inject_nan_rank = -1;
  int64_t inject_nan_step = -1;
  // --nan-from-step STEP: every rank's loss is NaN from STEP on, in every generation (a fault that
  // replaying from a checkpoint cannot cure). -1: off.
  int64_t nan_from_step = -1;
  // --inject-nan-grad RANK:STEP[,RANK:STEP...]: a NaN written into RANK's gradient at STEP (its
  // loss stays finite), in any generation.
  std::vector<std::pair<int, int64_t>> inject_nan_grad;
  // --stop-before-collective RANK:STEP: RANK stops itself (SIGSTOP) before STEP's allreduce.
  int stop_rank = -1;
  int64_t stop_step = -1;
  // --drop-connections RANK:STEP: RANK closes every connection of its communicator before STEP's
  // allreduce (a dropped link: every process stays alive).
  int drop_rank = -1;
  int64_t drop_step = -1;
  // --flip-bit RANK:STEP: after STEP's update, RANK flips one bit of one parameter in its own
  // memory (silent data corruption: nothing fails; the replicas no longer agree). Generation 0
  // only, so that the replay after a repair is clean.
  int flip_rank = -1;
  int64_t flip_step = -1;
  // --flip-bit-every-generation 1: the flip happens in every generation (a machine that keeps
  // corrupting: a rollback does not cure it).
  bool flip_every_generation = false;
  // --check-reduced-grad 1: right after the allreduce, every rank compares its reduced gradients
  // with its replicas' (Step::CheckReplicated). --corrupt-reduced-grad RANK:STEP: RANK flips a bit
  // of its reduced gradients at STEP, after the allreduce (generation 0 only).
  bool check_reduced_grad = false;
  int corrupt_grad_rank = -1;
  int64_t corrupt_grad_step = -1;
  // --sleep-in-collective RANK:STEP:SECONDS: RANK sleeps inside STEP's allreduce.
  int sleep_rank = -1;
  int64_t sleep_step = -1;
  absl::Duration sleep_in_collective = absl::ZeroDuration();
  // --generate MEDIAN_MS:P99_RATIO: an RL-shaped step. Each step first runs a "generate" phase that
  // decodes tokens of 1 ms each, ticking the watchdog once per token, for a lognormal time per rank
  // and step (median MEDIAN_MS, p99/median P99_RATIO); the fast ranks then wait in the allreduce
  // for the slowest. 0: off.
  double generate_median_ms = 0;
  double generate_p99_ratio = 10;
  // --stall-generation RANK:STEP:SECONDS: RANK's decoding stops ticking for SECONDS halfway
  // through STEP's generation (a stuck rollout; generation 0 only).
  int stall_rank = -1;
  int64_t stall_step = -1;
  absl::Duration stall_generation = absl::ZeroDuration();
  // --long-generation RANK:STEP:SECONDS: RANK's generation at STEP decodes for SECONDS, ticking
  // every token, instead of its drawn length (a rollout far in the tail, in every generation).
  int long_rank = -1;
  int64_t long_step = -1;
  absl::Duration long_generation = absl::ZeroDuration();
  // --extra-state-mib N: N MiB of float32 registered with the model as a stand-in for optimizer
  // state (a real job's snapshot is mostly that), initialised from model_seed; each step updates
  // a 16 KiB slice of it, and the final params_checksum covers it. 0: off.
  int extra_state_mib = 0;
  // --step-time-ms X: every step takes at least X ms (a sleep standing in for compute, before the
  // allreduce), so that a run's length is bounded below whatever the machine. 0: off.
  double step_time_ms = 0;
  // --progress-events 1: rank 0 writes an event (custom, what=step_done) after every step that
  // succeeded, the record `trainguard report` measures progress from. 0: off.
  bool progress_events = false;
  // --nan-on-sigusr1 1: a SIGUSR1 makes this rank write a NaN into its gradient at the next step
  // (what `trainguard chaos` injects as "nan"). 0: SIGUSR1 keeps its default action.
  bool nan_on_sigusr1 = false;
  // --drop-on-sigurg 1: a SIGURG makes this rank close every connection of its communicator before
  // its next allreduce (what `trainguard chaos` injects as "drop"). 0: SIGURG is ignored.
  bool drop_on_sigurg = false;
  bool help = false;
};

// The usage text.
std::string TrainerUsage();

// Parses argv[1..argc). InvalidArgument naming the flag for an unknown flag, a missing value or a
// malformed or out-of-range value.
absl::StatusOr<TrainerFlags> ParseTrainerFlags(int argc, char** argv);

}  // namespace cpp_trainer

#endif  // TRAINGUARD_EXAMPLES_CPP_TRAINER_TRAINER_FLAGS_H_
