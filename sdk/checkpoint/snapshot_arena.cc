#include "sdk/checkpoint/snapshot_arena.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "sdk/core/errno_error.h"
#include "sdk/core/human_bytes.h"
#include "trainguard/env.h"

namespace trainguard {
namespace checkpoint_internal {
namespace {

// Populated up front: the page-table entries of the whole arena are set up once, here, and not by
// page faults in the middle of the first snapshots (about 1 s per 4 GiB of 4 KiB pages).
constexpr int kMapFlags = MAP_SHARED | MAP_POPULATE;

constexpr std::string_view kArena = "snapshot arena";

// Why an existing segment of `size` bytes whose header is `header` cannot serve `geometry`; empty
// when it can.
std::string Mismatch(const ArenaHeader& header, uint64_t size, const ArenaGeometry& geometry) {
  if (size < sizeof(ArenaHeader)) return absl::StrFormat("it is only %d bytes", size);
  if (header.magic != kArenaMagicValue) {
    return "it has no arena header (its creator died while creating it, or it is not an arena)";
  }
  if (header.format_version != kArenaFormatVersion) {
    return absl::StrFormat("it has format version %d, this library writes %d",
                           header.format_version, kArenaFormatVersion);
  }
  if (header.layout_hash != geometry.layout_hash) {
    return absl::StrFormat(
        "it holds state of layout hash %016x, the registry has layout hash %016x (other buffers, "
        "sizes, dtypes, shapes or devices)",
        header.layout_hash, geometry.layout_hash);
  }
  const ArenaGeometry found{header.layout_hash, header.chunk_bytes, header.payload_capacity,
                            header.max_chunks, header.slot_header_bytes};
  if (!(found == geometry) || header.segment_bytes != size || size != geometry.segment_bytes()) {
    return absl::StrFormat(
        "its geometry (chunk %d bytes, slot capacity %d bytes, %d bytes) differs from this one "
        "(chunk %d bytes, slot capacity %d bytes, %d bytes)",
        header.chunk_bytes, header.payload_capacity, size, geometry.chunk_bytes,
        geometry.payload_capacity, geometry.segment_bytes());
  }
  return "";
}

// Takes the segment's exclusive lock, so that two live processes never write one arena; a lock
// held elsewhere is polled for, every millisecond, until `wait` has passed.
absl::Status LockSegment(int fd, const std::string& name, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return ErrnoError(errno, kArena, name, "flock");
    if (absl::Now() >= deadline) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "snapshot arena %s: in use by another live Snapshotter (a process of this rank that "
          "has not exited, or a second Snapshotter in this one)%s",
          name,
          wait > absl::ZeroDuration()
              ? absl::StrCat("; waited ", absl::FormatDuration(wait), " for it to exit")
              : ""));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return absl::OkStatus();
}

// An Env error about the arena's segment, saying it is the snapshot arena.
absl::Status InArena(absl::Status status) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(std::string(kArena), ": ", std::string(status.message())));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SnapshotArena>> SnapshotArena::OpenOrCreate(
    Env* env, const std::string& name, const ArenaGeometry& geometry, std::string* replaced_reason,
    std::string_view keep_other_layout, SpareArena* spare, absl::Duration lock_wait) {
  replaced_reason->clear();
  const uint64_t size = geometry.segment_bytes();
  absl::StatusOr<int> existing = env->OpenSharedMemory(name, /*writable=*/true);
  if (existing.ok()) {
    const int fd = *existing;
    if (absl::Status locked = LockSegment(fd, name, lock_wait); !locked.ok()) {
      close(fd);
      return locked;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
      const int error = errno;
      close(fd);
      return ErrnoError(error, kArena, name, "fstat");
    }
    ArenaHeader header{};
    if (static_cast<uint64_t>(st.st_size) >= sizeof(header) &&
        pread(fd, &header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header))) {
      std::memset(&header, 0, sizeof(header));
    }
    *replaced_reason = Mismatch(header, static_cast<uint64_t>(st.st_size), geometry);
    if (replaced_reason->empty()) {
      void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, kMapFlags, fd, 0);
      if (base == MAP_FAILED) {
        const int error = errno;
        close(fd);
        return ErrnoError(error, kArena, name, "mmap");
      }
      return std::unique_ptr<SnapshotArena>(
          new SnapshotArena(name, geometry, fd, static_cast<char*>(base), /*reopened=*/true));
    }
    if (!keep_other_layout.empty() && header.magic == kArenaMagicValue &&
        header.format_version == kArenaFormatVersion &&
        header.layout_hash != geometry.layout_hash) {
      close(fd);
      return absl::FailedPreconditionError(absl::StrFormat(
          "snapshot arena %s (%d bytes) holds the state of layout hash %016x, the registry has "
          "layout hash %016x (%s): it is neither restored into this registry nor replaced",
          name, static_cast<uint64_t>(st.st_size), header.layout_hash, geometry.layout_hash,
          keep_other_layout));
    }
    // Another layout: the old snapshot can never be restored into this registry, so it is replaced.
    (void)env->RemoveSharedMemory(name);
    close(fd);
  } else if (!absl::IsNotFound(existing.status())) {
    return InArena(existing.status());
  }

  if (spare != nullptr) {
    if (std::unique_ptr<SnapshotArena> adopted = Adopt(env, name, geometry, spare)) return adopted;
  }
  absl::StatusOr<int> created = env->CreateSharedMemory(name);
  if (!created.ok()) return InArena(created.status());
  const int fd = *created;
  auto fail = [&](absl::Status status) {
    (void)env->RemoveSharedMemory(name);
    close(fd);
    return InArena(std::move(status));
  };
  if (absl::Status locked = LockSegment(fd, name, absl::ZeroDuration()); !locked.ok()) {
    close(fd);
    return locked;
  }
  // Reserve the memory now: a full /dev/shm then fails here, not with SIGBUS in the middle of a
  // copy. The error says what the arena needs, whichever Env refused it: the room to make.
  if (absl::Status s = env->ReserveSharedMemory(fd, name, size); !s.ok()) {
    (void)env->RemoveSharedMemory(name);
    close(fd);
    return absl::Status(
        s.code(),
        absl::StrFormat("%s %s needs %s (two slots of %s): %s", kArena, name, HumanBytes(size),
                        HumanBytes(geometry.payload_capacity), s.message()));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, kMapFlags, fd, 0);
  if (base == MAP_FAILED) return fail(ErrnoError(errno, kArena, name, "mmap"));
  return Initialise(name, geometry, fd, static_cast<char*>(base));
}

