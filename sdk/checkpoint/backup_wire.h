// The peer-backup wire format over any BackupStream, shared by the holder (BackupHolder) and the
// client calls (PushBackup, FetchBackup). Every message is a u32 little-endian length and a
// BackupMessage protobuf (sdk/proto/backup.proto); a push request and a fetch reply are followed by
// the raw payload, which the receiver checks chunk by chunk against the XXH3-64 checksum table as
// it lands. The bytes are the same on every transport. Functions of their arguments: thread-safe
// as far as their stream is.
#ifndef TRAINGUARD_SDK_CHECKPOINT_BACKUP_WIRE_H_
#define TRAINGUARD_SDK_CHECKPOINT_BACKUP_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "sdk/checkpoint/backup_transport.h"
#include "sdk/proto/backup.pb.h"

namespace trainguard {
namespace checkpoint_internal {

// 2: a fetch asks for a share or a range of the chunks (BackupFetch), and its reply says which.
inline constexpr uint32_t kBackupProtocolVersion = 2;
// A request or reply (the checksum table is the large part: 8 bytes a chunk).
inline constexpr uint32_t kMaxBackupMessageBytes = 16 << 20;
inline constexpr uint64_t kMaxBackupChunks = 1 << 20;
// A slot larger than this is a corrupt or hostile header, not a snapshot.
inline constexpr uint64_t kMaxBackupPayloadCapacity = uint64_t{1} << 42;

// The piece of payload each send (and each rate-limiter grant) covers for chunks of `chunk_bytes`.
uint64_t BackupPieceBytes(uint64_t chunk_bytes);

// `status` with "`context`: " before its message; OK stays OK.
absl::Status WithContext(const absl::Status& status, std::string_view context);

// The absl::StatusCode of a reply's code; Unknown for a number that is none.
absl::StatusCode CodeFromWire(int32_t code);

// Exactly `n` bytes into `data`.
absl::Status ReceiveExactly(BackupStream* stream, char* data, size_t n);

// InvalidArgument for a message over kMaxBackupMessageBytes.
absl::Status SendBackupMessage(BackupStream* stream, const proto::BackupMessage& message);
// InvalidArgument for a length over the limit or bytes that do not parse: the caller closes the
// connection.
absl::Status ReceiveBackupMessage(BackupStream* stream, proto::BackupMessage* message);

// Receives `bytes` into `payload`, hashing what each receive gave while it is in the cache, and
// checks every chunk of `chunk_bytes` against `expected` once its last byte is in. On a mismatch:
// DataLoss naming the chunk, its payload offset and both checksums, at once or (`drain`) after the
// rest of the payload has been received, so that the peer that sent it can read the answer.
// Connection errors return at once, saying how much of the payload had arrived. `payload` may be
// the chunks from `first_chunk` on of a larger payload: errors then name chunks and offsets in
// that payload. `verified` (optional) is set to the number of chunks in and verified before the
// first error (all of them on OK). `landed` is called with the number (in the whole payload) of
// each chunk verified before the first error, at once, while its bytes are in the cache.
absl::Status ReceiveVerified(BackupStream* stream, char* payload, uint64_t bytes,
                             uint64_t chunk_bytes, const uint64_t* expected, bool drain,
                             uint64_t first_chunk, uint64_t* verified,
                             absl::FunctionRef<void(uint64_t chunk)> landed);
inline absl::Status ReceiveVerified(BackupStream* stream, char* payload, uint64_t bytes,
                                    uint64_t chunk_bytes, const uint64_t* expected, bool drain) {
  return ReceiveVerified(stream, payload, bytes, chunk_bytes, expected, drain, 0, nullptr,
                         [](uint64_t) {});
}

}  // namespace checkpoint_internal
}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_BACKUP_WIRE_H_
