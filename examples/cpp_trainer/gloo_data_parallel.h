// GlooDataParallel: the example trainer's data-parallel communicator, gloo's TCP transport on
// 127.0.0.1, and its trainguard::Communicator: the Runtime builds one per membership generation
// (trainer.cc's factory), aborts it on a failure and broadcasts the model through it to a
// replacement.
//
// Every rank of the job calls Connect() with the same store directory and rendezvous id; gloo's
// ranks publish their listening addresses as files in that directory (a gloo FileStore under a
// PrefixStore named by the id) and connect to each other in a full mesh. AllreduceSum() then sums a
// flat float buffer across the ranks with gloo's ring allreduce (reduce-scatter, then all-gather:
// each element is summed once, on one rank, and copied to the others), so every rank gets
// bit-identical results.
//
// Failures are reported the way trainguard expects: Connect() and Broadcast() (called by the
// Runtime, outside any guard) return a Status; AllreduceSum() (called inside a guarded step)
// throws trainguard::CommunicationError, whatever gloo threw, so the guard classifies a dead or
// hung peer as a communication failure rather than an unknown exception.
//
// Rendezvous files outlive the job: gloo's FileStore refuses to overwrite a key, so a second launch
// in the same directory with the same id fails at once ("File already exists") instead of reading
// the first launch's dead addresses. Callers use a rendezvous id unique per launch (see
// trainer.cc).
//
// Thread safety: Abort() from any thread; everything else belongs to the training thread.
#ifndef TRAINGUARD_EXAMPLES_CPP_TRAINER_GLOO_DATA_PARALLEL_H_
#define TRAINGUARD_EXAMPLES_CPP_TRAINER_GLOO_DATA_PARALLEL_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainguard/communicator.h"

namespace trainguard {
class CollectiveTracker;
class Store;
}  // namespace trainguard

namespace gloo {
class AllreduceOptions;
class Context;
}  // namespace gloo

namespace cpp_trainer {

class GlooDataParallel final : public trainguard::Communicator {
 public:
  struct Config {
    int rank = 0;
    int world_size = 1;
    // Where the ranks meet: the job's trainguard store when there is one (then store_dir is
    // unused), else gloo FileStore files in store_dir.
    trainguard::Store* store = nullptr;
    std::string store_dir;      // created if missing; shared by every rank of the job
    std::string rendezvous_id;  // the same on every rank, unique per launch (and per generation)
    // Bounds the rendezvous and every collective: a peer that is gone or stuck for this long is an
    // error instead of a hang.
    absl::Duration timeout = absl::Seconds(60);
    // When set, every collective is recorded (Begin/End, with this communicator id) for the
    // watchdog and the flight recorder. The Runtime registers the communicator under comm_id
    // itself (CommunicatorSpec), so a hang reaches Abort().
    trainguard::CollectiveTracker* tracker = nullptr;
    uint64_t comm_id = 0;
  };

  // Rendezvous with every other rank and connect to all of them. Blocks until all `world_size`
  // ranks have called Connect(), or fails after `timeout`. Errors name the rank, the directory and
  // the id.
  static absl::StatusOr<std::unique_ptr<GlooDataParallel>> Connect(const Config& config);

  ~GlooDataParallel() override;

  // Fails every connection (trainguard::AbortGlooContext): a collective blocked in this
  // communicator, here or at a peer, fails at once. Idempotent.
  void Abort() override;

  // Replaces `data` on every rank by its element-wise sum over all ranks. Every rank must call it
  // with the same size, in the same order. Throws trainguard::CommunicationError (naming this rank
  // and the collective's sequence number) when gloo fails or times out. The communicator is broken
  // after that, and gloo may still write to `data` until the communicator is destroyed.
  void AllreduceSum(std::span<float> data);

  // Replaces the host bytes at `data` on every rank by `root`'s. Unimplemented for device memory
  // (this example trains on the host); Unavailable, naming the rank, the root and the sequence
  // number, when gloo fails.
  absl::Status Broadcast(void* data, size_t bytes, trainguard::Device device, int root) override;

  // Fault injection (demos and tests): the next collective sleeps for `delay` once it is recorded
  // as entered, before it exchanges any data, like a rank that is slow inside a collective while
  // its peers wait in it.
  void DelayNextCollective(absl::Duration delay) { next_delay_ = delay; }
  // Fault injection: the next collective first closes every connection of this rank, like a link
  // that drops. It fails, and so do the peers' (their connection is closed by this peer), while
  // every process stays alive.
  void DropConnectionsBeforeNextCollective() { drop_next_ = true; }

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

 private:
  GlooDataParallel(int rank, int world_size, std::shared_ptr<gloo::Context> context,
                   trainguard::CollectiveTracker* tracker, uint64_t comm_id);

  const int rank_;
  const int world_size_;
  const std::shared_ptr<gloo::Context> context_;
  trainguard::CollectiveTracker* const tracker_;  // nullptr: collectives are not recorded
  const uint64_t comm_id_;
  // A failed gloo collective is not cancelled: transfers it left in flight may still complete on
  // gloo's I/O thread and touch its buffers. They are kept until the destructor has closed every
  // connection.
  std::vector<std::shared_ptr<void>> failed_collectives_;  // gloo::*Options of any collective
  uint64_t collectives_ = 0;                               // sequence number of the next collective
  absl::Duration next_delay_ = absl::ZeroDuration();
  bool drop_next_ = false;
  // The watchdog's abort and the Runtime's may race. A std::mutex: ThreadSanitizer sees it
  // (Debian's Abseil is not built for TSan, so it cannot see absl::Mutex).
  std::mutex abort_mu_;
  bool aborted_ = false;  // guarded by abort_mu_
};

}  // namespace cpp_trainer

#endif  // TRAINGUARD_EXAMPLES_CPP_TRAINER_GLOO_DATA_PARALLEL_H_
