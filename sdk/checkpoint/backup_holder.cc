#include "sdk/checkpoint/backup_holder.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "sdk/checkpoint/backup_wire.h"
#include "sdk/checkpoint/snapshotter.h"
#include "trainguard/env.h"

namespace trainguard {

using checkpoint_internal::AlignUp;
using checkpoint_internal::ArenaGeometry;
using checkpoint_internal::BackupArenaName;
using checkpoint_internal::BackupArenasOnHost;
using checkpoint_internal::BackupPieceBytes;
using checkpoint_internal::ChunkChecksums;
using checkpoint_internal::CompleteSlots;
using checkpoint_internal::GeometryFor;
using checkpoint_internal::kArenaAlignment;
using checkpoint_internal::kArenaFormatVersion;
using checkpoint_internal::kBackupProtocolVersion;
using checkpoint_internal::kMaxBackupChunks;
using checkpoint_internal::kMaxBackupPayloadCapacity;
using checkpoint_internal::kSlotComplete;
using checkpoint_internal::kSlotEmpty;
using checkpoint_internal::kSlotMagic;
using checkpoint_internal::kSlotWriting;
using checkpoint_internal::LoadState;
using checkpoint_internal::PeekBackupArena;
using checkpoint_internal::ReadBackupGeometry;
using checkpoint_internal::ReceiveBackupMessage;
using checkpoint_internal::ReceiveVerified;
using checkpoint_internal::SendBackupMessage;
using checkpoint_internal::SlotFingerprint;
using checkpoint_internal::SlotHeader;
using checkpoint_internal::SlotUsable;
using checkpoint_internal::SnapshotArena;
using checkpoint_internal::StoreState;
using checkpoint_internal::WithContext;

namespace {

// Equal strings, in time that depends only on their lengths.
bool TokenMatches(std::string_view expected, std::string_view got) {
  unsigned char diff = expected.size() == got.size() ? 0 : 1;
  const size_t n = std::max(expected.size(), got.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char a = i < expected.size() ? expected[i] : 0;
    const unsigned char b = i < got.size() ? got[i] : 0;
    diff |= a ^ b;
  }
  return diff == 0;
}

absl::Status Reply(BackupStream* stream, const absl::Status& status,
                   proto::BackupReply reply = {}) {
  reply.set_code(static_cast<int32_t>(status.code()));
  reply.set_message(std::string(status.message()));
  proto::BackupMessage message;
  *message.mutable_reply() = std::move(reply);
  return SendBackupMessage(stream, message);
}

}  // namespace

BackupHolder::BackupHolder(const BackupServiceOptions& options, std::string address)
    : options_(options),
      env_(options.env != nullptr ? options.env : Env::Default()),
      address_(std::move(address)) {}

std::string BackupHolder::name() const {
  return absl::StrFormat("backup holder rank %d (%s)", options_.rank, address_);
}

void BackupHolder::Log(const std::string& what) const {
  std::fprintf(stderr, "trainguard: %s: %s\n", name().c_str(), what.c_str());
}

BackupHolder::Source* BackupHolder::FindSource(int rank) {
  MutexLock lock(&sources_mu_);
  auto it = sources_.find(rank);
  return it == sources_.end() ? nullptr : it->second.get();
}

BackupHolder::Source* BackupHolder::GetSource(int rank) {
  MutexLock lock(&sources_mu_);
  std::unique_ptr<Source>& source = sources_[rank];
  if (source == nullptr) source = std::make_unique<Source>();
  return source.get();
}

std::vector<HeldBackup> BackupHolder::Held() {
  std::vector<int> ranks = BackupArenasOnHost(options_.job_id);
  {
    MutexLock lock(&sources_mu_);
    for (const auto& [rank, source] : sources_) ranks.push_back(rank);
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::vector<HeldBackup> out;
  for (int rank : ranks) {
    Source* source = FindSource(rank);
    std::vector<HeldBackup> held;
    bool peek = true;
    if (source != nullptr) {
      MutexLock lock(&source->mu);
      if (source->arena != nullptr) {
        peek = false;
        SlotHeader* slots[2] = {source->arena->slot(0), source->arena->slot(1)};
        held = CompleteSlots(rank, source->arena->geometry(), slots, source->writing);
      }
    }
    if (peek) held = PeekBackupArena(env_, BackupArenaName(options_.job_id, rank), rank);
    out.insert(out.end(), held.begin(), held.end());
  }
  return out;
}

absl::Status BackupHolder::Serve(BackupStream* stream) {
  proto::BackupMessage request;
  if (absl::Status s = ReceiveBackupMessage(stream, &request); !s.ok()) {
    if (absl::IsInvalidArgument(s)) (void)Reply(stream, s);
    return WithContext(s, absl::StrFormat("%s: dropped the connection", name()));
  }
  if (request.has_push()) return ServePush(stream, request.push());
  if (request.has_fetch()) return ServeFetch(stream, request.fetch());
  const absl::Status neither = absl::InvalidArgumentError(absl::StrFormat(
      "%s: %s sent a backup message that is neither a push nor a fetch", name(), stream->peer()));
  (void)Reply(stream, neither);
  return neither;
}

// Checks what every request carries. The status goes back to the client as it is.
absl::Status BackupHolder::CheckRequest(uint32_t version, const std::string& token,
                                        const std::string& job_id, int source_rank,
                                        const std::string& peer) const {
  if (version != kBackupProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: %s speaks backup protocol version %d, this holder %d", name(), peer,
                        version, kBackupProtocolVersion));
  }
  if (!options_.token.empty() && !TokenMatches(options_.token, token)) {
    return absl::PermissionDeniedError(
        absl::StrFormat("%s: %s presented a wrong job token", name(), peer));
  }
  if (job_id != options_.job_id) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s asked about job \"%s\", this holder serves job \"%s\"", name(),
                        peer, absl::CHexEscape(job_id), options_.job_id));
  }
  if (source_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s named source rank %d", name(), peer, source_rank));
  }
  return absl::OkStatus();
}

