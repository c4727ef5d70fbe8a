// Peer backups: a holder keeps the last complete backup of each source whatever happens to a push
// (a crash, a corrupt byte, a cancel), and a corrupt copy is never handed back as OK. Real sockets
// on 127.0.0.1; the holder killed mid-push is a real forked process.
#include "sdk/checkpoint/backup_service.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/checkpoint/in_memory_backup_transport.h"
#include "sdk/checkpoint/snapshot_arena.h"
#include "sdk/checkpoint/snapshotter.h"
#include "sdk/checkpoint/tcp_backup_transport.h"
#include "sdk/core/mutex.h"
#include "tests/support/free_port.h"
#include "tests/support/full_shm_env.h"
#include "tests/support/own_process.h"
#include "tests/support/shm_suffix_env.h"
#include "tests/support/snapshot_view.h"
#include "trainguard/checkpoint.h"
#include "trainguard/clock.h"
#include "trainguard/env.h"

namespace trainguard {
namespace {

using checkpoint_internal::ArenaHeader;
using checkpoint_internal::kArenaAlignment;
using checkpoint_internal::kSlotWriting;
using checkpoint_internal::SlotHeader;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::trainguard::testing::SignalOwnProcess;

constexpr uint64_t kChunk = 64 << 10;
constexpr uint64_t kLayoutHash = 0x5eed5eed5eed5eedULL;
constexpr int kSource = 1;
// Bounds of the polls below: generous, never reached by a passing test.
constexpr absl::Duration kPollBound = absl::Seconds(30);
constexpr absl::Duration kPollStep = absl::Milliseconds(5);

// The deterministic payload of a snapshot of `step`.
std::string Payload(int64_t step, size_t bytes) {
  return testing::SnapshotPayload(step, bytes, 0x9e3779b97f4a7c15ULL);
}

Snapshotter::View MakeView(int64_t step, const std::string& payload, uint64_t chunk = kChunk) {
  return testing::MakeSnapshotView(step, payload, chunk, kLayoutHash, /*generation=*/3);
}

// The states of both slots of a backup arena, read from /dev/shm the way another process sees
// them; empty when the segment has no valid header yet.
std::vector<uint32_t> SlotStates(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return {};
  ArenaHeader header{};
  std::vector<uint32_t> states;
  if (pread(fd, &header, sizeof(header), 0) == static_cast<ssize_t>(sizeof(header)) &&
      header.slot_header_bytes != 0) {
    for (int i = 0; i < 2; ++i) {
      SlotHeader slot{};
      const off_t at = static_cast<off_t>(kArenaAlignment + i * header.slot_header_bytes);
      if (pread(fd, &slot, sizeof(slot), at) == static_cast<ssize_t>(sizeof(slot))) {
        states.push_back(slot.state);
      }
    }
  }
  close(fd);
  return states;
}

// Polls (bounded) until a slot of the arena `name` is being written.
bool AwaitSlotWriting(const std::string& name) {
  for (absl::Time end = absl::Now() + kPollBound; absl::Now() < end;) {
    for (uint32_t state : SlotStates(name)) {
      if (state == kSlotWriting) return true;
    }
    absl::SleepFor(kPollStep);
  }
  return false;
}

// Flips one byte of the payload of every complete slot holding `step` in the arena `name`.
bool FlipPayloadByte(const std::string& name, int64_t step, uint64_t offset) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return false;
  struct stat st;
  fstat(fd, &st);
  void* base = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return false;
  auto* bytes = static_cast<char*>(base);
  const auto* header = reinterpret_cast<const ArenaHeader*>(bytes);
  bool flipped = false;
  for (int i = 0; i < 2; ++i) {
    const auto* slot = reinterpret_cast<const SlotHeader*>(bytes + kArenaAlignment +
                                                           i * header->slot_header_bytes);
    if (slot->step != step) continue;
    char* payload =
        bytes + kArenaAlignment + 2 * header->slot_header_bytes + i * header->payload_capacity;
    payload[offset] ^= 0x40;
    flipped = true;
  }
  munmap(base, st.st_size);
  return flipped;
}

class BackupServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    job_ = absl::StrFormat("backuptest-%d-%s", getpid(),
                           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    (void)BackupService::RemoveArenas(job_, {kSource});
  }
  void TearDown() override { (void)BackupService::RemoveArenas(job_, {kSource}); }

  std::unique_ptr<BackupService> StartService(std::string token = "", Env* env = nullptr) {
    BackupServiceOptions options;
    options.job_id = job_;
    options.rank = 5;
    options.token = std::move(token);
    options.env = env;
    absl::StatusOr<std::unique_ptr<BackupService>> service = BackupService::Start(options);
    EXPECT_TRUE(service.ok()) << service.status();
    return service.ok() ? *std::move(service) : nullptr;
  }

  PushRequest Push(const std::string& holder, const Snapshotter::View* view) const {
    PushRequest request;
    request.holder_address = holder;
    request.job_id = job_;
    request.source_rank = kSource;
    request.view = view;
    request.chunk_bytes = kChunk;
    request.payload_capacity = 2 << 20;
    request.deadline = absl::Now() + absl::Seconds(60);
    return request;
  }

  FetchRequest Fetch(const std::string& holder, const Snapshotter::View& view) const {
    FetchRequest request;
    request.holder_address = holder;
    request.job_id = job_;
    request.source_rank = kSource;
    request.step = view.info.step;
    request.fingerprint = view.info.fingerprint;
    request.deadline = absl::Now() + absl::Seconds(60);
    return request;
  }

  std::string arena() const { return BackupService::ArenaName(job_, kSource); }

  std::string job_;
};

TEST_F(BackupServiceTest, PushThenFetchRoundTripsThePayloadBitExact) {
  std::unique_ptr<BackupService> service = StartService();
  ASSERT_NE(service, nullptr);
  const std::string payload = Payload(10, 1000000);  // not a multiple of the chunk size
  const Snapshotter::View view = MakeView(10, payload);

  absl::StatusOr<PushResult> pushed = PushBackup(Push(service->address(), &view));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_FALSE(pushed->already_held);
  EXPECT_EQ(pushed->bytes_sent, payload.size());

  absl::StatusOr<FetchedBackup> fetched = FetchBackup(Fetch(service->address(), view));
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->step, 10);
  EXPECT_EQ(fetched->generation, 3);
  EXPECT_EQ(fetched->layout_hash, kLayoutHash);
  EXPECT_EQ(fetched->chunk_bytes, kChunk);
  EXPECT_TRUE(fetched->payload == payload);
  EXPECT_EQ(fetched->chunk_checksums, view.chunk_checksums);
  EXPECT_EQ(SnapshotFingerprint(fetched->step, fetched->layout_hash, fetched->payload.size(),
                                fetched->chunk_checksums),
            view.info.fingerprint);

  const std::vector<HeldBackup> held = service->Held();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].source_rank, kSource);
  EXPECT_EQ(held[0].step, 10);
  EXPECT_EQ(held[0].fingerprint, view.info.fingerprint);
  EXPECT_EQ(held[0].payload_bytes, payload.size());
}

