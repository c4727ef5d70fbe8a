// cpp_trainer: a Megatron-style data-parallel trainer in plain C++, and the reference
// integration of trainguard in a C++ training loop.
//
// Each process is one rank. Every rank holds a full replica of a small MLP (mlp.h) initialised from
// the same seed, trains on its data-parallel shard of a synthetic regression task
// (synthetic_regression.h; with TRAINGUARD_TP/CP/PP > 1, ranks of one model-parallel group share a
// shard),
// averages the gradients over all ranks with one gloo allreduce per step (gloo_data_parallel.h) and
// applies SGD, so the replicas stay bit-identical. Each step runs inside sdk::guard; a failed step
// goes to Runtime::recover(), which says where to resume or that this process must stop. The
// recovery itself is trainguard's: the trainer registers its model as the Runtime's state, gives it
// a factory for its gloo communicator (gloo_data_parallel.h), calls Runtime::Start() once and runs
// README's loop; restores, rebuilds per generation and state broadcasts happen inside Start() and
// recover().
//
// A rank whose loss is not finite says so (Step::ReportFault) before the gradient reduction, so the
// rank where the NaN was born is the one named; it contributes zero gradients and a flag, and every
// rank then skips that step's update, reporting the skip as a step failure too. All ranks thus take
// the same decision and stay in step.
//
// Output: the interface for tests (tests/integration/cpp_trainer_test.cc) and scripts/demo.sh;
// keep it stable. Every rank prints its own lines to stdout, line-buffered, each starting with
// "rank R":
//
//   rank R start world W job JOB run_dir DIR resume_step S steps N
//   rank R step S loss L
//       At every --print-every'th step and at the last step. L (printf %.6f) is the mean over the
//       ranks of the step's loss before its update, so every rank prints the same value.
//   rank R step S fault KIND action ACTION: MESSAGE
//       A guarded step failed. KIND and ACTION are trainguard's names (FaultKindName,
//       StepActionName), e.g. "step_failure" "skip", "communication_failure" "re_rendezvous".
//   rank R recover step S next N
//       Runtime::recover() resumes at step N.
//   rank R restored step S from SOURCE            (checkpointing on: state restored from the
//                                                 arena, a peer's memory or disk; S is the step
//                                                 resumed at)
//   rank R restore skipped WHY                    (a newer committed step no rank could restore)
//   rank R generation G resume_step S state_from SRC
//       Joined membership generation G after a rank replacement (as a survivor or as the
//       replacement), resuming at step S; SRC is the rank whose model state was broadcast (-1:
//       none, e.g. every rank restored a checkpoint).
//   rank R generation G entered after N attempts
//       Other ranks died while the communicator was being rebuilt; trainguard met them in newer
//       generations until it could build one (N > 1 only).
//   rank R generate phases N tokens T longest_ms L over_duration_bound K hangs_declared H
//       hangs_postponed P
//       With --generate, before the final line: this process's generate phases, the longest one,
//       how many outran the watchdog's duration bound for "generate" in force when they began
//       (kept alive by their ticks), and the watchdog's hangs declared and postponed.
//   rank R stalling generation at step S
//       --stall-generation: the decoding stops ticking now.
// With --progress-events 1, rank 0 also writes an event (custom, attribute what=step_done, its pid)
// after every step that succeeded: the progress `trainguard report` measures ETTR from.
//
//   rank R final_loss L params_checksum H
//       The last line of a successful run. L is the loss of the last successful step ("nan" if
//       none ran), H the XXH64 of the parameter bytes as 16 hex digits: equal on all ranks.
//
// Errors go to stderr as "rank R error: ..." (or "cpp_trainer: ..." before the rank is known).
// When trainguard stops the job (a fault that recurs after rollback), the error is its one-line
// reason: "rank R error: cannot recover from step S: FAILED_PRECONDITION: rank R: ...".
// Exit status: 0 trained every step; 1 training stopped (rendezvous failed, or recover() gave up);
// 2 bad flags or invalid trainguard options.
//
// Launch (until `trainguard run` exists), e.g. 4 ranks on this machine:
//   export TRAINGUARD_WORLD_SIZE=4 TRAINGUARD_JOB_ID=j TRAINGUARD_RUN_DIR=/tmp/j
//   for r in 0 1 2 3; do TRAINGUARD_RANK=$r ./cpp_trainer --rendezvous-id j-1 & done; wait
#include <signal.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "example_support.h"
#include "gloo_data_parallel.h"
#include "mlp.h"
#include "split_mix64.h"
#include "synthetic_regression.h"
#include "trainer_flags.h"
#include "trainguard/sdk.h"

