// TcpStoreServer: one event-loop thread (level-triggered epoll) over non-blocking sockets. The
// protocol lives in StoreSession and the data in StoreState; this file moves bytes, keeps
// deadlines (handshakes, lingering closes, parked Waits) and never blocks on a peer. Once idle it
// polls for the next event briefly before it sleeps (busy_poll.h).
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "sdk/core/errno_error.h"
#include "sdk/core/job_id.h"
#include "sdk/core/mutex.h"
#include "sdk/core/socket_address.h"
#include "sdk/rendezvous/busy_poll.h"
#include "sdk/rendezvous/store_frame.h"
#include "sdk/rendezvous/store_session.h"
#include "sdk/rendezvous/store_state.h"
#include "sdk/rendezvous/tcp_store.h"
#include "trainguard/clock.h"

namespace trainguard {
namespace {

constexpr uint64_t kListenerTag = 0;
constexpr uint64_t kWakeTag = 1;
// The control lane's epoll set, itself in the main one: readable when a control connection is.
constexpr uint64_t kControlTag = 2;
constexpr uint64_t kFirstConnectionId = 3;
constexpr size_t kReadChunkBytes = 64 << 10;
// Bytes read from one connection per readiness event, so one busy client cannot starve others.
constexpr size_t kReadBudgetBytes = 1 << 20;
constexpr int kMaxEvents = 256;
// How long a closing connection may take to receive its last frame and hang up.
constexpr absl::Duration kLingerTimeout = absl::Seconds(2);
// The StoreResponse inside a ServerMessage costs a few bytes of envelope.
constexpr uint32_t kEnvelopeBytes = 16;

absl::Time MonotonicNow() { return absl::FromUnixNanos(Clock::Real()->MonotonicNanos()); }

absl::Status ValidateOptions(const TcpStoreServerOptions& options) {
  if (options.job_token.empty() && options.job_tokens.empty()) {
    return absl::InvalidArgumentError(
        "TcpStoreServerOptions: no token given (job_token and job_tokens are both empty); the "
        "store server does not serve unauthenticated clients");
  }
  for (const auto& [job, token] : options.job_tokens) {
    if (absl::Status s = ValidateJobId(job); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("TcpStoreServerOptions.job_tokens: ", s.message()));
    }
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("TcpStoreServerOptions.job_tokens: the token of job '", job, "' is empty"));
    }
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("TcpStoreServerOptions.port %d is not in [0, 65535]", options.port));
  }
  if (options.max_frame_bytes < 1024) {
    return absl::InvalidArgumentError(
        absl::StrFormat("TcpStoreServerOptions.max_frame_bytes %d is below the minimum of 1024",
                        options.max_frame_bytes));
  }
  if (options.max_pending_write_bytes <
      size_t{options.max_frame_bytes} + store_wire::kFrameHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "TcpStoreServerOptions.max_pending_write_bytes %d is below max_frame_bytes + 4 = %d: "
        "one response would not fit",
        options.max_pending_write_bytes,
        size_t{options.max_frame_bytes} + store_wire::kFrameHeaderBytes));
  }
  if (options.auth_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpStoreServerOptions.auth_timeout must be positive, not ",
                     absl::FormatDuration(options.auth_timeout)));
  }
  if (options.busy_poll < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpStoreServerOptions.busy_poll must not be negative, not ",
                     absl::FormatDuration(options.busy_poll)));
  }
  if (options.max_connections <= 0 || options.listen_backlog <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "TcpStoreServerOptions: max_connections (%d) and listen_backlog (%d) must be positive",
        options.max_connections, options.listen_backlog));
  }
  return absl::OkStatus();
}

// A listening socket bound to host:port (numeric host), non-blocking.
absl::StatusOr<int> Listen(const TcpStoreServerOptions& options) {
  const std::string where = absl::StrCat(options.host, ":", options.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = absl::StrCat(options.port);
  if (int rc = getaddrinfo(options.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store server address ", where, " is not a numeric address: ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addresses(found, &freeaddrinfo);
  int fd = socket(found->ai_family, found->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                  found->ai_protocol);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("socket() for the store server at ", where, ": ", ErrnoText(errno)));
  }
  const int one = 1;
  // A restarted server can bind its port while connections of the old one are in TIME_WAIT.
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, found->ai_addr, found->ai_addrlen) != 0 || listen(fd, options.listen_backlog) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", where, " for the store server: ", ErrnoText(err)));
  }
  return fd;
}

}  // namespace

