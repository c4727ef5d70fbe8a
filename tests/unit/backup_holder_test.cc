// The holder logic and the client calls over InMemoryBackupTransport: no sockets and no sleeps. A
// push round-trips bit-exact even in 7-byte reads; a byte corrupted in transit is DataLoss naming
// holder, source, step and chunk; a connection dropped mid-payload loses no data of the holder; the
// service's destructor wakes and joins every connection thread; the rate limiter paces a push on a
// ManualClock. The same holder over TCP: backup_service_test.cc.
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/checkpoint/backup_service.h"
#include "sdk/checkpoint/backup_wire.h"
#include "sdk/checkpoint/in_memory_backup_transport.h"
#include "sdk/checkpoint/snapshotter.h"
#include "sdk/proto/backup.pb.h"
#include "tests/support/snapshot_view.h"
#include "trainguard/clock.h"

namespace trainguard {
namespace {

using checkpoint_internal::kBackupProtocolVersion;
using checkpoint_internal::ReceiveBackupMessage;
using checkpoint_internal::SendBackupMessage;
using ::testing::HasSubstr;

constexpr uint64_t kChunk = 64 << 10;
constexpr uint64_t kLayoutHash = 0x1adeb0a7d1ceULL;
constexpr int kSource = 1;
constexpr size_t kBytes = 600000;  // ten chunks, the last one short
// Bounds of the waits below: generous, never reached by a passing test.
constexpr absl::Duration kBound = absl::Seconds(30);
// A push's or a fetch's header is far shorter than this: a stream offset of
// kHeaderRoom + 2 * kChunk + k (k < kChunk - kHeaderRoom) falls in chunk 2 of the payload.
constexpr uint64_t kHeaderRoom = 4096;

std::string Payload(int64_t step, size_t bytes) {
  return testing::SnapshotPayload(step, bytes, 0x2545f4914f6cdd1dULL);
}

Snapshotter::View MakeView(int64_t step, const std::string& payload) {
  return testing::MakeSnapshotView(step, payload, kChunk, kLayoutHash, /*generation=*/2);
}

class InMemoryBackupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    job_ = absl::StrFormat("holdertest-%d-%s", getpid(),
                           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    (void)BackupService::RemoveArenas(job_, {1, 2, 3});
  }
  void TearDown() override { (void)BackupService::RemoveArenas(job_, {1, 2, 3}); }

  std::unique_ptr<BackupService> StartService(absl::Duration io_timeout = absl::Seconds(30)) {
    BackupServiceOptions options;
    options.job_id = job_;
    options.rank = 4;
    options.transport = &transport_;
    options.io_timeout = io_timeout;
    absl::StatusOr<std::unique_ptr<BackupService>> service = BackupService::Start(options);
    EXPECT_TRUE(service.ok()) << service.status();
    return service.ok() ? *std::move(service) : nullptr;
  }

  PushRequest Push(const std::string& holder, const Snapshotter::View* view) {
    PushRequest request;
    request.holder_address = holder;
    request.job_id = job_;
    request.source_rank = kSource;
    request.view = view;
    request.chunk_bytes = kChunk;
    request.payload_capacity = 1 << 20;
    request.deadline = absl::Now() + kBound;
    request.transport = &transport_;
    return request;
  }

  FetchRequest Fetch(const std::string& holder, const Snapshotter::View& view) {
    FetchRequest request;
    request.holder_address = holder;
    request.job_id = job_;
    request.source_rank = kSource;
    request.step = view.info.step;
    request.fingerprint = view.info.fingerprint;
    request.deadline = absl::Now() + kBound;
    request.transport = &transport_;
    return request;
  }

  std::string job_;
  InMemoryBackupTransport transport_;
};

TEST_F(InMemoryBackupTest, PushThenFetchRoundTripsTheBytesInShortReads) {
  std::unique_ptr<BackupService> service = StartService();
  ASSERT_NE(service, nullptr);
  InMemoryStreamFaults faults;
  faults.max_receive_bytes = 7;  // every receive loop must gather its bytes piece by piece
  transport_.set_faults(faults);
  const std::string payload = Payload(7, kBytes);
  const Snapshotter::View view = MakeView(7, payload);

  absl::StatusOr<PushResult> pushed = PushBackup(Push(service->address(), &view));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->bytes_sent, kBytes);
  absl::StatusOr<FetchedBackup> fetched = FetchBackup(Fetch(service->address(), view));
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(fetched->payload == payload);
  EXPECT_EQ(fetched->step, 7);
  EXPECT_EQ(fetched->generation, 2);
  EXPECT_EQ(fetched->chunk_checksums, view.chunk_checksums);

  const std::vector<HeldBackup> held = service->Held();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].step, 7);
  EXPECT_EQ(held[0].fingerprint, view.info.fingerprint);
}