TEST_F(BackupServiceTest, ASecondPushOfTheSameSnapshotIsAlreadyHeldAndSendsNothing) {
  std::unique_ptr<BackupService> service = StartService();
  ASSERT_NE(service, nullptr);
  const std::string payload = Payload(10, 300000);
  const Snapshotter::View view = MakeView(10, payload);
  ASSERT_TRUE(PushBackup(Push(service->address(), &view)).ok());

  absl::StatusOr<PushResult> again = PushBackup(Push(service->address(), &view));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->already_held);
  EXPECT_EQ(again->bytes_sent, 0u);
}

TEST_F(BackupServiceTest, TwoBackupsAreKeptAndAThirdReplacesTheOlderOne) {
  std::unique_ptr<BackupService> service = StartService();
  ASSERT_NE(service, nullptr);
  const std::string p10 = Payload(10, 500000), p20 = Payload(20, 500000), p30 = Payload(30, 400000);
  const Snapshotter::View v10 = MakeView(10, p10), v20 = MakeView(20, p20), v30 = MakeView(30, p30);
  ASSERT_TRUE(PushBackup(Push(service->address(), &v10)).ok());
  ASSERT_TRUE(PushBackup(Push(service->address(), &v20)).ok());

  absl::StatusOr<FetchedBackup> f10 = FetchBackup(Fetch(service->address(), v10));
  absl::StatusOr<FetchedBackup> f20 = FetchBackup(Fetch(service->address(), v20));
  ASSERT_TRUE(f10.ok()) << f10.status();
  ASSERT_TRUE(f20.ok()) << f20.status();
  EXPECT_TRUE(f10->payload == p10);
  EXPECT_TRUE(f20->payload == p20);

  ASSERT_TRUE(PushBackup(Push(service->address(), &v30)).ok());
  EXPECT_EQ(FetchBackup(Fetch(service->address(), v10)).status().code(),
            absl::StatusCode::kNotFound);
  f20 = FetchBackup(Fetch(service->address(), v20));
  absl::StatusOr<FetchedBackup> f30 = FetchBackup(Fetch(service->address(), v30));
  ASSERT_TRUE(f20.ok()) << f20.status();
  ASSERT_TRUE(f30.ok()) << f30.status();
  EXPECT_TRUE(f20->payload == p20);
  EXPECT_TRUE(f30->payload == p30);

  std::vector<int64_t> steps;
  for (const HeldBackup& held : service->Held()) steps.push_back(held.step);
  EXPECT_THAT(steps, ElementsAre(30, 20));  // newest first
}