// Owns the listening socket, the epoll set, the connections, the StoreState and the thread that
// drives them. Everything but the constructor, the destructor and the accessors runs on that
// thread; stats() reads atomics and a mutex-guarded string.
class TcpStoreServer::EventLoop {
 public:
  static absl::StatusOr<std::unique_ptr<EventLoop>> Create(const TcpStoreServerOptions& options);

  ~EventLoop() {
    stop_.store(true);
    const uint64_t one = 1;
    // The eventfd counter cannot overflow with one write; the loop wakes on it.
    (void)!write(wake_fd_, &one, sizeof(one));
    if (thread_.joinable()) thread_.join();
    for (auto& [id, connection] : connections_) close(connection->fd);
    close(listen_fd_);
    close(epoll_fd_);
    close(control_fd_);
    close(wake_fd_);
    if (reserve_fd_ >= 0) close(reserve_fd_);
  }

  void StartThread() {
    thread_ = std::thread([this] { Run(); });
  }

  int port() const { return port_; }
  std::string address() const { return absl::StrCat(options_.host, ":", port_); }

  TcpStoreServerStats stats() const {
    TcpStoreServerStats s;
    s.connections_accepted = accepted_.load();
    s.connections_open = open_.load();
    s.authentication_failures = authentication_failures_.load();
    s.protocol_errors = protocol_errors_.load();
    s.connections_refused = connections_refused_.load();
    s.requests_served = requests_served_.load();
    s.bytes_received = bytes_received_.load();
    s.bytes_sent = bytes_sent_.load();
    s.waits_parked = waits_parked_.load();
    s.control_connections = control_open_.load();
    MutexLock lock(&last_error_mu_);
    s.last_error = last_error_;
    return s;
  }

 private:
  enum class Closing { kNo, kFlushing, kLingering };

  struct Connection {
    Connection(int fd, uint64_t id, std::string peer, const StoreAuthPolicy* auth,
               StoreState* state, uint32_t max_frame_bytes)
        : fd(fd), session(id, std::move(peer), auth, state, max_frame_bytes) {}

    const int fd;
    StoreSession session;
    std::string out;
    size_t out_offset = 0;
    bool want_write = false;
    Closing closing = Closing::kNo;
    bool dead = false;
    // The epoll set it is in: the main one, or the control lane's once it said it is a control
    // connection (ClientHello.control).
    int epoll_fd = -1;
    // The handshake deadline until authenticated; the linger deadline while closing.
    std::optional<absl::Time> deadline;

    size_t pending() const { return out.size() - out_offset; }
  };

  EventLoop(const TcpStoreServerOptions& options, int listen_fd, int epoll_fd, int control_fd,
            int wake_fd, int port)
      : options_(options),
        state_(options.max_frame_bytes - kEnvelopeBytes),
        listen_fd_(listen_fd),
        epoll_fd_(epoll_fd),
        control_fd_(control_fd),
        wake_fd_(wake_fd),
        port_(port),
        read_buffer_(kReadChunkBytes),
        busy_poll_(options.busy_poll) {
    auth_.default_token = options.job_token;
    for (const auto& [job, token] : options.job_tokens) auth_.job_tokens.emplace(job, token);
    reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }

  void Run();
  int WaitForEvents(std::vector<epoll_event>& events);
  void AcceptAll(absl::Time now);
  void OnEvent(Connection& c, uint32_t events, absl::Time now);
  // Moves an authenticated control connection into the control lane's set.
  void JoinControlLane(Connection& c);
  // Reads the control lane's ready connections (without waiting).
  void HandleControlLane(absl::Time now);
  void OnReadable(Connection& c, absl::Time now);
  void Feed(Connection& c, std::string_view bytes, absl::Time now);
  // The answers to parked waits the state finished (woken or expired) join unsent_, in order;
  // DeliverCompletions sends up to TcpStoreServer::kCompletionsPerTurn of them.
  void QueueCompletions();
  void DeliverCompletions();
  void Flush(Connection& c);
  void BeginClose(Connection& c, absl::Time now);
  void SetDeadline(Connection& c, std::optional<absl::Time> deadline);
  void UpdateInterest(Connection& c);
  void MarkDead(Connection& c);
  void ReapDead();
  void ExpireDeadlines(absl::Time now);
  int EpollTimeoutMs(absl::Time now) const;
  enum class ErrorKind { kProtocol, kAuthentication, kRefused, kInternal };
  void RecordError(std::string error, ErrorKind kind);
  Connection* Find(uint64_t id) {
    auto it = connections_.find(id);
    return it == connections_.end() ? nullptr : it->second.get();
  }

