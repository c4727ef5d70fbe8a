// Peer backups: the holder (BackupService: a listener thread, one thread per connection, one
// SnapshotArena per source rank) and the client calls (PushBackup, FetchBackup). Wire protocol and
// crash semantics: backup_service.h and sdk/proto/backup.proto.
#include "sdk/checkpoint/backup_service.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "sdk/checkpoint/snapshot_arena.h"
#include "sdk/core/job_id.h"
#include "sdk/core/mutex.h"
#include "sdk/core/scoped_fd.h"
#include "sdk/proto/backup.pb.h"
#include "trainguard/clock.h"
#include "trainguard/env.h"

namespace trainguard {

using checkpoint_internal::AlignUp;
using checkpoint_internal::ArenaGeometry;
using checkpoint_internal::ArenaHeader;
using checkpoint_internal::ChunkChecksums;
using checkpoint_internal::GeometryFor;
using checkpoint_internal::kArenaAlignment;
using checkpoint_internal::kArenaFormatVersion;
using checkpoint_internal::kArenaMagicValue;
using checkpoint_internal::kSlotComplete;
using checkpoint_internal::kSlotEmpty;
using checkpoint_internal::kSlotMagic;
using checkpoint_internal::kSlotWriting;
using checkpoint_internal::LoadState;
using checkpoint_internal::SlotHeader;
using checkpoint_internal::SnapshotArena;
using checkpoint_internal::StoreState;

namespace {

constexpr uint32_t kProtocolVersion = 1;
// A request or reply (the checksum table is the large part: 8 bytes a chunk).
constexpr uint32_t kMaxMessageBytes = 16 << 20;
constexpr uint64_t kMaxChunks = 1 << 20;
// A slot larger than this is a corrupt or hostile header, not a snapshot.
constexpr uint64_t kMaxPayloadCapacity = uint64_t{1} << 42;
// Bulk transfer: the piece each send (and each rate-limiter grant) covers. The socket buffers are
// left to the kernel: setting SO_SNDBUF/SO_RCVBUF turns off Linux's buffer autotuning, which grows
// them past 4 MiB (net.ipv4.tcp_rmem); with 4 MiB set, pushes over loopback ran at about 0.5x a
// plain socket, without at about 0.8x (bench/bench_replication.cc). Nagle stays on.
constexpr uint64_t kMaxPieceBytes = 4 << 20;
constexpr uint64_t kMinPieceBytes = 64 << 10;
// How often a blocked socket wait re-checks the caller's cancel flag.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(20);
// How often the listener re-checks for shutdown and reaps finished connection threads.
constexpr absl::Duration kListenerPoll = absl::Milliseconds(500);
constexpr int kMaxConnections = 16;
// After a failed send, how long a client listens for the holder's reason (a DataLoss reply).
constexpr absl::Duration kReasonGrace = absl::Seconds(1);

std::string ErrnoText(int err) {
  char buf[256];
  return std::string(strerror_r(err, buf, sizeof(buf)));
}

uint64_t PieceBytes(uint64_t chunk_bytes) {
  return std::clamp(chunk_bytes, kMinPieceBytes, kMaxPieceBytes);
}

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

absl::Status WithContext(const absl::Status& status, std::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrFormat("%s: %s", context, status.message()));
}

absl::StatusCode CodeFromWire(int32_t code) {
  if (code < 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::StatusCode::kUnknown;
  }
  return static_cast<absl::StatusCode>(code);
}

// The fingerprint of a slot, from its header and checksum table.
uint64_t SlotFingerprint(SlotHeader* slot) {
  const uint64_t* sums = ChunkChecksums(slot);
  return SnapshotFingerprint(slot->step, slot->layout_hash, slot->payload_bytes,
                             std::vector<uint64_t>(sums, sums + slot->num_chunks));
}

// A complete slot is trusted only when its header fits the arena's geometry.
bool SlotUsable(const SlotHeader* slot, const ArenaGeometry& g) {
  return std::memcmp(slot->magic, kSlotMagic, sizeof(kSlotMagic)) == 0 &&
         slot->format_version == kArenaFormatVersion && slot->layout_hash == g.layout_hash &&
         slot->chunk_bytes == g.chunk_bytes && slot->payload_bytes <= g.payload_capacity &&
         slot->num_chunks == (slot->payload_bytes + g.chunk_bytes - 1) / g.chunk_bytes &&
         slot->num_chunks <= g.max_chunks;
}

// ---------------------------------------------------------------------------------------------
// Sockets.

// "HOST:PORT" or "[V6]:PORT" -> host, port.
absl::Status SplitAddress(const std::string& address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("backup holder address \"%s\" is not HOST:PORT", address));
  }
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return absl::OkStatus();
}

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// One end of a backup connection: blocking-with-deadline I/O on a non-blocking socket. Every wait
// ends by `deadline`, after `idle_timeout` without progress, when `*cancel` is set, or when
// `wake_fd` (the service's shutdown pipe) becomes readable. Not thread-safe.
class Channel {
 public:
  Channel(int fd, std::string peer, absl::Time deadline, absl::Duration idle_timeout,
          const std::atomic<bool>* cancel, int wake_fd)
      : fd_(fd),
        peer_(std::move(peer)),
        deadline_(deadline),
        idle_timeout_(idle_timeout),
        cancel_(cancel),
        wake_fd_(wake_fd),
        last_progress_(absl::Now()) {}