// A commit that stalls: step 10 is committed, 20 and 30 wait for theirs. The source names step 10
// as the backup to keep, so 30 replaces 20 (the newer one) and 10 can still be restored.
TEST_F(BackupServiceTest, APushKeepsTheBackupTheSourceNamesAndReplacesTheOther) {
  std::unique_ptr<BackupService> service = StartService();
  ASSERT_NE(service, nullptr);
  const std::string p10 = Payload(10, 500000), p20 = Payload(20, 500000), p30 = Payload(30, 400000);
  const Snapshotter::View v10 = MakeView(10, p10), v20 = MakeView(20, p20), v30 = MakeView(30, p30);
  ASSERT_TRUE(PushBackup(Push(service->address(), &v10)).ok());
  PushRequest keep10 = Push(service->address(), &v20);
  keep10.keep_fingerprint = v10.info.fingerprint;
  ASSERT_TRUE(PushBackup(keep10).ok());
  keep10.view = &v30;
  ASSERT_TRUE(PushBackup(keep10).ok());

  EXPECT_EQ(FetchBackup(Fetch(service->address(), v20)).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<FetchedBackup> f10 = FetchBackup(Fetch(service->address(), v10));
  ASSERT_TRUE(f10.ok()) << f10.status();
  EXPECT_TRUE(f10->payload == p10);
  std::vector<int64_t> steps;
  for (const HeldBackup& held : service->Held()) steps.push_back(held.step);
  EXPECT_THAT(steps, ElementsAre(30, 10));

  // Once 30 is committed the source keeps 30: the next push replaces 10.
  const std::string p40 = Payload(40, 400000);
  const Snapshotter::View v40 = MakeView(40, p40);
  PushRequest keep30 = Push(service->address(), &v40);
  keep30.keep_fingerprint = v30.info.fingerprint;
  ASSERT_TRUE(PushBackup(keep30).ok());
  steps.clear();
  for (const HeldBackup& held : service->Held()) steps.push_back(held.step);
  EXPECT_THAT(steps, ElementsAre(40, 30));
}

TEST_F(BackupServiceTest, AFetchOfAnotherFingerprintIsNotFound) {
  std::unique_ptr<BackupService> service = StartService();
  ASSERT_NE(service, nullptr);
  const std::string payload = Payload(10, 200000);
  const Snapshotter::View view = MakeView(10, payload);
  ASSERT_TRUE(PushBackup(Push(service->address(), &view)).ok());
  FetchRequest request = Fetch(service->address(), view);
  request.fingerprint ^= 1;
  EXPECT_EQ(FetchBackup(request).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(BackupServiceTest, AByteFlippedInTheHoldersMemoryIsDataLossNamingSourceStepAndChunk) {
  std::unique_ptr<BackupService> service = StartService();
  ASSERT_NE(service, nullptr);
  const std::string payload = Payload(10, 1000000);
  const Snapshotter::View view = MakeView(10, payload);
  ASSERT_TRUE(PushBackup(Push(service->address(), &view)).ok());

  ASSERT_TRUE(FlipPayloadByte(arena(), 10, 2 * kChunk + 17));

  absl::StatusOr<FetchedBackup> fetched = FetchBackup(Fetch(service->address(), view));
  ASSERT_FALSE(fetched.ok());
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kDataLoss) << fetched.status();
  EXPECT_THAT(fetched.status().message(), HasSubstr("source rank 1"));
  EXPECT_THAT(fetched.status().message(), HasSubstr("step 10"));
  EXPECT_THAT(fetched.status().message(), HasSubstr("chunk 2 "));
}

TEST_F(BackupServiceTest, APushWhosePayloadDoesNotMatchItsChecksumsIsDataLossAndKeepsTheOldBackup) {
  std::unique_ptr<BackupService> service = StartService();
  ASSERT_NE(service, nullptr);
  const std::string p10 = Payload(10, 400000);
  const Snapshotter::View v10 = MakeView(10, p10);
  ASSERT_TRUE(PushBackup(Push(service->address(), &v10)).ok());

  std::string p20 = Payload(20, 400000);
  const Snapshotter::View v20 = MakeView(20, p20);
  p20[3 * kChunk + 5] ^= 1;  // after the checksums were taken: the bytes sent do not match

  absl::StatusOr<PushResult> pushed = PushBackup(Push(service->address(), &v20));
  ASSERT_FALSE(pushed.ok());
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kDataLoss) << pushed.status();
  EXPECT_THAT(pushed.status().message(), HasSubstr("chunk 3 "));

  std::vector<int64_t> steps;
  for (const HeldBackup& held : service->Held()) steps.push_back(held.step);
  EXPECT_THAT(steps, ElementsAre(10));
  absl::StatusOr<FetchedBackup> f10 = FetchBackup(Fetch(service->address(), v10));
  ASSERT_TRUE(f10.ok()) << f10.status();
  EXPECT_TRUE(f10->payload == p10);
}

// The holder in a child process: it serves until killed, and writes its port to `port_pipe`.
[[noreturn]] void RunHolderChild(const std::string& job, int port_pipe) {
  BackupServiceOptions options;
  options.job_id = job;
  options.rank = 7;
  absl::StatusOr<std::unique_ptr<BackupService>> service = BackupService::Start(options);
  if (!service.ok()) _exit(3);
  const std::string address = (*service)->address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  if (write(port_pipe, &port, sizeof(port)) != sizeof(port)) _exit(4);
  // Bounded: a parent that died without killing this child does not leave it forever.
  absl::SleepFor(absl::Seconds(120));
  _exit(0);
}

TEST_F(BackupServiceTest, AHolderKilledWhileReceivingLeavesThePreviousCompleteBackup) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0) << strerror(errno);
  if (child == 0) {
    close(pipe_fds[0]);
    RunHolderChild(job_, pipe_fds[1]);
  }
  close(pipe_fds[1]);
  ASSERT_TRUE(::trainguard::testing::CheckOwnProcess(child).ok());
  pollfd ready{pipe_fds[0], POLLIN, 0};
  ASSERT_EQ(poll(&ready, 1, static_cast<int>(absl::ToInt64Milliseconds(kPollBound))), 1);
  int port = 0;
  ASSERT_EQ(read(pipe_fds[0], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  close(pipe_fds[0]);
  const std::string holder = absl::StrFormat("127.0.0.1:%d", port);

  const std::string p10 = Payload(10, 1 << 20), p20 = Payload(20, 1 << 20);
  const Snapshotter::View v10 = MakeView(10, p10), v20 = MakeView(20, p20);
  absl::StatusOr<PushResult> first = PushBackup(Push(holder, &v10));
  ASSERT_TRUE(first.ok()) << first.status();

  // Step 20 at 64 KiB/s: 16 s if nothing stopped it.
  BackupRateLimiter slow(kChunk);
  PushRequest request = Push(holder, &v20);
  request.limiter = &slow;
  absl::Status second;
  std::thread pusher([&] { second = PushBackup(request).status(); });
  const bool writing = AwaitSlotWriting(arena());
  EXPECT_TRUE(writing);
  EXPECT_TRUE(SignalOwnProcess(child, SIGKILL).ok());
  int wstatus = 0;
  EXPECT_EQ(waitpid(child, &wstatus, 0), child);
  pusher.join();
  ASSERT_TRUE(writing);
  EXPECT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL);
  EXPECT_EQ(second.code(), absl::StatusCode::kUnavailable) << second;

  // A fresh holder on this host finds what the dead one left: step 10, complete; 20 never.
  std::unique_ptr<BackupService> successor = StartService();
  ASSERT_NE(successor, nullptr);
  std::vector<int64_t> steps;
  for (const HeldBackup& held : successor->Held()) steps.push_back(held.step);
  EXPECT_THAT(steps, ElementsAre(10));
  absl::StatusOr<FetchedBackup> f10 = FetchBackup(Fetch(successor->address(), v10));
  ASSERT_TRUE(f10.ok()) << f10.status();
  EXPECT_TRUE(f10->payload == p10);
  EXPECT_EQ(FetchBackup(Fetch(successor->address(), v20)).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(BackupServiceTest, AWrongTokenIsPermissionDenied) {
  std::unique_ptr<BackupService> service = StartService("the-job-token");
  ASSERT_NE(service, nullptr);
  const std::string payload = Payload(10, 100000);
  const Snapshotter::View view = MakeView(10, payload);
  PushRequest push = Push(service->address(), &view);
  push.token = "not-the-job-token";
  EXPECT_EQ(PushBackup(push).status().code(), absl::StatusCode::kPermissionDenied);
  FetchRequest fetch = Fetch(service->address(), view);
  fetch.token = "";
  EXPECT_EQ(FetchBackup(fetch).status().code(), absl::StatusCode::kPermissionDenied);

  push.token = "the-job-token";
  EXPECT_TRUE(PushBackup(push).ok());
}

TEST_F(BackupServiceTest, ACancelDuringASlowPushIsCancelledAndKeepsNoPartialBackup) {
  std::unique_ptr<BackupService> service = StartService();
  ASSERT_NE(service, nullptr);
  const std::string payload = Payload(10, 1 << 20);
  const Snapshotter::View view = MakeView(10, payload);
  BackupRateLimiter slow(kChunk);  // 16 s for the whole payload
  std::atomic<bool> cancel{false};
  PushRequest request = Push(service->address(), &view);
  request.limiter = &slow;
  request.cancel = &cancel;
  absl::Status status;
  std::thread pusher([&] { status = PushBackup(request).status(); });
  EXPECT_TRUE(AwaitSlotWriting(arena()));
  cancel = true;
  pusher.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  // The holder drops the half-received slot once it notices the connection closed.
  for (absl::Time end = absl::Now() + kPollBound;
       absl::Now() < end && SlotStates(arena()) != std::vector<uint32_t>{0, 0};) {
    absl::SleepFor(kPollStep);
  }
  EXPECT_EQ(SlotStates(arena()), (std::vector<uint32_t>{0, 0}));
  EXPECT_TRUE(service->Held().empty());
}

TEST_F(BackupServiceTest, APushThatCannotFinishByItsDeadlineIsDeadlineExceeded) {
  std::unique_ptr<BackupService> service = StartService();
  ASSERT_NE(service, nullptr);
  const std::string payload = Payload(10, 1 << 20);
  const Snapshotter::View view = MakeView(10, payload);
  BackupRateLimiter slow(kChunk);
  PushRequest request = Push(service->address(), &view);
  request.limiter = &slow;
  request.deadline = absl::Now() + absl::Milliseconds(300);
  EXPECT_EQ(PushBackup(request).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(BackupServiceTest, AnUnreachableHolderIsUnavailable) {
  // A port with no listener (FreeTcpPort).
  const absl::StatusOr<int> port = testing::FreeTcpPort("127.0.0.1");
  ASSERT_TRUE(port.ok()) << port.status();
  const std::string holder = absl::StrFormat("127.0.0.1:%d", *port);

  const std::string payload = Payload(10, 100000);
  const Snapshotter::View view = MakeView(10, payload);
  absl::StatusOr<PushResult> pushed = PushBackup(Push(holder, &view));
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kUnavailable) << pushed.status();
  EXPECT_THAT(pushed.status().message(), HasSubstr(holder));
  EXPECT_EQ(FetchBackup(Fetch(holder, view)).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(BackupServiceTest, AFullDevShmIsResourceExhaustedNamingTheSegmentAndSize) {
  ::trainguard::testing::FullShmEnv full(64 << 10);
  std::unique_ptr<BackupService> service = StartService("", &full);
  ASSERT_NE(service, nullptr);
  const std::string payload = Payload(10, 500000);
  const Snapshotter::View view = MakeView(10, payload);
  absl::StatusOr<PushResult> pushed = PushBackup(Push(service->address(), &view));
  ASSERT_FALSE(pushed.ok());
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kResourceExhausted) << pushed.status();
  EXPECT_THAT(pushed.status().message(), HasSubstr(arena()));
  EXPECT_THAT(pushed.status().message(), HasSubstr("bytes"));
  EXPECT_TRUE(full.left_behind().empty());
}

// Connects to `address` ("127.0.0.1:PORT"), sends `bytes`, and waits (bounded) until the holder
// closes the connection. True when it did.
bool HolderDropsConnectionAfter(const std::string& address, const std::string& bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1))));
  bool dropped = false;
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0 &&
      send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size())) {
    char sink[4096];
    for (absl::Time end = absl::Now() + kPollBound; absl::Now() < end;) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = recv(fd, sink, sizeof(sink), 0);
      if (n <= 0) {
        dropped = true;
        break;
      }
    }
  }
  close(fd);
  return dropped;
}