// The arena of `source` for `geometry`, opened (or created, or replaced when the layout
// changed) now if need be.
absl::Status BackupHolder::EnsureArena(Source* source, int source_rank,
                                       const ArenaGeometry& geometry) {
  if (source->arena != nullptr && source->arena->geometry() == geometry) {
    return absl::OkStatus();
  }
  if (source->arena != nullptr) {
    // Another layout replaces the arena: wait for the fetches of the old one to finish.
    const bool idle = source->mu.AwaitWithTimeout(
        [source]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return source->readers[0] == 0 && source->readers[1] == 0;
        },
        options_.io_timeout);
    if (!idle) {
      return absl::UnavailableError(absl::StrFormat(
          "%s: the backup of source rank %d is being fetched; its arena cannot be replaced", name(),
          source_rank));
    }
    source->arena.reset();  // releases the flock, so that OpenOrCreate can take it
  }
  return OpenArena(source, source_rank, geometry);
}

absl::Status BackupHolder::OpenArena(Source* source, int source_rank,
                                     const ArenaGeometry& geometry) {
  const std::string arena_name = BackupArenaName(options_.job_id, source_rank);
  std::string replaced;
  absl::StatusOr<std::unique_ptr<SnapshotArena>> arena =
      SnapshotArena::OpenOrCreate(env_, arena_name, geometry, &replaced);
  if (!arena.ok()) {
    return WithContext(arena.status(),
                       absl::StrFormat("%s: the backup arena of source rank %d (%s, %d bytes)",
                                       name(), source_rank, arena_name, geometry.segment_bytes()));
  }
  if (!replaced.empty()) {
    Log(absl::StrFormat("replaced the backup arena %s of source rank %d: %s", arena_name,
                        source_rank, replaced));
  }
  for (int i = 0; i < 2; ++i) {
    // We hold the segment's lock: a slot still being written was left by a holder that died.
    SlotHeader* slot = (*arena)->slot(i);
    if (LoadState(slot) == kSlotWriting) StoreState(slot, kSlotEmpty);
  }
  source->arena = *std::move(arena);
  return absl::OkStatus();
}

// The newest complete usable slot, -1 if none.
int BackupHolder::NewestSlot(Source* source) {
  int newest = -1;
  for (int i = 0; i < 2; ++i) {
    SlotHeader* slot = source->arena->slot(i);
    if (i == source->writing || LoadState(slot) != kSlotComplete ||
        !SlotUsable(slot, source->arena->geometry())) {
      continue;
    }
    if (newest < 0 || slot->sequence > source->arena->slot(newest)->sequence) newest = i;
  }
  return newest;
}

