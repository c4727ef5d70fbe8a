#include "sdk/checkpoint/backup_client.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "sdk/checkpoint/backup_rate_limiter.h"
#include "sdk/checkpoint/backup_transport.h"
#include "sdk/checkpoint/backup_wire.h"
#include "sdk/checkpoint/tcp_backup_transport.h"
#include "sdk/core/mutex.h"
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
  push->set_keep_fingerprint(request.keep_fingerprint);
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

// Which chunks a fetch asks a holder for (proto::BackupFetch).
struct ChunkRequest {
  enum class Kind { kAll, kShare, kRange };
  Kind kind = Kind::kAll;
  uint32_t share = 0;  // kShare: share `share` of `shares` equal parts
  uint32_t shares = 0;
  uint64_t first = 0;  // kRange: chunks [first, end)
  uint64_t end = 0;
};

// A fetch whose reply header was read and checked: the payload of the chunks
// [first_chunk, end_chunk) is next on the stream.
struct OpenedFetch {
  std::unique_ptr<BackupStream> stream;
  FetchedBackup described;  // everything but the payload
  uint64_t payload_bytes = 0;
  uint64_t fingerprint = 0;  // of the holder's header and checksum table
  uint64_t first_chunk = 0;
  uint64_t end_chunk = 0;
};

absl::StatusOr<OpenedFetch> OpenFetch(const FetchRequest& request, const std::string& address,
                                      const ChunkRequest& chunks, const std::string& what,
                                      const std::atomic<bool>* cancel) {
  absl::StatusOr<std::unique_ptr<BackupStream>> stream =
      Dial(request.transport, address, request.source_address, request.deadline, cancel);
  if (!stream.ok()) return WithContext(stream.status(), what);
  proto::BackupMessage message;
  proto::BackupFetch* fetch = message.mutable_fetch();
  fetch->set_protocol_version(kBackupProtocolVersion);
  fetch->set_token(request.token);
  fetch->set_job_id(request.job_id);
  fetch->set_source_rank(request.source_rank);
  fetch->set_step(request.step);
  fetch->set_fingerprint(request.fingerprint);
  if (chunks.kind == ChunkRequest::Kind::kShare) {
    fetch->set_share(chunks.share);
    fetch->set_shares(chunks.shares);
  } else if (chunks.kind == ChunkRequest::Kind::kRange) {
    fetch->set_first_chunk(chunks.first);
    fetch->set_end_chunk(chunks.end);
  }
  if (absl::Status s = SendBackupMessage(stream->get(), message); !s.ok()) {
    return WithContext(s, what);
  }
  absl::StatusOr<proto::BackupReply> reply = ReceiveReply(stream->get(), what);
  if (!reply.ok()) return reply.status();
  if (absl::Status s = HolderStatus(*reply, what); !s.ok()) return s;

  const proto::BackupSnapshotHeader& h = reply->snapshot();
  const uint64_t chunk = h.chunk_bytes();
  const uint64_t n = static_cast<uint64_t>(h.chunk_checksums_size());
  if (h.step() != request.step || chunk == 0 || h.payload_bytes() > kMaxBackupPayloadCapacity ||
      n != (h.payload_bytes() + chunk - 1) / chunk) {
    return absl::DataLossError(absl::StrFormat(
        "%s: the holder described step %d, %d bytes in %d chunks of %d bytes: not the backup "
        "asked for, or an inconsistent one",
        what, h.step(), h.payload_bytes(), h.chunk_checksums_size(), chunk));
  }
  uint64_t first = 0, end = n;
  if (chunks.kind == ChunkRequest::Kind::kShare) {
    first = n * chunks.share / chunks.shares;
    end = n * (chunks.share + 1) / chunks.shares;
  } else if (chunks.kind == ChunkRequest::Kind::kRange) {
    first = chunks.first;
    end = chunks.end;
  }
  if (reply->first_chunk() != first || reply->end_chunk() != end || end > n) {
    return absl::DataLossError(
        absl::StrFormat("%s: asked for chunks [%d, %d) of %d, the holder announced [%d, %d)", what,
                        first, end, n, reply->first_chunk(), reply->end_chunk()));
  }
  OpenedFetch opened;
  opened.stream = *std::move(stream);
  opened.payload_bytes = h.payload_bytes();
  opened.first_chunk = first;
  opened.end_chunk = end;
  FetchedBackup& fetched = opened.described;
  fetched.step = h.step();
  fetched.generation = h.generation();
  fetched.layout_hash = h.layout_hash();
  fetched.chunk_bytes = chunk;
  fetched.chunk_checksums.assign(h.chunk_checksums().begin(), h.chunk_checksums().end());
  opened.fingerprint =
      SnapshotFingerprint(h.step(), h.layout_hash(), h.payload_bytes(), fetched.chunk_checksums);
  if (request.fingerprint != 0 && opened.fingerprint != request.fingerprint) {
    return absl::DataLossError(absl::StrFormat(
        "%s: the holder's checksum table has fingerprint %016x, the committed snapshot %016x", what,
        opened.fingerprint, request.fingerprint));
  }
  return opened;
}

