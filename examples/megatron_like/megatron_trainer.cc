// megatron_like: a Megatron-style C++ trainer with real tensor, pipeline and data-parallel groups,
// and the reference integration of trainguard in such a trainer (docs/GUIDE.md, "A Megatron-style
// trainer").
//
// The job's TRAINGUARD_WORLD_SIZE ranks form the grid TRAINGUARD_TP x TRAINGUARD_PP x DP (the rest)
// in Megatron-LM's order (include/trainguard/topology.h). The model is a stack of PP x
// --blocks-per-stage transformer MLP blocks (parallel_mlp.h): each pipeline stage holds its blocks,
// split column/row-parallel across its tensor-parallel group (two allreduces per block and
// micro-batch). A step runs --micro-batches micro-batches through the pipeline (GPipe: every
// forward, then every backward; activations sent to the next stage, their gradients back), then the
// distributed optimizer: the gradients are reduce-scattered over the data-parallel group, each rank
// updates its shard of the parameters with Adam from its shard of the optimizer state (which no
// other rank holds), and the parameters are all-gathered. Every group is a gloo communicator
// (megatron_groups.h), tracked under its own id, rebuilt by the Runtime's communicator factory in
// every membership generation.
//
// trainguard's part is what any trainer's is: the options and the topology from the environment,
// the state registered (the rank's parameters, replicated over its data-parallel group, and its
// optimizer shard), the communicator factory, Runtime::Start(), one sdk::guard per step and
// Runtime::recover() after a failed one. Restores (a rank's arena, a peer's backup, the disk),
// rebuilding the groups and replacing a rank are the SDK's. A rank's state is a shard: a
// replacement takes it from a checkpoint, never from a broadcast (set
// TRAINGUARD_CHECKPOINT_EVERY_STEPS).
//
// A non-finite value is named where it is born: each rank checks its share of each block's output
// before the tensor-parallel allreduce spreads it, and only when the block's input was finite
// (Step::CheckFinite); a rank that sees one arrive (from another stage, from a tensor-parallel
// peer, in the gradients) reports a step failure naming none. A count of such ranks rides in every
// shard of the reduce-scatter, so every rank of every group skips the update of that step.
//
// Output (each line starts with "rank R"; the tests read them):
//   rank R start world W tp T pp P dp D stage S params N
//   rank R step S loss L           (last stage, every --print-every'th and the last step; the mean
//                                   over the data-parallel replicas' micro-batches)
//   rank R step S fault KIND action ACTION: MESSAGE, rank R recover step S next N, rank R restored
//   step S from SOURCE, ...        (examples/cpp_trainer/example_support.h)
//   rank R stopping in a send at step S      (--stop-in-send)
//   rank R steps N median_step_us T tracked K (the successful steps, the first left out, each with
//                                   its guard; K: 1 when the groups' operations were tracked)
//   rank R final_loss L params_checksum H    (the last line: L is nan off the last stage; H the
//                                   XXH64 of the rank's parameters and optimizer shard)
// Exit status: 0 trained every step; 1 training stopped; 2 bad flags or options.
#include <signal.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "examples/cpp_trainer/example_support.h"
#include "examples/cpp_trainer/split_mix64.h"
#include "megatron_groups.h"
#include "parallel_mlp.h"
#include "trainguard/sdk.h"