TEST_F(BackupServiceTest, MalformedInputDropsTheConnectionAndTheServiceServesTheNextClient) {
  std::unique_ptr<BackupService> service = StartService();
  ASSERT_NE(service, nullptr);
  EXPECT_TRUE(HolderDropsConnectionAfter(service->address(), "GET / HTTP/1.1\r\n\r\n"));
  EXPECT_TRUE(HolderDropsConnectionAfter(service->address(), std::string("\xff\xff\xff\x7f", 4)));
  EXPECT_TRUE(HolderDropsConnectionAfter(service->address(),
                                         std::string("\x05\x00\x00\x00\xff\xff\xff\xff\xff", 9)));

  const std::string payload = Payload(10, 300000);
  const Snapshotter::View view = MakeView(10, payload);
  absl::StatusOr<PushResult> pushed = PushBackup(Push(service->address(), &view));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  absl::StatusOr<FetchedBackup> fetched = FetchBackup(Fetch(service->address(), view));
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(fetched->payload == payload);
}

// A rank's registry of one buffer and its arena, as a restoring replacement has them.
struct RankArena {
  std::vector<char> weights;
  StateRegistry registry;
  std::unique_ptr<Snapshotter> snapshotter;
};

std::unique_ptr<RankArena> MakeRankArena(const std::string& job, size_t bytes,
                                         const std::string& buffer_name = "w") {
  auto rank = std::make_unique<RankArena>();
  rank->weights.assign(bytes, 0);
  StateBuffer buffer;
  buffer.name = buffer_name;
  buffer.data = rank->weights.data();
  buffer.bytes = bytes;
  buffer.shape = {static_cast<int64_t>(bytes)};
  EXPECT_TRUE(rank->registry.Register(std::move(buffer)).ok());
  SnapshotterOptions options;
  options.job_id = job;
  options.rank = kSource;
  options.chunk_bytes = kChunk;
  options.copy_threads = 1;
  absl::StatusOr<std::unique_ptr<Snapshotter>> snapshotter =
      Snapshotter::Create(&rank->registry, options);
  EXPECT_TRUE(snapshotter.ok()) << snapshotter.status();
  if (!snapshotter.ok()) return nullptr;
  rank->snapshotter = *std::move(snapshotter);
  return rank;
}

// A snapshot of `step` in `rank`'s arena, every byte of its buffer equal to `step`.
void SnapshotStep(RankArena& rank, int64_t step) {
  std::memset(rank.weights.data(), static_cast<int>(step), rank.weights.size());
  ASSERT_TRUE(rank.snapshotter->Begin(step).ok());
  ASSERT_TRUE(rank.snapshotter->Fence(absl::Seconds(30)).ok());
}

TEST_F(BackupServiceTest, ASnapshottersViewOfAnOlderStepRoundTripsThroughAHolder) {
  std::unique_ptr<RankArena> source = MakeRankArena(job_, 300000);
  ASSERT_NE(source, nullptr);
  for (int64_t step : {10, 20}) SnapshotStep(*source, step);
  Snapshotter* snapshotter = source->snapshotter.get();
  EXPECT_EQ(snapshotter->ViewOf(30).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<Snapshotter::View> view = snapshotter->ViewOf(10);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->info.step, 10);

  std::unique_ptr<BackupService> service = StartService();
  ASSERT_NE(service, nullptr);
  PushRequest push = Push(service->address(), &*view);
  push.payload_capacity = snapshotter->payload_capacity();
  ASSERT_TRUE(PushBackup(push).ok());
  absl::StatusOr<FetchedBackup> fetched = FetchBackup(Fetch(service->address(), *view));
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(fetched->payload == view->payload);
  EXPECT_EQ(fetched->chunk_checksums, view->chunk_checksums);
  source.reset();
  (void)Snapshotter::RemoveArena(job_, kSource);
}

// A source rank whose snapshot of step 10 a holder keeps, and a replacement with the same layout
// and an arena of its own (another host's shared memory), for FetchBackupInto.
class BackupIntoArenaTest : public BackupServiceTest {
 protected:
  void SetUp() override {
    BackupServiceTest::SetUp();
    source_ = MakeRankArena(job_, kBytes);
    restorer_ = MakeRankArena(RestorerJob(), kBytes);
    ASSERT_NE(source_, nullptr);
    ASSERT_NE(restorer_, nullptr);
    SnapshotStep(*source_, 10);
    absl::StatusOr<Snapshotter::View> view = source_->snapshotter->ViewOf(10);
    ASSERT_TRUE(view.ok()) << view.status();
    view_ = *std::move(view);
    service_ = StartService();
    ASSERT_NE(service_, nullptr);
    PushRequest push = Push(service_->address(), &view_);
    push.payload_capacity = source_->snapshotter->payload_capacity();
    ASSERT_TRUE(PushBackup(push).ok());
  }
  void TearDown() override {
    service_.reset();
    source_.reset();
    restorer_.reset();
    (void)Snapshotter::RemoveArena(job_, kSource);
    (void)Snapshotter::RemoveArena(RestorerJob(), kSource);
    BackupServiceTest::TearDown();
  }
  std::string RestorerJob() const { return job_ + "-r"; }
  absl::StatusOr<SnapshotInfo> FetchIntoRestorer() {
    return FetchBackupInto(Fetch(service_->address(), view_), restorer_->snapshotter.get());
  }

  static constexpr size_t kBytes = 300000;
  std::unique_ptr<RankArena> source_, restorer_;
  Snapshotter::View view_;
  std::unique_ptr<BackupService> service_;
};

TEST_F(BackupIntoArenaTest, TheBackupIsInstalledInTheArenaAndRestoresBitExact) {
  absl::StatusOr<SnapshotInfo> installed = FetchIntoRestorer();
  ASSERT_TRUE(installed.ok()) << installed.status();
  EXPECT_EQ(installed->step, 10);
  EXPECT_EQ(installed->fingerprint, view_.info.fingerprint);
  ASSERT_TRUE(restorer_->snapshotter->LatestComplete().has_value());
  EXPECT_EQ(restorer_->snapshotter->LatestComplete()->step, 10);
  absl::StatusOr<SnapshotInfo> restored =
      restorer_->snapshotter->RestoreStep(&restorer_->registry, 10);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(restorer_->weights == source_->weights);
}

