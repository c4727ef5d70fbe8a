// TcpStore, the client: a pool of blocking-with-deadline connections (non-blocking socket + poll),
// one request in flight on each, reconnection with bounded exponential backoff inside each call's
// timeout. A call takes an idle connection, or opens one when all are busy, within the pool's cap
// (connection_pool.h), and polls for its answer briefly before it sleeps (busy_poll.h).
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "sdk/core/errno_error.h"
#include "sdk/core/job_id.h"
#include "sdk/core/mutex.h"
#include "sdk/core/socket_address.h"
#include "sdk/proto/store.pb.h"
#include "sdk/rendezvous/busy_poll.h"
#include "sdk/rendezvous/store_auth.h"
#include "sdk/rendezvous/store_frame.h"
#include "sdk/rendezvous/tcp_store.h"
#include "trainguard/clock.h"

namespace trainguard {
namespace {

constexpr size_t kReadChunkBytes = 64 << 10;
// A Wait's answer leaves the server at the wait's deadline; the client listens this much longer
// for it, so that a timeout names the keys still missing.
constexpr absl::Duration kWaitAnswerGrace = absl::Seconds(1);

// The calls of this process that poll for their answer at one time. A chain of dependent calls
// needs one awake thread; more threads polling at once take the CPUs from each other and from
// the threads that answer them (a server in the same process, clients on the same host).
constexpr int kPollingCallsPerProcess = 1;

PollingSlots& ProcessPollingSlots() {
  static PollingSlots* const slots = new PollingSlots(kPollingCallsPerProcess);  // never destroyed
  return *slots;
}

absl::Time MonotonicNow() { return absl::FromUnixNanos(Clock::Real()->MonotonicNanos()); }

absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Poll's timeout for `deadline`, rounded up to a millisecond.
int PollTimeoutMs(absl::Time deadline) {
  const absl::Duration left = deadline - MonotonicNow();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), INT_MAX));
}

absl::Status CheckKey(std::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("store key must not be empty");
  return absl::OkStatus();
}

absl::Status CheckKeys(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(key); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// "Op(k1, k2, k3, ...)" for error messages.
std::string Describe(std::string_view op, const std::vector<std::string>& keys) {
  constexpr size_t kShown = 3;
  std::vector<std::string> shown(
      keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(std::min(keys.size(), kShown)));
  if (keys.size() > kShown) shown.push_back(absl::StrCat("... ", keys.size(), " keys"));
  return absl::StrCat(Absl(op), "(", absl::StrJoin(shown, ", "), ")");
}

// The request of SetAndAdd, or (`only_if_absent`) CreateAndAdd.
proto::ClientMessage SetThenAdd(std::string_view set_key, std::string_view value,
                                std::string_view add_key, int64_t delta, bool only_if_absent) {
  proto::ClientMessage message;
  proto::SetOp* op = message.mutable_request()->mutable_set();
  op->set_key(set_key.data(), set_key.size());
  op->set_value(value.data(), value.size());
  op->set_add_key(add_key.data(), add_key.size());
  op->set_add_delta(delta);
  op->set_only_if_absent(only_if_absent);
  return message;
}

absl::Status ResponseStatus(const proto::StoreResponse& response) {
  if (response.code() == 0) return absl::OkStatus();
  const int code = response.code();
  const auto status_code = code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated)
                               ? static_cast<absl::StatusCode>(code)
                               : absl::StatusCode::kUnknown;
  return absl::Status(status_code, response.message());
}

// The values of a MultiGet, or of a wait with keys to read, moved out in order.
std::vector<std::optional<std::string>> TakeValues(proto::StoreResponse& response) {
  std::vector<std::optional<std::string>> values;
  values.reserve(response.values_size());
  for (proto::OptionalValue& value : *response.mutable_values()) {
    values.push_back(value.present() ? std::optional<std::string>(std::move(*value.mutable_value()))
                                     : std::nullopt);
  }
  return values;
}

}  // namespace

class TcpStore::Connection {
 public:
  // Whether an operation may be sent again after its connection broke with the outcome unknown.
  enum class Retry { kIdempotent, kOnlyIfUnsent };

  // `options` and `generation` are its TcpStore's, which owns the connection.
  Connection(const TcpStoreOptions& options, const std::atomic<int64_t>& generation)
      : options_(options),
        generation_(generation),
        address_(absl::StrCat(options_.host, ":", options_.port)),
        decoder_(options_.max_frame_bytes),
        read_buffer_(kReadChunkBytes),
        busy_poll_(options_.busy_poll) {}

  ~Connection() {
    MutexLock lock(&mu_);
    CloseLocked();
  }

  const std::string& address() const { return address_; }