std::unique_ptr<SnapshotArena> SnapshotArena::Adopt(Env* env, const std::string& name,
                                                    const ArenaGeometry& geometry,
                                                    SpareArena* spare) {
  if (spare->fd_ < 0 || spare->bytes() != geometry.segment_bytes()) return nullptr;
  // The spare is zeroed memory of the arena's size, reserved and mapped: under the arena's name
  // it is what creating the arena would have made. A failed rename (the name taken meanwhile)
  // leaves the spare to its destructor and the arena to the usual path.
  if (!env->RenameSharedMemory(spare->name(), name).ok()) return nullptr;
  const int fd = spare->fd_;
  char* const base = spare->base_;
  spare->Release();
  return Initialise(name, geometry, fd, base);
}

std::unique_ptr<SnapshotArena> SnapshotArena::Initialise(std::string name,
                                                         const ArenaGeometry& geometry, int fd,
                                                         char* base) {
  const uint64_t size = geometry.segment_bytes();
  auto* header = reinterpret_cast<ArenaHeader*>(base);
  header->format_version = kArenaFormatVersion;
  header->layout_hash = geometry.layout_hash;
  header->chunk_bytes = geometry.chunk_bytes;
  header->payload_capacity = geometry.payload_capacity;
  header->max_chunks = geometry.max_chunks;
  header->slot_header_bytes = geometry.slot_header_bytes;
  header->segment_bytes = size;
  auto arena = std::unique_ptr<SnapshotArena>(
      new SnapshotArena(std::move(name), geometry, fd, base, /*reopened=*/false));
  for (int i = 0; i < 2; ++i) {
    SlotHeader* slot = arena->slot(i);
    std::memcpy(slot->magic, kSlotMagic, sizeof(kSlotMagic));
    slot->format_version = kArenaFormatVersion;
    StoreState(slot, kSlotEmpty);
  }
  // The magic last: a segment whose creator died before this line is recognised as unusable.
  std::atomic_ref<uint64_t>(header->magic).store(kArenaMagicValue, std::memory_order_release);
  return arena;
}

SnapshotArena::~SnapshotArena() {
  munmap(base_, geometry_.segment_bytes());
  close(fd_);  // releases the flock
}

SlotHeader* SnapshotArena::slot(int i) const {
  return reinterpret_cast<SlotHeader*>(base_ + kArenaAlignment + i * geometry_.slot_header_bytes);
}

char* SnapshotArena::payload(int i) const {
  return base_ + kArenaAlignment + 2 * geometry_.slot_header_bytes + i * geometry_.payload_capacity;
}

absl::Status SnapshotArena::Remove(Env* env, const std::string& name) {
  return InArena(env->RemoveSharedMemory(name));
}

}  // namespace checkpoint_internal
}  // namespace trainguard