// Receives the chunks `opened` announced into `payload` (the buffer of the whole payload),
// checking every chunk as it lands, and tells `sink` (when there is one) of each. `*verified`:
// the chunks in and verified, also on an error.
absl::Status ReceiveChunks(OpenedFetch& opened, char* payload, const std::string& what,
                           uint64_t* verified, Snapshotter::ChunkSink* sink = nullptr) {
  const uint64_t chunk = opened.described.chunk_bytes;
  const uint64_t begin = opened.first_chunk * chunk;
  const uint64_t end = std::min(opened.end_chunk * chunk, opened.payload_bytes);
  absl::Status received =
      ReceiveVerified(opened.stream.get(), payload + begin, end > begin ? end - begin : 0, chunk,
                      opened.described.chunk_checksums.data() + opened.first_chunk, /*drain=*/false,
                      opened.first_chunk, verified, [sink](uint64_t k) {
                        if (sink != nullptr) sink->Landed(k);
                      });
  if (absl::IsDataLoss(received)) {
    return WithContext(received, absl::StrFormat("%s: the holder's copy is corrupt", what));
  }
  return received.ok() ? received : WithContext(received, what);
}

std::string DescribeFetch(const FetchRequest& request, const std::string& holder_address) {
  return absl::StrFormat("fetch of source rank %d step %d from backup holder %s",
                         request.source_rank, request.step, holder_address);
}

// How often a wait of SpreadFetch looks at the request's cancel flag.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(20);

// One fetch from several holders straight into an arena slot. A thread per holder asks it for its
// share of the chunks; the first reply's header (every holder's must have the same fingerprint)
// sizes the install, and the threads receive into the slot once it is chosen. A holder that fails
// (unreachable, dropped mid-transfer, a chunk that fails its checksum) is not asked again; the
// chunks it had not delivered go to the leftovers, which the holders that finished their share
// fetch over new connections, as they do the share of a holder still being dialled. Every thread
// is stopped (the streams' cancel flag) and joined before the install returns, so none writes into
// the slot after it was installed or emptied.
class SpreadFetch {
 public:
  SpreadFetch(const FetchRequest& request, std::vector<std::string> holders)
      : request_(request), holders_(std::move(holders)) {
    MutexLock lock(&mu_);
    state_.resize(holders_.size());
  }
  ~SpreadFetch() { StopAndJoin(); }
  SpreadFetch(const SpreadFetch&) = delete;
  SpreadFetch& operator=(const SpreadFetch&) = delete;

  // `restore_into`: restored as the chunks land (Snapshotter::InstallAndRestoreWith); nullptr:
  // installed only.
  absl::StatusOr<FetchedFromHolders> Run(Snapshotter* snapshotter, StateRegistry* restore_into);

 private:
  struct Range {
    uint64_t first = 0;
    uint64_t end = 0;
  };
  struct Holder {
    absl::Status status;         // why it stopped serving (OK: it did not)
    uint64_t bytes = 0;          // payload bytes it delivered, verified
    bool share_started = false;  // its share's header came while the share was still its own
    bool share_taken = false;    // its share went to another holder or to the leftovers
  };

