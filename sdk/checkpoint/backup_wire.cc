#include "sdk/checkpoint/backup_wire.h"

#include <xxhash.h>

#include <algorithm>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"

namespace trainguard {
namespace checkpoint_internal {
namespace {

// Bulk transfer: the piece each send (and each rate-limiter grant) covers. The socket buffers are
// left to the kernel: setting SO_SNDBUF/SO_RCVBUF turns off Linux's buffer autotuning, which grows
// them past 4 MiB (net.ipv4.tcp_rmem); with 4 MiB set, pushes over loopback ran at about 0.5x a
// plain socket, without at about 0.8x (bench/bench_replication.cc). Nagle stays on.
constexpr uint64_t kMaxPieceBytes = 4 << 20;
constexpr uint64_t kMinPieceBytes = 64 << 10;

}  // namespace

uint64_t BackupPieceBytes(uint64_t chunk_bytes) {
  return std::clamp(chunk_bytes, kMinPieceBytes, kMaxPieceBytes);
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

absl::Status ReceiveExactly(BackupStream* stream, char* data, size_t n) {
  for (size_t done = 0; done < n;) {
    absl::StatusOr<size_t> got = stream->ReceiveSome(data + done, n - done);
    if (!got.ok()) {
      return absl::Status(got.status().code(), absl::StrFormat("%s (%d of %d bytes received)",
                                                               got.status().message(), done, n));
    }
    done += *got;
  }
  return absl::OkStatus();
}

absl::Status SendBackupMessage(BackupStream* stream, const proto::BackupMessage& message) {
  std::string frame(4, '\0');
  if (!message.AppendToString(&frame) || frame.size() - 4 > kMaxBackupMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a backup message of %d bytes for %s exceeds the limit of %d bytes",
                        frame.size() - 4, stream->peer(), kMaxBackupMessageBytes));
  }
  const uint32_t length = static_cast<uint32_t>(frame.size() - 4);
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return stream->Send(frame.data(), frame.size());
}

absl::Status ReceiveBackupMessage(BackupStream* stream, proto::BackupMessage* message) {
  unsigned char header[4];
  if (absl::Status s = ReceiveExactly(stream, reinterpret_cast<char*>(header), 4); !s.ok()) {
    return s;
  }
  const uint32_t length = uint32_t{header[0]} | uint32_t{header[1]} << 8 |
                          uint32_t{header[2]} << 16 | uint32_t{header[3]} << 24;
  if (length > kMaxBackupMessageBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s sent a message length of %d bytes, over the limit of %d (not a backup peer, or a "
        "corrupt stream)",
        stream->peer(), length, kMaxBackupMessageBytes));
  }
  std::string body(length, '\0');
  if (absl::Status s = ReceiveExactly(stream, body.data(), length); !s.ok()) return s;
  if (!message->ParseFromString(body)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s sent %d bytes that are not a backup message (not a backup peer, or a corrupt stream)",
        stream->peer(), length));
  }
  return absl::OkStatus();
}

absl::Status ReceiveVerified(BackupStream* stream, char* payload, uint64_t bytes,
                             uint64_t chunk_bytes, const uint64_t* expected, bool drain,
                             uint64_t first_chunk, uint64_t* verified,
                             absl::FunctionRef<void(uint64_t chunk)> landed) {
  uint64_t good = 0;  // chunks in and verified before the first error
  bool counting = true;
  auto done = [&](absl::Status status) {
    if (verified != nullptr) *verified = good;
    return status;
  };
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 XXH3_freeState);
  if (state == nullptr) return done(absl::ResourceExhaustedError("XXH3_createState failed"));
  const uint64_t base = first_chunk * chunk_bytes;  // of `payload` in the whole payload
  absl::Status mismatch;
  for (uint64_t k = 0, begin = 0; begin < bytes; ++k, begin += chunk_bytes) {
    const uint64_t end = std::min(begin + chunk_bytes, bytes);
    XXH3_64bits_reset(state.get());
    for (uint64_t at = begin; at < end;) {
      absl::StatusOr<size_t> n = stream->ReceiveSome(payload + at, end - at);
      if (!n.ok()) {
        return done(
            WithContext(n.status(), absl::StrFormat("%d of %d payload bytes received", at, bytes)));
      }
      XXH3_64bits_update(state.get(), payload + at, *n);
      at += *n;
    }
    const uint64_t actual = XXH3_64bits_digest(state.get());
    if (actual != expected[k]) {
      counting = false;
      if (mismatch.ok()) {
        mismatch = absl::DataLossError(absl::StrFormat(
            "chunk %d (payload offset %d, %d bytes) has checksum %016x, expected %016x",
            first_chunk + k, base + begin, end - begin, actual, expected[k]));
      }
      if (!drain) return done(mismatch);
    } else if (counting) {
      ++good;
      landed(first_chunk + k);
    }
  }
  return done(mismatch);
}

}  // namespace checkpoint_internal
}  // namespace trainguard