TEST_F(BackupIntoArenaTest, ACorruptHolderCopyIsDataLossAndTheArenasSnapshotIsKept) {
  ASSERT_TRUE(FlipPayloadByte(arena(), 10, 2 * kChunk + 17));
  SnapshotStep(*restorer_, 5);  // what the arena held before the fetch
  absl::StatusOr<SnapshotInfo> installed = FetchIntoRestorer();
  ASSERT_FALSE(installed.ok());
  EXPECT_EQ(installed.status().code(), absl::StatusCode::kDataLoss) << installed.status();
  EXPECT_THAT(installed.status().message(), HasSubstr("source rank 1 step 10"));
  EXPECT_THAT(installed.status().message(),
              HasSubstr(absl::StrCat("backup holder ", service_->address())));
  EXPECT_THAT(installed.status().message(), HasSubstr("chunk 2 "));
  ASSERT_TRUE(restorer_->snapshotter->LatestComplete().has_value());
  EXPECT_EQ(restorer_->snapshotter->LatestComplete()->step, 5);
  std::memset(restorer_->weights.data(), 0, kBytes);
  absl::StatusOr<SnapshotInfo> restored = restorer_->snapshotter->RestoreLatest(&restorer_->registry);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 5);
  EXPECT_EQ(restorer_->weights, std::vector<char>(kBytes, 5));
}

// One pass: the fetch checked every chunk as it landed in the slot, so the restore right after
// copies the slot out without hashing it again; any later restore of that slot checks it again.
// Shown with a byte flipped in the restorer's own arena between the fetch and the restores.
TEST_F(BackupIntoArenaTest, TheFirstRestoreAfterTheFetchDoesNotHashItAgainALaterOneDoes) {
  ASSERT_TRUE(FetchIntoRestorer().ok());
  const std::string mine = Snapshotter::ArenaName(RestorerJob(), kSource);
  ASSERT_TRUE(FlipPayloadByte(mine, 10, 100));
  absl::StatusOr<SnapshotInfo> first =
      restorer_->snapshotter->RestoreStep(&restorer_->registry, 10);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_NE(restorer_->weights[100], source_->weights[100]);  // copied as it was: not re-hashed
  absl::StatusOr<SnapshotInfo> again =
      restorer_->snapshotter->RestoreStep(&restorer_->registry, 10);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kDataLoss) << again.status();
  EXPECT_THAT(again.status().message(), HasSubstr("chunk 0 "));
}

// The installed snapshot's fingerprint, with the restorer's own layout, must be the committed
// one: a backup of a registry whose buffer has another name (same size, so the bytes would fit)
// is refused before a byte is received, and the arena keeps what it had.
TEST_F(BackupIntoArenaTest, ABackupOfAnotherLayoutIsNotInstalled) {
  std::unique_ptr<RankArena> other = MakeRankArena(job_ + "-o", kBytes, "other");
  ASSERT_NE(other, nullptr);
  SnapshotStep(*other, 5);
  absl::StatusOr<SnapshotInfo> installed =
      FetchBackupInto(Fetch(service_->address(), view_), other->snapshotter.get());
  EXPECT_EQ(installed.status().code(), absl::StatusCode::kFailedPrecondition) << installed.status();
  EXPECT_THAT(installed.status().message(), HasSubstr("another layout"));
  ASSERT_TRUE(other->snapshotter->LatestComplete().has_value());
  EXPECT_EQ(other->snapshotter->LatestComplete()->step, 5);
  other.reset();
  (void)Snapshotter::RemoveArena(job_ + "-o", kSource);
}

// Two holders of rank 1's backup of step 10 in this process (the second's arenas under other
// shared-memory names, as on another host) and a replacement with an arena of its own, for
// FetchBackupFromHolders. The source's buffer holds distinct bytes at every offset, so that a
// chunk landing at the wrong place would show.
class BackupFromTwoHoldersTest : public BackupServiceTest {
 protected:
  void SetUp() override {
    BackupServiceTest::SetUp();
    source_ = MakeRankArena(job_, kBytes);
    restorer_ = MakeRankArena(RestorerJob(), kBytes);
    ASSERT_NE(source_, nullptr);
    ASSERT_NE(restorer_, nullptr);
    const std::string bytes = Payload(10, kBytes);
    std::memcpy(source_->weights.data(), bytes.data(), kBytes);
    ASSERT_TRUE(source_->snapshotter->Begin(10).ok());
    ASSERT_TRUE(source_->snapshotter->Fence(absl::Seconds(30)).ok());
    absl::StatusOr<Snapshotter::View> view = source_->snapshotter->ViewOf(10);
    ASSERT_TRUE(view.ok()) << view.status();
    view_ = *std::move(view);
    chunks_ = view_.chunk_checksums.size();
    ASSERT_GE(chunks_, 8u);
  }
  void TearDown() override {
    for (auto& service : services_) service.reset();
    source_.reset();
    restorer_.reset();
    (void)BackupService::RemoveArenas(job_, {kSource}, &other_host_);
    (void)Snapshotter::RemoveArena(job_, kSource);
    (void)Snapshotter::RemoveArena(RestorerJob(), kSource);
    BackupServiceTest::TearDown();
  }
  std::string RestorerJob() const { return job_ + "-r"; }

  // Starts both holders on `transport` (nullptr: TCP) and pushes the backup to each.
  void StartHolders(BackupTransport* transport = nullptr) {
    transport_ = transport;
    for (int h = 0; h < 2; ++h) {
      BackupServiceOptions options;
      options.job_id = job_;
      options.rank = 5 + h;
      options.env = h == 0 ? nullptr : &other_host_;
      options.transport = transport;
      absl::StatusOr<std::unique_ptr<BackupService>> service = BackupService::Start(options);
      ASSERT_TRUE(service.ok()) << service.status();
      services_[h] = *std::move(service);
      PushRequest push = Push(services_[h]->address(), &view_);
      push.payload_capacity = source_->snapshotter->payload_capacity();
      push.transport = transport;
      absl::StatusOr<PushResult> pushed = PushBackup(push);
      ASSERT_TRUE(pushed.ok()) << pushed.status();
    }
  }
  std::vector<std::string> Holders() const {
    return {services_[0]->address(), services_[1]->address()};
  }
  absl::StatusOr<FetchedFromHolders> FetchFromBoth() {
    FetchRequest request = Fetch("", view_);
    request.transport = transport_;
    return FetchBackupFromHolders(request, Holders(), restorer_->snapshotter.get());
  }
  // As FetchFromBoth, restoring the restorer's buffers (zeroed first) as the chunks land.
  absl::StatusOr<FetchedFromHolders> FetchAndRestoreFromBoth() {
    std::memset(restorer_->weights.data(), 0, kBytes);
    FetchRequest request = Fetch("", view_);
    request.transport = transport_;
    return FetchBackupFromHolders(request, Holders(), restorer_->snapshotter.get(),
                                  &restorer_->registry);
  }
  // The restorer's buffers, restored as the chunks landed, equal the source's (no RestoreStep).
  void ExpectRestoredAsItLanded(const FetchedFromHolders& fetched) {
    EXPECT_EQ(fetched.installed.fingerprint, view_.info.fingerprint);
    EXPECT_TRUE(restorer_->weights == source_->weights);
  }
  // The restorer's buffers restored from what the fetch installed equal the source's.
  void ExpectRestoredBitExact() {
    std::memset(restorer_->weights.data(), 0, kBytes);
    absl::StatusOr<SnapshotInfo> restored =
        restorer_->snapshotter->RestoreStep(&restorer_->registry, 10);
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(restored->fingerprint, view_.info.fingerprint);
    EXPECT_TRUE(restorer_->weights == source_->weights);
  }