  int fd() const { return fd_.get(); }
  const std::string& peer() const { return peer_; }
  void set_deadline(absl::Time deadline) { deadline_ = deadline; }

  absl::Status Send(const char* data, size_t n) {
    size_t done = 0;
    while (done < n) {
      const ssize_t sent = send(fd(), data + done, n - done, MSG_NOSIGNAL);
      if (sent > 0) {
        done += static_cast<size_t>(sent);
        last_progress_ = absl::Now();
        continue;
      }
      if (sent < 0 && errno == EINTR) continue;
      if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (absl::Status s = Wait(POLLOUT, "sending to"); !s.ok()) return s;
        continue;
      }
      return absl::UnavailableError(absl::StrFormat("sending to %s: %s", peer_, ErrnoText(errno)));
    }
    return absl::OkStatus();
  }

  // At least one byte and at most `max` into `data`: what one recv() gave.
  absl::StatusOr<size_t> RecvSome(char* data, size_t max) {
    while (true) {
      const ssize_t got = recv(fd(), data, max, 0);
      if (got > 0) {
        last_progress_ = absl::Now();
        return static_cast<size_t>(got);
      }
      if (got == 0) {
        return absl::UnavailableError(
            absl::StrFormat("receiving from %s: connection closed by the peer", peer_));
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (absl::Status s = Wait(POLLIN, "receiving from"); !s.ok()) return s;
        continue;
      }
      return absl::UnavailableError(
          absl::StrFormat("receiving from %s: %s", peer_, ErrnoText(errno)));
    }
  }

  // Exactly `n` bytes into `data`.
  absl::Status Recv(char* data, size_t n) {
    size_t done = 0;
    while (done < n) {
      const ssize_t got = recv(fd(), data + done, n - done, 0);
      if (got > 0) {
        done += static_cast<size_t>(got);
        last_progress_ = absl::Now();
        continue;
      }
      if (got == 0) {
        return absl::UnavailableError(absl::StrFormat(
            "receiving from %s: connection closed by the peer (%d of %d bytes received)", peer_,
            done, n));
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (absl::Status s = Wait(POLLIN, "receiving from"); !s.ok()) return s;
        continue;
      }
      return absl::UnavailableError(
          absl::StrFormat("receiving from %s: %s", peer_, ErrnoText(errno)));
    }
    return absl::OkStatus();
  }

  absl::Status SendMessage(const proto::BackupMessage& message) {
    std::string frame(4, '\0');
    if (!message.AppendToString(&frame) || frame.size() - 4 > kMaxMessageBytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("a backup message of %d bytes for %s exceeds the limit of %d bytes",
                          frame.size() - 4, peer_, kMaxMessageBytes));
    }
    const uint32_t length = static_cast<uint32_t>(frame.size() - 4);
    for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((length >> (8 * i)) & 0xff);
    return Send(frame.data(), frame.size());
  }

  // InvalidArgument for a length over the limit or bytes that do not parse: the caller closes the
  // connection.
  absl::Status RecvMessage(proto::BackupMessage* message) {
    unsigned char header[4];
    if (absl::Status s = Recv(reinterpret_cast<char*>(header), 4); !s.ok()) return s;
    const uint32_t length = uint32_t{header[0]} | uint32_t{header[1]} << 8 |
                            uint32_t{header[2]} << 16 | uint32_t{header[3]} << 24;
    if (length > kMaxMessageBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s sent a message length of %d bytes, over the limit of %d (not a backup peer, or a "
          "corrupt stream)",
          peer_, length, kMaxMessageBytes));
    }
    std::string body(length, '\0');
    if (absl::Status s = Recv(body.data(), length); !s.ok()) return s;
    if (!message->ParseFromString(body)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s sent %d bytes that are not a backup message (not a backup peer, or a corrupt "
          "stream)",
          peer_, length));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Wait(short events, const char* doing) {
    while (true) {
      if (cancel_ != nullptr && cancel_->load(std::memory_order_relaxed)) {
        return absl::CancelledError(absl::StrFormat("%s %s: cancelled", doing, peer_));
      }
      const absl::Time now = absl::Now();
      if (now >= deadline_) {
        return absl::DeadlineExceededError(
            absl::StrFormat("%s %s: the deadline passed", doing, peer_));
      }
      if (now - last_progress_ >= idle_timeout_) {
        return absl::DeadlineExceededError(absl::StrFormat("%s %s: the peer was silent for %s",
                                                           doing, peer_,
                                                           absl::FormatDuration(idle_timeout_)));
      }
      absl::Duration wait = std::min(deadline_ - now, last_progress_ + idle_timeout_ - now);
      if (cancel_ != nullptr) wait = std::min(wait, kCancelPoll);
      const int timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(wait, absl::Milliseconds(1))), 1, 1000));
      pollfd fds[2] = {{fd(), events, 0}, {wake_fd_, POLLIN, 0}};
      const int n = poll(fds, wake_fd_ >= 0 ? 2 : 1, timeout_ms);
      if (n < 0 && errno != EINTR) {
        return absl::UnavailableError(
            absl::StrFormat("%s %s: poll: %s", doing, peer_, ErrnoText(errno)));
      }
      if (n <= 0) continue;
      if (wake_fd_ >= 0 && fds[1].revents != 0) {
        return absl::CancelledError(
            absl::StrFormat("%s %s: the backup service is stopping", doing, peer_));
      }
      if (fds[0].revents != 0) return absl::OkStatus();
    }
  }

  ScopedFd fd_;
  const std::string peer_;
  absl::Time deadline_;
  const absl::Duration idle_timeout_;
  const std::atomic<bool>* const cancel_;
  const int wake_fd_;
  absl::Time last_progress_;
};

