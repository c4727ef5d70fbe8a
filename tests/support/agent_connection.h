// AgentConnection: one agent's connection to a job's shared store in a decision test, with the
// faults of a network in between: cut off (every call fails Unavailable, nothing is applied),
// replies lost (the call is applied, then fails DeadlineExceeded), and calls that take `latency`
// of the agent's ManualClock before they are applied. Wraps any Store; not thread-safe (a test
// drives it from one thread).
#ifndef TRAINGUARD_TESTS_SUPPORT_AGENT_CONNECTION_H_
#define TRAINGUARD_TESTS_SUPPORT_AGENT_CONNECTION_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainguard/clock.h"
#include "trainguard/store.h"

namespace trainguard::testing {

class AgentConnection final : public Store {
 public:
  // REQUIRES: `base` (and `clock`, when given) outlive the connection. Without a clock, `latency`
  // must stay zero.
  explicit AgentConnection(Store* base, ManualClock* clock = nullptr)
      : base_(base), clock_(clock) {}

  bool cut_off = false;
  bool lose_replies = false;
  absl::Duration latency = absl::ZeroDuration();

  absl::Status Set(std::string_view key, std::string_view value, absl::Duration timeout) override {
    return Call([&] { return base_->Set(key, value, timeout); });
  }
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override {
    return Call([&] { return base_->Get(key, timeout); });
  }
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta,
                              absl::Duration timeout) override {
    return Call([&] { return base_->Add(key, delta, timeout); });
  }
  absl::StatusOr<CompareAndSetResult> CompareAndSet(std::string_view key,
                                                    const std::optional<std::string>& expected,
                                                    std::string_view desired,
                                                    absl::Duration timeout) override {
    return Call([&] { return base_->CompareAndSet(key, expected, desired, timeout); });
  }
  absl::StatusOr<bool> Delete(std::string_view key, absl::Duration timeout) override {
    return Call([&] { return base_->Delete(key, timeout); });
  }
  absl::StatusOr<std::vector<std::optional<std::string>>> MultiGet(
      const std::vector<std::string>& keys, absl::Duration timeout) override {
    return Call([&] { return base_->MultiGet(keys, timeout); });
  }
  absl::StatusOr<std::vector<std::optional<AgedValue>>> MultiGetWithAges(
      const std::vector<std::string>& keys, absl::Duration timeout) override {
    return Call([&] { return base_->MultiGetWithAges(keys, timeout); });
  }
  absl::StatusOr<std::vector<std::string>> ListKeys(std::string_view prefix,
                                                    absl::Duration timeout) override {
    return Call([&] { return base_->ListKeys(prefix, timeout); });
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    return Call([&] { return base_->Wait(keys, timeout); });
  }
  absl::StatusOr<size_t> WaitAny(const std::vector<std::string>& keys,
                                 absl::Duration timeout) override {
    return Call([&] { return base_->WaitAny(keys, timeout); });
  }
  absl::Status RaiseFence(int64_t generation, absl::Duration timeout) override {
    return Call([&] { return base_->RaiseFence(generation, timeout); });
  }
  absl::StatusOr<std::vector<CompareAndSetResult>> WriteBatch(const std::vector<BatchWrite>& writes,
                                                              absl::Duration timeout) override {
    return Call([&] { return base_->WriteBatch(writes, timeout); });
  }
  void SetWriterGeneration(int64_t generation) override { base_->SetWriterGeneration(generation); }

 private:
  template <typename F>
  auto Call(F f) -> decltype(f()) {
    if (cut_off) return absl::UnavailableError("cut off from the store");
    if (clock_ != nullptr) clock_->Advance(latency);
    auto result = f();
    if (lose_replies) return absl::DeadlineExceededError("the reply was lost");
    return result;
  }

  Store* const base_;
  ManualClock* const clock_;
};

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_AGENT_CONNECTION_H_
