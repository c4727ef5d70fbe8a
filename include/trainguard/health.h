// Numerical health of a training step: finite checks on buffers (gradients, activations, weights)
// and loss-spike detection.
//
// CheckFiniteHost() scans a host buffer of fp32/fp16/bf16/fp64 elements for NaN and Inf by testing
// the exponent bits with integer operations, at close to memory bandwidth; a buffer that is all
// finite (the common case) is read once, and only a buffer that is not is scanned again to locate
// and count the bad elements.
//
// FiniteChecker does the same for CUDA device buffers without ever synchronising the training
// stream. The no-sync contract: Check() enqueues a small kernel on the caller's stream, after the
// work that produces the buffer, and returns at once; the kernel writes its verdict into pinned,
// host-mapped memory. Collect(), called at the step boundary, reports every check whose kernel has
// finished and reports the others as pending (carried to the next Collect()); it never waits for a
// kernel. Host buffers are checked at once, inside Check(), by CheckFiniteHost(). Call Check() on
// the gradients before the gradient reduction, so a NaN is attributed to the rank (and buffer) that
// produced it rather than to every rank after the all-reduce has spread it.
//
// LossSpikeDetector flags a loss far above the recent ones, using the median and the median
// absolute deviation of a sliding window, which one outlier cannot drag along.
//
// Thread safety: CheckFiniteHost() is thread-safe. FiniteChecker and LossSpikeDetector are not:
// each is used by one thread (the training thread) at a time.
#ifndef TRAINGUARD_HEALTH_H_
#define TRAINGUARD_HEALTH_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainguard/checkpoint.h"  // DType, Device

namespace trainguard {

// What a finite check found in one buffer.
struct FiniteCheckResult {
  size_t nonfinite_count = 0;    // elements that are NaN or +/-Inf
  int64_t first_bad_index = -1;  // the lowest such element index; -1 when all are finite
  bool has_nan = false;
  bool has_inf = false;

  bool all_finite() const { return nonfinite_count == 0; }
  bool operator==(const FiniteCheckResult&) const = default;
};

// Checks `count` elements of `dtype` at `data`, a host address with any alignment. kF32, kF16 (IEEE
// half), kBF16 and kF64 are checked; the integer dtypes (kU8, kI32, kI64) cannot hold NaN or Inf
// and are reported all finite without being read. Subnormals, zeros of either sign and the
// largest finite values are finite. REQUIRES: `data` is readable for count * DTypeSize(dtype)
// bytes (it may be null when count is 0).
FiniteCheckResult CheckFiniteHost(const void* data, size_t count, DType dtype);

// The outcome of one FiniteChecker::Check().
struct BufferCheck {
  std::string buffer_name;  // as given to Check()
  DType dtype = DType::kF32;
  Device device;
  size_t count = 0;  // elements checked
  // The kernel had not finished when Collect() looked; `result` is not known yet and the check is
  // reported again by the next Collect().
  bool pending = false;
  FiniteCheckResult result;  // meaningful when !pending
};

// Runs finite checks on host and CUDA device buffers during a step and reports them at the step
// boundary. A fixed number of result slots lives in pinned, host-mapped memory (allocated once, in
// Create()), so neither Check() nor Collect() allocates device memory or synchronises.
//
// A FiniteChecker must not be copied (its slots are written by kernels in flight). Destroying it
// never waits: if a kernel of one of its checks is still running (a hung stream), the pinned slots
// are leaked rather than freed under that kernel.
class FiniteChecker {
 public:
  // Allocates `max_checks_per_step` result slots: pinned and mapped into the device address space
  // when trainguard is built with CUDA and a device is present, plain host memory otherwise (then
  // only host buffers can be checked). InvalidArgument unless max_checks_per_step >= 1; Internal
  // when the CUDA runtime fails to allocate.
  static absl::StatusOr<std::unique_ptr<FiniteChecker>> Create(int max_checks_per_step);
  ~FiniteChecker();
  FiniteChecker(const FiniteChecker&) = delete;
  FiniteChecker& operator=(const FiniteChecker&) = delete;

  // Checks `count` elements of `dtype` at `data`, naming the buffer `buffer_name` in the result.
  // For a host buffer the check runs now; for a CUDA buffer a kernel is enqueued on `cuda_stream`
  // (a cudaStream_t; nullptr means the legacy default stream) after whatever the caller already
  // queued there, and Check() returns without waiting. REQUIRES: a device buffer is neither freed
  // nor modified by work that is not ordered after `cuda_stream` until the check's kernel has run
  // (work queued later on the same stream is ordered after it).
  // InvalidArgument for null `data` with count > 0 or a CUDA ordinal that does not exist;
  // ResourceExhausted when every slot holds a check not yet collected; FailedPrecondition for a
  // CUDA buffer when trainguard has no CUDA or no device was present at Create(); Internal (naming
  // the buffer and device) when the launch fails.
  absl::Status Check(std::string_view buffer_name, const void* data, size_t count, DType dtype,
                     Device device, void* cuda_stream);

  // Reports every check made since the last Collect() plus those it reported pending, in the order
  // of the Check() calls; finished ones free their slots. Never waits for a kernel. Internal
  // (naming the buffer and device) when the CUDA runtime reports an error for a check's kernel,
  // e.g. a sticky error from earlier work on its stream; the other checks stay to be collected.
  absl::StatusOr<std::vector<BufferCheck>> Collect();