TEST_F(InMemoryBackupTest, APushCorruptedInTransitIsRefusedNamingHolderSourceStepAndChunk) {
  std::unique_ptr<BackupService> service = StartService();
  ASSERT_NE(service, nullptr);
  const std::string p6 = Payload(6, kBytes), p7 = Payload(7, kBytes);
  const Snapshotter::View v6 = MakeView(6, p6), v7 = MakeView(7, p7);
  ASSERT_TRUE(PushBackup(Push(service->address(), &v6)).ok());

  InMemoryStreamFaults faults;
  faults.corrupt_sent_byte = kHeaderRoom + 2 * kChunk + 100;
  transport_.set_faults(faults);
  absl::StatusOr<PushResult> pushed = PushBackup(Push(service->address(), &v7));
  ASSERT_TRUE(absl::IsDataLoss(pushed.status())) << pushed.status();
  const std::string message(pushed.status().message());
  EXPECT_THAT(message, HasSubstr("source rank 1 step 7"));
  EXPECT_THAT(message, HasSubstr(service->address()));
  EXPECT_THAT(message, HasSubstr("backup holder rank 4"));
  EXPECT_THAT(message, HasSubstr("chunk 2 "));

  // The holder kept its older backup and nothing of the corrupt one.
  const std::vector<HeldBackup> held = service->Held();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].fingerprint, v6.info.fingerprint);
  transport_.set_faults({});
  absl::StatusOr<FetchedBackup> fetched = FetchBackup(Fetch(service->address(), v6));
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(fetched->payload == p6);
}

TEST_F(InMemoryBackupTest, AFetchCorruptedInTransitIsDataLossNamingHolderSourceStepAndChunk) {
  std::unique_ptr<BackupService> service = StartService();
  ASSERT_NE(service, nullptr);
  const std::string payload = Payload(7, kBytes);
  const Snapshotter::View view = MakeView(7, payload);
  ASSERT_TRUE(PushBackup(Push(service->address(), &view)).ok());

  InMemoryStreamFaults faults;
  faults.corrupt_received_byte = kHeaderRoom + 2 * kChunk + 100;
  transport_.set_faults(faults);
  absl::StatusOr<FetchedBackup> fetched = FetchBackup(Fetch(service->address(), view));
  ASSERT_TRUE(absl::IsDataLoss(fetched.status())) << fetched.status();
  const std::string message(fetched.status().message());
  EXPECT_THAT(message, HasSubstr("fetch of source rank 1 step 7"));
  EXPECT_THAT(message, HasSubstr(service->address()));
  EXPECT_THAT(message, HasSubstr("chunk 2 "));
}

TEST_F(InMemoryBackupTest, AConnectionDroppedMidPayloadIsUnavailableAndTheHolderKeepsItsOlderCopy) {
  std::unique_ptr<BackupService> service = StartService();
  ASSERT_NE(service, nullptr);
  const std::string p6 = Payload(6, kBytes), p7 = Payload(7, kBytes);
  const Snapshotter::View v6 = MakeView(6, p6), v7 = MakeView(7, p7);
  ASSERT_TRUE(PushBackup(Push(service->address(), &v6)).ok());

  InMemoryStreamFaults faults;
  faults.drop_after_sent_bytes = kBytes / 2;
  transport_.set_faults(faults);
  absl::StatusOr<PushResult> pushed = PushBackup(Push(service->address(), &v7));
  ASSERT_TRUE(absl::IsUnavailable(pushed.status())) << pushed.status();
  EXPECT_THAT(std::string(pushed.status().message()),
              HasSubstr(absl::StrFormat("push of source rank 1 step 7 to backup holder %s",
                                        service->address())));
  EXPECT_THAT(std::string(pushed.status().message()), HasSubstr("connection dropped"));
  // The holder's connection thread has given the half-written slot up once its stream is closed.
  ASSERT_TRUE(transport_.AwaitHolderStreamsClosed(kBound));

  transport_.set_faults({});
  const std::vector<HeldBackup> held = service->Held();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].step, 6);
  EXPECT_EQ(held[0].fingerprint, v6.info.fingerprint);
  absl::StatusOr<FetchedBackup> fetched = FetchBackup(Fetch(service->address(), v6));
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(fetched->payload == p6);
  EXPECT_TRUE(absl::IsNotFound(FetchBackup(Fetch(service->address(), v7)).status()));

  // The dropped push left no slot marked as being written: the next push of step 7 lands.
  absl::StatusOr<PushResult> again = PushBackup(Push(service->address(), &v7));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->already_held);
  ASSERT_EQ(service->Held().size(), 2u);
}