  static constexpr size_t kBytes = 1 << 20;  // 17 chunks of 64 KiB with the blob area
  testing::ShmSuffixEnv other_host_{".other-host"};
  BackupTransport* transport_ = nullptr;
  std::unique_ptr<BackupService> services_[2];
  std::unique_ptr<RankArena> source_, restorer_;
  Snapshotter::View view_;
  uint64_t chunks_ = 0;
};

// Which holder serves which chunks is not fixed: a holder that finished its share takes the share
// of one still being dialled (SpreadFetch), so on a busy machine one holder may serve every chunk.
// These tests assert what holds whichever way the threads ran: every chunk delivered once and
// verified, the install exact, and a failing holder's error naming it and where it failed.
uint64_t DeliveredBytes(const FetchedFromHolders& fetched) {
  uint64_t bytes = 0;
  for (const HolderShare& h : fetched.holders) bytes += h.bytes;
  return bytes;
}

TEST_F(BackupFromTwoHoldersTest, TwoHoldersDeliverEveryChunkOnceBetweenThemAndTheRestoreIsBitExact) {
  ASSERT_NO_FATAL_FAILURE(StartHolders());
  absl::StatusOr<FetchedFromHolders> fetched = FetchFromBoth();
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->installed.fingerprint, view_.info.fingerprint);
  ASSERT_EQ(fetched->holders.size(), 2u);
  for (const HolderShare& h : fetched->holders) {
    EXPECT_TRUE(h.status.ok()) << h.status;
    // Whole shares: share 0 is chunks [0, n/2), share 1 the rest (the last chunk short).
    const uint64_t half = chunks_ / 2;
    EXPECT_THAT(h.bytes, ::testing::AnyOf(0u, half * kChunk, view_.payload.size() - half * kChunk,
                                          view_.payload.size()));
  }
  EXPECT_EQ(DeliveredBytes(*fetched), view_.payload.size());
  ExpectRestoredBitExact();
}

TEST_F(BackupFromTwoHoldersTest, AChunkCorruptedInOneHoldersMemoryIsFetchedFromTheOther) {
  ASSERT_NO_FATAL_FAILURE(StartHolders());
  // Chunk 1, in holder 0's share, flipped in holder 0's memory only.
  ASSERT_TRUE(FlipPayloadByte(arena(), 10, kChunk + 5));
  absl::StatusOr<FetchedFromHolders> fetched = FetchAndRestoreFromBoth();
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(fetched->holders[1].status.ok()) << fetched->holders[1].status;
  const HolderShare& bad = fetched->holders[0];
  if (!bad.status.ok()) {  // it served its share (else holder 1 took it before it started)
    EXPECT_EQ(bad.status.code(), absl::StatusCode::kDataLoss) << bad.status;
    EXPECT_THAT(bad.status.message(), HasSubstr(absl::StrCat("source rank 1 step 10 from backup "
                                                             "holder ",
                                                             services_[0]->address())));
    EXPECT_THAT(bad.status.message(), HasSubstr("chunk 1 "));
    EXPECT_EQ(bad.bytes, kChunk);  // chunk 0 only
  }
  EXPECT_EQ(DeliveredBytes(*fetched), view_.payload.size());
  ExpectRestoredAsItLanded(*fetched);  // the flipped byte never reached the buffers
}

// A holder that dies in the middle of its share (its connection dropped after a chunk and a half
// of payload, on the in-memory transport): the chunk it had verified stays, the rest of its share
// comes from the other holder, and the install (and the buffers, restored as it landed) is
// complete and exact.
TEST_F(BackupFromTwoHoldersTest, AHolderDroppedMidTransferLeavesItsRemainingChunksToTheOther) {
  InMemoryBackupTransport transport(64 << 10);
  ASSERT_NO_FATAL_FAILURE(StartHolders(&transport));
  InMemoryStreamFaults drop;
  // The reply (a header and 8 bytes a chunk of checksums) is well under 4 KiB.
  drop.drop_after_received_bytes = 4096 + kChunk + kChunk / 2;
  transport.set_faults_to(services_[0]->address(), drop);
  absl::StatusOr<FetchedFromHolders> fetched = FetchAndRestoreFromBoth();
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(fetched->holders[1].status.ok()) << fetched->holders[1].status;
  const HolderShare& dropped = fetched->holders[0];
  if (!dropped.status.ok()) {  // it served its share (else holder 1 took it before it started)
    EXPECT_EQ(dropped.status.code(), absl::StatusCode::kUnavailable) << dropped.status;
    EXPECT_THAT(dropped.status.message(), HasSubstr(services_[0]->address()));
    EXPECT_EQ(dropped.bytes, kChunk);
  }
  EXPECT_EQ(DeliveredBytes(*fetched), view_.payload.size());
  ExpectRestoredAsItLanded(*fetched);
}

// TCP for a holder in a child process whose sends stop for good once a stream has sent
// `stall_after` bytes: it writes one byte to `stalled_pipe` and waits there to be killed, so the
// holder dies in the middle of its share, with a known prefix of it delivered.
class StallingTransport : public BackupTransport {
 public:
  StallingTransport(size_t stall_after, int stalled_pipe)
      : stall_after_(stall_after), stalled_pipe_(stalled_pipe) {}
  absl::StatusOr<std::unique_ptr<BackupListener>> Listen(
      const BackupListenOptions& options) override {
    absl::StatusOr<std::unique_ptr<BackupListener>> inner =
        TcpBackupTransport::Get()->Listen(options);
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<BackupListener>(new Listener(*std::move(inner), this));
  }
  absl::StatusOr<std::unique_ptr<BackupStream>> Dial(const BackupDialOptions& options) override {
    return TcpBackupTransport::Get()->Dial(options);
  }

 private:
  class Stream : public BackupStream {
   public:
    Stream(std::unique_ptr<BackupStream> inner, StallingTransport* t)
        : inner_(std::move(inner)), t_(t) {}
    const std::string& peer() const override { return inner_->peer(); }
    absl::Status Send(const char* data, size_t n) override {
      const size_t room = t_->stall_after_ - std::min(sent_, t_->stall_after_);
      if (n <= room) {
        sent_ += n;
        return inner_->Send(data, n);
      }
      if (absl::Status s = inner_->Send(data, room); !s.ok()) return s;
      sent_ += room;
      const char byte = 1;
      (void)!write(t_->stalled_pipe_, &byte, 1);
      // Bounded: a parent that died without killing this child does not leave it forever.
      absl::SleepFor(absl::Seconds(120));
      _exit(0);
    }
    absl::StatusOr<size_t> ReceiveSome(char* data, size_t max) override {
      return inner_->ReceiveSome(data, max);
    }
    void set_deadline(absl::Time deadline) override { inner_->set_deadline(deadline); }

