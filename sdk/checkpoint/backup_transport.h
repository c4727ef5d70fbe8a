// The transport under peer backups: a byte stream between a backup client and a holder, and the
// listener and dialer that make streams. The holder logic (BackupHolder) and the client calls
// (PushBackup, FetchBackup) see only these interfaces. TcpBackupTransport (tcp_backup_transport.h)
// carries backups between hosts; InMemoryBackupTransport (in_memory_backup_transport.h) connects a
// client and a holder in one process, with faults to inject, for tests. An RDMA or NCCL transport
// would be a third implementation. Every transport carries the same bytes (backup_wire.h).
//
// Every wait of a stream ends: by its deadline (DeadlineExceeded), after its idle timeout without
// progress (DeadlineExceeded), when its cancel flag is set (Cancelled), or when the listener that
// accepted it shuts down (Cancelled). A lost connection is Unavailable. Errors name the peer.
//
// Thread safety: a BackupStream has one user at a time. A BackupListener's Accept has one caller;
// its Shutdown may be called from any thread. A BackupTransport is thread-safe.
#ifndef TRAINGUARD_SDK_CHECKPOINT_BACKUP_TRANSPORT_H_
#define TRAINGUARD_SDK_CHECKPOINT_BACKUP_TRANSPORT_H_

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainguard {

// One connection. The destructor closes it: the peer's next receive is Unavailable.
class BackupStream {
 public:
  virtual ~BackupStream() = default;

  // Who is at the other end, for errors: "backup holder 10.0.0.2:7000", "peer 10.0.0.1:41712".
  virtual const std::string& peer() const = 0;
  // Sends all `n` bytes of `data`.
  virtual absl::Status Send(const char* data, size_t n) = 0;
  // Receives at least one byte and at most `max` into `data`; returns how many. Unavailable when
  // the peer closed the connection.
  virtual absl::StatusOr<size_t> ReceiveSome(char* data, size_t max) = 0;
  // The deadline of the waits from now on.
  virtual void set_deadline(absl::Time deadline) = 0;
};

struct BackupListenOptions {
  std::string bind_address = "127.0.0.1";
  int port = 0;  // 0: a free one
  // Of every accepted stream: a peer silent this long is dropped.
  absl::Duration idle_timeout = absl::InfiniteDuration();
};

class BackupListener {
 public:
  // Shuts down and closes the listening endpoint. REQUIRES: Accept is not running.
  virtual ~BackupListener() = default;

  // "ADDRESS:PORT" that the transport's Dial reaches.
  virtual std::string address() const = 0;
  // The next connection. Its streams have no deadline: their waits end after the idle timeout or
  // at Shutdown. DeadlineExceeded when none came by `deadline`, Cancelled after Shutdown; other
  // errors are of one connection attempt, and the next call may succeed.
  virtual absl::StatusOr<std::unique_ptr<BackupStream>> Accept(absl::Time deadline) = 0;
  // Wakes Accept and every wait of the streams this listener accepted: they are Cancelled from now
  // on. Thread-safe; a second call does nothing.
  virtual void Shutdown() = 0;
};

struct BackupDialOptions {
  std::string address;         // a listener's address()
  std::string source_address;  // the local end's address ("": the transport's choice)
  absl::Time deadline = absl::InfiniteFuture();  // of the connect and of every wait of the stream
  const std::atomic<bool>* cancel = nullptr;     // checked while connecting and in every wait
};

class BackupTransport {
 public:
  virtual ~BackupTransport() = default;

  // A listener on `options.bind_address`: InvalidArgument when the address is not one this
  // transport can bind, Unavailable when it cannot listen there.
  virtual absl::StatusOr<std::unique_ptr<BackupListener>> Listen(
      const BackupListenOptions& options) = 0;
  // A connection to the listener at `options.address`: Unavailable when none answers there,
  // InvalidArgument for an address this transport cannot parse, DeadlineExceeded, Cancelled.
  virtual absl::StatusOr<std::unique_ptr<BackupStream>> Dial(const BackupDialOptions& options) = 0;
};

// For transports: how long a stream's next wait may last at `now` (at most 20 ms while a cancel
// flag is given, so that it is seen), or the status that ends the wait by the rules above:
// Cancelled once `*cancel` is set, DeadlineExceeded once `deadline` passed or the peer was silent
// for `idle_timeout` since `last_progress`. `doing` and `peer` name the wait in the error
// ("receiving from", "backup holder 10.0.0.2:7000").
absl::StatusOr<absl::Duration> NextStreamWait(const char* doing, const std::string& peer,
                                              absl::Time now, absl::Time deadline,
                                              absl::Time last_progress,
                                              absl::Duration idle_timeout,
                                              const std::atomic<bool>* cancel);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_BACKUP_TRANSPORT_H_
