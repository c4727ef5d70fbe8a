#include "sdk/checkpoint/backup_client.h"

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "sdk/checkpoint/backup_rate_limiter.h"
#include "sdk/checkpoint/backup_transport.h"
#include "sdk/checkpoint/backup_wire.h"
#include "sdk/checkpoint/tcp_backup_transport.h"
#include "sdk/proto/backup.pb.h"

namespace trainguard {

using checkpoint_internal::BackupPieceBytes;
using checkpoint_internal::CodeFromWire;
using checkpoint_internal::kBackupProtocolVersion;
using checkpoint_internal::kMaxBackupPayloadCapacity;
using checkpoint_internal::ReceiveBackupMessage;
using checkpoint_internal::ReceiveVerified;
using checkpoint_internal::SendBackupMessage;
using checkpoint_internal::WithContext;

namespace {

// After a failed send, how long a client listens for the holder's reason (a DataLoss reply).
constexpr absl::Duration kReasonGrace = absl::Seconds(1);

absl::StatusOr<std::unique_ptr<BackupStream>> Dial(BackupTransport* transport,
                                                   const std::string& holder_address,
                                                   const std::string& source_address,
                                                   absl::Time deadline,
                                                   const std::atomic<bool>* cancel) {
  if (transport == nullptr) transport = TcpBackupTransport::Get();
  BackupDialOptions options;
  options.address = holder_address;
  options.source_address = source_address;
  options.deadline = deadline;
  options.cancel = cancel;
  return transport->Dial(options);
}

absl::Status HolderStatus(const proto::BackupReply& reply, std::string_view what) {
  if (reply.code() == 0) return absl::OkStatus();
  return absl::Status(CodeFromWire(reply.code()),
                      absl::StrFormat("%s: the holder answered: %s", what, reply.message()));
}

absl::StatusOr<proto::BackupReply> ReceiveReply(BackupStream* stream, std::string_view what) {
  proto::BackupMessage message;
  if (absl::Status s = ReceiveBackupMessage(stream, &message); !s.ok()) {
    return WithContext(s, what);
  }
  if (!message.has_reply()) {
    return absl::UnavailableError(
        absl::StrFormat("%s: the holder sent something other than a reply", what));
  }
  return message.reply();
}

// After a failed send: the holder's reason, when it sent one (a chunk that did not verify, a
// full /dev/shm), else `failure`.
absl::Status ReasonOrFailure(BackupStream* stream, const absl::Status& failure,
                             std::string_view what) {
  if (absl::IsCancelled(failure) || absl::IsDeadlineExceeded(failure)) return failure;
  stream->set_deadline(absl::Now() + kReasonGrace);
  absl::StatusOr<proto::BackupReply> reply = ReceiveReply(stream, what);
  if (reply.ok() && reply->code() != 0) return HolderStatus(*reply, what);
  return failure;
}

proto::BackupMessage PushHeader(const PushRequest& request) {
  const Snapshotter::View& view = *request.view;
  proto::BackupMessage message;
  proto::BackupPush* push = message.mutable_push();
  push->set_protocol_version(kBackupProtocolVersion);
  push->set_token(request.token);
  push->set_job_id(request.job_id);
  push->set_source_rank(request.source_rank);
  push->set_payload_capacity(request.payload_capacity);
  proto::BackupSnapshotHeader* h = push->mutable_snapshot();
  h->set_step(view.info.step);
  h->set_generation(view.info.generation);
  h->set_layout_hash(view.info.layout_hash);
  h->set_payload_bytes(view.payload.size());
  h->set_chunk_bytes(request.chunk_bytes);
  h->mutable_chunk_checksums()->Add(view.chunk_checksums.begin(), view.chunk_checksums.end());
  h->set_fingerprint(view.info.fingerprint);
  return message;
}

// Sends the payload of a push the holder accepted, in pieces paced by the request's limiter.
absl::Status SendPayload(BackupStream* stream, const PushRequest& request, std::string_view what,
                         uint64_t* bytes_sent) {
  const uint64_t piece = BackupPieceBytes(request.chunk_bytes);
  const std::string_view payload = request.view->payload;
  for (uint64_t at = 0; at < payload.size(); at += piece) {
    const uint64_t n = std::min<uint64_t>(piece, payload.size() - at);
    if (request.limiter != nullptr &&
        !request.limiter->Acquire(n, request.deadline, request.cancel)) {
      if (request.cancel != nullptr && request.cancel->load()) {
        return absl::CancelledError(
            absl::StrFormat("%s: cancelled after %d of %d bytes", what, at, payload.size()));
      }
      return absl::DeadlineExceededError(absl::StrFormat(
          "%s: the rate limit (%d bytes/s) leaves no time to send the rest before the deadline "
          "(%d of %d bytes sent)",
          what, request.limiter->bytes_per_second(), at, payload.size()));
    }
    if (absl::Status s = stream->Send(payload.data() + at, n); !s.ok()) {
      return ReasonOrFailure(stream, WithContext(s, what), what);
    }
    *bytes_sent += n;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PushResult> PushBackup(const PushRequest& request) {
  const absl::Time started = absl::Now();
  const Snapshotter::View* view = request.view;
  const int64_t step = view != nullptr ? view->info.step : -1;
  const std::string what = absl::StrFormat("push of source rank %d step %d to backup holder %s",
                                           request.source_rank, step, request.holder_address);
  if (view == nullptr || request.chunk_bytes == 0 ||
      view->chunk_checksums.size() !=
          (view->payload.size() + request.chunk_bytes - 1) / request.chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: needs a view whose checksums cover its payload in chunks of chunk_bytes (%d)", what,
        request.chunk_bytes));
  }
  absl::StatusOr<std::unique_ptr<BackupStream>> stream =
      Dial(request.transport, request.holder_address, request.source_address, request.deadline,
           request.cancel);
  if (!stream.ok()) return WithContext(stream.status(), what);
  if (absl::Status s = SendBackupMessage(stream->get(), PushHeader(request)); !s.ok()) {
    return WithContext(s, what);
  }
  absl::StatusOr<proto::BackupReply> ready = ReceiveReply(stream->get(), what);
  if (!ready.ok()) return ready.status();
  if (absl::Status s = HolderStatus(*ready, what); !s.ok()) return s;
  PushResult result;
  if (ready->already_held()) {
    result.already_held = true;
    result.elapsed = absl::Now() - started;
    return result;
  }
  if (absl::Status s = SendPayload(stream->get(), request, what, &result.bytes_sent); !s.ok()) {
    return s;
  }
  absl::StatusOr<proto::BackupReply> done = ReceiveReply(stream->get(), what);
  if (!done.ok()) return done.status();
  if (absl::Status s = HolderStatus(*done, what); !s.ok()) return s;
  if (done->fingerprint() != view->info.fingerprint) {
    return absl::DataLossError(
        absl::StrFormat("%s: the holder acknowledged fingerprint %016x, the snapshot has %016x",
                        what, done->fingerprint(), view->info.fingerprint));
  }
  result.elapsed = absl::Now() - started;
  return result;
}

namespace {

// A fetch whose reply header was read and checked: the payload is next on the stream.
struct OpenedFetch {
  std::unique_ptr<BackupStream> stream;
  FetchedBackup described;  // everything but the payload
  uint64_t payload_bytes = 0;
};

absl::StatusOr<OpenedFetch> OpenFetch(const FetchRequest& request, const std::string& what) {
  absl::StatusOr<std::unique_ptr<BackupStream>> stream =
      Dial(request.transport, request.holder_address, request.source_address, request.deadline,
           request.cancel);
  if (!stream.ok()) return WithContext(stream.status(), what);
  proto::BackupMessage message;
  proto::BackupFetch* fetch = message.mutable_fetch();
  fetch->set_protocol_version(kBackupProtocolVersion);
  fetch->set_token(request.token);
  fetch->set_job_id(request.job_id);
  fetch->set_source_rank(request.source_rank);
  fetch->set_step(request.step);
  fetch->set_fingerprint(request.fingerprint);
  if (absl::Status s = SendBackupMessage(stream->get(), message); !s.ok()) {
    return WithContext(s, what);
  }
  absl::StatusOr<proto::BackupReply> reply = ReceiveReply(stream->get(), what);
  if (!reply.ok()) return reply.status();
  if (absl::Status s = HolderStatus(*reply, what); !s.ok()) return s;

  const proto::BackupSnapshotHeader& h = reply->snapshot();
  const uint64_t chunk = h.chunk_bytes();
  if (h.step() != request.step || chunk == 0 || h.payload_bytes() > kMaxBackupPayloadCapacity ||
      static_cast<uint64_t>(h.chunk_checksums_size()) != (h.payload_bytes() + chunk - 1) / chunk) {
    return absl::DataLossError(absl::StrFormat(
        "%s: the holder described step %d, %d bytes in %d chunks of %d bytes: not the backup "
        "asked for, or an inconsistent one",
        what, h.step(), h.payload_bytes(), h.chunk_checksums_size(), chunk));
  }
  OpenedFetch opened;
  opened.stream = *std::move(stream);
  opened.payload_bytes = h.payload_bytes();
  FetchedBackup& fetched = opened.described;
  fetched.step = h.step();
  fetched.generation = h.generation();
  fetched.layout_hash = h.layout_hash();
  fetched.chunk_bytes = chunk;
  fetched.chunk_checksums.assign(h.chunk_checksums().begin(), h.chunk_checksums().end());
  const uint64_t fingerprint =
      SnapshotFingerprint(h.step(), h.layout_hash(), h.payload_bytes(), fetched.chunk_checksums);
  if (request.fingerprint != 0 && fingerprint != request.fingerprint) {
    return absl::DataLossError(absl::StrFormat(
        "%s: the holder's checksum table has fingerprint %016x, the committed snapshot %016x", what,
        fingerprint, request.fingerprint));
  }
  return opened;
}

// Receives the payload of `opened` into `dst`, checking every chunk as it lands.
absl::Status ReceivePayload(OpenedFetch& opened, char* dst, const std::string& what) {
  absl::Status received =
      ReceiveVerified(opened.stream.get(), dst, opened.payload_bytes, opened.described.chunk_bytes,
                      opened.described.chunk_checksums.data(),
                      /*drain=*/false);
  if (absl::IsDataLoss(received)) {
    return WithContext(received, absl::StrFormat("%s: the holder's copy is corrupt", what));
  }
  return received.ok() ? received : WithContext(received, what);
}

std::string DescribeFetch(const FetchRequest& request) {
  return absl::StrFormat("fetch of source rank %d step %d from backup holder %s",
                         request.source_rank, request.step, request.holder_address);
}

}  // namespace

absl::StatusOr<FetchedBackup> FetchBackup(const FetchRequest& request) {
  const std::string what = DescribeFetch(request);
  absl::StatusOr<OpenedFetch> opened = OpenFetch(request, what);
  if (!opened.ok()) return opened.status();
  std::string payload(opened->payload_bytes, '\0');
  if (absl::Status s = ReceivePayload(*opened, payload.data(), what); !s.ok()) return s;
  FetchedBackup fetched = std::move(opened->described);
  fetched.payload = std::move(payload);
  return fetched;
}

absl::StatusOr<SnapshotInfo> FetchBackupInto(const FetchRequest& request,
                                             Snapshotter* snapshotter) {
  const std::string what = DescribeFetch(request);
  absl::StatusOr<OpenedFetch> opened = OpenFetch(request, what);
  if (!opened.ok()) return opened.status();
  if (opened->described.chunk_bytes != snapshotter->chunk_bytes()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: the backup is in chunks of %d bytes, this rank's arena in chunks of %d", what,
        opened->described.chunk_bytes, snapshotter->chunk_bytes()));
  }
  return snapshotter->InstallWith(opened->described.step, opened->described.generation,
                                  opened->payload_bytes, opened->described.chunk_checksums,
                                  [&](char* dst) { return ReceivePayload(*opened, dst, what); });
}

}  // namespace trainguard