namespace megatron_like {
namespace {

using cpp_trainer::SplitMix64;

struct Flags {
  int64_t steps = 40;
  int micro_batches = 4;
  int micro_batch_size = 4;
  int hidden = 32;
  int ffn = 128;
  int blocks_per_stage = 2;
  float learning_rate = 0.01f;
  int print_every = 10;
  uint64_t seed = 1234;
  absl::Duration comm_timeout = absl::Seconds(60);
  // Extra optimizer state per rank, MiB (recovery measurements): updated a slice per step.
  int state_mib = 0;
  // --track 0: the groups' operations are not recorded on the collective tracker (the baseline
  // of bench/bench_megatron_like.sh; the watchdog then sees no collective).
  bool track = true;
  // Faults, generation 0 only (RANK:STEP).
  int stop_rank = -1;  // --stop-in-send: SIGSTOP inside its first send of activations
  int64_t stop_step = -1;
  int kill_rank = -1;  // --kill-between: SIGKILL between the reduce-scatter and the all-gather
  int64_t kill_step = -1;
  int die_rank = -1;  // --kill-at: SIGKILL as the step begins
  int64_t die_step = -1;
  int nan_rank = -1;  // --nan-activation: a NaN in its first block's activations
  int64_t nan_step = -1;
};

constexpr char kUsage[] =
    "usage: megatron_like [--steps N] [--micro-batches M] [--micro-batch-size B] [--hidden H]\n"
    "         [--ffn F] [--blocks-per-stage L] [--lr X] [--print-every N] [--seed S]\n"
    "         [--comm-timeout-s S] [--state-mib N] [--track 0|1]\n"
    "         [--stop-in-send R:S] [--kill-between R:S] [--kill-at R:S] [--nan-activation R:S]\n"
    "Run under `trainguard run`, with TRAINGUARD_TP and TRAINGUARD_PP set to the tensor- and\n"
    "pipeline-parallel degrees; the rest of the world is data-parallel.\n";

bool ParseRankStep(absl::string_view value, int& rank, int64_t& step) {
  std::vector<absl::string_view> parts = absl::StrSplit(value, ':');
  return parts.size() == 2 && absl::SimpleAtoi(parts[0], &rank) &&
         absl::SimpleAtoi(parts[1], &step) && rank >= 0 && step >= 0;
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view name = argv[i];
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(name, " needs a value"));
    const absl::string_view value = argv[++i];
    double seconds = 0;
    bool ok = true;
    if (name == "--steps") {
      ok = absl::SimpleAtoi(value, &f.steps) && f.steps > 0;
    } else if (name == "--micro-batches") {
      ok = absl::SimpleAtoi(value, &f.micro_batches) && f.micro_batches > 0;
    } else if (name == "--micro-batch-size") {
      ok = absl::SimpleAtoi(value, &f.micro_batch_size) && f.micro_batch_size > 0;
    } else if (name == "--hidden") {
      ok = absl::SimpleAtoi(value, &f.hidden) && f.hidden > 0;
    } else if (name == "--ffn") {
      ok = absl::SimpleAtoi(value, &f.ffn) && f.ffn > 0;
    } else if (name == "--blocks-per-stage") {
      ok = absl::SimpleAtoi(value, &f.blocks_per_stage) && f.blocks_per_stage > 0;
    } else if (name == "--lr") {
      ok = absl::SimpleAtof(value, &f.learning_rate) && f.learning_rate > 0;
    } else if (name == "--print-every") {
      ok = absl::SimpleAtoi(value, &f.print_every) && f.print_every > 0;
    } else if (name == "--seed") {
      ok = absl::SimpleAtoi(value, &f.seed);
    } else if (name == "--comm-timeout-s") {
      ok = absl::SimpleAtod(value, &seconds) && seconds > 0;
      f.comm_timeout = absl::Seconds(seconds);
    } else if (name == "--track") {
      int track = 1;
      ok = absl::SimpleAtoi(value, &track) && (track == 0 || track == 1);
      f.track = track == 1;
    } else if (name == "--state-mib") {
      ok = absl::SimpleAtoi(value, &f.state_mib) && f.state_mib >= 0;
    } else if (name == "--stop-in-send") {
      ok = ParseRankStep(value, f.stop_rank, f.stop_step);
    } else if (name == "--kill-between") {
      ok = ParseRankStep(value, f.kill_rank, f.kill_step);
    } else if (name == "--kill-at") {
      ok = ParseRankStep(value, f.die_rank, f.die_step);
    } else if (name == "--nan-activation") {
      ok = ParseRankStep(value, f.nan_rank, f.nan_step);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", name));
    }
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("bad value for ", name, ": ", value));
  }
  return f;
}