   private:
    std::unique_ptr<BackupStream> inner_;
    StallingTransport* t_;
    size_t sent_ = 0;
  };
  class Listener : public BackupListener {
   public:
    Listener(std::unique_ptr<BackupListener> inner, StallingTransport* t)
        : inner_(std::move(inner)), t_(t) {}
    std::string address() const override { return inner_->address(); }
    absl::StatusOr<std::unique_ptr<BackupStream>> Accept(absl::Time deadline) override {
      absl::StatusOr<std::unique_ptr<BackupStream>> s = inner_->Accept(deadline);
      if (!s.ok()) return s.status();
      return std::unique_ptr<BackupStream>(new Stream(*std::move(s), t_));
    }
    void Shutdown() override { inner_->Shutdown(); }

   private:
    std::unique_ptr<BackupListener> inner_;
    StallingTransport* t_;
  };

  const size_t stall_after_;
  const int stalled_pipe_;
};

// Holder 0 of AHolderProcessKilledMidShare... below, in a process of its own: serves job `job`'s
// backup that the killed service left in this machine's shared memory, over a StallingTransport,
// writes its port to `port_fd` and never returns.
[[noreturn]] void ServeAsStallingHolder(const std::string& job, int port_fd, int stalled_fd) {
  // The reply (a header and 8 bytes a chunk of checksums) is well under 4 KiB.
  StallingTransport transport(4096 + kChunk + kChunk / 2, stalled_fd);
  BackupServiceOptions options;
  options.job_id = job;
  options.rank = 5;
  options.transport = &transport;
  absl::StatusOr<std::unique_ptr<BackupService>> service = BackupService::Start(options);
  if (!service.ok()) _exit(3);
  const std::string address = (*service)->address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  if (write(port_fd, &port, sizeof(port)) != sizeof(port)) _exit(4);
  absl::SleepFor(absl::Seconds(120));  // bounded: a parent that died without killing it
  _exit(0);
}

// That process is this binary executed afresh, told by kHolderEnv what to serve: a fork of the
// multi-threaded test may not start threads of its own (a lock a vanished thread held stays held;
// ThreadSanitizer refuses it). This runs before main() and never returns in that process.
constexpr char kHolderEnv[] = "TG_BACKUP_TEST_HOLDER";
[[maybe_unused]] const bool kIsHolderProcess = [] {
  const char* spec = getenv(kHolderEnv);
  if (spec == nullptr) return false;
  char job[256];
  int port_fd = -1, stalled_fd = -1;
  if (sscanf(spec, "%255s %d %d", job, &port_fd, &stalled_fd) != 3) _exit(6);
  ServeAsStallingHolder(job, port_fd, stalled_fd);
}();

// TCP whose dial to `gated` waits until Open() (bounded): the fetch reaches the other holder only
// once the test let it, so no holder finishes early and takes another's share. The streams to the
// other holders say when a receive of theirs failed (AwaitUngatedReceiveFailed): the fetch's thread
// for that holder then holds its share and posts what is left of it, whoever is dialled next.
class GatedDialTransport : public BackupTransport {
 public:
  explicit GatedDialTransport(std::string gated) : gated_(std::move(gated)) {}
  void Open() { open_.Notify(); }
  bool AwaitUngatedReceiveFailed() {
    return receive_failed_.WaitForNotificationWithTimeout(kPollBound);
  }
  absl::StatusOr<std::unique_ptr<BackupListener>> Listen(
      const BackupListenOptions& options) override {
    return TcpBackupTransport::Get()->Listen(options);
  }
  absl::StatusOr<std::unique_ptr<BackupStream>> Dial(const BackupDialOptions& options) override {
    if (options.address == gated_) {
      (void)open_.WaitForNotificationWithTimeout(kPollBound);
      return TcpBackupTransport::Get()->Dial(options);
    }
    absl::StatusOr<std::unique_ptr<BackupStream>> inner = TcpBackupTransport::Get()->Dial(options);
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<BackupStream>(new WatchedStream(*std::move(inner), &receive_failed_));
  }

 private:
  class WatchedStream : public BackupStream {
   public:
    WatchedStream(std::unique_ptr<BackupStream> inner, Notification* failed)
        : inner_(std::move(inner)), failed_(failed) {}
    const std::string& peer() const override { return inner_->peer(); }
    absl::Status Send(const char* data, size_t n) override { return inner_->Send(data, n); }
    absl::StatusOr<size_t> ReceiveSome(char* data, size_t max) override {
      absl::StatusOr<size_t> n = inner_->ReceiveSome(data, max);
      if (!n.ok()) failed_->Notify();
      return n;
    }
    void set_deadline(absl::Time deadline) override { inner_->set_deadline(deadline); }

   private:
    const std::unique_ptr<BackupStream> inner_;
    Notification* const failed_;
  };

  const std::string gated_;
  Notification open_;
  Notification receive_failed_;  // notified by every failed receive (Notify may repeat)
};

