// TcpStore: trainguard's embedded default Store. A TcpStoreServer holds the keys of one or more
// jobs in memory and serves them on one event-loop thread (epoll, non-blocking sockets); a
// TcpStore is a client of it over TCP.
//
// A client proves that it knows its job's token by a challenge-response (HMAC-SHA256 over random
// nonces of both sides and the job id), and the server proves the same to the client, so the token
// never crosses the network. Values are NOT encrypted: run the server on a trusted network (see
// docs/STORE.md for the wire protocol and the security model). Every key a client uses lives in
// its job's namespace: clients of job A never see the keys, nor the fence, of job B.
//
// The server never blocks on one client: a frame that is malformed, larger than the limit,
// unauthenticated or not understood gets an error response (where one can be sent) and the
// connection is closed; a client that does not read its responses is disconnected once its
// pending output exceeds a bound; a client that does not authenticate within auth_timeout is
// dropped. Wait parks the request on the server, which answers when every key exists or when the
// wait's deadline passes.
//
// The client reconnects by itself: when the connection breaks, a call reconnects with bounded
// exponential backoff within its own timeout and retries the operation if it is idempotent (every
// operation except Add and CompareAndSet) or if the request had not been sent yet. An Add or
// CompareAndSet that was sent and then lost its connection fails with Unavailable "... outcome
// unknown": the caller decides (e.g. by reading the key). A Delete retried that way may report
// false for a key its first attempt deleted.
//
// Thread safety: TcpStore is thread-safe. A connection carries one request at a time; a call takes
// an idle connection, or opens one when every connection is busy, up to
// TcpStoreOptions::max_connections for the requests answered at once; beyond it a call waits for
// the first connection to come free. One thread alone uses one connection; a Wait, WaitAny or
// WaitAndRead parked on the server holds a connection of its own outside that cap, so a long wait
// never holds up another thread's calls behind it (a rank's heartbeats, its votes)
// (sdk/rendezvous/connection_pool.h). TcpStoreServer's methods may be called from any thread.
#ifndef TRAINGUARD_SDK_RENDEZVOUS_TCP_STORE_H_
#define TRAINGUARD_SDK_RENDEZVOUS_TCP_STORE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/core/mutex.h"
#include "sdk/rendezvous/connection_pool.h"
#include "trainguard/store.h"

namespace trainguard::proto {
class StoreResponse;
}  // namespace trainguard::proto

namespace trainguard {

struct TcpStoreServerOptions {
  // The address to listen on: a numeric IPv4 or IPv6 address ("0.0.0.0" for every interface).
  std::string host = "127.0.0.1";
  // 0 picks a free ephemeral port; TcpStoreServer::port() says which.
  int port = 0;
  // The token clients of any job not listed in `job_tokens` must prove. Empty: only the jobs in
  // `job_tokens` are served. At least one token must be given.
  std::string job_token;
  // Per-job tokens (job id -> token), to keep the jobs sharing one server apart.
  std::map<std::string, std::string> job_tokens;
  // The largest frame (length prefix excluded) accepted or sent. A larger frame closes the
  // connection with an error before any of it is buffered.
  uint32_t max_frame_bytes = 64u << 20;
  // A connection that has not authenticated after this long is closed.
  absl::Duration auth_timeout = absl::Seconds(10);
  // A client whose unsent responses exceed this many bytes is disconnected. Must be at least
  // max_frame_bytes + 4, so that any one response fits.
  size_t max_pending_write_bytes = size_t{128} << 20;
  // Connections beyond this many are closed as soon as they are accepted.
  int max_connections = 16384;
  // The listen(2) backlog (the kernel caps it at net.core.somaxconn).
  int listen_backlog = 4096;
  // How long the event loop, once idle, polls for the next request before it sleeps: a client's
  // next request of a chain then finds it awake instead of paying for waking its CPU. Withdrawn
  // while it keeps finding nothing (sdk/rendezvous/busy_poll.h), so an idle server costs little;
  // zero never polls.
  absl::Duration busy_poll = absl::Microseconds(20);
};

// Counters of a running server, for tests and operations. A snapshot; the fields are not
// updated together.
struct TcpStoreServerStats {
  int64_t connections_accepted = 0;
  int64_t connections_open = 0;
  int64_t authentication_failures = 0;
  // Connections closed for a malformed, oversized, unauthenticated or unknown message, for not
  // reading their responses, or for not authenticating in time.
  int64_t protocol_errors = 0;
  // Connections closed at once because max_connections were open or file descriptors ran out.
  int64_t connections_refused = 0;
  int64_t requests_served = 0;
  // The bytes read from and written to the clients' sockets, framing and handshakes included:
  // what the store's traffic costs the server (a simulator's per-rank figures divide them).
  int64_t bytes_received = 0;
  int64_t bytes_sent = 0;
  // Waits parked now, waiting for their keys.
  int64_t waits_parked = 0;
  // Open connections in the control lane (TcpStoreOptions::control): read ahead of the others.
  int64_t control_connections = 0;
  // The latest of the errors counted above, naming the peer (and its job once known).
  std::string last_error;
};

// The server: owns a listening socket and the event-loop thread. Not copyable or movable.
class TcpStoreServer {
 public:
  // Answers to parked waits (woken by a write, or run out) sent per turn of the event loop,
  // between its reads: a write that wakes 16,384 waits (a third of a second of sends on loopback),
  // or their deadlines passing together, does not hold up the other clients' requests until the
  // last of them is sent; the control lane's are read at every turn. Fewer per turn make the
  // fan-out itself slower (the woken ranks' next requests are read in between): at 16,384 ranks
  // generation 0 formed in 0.53-0.65 s at 2,048 a turn, 0.54-0.64 s at 4,096 and 0.51-0.56 s
  // unbounded, where a lost host's recovery had longer tails (bench_simulate, docs/PERFORMANCE.md).
  static constexpr size_t kCompletionsPerTurn = 4096;