// A connection to a holder, bound to `source_address` when that is not empty.
absl::StatusOr<std::unique_ptr<Channel>> Connect(const std::string& address,
                                                 const std::string& source_address,
                                                 absl::Time deadline,
                                                 const std::atomic<bool>* cancel) {
  std::string host, port;
  if (absl::Status s = SplitAddress(address, &host, &port); !s.ok()) return s;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrFormat("cannot resolve backup holder %s: %s", address, gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(found, freeaddrinfo);
  absl::Status last =
      absl::UnavailableError(absl::StrFormat("backup holder %s resolves to no address", address));
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int raw = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (raw < 0) {
      last = absl::UnavailableError(
          absl::StrFormat("socket for backup holder %s: %s", address, ErrnoText(errno)));
      continue;
    }
    auto channel = std::make_unique<Channel>(raw, absl::StrFormat("backup holder %s", address),
                                             deadline, absl::InfiniteDuration(), cancel, -1);
    SetNonBlocking(raw);
    if (!source_address.empty()) {
      sockaddr_storage source{};
      auto* v4 = reinterpret_cast<sockaddr_in*>(&source);
      auto* v6 = reinterpret_cast<sockaddr_in6*>(&source);
      socklen_t length = 0;
      if (inet_pton(AF_INET, source_address.c_str(), &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        length = sizeof(sockaddr_in);
      } else if (inet_pton(AF_INET6, source_address.c_str(), &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        length = sizeof(sockaddr_in6);
      } else {
        return absl::InvalidArgumentError(absl::StrFormat(
            "source address \"%s\" is not a numeric IPv4 or IPv6 address", source_address));
      }
      if (source.ss_family != a->ai_family) {
        last = absl::UnavailableError(absl::StrFormat(
            "source address %s and backup holder %s are of different address families",
            source_address, address));
        continue;
      }
      if (bind(raw, reinterpret_cast<const sockaddr*>(&source), length) != 0) {
        return absl::UnavailableError(
            absl::StrFormat("cannot bind source address %s for backup holder %s: %s",
                            source_address, address, ErrnoText(errno)));
      }
    }
    if (connect(raw, a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS && errno != EINTR) {
        last = absl::UnavailableError(
            absl::StrFormat("cannot connect to backup holder %s: %s", address, ErrnoText(errno)));
        continue;
      }
      while (true) {
        if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
          return absl::CancelledError(
              absl::StrFormat("connecting to backup holder %s: cancelled", address));
        }
        const absl::Duration left = deadline - absl::Now();
        if (left <= absl::ZeroDuration()) {
          return absl::DeadlineExceededError(
              absl::StrFormat("connecting to backup holder %s: the deadline passed", address));
        }
        pollfd fds{raw, POLLOUT, 0};
        const int timeout_ms = static_cast<int>(
            std::clamp<int64_t>(absl::ToInt64Milliseconds(
                                    absl::Ceil(std::min(left, kCancelPoll), absl::Milliseconds(1))),
                                1, 1000));
        if (poll(&fds, 1, timeout_ms) > 0) break;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(raw, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = absl::UnavailableError(
            absl::StrFormat("cannot connect to backup holder %s: %s", address, ErrnoText(err)));
        continue;
      }
    }
    return channel;
  }
  return last;
}

// Receives `bytes` into `payload`, hashing what each recv() gave while it is in the cache, and
// checks every chunk's XXH3-64 against `expected` once its last byte is in. On a mismatch: DataLoss
// naming the chunk, at once or (`drain`) after the rest of the payload has been received, so the
// peer that sent it can read the answer. Connection errors return at once.
absl::Status ReceiveVerified(Channel* channel, char* payload, uint64_t bytes, uint64_t chunk,
                             const uint64_t* expected, bool drain) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 XXH3_freeState);
  if (state == nullptr) return absl::ResourceExhaustedError("XXH3_createState failed");
  absl::Status mismatch;
  for (uint64_t k = 0, begin = 0; begin < bytes; ++k, begin += chunk) {
    const uint64_t end = std::min(begin + chunk, bytes);
    XXH3_64bits_reset(state.get());
    for (uint64_t at = begin; at < end;) {
      absl::StatusOr<size_t> n = channel->RecvSome(payload + at, end - at);
      if (!n.ok()) {
        return WithContext(n.status(),
                           absl::StrFormat("%d of %d payload bytes received", at, bytes));
      }
      XXH3_64bits_update(state.get(), payload + at, *n);
      at += *n;
    }
    const uint64_t actual = XXH3_64bits_digest(state.get());
    if (mismatch.ok() && actual != expected[k]) {
      mismatch = absl::DataLossError(absl::StrFormat(
          "chunk %d (payload offset %d, %d bytes) has checksum %016x, expected %016x", k, begin,
          end - begin, actual, expected[k]));
      if (!drain) return mismatch;
    }
  }
  return mismatch;
}

