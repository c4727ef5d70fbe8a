// TurnReadStore: a Store in front of the job's store that answers the reads of one turn of a host
// agent's loop from a single MultiGet made at the turn's start.
//
// An agent's turn reads a handful of keys, each with a Get of its own component: its fence
// (agents/dead/<host>), the job's end (job/failed, job/done), the coordinator lease, the newest
// generation (rdzv/current), its kill requests' count, the plan or the restart round. At 2,048
// hosts and four turns a second that was some 65,000 requests a second at the store for facts
// that almost never change. BeginTurn reads them all in one request; until EndTurn a Get (or a
// MultiGet of those keys only) is answered from what it read, as of the turn's start, and every
// other call goes to the store behind. A write through this store (Set, Add, SetAndAdd,
// CompareAndSet, Delete) of a key read drops it, so a component reads its own writes; a write by
// another client is seen at the next turn, as it would be had the Get come at the turn's start.
// When the MultiGet fails, nothing is held and every read goes to the store (and fails or not
// there, as before).
//
// Thread safety: thread-safe (the agent's loop turns; a helper thread, such as the generation-0
// former, may read through it meanwhile and gets the same answers).
#ifndef TRAINGUARD_SDK_HOST_AGENT_TURN_READ_STORE_H_
#define TRAINGUARD_SDK_HOST_AGENT_TURN_READ_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/core/forwarding_store.h"
#include "sdk/core/mutex.h"
#include "trainguard/store.h"

namespace trainguard {

class TurnReadStore final : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;  // a store behind, borrowed or owned

  // Reads `keys` in one MultiGet (within `timeout`) and holds their values, absent ones as absent,
  // until EndTurn. Returns the MultiGet's status (nothing is held when it failed).
  absl::Status BeginTurn(const std::vector<std::string>& keys, absl::Duration timeout);
  // Forgets what BeginTurn read: reads go to the store again.
  void EndTurn();

  // Held keys are answered from the turn's read; the others go to the store behind.
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<std::vector<std::optional<std::string>>> MultiGet(
      const std::vector<std::string>& keys, absl::Duration timeout) override;

  // Writes go to the store behind, and drop the keys written from the turn's read. Every other
  // call goes straight to the store behind (ForwardingStore).
  absl::Status Set(std::string_view key, std::string_view value, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta, absl::Duration timeout) override;
  absl::StatusOr<int64_t> SetAndAdd(std::string_view set_key, std::string_view value,
                                    std::string_view add_key, int64_t delta,
                                    absl::Duration timeout) override;
  absl::StatusOr<bool> CreateAndAdd(std::string_view key, std::string_view value,
                                    std::string_view add_key, int64_t delta,
                                    absl::Duration timeout) override;
  absl::StatusOr<CompareAndSetResult> CompareAndSet(std::string_view key,
                                                    const std::optional<std::string>& expected,
                                                    std::string_view desired,
                                                    absl::Duration timeout) override;
  absl::StatusOr<bool> Delete(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<std::vector<CompareAndSetResult>> WriteBatch(const std::vector<BatchWrite>& writes,
                                                              absl::Duration timeout) override;

  // The reads answered from turns' MultiGets so far (what the store was spared).
  int64_t reads_answered() const {
    MutexLock lock(&mu_);
    return reads_answered_;
  }

 private:
  void Forget(std::string_view key);

  mutable Mutex mu_;
  // The current turn's values by key (nullopt: absent at the turn's start).
  std::map<std::string, std::optional<std::string>, std::less<>> held_ ABSL_GUARDED_BY(mu_);
  int64_t reads_answered_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_HOST_AGENT_TURN_READ_STORE_H_