  void Work(int i);
  // Receives what `opened` announced from holder i into the slot; on an error the chunks not
  // verified go to the leftovers and holder i is failed. False on an error.
  bool Receive(int i, OpenedFetch& opened, char* dst, Snapshotter::ChunkSink* sink,
               const std::string& what);
  void Fail(int i, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Holder j's share goes to the leftovers, once the payload's size is known, unless it started.
  void ReleaseShare(int j) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A holder whose share nobody has started (still being dialled), or -1.
  int Untouched() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Range ShareOf(int j) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until `condition()` holds or the fetch ends (stopped, cancelled, past its deadline);
  // returns condition().
  template <typename Condition>
  bool Await(Condition condition) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Stop() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopAndJoin();
  // Why the fetch did not complete.
  absl::Status Failure() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const FetchRequest request_;
  const std::vector<std::string> holders_;
  // The streams' cancel flag: set by Stop (the request's cancel, its deadline, the fetch's end).
  std::atomic<bool> stop_flag_{false};
  std::vector<std::thread> threads_;  // started by Run, joined by StopAndJoin

  mutable Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status ended_ ABSL_GUARDED_BY(mu_);  // Cancelled or DeadlineExceeded, when so
  std::vector<Holder> state_ ABSL_GUARDED_BY(mu_);
  std::optional<OpenedFetch> described_ ABSL_GUARDED_BY(mu_);  // the first header (no stream)
  char* dst_ ABSL_GUARDED_BY(mu_) = nullptr;  // the slot's payload, once the install began
  Snapshotter::ChunkSink* sink_ ABSL_GUARDED_BY(mu_) = nullptr;  // with dst_, when restoring
  std::deque<Range> leftovers_ ABSL_GUARDED_BY(mu_);
  uint64_t chunks_done_ ABSL_GUARDED_BY(mu_) = 0;
  int working_ ABSL_GUARDED_BY(mu_) = 0;  // threads that have neither failed nor returned
};

template <typename Condition>
bool SpreadFetch::Await(Condition condition) {
  while (!condition() && !stopped_) {
    if (request_.cancel != nullptr && request_.cancel->load()) {
      ended_ = absl::CancelledError("cancelled");
      Stop();
      break;
    }
    const absl::Time now = absl::Now();
    if (now >= request_.deadline) {
      ended_ = absl::DeadlineExceededError("the deadline passed");
      Stop();
      break;
    }
    mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return condition() || stopped_; },
                         std::min(kCancelPoll, request_.deadline - now));
  }
  return condition();
}

void SpreadFetch::Stop() {
  stopped_ = true;
  stop_flag_.store(true);
}