absl::Status BackupHolder::ValidatePush(const proto::BackupPush& push, const std::string& peer,
                                        uint64_t* capacity) const {
  const proto::BackupSnapshotHeader& h = push.snapshot();
  const std::string what = absl::StrFormat("%s: the push of source rank %d step %d from %s", name(),
                                           push.source_rank(), h.step(), peer);
  if (h.chunk_bytes() == 0 || h.chunk_bytes() % kArenaAlignment != 0 ||
      h.chunk_bytes() > kMaxBackupPayloadCapacity) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: chunk_bytes %d is not a positive multiple of %d", what,
                        h.chunk_bytes(), kArenaAlignment));
  }
  *capacity = push.payload_capacity() != 0 ? push.payload_capacity()
                                           : AlignUp(h.payload_bytes(), kArenaAlignment);
  if (*capacity > kMaxBackupPayloadCapacity || h.payload_bytes() > *capacity ||
      (*capacity + h.chunk_bytes() - 1) / h.chunk_bytes() > kMaxBackupChunks) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d payload bytes in a slot of %d bytes (chunk %d bytes) do not fit a backup arena "
        "(at most %d bytes, %d chunks)",
        what, h.payload_bytes(), *capacity, h.chunk_bytes(), kMaxBackupPayloadCapacity,
        kMaxBackupChunks));
  }
  const uint64_t chunks = (h.payload_bytes() + h.chunk_bytes() - 1) / h.chunk_bytes();
  if (static_cast<uint64_t>(h.chunk_checksums_size()) != chunks) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d checksums for %d chunks", what, h.chunk_checksums_size(), chunks));
  }
  const uint64_t fingerprint = SnapshotFingerprint(
      h.step(), h.layout_hash(), h.payload_bytes(),
      std::vector<uint64_t>(h.chunk_checksums().begin(), h.chunk_checksums().end()));
  if (fingerprint != h.fingerprint()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: the header's fingerprint %016x is not that of its checksums (%016x)",
                        what, h.fingerprint(), fingerprint));
  }
  return absl::OkStatus();
}

absl::Status BackupHolder::ServePush(BackupStream* stream, const proto::BackupPush& push) {
  const std::string& peer = stream->peer();
  absl::Status checked =
      CheckRequest(push.protocol_version(), push.token(), push.job_id(), push.source_rank(), peer);
  uint64_t capacity = 0;
  if (checked.ok()) checked = ValidatePush(push, peer, &capacity);
  if (!checked.ok()) {
    (void)Reply(stream, checked);
    return checked;
  }
  const proto::BackupSnapshotHeader& h = push.snapshot();
  const int rank = push.source_rank();
  Source* source = GetSource(rank);
  int w = -1;
  {
    MutexLock lock(&source->mu);
    absl::Status ready = BeginPush(source, rank, h, capacity, push.keep_fingerprint(), &w);
    if (!ready.ok() || w < 0) {
      proto::BackupReply reply;
      reply.set_already_held(ready.ok());
      reply.set_fingerprint(h.fingerprint());
      (void)Reply(stream, ready, std::move(reply));
      return ready;
    }
  }
  absl::Status received = Reply(stream, absl::OkStatus());
  if (received.ok()) received = ReceivePayload(stream, source, w, h);
  MutexLock lock(&source->mu);
  SlotHeader* slot = source->arena->slot(w);
  if (!received.ok()) {
    StoreState(slot, kSlotEmpty);
    source->writing = -1;
    const absl::Status status = WithContext(
        received,
        absl::StrFormat("%s: receiving step %d of source rank %d", name(), h.step(), rank));
    if (absl::IsDataLoss(received)) (void)Reply(stream, status);
    return status;
  }
  std::copy(h.chunk_checksums().begin(), h.chunk_checksums().end(), ChunkChecksums(slot));
  std::memcpy(slot->magic, kSlotMagic, sizeof(kSlotMagic));
  slot->format_version = kArenaFormatVersion;
  slot->step = h.step();
  slot->generation = h.generation();
  slot->layout_hash = h.layout_hash();
  slot->payload_bytes = h.payload_bytes();
  slot->chunk_bytes = h.chunk_bytes();
  slot->num_chunks = static_cast<uint64_t>(h.chunk_checksums_size());
  slot->sequence = std::max(source->arena->slot(0)->sequence, source->arena->slot(1)->sequence) + 1;
  // Release: every payload byte and checksum is visible before "complete" is.
  StoreState(slot, kSlotComplete);
  source->writing = -1;
  proto::BackupReply reply;
  reply.set_fingerprint(SlotFingerprint(slot));
  return Reply(stream, absl::OkStatus(), std::move(reply));
}