  // Connects and authenticates, retrying an unreachable server until `timeout` has passed.
  absl::Status Open(absl::Duration timeout) {
    const absl::Time deadline = MonotonicNow() + timeout;
    MutexLock lock(&mu_);
    absl::Duration backoff = options_.reconnect_backoff_initial;
    int attempts = 0;
    while (true) {
      absl::Status s = ConnectLocked(deadline);
      ++attempts;
      if (s.ok()) return s;
      CloseLocked();
      if (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s)) return s;
      if (!Backoff(&backoff, deadline)) return GaveUp(s, attempts, timeout);
    }
  }

  // Sends the request in `message` and returns the server's response to it (whose code may be an
  // error). `what` names the operation and key for error messages.
  absl::StatusOr<proto::StoreResponse> Call(proto::ClientMessage& message, Retry retry,
                                            absl::Duration timeout, const std::string& what) {
    const absl::Time deadline = MonotonicNow() + timeout;
    proto::StoreRequest& request = *message.mutable_request();
    MutexLock lock(&mu_);
    absl::Duration backoff = options_.reconnect_backoff_initial;
    int attempts = 0;
    absl::Status last_failure;
    while (true) {
      if (fd_ >= 0 && !(abandoned_ > 0 ? AwaitedConnectionIsOpen() : IdleConnectionIsAlive())) {
        CloseLocked();
      }
      if (attempts > 0 && !Backoff(&backoff, deadline)) {
        return GaveUp(last_failure, attempts, timeout, what);
      }
      ++attempts;
      if (fd_ < 0) {
        absl::Status s = ConnectLocked(deadline);
        if (!s.ok()) {
          CloseLocked();
          if (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s)) return s;
          last_failure = s;
          continue;
        }
      }
      const uint64_t id = next_request_id_++;
      request.set_request_id(id);
      request.set_writer_generation(generation_.load());
      const bool is_wait = request.has_wait() || request.has_wait_any();
      if (is_wait) {
        const int64_t timeout_ms = absl::ToInt64Milliseconds(absl::Ceil(
            std::max(deadline - MonotonicNow(), absl::ZeroDuration()), absl::Milliseconds(1)));
        if (request.has_wait()) request.mutable_wait()->set_timeout_ms(timeout_ms);
        if (request.has_wait_any()) request.mutable_wait_any()->set_timeout_ms(timeout_ms);
      }
      std::string frame;
      if (absl::Status s = store_wire::AppendFrame(message, server_max_frame_bytes_, what, &frame);
          !s.ok()) {
        return s;
      }
      bool sent = false;
      absl::Status failure = SendAll(frame, deadline);
      if (failure.ok()) {
        sent = true;
        // A Wait's answer comes when its keys do, not within a round trip: it is not polled for.
        absl::StatusOr<proto::StoreResponse> response =
            is_wait ? ReadResponse(id, deadline + kWaitAnswerGrace, what, /*busy_poll=*/false)
                    : ReadResponse(id, deadline, what, /*busy_poll=*/true);
        if (response.ok()) return response;
        failure = response.status();
      }
      // An answer that is late, not lost (a busy server), is read and dropped by the next call
      // rather than the connection closed: thousands of clients reconnecting whenever the server
      // falls behind would bury it under connections. Only one: a connection whose next call is
      // late again is closed.
      if (sent && absl::IsDeadlineExceeded(failure) && abandoned_ == 0) {
        abandoned_ = 1;
      } else {
        CloseLocked();
      }
      if (absl::IsDeadlineExceeded(failure)) {
        return absl::DeadlineExceededError(
            absl::StrCat(what, " on store server ", address_, ": no answer within ",
                         absl::FormatDuration(timeout),
                         sent && retry == Retry::kOnlyIfUnsent ? "; outcome unknown" : ""));
      }
      if (!absl::IsUnavailable(failure)) return failure;
      if (sent && retry == Retry::kOnlyIfUnsent) {
        return absl::UnavailableError(absl::StrCat("connection to ", address_,
                                                   " lost after sending ", what,
                                                   "; outcome unknown (", failure.message(), ")"));
      }
      last_failure = failure;
    }
  }

 private:
  absl::Status GaveUp(const absl::Status& last, int attempts, absl::Duration timeout,
                      const std::string& what = "connect") {
    return absl::UnavailableError(absl::StrFormat(
        "%s: store server %s (job '%s') unreachable: %d attempts in %s; last: %s", what, address_,
        options_.job_id, attempts, absl::FormatDuration(timeout), last.message()));
  }

  // Sleeps the current backoff (never past `deadline`) and doubles it. False when the deadline has
  // passed.
  bool Backoff(absl::Duration* backoff, absl::Time deadline) {
    const absl::Duration left = deadline - MonotonicNow();
    if (left <= absl::ZeroDuration()) return false;
    absl::SleepFor(std::min(*backoff, left));
    *backoff = std::min(*backoff * 2, options_.reconnect_backoff_max);
    return true;
  }

  void CloseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    decoder_.Clear();
    abandoned_ = 0;
  }

  // A connection that owes a late answer (abandoned_) may have bytes to read: only its end of
  // stream or an error says it was closed.
  bool AwaitedConnectionIsOpen() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    char byte;
    const ssize_t n = recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
  }

  // The server never speaks unasked, so a connection with something to read while idle has been
  // closed (end of stream, a reset, or the error frame of a server closing it).
  bool IdleConnectionIsAlive() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (decoder_.buffered_bytes() > 0) return false;
    char byte;
    const ssize_t n = recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }

  absl::Status WaitFor(decltype(pollfd::events) events, absl::Time deadline, std::string_view doing)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (true) {
      pollfd p{.fd = fd_, .events = events, .revents = 0};
      const int n = poll(&p, 1, PollTimeoutMs(deadline));
      if (n > 0) return absl::OkStatus();
      if (n == 0) {
        return absl::DeadlineExceededError(
            absl::StrCat("timed out ", Absl(doing), " store server ", address_));
      }
      if (errno != EINTR) {
        return absl::UnavailableError(
            absl::StrCat("poll while ", Absl(doing), " ", address_, ": ", ErrnoText(errno)));
      }
    }
  }

  absl::Status Dial(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const std::string port = absl::StrCat(options_.port);
    if (int rc = getaddrinfo(options_.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot resolve store server ", address_, ": ", gai_strerror(rc)));
    }
    std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addresses(found, &freeaddrinfo);
    absl::Status last = absl::UnavailableError(absl::StrCat("no address for ", address_));
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      fd_ = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
      if (fd_ < 0) {
        last = absl::UnavailableError(
            absl::StrCat("socket() for store server ", address_, ": ", ErrnoText(errno)));
        continue;
      }
      absl::Status s = BindSource(a->ai_family);
      if (s.ok()) s = ConnectOne(a, deadline);
      if (s.ok()) {
        const int one = 1;
        setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return s;
      }
      CloseLocked();
      last = s;
    }
    return last;
  }

  // Binds fd_ to options_.source_address (port 0) unless that is empty.
  absl::Status BindSource(int family) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (options_.source_address.empty()) return absl::OkStatus();
    absl::StatusOr<sockaddr_storage> source = NumericSockaddr(options_.source_address, "TcpStoreOptions.source_address");
    if (!source.ok()) return source.status();
    if (source->ss_family != family) {
      return absl::UnavailableError(absl::StrCat("source address ", options_.source_address,
                                                 " and store server ", address_,
                                                 " are of different address families"));
    }
    if (bind(fd_, reinterpret_cast<const sockaddr*>(&*source), SockaddrLength(*source)) != 0) {
      return absl::UnavailableError(absl::StrCat("cannot bind source address ",
                                                 options_.source_address, " for store server ",
                                                 address_, ": ", ErrnoText(errno)));
    }
    return absl::OkStatus();
  }

  absl::Status ConnectOne(const addrinfo* a, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (connect(fd_, a->ai_addr, a->ai_addrlen) == 0) return absl::OkStatus();
    if (errno != EINPROGRESS && errno != EINTR) {
      return absl::UnavailableError(
          absl::StrCat("cannot connect to store server ", address_, ": ", ErrnoText(errno)));
    }
    if (absl::Status s = WaitFor(POLLOUT, deadline, "connecting to"); !s.ok()) return s;
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot connect to store server ", address_, ": ", ErrnoText(err)));
    }
    return absl::OkStatus();
  }

  absl::Status SendAll(std::string_view data, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    size_t offset = 0;
    while (offset < data.size()) {
      const ssize_t n = send(fd_, data.data() + offset, data.size() - offset, MSG_NOSIGNAL);
      if (n > 0) {
        offset += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (absl::Status s = WaitFor(POLLOUT, deadline, "sending to"); !s.ok()) return s;
        continue;
      }
      return absl::UnavailableError(
          absl::StrCat("sending to store server ", address_, ": ", ErrnoText(errno)));
    }
    return absl::OkStatus();
  }

  // The next message from the server. With `busy_poll`, a thread whose answer has not arrived
  // polls the socket for busy_poll_'s budget before it blocks (busy_poll.h).
  absl::StatusOr<proto::ServerMessage> ReadMessage(absl::Time deadline, bool busy_poll)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    bool polled = !busy_poll;
    while (true) {
      absl::StatusOr<std::optional<std::string_view>> frame = decoder_.Next();
      if (!frame.ok()) {
        return absl::Status(
            frame.status().code(),
            absl::StrCat("store server ", address_,
                         " sent a frame over this client's limit: ", frame.status().message()));
      }
      if (frame->has_value()) {
        proto::ServerMessage message;
        if (!message.ParseFromArray((*frame)->data(), static_cast<int>((*frame)->size()))) {
          return absl::DataLossError(absl::StrFormat(
              "store server %s sent an unparsable frame of %d bytes", address_, (*frame)->size()));
        }
        return message;
      }
      int error = 0;
      const auto receive = [&] {
        const ssize_t n = recv(fd_, read_buffer_.data(), read_buffer_.size(), MSG_DONTWAIT);
        error = n < 0 ? errno : 0;
        if (n > 0) decoder_.Append(std::string_view(read_buffer_.data(), static_cast<size_t>(n)));
        if (n == 0) error = -1;  // end of stream
        return error != EAGAIN && error != EWOULDBLOCK;
      };
      // The first wait of the call may poll (one call of the process at a time); any other sleeps.
      bool waited = false;
      bool received = false;
      if (!polled) {
        polled = true;
        if (ProcessPollingSlots().TryAcquire()) {
          const absl::Duration budget = busy_poll_.NextWait();
          if (budget > absl::ZeroDuration()) {
            received = PollFor(std::clamp(deadline - MonotonicNow(), absl::ZeroDuration(), budget),
                               receive);
            busy_poll_.Record(received);
            waited = true;
          }
          ProcessPollingSlots().Release();
        }
      }
      if (!waited) {
        if (absl::Status s = WaitFor(POLLIN, deadline, "waiting for an answer from"); !s.ok()) {
          return s;
        }
        received = receive();
      }
      if (!received || error == 0 || error == EINTR) continue;
      if (error == -1) {
        return absl::UnavailableError(
            absl::StrCat("store server ", address_, " closed the connection"));
      }
      return absl::UnavailableError(
          absl::StrCat("receiving from store server ", address_, ": ", ErrnoText(error)));
    }
  }

  // The response to request `id`. A response with request id 0 is the server's last word before
  // it closes the connection (a protocol error), returned as that error.
  absl::StatusOr<proto::StoreResponse> ReadResponse(uint64_t id, absl::Time deadline,
                                                    const std::string& what, bool busy_poll)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<proto::ServerMessage> message = ReadMessage(deadline, busy_poll);
    if (!message.ok()) return message.status();
    // The late answer of the call before, which gave up on it: dropped.
    while (abandoned_ > 0 && message->has_response() && message->response().request_id() != 0 &&
           message->response().request_id() < id) {
      --abandoned_;
      message = ReadMessage(deadline, busy_poll);
      if (!message.ok()) return message.status();
    }
    if (!message->has_response()) {
      return absl::InternalError(absl::StrCat("store server ", address_, " answered ", what,
                                              " with a message that is not a response"));
    }
    proto::StoreResponse& response = *message->mutable_response();
    if (response.request_id() == id) return std::move(response);
    if (response.request_id() == 0 && response.code() != 0) {
      absl::Status error = ResponseStatus(response);
      return absl::Status(error.code(),
                          absl::StrCat("store server ", address_, " refused ", what,
                                       " and closed the connection: ", error.message()));
    }
    return absl::InternalError(
        absl::StrFormat("store server %s answered request %d while %s (request %d) was awaited",
                        address_, response.request_id(), what, id));
  }

  absl::Status SendMessage(const proto::ClientMessage& message, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::string frame;
    if (absl::Status s =
            store_wire::AppendFrame(message, server_max_frame_bytes_, "handshake", &frame);
        !s.ok()) {
      return s;
    }
    return SendAll(frame, deadline);
  }

  // Dials and runs the handshake. Unauthenticated or PermissionDenied when the tokens disagree.
  absl::Status ConnectLocked(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (absl::Status s = Dial(deadline); !s.ok()) return s;
    absl::StatusOr<std::string> client_nonce = store_auth::NewNonce();
    if (!client_nonce.ok()) return client_nonce.status();
    proto::ClientMessage hello;
    hello.mutable_hello()->set_protocol_version(store_wire::kProtocolVersion);
    hello.mutable_hello()->set_job_id(options_.job_id);
    hello.mutable_hello()->set_client_nonce(*client_nonce);
    hello.mutable_hello()->set_control(options_.control);
    if (absl::Status s = SendMessage(hello, deadline); !s.ok()) return s;

    absl::StatusOr<proto::ServerMessage> reply = ReadMessage(deadline, /*busy_poll=*/true);
    if (!reply.ok()) return reply.status();
    if (reply->has_response()) return HandshakeRefused(reply->response());
    if (!reply->has_challenge()) {
      return absl::InternalError(
          absl::StrCat("store server ", address_, " answered ClientHello without a challenge"));
    }
    const proto::ServerChallenge& challenge = reply->challenge();
    const std::string expected =
        store_auth::Proof(options_.job_token, store_auth::Role::kServer, challenge.server_nonce(),
                          *client_nonce, options_.job_id);
    if (challenge.server_nonce().size() != store_auth::kNonceBytes ||
        !store_auth::ProofMatches(expected, challenge.server_proof())) {
      return absl::UnauthenticatedError(absl::StrCat(
          "store server ", address_, " could not prove that it holds the token of job '",
          options_.job_id,
          "': this client's job token differs from the server's (or that is not the job's store)"));
    }
    if (challenge.max_frame_bytes() > 0) server_max_frame_bytes_ = challenge.max_frame_bytes();

    proto::ClientMessage proof;
    proof.mutable_proof()->set_client_proof(
        store_auth::Proof(options_.job_token, store_auth::Role::kClient, challenge.server_nonce(),
                          *client_nonce, options_.job_id));
    if (absl::Status s = SendMessage(proof, deadline); !s.ok()) return s;
    reply = ReadMessage(deadline, /*busy_poll=*/true);
    if (!reply.ok()) return reply.status();
    if (!reply->has_response() || reply->response().request_id() != 0) {
      return absl::InternalError(
          absl::StrCat("store server ", address_, " answered the client's proof out of protocol"));
    }
    if (reply->response().code() != 0) return HandshakeRefused(reply->response());
    return absl::OkStatus();
  }

  absl::Status HandshakeRefused(const proto::StoreResponse& response) const {
    absl::Status error = ResponseStatus(response);
    if (error.ok()) {
      return absl::InternalError(
          absl::StrCat("store server ", address_, " answered the handshake out of protocol"));
    }
    return absl::Status(error.code(), absl::StrCat("store server ", address_, " refused job '",
                                                   options_.job_id, "': ", error.message()));
  }

  const TcpStoreOptions& options_;
  const std::atomic<int64_t>& generation_;  // the writer generation each request carries
  const std::string address_;

  // Serializes the calls on this connection: one request in flight.
  Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  store_wire::FrameDecoder decoder_ ABSL_GUARDED_BY(mu_);
  std::vector<char> read_buffer_ ABSL_GUARDED_BY(mu_);
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 1;
  // The requests sent on fd_ whose calls gave up before their answers came (0 or 1): their
  // answers, still to come, are dropped by the next call's read.
  int abandoned_ ABSL_GUARDED_BY(mu_) = 0;
  // Until the server says otherwise in its challenge.
  uint32_t server_max_frame_bytes_ ABSL_GUARDED_BY(mu_) = 64u << 20;
  BusyPoll busy_poll_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const TcpStoreOptions& options) {
  if (absl::Status s = ValidateJobId(options.job_id); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("TcpStoreOptions: ", s.message()));
  }
  if (options.job_token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpStoreOptions.job_token is empty (job '", options.job_id, "')"));
  }
  if (options.port <= 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("TcpStoreOptions.port %d is not in [1, 65535]", options.port));
  }
  if (options.busy_poll < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpStoreOptions.busy_poll must not be negative, not ",
                     absl::FormatDuration(options.busy_poll)));
  }
  if (options.reconnect_backoff_initial <= absl::ZeroDuration() ||
      options.reconnect_backoff_max < options.reconnect_backoff_initial) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpStoreOptions: reconnect backoff must satisfy 0 < initial (",
                     absl::FormatDuration(options.reconnect_backoff_initial), ") <= max (",
                     absl::FormatDuration(options.reconnect_backoff_max), ")"));
  }
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "TcpStoreOptions.max_connections must be at least 1, not %d", options.max_connections));
  }
  if (!options.source_address.empty()) {
    if (absl::StatusOr<sockaddr_storage> source =
            NumericSockaddr(options.source_address, "TcpStoreOptions.source_address");
        !source.ok()) {
      return source.status();
    }
  }
  std::unique_ptr<TcpStore> store(new TcpStore(options));
  using Use = ConnectionPool<Connection>::Use;
  std::unique_ptr<Connection> connection = store->pool_->Take(Use::kParked, absl::ZeroDuration());
  if (absl::Status s = connection->Open(options.connect_timeout); !s.ok()) return s;
  store->pool_->Give(std::move(connection), Use::kParked);  // idle, for the first call
  return store;
}

