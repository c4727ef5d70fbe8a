// MegatronGroups: the megatron_like example's communicators, one gloo context (TCP on the host's
// loopback address) per parallel group this rank is a member of, built together for one membership
// generation by the Runtime's communicator factory:
//
//   tp<g>            the tensor-parallel group: the allreduces of the column/row-parallel layers
//   dp<g>            the data-parallel group: the gradients' reduce-scatter and the parameters'
//                    all-gather around the distributed optimizer
//   pp<g>.link<s>    the two ranks of pipeline group g at stages s and s+1: activations forward,
//                    their gradients backward (send/recv)
//
// Each is a trainguard::Communicator group (Groups()): the Runtime registers it with the collective
// tracker under CommunicatorSpec::GroupId, every operation is tracked under that id (with the peer
// of a send or receive), so a hang names the group, the operation and its sequence number, and the
// diagnosis follows the waits from one group to the next. Abort() fails every context: a rank
// blocked in any of them, here or at a peer, wakes with an error. Every operation throws
// trainguard::CommunicationError when gloo fails or times out.
//
// The Runtime's state broadcast (Broadcast()) is refused: a rank's state is its own shard of the
// model and of the optimizer, which no other rank holds whole; a new rank takes it from a
// checkpoint (its arena, a peer's backup, the disk).
//
// Thread safety: Abort() from any thread; everything else belongs to the training thread.
#ifndef TRAINGUARD_EXAMPLES_MEGATRON_LIKE_MEGATRON_GROUPS_H_
#define TRAINGUARD_EXAMPLES_MEGATRON_LIKE_MEGATRON_GROUPS_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainguard/communicator.h"
#include "trainguard/topology.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace megatron_like {

class MegatronGroups final : public trainguard::Communicator {
 public:
  // Builds every group of `spec.rank` in `topology` through `spec.store` (required). Blocks until
  // each group's members have connected, or fails after `timeout`.
  static absl::StatusOr<std::unique_ptr<MegatronGroups>> Connect(
      const trainguard::CommunicatorSpec& spec, const trainguard::Topology& topology,
      absl::Duration timeout);
  ~MegatronGroups() override;

  void Abort() override;
  absl::Status Broadcast(void* data, size_t bytes, trainguard::Device device, int root) override;
  std::vector<Group> Groups() const override;

  // Sums `data` over the tensor-parallel group.
  void TpAllreduce(std::span<float> data);
  // Reduce-scatter over the data-parallel group: `data` holds dp() equal shards; afterwards shard
  // dp_rank() of it is the sum of every member's (the others are undefined).
  void DpReduceScatter(std::span<float> data);
  // All-gather over the data-parallel group: shard dp_rank() of `data` (dp() equal shards) is this
  // rank's; afterwards every shard is its owner's.
  void DpAllGather(std::span<float> data);
  // Activations to the next stage, gradients to the previous one, and back. `micro` is only for
  // the error messages.
  void SendNext(std::span<const float> data);
  void RecvPrev(std::span<float> data);
  void SendPrev(std::span<const float> data);
  void RecvNext(std::span<float> data);

  // Fault injection: the next SendNext is recorded as entered, and then this process stops itself
  // (SIGSTOP) before a byte goes out, like a stage stuck in the middle of a send.
  void StopInNextSend() { stop_in_next_send_ = true; }

  int dp() const { return static_cast<int>(dp_group_.size()); }
  int dp_rank() const { return dp_rank_; }

 private:
  struct Link;
  MegatronGroups(int rank, absl::Duration timeout);
  void Send(Link& link, std::span<const float> data, const char* what);
  void Recv(Link& link, std::span<float> data, const char* what);
  [[noreturn]] void Fail(const std::string& what, uint64_t seq);

  const int rank_;
  const absl::Duration timeout_;
  std::vector<int> dp_group_;
  int dp_rank_ = 0;
  // Each group: its context, its tracked id and name, the next sequence number.
  struct Channel {
    std::shared_ptr<gloo::Context> context;
    uint64_t comm_id = 0;
    std::string name;
    uint64_t seq = 0;
  };
  Channel tp_;
  Channel dp_;
  struct Link {
    Channel channel;
    int peer_rank = -1;  // the other stage's rank in the job
    int peer = -1;       // its rank in the link's context (0 or 1)
  };
  std::unique_ptr<Link> next_;  // to stage + 1; nullptr on the last stage
  std::unique_ptr<Link> prev_;  // to stage - 1; nullptr on the first stage
  trainguard::CollectiveTracker* tracker_ = nullptr;
  bool stop_in_next_send_ = false;
  // Transfers a failed operation left in flight may still touch its buffers until the contexts
  // are closed (the destructor).
  std::vector<std::shared_ptr<void>> failed_;
  // The watchdog's abort and the Runtime's may race. A std::mutex: ThreadSanitizer sees it.
  std::mutex abort_mu_;
  bool aborted_ = false;  // guarded by abort_mu_
};

}  // namespace megatron_like

#endif  // TRAINGUARD_EXAMPLES_MEGATRON_LIKE_MEGATRON_GROUPS_H_