namespace cpp_trainer {
namespace {

constexpr int kInputs = 16;
constexpr int kHidden = 64;

// The gloo rendezvous id of a static job (no trainguard store): the flag, else the environment,
// else one derived from the job. With a store, the Runtime scopes the rendezvous per generation.
std::string StaticRendezvousId(const TrainerFlags& flags, const sdk::Runtime& rt) {
  if (!flags.rendezvous_id.empty()) {
    return flags.rendezvous_id;
  }
  // Read before any thread of ours starts; nothing in this process sets variables.
  const char* id = std::getenv("CPP_TRAINER_RENDEZVOUS_ID");  // NOLINT(concurrency-mt-unsafe)
  if (id != nullptr && *id != '\0') {
    return id;
  }
  return absl::StrCat(rt.options().job_id, "-gen", rt.generation());
}

// One data-parallel training run of this rank: owns the model and the data; the Runtime owns the
// communicator it builds with Connect().
class DataParallelTrainer {
 public:
  DataParallelTrainer(const TrainerFlags& flags, sdk::Runtime& rt, int dp_rank,
                      std::vector<float> extra_state)
      : flags_(flags),
        rt_(rt),
        dp_rank_(dp_rank),
        task_(kInputs, flags.data_seed),
        model_(kInputs, kHidden, flags.model_seed),
        reduce_buffer_(model_.parameters().size() + kTailFloats),
        extra_state_(std::move(extra_state)) {}

  // The communicator goes first: after a failed collective, gloo's I/O thread may write into
  // reduce_buffer_ until it is destroyed. The model is registered state: a snapshot of it still
  // being copied must finish before it is freed, however Run() ended.
  ~DataParallelTrainer() {
    rt_.CloseCommunicator();
    (void)rt_.WaitForCheckpoints(absl::Minutes(5));
  }

  // Registers the model (the whole state: the data order is a function of the step) and the
  // communicator factory. The Runtime restores it, broadcasts it to a replacement and rebuilds the
  // communicator for every generation.
  absl::Status Setup() {
    std::span<float> params = model_.mutable_parameters();
    if (absl::Status s = rt_.state().Register({"mlp.parameters",
                                               "model",
                                               params.data(),
                                               params.size_bytes(),
                                               sdk::DType::kF32,
                                               {static_cast<int64_t>(params.size())},
                                               sdk::Device::Host(),
                                               /*replicated=*/true});
        !s.ok()) {
      return s;
    }
    if (!extra_state_.empty()) {
      if (absl::Status s = rt_.state().Register({"optimizer.extra_state",
                                                 "optimizer",
                                                 extra_state_.data(),
                                                 extra_state_.size() * sizeof(float),
                                                 sdk::DType::kF32,
                                                 {static_cast<int64_t>(extra_state_.size())},
                                                 sdk::Device::Host(),
                                                 /*replicated=*/true});
          !s.ok()) {
        return s;
      }
    }
    rt_.SetCommunicatorFactory([this](const sdk::CommunicatorSpec& spec) { return Connect(spec); });
    return absl::OkStatus();
  }

