// BackupService: the listener thread and one thread per connection in front of a BackupHolder.
#include "sdk/checkpoint/backup_service.h"

#include <atomic>
#include <cstdio>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "sdk/checkpoint/backup_holder.h"
#include "sdk/checkpoint/backup_transport.h"
#include "sdk/checkpoint/backup_wire.h"
#include "sdk/checkpoint/held_backups.h"
#include "sdk/checkpoint/snapshot_arena.h"
#include "sdk/checkpoint/tcp_backup_transport.h"
#include "sdk/core/job_id.h"
#include "sdk/core/mutex.h"
#include "trainguard/env.h"

namespace trainguard {

using checkpoint_internal::BackupArenaName;
using checkpoint_internal::SnapshotArena;
using checkpoint_internal::WithContext;

namespace {

// How often the listener re-checks for shutdown and reaps finished connection threads.
constexpr absl::Duration kListenerPoll = absl::Milliseconds(500);
constexpr int kMaxConnections = 16;

}  // namespace

class BackupService::Impl {
 public:
  Impl(const BackupServiceOptions& options, std::unique_ptr<BackupListener> listener)
      : listener_(std::move(listener)), holder_(options, listener_->address()) {}

  ~Impl() {
    // Wakes Accept and every wait of the connections; each returns Cancelled.
    listener_->Shutdown();
    if (accept_thread_.joinable()) accept_thread_.join();
    MutexLock lock(&connections_mu_);
    for (Connection& c : connections_) c.thread.join();
    connections_.clear();
  }

  void StartListener() {
    accept_thread_ = std::thread([this] { ListenLoop(); });
  }

  std::string address() const { return listener_->address(); }
  std::vector<HeldBackup> Held() { return holder_.Held(); }

 private:
  struct Connection {
    std::thread thread;
    std::atomic<bool> done{false};
  };

  void ListenLoop() {
    while (true) {
      absl::StatusOr<std::unique_ptr<BackupStream>> stream =
          listener_->Accept(absl::Now() + kListenerPoll);
      ReapConnections();
      if (absl::IsCancelled(stream.status())) return;
      if (!stream.ok()) continue;  // no connection this time, or one that failed to arrive
      MutexLock lock(&connections_mu_);
      if (static_cast<int>(connections_.size()) >= kMaxConnections) {
        std::fprintf(
            stderr,
            "trainguard: %s: refused a connection from %s: %d connections are being served\n",
            holder_.name().c_str(), (*stream)->peer().c_str(), kMaxConnections);
        continue;  // the stream closes here
      }
      connections_.emplace_back();
      Connection* c = &connections_.back();
      c->thread = std::thread([this, c, stream = *std::move(stream)] {
        const absl::Status served = holder_.Serve(stream.get());
        // The status names this holder and the peer.
        if (!served.ok()) {
          std::fprintf(stderr, "trainguard: %s\n", std::string(served.message()).c_str());
        }
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

  // Destroyed after the holder and the threads: the accepted streams' waits use it.
  const std::unique_ptr<BackupListener> listener_;
  BackupHolder holder_;
  std::thread accept_thread_;

  Mutex connections_mu_;
  std::list<Connection> connections_ ABSL_GUARDED_BY(connections_mu_);
};

absl::StatusOr<std::unique_ptr<BackupService>> BackupService::Start(
    const BackupServiceOptions& options) {
  const std::string where = absl::StrFormat("backup holder rank %d (job %s, %s:%d)", options.rank,
                                            options.job_id, options.bind_address, options.port);
  if (absl::Status s = ValidateJobId(options.job_id); !s.ok()) return WithContext(s, where);
  if (options.io_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: io_timeout must be positive", where));
  }
  BackupTransport* transport =
      options.transport != nullptr ? options.transport : TcpBackupTransport::Get();
  BackupListenOptions listen;
  listen.bind_address = options.bind_address;
  listen.port = options.port;
  listen.idle_timeout = options.io_timeout;
  absl::StatusOr<std::unique_ptr<BackupListener>> listener = transport->Listen(listen);
  if (!listener.ok()) {
    return WithContext(listener.status(), absl::StrFormat("backup holder rank %d (job %s)",
                                                          options.rank, options.job_id));
  }
  auto impl = std::make_unique<Impl>(options, *std::move(listener));
  impl->StartListener();
  return std::unique_ptr<BackupService>(new BackupService(std::move(impl)));
}

BackupService::BackupService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BackupService::~BackupService() = default;

std::string BackupService::address() const { return impl_->address(); }
std::vector<HeldBackup> BackupService::Held() const { return impl_->Held(); }

std::string BackupService::ArenaName(std::string_view job_id, int source_rank) {
  return BackupArenaName(job_id, source_rank);
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

}  // namespace trainguard
