// A Communicator whose broadcast goes through the generation's scoped store (CommunicatorSpec::
// store): the root writes the bytes under the next sequence number, the others wait for them.
// Enough to test what the Runtime and its generation entry do with a communicator, with ranks as
// threads and no network. Only Broadcast is implemented; Abort makes every later call fail
// Cancelled. Groups() returns what the test set.
#ifndef TRAINGUARD_TESTS_SUPPORT_STORE_COMMUNICATOR_H_
#define TRAINGUARD_TESTS_SUPPORT_STORE_COMMUNICATOR_H_

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "trainguard/communicator.h"
#include "trainguard/store.h"

namespace trainguard::testing {

class StoreCommunicator : public Communicator {
 public:
  // `aborted` is shared with the test, which reads whether the Runtime aborted this communicator;
  // `timeout` bounds each store request.
  StoreCommunicator(const CommunicatorSpec& spec, std::shared_ptr<std::atomic<bool>> aborted,
                    absl::Duration timeout)
      : store_(spec.store), rank_(spec.rank), aborted_(std::move(aborted)), timeout_(timeout) {}

  void Abort() override { aborted_->store(true); }

  // The groups Groups() returns (none unless set).
  void set_groups(std::vector<Group> groups) { groups_ = std::move(groups); }
  std::vector<Group> Groups() const override { return groups_; }

  absl::Status Broadcast(void* data, size_t bytes, Device, int root) override {
    if (aborted_->load()) return absl::CancelledError("aborted");
    const std::string key = absl::StrCat("bcast/", sequence_++);
    if (rank_ == root) {
      return store_->Set(key, std::string_view(static_cast<const char*>(data), bytes), timeout_);
    }
    if (absl::Status s = store_->Wait({key}, timeout_); !s.ok()) return s;
    absl::StatusOr<std::string> value = store_->Get(key, timeout_);
    if (!value.ok()) return value.status();
    if (value->size() != bytes) return absl::DataLossError("broadcast of another size");
    std::memcpy(data, value->data(), bytes);
    return absl::OkStatus();
  }

 private:
  Store* const store_;
  const int rank_;
  const std::shared_ptr<std::atomic<bool>> aborted_;
  const absl::Duration timeout_;
  int sequence_ = 0;
  std::vector<Group> groups_;
};

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_STORE_COMMUNICATOR_H_