TcpStore::TcpStore(const TcpStoreOptions& options)
    : options_(options),
      pool_(std::make_unique<ConnectionPool<Connection>>(options_.max_connections, [this] {
        return std::make_unique<Connection>(options_, generation_);
      })) {}
TcpStore::~TcpStore() = default;

// One call on a connection of the pool, taken for it and given back: `Lease(this)->Call(...)`. A
// Wait or WaitAny is parked on the server and takes no slot of the cap; any other request waits,
// within its timeout, for a slot when the cap's connections are all busy.
class TcpStore::Lease {
 public:
  explicit Lease(TcpStore* store) : store_(store) {}
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  Lease* operator->() { return this; }

  // Connection::Call on the connection taken, with what is left of `timeout` once it is.
  absl::StatusOr<proto::StoreResponse> Call(proto::ClientMessage& message, Connection::Retry retry,
                                            absl::Duration timeout, const std::string& what) {
    using Use = ConnectionPool<Connection>::Use;
    const proto::StoreRequest& request = message.request();
    const Use use = request.has_wait() || request.has_wait_any() ? Use::kParked : Use::kShort;
    const absl::Time deadline = MonotonicNow() + timeout;
    std::unique_ptr<Connection> connection = store_->pool_->Take(use, timeout);
    if (connection == nullptr) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "%s on store server %s: no connection came free within %s: all %d of this client's "
          "connections (TcpStoreOptions.max_connections) carry other calls",
          what, store_->address(), absl::FormatDuration(timeout),
          store_->options_.max_connections));
    }
    absl::StatusOr<proto::StoreResponse> response = connection->Call(
        message, retry, std::max(deadline - MonotonicNow(), absl::ZeroDuration()), what);
    store_->pool_->Give(std::move(connection), use);
    return response;
  }

 private:
  TcpStore* const store_;
};