  const TcpStoreServerOptions options_;
  StoreAuthPolicy auth_;
  StoreState state_;
  const int listen_fd_;
  const int epoll_fd_;
  // The control lane: the connections of the job's coordinator and agents (ClientHello.control),
  // whose requests each turn of the loop reads before the others', so that a burst of the ranks'
  // requests (16,384 of them queue for a third of a second) does not delay a host's declaration.
  const int control_fd_;
  const int wake_fd_;
  const int port_;
  // Kept open so that, out of file descriptors, the loop can still accept and close a connection
  // instead of spinning on a listener that stays readable.
  int reserve_fd_ = -1;
  std::vector<char> read_buffer_;
  BusyPoll busy_poll_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Connection>> connections_;
  std::set<std::pair<absl::Time, uint64_t>> deadlines_;
  std::vector<uint64_t> dead_;
  std::deque<StoreState::Completion> unsent_;
  std::vector<epoll_event> control_events_ = std::vector<epoll_event>(kMaxEvents);
  uint64_t next_id_ = kFirstConnectionId;
  std::atomic<bool> stop_{false};
  std::thread thread_;

  std::atomic<int64_t> accepted_{0};
  std::atomic<int64_t> open_{0};
  std::atomic<int64_t> authentication_failures_{0};
  std::atomic<int64_t> protocol_errors_{0};
  std::atomic<int64_t> connections_refused_{0};
  std::atomic<int64_t> requests_served_{0};
  std::atomic<int64_t> bytes_received_{0};
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> waits_parked_{0};
  std::atomic<int64_t> control_open_{0};
  // The one piece of the loop's state that other threads read.
  mutable Mutex last_error_mu_;
  std::string last_error_ ABSL_GUARDED_BY(last_error_mu_);
};

absl::StatusOr<std::unique_ptr<TcpStoreServer::EventLoop>> TcpStoreServer::EventLoop::Create(
    const TcpStoreServerOptions& options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  absl::StatusOr<int> listen_fd = Listen(options);
  if (!listen_fd.ok()) return listen_fd.status();
  const int port = BoundPort(*listen_fd);
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  const int control_fd = epoll_create1(EPOLL_CLOEXEC);
  const int wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd < 0 || control_fd < 0 || wake_fd < 0) {
    const int err = errno;
    close(*listen_fd);
    if (epoll_fd >= 0) close(epoll_fd);
    if (control_fd >= 0) close(control_fd);
    if (wake_fd >= 0) close(wake_fd);
    return absl::InternalError(
        absl::StrCat("epoll/eventfd for the store server: ", ErrnoText(err)));
  }
  epoll_event listener{.events = EPOLLIN, .data = {.u64 = kListenerTag}};
  epoll_event wake{.events = EPOLLIN, .data = {.u64 = kWakeTag}};
  epoll_ctl(epoll_fd, EPOLL_CTL_ADD, *listen_fd, &listener);
  epoll_event control{.events = EPOLLIN, .data = {.u64 = kControlTag}};
  epoll_ctl(epoll_fd, EPOLL_CTL_ADD, wake_fd, &wake);
  epoll_ctl(epoll_fd, EPOLL_CTL_ADD, control_fd, &control);
  return std::unique_ptr<EventLoop>(
      new EventLoop(options, *listen_fd, epoll_fd, control_fd, wake_fd, port));
}

void TcpStoreServer::EventLoop::Run() {
  std::vector<epoll_event> events(kMaxEvents);
  while (!stop_.load()) {
    const int n = WaitForEvents(events);
    if (n < 0) {
      if (errno == EINTR) continue;
      RecordError(
          absl::StrCat("epoll_wait failed; the store server stops serving: ", ErrnoText(errno)),
          ErrorKind::kInternal);
      return;
    }
    absl::Time now = MonotonicNow();
    // The control lane first, whether or not its set's readiness is among the events.
    HandleControlLane(now);
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kControlTag) continue;
      if (tag == kWakeTag) {
        uint64_t count;
        (void)!read(wake_fd_, &count, sizeof(count));
      } else if (tag == kListenerTag) {
        AcceptAll(now);
      } else if (Connection* c = Find(tag); c != nullptr && !c->dead) {
        OnEvent(*c, events[i].events, now);
      }
      ReapDead();
    }
    now = MonotonicNow();
    state_.ExpireWaits(now);
    DeliverCompletions();
    ExpireDeadlines(now);
    ReapDead();
    waits_parked_.store(static_cast<int64_t>(state_.parked_waits()));
  }
}