// Protocol version 2: a fetch names the chunks it wants; the reply announces them and only their
// payload bytes follow. A range past the backup's last chunk is refused, naming it.
TEST_F(InMemoryBackupTest,
       AFetchOfAChunkRangeGetsExactlyThoseChunksAndOneBeyondTheBackupIsRefused) {
  std::unique_ptr<BackupService> service = StartService();
  ASSERT_NE(service, nullptr);
  const std::string payload = Payload(7, kBytes);
  const Snapshotter::View view = MakeView(7, payload);
  ASSERT_TRUE(PushBackup(Push(service->address(), &view)).ok());
  const uint64_t chunks = view.chunk_checksums.size();
  ASSERT_GE(chunks, 3u);
  auto ask = [&](uint64_t first, uint64_t end, proto::BackupReply* reply, std::string* bytes) {
    BackupDialOptions dial;
    dial.address = service->address();
    dial.deadline = absl::Now() + kBound;
    absl::StatusOr<std::unique_ptr<BackupStream>> stream = transport_.Dial(dial);
    ASSERT_TRUE(stream.ok()) << stream.status();
    proto::BackupMessage message;
    proto::BackupFetch* fetch = message.mutable_fetch();
    fetch->set_protocol_version(kBackupProtocolVersion);
    fetch->set_job_id(job_);
    fetch->set_source_rank(kSource);
    fetch->set_step(7);
    fetch->set_fingerprint(view.info.fingerprint);
    fetch->set_first_chunk(first);
    fetch->set_end_chunk(end);
    ASSERT_TRUE(SendBackupMessage(stream->get(), message).ok());
    proto::BackupMessage answer;
    ASSERT_TRUE(ReceiveBackupMessage(stream->get(), &answer).ok());
    *reply = answer.reply();
    if (reply->code() != 0) return;
    const uint64_t n = std::min<uint64_t>(end * kChunk, kBytes) - first * kChunk;
    bytes->assign(n, '\0');
    ASSERT_TRUE(checkpoint_internal::ReceiveExactly(stream->get(), bytes->data(), n).ok());
    // Nothing more follows: the holder closes the connection after the range.
    char extra = 0;
    EXPECT_FALSE((*stream)->ReceiveSome(&extra, 1).ok());
  };
  proto::BackupReply reply;
  std::string bytes;
  ASSERT_NO_FATAL_FAILURE(ask(1, chunks, &reply, &bytes));
  ASSERT_EQ(reply.code(), 0) << reply.message();
  EXPECT_EQ(reply.first_chunk(), 1u);
  EXPECT_EQ(reply.end_chunk(), chunks);
  EXPECT_EQ(reply.snapshot().chunk_checksums_size(), static_cast<int>(chunks));  // the whole table
  EXPECT_TRUE(bytes == payload.substr(kChunk));

  ASSERT_NO_FATAL_FAILURE(ask(1, chunks + 1, &reply, &bytes));
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(reply.message(), HasSubstr(absl::StrFormat("chunks [1, %d) of a backup of %d chunks",
                                                         chunks + 1, chunks)));
}

TEST_F(InMemoryBackupTest, TheServicesDestructorWakesAndJoinsEveryConnectionThread) {
  // Connections would wait an hour for their peers: only the shutdown ends them.
  std::unique_ptr<BackupService> service = StartService(absl::Hours(1));
  ASSERT_NE(service, nullptr);
  std::vector<std::unique_ptr<BackupStream>> clients;
  for (int source = 1; source <= 3; ++source) {
    BackupDialOptions dial;
    dial.address = service->address();
    dial.deadline = absl::Now() + kBound;
    absl::StatusOr<std::unique_ptr<BackupStream>> stream = transport_.Dial(dial);
    ASSERT_TRUE(stream.ok()) << stream.status();
    // A push whose header the holder accepts and whose payload never comes: the connection's
    // thread is then inside the holder, receiving.
    proto::BackupMessage message;
    proto::BackupPush* push = message.mutable_push();
    push->set_protocol_version(kBackupProtocolVersion);
    push->set_job_id(job_);
    push->set_source_rank(source);
    const std::string payload = Payload(source, kBytes);
    const Snapshotter::View view = MakeView(5, payload);
    proto::BackupSnapshotHeader* h = push->mutable_snapshot();
    h->set_step(5);
    h->set_layout_hash(kLayoutHash);
    h->set_payload_bytes(kBytes);
    h->set_chunk_bytes(kChunk);
    h->mutable_chunk_checksums()->Add(view.chunk_checksums.begin(), view.chunk_checksums.end());
    h->set_fingerprint(view.info.fingerprint);
    ASSERT_TRUE(SendBackupMessage(stream->get(), message).ok());
    proto::BackupMessage ready;
    ASSERT_TRUE(ReceiveBackupMessage(stream->get(), &ready).ok());
    ASSERT_TRUE(ready.has_reply());
    ASSERT_EQ(ready.reply().code(), 0) << ready.reply().message();
    ASSERT_TRUE((*stream)->Send(payload.data(), 1000).ok());
    clients.push_back(*std::move(stream));
  }
  // One more connection that never says anything.
  BackupDialOptions dial;
  dial.address = service->address();
  absl::StatusOr<std::unique_ptr<BackupStream>> silent = transport_.Dial(dial);
  ASSERT_TRUE(silent.ok()) << silent.status();
  clients.push_back(*std::move(silent));
  EXPECT_EQ(transport_.open_holder_streams(), 4);

  service.reset();
  // Every connection's thread has ended and closed its end.
  EXPECT_EQ(transport_.open_holder_streams(), 0);
  for (const std::unique_ptr<BackupStream>& client : clients) {
    char byte;
    absl::StatusOr<size_t> got = client->ReceiveSome(&byte, 1);
    EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
  }
  // No push completed: the next holder on this host finds no backup.
  std::unique_ptr<BackupService> next = StartService();
  ASSERT_NE(next, nullptr);
  EXPECT_TRUE(next->Held().empty());
}