std::string TcpStore::address() const { return absl::StrCat(options_.host, ":", options_.port); }

void TcpStore::SetWriterGeneration(int64_t generation) { generation_.store(generation); }

absl::Status TcpStore::Set(std::string_view key, std::string_view value, absl::Duration timeout) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  proto::ClientMessage message;
  proto::SetOp* op = message.mutable_request()->mutable_set();
  op->set_key(key.data(), key.size());
  op->set_value(value.data(), value.size());
  absl::StatusOr<proto::StoreResponse> response = Lease(this)->Call(
      message, Connection::Retry::kIdempotent, timeout, absl::StrFormat("Set(%s)", Absl(key)));
  if (!response.ok()) return response.status();
  return ResponseStatus(*response);
}

absl::StatusOr<std::string> TcpStore::Get(std::string_view key, absl::Duration timeout) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  proto::ClientMessage message;
  message.mutable_request()->mutable_get()->set_key(key.data(), key.size());
  absl::StatusOr<proto::StoreResponse> response = Lease(this)->Call(
      message, Connection::Retry::kIdempotent, timeout, absl::StrFormat("Get(%s)", Absl(key)));
  if (!response.ok()) return response.status();
  if (absl::Status s = ResponseStatus(*response); !s.ok()) return s;
  return std::move(*response->mutable_value());
}

