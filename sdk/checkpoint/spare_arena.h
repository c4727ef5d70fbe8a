// SpareArena: the shared memory a parked standby prepares for the snapshot arena of the rank it
// will take, before it knows which rank that is. A standby of a multi-host job replaces the ranks
// of a lost host, whose arenas died with it: the arena the replacement restores into must be
// created, reserved and faulted in before the first byte of a peer backup can land in it, and that
// costs about as long as the fetch itself. The ranks publish their arena sizes in the store before
// any fault (PeerBackups: ckpt/backup/size/<rank>), so a parked standby creates a segment of that
// size (SpareArenaPreparer), reserves its memory and maps every page; at the takeover
// SnapshotArena::OpenOrCreate renames it to the rank's arena (when the rank has none on this host
// and the sizes agree) and keeps the mapping. Otherwise it is removed and the arena created as
// before: a spare never changes what is restored, only how soon.
//
// The segment is /dev/shm/trainguard.<job>.spare.pid<pid> (`trainguard shm list` shows it as a
// spare arena); removed by the destructor unless adopted. A standby killed while parked (or while
// it filled its spare) leaves it behind, unlocked: the next standby's preparer on the host removes
// it before it makes its own (RemoveAbandoned), and `trainguard shm remove` does too.
//
// Thread safety: a SpareArena belongs to one thread at a time. SpareArenaPreparer's Stop and
// Take belong to its owner's thread; its own thread is started by the constructor and joined by
// Stop or the destructor.
#ifndef TRAINGUARD_SDK_CHECKPOINT_SPARE_ARENA_H_
#define TRAINGUARD_SDK_CHECKPOINT_SPARE_ARENA_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainguard {

class Env;
class Store;

namespace checkpoint_internal {
class SnapshotArena;
}

class SpareArena {
 public:
  static std::string Name(std::string_view job_id, int64_t pid);
  // Removes the spare arenas of `job_id` in this host's /dev/shm that no live process holds (a
  // spare's lock is held for its life and dies with its standby), so that a killed standby's
  // segment does not keep the memory the next one needs. Returns the names removed. Best effort.
  // A segment created in the instant before its creator locks it may be removed too: that
  // standby's spare is then not adopted (renaming it fails), and its arena is created at the
  // takeover as without a spare.
  static std::vector<std::string> RemoveAbandoned(Env* env, std::string_view job_id);
  // Creates segment `name` of `bytes`, reserves its memory (a full /dev/shm fails here with
  // ResourceExhausted) and maps it with every page faulted in.
  static absl::StatusOr<std::unique_ptr<SpareArena>> Create(Env* env, const std::string& name,
                                                            uint64_t bytes);
  ~SpareArena();  // unmaps it, and removes the segment unless an arena adopted it
  SpareArena(const SpareArena&) = delete;
  SpareArena& operator=(const SpareArena&) = delete;

  const std::string& name() const { return name_; }
  uint64_t bytes() const { return bytes_; }

 private:
  friend class checkpoint_internal::SnapshotArena;
  SpareArena(Env* env, std::string name, uint64_t bytes, int fd, char* base)
      : env_(env), name_(std::move(name)), bytes_(bytes), fd_(fd), base_(base) {}
  // For SnapshotArena::OpenOrCreate: the segment, already renamed, becomes the arena's; this object
  // keeps nothing.
  void Release() {
    fd_ = -1;
    base_ = nullptr;
  }

  Env* const env_;
  const std::string name_;
  const uint64_t bytes_;
  int fd_;
  char* base_;
};

// The size to prepare from the sizes the ranks published (nullopt: not published): the one most
// ranks have (a data-parallel job's ranks usually all do), the larger of a tie. nullopt when none
// is published.
std::optional<uint64_t> ChooseSpareArenaBytes(const std::vector<std::optional<uint64_t>>& sizes);

struct SpareArenaPreparerOptions {
  std::string job_id;
  int world_size = 0;
  Env* env = nullptr;  // nullptr: Env::Default()
  std::string name;    // the spare's segment name (SpareArena::Name)
  // How long one store wait lasts before the thread checks whether it was stopped.
  absl::Duration poll = absl::Milliseconds(100);
};

// A thread that waits until every rank published its arena size in `job_store` (the job's store,
// keys under ckpt/), then creates the SpareArena of ChooseSpareArenaBytes.
class SpareArenaPreparer {
 public:
  SpareArenaPreparer(Store* job_store, SpareArenaPreparerOptions options);
  ~SpareArenaPreparer();  // Stop()
  SpareArenaPreparer(const SpareArenaPreparer&) = delete;
  SpareArenaPreparer& operator=(const SpareArenaPreparer&) = delete;

  // Ends the wait for the sizes (within one poll) and joins the thread; a creation under way is
  // completed first.
  void Stop();
  // After Stop: the spare (nullptr when none was made), and why not, if it failed.
  std::unique_ptr<SpareArena> Take() { return std::move(spare_); }
  const absl::Status& status() const { return status_; }

 private:
  void Run();

  Store* const store_;
  const SpareArenaPreparerOptions options_;
  std::atomic<bool> stop_{false};
  // Written by the thread, read by the owner after the join.
  std::unique_ptr<SpareArena> spare_;
  absl::Status status_;
  std::thread thread_;  // last: started after every other member is initialised
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_SPARE_ARENA_H_