  // The training loop: README's. Returns the process's exit status.
  int Run() {
    const int rank = rt_.rank();
    absl::StatusOr<int64_t> start = rt_.Start();
    if (!start.ok()) {
      std::fprintf(stderr, "rank %d error: cannot start: %s\n", rank,
                   start.status().ToString().c_str());
      return 1;
    }
    for (int64_t step = *start; step < flags_.steps;) {
      sdk::StepResult r = sdk::guard(rt_, step, [&](sdk::Step& s) { TrainStep(s); });
      if (r.ok()) {
        if (flags_.progress_events && rank == 0) EmitStepDone(step);
        ++step;
        continue;
      }
      absl::StatusOr<int64_t> next = rt_.recover(r);
      if (!next.ok()) {
        std::fprintf(stderr, "rank %d error: cannot recover from step %" PRId64 ": %s\n", rank,
                     step, next.status().ToString().c_str());
        return 1;
      }
      step = *next;
    }
    if (flags_.generate_median_ms > 0) {
      const sdk::Watchdog* wd = rt_.watchdog();
      std::printf("rank %d generate phases %" PRId64 " tokens %" PRId64 " longest_ms %" PRId64
                  " over_duration_bound %" PRId64 " hangs_declared %" PRId64
                  " hangs_postponed %" PRId64 "\n",
                  rank, generate_phases_, generate_tokens_,
                  absl::ToInt64Milliseconds(longest_generation_), generations_over_bound_,
                  wd != nullptr ? wd->hangs_declared() : int64_t{0},
                  wd != nullptr ? wd->hangs_postponed() : int64_t{0});
    }
    std::printf("rank %d final_loss %.6f params_checksum %s\n", rank, last_loss_,
                ParamsChecksum(model_.parameters(), {extra_state_}).c_str());
    return 0;
  }

  // Set by the SIGUSR1 handler (--nan-on-sigusr1); the next step corrupts this rank's gradient.
  static inline std::atomic<bool> nan_requested{false};
  // Set by the SIGURG handler (--drop-on-sigurg); the next allreduce starts with dropped links.
  static inline std::atomic<bool> drop_requested{false};

 private:
  // The progress record `trainguard report` reads (--progress-events). Best effort: a full disk
  // must not stop training.
  void EmitStepDone(int64_t step) {
    sdk::Event event = sdk::EventOfKind(sdk::EventKind::kStepDone, "step done");
    event.step = step;
    event.attributes.emplace_back("pid", absl::StrCat(getpid()));
    (void)rt_.EmitEvent(std::move(event));
  }

  // A deterministic function of the step and the loss on a 16 KiB slice that moves with the step,
  // so that every part of the extra state is written over a run and a restore of stale memory
  // changes the final checksum.
  void UpdateExtraState(int64_t step, float loss) {
    if (extra_state_.empty()) return;
    constexpr size_t kSlice = 4096;
    const size_t slices = extra_state_.size() / kSlice;
    float* slice = extra_state_.data() + (static_cast<size_t>(step) % slices) * kSlice;
    for (size_t i = 0; i < kSlice; ++i) slice[i] = 0.9f * slice[i] + 0.1f * loss;
  }

  // The reduction buffer is the flat gradient followed by the sum of the ranks' finite losses and
  // the number of ranks whose loss was not finite: one collective per step carries all three.
  static constexpr size_t kTailFloats = 2;

  // The communicator factory: a gloo full mesh for one generation, meeting through the
  // generation's store, or, in a static job, through files in <run_dir>/gloo.
  absl::StatusOr<std::unique_ptr<sdk::Communicator>> Connect(const sdk::CommunicatorSpec& spec) {
    GlooDataParallel::Config config;
    config.rank = spec.rank;
    config.world_size = spec.world_size;
    config.store = spec.store;
    config.store_dir = rt_.run_dir() + "/gloo";
    config.rendezvous_id = spec.store != nullptr ? "gloo" : StaticRendezvousId(flags_, rt_);
    config.timeout = flags_.comm_timeout;
    config.tracker = spec.tracker;
    config.comm_id = spec.comm_id;
    absl::StatusOr<std::unique_ptr<GlooDataParallel>> comm = GlooDataParallel::Connect(config);
    if (!comm.ok()) return comm.status();
    return std::unique_ptr<sdk::Communicator>(*std::move(comm));
  }

