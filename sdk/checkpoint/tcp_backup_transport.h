// TcpBackupTransport: peer backups over TCP (out of band: never the training communicator).
// Blocking-with-deadline I/O on non-blocking sockets and poll(); a stream re-checks its cancel flag
// every few milliseconds while it waits, and the streams a listener accepted also wake on the
// listener's shutdown pipe. Addresses are "HOST:PORT" or "[V6]:PORT"; a dial may bind a numeric
// source address (the job's interface on a host with several). Stateless: thread-safe.
#ifndef TRAINGUARD_SDK_CHECKPOINT_TCP_BACKUP_TRANSPORT_H_
#define TRAINGUARD_SDK_CHECKPOINT_TCP_BACKUP_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "sdk/checkpoint/backup_transport.h"

namespace trainguard {

class TcpBackupTransport final : public BackupTransport {
 public:
  // The process's TCP transport; never destroyed.
  static TcpBackupTransport* Get();

  absl::StatusOr<std::unique_ptr<BackupListener>> Listen(
      const BackupListenOptions& options) override;
  absl::StatusOr<std::unique_ptr<BackupStream>> Dial(const BackupDialOptions& options) override;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_TCP_BACKUP_TRANSPORT_H_