// Holder 0 as a real process on TCP, SIGKILLed after it sent its reply, chunk 0 of its share and
// half of chunk 1 (the other holder is dialled only once the fetch's receive from it failed): the
// verified chunk stays, the rest of its share comes from the other holder, and the install is
// complete and exact.
TEST_F(BackupFromTwoHoldersTest, AHolderProcessKilledMidShareLeavesItsRemainingChunksToTheOther) {
  ASSERT_NO_FATAL_FAILURE(StartHolders());
  const std::string in_process_holder = services_[1]->address();
  services_[0].reset();  // its place taken by the child below, on this "host"'s shared memory
  int port_pipe[2], stalled_pipe[2];
  ASSERT_EQ(pipe(port_pipe), 0);
  ASSERT_EQ(pipe(stalled_pipe), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0) << strerror(errno);
  if (child == 0) {
    close(port_pipe[0]);
    close(stalled_pipe[0]);
    const std::string spec = absl::StrFormat("%s %d %d", job_, port_pipe[1], stalled_pipe[1]);
    setenv(kHolderEnv, spec.c_str(), 1);
    char* const argv[] = {const_cast<char*>("backup_service_test"), nullptr};
    execv("/proc/self/exe", argv);
    _exit(5);
  }
  close(port_pipe[1]);
  close(stalled_pipe[1]);
  ASSERT_TRUE(::trainguard::testing::CheckOwnProcess(child).ok());
  pollfd ready{port_pipe[0], POLLIN, 0};
  ASSERT_EQ(poll(&ready, 1, static_cast<int>(absl::ToInt64Milliseconds(kPollBound))), 1);
  int port = 0;
  ASSERT_EQ(read(port_pipe[0], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  close(port_pipe[0]);
  const std::string child_holder = absl::StrFormat("127.0.0.1:%d", port);
  // The child serves the backup the killed service left in this host's shared memory.

  std::memset(restorer_->weights.data(), 0, kBytes);
  absl::StatusOr<FetchedFromHolders> fetched;
  GatedDialTransport gate(in_process_holder);
  std::thread fetcher([&] {
    FetchRequest request = Fetch("", view_);
    request.transport = &gate;
    fetched = FetchBackupFromHolders(request, {child_holder, in_process_holder},
                                     restorer_->snapshotter.get(), &restorer_->registry);
  });
  pollfd stalled{stalled_pipe[0], POLLIN, 0};
  const bool mid_share =
      poll(&stalled, 1, static_cast<int>(absl::ToInt64Milliseconds(kPollBound))) == 1;
  EXPECT_TRUE(mid_share);
  EXPECT_TRUE(SignalOwnProcess(child, SIGKILL).ok());
  int wstatus = 0;
  EXPECT_EQ(waitpid(child, &wstatus, 0), child);
  EXPECT_TRUE(gate.AwaitUngatedReceiveFailed());
  gate.Open();
  fetcher.join();
  close(stalled_pipe[0]);
  ASSERT_TRUE(mid_share);
  EXPECT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  const HolderShare& killed = fetched->holders[0];
  EXPECT_EQ(killed.status.code(), absl::StatusCode::kUnavailable) << killed.status;
  EXPECT_THAT(killed.status.message(), HasSubstr(child_holder));
  EXPECT_EQ(killed.bytes, kChunk);
  EXPECT_EQ(fetched->holders[1].bytes, view_.payload.size() - kChunk);
  EXPECT_TRUE(fetched->holders[1].status.ok()) << fetched->holders[1].status;
  ExpectRestoredAsItLanded(*fetched);
}

// A holder without the backup (a replacement host that has not received it yet) answers NotFound
// at once: its share comes from the other holder. On a busy machine the other may deliver every
// chunk before that answer comes: the fetch then stops the first holder's call, which is no failure
// of that holder (its status OK, no bytes).
TEST_F(BackupFromTwoHoldersTest, AHolderWithoutTheBackupLeavesItsShareToTheOther) {
  ASSERT_NO_FATAL_FAILURE(StartHolders());
  services_[0].reset();
  ASSERT_TRUE(BackupService::RemoveArenas(job_, {kSource}).ok());
  BackupServiceOptions options;
  options.job_id = job_;
  options.rank = 5;
  absl::StatusOr<std::unique_ptr<BackupService>> empty = BackupService::Start(options);
  ASSERT_TRUE(empty.ok()) << empty.status();
  services_[0] = *std::move(empty);
  absl::StatusOr<FetchedFromHolders> fetched = FetchFromBoth();
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  if (!fetched->holders[0].status.ok()) {
    EXPECT_EQ(fetched->holders[0].status.code(), absl::StatusCode::kNotFound)
        << fetched->holders[0].status;
  }
  EXPECT_EQ(fetched->holders[0].bytes, 0u);
  EXPECT_EQ(fetched->holders[1].bytes, view_.payload.size());
  ExpectRestoredBitExact();
}

// Each holder's copy corrupt in its own share: no chunk source is left for either, nothing is
// installed (the arena keeps its snapshot of step 5), and the error names both holders.
TEST_F(BackupFromTwoHoldersTest, WhenNoHolderCanDeliverAChunkNothingIsInstalledAndBothAreNamed) {
  ASSERT_NO_FATAL_FAILURE(StartHolders());
  ASSERT_TRUE(FlipPayloadByte(arena(), 10, kChunk + 5));
  ASSERT_TRUE(FlipPayloadByte(other_host_.Real(arena()), 10, (chunks_ - 2) * kChunk));
  SnapshotStep(*restorer_, 5);
  absl::StatusOr<FetchedFromHolders> fetched = FetchFromBoth();
  ASSERT_FALSE(fetched.ok());
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kDataLoss) << fetched.status();
  EXPECT_THAT(fetched.status().message(), HasSubstr(services_[0]->address()));
  EXPECT_THAT(fetched.status().message(), HasSubstr(services_[1]->address()));
  ASSERT_TRUE(restorer_->snapshotter->LatestComplete().has_value());
  EXPECT_EQ(restorer_->snapshotter->LatestComplete()->step, 5);
  EXPECT_EQ(restorer_->snapshotter->CompleteSnapshots().size(), 1u);
}

// The rate limiter's arithmetic, on a ManualClock: its waits advance the clock exactly.
TEST(BackupRateLimiterTest, PacesChunksAtTheRateOnTheClock) {
  ManualClock clock;
  BackupRateLimiter limiter(1000, &clock);
  const absl::Time forever = absl::InfiniteFuture();
  EXPECT_TRUE(limiter.Acquire(1000, forever, nullptr));  // the first chunk goes at once
  EXPECT_EQ(clock.MonotonicNanos(), 0);
  EXPECT_TRUE(limiter.Acquire(1000, forever, nullptr));
  EXPECT_EQ(clock.MonotonicNanos(), absl::ToInt64Nanoseconds(absl::Seconds(1)));
  EXPECT_TRUE(limiter.Acquire(500, forever, nullptr));
  EXPECT_EQ(clock.MonotonicNanos(), absl::ToInt64Nanoseconds(absl::Seconds(2)));
  EXPECT_TRUE(limiter.Acquire(1, forever, nullptr));
  EXPECT_EQ(clock.MonotonicNanos(), absl::ToInt64Nanoseconds(absl::Milliseconds(2500)));
}

TEST(BackupRateLimiterTest, GivesUpAtOnceWhenTheBytesWouldBeFreeOnlyAfterTheDeadline) {
  ManualClock clock;
  BackupRateLimiter limiter(1000, &clock);
  ASSERT_TRUE(limiter.Acquire(2000, absl::InfiniteFuture(), nullptr));  // busy for 2 s
  EXPECT_FALSE(limiter.Acquire(10, clock.Now() + absl::Milliseconds(1999), nullptr));
  EXPECT_EQ(clock.MonotonicNanos(), 0);  // no wait
  // The refusal reserved nothing: the link is free at 2 s, as before.
  EXPECT_TRUE(limiter.Acquire(10, clock.Now() + absl::Seconds(2), nullptr));
  EXPECT_EQ(clock.MonotonicNanos(), absl::ToInt64Nanoseconds(absl::Seconds(2)));
}

TEST(BackupRateLimiterTest, GivesUpWhenCancelled) {
  ManualClock clock;
  BackupRateLimiter limiter(1000, &clock);
  std::atomic<bool> cancel{true};
  EXPECT_FALSE(limiter.Acquire(10, absl::InfiniteFuture(), &cancel));
  cancel = false;
  EXPECT_TRUE(limiter.Acquire(10, absl::InfiniteFuture(), &cancel));
}

TEST(BackupRateLimiterTest, ARateOfZeroIsUnlimited) {
  ManualClock clock;
  BackupRateLimiter limiter(0, &clock);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.Acquire(uint64_t{1} << 40, clock.Now(), nullptr));
  EXPECT_EQ(clock.MonotonicNanos(), 0);
}

}  // namespace
}  // namespace trainguard