  // The communicator of the current generation (the Runtime built it with Connect()).
  GlooDataParallel& comm() { return static_cast<GlooDataParallel&>(*rt_.communicator()); }

  // The RL-shaped part of a step (--generate): "decodes" 1 ms tokens for a lognormal time, one
  // watchdog tick per token, inside a "generate" phase. Its length depends on the rank and the
  // step only, so a replayed step generates as long again.
  void Generate(int64_t step) {
    SplitMix64 rng(SplitMix64::Mix(SplitMix64::Mix(flags_.data_seed ^ 0x67656eULL, rt_.rank()),
                                   static_cast<uint64_t>(step)));
    constexpr double kZ99 = 2.3263478740408408;  // the standard normal's 99th percentile
    const double sigma = std::log(flags_.generate_p99_ratio) / kZ99;
    const double ms = flags_.generate_median_ms * std::exp(sigma * rng.Normal());
    const bool long_one = rt_.rank() == flags_.long_rank && step == flags_.long_step;
    const int64_t tokens = long_one ? absl::ToInt64Milliseconds(flags_.long_generation)
                                    : std::max<int64_t>(1, std::llround(ms));
    sdk::Watchdog* wd = rt_.watchdog();
    const sdk::PhaseBounds bounds = wd != nullptr ? wd->BoundsFor("generate") : sdk::PhaseBounds{};
    const bool stall =
        rt_.rank() == flags_.stall_rank && step == flags_.stall_step && rt_.generation() == 0;
    const absl::Time begin = absl::Now();
    {
      sdk::ScopedPhase phase(wd, "generate");
      for (int64_t t = 0; t < tokens; ++t) {
        if (stall && t == tokens / 2) {
          std::printf("rank %d stalling generation at step %" PRId64 "\n", rt_.rank(), step);
          absl::SleepFor(flags_.stall_generation);  // stuck: no tick
        }
        absl::SleepFor(absl::Milliseconds(1));
        if (wd != nullptr) wd->Tick(1);
      }
    }
    const absl::Duration took = absl::Now() - begin;
    ++generate_phases_;
    generate_tokens_ += tokens;
    longest_generation_ = std::max(longest_generation_, took);
    if (wd != nullptr && took > bounds.duration) ++generations_over_bound_;
  }

