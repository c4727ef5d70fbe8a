// InMemoryBackupTransport: backup streams between a client and a holder of one process, with no
// sockets, for tests of the holder logic and the client calls. A connection is a pair of bounded
// byte pipes (a sender blocks while the other end's pipe is full, as on a socket); a listener is a
// queue of connections dialed to its address. Streams keep the rules of every transport
// (backup_transport.h): each wait ends by the deadline, the idle timeout, the cancel flag or the
// listener's Shutdown. Faults to inject, per connection dialed after set_faults() (or
// set_faults_to() its address): a connection dropped after the client sent or received N bytes, a
// byte corrupted in transit either way, short reads.
//
// Thread-safe. The transport may be destroyed before its listeners and streams (they share its
// state).
#ifndef TRAINGUARD_SDK_CHECKPOINT_IN_MEMORY_BACKUP_TRANSPORT_H_
#define TRAINGUARD_SDK_CHECKPOINT_IN_MEMORY_BACKUP_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/checkpoint/backup_transport.h"

namespace trainguard {

struct InMemoryStreamFaults {
  static constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

  // Once the dialing end has sent this many bytes, the connection drops: its next send fails, and
  // each end receives what was sent before the drop, then Unavailable ("connection dropped").
  uint64_t drop_after_sent_bytes = kNever;
  // Once the dialing end has received this many bytes, the connection drops, as when the holder
  // dies in the middle of a fetch's payload: the dialing end's next receive is Unavailable
  // (whatever else was on the way), and the holder's next send fails.
  uint64_t drop_after_received_bytes = kNever;
  // The byte at this offset of what the dialing end sends (a request, a push's payload) arrives
  // with its bits flipped.
  uint64_t corrupt_sent_byte = kNever;
  // The byte at this offset of what the dialing end receives (a reply, a fetch's payload) arrives
  // with its bits flipped.
  uint64_t corrupt_received_byte = kNever;
  // Each receive on either end gives at most this many bytes (0: all that is buffered, up to the
  // caller's maximum).
  size_t max_receive_bytes = 0;
};

class InMemoryBackupTransport final : public BackupTransport {
 public:
  // Each direction of a connection buffers at most `pipe_bytes` (> 0).
  explicit InMemoryBackupTransport(size_t pipe_bytes = 256 << 10);
  ~InMemoryBackupTransport() override;
  InMemoryBackupTransport(const InMemoryBackupTransport&) = delete;
  InMemoryBackupTransport& operator=(const InMemoryBackupTransport&) = delete;

  // The faults of the connections dialed from now on.
  void set_faults(const InMemoryStreamFaults& faults);
  // The faults of the connections dialed to `address` from now on (instead of set_faults').
  void set_faults_to(const std::string& address, const InMemoryStreamFaults& faults);

  // The holder ends of connections (accepted or waiting to be) that are still open.
  int open_holder_streams() const;
  // Waits at most `timeout` until no holder end is open; true when none is.
  bool AwaitHolderStreamsClosed(absl::Duration timeout) const;

  // Addresses are "BIND_ADDRESS:PORT"; port 0 takes the next unused one.
  absl::StatusOr<std::unique_ptr<BackupListener>> Listen(
      const BackupListenOptions& options) override;
  absl::StatusOr<std::unique_ptr<BackupStream>> Dial(const BackupDialOptions& options) override;

  struct Network;  // the state the transport shares with its listeners and streams

 private:
  const std::shared_ptr<Network> network_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_IN_MEMORY_BACKUP_TRANSPORT_H_