  // Binds, listens and starts the event-loop thread. InvalidArgument for bad options (naming the
  // option), Unavailable when the address cannot be bound (naming it).
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(
      const TcpStoreServerOptions& options);

  // Stops the event loop, joins its thread and closes every connection. Parked waits are not
  // answered; their clients see the connection close.
  ~TcpStoreServer();

  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // The port the server listens on (the chosen one when options.port was 0).
  int port() const;
  // "host:port".
  std::string address() const;
  TcpStoreServerStats stats() const;

 private:
  class EventLoop;
  explicit TcpStoreServer(std::unique_ptr<EventLoop> loop);

  std::unique_ptr<EventLoop> loop_;
};

struct TcpStoreOptions {
  // The server's address: a host name or a numeric address.
  std::string host = "127.0.0.1";
  int port = 0;
  // The local address this client's connections leave from: a numeric IPv4 or IPv6 address of
  // this host, bound (port 0) before connecting. Empty: the kernel's choice. Simulated hosts that
  // share a network namespace each have their own (e.g. 127.0.1.N), so that a test can cut one
  // host off by address.
  std::string source_address;
  // The job whose namespace this client reads and writes: a job id as Options::job_id (1 to 200
  // of A-Z a-z 0-9 . _ -).
  std::string job_id;
  std::string job_token;
  // How long Connect may take to connect and authenticate.
  absl::Duration connect_timeout = absl::Seconds(30);
  // Reconnection backoff: starts at the first, doubles, never exceeds the second; always bounded
  // by the calling operation's timeout.
  absl::Duration reconnect_backoff_initial = absl::Milliseconds(10);
  absl::Duration reconnect_backoff_max = absl::Seconds(1);
  // The largest response frame this client accepts.
  uint32_t max_frame_bytes = 64u << 20;
  // How long a call polls for its answer before its thread sleeps, so that a quick answer does
  // not pay for waking the thread's CPU. One call of a process polls at a time (the others sleep
  // at once), and polling is withdrawn while answers keep coming later than this (e.g. from a
  // loaded server; sdk/rendezvous/busy_poll.h); never used for Wait. Zero never polls. Short: on
  // a busy host a poll that misses holds a CPU its peer may need for the whole budget.
  absl::Duration busy_poll = absl::Microseconds(20);
  // The most connections this client holds for its requests answered at once (all but the waits):
  // a call that finds them all busy waits, within its timeout and in arrival order, for the first
  // to come free, rather than open another (DeadlineExceeded naming this option when none does).
  // Waits (Wait, WaitAny, WaitAndRead) are parked on the server for as long as their keys take, so
  // each holds a connection of its own beyond the cap: counted in it, they would hold up the short
  // calls (a rank's heartbeats behind its generation watch) and one another. A client thus holds
  // at most this many connections plus one per wait in flight. At least 1.
  int max_connections = 4;
  // A client of the job's control plane (its coordinator and host agents; the launcher's agents
  // set it): the server reads its requests ahead of the ranks' in each turn of its loop
  // (ClientHello.control), so that its heartbeat reads, declarations and publications do not
  // queue behind a burst of the ranks' requests. Not for ranks: a lane that every rank takes
  // serves nobody first.
  bool control = false;
};

class TcpStore final : public Store {
 public:
  // Connects and authenticates within options.connect_timeout. Unavailable (naming host:port)
  // when the server cannot be reached; Unauthenticated or PermissionDenied (naming the job) when
  // the tokens disagree or the server does not serve the job; InvalidArgument for bad options (a
  // source_address that is not numeric, naming it); Unavailable naming the source address when it
  // cannot be bound (not an address of this host).
  static absl::StatusOr<std::unique_ptr<TcpStore>> Connect(const TcpStoreOptions& options);