  void TrainStep(sdk::Step& s) {
    const int64_t step = s.number();
    if (flags_.generate_median_ms > 0) Generate(step);
    if (flags_.step_time_ms > 0) absl::SleepFor(absl::Milliseconds(flags_.step_time_ms));
    Batch batch = task_.Sample(dp_rank_, step, flags_.batch_size);
    if ((rt_.rank() == flags_.inject_nan_rank && step == flags_.inject_nan_step) ||
        (flags_.nan_from_step >= 0 && step >= flags_.nan_from_step)) {
      batch.x[0] = std::numeric_limits<float>::quiet_NaN();  // a corrupt example
    }
    const float local_loss = model_.ForwardBackward(batch);
    const bool finite = std::isfinite(local_loss);
    if (!finite) {
      s.ReportFault(sdk::FaultKind::kStepFailure,
                    absl::StrCat("loss is not finite (", local_loss, ") on rank ", rt_.rank()));
    }

    const size_t n = model_.gradients().size();
    std::span<const float> grads = model_.gradients();
    std::copy(grads.begin(), grads.end(), reduce_buffer_.begin());
    bool corrupt = nan_requested.exchange(false);  // a SIGUSR1 (--nan-on-sigusr1)
    for (const auto& [nan_rank, nan_step] : flags_.inject_nan_grad) {
      corrupt |= rt_.rank() == nan_rank && step == nan_step;
    }
    if (corrupt) {
      reduce_buffer_[n / 2] = std::numeric_limits<float>::quiet_NaN();  // a corrupted gradient
    }
    // Before the reduction: a NaN born here is named here, not on every rank after the allreduce.
    const bool clean =
        s.CheckFinite("mlp.gradients", reduce_buffer_.data(), n, sdk::DType::kF32) && finite;
    if (!clean) std::fill(reduce_buffer_.begin(), reduce_buffer_.begin() + n, 0.0f);
    reduce_buffer_[n] = clean ? local_loss : 0.0f;
    reduce_buffer_[n + 1] = clean ? 0.0f : 1.0f;
    // Generation 0 only: the rank that replaces a stopped one must not stop again.
    if (rt_.rank() == flags_.stop_rank && step == flags_.stop_step && rt_.generation() == 0) {
      raise(SIGSTOP);
    }
    if (rt_.rank() == flags_.drop_rank && step == flags_.drop_step && rt_.generation() == 0) {
      comm().DropConnectionsBeforeNextCollective();
    }
    if (drop_requested.exchange(false)) comm().DropConnectionsBeforeNextCollective();  // SIGURG
    if (rt_.rank() == flags_.sleep_rank && step == flags_.sleep_step && rt_.generation() == 0) {
      comm().DelayNextCollective(flags_.sleep_in_collective);
    }
    comm().AllreduceSum(reduce_buffer_);  // throws sdk::CommunicationError
    if (rt_.rank() == flags_.corrupt_grad_rank && step == flags_.corrupt_grad_step &&
        rt_.generation() == 0) {
      uint32_t bits;  // a bit of one reduced gradient, as a faulty reduction would leave it
      std::memcpy(&bits, &reduce_buffer_[n / 3], sizeof(bits));
      bits ^= 1u << 5;
      std::memcpy(&reduce_buffer_[n / 3], &bits, sizeof(bits));
    }
    if (flags_.check_reduced_grad) {
      // Every replica holds the same reduced gradients: compared out of band, before the update.
      if (absl::Status s_check = s.CheckReplicated("mlp.reduced_gradients", reduce_buffer_.data(),
                                                   reduce_buffer_.size() * sizeof(float));
          !s_check.ok()) {
        std::fprintf(stderr, "rank %d step %" PRId64 ": %s\n", rt_.rank(), step,
                     s_check.ToString().c_str());
      }
    }

    const int bad_ranks = static_cast<int>(reduce_buffer_[n + 1]);
    if (bad_ranks > 0) {
      // A partial average would make this update differ from a clean replay: skip it everywhere.
      if (clean) {
        s.ReportFault(sdk::FaultKind::kStepFailure,
                      absl::StrCat(bad_ranks,
                                   " other rank(s) had a non-finite loss; the update is "
                                   "skipped on every rank"));
      }
      return;
    }
    const float inverse_world = 1.0f / static_cast<float>(comm().world_size());
    for (size_t i = 0; i < n; ++i) {
      reduce_buffer_[i] *= inverse_world;
    }
    const float loss = reduce_buffer_[n] * inverse_world;
    model_.ApplySgd(std::span<const float>(reduce_buffer_).first(n), flags_.learning_rate);
    if (rt_.rank() == flags_.flip_rank && step == flags_.flip_step &&
        (rt_.generation() == 0 || flags_.flip_every_generation)) {
      // A bit of one mantissa, as a faulty core or DIMM flips it: the value moves by a few ulps,
      // nothing fails, and the replicas disagree from now on.
      std::span<float> params = model_.mutable_parameters();
      uint32_t bits;
      std::memcpy(&bits, &params[params.size() / 2], sizeof(bits));
      bits ^= 1u << 3;
      std::memcpy(&params[params.size() / 2], &bits, sizeof(bits));
      std::printf("rank %d flipped a bit of mlp.parameters[%zu] at step %" PRId64 "\n", rt_.rank(),
                  params.size() / 2, step);
    }
    UpdateExtraState(step, loss);
    last_loss_ = loss;
    if (step % flags_.print_every == 0 || step == flags_.steps - 1) {
      std::printf("rank %d step %" PRId64 " loss %.6f\n", rt_.rank(), step, loss);
    }
  }

