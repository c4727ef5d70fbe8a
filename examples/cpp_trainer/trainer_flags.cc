#include "trainer_flags.h"

#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace cpp_trainer {
namespace {

template <typename T>
absl::Status ParseNumber(absl::string_view flag, absl::string_view text, T min, T* out) {
  bool parsed;
  if constexpr (std::is_same_v<T, double>) {
    parsed = absl::SimpleAtod(text, out);
  } else if constexpr (std::is_same_v<T, float>) {
    parsed = absl::SimpleAtof(text, out);
  } else {
    parsed = absl::SimpleAtoi(text, out);
  }
  if (!parsed || !(*out >= min)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": expected a number >= ", min, ", got '", text, "'"));
  }
  return absl::OkStatus();
}

// RANK:STEP, the shape of the one-shot fault-injection flags.
absl::Status ParseRankStep(absl::string_view flag, absl::string_view value, int* rank,
                           int64_t* step) {
  std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(value, ':');
  absl::Status status = ParseNumber<int>(flag, parts.first, 0, rank);
  if (status.ok()) status = ParseNumber<int64_t>(flag, parts.second, 0, step);
  return status;
}

// RANK:STEP:SECONDS, the shape of the fault-injection flags that last a while.
absl::Status ParseRankStepSeconds(absl::string_view flag, absl::string_view value, int* rank,
                                  int64_t* step, absl::Duration* duration) {
  std::vector<absl::string_view> parts = absl::StrSplit(value, ':');
  if (parts.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": expected RANK:STEP:SECONDS, got '", value, "'"));
  }
  double seconds = 0;
  absl::Status status = ParseNumber<int>(flag, parts[0], 0, rank);
  if (status.ok()) status = ParseNumber<int64_t>(flag, parts[1], 0, step);
  if (status.ok()) status = ParseNumber<double>(flag, parts[2], 0.001, &seconds);
  *duration = absl::Seconds(seconds);
  return status;
}

}  // namespace

std::string TrainerUsage() {
  return R"(usage: cpp_trainer [flags]
Trains a small MLP on a synthetic regression task, data parallel over gloo, guarded by trainguard.
Rank, world size, job id and run directory come from TRAINGUARD_RANK, TRAINGUARD_WORLD_SIZE,
TRAINGUARD_JOB_ID and TRAINGUARD_RUN_DIR (see trainguard's Options).

  --steps N               steps to train (default 200)
  --lr X                  SGD learning rate (default 0.1)
  --batch-size N          examples per rank per step (default 32)
  --print-every N         print the loss every N steps and at the last step (default 10)
  --model-seed N          parameter initialisation seed, the same on every rank (default 1234)
  --data-seed N           data seed; each rank's shard also depends on its rank and the step (default 42)
  --rendezvous-id ID      gloo rendezvous id, the same on every rank and unique per launch
                          (default: $CPP_TRAINER_RENDEZVOUS_ID, else <job_id>-gen<generation>)
  --comm-timeout-s X      gloo rendezvous and collective timeout in seconds (default 60)
  --inject-nan RANK:STEP  make RANK's loss NaN at STEP (fault injection)
  --nan-from-step STEP    make every rank's loss NaN at STEP and every later step (a fault that
                          recurs after every rollback: trainguard stops the job)
  --inject-nan-grad RANK:STEP[,RANK:STEP...]
                          write a NaN into RANK's gradient at STEP, before the reduction
  --stop-before-collective RANK:STEP
                          RANK sends itself SIGSTOP before STEP's allreduce (a hung rank;
                          generation 0 only)
  --drop-connections RANK:STEP
                          RANK closes its connections to every peer before STEP's allreduce (a
                          dropped link, every process alive; generation 0 only)
  --sleep-in-collective RANK:STEP:SECONDS
                          RANK sleeps SECONDS inside STEP's allreduce, after entering it and
                          before exchanging data (a rank slow inside a collective; generation 0
                          only)
  --generate MEDIAN_MS:P99_RATIO
                          RL-shaped steps: a "generate" phase first, decoding 1 ms tokens (one
                          watchdog tick each) for a lognormal time per rank and step with that
                          median and p99/median; the other ranks wait in the allreduce
  --stall-generation RANK:STEP:SECONDS
                          RANK's decoding stops ticking for SECONDS halfway through STEP's
                          generation (a stuck rollout; generation 0 only)
  --long-generation RANK:STEP:SECONDS
                          RANK's generation at STEP decodes for SECONDS, ticking every token,
                          instead of its drawn length (a rollout far in the tail)
  --extra-state-mib N     N MiB of float32 state registered with the model (a stand-in for
                          optimizer state: the snapshot's size); each step updates a 16 KiB
                          slice, and params_checksum covers it
  --step-time-ms X        every step takes at least X ms (a sleep standing in for compute; given
                          to one host's command only: a fail-slow host the others wait for)
  --progress-events 0|1   rank 0 writes an event (what=step_done) after every step that
                          succeeded: the progress `trainguard report` measures (default 0)
  --nan-on-sigusr1 0|1    SIGUSR1 makes this rank write a NaN into its gradient at the next step
                          (what `trainguard chaos` injects; default 0)
  --flip-bit RANK:STEP     after STEP's update RANK flips a bit of one parameter in its memory
                          (silent data corruption; generation 0 only)
  --check-reduced-grad 0|1
                          1: every rank compares its reduced gradients with its replicas' right
                          after the allreduce (Step::CheckReplicated)
  --corrupt-reduced-grad RANK:STEP
                          RANK flips a bit of its reduced gradients at STEP, after the allreduce
                          (generation 0 only)
  --flip-bit-every-generation 0|1
                          1: --flip-bit flips in every generation (a machine that keeps corrupting)
  --drop-on-sigurg 0|1    SIGURG makes this rank close its connections before its next allreduce
                          (a dropped link; what `trainguard chaos` injects as drop; default 0)
  --help                  print this text
)";
}