// ---------------------------------------------------------------------------------------------
// Arenas.

std::string SegmentPrefix(std::string_view job_id) {
  return absl::StrFormat("trainguard.%s.backup.rank", job_id);
}

// The geometry an existing arena was created with; nullopt when there is no segment `name`.
// DataLoss when it is not a usable arena (its creator died while creating it).
absl::StatusOr<std::optional<ArenaGeometry>> ReadGeometry(Env* env, const std::string& name) {
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

// The complete, usable slots of `slot(0)`, `slot(1)` (skipping `writing`), newest first.
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

// The complete backups in a segment this process has not opened, read without locking it (its
// holder may be another live process on this host).
std::vector<HeldBackup> PeekSegment(Env* env, const std::string& name, int source_rank) {
  absl::StatusOr<std::optional<ArenaGeometry>> geometry = ReadGeometry(env, name);
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

// The source ranks whose backup arenas of `job_id` exist on this host (/dev/shm is where Linux
// keeps POSIX shared memory; the Env has no listing).
std::vector<int> SegmentsOnHost(std::string_view job_id) {
  std::vector<int> ranks;
  const std::string prefix = SegmentPrefix(job_id);
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return ranks;
  while (const dirent* entry = readdir(dir)) {
    const std::string_view name(entry->d_name);
    if (name.substr(0, prefix.size()) != prefix) continue;
    const std::string_view digits = name.substr(prefix.size());
    if (digits.empty() || digits.size() > 9 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    ranks.push_back(std::stoi(std::string(digits)));
  }
  closedir(dir);
  return ranks;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// BackupRateLimiter.

BackupRateLimiter::BackupRateLimiter(uint64_t bytes_per_second, Clock* clock)
    : rate_(bytes_per_second), clock_(clock != nullptr ? clock : Clock::Real()) {}

bool BackupRateLimiter::Acquire(uint64_t bytes, absl::Time deadline,
                                const std::atomic<bool>* cancel) {
  auto cancelled = [cancel] {
    return cancel != nullptr && cancel->load(std::memory_order_relaxed);
  };
  if (cancelled()) return false;
  if (rate_ == 0) return true;
  constexpr int64_t kFar = INT64_MAX / 4;  // beyond any deadline; sums of two do not overflow
  const int64_t cost = static_cast<int64_t>(std::min(
      static_cast<double>(kFar), static_cast<double>(bytes) * 1e9 / static_cast<double>(rate_)));
  int64_t now = clock_->MonotonicNanos();
  const absl::Duration left = deadline - clock_->Now();
  const int64_t deadline_ns =
      now + (left >= absl::Nanoseconds(kFar)    ? kFar
             : left <= absl::Nanoseconds(-kFar) ? -kFar
                                                : absl::ToInt64Nanoseconds(left));
  int64_t start = 0;
  int64_t expected = next_free_ns_.load(std::memory_order_relaxed);
  do {
    start = std::max(expected, now);
    if (start > deadline_ns) return false;
  } while (!next_free_ns_.compare_exchange_weak(expected, start + cost, std::memory_order_relaxed));
  while ((now = clock_->MonotonicNanos()) < start) {
    if (cancelled()) return false;
    clock_->SleepFor(std::min(absl::Nanoseconds(start - now), kCancelPoll));
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// BackupService.

class BackupService::Impl {
 public:
  Impl(const BackupServiceOptions& options, int listen_fd, int wake_read, int wake_write, int port)
      : options_(options),
        env_(options.env != nullptr ? options.env : Env::Default()),
        listen_fd_(listen_fd),
        wake_read_(wake_read),
        wake_write_(wake_write),
        port_(port) {}

  ~Impl() {
    // Wakes every wait of the listener and the connections: the pipe stays readable.
    const char byte = 1;
    (void)!write(wake_write_.get(), &byte, 1);
    if (listener_.joinable()) listener_.join();
    MutexLock lock(&connections_mu_);
    for (Connection& c : connections_) c.thread.join();
    connections_.clear();
  }

  void StartListener() {
    listener_ = std::thread([this] { ListenLoop(); });
  }

  std::string address() const {
    const bool v6 = options_.bind_address.find(':') != std::string::npos;
    return v6 ? absl::StrFormat("[%s]:%d", options_.bind_address, port_)
              : absl::StrFormat("%s:%d", options_.bind_address, port_);
  }

  std::vector<HeldBackup> Held() {
    std::vector<int> ranks = SegmentsOnHost(options_.job_id);
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
      if (peek) held = PeekSegment(env_, ArenaName(options_.job_id, rank), rank);
      out.insert(out.end(), held.begin(), held.end());
    }
    return out;
  }

 private:
  // The backups of one source rank: its arena (opened on the first push or fetch) and who is
  // using which slot. A push writes one slot while fetches read the other.
  struct Source {
    Mutex mu;
    std::unique_ptr<SnapshotArena> arena ABSL_GUARDED_BY(mu);
    int writing ABSL_GUARDED_BY(mu) = -1;
    int readers[2] ABSL_GUARDED_BY(mu) = {0, 0};
  };

  struct Connection {
    std::thread thread;
    std::atomic<bool> done{false};
  };

  std::string Where() const {
    return absl::StrFormat("backup holder rank %d (%s)", options_.rank, address());
  }

  void Log(const std::string& what) const {
    std::fprintf(stderr, "trainguard: %s: %s\n", Where().c_str(), what.c_str());
  }

  Source* FindSource(int rank) {
    MutexLock lock(&sources_mu_);
    auto it = sources_.find(rank);
    return it == sources_.end() ? nullptr : it->second.get();
  }

  Source* GetSource(int rank) {
    MutexLock lock(&sources_mu_);
    std::unique_ptr<Source>& source = sources_[rank];
    if (source == nullptr) source = std::make_unique<Source>();
    return source.get();
  }

  void ListenLoop() {
    while (true) {
      pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_read_.get(), POLLIN, 0}};
      const int n = poll(fds, 2, static_cast<int>(absl::ToInt64Milliseconds(kListenerPoll)));
      ReapConnections();
      if (n > 0 && fds[1].revents != 0) return;
      if (n <= 0 || fds[0].revents == 0) continue;
      sockaddr_storage peer{};
      socklen_t length = sizeof(peer);
      const int fd = accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&peer), &length,
                             SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) continue;
      std::string name = DescribePeer(peer);
      MutexLock lock(&connections_mu_);
      if (static_cast<int>(connections_.size()) >= kMaxConnections) {
        Log(absl::StrFormat("refused a connection from %s: %d connections are being served", name,
                            kMaxConnections));
        close(fd);
        continue;
      }
      connections_.emplace_back();
      Connection* c = &connections_.back();
      c->thread = std::thread([this, fd, name = std::move(name), c] {
        Serve(fd, name);
        c->done.store(true, std::memory_order_release);
      });
    }
  }

  void ReapConnections() {
    MutexLock lock(&connections_mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (it->done.load(std::memory_order_acquire)) {
        it->thread.join();
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }

  static std::string DescribePeer(const sockaddr_storage& peer) {
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (peer.ss_family == AF_INET) {
      const auto* v4 = reinterpret_cast<const sockaddr_in*>(&peer);
      inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
      port = ntohs(v4->sin_port);
    } else if (peer.ss_family == AF_INET6) {
      const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&peer);
      inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
      port = ntohs(v6->sin6_port);
    }
    return absl::StrFormat("peer %s:%d", host, port);
  }

  // One request per connection.
  void Serve(int fd, const std::string& peer) {
    Channel channel(fd, peer, absl::InfiniteFuture(), options_.io_timeout, nullptr,
                    wake_read_.get());
    proto::BackupMessage request;
    if (absl::Status s = channel.RecvMessage(&request); !s.ok()) {
      Log(absl::StrFormat("dropped the connection: %s", s.message()));
      if (absl::IsInvalidArgument(s)) (void)Reply(&channel, s);
      return;
    }
    absl::Status served;
    if (request.has_push()) {
      served = ServePush(&channel, request.push());
    } else if (request.has_fetch()) {
      served = ServeFetch(&channel, request.fetch());
    } else {
      served = absl::InvalidArgumentError(
          absl::StrFormat("%s sent a backup message that is neither a push nor a fetch", peer));
      (void)Reply(&channel, served);
    }
    // The status already names this holder.
    if (!served.ok())
      std::fprintf(stderr, "trainguard: %s\n", std::string(served.message()).c_str());
  }

  static absl::Status Reply(Channel* channel, const absl::Status& status,
                            proto::BackupReply reply = {}) {
    reply.set_code(static_cast<int32_t>(status.code()));
    reply.set_message(std::string(status.message()));
    proto::BackupMessage message;
    *message.mutable_reply() = std::move(reply);
    return channel->SendMessage(message);
  }

  // Checks what every request carries. The status goes back to the client as it is.
  absl::Status CheckRequest(uint32_t version, const std::string& token, const std::string& job_id,
                            int source_rank, const std::string& peer) const {
    if (version != kProtocolVersion) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s: %s speaks backup protocol version %d, this holder %d", Where(), peer,
                          version, kProtocolVersion));
    }
    if (!options_.token.empty() && !TokenMatches(options_.token, token)) {
      return absl::PermissionDeniedError(
          absl::StrFormat("%s: %s presented a wrong job token", Where(), peer));
    }
    if (job_id != options_.job_id) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: %s asked about job \"%s\", this holder serves job \"%s\"", Where(),
                          peer, absl::CHexEscape(job_id), options_.job_id));
    }
    if (source_rank < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: %s named source rank %d", Where(), peer, source_rank));
    }
    return absl::OkStatus();
  }

  // The arena of `source` for `geometry`, opened (or created, or replaced when the layout
  // changed) now if need be.
  absl::Status EnsureArena(Source* source, int source_rank, const ArenaGeometry& geometry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(source->mu) {
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
            "%s: the backup of source rank %d is being fetched; its arena cannot be replaced",
            Where(), source_rank));
      }
      source->arena.reset();  // releases the flock, so that OpenOrCreate can take it
    }
    return OpenArena(source, source_rank, geometry);
  }

  absl::Status OpenArena(Source* source, int source_rank, const ArenaGeometry& geometry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(source->mu) {
    const std::string name = ArenaName(options_.job_id, source_rank);
    std::string replaced;
    absl::StatusOr<std::unique_ptr<SnapshotArena>> arena =
        SnapshotArena::OpenOrCreate(env_, name, geometry, &replaced);
    if (!arena.ok()) {
      return WithContext(arena.status(),
                         absl::StrFormat("%s: the backup arena of source rank %d (%s, %d bytes)",
                                         Where(), source_rank, name, geometry.segment_bytes()));
    }
    if (!replaced.empty()) {
      Log(absl::StrFormat("replaced the backup arena %s of source rank %d: %s", name, source_rank,
                          replaced));
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
  static int NewestSlot(Source* source) ABSL_EXCLUSIVE_LOCKS_REQUIRED(source->mu) {
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

  absl::Status ValidatePush(const proto::BackupPush& push, const std::string& peer,
                            uint64_t* capacity) const {
    const proto::BackupSnapshotHeader& h = push.snapshot();
    const std::string what = absl::StrFormat("%s: the push of source rank %d step %d from %s",
                                             Where(), push.source_rank(), h.step(), peer);
    if (h.chunk_bytes() == 0 || h.chunk_bytes() % kArenaAlignment != 0 ||
        h.chunk_bytes() > kMaxPayloadCapacity) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: chunk_bytes %d is not a positive multiple of %d", what,
                          h.chunk_bytes(), kArenaAlignment));
    }
    *capacity = push.payload_capacity() != 0 ? push.payload_capacity()
                                             : AlignUp(h.payload_bytes(), kArenaAlignment);
    if (*capacity > kMaxPayloadCapacity || h.payload_bytes() > *capacity ||
        (*capacity + h.chunk_bytes() - 1) / h.chunk_bytes() > kMaxChunks) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %d payload bytes in a slot of %d bytes (chunk %d bytes) do not fit a backup arena "
          "(at most %d bytes, %d chunks)",
          what, h.payload_bytes(), *capacity, h.chunk_bytes(), kMaxPayloadCapacity, kMaxChunks));
    }
    const uint64_t chunks = (h.payload_bytes() + h.chunk_bytes() - 1) / h.chunk_bytes();
    if (static_cast<uint64_t>(h.chunk_checksums_size()) != chunks) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: %d checksums for %d chunks", what,
                                                        h.chunk_checksums_size(), chunks));
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

  absl::Status ServePush(Channel* channel, const proto::BackupPush& push) {
    const std::string& peer = channel->peer();
    absl::Status checked = CheckRequest(push.protocol_version(), push.token(), push.job_id(),
                                        push.source_rank(), peer);
    uint64_t capacity = 0;
    if (checked.ok()) checked = ValidatePush(push, peer, &capacity);
    if (!checked.ok()) {
      (void)Reply(channel, checked);
      return checked;
    }
    const proto::BackupSnapshotHeader& h = push.snapshot();
    const int rank = push.source_rank();
    Source* source = GetSource(rank);
    int w = -1;
    {
      MutexLock lock(&source->mu);
      absl::Status ready = BeginPush(source, rank, h, capacity, &w);
      if (!ready.ok() || w < 0) {
        proto::BackupReply reply;
        reply.set_already_held(ready.ok());
        reply.set_fingerprint(h.fingerprint());
        (void)Reply(channel, ready, std::move(reply));
        return ready;
      }
    }
    absl::Status received = Reply(channel, absl::OkStatus());
    if (received.ok()) received = ReceivePayload(channel, source, w, h);
    MutexLock lock(&source->mu);
    SlotHeader* slot = source->arena->slot(w);
    if (!received.ok()) {
      StoreState(slot, kSlotEmpty);
      source->writing = -1;
      const absl::Status status = WithContext(
          received,
          absl::StrFormat("%s: receiving step %d of source rank %d", Where(), h.step(), rank));
      if (absl::IsDataLoss(received)) (void)Reply(channel, status);
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
    slot->sequence =
        std::max(source->arena->slot(0)->sequence, source->arena->slot(1)->sequence) + 1;
    // Release: every payload byte and checksum is visible before "complete" is.
    StoreState(slot, kSlotComplete);
    source->writing = -1;
    proto::BackupReply reply;
    reply.set_fingerprint(SlotFingerprint(slot));
    return Reply(channel, absl::OkStatus(), std::move(reply));
  }

  // Picks the slot a push writes (*w; -1 when the fingerprint is held already) and marks it
  // kWriting.
  absl::Status BeginPush(Source* source, int rank, const proto::BackupSnapshotHeader& h,
                         uint64_t capacity, int* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(source->mu) {
    *w = -1;
    if (source->writing >= 0) {
      return absl::AbortedError(
          absl::StrFormat("%s: a push of source rank %d is already being received", Where(), rank));
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
    const int newest = NewestSlot(source);
    const int target = newest == 0 ? 1 : 0;
    const bool free = source->mu.AwaitWithTimeout(
        [source, target]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return source->readers[target] == 0; },
        options_.io_timeout);
    if (!free) {
      return absl::UnavailableError(
          absl::StrFormat("%s: the older backup of source rank %d is still being fetched after %s",
                          Where(), rank, absl::FormatDuration(options_.io_timeout)));
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
  absl::Status ReceivePayload(Channel* channel, Source* source, int w,
                              const proto::BackupSnapshotHeader& h) {
    char* payload = nullptr;
    {
      MutexLock lock(&source->mu);
      payload = source->arena->payload(w);  // the arena is not replaced while `writing` is set
    }
    return ReceiveVerified(channel, payload, h.payload_bytes(), h.chunk_bytes(),
                           h.chunk_checksums().data(), /*drain=*/true);
  }

  absl::Status ServeFetch(Channel* channel, const proto::BackupFetch& fetch) {
    const std::string& peer = channel->peer();
    if (absl::Status s = CheckRequest(fetch.protocol_version(), fetch.token(), fetch.job_id(),
                                      fetch.source_rank(), peer);
        !s.ok()) {
      (void)Reply(channel, s);
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
        (void)Reply(channel, found);
        return absl::OkStatus();  // a miss is an answer, not a fault of this holder
      }
      ++source->readers[s];
      payload = source->arena->payload(s);
      SlotHeader* slot = source->arena->slot(s);
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
    absl::Status sent = Reply(channel, absl::OkStatus(), reply);
    const uint64_t bytes = reply.snapshot().payload_bytes();
    const uint64_t piece = PieceBytes(reply.snapshot().chunk_bytes());
    for (uint64_t at = 0; sent.ok() && at < bytes; at += piece) {
      sent = channel->Send(payload + at, std::min(piece, bytes - at));
    }
    MutexLock lock(&source->mu);
    --source->readers[s];
    return WithContext(sent, absl::StrFormat("%s: sending step %d of source rank %d", Where(),
                                             fetch.step(), rank));
  }

  absl::Status FindForFetch(Source* source, const proto::BackupFetch& fetch, int* s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(source->mu) {
    const int rank = fetch.source_rank();
    const std::string missing =
        absl::StrFormat("%s has no complete backup of source rank %d step %d fingerprint %016x",
                        Where(), rank, fetch.step(), fetch.fingerprint());
    if (source->arena == nullptr) {
      const std::string name = ArenaName(options_.job_id, rank);
      absl::StatusOr<std::optional<ArenaGeometry>> geometry = ReadGeometry(env_, name);
      if (!geometry.ok())
        return absl::NotFoundError(
            absl::StrFormat("%s (%s)", missing, geometry.status().message()));
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

  const BackupServiceOptions options_;
  Env* const env_;
  const ScopedFd listen_fd_;
  const ScopedFd wake_read_;
  const ScopedFd wake_write_;
  const int port_;
  std::thread listener_;

  Mutex connections_mu_;
  std::list<Connection> connections_ ABSL_GUARDED_BY(connections_mu_);

  Mutex sources_mu_;
  // Never erased while the service runs: connection threads keep pointers to the entries.
  std::map<int, std::unique_ptr<Source>> sources_ ABSL_GUARDED_BY(sources_mu_);
};

absl::StatusOr<std::unique_ptr<BackupService>> BackupService::Start(
    const BackupServiceOptions& options) {
  const std::string where = absl::StrFormat("backup holder rank %d (job %s, %s:%d)", options.rank,
                                            options.job_id, options.bind_address, options.port);
  if (absl::Status s = ValidateJobId(options.job_id); !s.ok()) return WithContext(s, where);
  if (options.io_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: io_timeout must be positive", where));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(options.port);
  if (const int rc = getaddrinfo(options.bind_address.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: cannot resolve the bind address: %s", where, gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(found, freeaddrinfo);
  ScopedFd listener(socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                           found->ai_protocol));
  if (listener.get() < 0) {
    return absl::UnavailableError(absl::StrFormat("%s: socket: %s", where, ErrnoText(errno)));
  }
  const int one = 1;
  setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(listener.get(), found->ai_addr, found->ai_addrlen) != 0 ||
      listen(listener.get(), 64) != 0) {
    return absl::UnavailableError(
        absl::StrFormat("%s: cannot listen: %s", where, ErrnoText(errno)));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bound), &length);
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::UnavailableError(absl::StrFormat("%s: pipe: %s", where, ErrnoText(errno)));
  }
  auto impl = std::make_unique<Impl>(options, listener.release(), wake[0], wake[1], bound_port);
  impl->StartListener();
  return std::unique_ptr<BackupService>(new BackupService(std::move(impl)));
}

BackupService::BackupService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BackupService::~BackupService() = default;

std::string BackupService::address() const { return impl_->address(); }
std::vector<HeldBackup> BackupService::Held() const { return impl_->Held(); }

std::string BackupService::ArenaName(std::string_view job_id, int source_rank) {
  return absl::StrFormat("/%s%d", SegmentPrefix(job_id), source_rank);
}

absl::Status BackupService::RemoveArenas(std::string_view job_id,
                                         const std::vector<int>& source_ranks, Env* env) {
  if (env == nullptr) env = Env::Default();
  absl::Status first;
  for (int rank : source_ranks) {
    absl::Status removed = SnapshotArena::Remove(env, ArenaName(job_id, rank));
    if (!removed.ok() && !absl::IsNotFound(removed) && first.ok()) first = removed;
  }
  return first;
}

// ---------------------------------------------------------------------------------------------
// The client calls.

namespace {

absl::Status HolderStatus(const proto::BackupReply& reply, std::string_view what) {
  if (reply.code() == 0) return absl::OkStatus();
  return absl::Status(CodeFromWire(reply.code()),
                      absl::StrFormat("%s: the holder answered: %s", what, reply.message()));
}

absl::StatusOr<proto::BackupReply> ReceiveReply(Channel* channel, std::string_view what) {
  proto::BackupMessage message;
  if (absl::Status s = channel->RecvMessage(&message); !s.ok()) return WithContext(s, what);
  if (!message.has_reply()) {
    return absl::UnavailableError(
        absl::StrFormat("%s: the holder sent something other than a reply", what));
  }
  return message.reply();
}

// After a failed send: the holder's reason, when it sent one (a chunk that did not verify, a
// full /dev/shm), else `failure`.
absl::Status ReasonOrFailure(Channel* channel, const absl::Status& failure, std::string_view what) {
  if (absl::IsCancelled(failure) || absl::IsDeadlineExceeded(failure)) return failure;
  channel->set_deadline(absl::Now() + kReasonGrace);
  absl::StatusOr<proto::BackupReply> reply = ReceiveReply(channel, what);
  if (reply.ok() && reply->code() != 0) return HolderStatus(*reply, what);
  return failure;
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
  absl::StatusOr<std::unique_ptr<Channel>> channel =
      Connect(request.holder_address, request.source_address, request.deadline, request.cancel);
  if (!channel.ok()) return WithContext(channel.status(), what);

  proto::BackupMessage message;
  proto::BackupPush* push = message.mutable_push();
  push->set_protocol_version(kProtocolVersion);
  push->set_token(request.token);
  push->set_job_id(request.job_id);
  push->set_source_rank(request.source_rank);
  push->set_payload_capacity(request.payload_capacity);
  proto::BackupSnapshotHeader* h = push->mutable_snapshot();
  h->set_step(view->info.step);
  h->set_generation(view->info.generation);
  h->set_layout_hash(view->info.layout_hash);
  h->set_payload_bytes(view->payload.size());
  h->set_chunk_bytes(request.chunk_bytes);
  h->mutable_chunk_checksums()->Add(view->chunk_checksums.begin(), view->chunk_checksums.end());
  h->set_fingerprint(view->info.fingerprint);
  if (absl::Status s = (*channel)->SendMessage(message); !s.ok()) return WithContext(s, what);
  absl::StatusOr<proto::BackupReply> ready = ReceiveReply(channel->get(), what);
  if (!ready.ok()) return ready.status();
  if (absl::Status s = HolderStatus(*ready, what); !s.ok()) return s;
  PushResult result;
  if (ready->already_held()) {
    result.already_held = true;
    result.elapsed = absl::Now() - started;
    return result;
  }

  const uint64_t piece = PieceBytes(request.chunk_bytes);
  const std::string_view payload = view->payload;
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
    if (absl::Status s = (*channel)->Send(payload.data() + at, n); !s.ok()) {
      return ReasonOrFailure(channel->get(), WithContext(s, what), what);
    }
    result.bytes_sent += n;
  }
  absl::StatusOr<proto::BackupReply> done = ReceiveReply(channel->get(), what);
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

// A fetch whose reply header was read and checked: the payload is next on the channel.
struct OpenedFetch {
  std::unique_ptr<Channel> channel;
  FetchedBackup described;  // everything but the payload
  uint64_t payload_bytes = 0;
};

absl::StatusOr<OpenedFetch> OpenFetch(const FetchRequest& request, const std::string& what) {
  absl::StatusOr<std::unique_ptr<Channel>> channel =
      Connect(request.holder_address, request.source_address, request.deadline, request.cancel);
  if (!channel.ok()) return WithContext(channel.status(), what);
  proto::BackupMessage message;
  proto::BackupFetch* fetch = message.mutable_fetch();
  fetch->set_protocol_version(kProtocolVersion);
  fetch->set_token(request.token);
  fetch->set_job_id(request.job_id);
  fetch->set_source_rank(request.source_rank);
  fetch->set_step(request.step);
  fetch->set_fingerprint(request.fingerprint);
  if (absl::Status s = (*channel)->SendMessage(message); !s.ok()) return WithContext(s, what);
  absl::StatusOr<proto::BackupReply> reply = ReceiveReply(channel->get(), what);
  if (!reply.ok()) return reply.status();
  if (absl::Status s = HolderStatus(*reply, what); !s.ok()) return s;

  const proto::BackupSnapshotHeader& h = reply->snapshot();
  const uint64_t chunk = h.chunk_bytes();
  if (h.step() != request.step || chunk == 0 || h.payload_bytes() > kMaxPayloadCapacity ||
      static_cast<uint64_t>(h.chunk_checksums_size()) != (h.payload_bytes() + chunk - 1) / chunk) {
    return absl::DataLossError(absl::StrFormat(
        "%s: the holder described step %d, %d bytes in %d chunks of %d bytes: not the backup "
        "asked for, or an inconsistent one",
        what, h.step(), h.payload_bytes(), h.chunk_checksums_size(), chunk));
  }
  OpenedFetch opened;
  opened.channel = *std::move(channel);
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
      ReceiveVerified(opened.channel.get(), dst, opened.payload_bytes,
                      opened.described.chunk_bytes, opened.described.chunk_checksums.data(),
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
  return snapshotter->InstallWith(
      opened->described.step, opened->described.generation, opened->payload_bytes,
      opened->described.chunk_checksums,
      [&](char* dst) { return ReceivePayload(*opened, dst, what); });
}

}  // namespace trainguard
