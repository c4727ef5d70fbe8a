// CheckBatch: what every Store's WriteBatch refuses before it writes anything.
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "trainguard/store.h"

namespace trainguard {

absl::Status CheckBatch(const std::vector<BatchWrite>& writes) {
  if (writes.size() > Store::kMaxBatchWrites) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a store batch of %d writes exceeds the limit of %d", writes.size(),
                        Store::kMaxBatchWrites));
  }
  absl::flat_hash_set<std::string_view> keys;
  bool fence_raised = false;
  for (size_t i = 0; i < writes.size(); ++i) {
    const BatchWrite& write = writes[i];
    switch (write.op) {
      case BatchWrite::Op::kSet:
      case BatchWrite::Op::kCompareAndSet:
        if (write.key.empty()) {
          return absl::InvalidArgumentError(
              absl::StrFormat("write %d of a store batch has an empty key", i));
        }
        if (!keys.insert(write.key).second) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "write %d of a store batch writes store key %s a second time", i, write.key));
        }
        break;
      case BatchWrite::Op::kRaiseFence:
        if (fence_raised) {
          return absl::InvalidArgumentError(
              absl::StrFormat("write %d of a store batch raises the fence a second time", i));
        }
        fence_raised = true;
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrFormat("write %d of a store batch has no known operation (%d)", i,
                            static_cast<int>(write.op)));
    }
  }
  return absl::OkStatus();
}

}  // namespace trainguard