absl::StatusOr<TrainerFlags> ParseTrainerFlags(int argc, char** argv) {
  TrainerFlags flags;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      flags.help = true;
      continue;
    }
    if (i + 1 >= argc) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": unknown flag or missing value"));
    }
    const absl::string_view value = argv[++i];
    absl::Status status;
    if (flag == "--steps") {
      status = ParseNumber<int64_t>(flag, value, 0, &flags.steps);
    } else if (flag == "--lr") {
      status = ParseNumber<float>(flag, value, 0.0f, &flags.learning_rate);
    } else if (flag == "--batch-size") {
      status = ParseNumber<int>(flag, value, 1, &flags.batch_size);
    } else if (flag == "--print-every") {
      status = ParseNumber<int>(flag, value, 1, &flags.print_every);
    } else if (flag == "--model-seed") {
      status = ParseNumber<uint64_t>(flag, value, 0, &flags.model_seed);
    } else if (flag == "--data-seed") {
      status = ParseNumber<uint64_t>(flag, value, 0, &flags.data_seed);
    } else if (flag == "--rendezvous-id") {
      if (value.empty()) {
        return absl::InvalidArgumentError("--rendezvous-id: must not be empty");
      }
      flags.rendezvous_id = std::string(value);
    } else if (flag == "--comm-timeout-s") {
      double seconds = 0;
      status = ParseNumber<double>(flag, value, 0.001, &seconds);
      flags.comm_timeout = absl::Seconds(seconds);
    } else if (flag == "--inject-nan") {
      status = ParseRankStep(flag, value, &flags.inject_nan_rank, &flags.inject_nan_step);
    } else if (flag == "--nan-from-step") {
      status = ParseNumber<int64_t>(flag, value, 0, &flags.nan_from_step);
    } else if (flag == "--stop-before-collective") {
      status = ParseRankStep(flag, value, &flags.stop_rank, &flags.stop_step);
    } else if (flag == "--drop-connections") {
      status = ParseRankStep(flag, value, &flags.drop_rank, &flags.drop_step);
    } else if (flag == "--corrupt-reduced-grad") {
      status = ParseRankStep(flag, value, &flags.corrupt_grad_rank, &flags.corrupt_grad_step);
    } else if (flag == "--flip-bit") {
      status = ParseRankStep(flag, value, &flags.flip_rank, &flags.flip_step);
    } else if (flag == "--sleep-in-collective") {
      status = ParseRankStepSeconds(flag, value, &flags.sleep_rank, &flags.sleep_step,
                                    &flags.sleep_in_collective);
    } else if (flag == "--generate") {
      std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(value, ':');
      status = ParseNumber<double>(flag, parts.first, 0.001, &flags.generate_median_ms);
      if (status.ok()) {
        status = ParseNumber<double>(flag, parts.second, 1.0, &flags.generate_p99_ratio);
      }
    } else if (flag == "--stall-generation") {
      status = ParseRankStepSeconds(flag, value, &flags.stall_rank, &flags.stall_step,
                                    &flags.stall_generation);
    } else if (flag == "--long-generation") {
      status = ParseRankStepSeconds(flag, value, &flags.long_rank, &flags.long_step,
                                    &flags.long_generation);
    } else if (flag == "--extra-state-mib") {
      status = ParseNumber<int>(flag, value, 0, &flags.extra_state_mib);
    } else if (flag == "--inject-nan-grad") {
      for (absl::string_view item : absl::StrSplit(value, ',')) {
        int rank = -1;
        int64_t step = -1;
        status = ParseRankStep(flag, item, &rank, &step);
        if (!status.ok()) break;
        flags.inject_nan_grad.emplace_back(rank, step);
      }
    } else if (flag == "--step-time-ms") {
      status = ParseNumber<double>(flag, value, 0.0, &flags.step_time_ms);
    } else if (flag == "--progress-events" || flag == "--nan-on-sigusr1" ||
               flag == "--drop-on-sigurg" || flag == "--flip-bit-every-generation" ||
               flag == "--check-reduced-grad") {
      int on = 0;
      status = ParseNumber<int>(flag, value, 0, &on);
      if (status.ok() && on > 1) {
        status = absl::InvalidArgumentError(absl::StrCat(flag, ": expected 0 or 1, got '", value, "'"));
      }
      (flag == "--progress-events"             ? flags.progress_events
       : flag == "--flip-bit-every-generation" ? flags.flip_every_generation
       : flag == "--check-reduced-grad"        ? flags.check_reduced_grad
       : flag == "--nan-on-sigusr1"            ? flags.nan_on_sigusr1
                                               : flags.drop_on_sigurg) = on == 1;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": unknown flag"));
    }
    if (!status.ok()) {
      return status;
    }
  }
  return flags;
}

}  // namespace cpp_trainer