TEST_F(InMemoryBackupTest, AnAddressWithNoListenerIsUnavailableNamingIt) {
  const std::string payload = Payload(7, kBytes);
  const Snapshotter::View view = MakeView(7, payload);
  absl::StatusOr<PushResult> pushed = PushBackup(Push("127.0.0.1:999", &view));
  ASSERT_TRUE(absl::IsUnavailable(pushed.status())) << pushed.status();
  EXPECT_THAT(std::string(pushed.status().message()),
              HasSubstr("push of source rank 1 step 7 to backup holder 127.0.0.1:999"));
}

// The limiter's decisions inside a push, on a ManualClock: its waits advance the clock exactly.
TEST_F(InMemoryBackupTest, APushIsPacedByTheRateLimiterOnItsClock) {
  std::unique_ptr<BackupService> service = StartService();
  ASSERT_NE(service, nullptr);
  const std::string payload = Payload(7, kBytes);
  const Snapshotter::View view = MakeView(7, payload);
  ManualClock clock;
  BackupRateLimiter limiter(1 << 20, &clock);  // a chunk of 64 KiB every 62.5 ms
  PushRequest request = Push(service->address(), &view);
  request.limiter = &limiter;
  absl::StatusOr<PushResult> pushed = PushBackup(request);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  // Ten pieces: the first goes at once, each of the other nine after the one before it.
  EXPECT_EQ(clock.MonotonicNanos(), absl::ToInt64Nanoseconds(absl::Milliseconds(562.5)));

  // A second push shares the link: its first piece waits for the last one of the first push.
  const std::string p8 = Payload(8, kBytes);
  const Snapshotter::View v8 = MakeView(8, p8);
  request = Push(service->address(), &v8);
  request.limiter = &limiter;
  ASSERT_TRUE(PushBackup(request).ok());
  const int64_t last_piece_ns = (kBytes - 9 * kChunk) * 1'000'000'000 / (1 << 20);
  EXPECT_EQ(clock.MonotonicNanos(),
            absl::ToInt64Nanoseconds(absl::Milliseconds(1125)) + last_piece_ns);
}

// A ManualClock whose every sleep also sets `cancel`: a wait cancelled while it waits.
class CancellingClock final : public Clock {
 public:
  explicit CancellingClock(std::atomic<bool>* cancel) : cancel_(cancel) {}
  absl::Time Now() override { return clock_.Now(); }
  int64_t MonotonicNanos() override { return clock_.MonotonicNanos(); }
  void SleepFor(absl::Duration d) override {
    clock_.SleepFor(d);
    cancel_->store(true);
  }

 private:
  ManualClock clock_;
  std::atomic<bool>* const cancel_;
};

TEST(BackupRateLimiterTest, AReservationWhoseWaitIsCancelledIsStillSpent) {
  std::atomic<bool> cancel{false};
  CancellingClock clock(&cancel);
  BackupRateLimiter limiter(1000, &clock);
  ASSERT_TRUE(limiter.Acquire(1000, absl::InfiniteFuture(), nullptr));  // the link until 1 s
  // Reserves [1 s, 2 s), then gives up in its first sleep.
  EXPECT_FALSE(limiter.Acquire(1000, absl::InfiniteFuture(), &cancel));
  EXPECT_LT(clock.MonotonicNanos(), absl::ToInt64Nanoseconds(absl::Seconds(1)));
  // The next reservation starts where the cancelled one ends.
  EXPECT_TRUE(limiter.Acquire(10, absl::InfiniteFuture(), nullptr));
  EXPECT_EQ(clock.MonotonicNanos(), absl::ToInt64Nanoseconds(absl::Seconds(2)));
}

}  // namespace
}  // namespace trainguard