  // Drops every check not yet collected, pending ones included (for a step that is abandoned, whose
  // results no longer matter). A slot whose kernel is still running is reused only once that kernel
  // has finished. Collect() alone is enough between steps that complete.
  void Reset();

  // Checks made and not yet collected (finished or not).
  int outstanding() const;
  int capacity() const;
  // True when CUDA buffers can be checked (CUDA built and a device present at Create()).
  bool has_cuda() const;

 private:
  struct Slots;
  explicit FiniteChecker(std::unique_ptr<Slots> slots);

  std::unique_ptr<Slots> slots_;
};

// Tuning of LossSpikeDetector.
struct LossSpikeOptions {
  int window = 100;        // the last `window` accepted losses form the reference
  double threshold = 8.0;  // a spike is a loss more than `threshold` scaled MADs above the median
  int warmup = 20;         // no spike is reported before this many losses are in the window (>= 20)
};

// A loss that LossSpikeDetector reports.
struct LossSpike {
  enum class Kind { kSpike, kNonFinite };
  Kind kind = Kind::kSpike;
  int64_t step = 0;
  double loss = 0;  // for kNonFinite: the NaN or +/-Inf observed
  // The scale the loss was judged on: log(loss) when it and every loss in the window are positive
  // (the usual case), the loss itself otherwise.
  bool log_scale = false;
  // The window's median loss when `loss` was observed (0 if the window is empty); on the log scale
  // exp of the median of the log losses.
  double median = 0;
  // 1.4826 x the median absolute deviation (a standard deviation for Gaussian noise) of the window,
  // on the judging scale (of log(loss) when log_scale); 0 if empty.
  double mad = 0;
  // (x - median) / mad on the judging scale (x = log(loss) and the median's log when log_scale),
  // with mad floored so a flat series still scores a jump (1e-6 on the log scale, 1e-6 x |median|
  // and 1e-12 on the loss's); 0 for kNonFinite.
  double score = 0;
};

// Flags losses that jump far above the recent ones, and every non-finite loss.
//
// A training loss is judged on the log scale: per-batch losses are skewed (a few hard examples
// make a batch's loss twice the median, rarely half), more so as training converges and the median
// falls, and their log is close to symmetric: judged on the loss itself, a healthy converging loop
// raises false alarms at any useful threshold (docs/PERFORMANCE.md, "Loss-spike detector's false
// alarms", measures both scales on the example's loop). A loss that is zero or
// negative (or a window holding one: an RL objective, a log-likelihood) is judged on the loss
// itself.
//
// Only upward jumps are spikes: a loss that falls is not a fault. A loss reported as a spike (or
// non-finite) is not added to the window, so one spike does not raise the median and the MAD that
// judge the next. Observe(), Judge() and Accept() do not allocate: the window and the scratch
// space for the medians are allocated once, in Create(); each call costs O(window).
//
// The window is state a checkpoint must hold: a run resumed from a checkpoint judges its losses
// exactly as the uninterrupted run only if its window is the one the uninterrupted run had there.
// SaveState() and LoadState() carry it (the Runtime saves it with every snapshot).
class LossSpikeDetector {
 public:
  // InvalidArgument unless 20 <= warmup <= window and threshold is positive and finite.
  static absl::StatusOr<LossSpikeDetector> Create(const LossSpikeOptions& options = {});

  // Judges `loss` observed at `step` against the window, then adds it to the window unless it is
  // reported. Returns the report for a spike (only once the window holds `warmup` losses) or a
  // non-finite loss (always), std::nullopt otherwise.
  std::optional<LossSpike> Observe(int64_t step, double loss);
  // Observe() in two halves, for a caller that adds a loss only once its step has succeeded (the
  // Runtime: a failed step's loss stays out, so the replay of that step is judged against the
  // window the first try saw). Judge() reports as Observe() does and adds nothing; Accept() adds a
  // loss Judge() did not report.
  std::optional<LossSpike> Judge(int64_t step, double loss);
  void Accept(double loss);

  // The window as bytes: a version, then the losses, oldest first (host byte order).
  std::string SaveState() const;
  // Replaces the window with one SaveState() wrote; "" empties it. A saved window longer than
  // options.window keeps its newest losses. InvalidArgument (naming what is wrong) for bytes
  // SaveState() did not write; the window is then unchanged.
  absl::Status LoadState(std::string_view state);

  // Losses currently in the window (at most options.window).
  int window_size() const { return size_; }
  const LossSpikeOptions& options() const { return options_; }

 private:
  explicit LossSpikeDetector(const LossSpikeOptions& options);
  // The median of scratch_[0, n), which it reorders.
  double ScratchMedian(int n);

  LossSpikeOptions options_;
  // Sets log_window_ and nonpositive_ from window_ (after LoadState).
  void RecomputeLogs();

  std::vector<double> window_;      // ring buffer of options_.window losses
  std::vector<double> log_window_;  // log of each positive one (same ring positions)
  std::vector<double> scratch_;     // same size: reordered to find medians
  int size_ = 0;                    // valid entries in window_
  int next_ = 0;                    // where the next loss goes
  int nonpositive_ = 0;             // entries <= 0 in window_: then no log scale
};

}  // namespace trainguard

#endif  // TRAINGUARD_HEALTH_H_
