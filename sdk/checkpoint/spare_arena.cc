#include "sdk/checkpoint/spare_arena.h"

#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "sdk/checkpoint/held_backups.h"
#include "sdk/checkpoint/peer_backups.h"
#include "sdk/core/errno_error.h"
#include "trainguard/env.h"
#include "trainguard/store.h"

namespace trainguard {

namespace {

// A spare arena's segment name without its leading slash and the pid that ends it.
std::string SparePrefix(std::string_view job_id) {
  return absl::StrFormat("trainguard.%s.spare.pid", job_id);
}

}  // namespace

std::string SpareArena::Name(std::string_view job_id, int64_t pid) {
  return absl::StrFormat("/%s%d", SparePrefix(job_id), pid);
}

absl::StatusOr<std::unique_ptr<SpareArena>> SpareArena::Create(Env* env, const std::string& name,
                                                               uint64_t bytes) {
  absl::StatusOr<int> created = env->CreateSharedMemory(name);
  if (!created.ok()) return created.status();
  const int fd = *created;
  auto fail = [&](absl::Status status) {
    (void)env->RemoveSharedMemory(name);
    close(fd);
    return absl::Status(status.code(),
                        absl::StrCat("spare arena ", name, ": ", status.message()));
  };
  // Held for the segment's life, as an arena's is: `trainguard shm` and a second Snapshotter see
  // it in use.
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) return fail(ErrnoError(errno, "spare arena", name, "flock"));
  if (absl::Status s = env->ReserveSharedMemory(fd, name, bytes); !s.ok()) return fail(s);
  // MAP_POPULATE: the page-table entries too, as SnapshotArena maps an arena it creates; the
  // mapping is kept, so the takeover pays for neither.
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) return fail(ErrnoError(errno, "spare arena", name, "mmap"));
  return std::unique_ptr<SpareArena>(
      new SpareArena(env, name, bytes, fd, static_cast<char*>(base)));
}

SpareArena::~SpareArena() {
  if (base_ != nullptr) munmap(base_, bytes_);
  if (fd_ >= 0) {
    (void)env_->RemoveSharedMemory(name_);
    close(fd_);
  }
}

std::vector<std::string> SpareArena::RemoveAbandoned(Env* env, std::string_view job_id) {
  std::vector<std::string> removed;
  for (const auto& [name, pid] : checkpoint_internal::NumberedSharedMemory(SparePrefix(job_id))) {
    absl::StatusOr<int> fd = env->OpenSharedMemory(name, /*writable=*/false);
    if (!fd.ok()) continue;
    if (flock(*fd, LOCK_EX | LOCK_NB) == 0 && env->RemoveSharedMemory(name).ok()) {
      removed.push_back(name);
    }
    close(*fd);  // releases the lock
  }
  return removed;
}

std::optional<uint64_t> ChooseSpareArenaBytes(const std::vector<std::optional<uint64_t>>& sizes) {
  std::map<uint64_t, int> count;
  for (const std::optional<uint64_t>& s : sizes) {
    if (s.has_value() && *s > 0) ++count[*s];
  }
  std::optional<uint64_t> best;
  int best_count = 0;
  for (const auto& [bytes, n] : count) {  // ascending: a later tie is larger
    if (n >= best_count) {
      best = bytes;
      best_count = n;
    }
  }
  return best;
}

SpareArenaPreparer::SpareArenaPreparer(Store* job_store, SpareArenaPreparerOptions options)
    : store_(job_store), options_(std::move(options)), thread_([this] { Run(); }) {}

SpareArenaPreparer::~SpareArenaPreparer() { Stop(); }

void SpareArenaPreparer::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void SpareArenaPreparer::Run() {
  PrefixStore ckpt("ckpt", store_);
  std::vector<std::string> keys;
  for (int r = 0; r < options_.world_size; ++r) keys.push_back(PeerBackups::ArenaSizeKey(r));
  // Every rank publishes its size when it creates its checkpointer, soon after the job starts;
  // until then (and while the job runs without a fault) the standby just waits here.
  // At least one wait: sizes published before a prompt Stop are still used.
  absl::Status waited;
  do {
    waited = ckpt.Wait(keys, options_.poll);
  } while (absl::IsDeadlineExceeded(waited) && !stop_.load());
  if (absl::IsDeadlineExceeded(waited)) return;  // stopped before every size was published
  if (!waited.ok()) {
    status_ = waited;
    return;
  }
  absl::StatusOr<std::vector<std::optional<std::string>>> values =
      ckpt.MultiGet(keys, options_.poll * 20);
  if (!values.ok()) {
    status_ = values.status();
    return;
  }
  std::vector<std::optional<uint64_t>> sizes;
  for (const std::optional<std::string>& v : *values) {
    uint64_t bytes = 0;
    sizes.push_back(v.has_value() && absl::SimpleAtoi(*v, &bytes) ? std::optional(bytes)
                                                                   : std::nullopt);
  }
  const std::optional<uint64_t> bytes = ChooseSpareArenaBytes(sizes);
  if (!bytes.has_value()) return;
  Env* env = options_.env != nullptr ? options_.env : Env::Default();
  (void)SpareArena::RemoveAbandoned(env, options_.job_id);
  absl::StatusOr<std::unique_ptr<SpareArena>> spare = SpareArena::Create(env, options_.name, *bytes);
  if (!spare.ok()) {
    status_ = spare.status();
    return;
  }
  spare_ = *std::move(spare);
}

}  // namespace trainguard