// epoll_wait until the next deadline, polled without sleeping for busy_poll_'s budget first.
int TcpStoreServer::EventLoop::WaitForEvents(std::vector<epoll_event>& events) {
  const int timeout_ms = EpollTimeoutMs(MonotonicNow());
  if (timeout_ms != 0) {
    absl::Duration budget = busy_poll_.NextWait();
    if (timeout_ms > 0) budget = std::min(budget, absl::Milliseconds(timeout_ms));
    if (budget > absl::ZeroDuration()) {
      int n = 0;
      const bool answered = PollFor(budget, [&] {
        n = epoll_wait(epoll_fd_, events.data(), kMaxEvents, 0);
        return n != 0;
      });
      busy_poll_.Record(answered);
      if (answered) return n;
    }
  }
  return epoll_wait(epoll_fd_, events.data(), kMaxEvents, timeout_ms);
}

int TcpStoreServer::EventLoop::EpollTimeoutMs(absl::Time now) const {
  if (!unsent_.empty()) return 0;  // answers still to send: only a look for new requests
  std::optional<absl::Time> next = state_.NextWaitDeadline();
  if (!deadlines_.empty() && (!next.has_value() || deadlines_.begin()->first < *next)) {
    next = deadlines_.begin()->first;
  }
  if (!next.has_value()) return -1;
  if (*next <= now) return 0;
  // Rounded up: waking before the deadline would only loop back here.
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(*next - now, absl::Milliseconds(1)));
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

void TcpStoreServer::EventLoop::AcceptAll(absl::Time now) {
  while (true) {
    sockaddr_storage addr{};
    socklen_t addr_len = sizeof(addr);
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &addr_len,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if ((errno == EMFILE || errno == ENFILE) && reserve_fd_ >= 0) {
        // Shed the connection rather than leave it in the backlog (and the listener readable).
        close(reserve_fd_);
        const int shed = accept(listen_fd_, nullptr, nullptr);
        if (shed >= 0) close(shed);
        reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
        RecordError("out of file descriptors: a new store connection was refused",
                    ErrorKind::kRefused);
        continue;
      }
      return;  // EAGAIN, or an error the next readiness will report again
    }
    accepted_.fetch_add(1);
    if (connections_.size() >= static_cast<size_t>(options_.max_connections)) {
      close(fd);
      RecordError(
          absl::StrFormat("connection from %s refused: %d connections are open (the limit)",
                          FormatSockaddr(addr), connections_.size()),
          ErrorKind::kRefused);
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    const uint64_t id = next_id_++;
    auto connection =
        std::make_unique<Connection>(fd, id, FormatSockaddr(addr),
                                     &auth_, &state_, options_.max_frame_bytes);
    epoll_event interest{.events = EPOLLIN, .data = {.u64 = id}};
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &interest) != 0) {
      close(fd);
      continue;
    }
    connection->epoll_fd = epoll_fd_;
    Connection& c = *connection;
    connections_.emplace(id, std::move(connection));
    open_.fetch_add(1);
    SetDeadline(c, now + options_.auth_timeout);
  }
}

void TcpStoreServer::EventLoop::OnEvent(Connection& c, uint32_t events, absl::Time now) {
  if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0) OnReadable(c, now);
  if (!c.dead && (events & EPOLLOUT) != 0) Flush(c);
}

