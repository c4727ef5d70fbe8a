// What both example trainers print of trainguard's recovery, in the output interface their tests
// and scripts/demo.sh read (examples/cpp_trainer/trainer.cc describes the lines), and the checksum
// of a rank's parameters that their last line carries.
//
// Thread safety: RecoveryPrinter's callbacks come from the training thread (Runtime observers).
#ifndef TRAINGUARD_EXAMPLES_CPP_TRAINER_EXAMPLE_SUPPORT_H_
#define TRAINGUARD_EXAMPLES_CPP_TRAINER_EXAMPLE_SUPPORT_H_

#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "trainguard/sdk.h"

namespace cpp_trainer {

// trainguard's options from the environment (TRAINGUARD_*, torchrun's variables), validated;
// nullopt, after printing "<program>: invalid options: ..." to stderr, when they are not.
inline std::optional<sdk::Options> OptionsFromEnv(const char* program) {
  absl::StatusOr<sdk::Options> options = sdk::Options::FromEnv();
  if (options.ok()) {
    if (absl::Status valid = options->Validate(); !valid.ok()) options = valid;
  }
  if (!options.ok()) {
    std::fprintf(stderr, "%s: invalid options: %s\n", program, options.status().ToString().c_str());
    return std::nullopt;
  }
  return *std::move(options);
}

// The Runtime (a standby parks in it until it is given a rank); nullptr, after printing
// "<program>: cannot start the trainguard runtime: ..." to stderr, when it cannot be made.
inline std::unique_ptr<sdk::Runtime> CreateRuntime(const char* program,
                                                   const sdk::Options& options) {
  absl::StatusOr<std::unique_ptr<sdk::Runtime>> rt = sdk::Runtime::Create(options);
  if (!rt.ok()) {
    std::fprintf(stderr, "%s: cannot start the trainguard runtime: %s\n", program,
                 rt.status().ToString().c_str());
    return nullptr;
  }
  return *std::move(rt);
}

// XXH64 of `params`, then, when `extra` holds any bytes, XXH64 of them one part after the other
// (streamed: as of their concatenation, without copying it), seeded with the first; as 16 hex
// digits.
inline std::string ParamsChecksum(std::span<const float> params,
                                  std::initializer_list<std::span<const float>> extra) {
  XXH64_hash_t hash = XXH64(params.data(), params.size_bytes(), /*seed=*/0);
  if (std::any_of(extra.begin(), extra.end(), [](auto part) { return !part.empty(); })) {
    XXH64_state_t* state = XXH64_createState();
    XXH64_reset(state, hash);
    for (std::span<const float> part : extra) XXH64_update(state, part.data(), part.size_bytes());
    hash = XXH64_digest(state);
    XXH64_freeState(state);
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016" PRIx64, static_cast<uint64_t>(hash));
  return hex;
}

// Prints the fault and recovery lines of the output interface ("rank R step S fault ...", "rank R
// recover step S next N", "rank R restored step S from SOURCE", ...). Declared before the Runtime,
// so that it outlives it as AddObserver requires.
class RecoveryPrinter : public sdk::StepObserver {
 public:
  void set_rank(int rank) { rank_ = rank; }
  void OnStepBegin(int64_t) override {}
  void OnStepEnd(const sdk::StepResult& r) override {
    if (r.ok()) return;
    std::printf("rank %d step %" PRId64 " fault %s action %s: %s\n", rank_, r.step,
                std::string(sdk::FaultKindName(r.fault)).c_str(),
                std::string(sdk::StepActionName(r.action)).c_str(), r.status.ToString().c_str());
  }
  void OnRecovery(const sdk::RecoveryReport& report) override {
    if (!report.status.ok()) return;  // the caller prints the error
    if (report.failed_step >= 0) {
      std::printf("rank %d recover step %" PRId64 " next %" PRId64 "\n", rank_, report.failed_step,
                  report.next_step);
    }
    if (!report.restored_from.empty()) {
      std::printf("rank %d restored step %" PRId64 " from %s\n", rank_, report.next_step,
                  report.restored_from.c_str());
    }
    for (const std::string& skipped : report.restore_skipped) {
      std::printf("rank %d restore skipped %s\n", rank_, skipped.c_str());
    }
    if (report.generation_attempts > 1) {
      std::printf("rank %d generation %" PRId64 " entered after %d attempts\n", rank_,
                  report.generation, report.generation_attempts);
    }
    if (report.joined_generation) {
      std::printf("rank %d generation %" PRId64 " resume_step %" PRId64 " state_from %d\n", rank_,
                  report.generation, report.next_step, report.state_source_rank);
    }
  }

 private:
  int rank_ = -1;
};

}  // namespace cpp_trainer

#endif  // TRAINGUARD_EXAMPLES_CPP_TRAINER_EXAMPLE_SUPPORT_H_
