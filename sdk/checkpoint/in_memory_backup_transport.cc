#include "sdk/checkpoint/in_memory_backup_transport.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "sdk/core/mutex.h"

namespace trainguard {
namespace {

// The longest single wait on a condition (a wait with no deadline is a loop of these).
constexpr absl::Duration kLongestWait = absl::Seconds(1);
// Connections dialed to a listener and not accepted yet; more are refused.
constexpr size_t kBacklog = 64;

// The bytes one end sends to the other.
struct Pipe {
  std::string bytes;  // bytes[read_at..] are buffered
  size_t read_at = 0;
  uint64_t written = 0;  // in all: the offset of the next byte sent
  uint64_t read = 0;     // in all: the offset of the next byte received
  bool writer_closed = false;
  bool reader_closed = false;

  size_t buffered() const { return bytes.size() - read_at; }
};

// Both directions of one connection. The holder end is Cancelled once its listener shut down.
struct Connection {
  explicit Connection(const InMemoryStreamFaults& f) : faults(f) {}
  const InMemoryStreamFaults faults;
  Mutex mu;
  Pipe to_holder ABSL_GUARDED_BY(mu);
  Pipe to_client ABSL_GUARDED_BY(mu);
  bool dropped ABSL_GUARDED_BY(mu) = false;
  bool holder_stopping ABSL_GUARDED_BY(mu) = false;
};

struct ListenerState {
  explicit ListenerState(absl::Duration idle) : idle_timeout(idle) {}
  const absl::Duration idle_timeout;  // of the holder ends
  Mutex mu;
  bool shut ABSL_GUARDED_BY(mu) = false;
  std::deque<std::unique_ptr<BackupStream>> pending ABSL_GUARDED_BY(mu);
  std::vector<std::weak_ptr<Connection>> accepted ABSL_GUARDED_BY(mu);
};

}  // namespace

// Lock order: Network::mu, then a ListenerState's, then a Connection's.
struct InMemoryBackupTransport::Network {
  explicit Network(size_t bytes) : pipe_bytes(bytes) {}
  const size_t pipe_bytes;
  mutable Mutex mu;
  std::map<std::string, std::shared_ptr<ListenerState>> listeners ABSL_GUARDED_BY(mu);
  int next_port ABSL_GUARDED_BY(mu) = 1;
  int next_client ABSL_GUARDED_BY(mu) = 1;
  InMemoryStreamFaults faults ABSL_GUARDED_BY(mu);
  std::map<std::string, InMemoryStreamFaults> faults_to ABSL_GUARDED_BY(mu);  // by address
  int open_holder_streams ABSL_GUARDED_BY(mu) = 0;
};

namespace {

using Network = InMemoryBackupTransport::Network;

// One end of a connection. Not thread-safe (one user), as every BackupStream.
class InMemoryBackupStream final : public BackupStream {
 public:
  InMemoryBackupStream(std::shared_ptr<Network> network, std::shared_ptr<Connection> connection,
                       bool holder_end, std::string peer, absl::Time deadline,
                       absl::Duration idle_timeout, const std::atomic<bool>* cancel)
      : network_(std::move(network)),
        connection_(std::move(connection)),
        holder_end_(holder_end),
        peer_(std::move(peer)),
        deadline_(deadline),
        idle_timeout_(idle_timeout),
        cancel_(cancel),
        last_progress_(absl::Now()) {}

  ~InMemoryBackupStream() override {
    {
      MutexLock lock(&connection_->mu);
      Out().writer_closed = true;
      In().reader_closed = true;
    }
    if (holder_end_) {
      MutexLock lock(&network_->mu);
      --network_->open_holder_streams;
    }
  }

  const std::string& peer() const override { return peer_; }
  void set_deadline(absl::Time deadline) override { deadline_ = deadline; }