void TcpStoreServer::EventLoop::OnReadable(Connection& c, absl::Time now) {
  size_t budget = kReadBudgetBytes;
  while (budget > 0 && !c.dead) {
    const ssize_t n = recv(c.fd, read_buffer_.data(), read_buffer_.size(), 0);
    if (n > 0) {
      bytes_received_.fetch_add(n, std::memory_order_relaxed);
      budget -= std::min(budget, static_cast<size_t>(n));
      // A closing connection's further bytes are read only to be dropped.
      // The instant after the bytes arrived, not the loop's: a write is stamped no earlier than
      // it reached the server (MultiGetWithAges' ages never exceed the writer's silence).
      if (c.closing == Closing::kNo) {
        Feed(c, std::string_view(read_buffer_.data(), n), std::max(now, MonotonicNow()));
      }
      // A short read emptied the socket: another recv would only say EAGAIN. Bytes (or an end of
      // stream) arriving since keep the socket readable for the next epoll_wait (level-triggered).
      if (static_cast<size_t>(n) < read_buffer_.size()) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // End of stream or a reset: send what is queued if the socket still takes it, then close.
    if (n == 0 && c.closing == Closing::kNo && c.pending() > 0) Flush(c);
    MarkDead(c);
    return;
  }
  if (!c.dead) Flush(c);
}

void TcpStoreServer::EventLoop::Feed(Connection& c, std::string_view bytes, absl::Time now) {
  const bool was_authenticated = c.session.authenticated();
  const int64_t executed_before = c.session.requests_executed();
  const StoreSession::Verdict verdict = c.session.OnBytes(bytes, now, &c.out);
  requests_served_.fetch_add(c.session.requests_executed() - executed_before);
  if (!was_authenticated && c.session.authenticated()) {
    SetDeadline(c, std::nullopt);
    if (c.session.control()) JoinControlLane(c);
  }
  // A write may have answered Waits parked by other connections: sent from the loop, a turn's
  // share at a time.
  QueueCompletions();
  if (verdict != StoreSession::Verdict::kKeepOpen) {
    RecordError(c.session.close_reason(),
                verdict == StoreSession::Verdict::kCloseAuthenticationFailure
                    ? ErrorKind::kAuthentication
                    : ErrorKind::kProtocol);
    BeginClose(c, now);
    return;
  }
  if (c.pending() > options_.max_pending_write_bytes) {
    RecordError(absl::StrFormat("client %s does not read its responses: %d bytes unsent (limit "
                                "%d); disconnected",
                                c.session.peer(), c.pending(), options_.max_pending_write_bytes),
                ErrorKind::kProtocol);
    MarkDead(c);
  }
}

void TcpStoreServer::EventLoop::QueueCompletions() {
  // Published before the answers go out, so that a client holding its answer never reads its wait
  // still counted as parked (stats(), read on other threads).
  waits_parked_.store(static_cast<int64_t>(state_.parked_waits()));
  for (StoreState::Completion& completion : state_.TakeCompletions()) {
    unsent_.push_back(std::move(completion));
  }
}

void TcpStoreServer::EventLoop::DeliverCompletions() {
  QueueCompletions();
  for (size_t sent = 0; sent < TcpStoreServer::kCompletionsPerTurn && !unsent_.empty(); ++sent) {
    StoreState::Completion completion = std::move(unsent_.front());
    unsent_.pop_front();
    Connection* c = Find(completion.session_id);
    if (c == nullptr || c->dead || c->closing != Closing::kNo) continue;
    c->session.AppendResponse(completion.response, &c->out);
    if (c->pending() > options_.max_pending_write_bytes) {
      RecordError(
          absl::StrFormat("client %s does not read its responses: %d bytes unsent "
                          "(limit %d); disconnected",
                          c->session.peer(), c->pending(), options_.max_pending_write_bytes),
          ErrorKind::kProtocol);
      MarkDead(*c);
      continue;
    }
    Flush(*c);
  }
}

void TcpStoreServer::EventLoop::Flush(Connection& c) {
  while (c.pending() > 0) {
    const ssize_t n = send(c.fd, c.out.data() + c.out_offset, c.pending(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes_sent_.fetch_add(n, std::memory_order_relaxed);
      c.out_offset += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    MarkDead(c);  // the peer is gone
    return;
  }
  if (c.pending() == 0) {
    // Give back the memory of a large response; keep a small buffer for the next.
    if (c.out.capacity() > (1 << 20)) {
      std::string().swap(c.out);
    } else {
      c.out.clear();
    }
    c.out_offset = 0;
    if (c.closing == Closing::kFlushing) {
      // Everything is sent: the FIN follows the error frame, and the peer's own close (or the
      // linger deadline) ends the connection. Closing at once could reset it and lose the frame.
      shutdown(c.fd, SHUT_WR);
      c.closing = Closing::kLingering;
    }
  } else if (c.out_offset > (1 << 20) && c.out_offset > c.out.size() / 2) {
    c.out.erase(0, c.out_offset);
    c.out_offset = 0;
  }
  UpdateInterest(c);
}

void TcpStoreServer::EventLoop::BeginClose(Connection& c, absl::Time now) {
  if (c.closing != Closing::kNo) return;
  c.closing = Closing::kFlushing;
  state_.CancelWaits(c.session.id());
  SetDeadline(c, now + kLingerTimeout);
  Flush(c);
}

void TcpStoreServer::EventLoop::SetDeadline(Connection& c, std::optional<absl::Time> deadline) {
  if (c.deadline.has_value()) deadlines_.erase({*c.deadline, c.session.id()});
  c.deadline = deadline;
  if (deadline.has_value()) deadlines_.emplace(*deadline, c.session.id());
}

void TcpStoreServer::EventLoop::UpdateInterest(Connection& c) {
  const bool want_write = c.pending() > 0;
  if (want_write == c.want_write || c.dead) return;
  c.want_write = want_write;
  epoll_event interest{.events = EPOLLIN | (want_write ? EPOLLOUT : 0u),
                       .data = {.u64 = c.session.id()}};
  epoll_ctl(c.epoll_fd, EPOLL_CTL_MOD, c.fd, &interest);
}

void TcpStoreServer::EventLoop::JoinControlLane(Connection& c) {
  epoll_event interest{.events = EPOLLIN | (c.want_write ? EPOLLOUT : 0u),
                       .data = {.u64 = c.session.id()}};
  if (epoll_ctl(control_fd_, EPOLL_CTL_ADD, c.fd, &interest) != 0) return;  // stays where it is
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  c.epoll_fd = control_fd_;
  control_open_.fetch_add(1);
}

void TcpStoreServer::EventLoop::HandleControlLane(absl::Time now) {
  const int n = epoll_wait(control_fd_, control_events_.data(), kMaxEvents, 0);
  for (int i = 0; i < n; ++i) {
    if (Connection* c = Find(control_events_[i].data.u64); c != nullptr && !c->dead) {
      OnEvent(*c, control_events_[i].events, now);
    }
    ReapDead();
  }
}

void TcpStoreServer::EventLoop::MarkDead(Connection& c) {
  if (c.dead) return;
  c.dead = true;
  dead_.push_back(c.session.id());
}

void TcpStoreServer::EventLoop::ReapDead() {
  for (uint64_t id : dead_) {
    auto it = connections_.find(id);
    if (it == connections_.end()) continue;
    Connection& c = *it->second;
    SetDeadline(c, std::nullopt);
    state_.CancelWaits(id);
    epoll_ctl(c.epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
    if (c.epoll_fd == control_fd_) control_open_.fetch_sub(1);
    close(c.fd);
    connections_.erase(it);
    open_.fetch_sub(1);
  }
  dead_.clear();
}

void TcpStoreServer::EventLoop::ExpireDeadlines(absl::Time now) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const uint64_t id = deadlines_.begin()->second;
    deadlines_.erase(deadlines_.begin());
    Connection* c = Find(id);
    if (c == nullptr) continue;
    c->deadline.reset();
    if (c->closing != Closing::kNo) {
      MarkDead(*c);  // it did not take its last frame, or did not hang up, in time
      continue;
    }
    c->session.Close(absl::DeadlineExceededError(absl::StrCat(
                         "no authentication within ", absl::FormatDuration(options_.auth_timeout),
                         " of connecting; closing the connection")),
                     &c->out);
    RecordError(c->session.close_reason(), ErrorKind::kProtocol);
    BeginClose(*c, now);
  }
}

void TcpStoreServer::EventLoop::RecordError(std::string error, ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kProtocol:
      protocol_errors_.fetch_add(1);
      break;
    case ErrorKind::kAuthentication:
      authentication_failures_.fetch_add(1);
      break;
    case ErrorKind::kRefused:
      connections_refused_.fetch_add(1);
      break;
    case ErrorKind::kInternal:
      break;
  }
  MutexLock lock(&last_error_mu_);
  last_error_ = std::move(error);
}

TcpStoreServer::TcpStoreServer(std::unique_ptr<EventLoop> loop) : loop_(std::move(loop)) {}

TcpStoreServer::~TcpStoreServer() = default;

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(
    const TcpStoreServerOptions& options) {
  absl::StatusOr<std::unique_ptr<EventLoop>> loop = EventLoop::Create(options);
  if (!loop.ok()) return loop.status();
  (*loop)->StartThread();
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(*std::move(loop)));
}

int TcpStoreServer::port() const { return loop_->port(); }
std::string TcpStoreServer::address() const { return loop_->address(); }
TcpStoreServerStats TcpStoreServer::stats() const { return loop_->stats(); }

}  // namespace trainguard