bool AllFinite(std::span<const float> v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

class MegatronTrainer {
 public:
  MegatronTrainer(const Flags& flags, sdk::Runtime& rt, const sdk::RankCoordinates& at)
      : flags_(flags),
        rt_(rt),
        at_(at),
        stages_(rt.topology().pp()),
        dp_(rt.topology().dp()),
        shape_{flags.hidden,       flags.ffn, flags.blocks_per_stage,
               rt.topology().tp(), at.tp,     at.pp * flags.blocks_per_stage},
        shard_((ParallelMlp::Size(shape_) + dp_ - 1) / dp_),
        params_(shard_ * dp_, 0.0f),
        model_(shape_, flags.seed, params_),
        adam_m_(shard_, 0.0f),
        adam_v_(shard_, 0.0f),
        reduce_(static_cast<size_t>(dp_) * (shard_ + kTail)),
        extra_((size_t{1} << 20) / sizeof(float) * flags.state_mib, 0.0f) {
    SplitMix64 rng(SplitMix64::Mix(flags.seed, 0x7461726765ULL));
    target_.resize(static_cast<size_t>(flags.hidden) * flags.hidden);
    for (float& a : target_) a = rng.Symmetric(1.0f / std::sqrt(static_cast<float>(flags.hidden)));
  }

  ~MegatronTrainer() {
    rt_.CloseCommunicator();
    (void)rt_.WaitForCheckpoints(absl::Minutes(5));
  }

  absl::Status Setup() {
    // The parameters are the same on every rank of a data-parallel group (the all-gather makes
    // them so): replicated, compared at every snapshot. The optimizer shard is this rank's alone.
    auto host_f32 = [](const char* name, const char* group, std::vector<float>& v,
                       bool replicated) {
      return sdk::StateBuffer{name,
                              group,
                              v.data(),
                              v.size() * sizeof(float),
                              sdk::DType::kF32,
                              {static_cast<int64_t>(v.size())},
                              sdk::Device::Host(),
                              replicated};
    };
    std::vector<sdk::StateBuffer> buffers = {host_f32("params", "model", params_, true),
                                             host_f32("adam.m", "optimizer", adam_m_, false),
                                             host_f32("adam.v", "optimizer", adam_v_, false)};
    if (!extra_.empty()) buffers.push_back(host_f32("optimizer.extra", "optimizer", extra_, false));
    for (const sdk::StateBuffer& b : buffers) {
      if (absl::Status s = rt_.state().Register(b); !s.ok()) return s;
    }
    rt_.SetCommunicatorFactory([this](const sdk::CommunicatorSpec& spec)
                                   -> absl::StatusOr<std::unique_ptr<sdk::Communicator>> {
      sdk::CommunicatorSpec tracked = spec;
      if (!flags_.track) tracked.tracker = nullptr;
      absl::StatusOr<std::unique_ptr<MegatronGroups>> groups =
          MegatronGroups::Connect(tracked, rt_.topology(), flags_.comm_timeout);
      if (!groups.ok()) return groups.status();
      return std::unique_ptr<sdk::Communicator>(*std::move(groups));
    });
    return absl::OkStatus();
  }

  int Run() {
    const int rank = rt_.rank();
    absl::StatusOr<int64_t> start = rt_.Start();
    if (!start.ok()) {
      std::fprintf(stderr, "rank %d error: cannot start: %s\n", rank,
                   start.status().ToString().c_str());
      return 1;
    }
    for (int64_t step = *start; step < flags_.steps;) {
      const absl::Time begin = absl::Now();
      sdk::StepResult r = sdk::guard(rt_, step, [&](sdk::Step& s) { TrainStep(s); });
      if (r.ok()) {
        step_times_.push_back(absl::Now() - begin);
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
    if (!step_times_.empty()) {
      // The median of the successful steps (guard included), skipping the first (connections
      // warm up): what bench/bench_megatron_like.sh compares.
      std::vector<absl::Duration> times(step_times_.begin() + (step_times_.size() > 1 ? 1 : 0),
                                        step_times_.end());
      std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
      std::printf("rank %d steps %zu median_step_us %" PRId64 " tracked %d\n", rank,
                  step_times_.size(), absl::ToInt64Microseconds(times[times.size() / 2]),
                  flags_.track ? 1 : 0);
    }
    std::printf("rank %d final_loss %.6f params_checksum %s\n", rank, last_loss_,
                cpp_trainer::ParamsChecksum(std::span<const float>(params_).first(model_.size()),
                                            {adam_m_, adam_v_, extra_})
                    .c_str());
    return 0;
  }

 private:
  // Each data-parallel shard of the reduce-scatter carries, after its gradients, the sum of the
  // members' losses and the count of members that saw a non-finite value.
  static constexpr size_t kTail = 2;

  MegatronGroups& groups() { return static_cast<MegatronGroups&>(*rt_.communicator()); }

  bool Fault(int rank, int64_t fault_step, int64_t step) const {
    return rt_.rank() == rank && step == fault_step && rt_.generation() == 0;
  }

  // The inputs of micro-batch `micro` of this rank's data-parallel replica at `step`: a function of
  // its arguments only, so a replayed step sees the same data. The first stage feeds them to the
  // model, the last computes their targets.
  std::vector<float> Inputs(int64_t step, int micro) const {
    SplitMix64 rng(SplitMix64::Mix(
        SplitMix64::Mix(SplitMix64::Mix(flags_.seed, static_cast<uint64_t>(step)), at_.dp), micro));
    std::vector<float> x(static_cast<size_t>(flags_.micro_batch_size) * flags_.hidden);
    for (float& v : x) v = rng.Symmetric(1.0f);
    return x;
  }

  // The targets tanh(A x) of a fixed A.
  std::vector<float> Targets(const std::vector<float>& x) const {
    const int h = flags_.hidden;
    const int rows = flags_.micro_batch_size;
    std::vector<float> y(x.size());
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < h; ++i) {
        float z = 0.0f;
        for (int k = 0; k < h; ++k) z += target_[i * h + k] * x[r * h + k];
        y[r * h + i] = std::tanh(z);
      }
    }
    return y;
  }

  void TrainStep(sdk::Step& s) {
    const int64_t step = s.number();
    if (Fault(flags_.die_rank, flags_.die_step, step)) raise(SIGKILL);
    MegatronGroups& g = groups();
    const int rows = flags_.micro_batch_size;
    const int h = flags_.hidden;
    const int micros = flags_.micro_batches;
    const bool first = at_.pp == 0;
    const bool last = at_.pp == stages_ - 1;
    model_.ZeroGradients();
    auto tp_allreduce = [&g](std::span<float> data) { g.TpAllreduce(data); };
    bool born_here = false;  // this rank named a non-finite value it produced
    bool saw_bad = false;    // any non-finite value reached this rank
    auto check = [&](int block, std::span<const float> input, std::span<const float> partial) {
      if (born_here || !AllFinite(input)) return;  // not born here: it arrived
      born_here = !s.CheckFinite(absl::StrCat("stage", at_.pp, ".block", block, ".partial"),
                                 partial.data(), partial.size(), sdk::DType::kF32);
    };

    // Forward, every micro-batch: GPipe.
    std::vector<std::vector<float>> dy(micros);
    float loss_sum = 0.0f;
    std::vector<float> inputs;
    std::vector<float> x(static_cast<size_t>(rows) * h);
    for (int m = 0; m < micros; ++m) {
      if (first || last) inputs = Inputs(step, m);
      if (first) {
        x = inputs;
      } else {
        g.RecvPrev(x);
      }
      const bool poison = m == 0 && Fault(flags_.nan_rank, flags_.nan_step, step);
      model_.Forward(m, x, rows, tp_allreduce, check, poison ? 7 : -1);
      saw_bad |= !AllFinite(x);
      if (!last) {
        if (m == 0 && Fault(flags_.stop_rank, flags_.stop_step, step)) {
          std::printf("rank %d stopping in a send at step %" PRId64 "\n", rt_.rank(), step);
          g.StopInNextSend();
        }
        g.SendNext(x);
        continue;
      }
      // The loss: the mean over the global batch of |out - target|^2 / 2H.
      const float scale = 1.0f / static_cast<float>(h * rows * micros * dp_);
      const std::vector<float> y = Targets(inputs);
      dy[m].resize(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        const float d = x[i] - y[i];
        loss_sum += 0.5f * d * d / static_cast<float>(h);
        dy[m][i] = d * scale;
      }
    }
    // Backward, in reverse.
    for (int m = micros - 1; m >= 0; --m) {
      if (!last) {
        dy[m].resize(static_cast<size_t>(rows) * h);
        g.RecvNext(dy[m]);
      }
      model_.Backward(m, dy[m], rows, tp_allreduce);
      if (!first) g.SendPrev(dy[m]);
    }
    saw_bad |= !AllFinite(model_.gradients());

    // The distributed optimizer: reduce-scatter, this rank's shard, all-gather.
    const std::span<const float> grads = model_.gradients();
    for (int k = 0; k < dp_; ++k) {
      float* out = reduce_.data() + k * (shard_ + kTail);
      for (size_t i = 0; i < shard_; ++i) {
        const size_t at = k * shard_ + i;
        out[i] = at < grads.size() ? grads[at] : 0.0f;
      }
      out[shard_] = last ? loss_sum : 0.0f;
      out[shard_ + 1] = saw_bad ? 1.0f : 0.0f;
    }
    g.DpReduceScatter(reduce_);
    const float* mine = reduce_.data() + g.dp_rank() * (shard_ + kTail);
    const int bad_ranks = static_cast<int>(mine[shard_ + 1]);
    if (bad_ranks > 0) {
      if (!born_here) {
        s.ReportFault(sdk::FaultKind::kStepFailure,
                      absl::StrCat("a non-finite value born on another rank reached ", bad_ranks,
                                   " rank(s) of this data-parallel group; the update is skipped "
                                   "on every rank"));
      }
      return;
    }
    if (Fault(flags_.kill_rank, flags_.kill_step, step)) raise(SIGKILL);
    AdamUpdate(step, std::span<const float>(mine, shard_));
    g.DpAllGather(params_);
    UpdateExtraState(step);
    if (last) {
      last_loss_ = mine[shard_] / static_cast<float>(dp_ * micros * rows);
      if (step % flags_.print_every == 0 || step == flags_.steps - 1) {
        std::printf("rank %d step %" PRId64 " loss %.6f\n", rt_.rank(), step, last_loss_);
      }
    }
  }

  // Adam on this rank's shard; the step count is the step number, so a replay is exact.
  void AdamUpdate(int64_t step, std::span<const float> grad) {
    constexpr float kBeta1 = 0.9f, kBeta2 = 0.999f, kEps = 1e-8f;
    const float t = static_cast<float>(step + 1);
    const float c1 = 1.0f - std::pow(kBeta1, t);
    const float c2 = 1.0f - std::pow(kBeta2, t);
    float* p = params_.data() + groups().dp_rank() * shard_;
    for (size_t i = 0; i < shard_; ++i) {
      adam_m_[i] = kBeta1 * adam_m_[i] + (1.0f - kBeta1) * grad[i];
      adam_v_[i] = kBeta2 * adam_v_[i] + (1.0f - kBeta2) * grad[i] * grad[i];
      p[i] -= flags_.learning_rate * (adam_m_[i] / c1) / (std::sqrt(adam_v_[i] / c2) + kEps);
    }
  }

  // A deterministic 16 KiB slice of the extra state per step, so that a stale restore shows.
  void UpdateExtraState(int64_t step) {
    if (extra_.empty()) return;
    constexpr size_t kSlice = 4096;
    float* slice = extra_.data() + (static_cast<size_t>(step) % (extra_.size() / kSlice)) * kSlice;
    for (size_t i = 0; i < kSlice; ++i) slice[i] = 0.5f * slice[i] + static_cast<float>(step);
  }

  const Flags& flags_;
  sdk::Runtime& rt_;
  const sdk::RankCoordinates at_;
  const int stages_;
  const int dp_;
  const MlpShape shape_;       // this rank's share of the model
  const size_t shard_;         // parameters per data-parallel shard
  std::vector<float> params_;  // the stage's parameters (dp_ * shard_, zero padded): registered
  ParallelMlp model_;          // computes with params_
  std::vector<float> adam_m_;  // this rank's shard of the optimizer state: registered
  std::vector<float> adam_v_;
  std::vector<float> reduce_;  // dp_ shards of shard_ + kTail floats
  std::vector<float> extra_;   // --state-mib
  std::vector<float> target_;  // A of the targets tanh(A x)
  float last_loss_ = std::numeric_limits<float>::quiet_NaN();
  std::vector<absl::Duration> step_times_;  // of the successful steps
};

int Main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::signal(SIGPIPE, SIG_IGN);
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "megatron_like: %s\n%s", std::string(flags.status().message()).c_str(),
                 kUsage);
    return 2;
  }
  std::optional<sdk::Options> options = cpp_trainer::OptionsFromEnv("megatron_like");
  if (!options.has_value()) return 2;
  cpp_trainer::RecoveryPrinter printer;  // outlives the Runtime
  std::unique_ptr<sdk::Runtime> rt = cpp_trainer::CreateRuntime("megatron_like", *options);
  if (rt == nullptr) return 1;
  sdk::Runtime& runtime = *rt;
  const int rank = runtime.rank();
  const sdk::Topology& topology = runtime.topology();
  absl::StatusOr<sdk::RankCoordinates> at = topology.CoordinatesOf(rank);
  if (!at.ok()) {
    std::fprintf(stderr, "rank %d error: %s\n", rank, at.status().ToString().c_str());
    return 1;
  }
  if (topology.cp() != 1 || flags->ffn % topology.tp() != 0) {
    std::fprintf(stderr, "rank %d error: %s: --ffn %d must be divisible by tp, and cp must be 1\n",
                 rank, topology.ToString().c_str(), flags->ffn);
    return 2;
  }
  printer.set_rank(rank);
  runtime.AddObserver(&printer);
  MegatronTrainer trainer(*flags, runtime, *at);
  std::printf("rank %d start world %d tp %d pp %d dp %d stage %d resume_step %" PRId64 "\n", rank,
              runtime.world_size(), topology.tp(), topology.pp(), topology.dp(), at->pp,
              runtime.resume_step());
  if (absl::Status s = trainer.Setup(); !s.ok()) {
    std::fprintf(stderr, "rank %d error: %s\n", rank, s.ToString().c_str());
    return 1;
  }
  return trainer.Run();
}

}  // namespace
}  // namespace megatron_like

int main(int argc, char** argv) { return megatron_like::Main(argc, argv); }