absl::StatusOr<int64_t> TcpStore::Add(std::string_view key, int64_t delta, absl::Duration timeout) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  proto::ClientMessage message;
  proto::AddOp* op = message.mutable_request()->mutable_add();
  op->set_key(key.data(), key.size());
  op->set_delta(delta);
  absl::StatusOr<proto::StoreResponse> response = Lease(this)->Call(
      message, Connection::Retry::kOnlyIfUnsent, timeout, absl::StrFormat("Add(%s)", Absl(key)));
  if (!response.ok()) return response.status();
  if (absl::Status s = ResponseStatus(*response); !s.ok()) return s;
  return response->number();
}

absl::StatusOr<int64_t> TcpStore::SetAndAdd(std::string_view set_key, std::string_view value,
                                            std::string_view add_key, int64_t delta,
                                            absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  if (absl::Status s = CheckKey(set_key); !s.ok()) return s;
  if (absl::Status s = CheckKey(add_key); !s.ok()) return s;
  proto::ClientMessage message =
      SetThenAdd(set_key, value, add_key, delta, /*only_if_absent=*/false);
  absl::StatusOr<proto::StoreResponse> response =
      Lease(this)->Call(message, Connection::Retry::kOnlyIfUnsent, timeout,
                        absl::StrFormat("SetAndAdd(%s, %s)", Absl(set_key), Absl(add_key)));
  if (!response.ok()) return response.status();
  if (absl::Status s = ResponseStatus(*response); !s.ok()) return s;
  // A server that predates SetOp.add_key only set the value: the Add goes apart.
  if (!response->flag()) {
    return Add(add_key, delta, std::max(deadline - absl::Now(), absl::ZeroDuration()));
  }
  return response->number();
}