// Picks the slot a push writes (*w; -1 when the fingerprint is held already) and marks it
// kWriting.
absl::Status BackupHolder::BeginPush(Source* source, int rank, const proto::BackupSnapshotHeader& h,
                                     uint64_t capacity, uint64_t keep_fingerprint, int* w) {
  *w = -1;
  if (source->writing >= 0) {
    return absl::AbortedError(
        absl::StrFormat("%s: a push of source rank %d is already being received", name(), rank));
  }
  const ArenaGeometry geometry = GeometryFor(h.layout_hash(), h.chunk_bytes(), capacity);
  if (absl::Status s = EnsureArena(source, rank, geometry); !s.ok()) return s;
  for (int i = 0; i < 2; ++i) {
    SlotHeader* slot = source->arena->slot(i);
    if (LoadState(slot) == kSlotComplete && SlotUsable(slot, geometry) &&
        SlotFingerprint(slot) == h.fingerprint()) {
      return absl::OkStatus();  // already held
    }
  }
  // The older slot, unless it holds the backup the source keeps (the newest step it knows is
  // committed) and the newer one does not: a commit that stalls for a few saves must not cost the
  // committed step its backup.
  const int newest = NewestSlot(source);
  int target = newest == 0 ? 1 : 0;
  if (keep_fingerprint != 0) {
    for (int i = 0; i < 2; ++i) {
      SlotHeader* slot = source->arena->slot(i);
      if (LoadState(slot) == kSlotComplete && SlotUsable(slot, geometry) &&
          SlotFingerprint(slot) == keep_fingerprint) {
        target = 1 - i;
      }
    }
  }
  const bool free = source->mu.AwaitWithTimeout(
      [source, target]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return source->readers[target] == 0; },
      options_.io_timeout);
  if (!free) {
    return absl::UnavailableError(
        absl::StrFormat("%s: the older backup of source rank %d is still being fetched after %s",
                        name(), rank, absl::FormatDuration(options_.io_timeout)));
  }
  // Unfinished before a byte of it changes: a holder killed from here on leaves it kWriting.
  StoreState(source->arena->slot(target), kSlotWriting);
  source->writing = target;
  *w = target;
  return absl::OkStatus();
}

// Receives the payload straight into slot `w`, verifying each chunk as it lands. A chunk that
// does not match is DataLoss, answered once the whole payload arrived (the client reads the
// holder's answer only after its last byte).
absl::Status BackupHolder::ReceivePayload(BackupStream* stream, Source* source, int w,
                                          const proto::BackupSnapshotHeader& h) {
  char* payload = nullptr;
  {
    MutexLock lock(&source->mu);
    payload = source->arena->payload(w);  // the arena is not replaced while `writing` is set
  }
  return ReceiveVerified(stream, payload, h.payload_bytes(), h.chunk_bytes(),
                         h.chunk_checksums().data(), /*drain=*/true);
}