  ~TcpStore() override;

  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  absl::Status Set(std::string_view key, std::string_view value, absl::Duration timeout) override;
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta, absl::Duration timeout) override;
  // One round trip: the server applies both writes together, or neither.
  absl::StatusOr<int64_t> SetAndAdd(std::string_view set_key, std::string_view value,
                                    std::string_view add_key, int64_t delta,
                                    absl::Duration timeout) override;
  // One round trip: the server creates the key and adds together, or does neither.
  absl::StatusOr<bool> CreateAndAdd(std::string_view key, std::string_view value,
                                    std::string_view add_key, int64_t delta,
                                    absl::Duration timeout) override;
  absl::StatusOr<CompareAndSetResult> CompareAndSet(std::string_view key,
                                                    const std::optional<std::string>& expected,
                                                    std::string_view desired,
                                                    absl::Duration timeout) override;
  absl::StatusOr<bool> Delete(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<std::vector<std::optional<std::string>>> MultiGet(
      const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<std::vector<std::optional<AgedValue>>> MultiGetWithAges(
      const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<std::vector<std::string>> ListKeys(std::string_view prefix,
                                                    absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<size_t> WaitAny(const std::vector<std::string>& keys,
                                 absl::Duration timeout) override;
  // One round trip: the server reads `read` in the pass that finds a key of `awaited` present.
  absl::StatusOr<AnyKeyAndValues> WaitAnyAndRead(const std::vector<std::string>& awaited,
                                                 const std::vector<std::string>& read,
                                                 absl::Duration timeout) override;
  // One round trip: the server reads `read` in the pass that finds `awaited` present.
  absl::StatusOr<std::vector<std::optional<std::string>>> WaitAndRead(
      const std::vector<std::string>& awaited, const std::vector<std::string>& read,
      absl::Duration timeout) override;
  absl::Status RaiseFence(int64_t generation, absl::Duration timeout) override;
  // One round trip: the server applies the writes in one pass (WriteBatchOp).
  absl::StatusOr<std::vector<CompareAndSetResult>> WriteBatch(const std::vector<BatchWrite>& writes,
                                                              absl::Duration timeout) override;
  void SetWriterGeneration(int64_t generation) override;

  // "host:port" of the server.
  std::string address() const;

 private:
  class Connection;
  class Lease;  // one call on a connection taken from the pool and given back (tcp_store_client.cc)
  explicit TcpStore(const TcpStoreOptions& options);
  // One MultiGet request (with the keys' ages, or not), its answer checked: as many values as
  // keys, and as many ages when asked (Unimplemented when the server gave none).
  absl::StatusOr<proto::StoreResponse> CallMultiGet(const std::vector<std::string>& keys,
                                                    bool with_ages, absl::Duration timeout);
  // The values of `read` a Wait or WaitAny answered with (`response`); read with a MultiGet by
  // `deadline` when the server predates the wait's read_keys and answered none.
  absl::StatusOr<std::vector<std::optional<std::string>>> ValuesReadWith(
      proto::StoreResponse& response, const std::vector<std::string>& read, absl::Time deadline,
      const std::string& what);

  const TcpStoreOptions options_;
  std::atomic<int64_t> generation_{kUnfenced};  // what SetWriterGeneration set; every request
                                                // carries it
  std::unique_ptr<ConnectionPool<Connection>> pool_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RENDEZVOUS_TCP_STORE_H_