absl::StatusOr<bool> TcpStore::CreateAndAdd(std::string_view key, std::string_view value,
                                            std::string_view add_key, int64_t delta,
                                            absl::Duration timeout) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  if (absl::Status s = CheckKey(add_key); !s.ok()) return s;
  proto::ClientMessage message = SetThenAdd(key, value, add_key, delta, /*only_if_absent=*/true);
  absl::StatusOr<proto::StoreResponse> response =
      Lease(this)->Call(message, Connection::Retry::kOnlyIfUnsent, timeout,
                        absl::StrFormat("CreateAndAdd(%s, %s)", Absl(key), Absl(add_key)));
  if (!response.ok()) return response.status();
  if (absl::Status s = ResponseStatus(*response); !s.ok()) return s;
  return response->flag();
}

absl::StatusOr<CompareAndSetResult> TcpStore::CompareAndSet(
    std::string_view key, const std::optional<std::string>& expected, std::string_view desired,
    absl::Duration timeout) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  proto::ClientMessage message;
  proto::CompareAndSetOp* op = message.mutable_request()->mutable_compare_and_set();
  op->set_key(key.data(), key.size());
  op->set_expected_present(expected.has_value());
  if (expected.has_value()) op->set_expected(*expected);
  op->set_desired(desired.data(), desired.size());
  const std::string what = absl::StrFormat("CompareAndSet(%s)", Absl(key));
  absl::StatusOr<proto::StoreResponse> response =
      Lease(this)->Call(message, Connection::Retry::kOnlyIfUnsent, timeout, what);
  if (!response.ok()) return response.status();
  if (absl::Status s = ResponseStatus(*response); !s.ok()) return s;
  if (response->values_size() != 1) {
    return absl::InternalError(
        absl::StrCat("store server ", address(), " answered ", what, " without the current value"));
  }
  CompareAndSetResult result;
  result.swapped = response->flag();
  if (response->values(0).present()) {
    result.current = std::move(*response->mutable_values(0)->mutable_value());
  }
  return result;
}

absl::StatusOr<bool> TcpStore::Delete(std::string_view key, absl::Duration timeout) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  proto::ClientMessage message;
  message.mutable_request()->mutable_delete_key()->set_key(key.data(), key.size());
  absl::StatusOr<proto::StoreResponse> response = Lease(this)->Call(
      message, Connection::Retry::kIdempotent, timeout, absl::StrFormat("Delete(%s)", Absl(key)));
  if (!response.ok()) return response.status();
  if (absl::Status s = ResponseStatus(*response); !s.ok()) return s;
  return response->flag();
}