absl::Status BackupHolder::ServeFetch(BackupStream* stream, const proto::BackupFetch& fetch) {
  const std::string& peer = stream->peer();
  if (absl::Status s = CheckRequest(fetch.protocol_version(), fetch.token(), fetch.job_id(),
                                    fetch.source_rank(), peer);
      !s.ok()) {
    (void)Reply(stream, s);
    return s;
  }
  const int rank = fetch.source_rank();
  Source* source = GetSource(rank);
  int s = -1;
  const char* payload = nullptr;
  proto::BackupReply reply;
  {
    MutexLock lock(&source->mu);
    absl::Status found = FindForFetch(source, fetch, &s);
    if (!found.ok()) {
      (void)Reply(stream, found);
      return absl::OkStatus();  // a miss is an answer, not a fault of this holder
    }
    SlotHeader* slot = source->arena->slot(s);
    uint64_t first = 0, end = slot->num_chunks;
    if (absl::Status asked = ChunksAskedFor(fetch, slot->num_chunks, &first, &end); !asked.ok()) {
      (void)Reply(stream, WithContext(asked, name()));
      return WithContext(asked, name());
    }
    reply.set_first_chunk(first);
    reply.set_end_chunk(end);
    ++source->readers[s];
    payload = source->arena->payload(s);
    proto::BackupSnapshotHeader* h = reply.mutable_snapshot();
    h->set_step(slot->step);
    h->set_generation(slot->generation);
    h->set_layout_hash(slot->layout_hash);
    h->set_payload_bytes(slot->payload_bytes);
    h->set_chunk_bytes(slot->chunk_bytes);
    h->mutable_chunk_checksums()->Add(ChunkChecksums(slot),
                                      ChunkChecksums(slot) + slot->num_chunks);
    h->set_fingerprint(SlotFingerprint(slot));
  }
  absl::Status sent = Reply(stream, absl::OkStatus(), reply);
  const uint64_t chunk = reply.snapshot().chunk_bytes();
  const uint64_t bytes = std::min(reply.end_chunk() * chunk, reply.snapshot().payload_bytes());
  const uint64_t piece = BackupPieceBytes(chunk);
  for (uint64_t at = reply.first_chunk() * chunk; sent.ok() && at < bytes; at += piece) {
    sent = stream->Send(payload + at, std::min(piece, bytes - at));
  }
  MutexLock lock(&source->mu);
  --source->readers[s];
  return WithContext(
      sent, absl::StrFormat("%s: sending step %d of source rank %d", name(), fetch.step(), rank));
}

// The chunks [*first, *end) of `chunks` that `fetch` asks for (proto/backup.proto: a share, a
// range, or all).
absl::Status BackupHolder::ChunksAskedFor(const proto::BackupFetch& fetch, uint64_t chunks,
                                          uint64_t* first, uint64_t* end) {
  *first = 0;
  *end = chunks;
  if (fetch.shares() > 0) {
    if (fetch.share() >= fetch.shares()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("a fetch of source rank %d asked for share %d of %d", fetch.source_rank(),
                          fetch.share(), fetch.shares()));
    }
    *first = chunks * fetch.share() / fetch.shares();
    *end = chunks * (fetch.share() + 1) / fetch.shares();
  } else if (fetch.end_chunk() > 0) {
    if (fetch.first_chunk() > fetch.end_chunk() || fetch.end_chunk() > chunks) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "a fetch of source rank %d asked for chunks [%d, %d) of a backup of %d chunks",
          fetch.source_rank(), fetch.first_chunk(), fetch.end_chunk(), chunks));
    }
    *first = fetch.first_chunk();
    *end = fetch.end_chunk();
  }
  return absl::OkStatus();
}

absl::Status BackupHolder::FindForFetch(Source* source, const proto::BackupFetch& fetch, int* s) {
  const int rank = fetch.source_rank();
  const std::string missing =
      absl::StrFormat("%s has no complete backup of source rank %d step %d fingerprint %016x",
                      name(), rank, fetch.step(), fetch.fingerprint());
  if (source->arena == nullptr) {
    const std::string arena_name = BackupArenaName(options_.job_id, rank);
    absl::StatusOr<std::optional<ArenaGeometry>> geometry = ReadBackupGeometry(env_, arena_name);
    if (!geometry.ok())
      return absl::NotFoundError(absl::StrFormat("%s (%s)", missing, geometry.status().message()));
    if (!geometry->has_value()) return absl::NotFoundError(missing);
    if (absl::Status opened = OpenArena(source, rank, **geometry); !opened.ok()) return opened;
  }
  const int newest = NewestSlot(source);
  for (int i : {newest, 1 - newest}) {
    if (newest < 0 || i == source->writing) continue;
    SlotHeader* slot = source->arena->slot(i);
    if (LoadState(slot) == kSlotComplete && SlotUsable(slot, source->arena->geometry()) &&
        slot->step == fetch.step() &&
        (fetch.fingerprint() == 0 || SlotFingerprint(slot) == fetch.fingerprint())) {
      *s = i;
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(missing);
}

}  // namespace trainguard