void SpreadFetch::StopAndJoin() {
  {
    MutexLock lock(&mu_);
    Stop();
  }
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

SpreadFetch::Range SpreadFetch::ShareOf(int j) const {
  const uint64_t n = described_->described.chunk_checksums.size();
  const uint64_t shares = holders_.size();
  return Range{n * j / shares, n * (j + 1) / shares};
}

void SpreadFetch::ReleaseShare(int j) {
  if (!described_.has_value() || state_[j].share_started || state_[j].share_taken) return;
  state_[j].share_taken = true;
  const Range share = ShareOf(j);
  if (share.end > share.first) leftovers_.push_back(share);
}

int SpreadFetch::Untouched() const {
  for (size_t j = 0; j < state_.size(); ++j) {
    if (!state_[j].share_started && !state_[j].share_taken) return static_cast<int>(j);
  }
  return -1;
}

void SpreadFetch::Fail(int i, absl::Status status) {
  // Once the fetch stopped (complete, cancelled, past its deadline), a call the stop cut short is
  // not its holder's fault: the holder is not reported failed for it. What a holder answered (not
  // found, a corrupt chunk, a dropped connection) is reported even when it comes after the stop.
  if (stopped_ && absl::IsCancelled(status)) return;
  if (state_[i].status.ok()) state_[i].status = std::move(status);
  ReleaseShare(i);
}

bool SpreadFetch::Receive(int i, OpenedFetch& opened, char* dst, Snapshotter::ChunkSink* sink,
                          const std::string& what) {
  uint64_t verified = 0;
  absl::Status received = ReceiveChunks(opened, dst, what, &verified, sink);
  MutexLock lock(&mu_);
  const uint64_t chunk = opened.described.chunk_bytes;
  const uint64_t good_end = opened.first_chunk + verified;
  chunks_done_ += verified;
  state_[i].bytes += std::min(good_end * chunk, opened.payload_bytes) -
                     std::min(opened.first_chunk * chunk, opened.payload_bytes);
  if (received.ok()) return true;
  if (good_end < opened.end_chunk) leftovers_.push_back(Range{good_end, opened.end_chunk});
  Fail(i, std::move(received));
  return false;
}

void SpreadFetch::Work(int i) {
  const std::string what = DescribeFetch(request_, holders_[i]);
  absl::Cleanup returned = [this] {
    MutexLock lock(&mu_);
    --working_;
  };
  ChunkRequest share;
  if (holders_.size() > 1) {
    share.kind = ChunkRequest::Kind::kShare;
    share.share = static_cast<uint32_t>(i);
    share.shares = static_cast<uint32_t>(holders_.size());
  }
  absl::StatusOr<OpenedFetch> opened = OpenFetch(request_, holders_[i], share, what, &stop_flag_);
  char* dst = nullptr;
  Snapshotter::ChunkSink* sink = nullptr;
  uint64_t fingerprint = 0;
  uint64_t total = 0;
  {
    MutexLock lock(&mu_);
    if (!opened.ok()) {
      Fail(i, opened.status());
      return;
    }
    if (!described_.has_value()) {
      described_.emplace();
      described_->described = opened->described;
      described_->payload_bytes = opened->payload_bytes;
      described_->fingerprint = opened->fingerprint;
      // Holders that failed before the size was known leave their shares now.
      for (size_t j = 0; j < state_.size(); ++j) {
        if (!state_[j].status.ok()) ReleaseShare(static_cast<int>(j));
      }
    } else if (opened->fingerprint != described_->fingerprint) {
      Fail(i, absl::DataLossError(
                  absl::StrFormat("%s: the holder serves fingerprint %016x, another holder %016x",
                                  what, opened->fingerprint, described_->fingerprint)));
      return;
    }
    fingerprint = described_->fingerprint;
    total = described_->described.chunk_checksums.size();
    if (state_[i].share_taken) {
      opened->stream.reset();  // another holder has its share: this one helps with the rest
    } else {
      state_[i].share_started = true;
    }
    if (!Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return dst_ != nullptr; })) return;
    dst = dst_;
    sink = sink_;
  }
  if (opened->stream != nullptr && !Receive(i, *opened, dst, sink, what)) return;
  opened->stream.reset();
  while (true) {
    Range range;
    {
      MutexLock lock(&mu_);
      if (!Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            return chunks_done_ == total || !leftovers_.empty() || Untouched() >= 0;
          }) ||
          chunks_done_ == total) {
        return;
      }
      if (!leftovers_.empty()) {
        range = leftovers_.front();
        leftovers_.pop_front();
      } else {
        const int j = Untouched();
        state_[j].share_taken = true;
        range = ShareOf(j);
        if (range.end == range.first) continue;
      }
    }
    ChunkRequest ask;
    ask.kind = ChunkRequest::Kind::kRange;
    ask.first = range.first;
    ask.end = range.end;
    absl::StatusOr<OpenedFetch> more = OpenFetch(request_, holders_[i], ask, what, &stop_flag_);
    if (more.ok() && more->fingerprint != fingerprint) {
      more = absl::DataLossError(
          absl::StrFormat("%s: the holder now serves fingerprint %016x, not %016x", what,
                          more->fingerprint, fingerprint));
    }
    if (!more.ok()) {
      MutexLock lock(&mu_);
      leftovers_.push_back(range);
      Fail(i, more.status());
      return;
    }
    if (!Receive(i, *more, dst, sink, what)) return;
  }
}

absl::Status SpreadFetch::Failure() const {
  if (!ended_.ok()) {
    return absl::Status(ended_.code(),
                        absl::StrFormat("fetch of source rank %d step %d: %s", request_.source_rank,
                                        request_.step, ended_.message()));
  }
  std::vector<std::string> why;
  absl::StatusCode code = absl::StatusCode::kNotFound;
  for (const Holder& h : state_) {
    if (h.status.ok()) continue;
    if (holders_.size() == 1) return h.status;  // it names the holder already
    why.push_back(h.status.ToString());
    if (code == absl::StatusCode::kNotFound) code = h.status.code();
  }
  if (why.empty()) {
    return absl::InternalError(absl::StrFormat(
        "fetch of source rank %d step %d: stopped with chunks missing and no holder failed",
        request_.source_rank, request_.step));
  }
  return absl::Status(code, absl::StrFormat("fetch of source rank %d step %d from %d holders: %s",
                                            request_.source_rank, request_.step, holders_.size(),
                                            absl::StrJoin(why, "; ")));
}