absl::StatusOr<proto::StoreResponse> TcpStore::CallMultiGet(const std::vector<std::string>& keys,
                                                            bool with_ages,
                                                            absl::Duration timeout) {
  if (absl::Status s = CheckKeys(keys); !s.ok()) return s;
  proto::ClientMessage message;
  proto::MultiGetOp* op = message.mutable_request()->mutable_multi_get();
  for (const std::string& key : keys) op->add_keys(key);
  op->set_with_ages(with_ages);
  const std::string what = Describe("MultiGet", keys);
  absl::StatusOr<proto::StoreResponse> response =
      Lease(this)->Call(message, Connection::Retry::kIdempotent, timeout, what);
  if (!response.ok()) return response.status();
  if (absl::Status s = ResponseStatus(*response); !s.ok()) return s;
  if (static_cast<size_t>(response->values_size()) != keys.size()) {
    return absl::InternalError(absl::StrFormat("store server %s answered %s with %d values",
                                               address(), what, response->values_size()));
  }
  // A server that predates MultiGetOp.with_ages answers the values alone.
  if (with_ages && static_cast<size_t>(response->ages_ns_size()) != keys.size()) {
    return absl::UnimplementedError(absl::StrFormat(
        "store server %s does not say when its keys were written (it answered %s with %d ages)",
        address(), what, response->ages_ns_size()));
  }
  return response;
}

absl::StatusOr<std::vector<std::optional<std::string>>> TcpStore::MultiGet(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  absl::StatusOr<proto::StoreResponse> response = CallMultiGet(keys, false, timeout);
  if (!response.ok()) return response.status();
  return TakeValues(*response);
}

absl::StatusOr<std::vector<std::optional<Store::AgedValue>>> TcpStore::MultiGetWithAges(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  absl::StatusOr<proto::StoreResponse> response = CallMultiGet(keys, true, timeout);
  if (!response.ok()) return response.status();
  std::vector<std::optional<AgedValue>> values;
  values.reserve(keys.size());
  for (int i = 0; i < response->values_size(); ++i) {
    proto::OptionalValue& value = *response->mutable_values(i);
    if (!value.present()) {
      values.push_back(std::nullopt);
      continue;
    }
    values.push_back(AgedValue{std::move(*value.mutable_value()),
                               absl::Nanoseconds(std::max<int64_t>(0, response->ages_ns(i)))});
  }
  return values;
}

absl::StatusOr<std::vector<std::string>> TcpStore::ListKeys(std::string_view prefix,
                                                            absl::Duration timeout) {
  proto::ClientMessage message;
  message.mutable_request()->mutable_list_keys()->set_prefix(prefix.data(), prefix.size());
  absl::StatusOr<proto::StoreResponse> response =
      Lease(this)->Call(message, Connection::Retry::kIdempotent, timeout,
                        absl::StrFormat("ListKeys(%s)", Absl(prefix)));
  if (!response.ok()) return response.status();
  if (absl::Status s = ResponseStatus(*response); !s.ok()) return s;
  return std::vector<std::string>(std::make_move_iterator(response->mutable_keys()->begin()),
                                  std::make_move_iterator(response->mutable_keys()->end()));
}

absl::Status TcpStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  if (absl::Status s = CheckKeys(keys); !s.ok()) return s;
  proto::ClientMessage message;
  proto::WaitOp* op = message.mutable_request()->mutable_wait();
  for (const std::string& key : keys) op->add_keys(key);
  absl::StatusOr<proto::StoreResponse> response =
      Lease(this)->Call(message, Connection::Retry::kIdempotent, timeout, Describe("Wait", keys));
  if (!response.ok()) return response.status();
  return ResponseStatus(*response);
}

absl::StatusOr<std::vector<std::optional<std::string>>> TcpStore::WaitAndRead(
    const std::vector<std::string>& awaited, const std::vector<std::string>& read,
    absl::Duration timeout) {
  if (read.empty()) {
    if (absl::Status s = Wait(awaited, timeout); !s.ok()) return s;
    return std::vector<std::optional<std::string>>();
  }
  if (absl::Status s = CheckKeys(awaited); !s.ok()) return s;
  if (absl::Status s = CheckKeys(read); !s.ok()) return s;
  const absl::Time deadline = absl::Now() + timeout;
  proto::ClientMessage message;
  proto::WaitOp* op = message.mutable_request()->mutable_wait();
  for (const std::string& key : awaited) op->add_keys(key);
  for (const std::string& key : read) op->add_read_keys(key);
  const std::string what = Describe("Wait", awaited);
  absl::StatusOr<proto::StoreResponse> response =
      Lease(this)->Call(message, Connection::Retry::kIdempotent, timeout, what);
  if (!response.ok()) return response.status();
  if (absl::Status s = ResponseStatus(*response); !s.ok()) return s;
  return ValuesReadWith(*response, read, deadline, what);
}

absl::StatusOr<std::vector<std::optional<std::string>>> TcpStore::ValuesReadWith(
    proto::StoreResponse& response, const std::vector<std::string>& read, absl::Time deadline,
    const std::string& what) {
  // A server that predates the wait's read_keys waited and read nothing: the values come apart.
  if (response.values_size() == 0) {
    return MultiGet(read, std::max(deadline - absl::Now(), absl::ZeroDuration()));
  }
  if (static_cast<size_t>(response.values_size()) != read.size()) {
    return absl::InternalError(absl::StrFormat("store server %s answered %s with %d values for %d",
                                               address(), what, response.values_size(),
                                               read.size()));
  }
  return TakeValues(response);
}