  absl::Status Send(const char* data, size_t n) override {
    Connection& c = *connection_;
    MutexLock lock(&c.mu);
    for (size_t done = 0; done < n;) {
      if (absl::Status s = Broken("sending to"); !s.ok()) return s;
      Pipe& out = Out();
      if (out.reader_closed) {
        return absl::UnavailableError(
            absl::StrFormat("sending to %s: connection reset by the peer", peer_));
      }
      const size_t room = network_->pipe_bytes - std::min(network_->pipe_bytes, out.buffered());
      if (room == 0) {
        if (absl::Status s = Wait("sending to",
                                  [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                    return Out().buffered() < network_->pipe_bytes ||
                                           Out().reader_closed || c.dropped || Stopping();
                                  });
            !s.ok()) {
          return s;
        }
        continue;
      }
      uint64_t k = std::min<uint64_t>(room, n - done);
      if (!holder_end_ && c.faults.drop_after_sent_bytes != InMemoryStreamFaults::kNever) {
        k = std::min<uint64_t>(k, c.faults.drop_after_sent_bytes - out.written);
      }
      if (out.read_at == out.bytes.size()) {
        out.bytes.clear();
        out.read_at = 0;
      }
      const size_t at = out.bytes.size();
      out.bytes.append(data + done, k);
      if (!holder_end_) Corrupt(c.faults.corrupt_sent_byte, out.written, &out.bytes[at], k);
      out.written += k;
      done += k;
      last_progress_ = absl::Now();
      if (!holder_end_ && out.written == c.faults.drop_after_sent_bytes) c.dropped = true;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> ReceiveSome(char* data, size_t max) override {
    Connection& c = *connection_;
    MutexLock lock(&c.mu);
    while (true) {
      Pipe& in = In();
      if (!holder_end_ && in.read >= c.faults.drop_after_received_bytes) {
        c.dropped = true;  // as if the holder died here: what it sent after is lost
        return absl::UnavailableError(
            absl::StrFormat("receiving from %s: connection dropped (after %d bytes to the client)",
                            peer_, in.read));
      }
      if (in.buffered() > 0 && max > 0) {
        size_t k = std::min(max, in.buffered());
        if (c.faults.max_receive_bytes > 0) k = std::min(k, c.faults.max_receive_bytes);
        if (!holder_end_ && c.faults.drop_after_received_bytes != InMemoryStreamFaults::kNever) {
          k = std::min<uint64_t>(k, c.faults.drop_after_received_bytes - in.read);
        }
        std::memcpy(data, in.bytes.data() + in.read_at, k);
        if (!holder_end_) Corrupt(c.faults.corrupt_received_byte, in.read, data, k);
        in.read_at += k;
        in.read += k;
        last_progress_ = absl::Now();
        // Frees room in a pipe that was full: a bounded buffer, as a socket's.
        if (in.read_at > network_->pipe_bytes) {
          in.bytes.erase(0, in.read_at);
          in.read_at = 0;
        }
        return k;
      }
      if (absl::Status s = Broken("receiving from"); !s.ok()) return s;
      if (in.writer_closed) {
        return absl::UnavailableError(
            absl::StrFormat("receiving from %s: connection closed by the peer", peer_));
      }
      if (absl::Status s = Wait("receiving from",
                                [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                  return In().buffered() > 0 || In().writer_closed || c.dropped ||
                                         Stopping();
                                });
          !s.ok()) {
        return s;
      }
    }
  }

 private:
  Pipe& Out() ABSL_EXCLUSIVE_LOCKS_REQUIRED(connection_->mu) {
    return holder_end_ ? connection_->to_client : connection_->to_holder;
  }
  Pipe& In() ABSL_EXCLUSIVE_LOCKS_REQUIRED(connection_->mu) {
    return holder_end_ ? connection_->to_holder : connection_->to_client;
  }
  bool Stopping() ABSL_EXCLUSIVE_LOCKS_REQUIRED(connection_->mu) {
    return holder_end_ && connection_->holder_stopping;
  }

  // Flips the byte at stream offset `target` if it is among the `n` bytes at `data`, which sit at
  // stream offset `offset`.
  static void Corrupt(uint64_t target, uint64_t offset, char* data, uint64_t n) {
    if (target >= offset && target - offset < n) data[target - offset] ^= 0x5a;
  }

  // The connection's injected drop, or its listener's shutdown.
  absl::Status Broken(const char* doing) ABSL_EXCLUSIVE_LOCKS_REQUIRED(connection_->mu) {
    if (connection_->dropped) {
      return absl::UnavailableError(
          absl::StrFormat("%s %s: connection dropped (after %d bytes from the client)", doing,
                          peer_, connection_->to_holder.written));
    }
    if (Stopping()) {
      return absl::CancelledError(
          absl::StrFormat("%s %s: the backup service is stopping", doing, peer_));
    }
    return absl::OkStatus();
  }

  // Until `ready()`, or one of the ends of a wait (sdk/checkpoint/backup_transport.h).
  template <typename Ready>
  absl::Status Wait(const char* doing, Ready ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(connection_->mu) {
    while (!ready()) {
      const absl::StatusOr<absl::Duration> wait = NextStreamWait(
          doing, peer_, absl::Now(), deadline_, last_progress_, idle_timeout_, cancel_);
      if (!wait.ok()) return wait.status();
      connection_->mu.AwaitWithTimeout(ready, std::min(*wait, kLongestWait));
    }
    return absl::OkStatus();
  }

  const std::shared_ptr<Network> network_;
  const std::shared_ptr<Connection> connection_;
  const bool holder_end_;
  const std::string peer_;
  absl::Time deadline_;
  const absl::Duration idle_timeout_;
  const std::atomic<bool>* const cancel_;
  absl::Time last_progress_;
};

class InMemoryBackupListener final : public BackupListener {
 public:
  InMemoryBackupListener(std::shared_ptr<Network> network, std::shared_ptr<ListenerState> state,
                         std::string address)
      : network_(std::move(network)), state_(std::move(state)), address_(std::move(address)) {}

  ~InMemoryBackupListener() override {
    Shutdown();
    MutexLock lock(&network_->mu);
    network_->listeners.erase(address_);
  }

  std::string address() const override { return address_; }

  absl::StatusOr<std::unique_ptr<BackupStream>> Accept(absl::Time deadline) override {
    MutexLock lock(&state_->mu);
    for (absl::Duration left = deadline - absl::Now();
         !state_->shut && state_->pending.empty() && left > absl::ZeroDuration();
         left = deadline - absl::Now()) {
      state_->mu.AwaitWithTimeout(
          [this]()
              ABSL_NO_THREAD_SAFETY_ANALYSIS { return state_->shut || !state_->pending.empty(); },
          std::min(left, kLongestWait));
    }
    if (state_->shut) {
      return absl::CancelledError(
          absl::StrFormat("backup listener %s: the backup service is stopping", address_));
    }
    if (state_->pending.empty()) {
      return absl::DeadlineExceededError(
          absl::StrFormat("backup listener %s: no connection", address_));
    }
    std::unique_ptr<BackupStream> stream = std::move(state_->pending.front());
    state_->pending.pop_front();
    return stream;
  }

  void Shutdown() override {
    std::deque<std::unique_ptr<BackupStream>> pending;  // closed after the lock is released
    MutexLock lock(&state_->mu);
    state_->shut = true;
    pending.swap(state_->pending);
    for (const std::weak_ptr<Connection>& weak : state_->accepted) {
      if (std::shared_ptr<Connection> c = weak.lock()) {
        MutexLock connection_lock(&c->mu);
        c->holder_stopping = true;
      }
    }
    state_->accepted.clear();
  }

 private:
  const std::shared_ptr<Network> network_;
  const std::shared_ptr<ListenerState> state_;
  const std::string address_;
};

}  // namespace

InMemoryBackupTransport::InMemoryBackupTransport(size_t pipe_bytes)
    : network_(std::make_shared<Network>(std::max<size_t>(pipe_bytes, 1))) {}

InMemoryBackupTransport::~InMemoryBackupTransport() = default;

void InMemoryBackupTransport::set_faults(const InMemoryStreamFaults& faults) {
  MutexLock lock(&network_->mu);
  network_->faults = faults;
}

void InMemoryBackupTransport::set_faults_to(const std::string& address,
                                            const InMemoryStreamFaults& faults) {
  MutexLock lock(&network_->mu);
  network_->faults_to[address] = faults;
}

int InMemoryBackupTransport::open_holder_streams() const {
  MutexLock lock(&network_->mu);
  return network_->open_holder_streams;
}

bool InMemoryBackupTransport::AwaitHolderStreamsClosed(absl::Duration timeout) const {
  MutexLock lock(&network_->mu);
  return network_->mu.AwaitWithTimeout(
      [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return network_->open_holder_streams == 0; },
      timeout);
}

absl::StatusOr<std::unique_ptr<BackupListener>> InMemoryBackupTransport::Listen(
    const BackupListenOptions& options) {
  MutexLock lock(&network_->mu);
  const int port = options.port != 0 ? options.port : network_->next_port++;
  const std::string address = absl::StrFormat("%s:%d", options.bind_address, port);
  if (network_->listeners.contains(address)) {
    return absl::UnavailableError(
        absl::StrFormat("%s: cannot listen: an in-memory listener is there already", address));
  }
  auto state = std::make_shared<ListenerState>(options.idle_timeout);
  network_->listeners[address] = state;
  return std::unique_ptr<BackupListener>(
      new InMemoryBackupListener(network_, std::move(state), address));
}

absl::StatusOr<std::unique_ptr<BackupStream>> InMemoryBackupTransport::Dial(
    const BackupDialOptions& options) {
  if (options.cancel != nullptr && options.cancel->load(std::memory_order_relaxed)) {
    return absl::CancelledError(
        absl::StrFormat("connecting to backup holder %s: cancelled", options.address));
  }
  MutexLock lock(&network_->mu);
  auto it = network_->listeners.find(options.address);
  if (it == network_->listeners.end()) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot connect to backup holder %s: no in-memory listener there", options.address));
  }
  ListenerState& listener = *it->second;
  MutexLock listener_lock(&listener.mu);
  if (listener.shut || listener.pending.size() >= kBacklog) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot connect to backup holder %s: %s", options.address,
        listener.shut ? "its listener shut down" : "its backlog of connections is full"));
  }
  auto to = network_->faults_to.find(options.address);
  auto connection =
      std::make_shared<Connection>(to != network_->faults_to.end() ? to->second : network_->faults);
  const std::string client = absl::StrFormat(
      "peer in-memory %s#%d", options.source_address.empty() ? "client" : options.source_address,
      network_->next_client++);
  listener.pending.push_back(std::make_unique<InMemoryBackupStream>(
      network_, connection, /*holder_end=*/true, client, absl::InfiniteFuture(),
      listener.idle_timeout, nullptr));
  ++network_->open_holder_streams;
  std::erase_if(listener.accepted, [](const std::weak_ptr<Connection>& c) { return c.expired(); });
  listener.accepted.push_back(connection);
  return std::unique_ptr<BackupStream>(
      new InMemoryBackupStream(network_, std::move(connection), /*holder_end=*/false,
                               absl::StrFormat("backup holder %s", options.address),
                               options.deadline, absl::InfiniteDuration(), options.cancel));
}

}  // namespace trainguard