absl::StatusOr<FetchedFromHolders> SpreadFetch::Run(Snapshotter* snapshotter,
                                                    StateRegistry* restore_into) {
  if (holders_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("fetch of source rank %d step %d: no holder to fetch from",
                        request_.source_rank, request_.step));
  }
  {
    MutexLock lock(&mu_);
    working_ = static_cast<int>(holders_.size());
  }
  for (size_t i = 0; i < holders_.size(); ++i) {
    try {
      threads_.emplace_back([this, i] { Work(static_cast<int>(i)); });
    } catch (const std::system_error& e) {
      // No thread to be had: this holder is not asked; the others take its share.
      MutexLock lock(&mu_);
      Fail(static_cast<int>(i),
           absl::ResourceExhaustedError(absl::StrFormat(
               "%s: cannot start a thread: %s", DescribeFetch(request_, holders_[i]), e.what())));
      --working_;
    }
  }
  OpenedFetch header;
  absl::Status failure;
  {
    MutexLock lock(&mu_);
    if (Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return described_.has_value() || working_ == 0;
        }) &&
        described_.has_value()) {
      header.described = described_->described;
      header.payload_bytes = described_->payload_bytes;
      header.fingerprint = described_->fingerprint;
    } else {
      failure = Failure();  // no holder described the backup
    }
  }
  if (!failure.ok()) {
    StopAndJoin();
    return failure;
  }
  const FetchedBackup& d = header.described;
  if (d.chunk_bytes != snapshotter->chunk_bytes()) {
    StopAndJoin();
    return absl::FailedPreconditionError(absl::StrFormat(
        "fetch of source rank %d step %d: the backup is in chunks of %d bytes, this rank's arena "
        "in chunks of %d",
        request_.source_rank, request_.step, d.chunk_bytes, snapshotter->chunk_bytes()));
  }
  const uint64_t total = d.chunk_checksums.size();
  auto fill = [&](char* dst, Snapshotter::ChunkSink* sink) -> absl::Status {
    absl::Status result;
    {
      MutexLock lock(&mu_);
      dst_ = dst;
      sink_ = sink;
      const bool complete = Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                              return chunks_done_ == total || working_ == 0;
                            }) &&
                            chunks_done_ == total;
      if (!complete) result = Failure();
    }
    StopAndJoin();  // no thread writes into the slot (or the buffers) from here on
    return result;
  };
  absl::StatusOr<SnapshotInfo> installed =
      restore_into != nullptr
          ? snapshotter->InstallAndRestoreWith(restore_into, d.step, d.generation,
                                               header.payload_bytes, d.chunk_checksums,
                                               header.fingerprint, fill)
          : snapshotter->InstallWith(d.step, d.generation, header.payload_bytes, d.chunk_checksums,
                                     header.fingerprint,
                                     [&](char* dst) { return fill(dst, nullptr); });
  StopAndJoin();
  if (!installed.ok()) return installed.status();
  FetchedFromHolders out;
  out.installed = *installed;
  MutexLock lock(&mu_);
  for (size_t i = 0; i < holders_.size(); ++i) {
    out.holders.push_back(HolderShare{holders_[i], state_[i].bytes, state_[i].status});
  }
  return out;
}

}  // namespace

absl::StatusOr<FetchedBackup> FetchBackup(const FetchRequest& request) {
  const std::string what = DescribeFetch(request, request.holder_address);
  absl::StatusOr<OpenedFetch> opened =
      OpenFetch(request, request.holder_address, ChunkRequest{}, what, request.cancel);
  if (!opened.ok()) return opened.status();
  std::string payload(opened->payload_bytes, '\0');
  uint64_t verified = 0;
  if (absl::Status s = ReceiveChunks(*opened, payload.data(), what, &verified); !s.ok()) return s;
  FetchedBackup fetched = std::move(opened->described);
  fetched.payload = std::move(payload);
  return fetched;
}

absl::StatusOr<FetchedFromHolders> FetchBackupFromHolders(
    const FetchRequest& request, const std::vector<std::string>& holder_addresses,
    Snapshotter* snapshotter, StateRegistry* restore_into) {
  SpreadFetch fetch(request, holder_addresses);
  return fetch.Run(snapshotter, restore_into);
}

absl::StatusOr<SnapshotInfo> FetchBackupInto(const FetchRequest& request,
                                             Snapshotter* snapshotter) {
  absl::StatusOr<FetchedFromHolders> fetched =
      FetchBackupFromHolders(request, {request.holder_address}, snapshotter, nullptr);
  if (!fetched.ok()) return fetched.status();
  return fetched->installed;
}

}  // namespace trainguard