absl::StatusOr<size_t> TcpStore::WaitAny(const std::vector<std::string>& keys,
                                         absl::Duration timeout) {
  absl::StatusOr<AnyKeyAndValues> found = WaitAnyAndRead(keys, {}, timeout);
  if (!found.ok()) return found.status();
  return found->index;
}

absl::StatusOr<AnyKeyAndValues> TcpStore::WaitAnyAndRead(const std::vector<std::string>& awaited,
                                                         const std::vector<std::string>& read,
                                                         absl::Duration timeout) {
  if (awaited.empty()) return absl::InvalidArgumentError("WaitAny needs at least one store key");
  if (absl::Status s = CheckKeys(awaited); !s.ok()) return s;
  if (absl::Status s = CheckKeys(read); !s.ok()) return s;
  const absl::Time deadline = absl::Now() + timeout;
  proto::ClientMessage message;
  proto::WaitAnyOp* op = message.mutable_request()->mutable_wait_any();
  for (const std::string& key : awaited) op->add_keys(key);
  for (const std::string& key : read) op->add_read_keys(key);
  const std::string what = Describe("WaitAny", awaited);
  absl::StatusOr<proto::StoreResponse> response =
      Lease(this)->Call(message, Connection::Retry::kIdempotent, timeout, what);
  if (!response.ok()) return response.status();
  if (absl::Status s = ResponseStatus(*response); !s.ok()) return s;
  if (response->number() < 0 || static_cast<size_t>(response->number()) >= awaited.size()) {
    return absl::InternalError(absl::StrFormat("store server %s answered %s with key index %d",
                                               address(), what, response->number()));
  }
  AnyKeyAndValues found{static_cast<size_t>(response->number()), {}};
  if (read.empty()) return found;
  absl::StatusOr<std::vector<std::optional<std::string>>> values =
      ValuesReadWith(*response, read, deadline, what);
  if (!values.ok()) return values.status();
  found.values = *std::move(values);
  return found;
}

absl::Status TcpStore::RaiseFence(int64_t generation, absl::Duration timeout) {
  proto::ClientMessage message;
  message.mutable_request()->mutable_raise_fence()->set_generation(generation);
  absl::StatusOr<proto::StoreResponse> response =
      Lease(this)->Call(message, Connection::Retry::kIdempotent, timeout,
                        absl::StrCat("RaiseFence(", generation, ")"));
  if (!response.ok()) return response.status();
  return ResponseStatus(*response);
}

absl::StatusOr<std::vector<CompareAndSetResult>> TcpStore::WriteBatch(
    const std::vector<BatchWrite>& writes, absl::Duration timeout) {
  if (absl::Status s = CheckBatch(writes); !s.ok()) return s;
  if (writes.empty()) return std::vector<CompareAndSetResult>();
  proto::ClientMessage message;
  proto::WriteBatchOp* op = message.mutable_request()->mutable_write_batch();
  std::vector<std::string> keys;
  for (const BatchWrite& write : writes) {
    proto::BatchWriteOp* out = op->add_writes();
    switch (write.op) {
      case BatchWrite::Op::kSet:
        out->mutable_set()->set_key(write.key);
        out->mutable_set()->set_value(write.value);
        keys.push_back(write.key);
        break;
      case BatchWrite::Op::kCompareAndSet: {
        proto::CompareAndSetOp* cas = out->mutable_compare_and_set();
        cas->set_key(write.key);
        cas->set_expected_present(write.expected.has_value());
        if (write.expected.has_value()) cas->set_expected(*write.expected);
        cas->set_desired(write.value);
        keys.push_back(write.key);
        break;
      }
      case BatchWrite::Op::kRaiseFence:
        out->mutable_raise_fence()->set_generation(write.generation);
        keys.push_back(absl::StrCat("(fence ", write.generation, ")"));
        break;
    }
  }
  const std::string what = Describe("WriteBatch", keys);
  // Not sent again once it may have applied: its compare-and-sets would see their own writes.
  absl::StatusOr<proto::StoreResponse> response =
      Lease(this)->Call(message, Connection::Retry::kOnlyIfUnsent, timeout, what);
  if (!response.ok()) return response.status();
  if (absl::Status s = ResponseStatus(*response); !s.ok()) return s;
  if (static_cast<size_t>(response->values_size()) != writes.size() ||
      static_cast<size_t>(response->flags_size()) != writes.size()) {
    return absl::InternalError(absl::StrFormat(
        "store server %s answered %s with %d values and %d flags for %d writes", address(), what,
        response->values_size(), response->flags_size(), writes.size()));
  }
  std::vector<CompareAndSetResult> results(writes.size());
  for (size_t i = 0; i < writes.size(); ++i) {
    results[i].swapped = response->flags(static_cast<int>(i));
    proto::OptionalValue& value = *response->mutable_values(static_cast<int>(i));
    if (value.present()) results[i].current = std::move(*value.mutable_value());
  }
  return results;
}

}  // namespace trainguard