  const TrainerFlags& flags_;
  sdk::Runtime& rt_;
  const int dp_rank_;
  const SyntheticRegression task_;
  Mlp model_;
  std::vector<float> reduce_buffer_;
  std::vector<float> extra_state_;  // --extra-state-mib
  float last_loss_ = std::numeric_limits<float>::quiet_NaN();
  // --generate statistics, printed at the end.
  int64_t generate_phases_ = 0;
  int64_t generate_tokens_ = 0;
  absl::Duration longest_generation_ = absl::ZeroDuration();
  int64_t generations_over_bound_ = 0;
};

int Main(int argc, char** argv) {
  // Lines reach a file or pipe as they are printed: launchers and tests read them while we run.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // A peer that dies mid-send must surface as a gloo I/O error (a communication failure the guard
  // classifies), not kill this process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);

  absl::StatusOr<TrainerFlags> flags = ParseTrainerFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "cpp_trainer: %s\n%s", std::string(flags.status().message()).c_str(),
                 TrainerUsage().c_str());
    return 2;
  }
  if (flags->nan_on_sigusr1) {
    // Installed before any thread starts; the handler only stores to a lock-free atomic.
    struct sigaction action = {};
    action.sa_handler = [](int) { DataParallelTrainer::nan_requested.store(true); };
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &action, nullptr);
  }
  if (flags->drop_on_sigurg) {
    struct sigaction action = {};
    action.sa_handler = [](int) { DataParallelTrainer::drop_requested.store(true); };
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGURG, &action, nullptr);
  }
  if (flags->help) {
    std::printf("%s", TrainerUsage().c_str());
    return 0;
  }

  std::optional<sdk::Options> options = OptionsFromEnv("cpp_trainer");
  if (!options.has_value()) return 2;
  // Made before the Runtime: a standby parks in Runtime::Create, and state it builds first is
  // ready when it is assigned a rank (the restore overwrites its values).
  std::vector<float> extra_state;
  if (flags->extra_state_mib > 0) {
    extra_state.resize((size_t{1} << 20) / sizeof(float) * flags->extra_state_mib);
    SplitMix64 rng(flags->model_seed);
    for (float& x : extra_state) x = static_cast<float>(rng.Next() >> 40) * 0x1p-24f;
  }
  RecoveryPrinter printer;  // outlives the Runtime
  std::unique_ptr<sdk::Runtime> rt = CreateRuntime("cpp_trainer", *options);
  if (rt == nullptr) return 1;
  sdk::Runtime& runtime = *rt;
  const int rank = runtime.rank();
  const sdk::Topology& topology = runtime.topology();
  // The model is small enough for every rank to hold all of it. A declared tp/cp/pp layout (which
  // the placement of peer backups reads) makes the ranks of one model-parallel group train on the
  // same batch, as Megatron's do: their gradients are equal, so the average over all ranks is the
  // average over the data-parallel replicas.
  absl::StatusOr<sdk::RankCoordinates> coordinates = topology.CoordinatesOf(rank);
  if (!coordinates.ok()) {
    std::fprintf(stderr, "rank %d error: %s\n", rank, coordinates.status().ToString().c_str());
    return 1;
  }

  std::printf("rank %d start world %d job %s run_dir %s resume_step %" PRId64 " steps %" PRId64
              "\n",
              rank, runtime.world_size(), runtime.options().job_id.c_str(),
              runtime.run_dir().c_str(), runtime.resume_step(), flags->steps);

  printer.set_rank(rank);
  runtime.AddObserver(&printer);
  DataParallelTrainer trainer(*flags, runtime, coordinates->dp, std::move(extra_state));
  if (absl::Status s = trainer.Setup(); !s.ok()) {
    std::fprintf(stderr, "rank %d error: %s\n", rank, s.ToString().c_str());
    return 1;
  }
  return trainer.Run();
}

}  // namespace
}  // namespace cpp_trainer

int main(int argc, char** argv) { return cpp_trainer::Main(argc, argv); }
