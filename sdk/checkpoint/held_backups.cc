#include "sdk/checkpoint/held_backups.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "sdk/checkpoint/snapshotter.h"
#include "sdk/core/scoped_fd.h"
#include "trainguard/env.h"

namespace trainguard {
namespace checkpoint_internal {
namespace {

std::string SegmentPrefix(std::string_view job_id) {
  return absl::StrFormat("trainguard.%s.backup.rank", job_id);
}

}  // namespace

std::string BackupArenaName(std::string_view job_id, int source_rank) {
  return absl::StrFormat("/%s%d", SegmentPrefix(job_id), source_rank);
}

uint64_t SlotFingerprint(SlotHeader* slot) {
  const uint64_t* sums = ChunkChecksums(slot);
  return SnapshotFingerprint(slot->step, slot->layout_hash, slot->payload_bytes,
                             std::vector<uint64_t>(sums, sums + slot->num_chunks));
}

bool SlotUsable(const SlotHeader* slot, const ArenaGeometry& g) {
  return std::memcmp(slot->magic, kSlotMagic, sizeof(kSlotMagic)) == 0 &&
         slot->format_version == kArenaFormatVersion && slot->layout_hash == g.layout_hash &&
         slot->chunk_bytes == g.chunk_bytes && slot->payload_bytes <= g.payload_capacity &&
         slot->num_chunks == (slot->payload_bytes + g.chunk_bytes - 1) / g.chunk_bytes &&
         slot->num_chunks <= g.max_chunks;
}

absl::StatusOr<std::optional<ArenaGeometry>> ReadBackupGeometry(Env* env, const std::string& name) {
  absl::StatusOr<int> opened = env->OpenSharedMemory(name, /*writable=*/false);
  if (absl::IsNotFound(opened.status())) return std::optional<ArenaGeometry>();
  if (!opened.ok()) return opened.status();
  ScopedFd fd(*opened);
  ArenaHeader header{};
  struct stat st;
  if (fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) < sizeof(header) ||
      pread(fd.get(), &header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header)) ||
      header.magic != kArenaMagicValue || header.format_version != kArenaFormatVersion ||
      header.chunk_bytes == 0) {
    return absl::DataLossError(absl::StrFormat("backup arena %s has no valid arena header", name));
  }
  const ArenaGeometry geometry =
      GeometryFor(header.layout_hash, header.chunk_bytes, header.payload_capacity);
  if (geometry.max_chunks != header.max_chunks ||
      geometry.slot_header_bytes != header.slot_header_bytes ||
      geometry.segment_bytes() != static_cast<uint64_t>(st.st_size)) {
    return absl::DataLossError(
        absl::StrFormat("backup arena %s: its header does not match its size", name));
  }
  return std::optional<ArenaGeometry>(geometry);
}

std::vector<HeldBackup> CompleteSlots(int source_rank, const ArenaGeometry& geometry,
                                      SlotHeader* slots[2], int writing) {
  std::vector<std::pair<uint64_t, HeldBackup>> found;
  for (int i = 0; i < 2; ++i) {
    if (i == writing || LoadState(slots[i]) != kSlotComplete || !SlotUsable(slots[i], geometry)) {
      continue;
    }
    found.emplace_back(slots[i]->sequence,
                       HeldBackup{source_rank, slots[i]->step, SlotFingerprint(slots[i]),
                                  slots[i]->payload_bytes});
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<HeldBackup> out;
  for (auto& [sequence, held] : found) out.push_back(held);
  return out;
}

std::vector<HeldBackup> PeekBackupArena(Env* env, const std::string& name, int source_rank) {
  absl::StatusOr<std::optional<ArenaGeometry>> geometry = ReadBackupGeometry(env, name);
  if (!geometry.ok() || !geometry->has_value()) return {};
  absl::StatusOr<int> opened = env->OpenSharedMemory(name, /*writable=*/false);
  if (!opened.ok()) return {};
  ScopedFd fd(*opened);
  const ArenaGeometry& g = **geometry;
  std::vector<std::string> headers(2, std::string(g.slot_header_bytes, '\0'));
  SlotHeader* slots[2];
  for (int i = 0; i < 2; ++i) {
    const off_t at = static_cast<off_t>(kArenaAlignment + i * g.slot_header_bytes);
    if (pread(fd.get(), headers[i].data(), g.slot_header_bytes, at) !=
        static_cast<ssize_t>(g.slot_header_bytes)) {
      return {};
    }
    slots[i] = reinterpret_cast<SlotHeader*>(headers[i].data());
  }
  return CompleteSlots(source_rank, g, slots, /*writing=*/-1);
}

// /dev/shm is where Linux keeps POSIX shared memory; the Env has no listing.
std::vector<std::pair<std::string, int>> NumberedSharedMemory(std::string_view prefix) {
  std::vector<std::pair<std::string, int>> found;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return found;
  while (const dirent* entry = readdir(dir)) {
    const std::string_view name(entry->d_name);
    if (name.substr(0, prefix.size()) != prefix) continue;
    const std::string_view digits = name.substr(prefix.size());
    if (digits.empty() || digits.size() > 9 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    found.emplace_back("/" + std::string(name), std::stoi(std::string(digits)));
  }
  closedir(dir);
  return found;
}

std::vector<int> BackupArenasOnHost(std::string_view job_id) {
  std::vector<int> ranks;
  for (const auto& [name, rank] : NumberedSharedMemory(SegmentPrefix(job_id))) {
    ranks.push_back(rank);
  }
  return ranks;
}

}  // namespace checkpoint_internal
}  // namespace trainguard
