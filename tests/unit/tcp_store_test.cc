// TcpStore and TcpStoreServer: the Store conformance suite over real loopback connections, then
// the faults a server facing a network must survive: wrong tokens, garbage, oversized and
// truncated frames, requests before authentication, silent and non-reading clients, a server
// restart under a client, a client process killed in the middle of a Wait, and a connection lost
// after an Add was sent.
#include "sdk/rendezvous/tcp_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/core/mutex.h"
#include "sdk/proto/store.pb.h"
#include "sdk/rendezvous/store_auth.h"
#include "sdk/rendezvous/store_frame.h"
#include "sdk/rendezvous/store_session.h"
#include "sdk/rendezvous/store_state.h"
#include "tests/support/free_port.h"
#include "tests/support/own_process.h"
#include "tests/support/peer_recording_listener.h"
#include "tests/support/store_conformance.h"

namespace trainguard::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "job-a-shared-secret";
constexpr char kJob[] = "job-a";
constexpr absl::Duration kTimeout = absl::Seconds(10);

TcpStoreServerOptions ServerOptions() {
  TcpStoreServerOptions options;
  options.job_token = kToken;
  return options;
}

TcpStoreOptions ClientOptions(int port, std::string job = kJob, std::string token = kToken) {
  TcpStoreOptions options;
  options.port = port;
  options.job_id = std::move(job);
  options.job_token = std::move(token);
  options.connect_timeout = kTimeout;
  return options;
}

template <typename T>
T OrDie(absl::StatusOr<T> value) {
  if (!value.ok()) {
    std::fprintf(stderr, "unexpected error: %s\n", value.status().ToString().c_str());
    std::abort();
  }
  return *std::move(value);
}

std::unique_ptr<TcpStoreServer> StartServer(
    const TcpStoreServerOptions& options = ServerOptions()) {
  return OrDie(TcpStoreServer::Start(options));
}

std::unique_ptr<TcpStore> ConnectClient(int port) {
  return OrDie(TcpStore::Connect(ClientOptions(port)));
}

// Bounded polling: true once `condition` holds, false if it does not within `timeout`.
template <typename Condition>
bool Eventually(Condition condition, absl::Duration timeout = kTimeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return condition();
}

// Asserts that a well-behaved client of `server` can still write and read.
void ExpectServes(const TcpStoreServer& server) {
  auto store = ConnectClient(server.port());
  const std::string key = absl::StrCat("still-serving/", absl::ToUnixNanos(absl::Now()));
  ASSERT_TRUE(store->Set(key, "yes", kTimeout).ok());
  auto got = store->Get(key, kTimeout);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "yes");
}

// A socket that speaks the wire protocol by hand, to send what no TcpStore would.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval tv{.tv_sec = 10, .tv_usec = 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawConnection() { Close(); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return connected_; }

  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  bool SendBytes(std::string_view bytes) {
    size_t offset = 0;
    while (offset < bytes.size()) {
      const ssize_t n = send(fd_, bytes.data() + offset, bytes.size() - offset, MSG_NOSIGNAL);
      if (n <= 0) return false;
      offset += static_cast<size_t>(n);
    }
    return true;
  }

  bool Send(const proto::ClientMessage& message) {
    std::string frame;
    if (!store_wire::AppendFrame(message, ~uint32_t{0}, "test", &frame).ok()) return false;
    return SendBytes(frame);
  }

  // The next message from the server; nullopt at end of stream, on an error or after 10 s.
  std::optional<proto::ServerMessage> Read() {
    std::string header(store_wire::kFrameHeaderBytes, '\0');
    if (!ReadExactly(header.data(), header.size())) return std::nullopt;
    std::string payload(store_wire::DecodeFrameLength(header.data()), '\0');
    if (!ReadExactly(payload.data(), payload.size())) return std::nullopt;
    proto::ServerMessage message;
    if (!message.ParseFromString(payload)) return std::nullopt;
    return message;
  }

  // The next response; a default one (code -1) when none came.
  proto::StoreResponse ReadResponse() {
    std::optional<proto::ServerMessage> message = Read();
    if (!message.has_value() || !message->has_response()) {
      proto::StoreResponse none;
      none.set_code(-1);
      none.set_message("no response");
      return none;
    }
    return message->response();
  }

  // True when the server closes the connection (end of stream or reset) within 10 s; bytes sent
  // before are discarded.
  bool ClosedByServer() {
    char buf[4096];
    while (true) {
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
    }
  }

  // Runs the client side of the handshake; the server's last response.
  proto::StoreResponse Authenticate(const std::string& job, const std::string& token) {
    const std::string client_nonce = OrDie(store_auth::NewNonce());
    proto::ClientMessage hello;
    hello.mutable_hello()->set_protocol_version(store_wire::kProtocolVersion);
    hello.mutable_hello()->set_job_id(job);
    hello.mutable_hello()->set_client_nonce(client_nonce);
    if (!Send(hello)) return ReadResponse();
    std::optional<proto::ServerMessage> challenge = Read();
    if (!challenge.has_value() || !challenge->has_challenge()) {
      return challenge.has_value() ? challenge->response() : ReadResponse();
    }
    proto::ClientMessage proof;
    proof.mutable_proof()->set_client_proof(store_auth::Proof(token, store_auth::Role::kClient,
                                                              challenge->challenge().server_nonce(),
                                                              client_nonce, job));
    if (!Send(proof)) return ReadResponse();
    return ReadResponse();
  }

 private:
  bool ReadExactly(char* data, size_t size) {
    size_t offset = 0;
    while (offset < size) {
      const ssize_t n = recv(fd_, data + offset, size - offset, 0);
      if (n <= 0) return false;
      offset += static_cast<size_t>(n);
    }
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
};

proto::ClientMessage GetRequest(uint64_t id, const std::string& key) {
  proto::ClientMessage message;
  message.mutable_request()->set_request_id(id);
  message.mutable_request()->mutable_get()->set_key(key);
  return message;
}

// A port with nothing listening on it, below the ephemeral range (FreeTcpPort), so that no
// client's own connection can take it as its source port and connect to itself.
int UnusedPort() {
  absl::StatusOr<int> port = FreeTcpPort("127.0.0.1");
  if (!port.ok()) std::abort();
  return *port;
}

// Every other client is a control client (TcpStoreOptions::control), so that the suite runs
// across the server's two lanes: the writes of one answer the waits of the other. NewClient is
// called from several threads.
class TcpStoreHarness {
 public:
  TcpStoreHarness() : server_(StartServer()) {}
  std::unique_ptr<Store> NewClient() {
    TcpStoreOptions options = ClientOptions(server_->port());
    options.control = clients_.fetch_add(1) % 2 == 1;
    return OrDie(TcpStore::Connect(options));
  }

 private:
  std::unique_ptr<TcpStoreServer> server_;
  std::atomic<int> clients_{0};
};

// A server and clients that never busy-poll: every wait for an answer or a request sleeps at once.
class TcpStoreWithoutBusyPollHarness {
 public:
  TcpStoreWithoutBusyPollHarness() {
    TcpStoreServerOptions options = ServerOptions();
    options.busy_poll = absl::ZeroDuration();
    server_ = StartServer(options);
  }
  std::unique_ptr<Store> NewClient() {
    TcpStoreOptions options = ClientOptions(server_->port());
    options.busy_poll = absl::ZeroDuration();
    return OrDie(TcpStore::Connect(options));
  }

 private:
  std::unique_ptr<TcpStoreServer> server_;
};

}  // namespace

INSTANTIATE_TYPED_TEST_SUITE_P(TcpStore, StoreConformance, TcpStoreHarness);
INSTANTIATE_TYPED_TEST_SUITE_P(TcpStoreWithoutBusyPoll, StoreConformance,
                               TcpStoreWithoutBusyPollHarness);

namespace {

// --- Authentication and namespaces.

TEST(TcpStoreAuthTest, AClientWithTheWrongTokenIsRejectedNamingTheJobAndOthersAreStillServed) {
  auto server = StartServer();
  auto rejected = TcpStore::Connect(ClientOptions(server->port(), kJob, "not-the-token"));
  EXPECT_TRUE(absl::IsUnauthenticated(rejected.status())) << rejected.status();
  EXPECT_THAT(std::string(rejected.status().message()), HasSubstr("job 'job-a'"));
  EXPECT_THAT(std::string(rejected.status().message()), HasSubstr(server->address()));
  ExpectServes(*server);
}

TEST(TcpStoreAuthTest, AForgedClientProofIsRefusedAndTheConnectionClosed) {
  auto server = StartServer();
  RawConnection raw(server->port());
  ASSERT_TRUE(raw.connected());
  proto::StoreResponse refused = raw.Authenticate(kJob, "guessed-token");
  EXPECT_EQ(refused.code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(refused.message(), HasSubstr("authentication failed for job 'job-a'"));
  EXPECT_TRUE(raw.ClosedByServer());
  EXPECT_EQ(server->stats().authentication_failures, 1);
  ExpectServes(*server);
}

TEST(TcpStoreAuthTest, TheTokenNeverCrossesTheWire) {
  auto server = StartServer();
  // Everything the server sends during a handshake, and what a client sends, holds no token.
  RawConnection raw(server->port());
  const std::string client_nonce = OrDie(store_auth::NewNonce());
  proto::ClientMessage hello;
  hello.mutable_hello()->set_protocol_version(store_wire::kProtocolVersion);
  hello.mutable_hello()->set_job_id(kJob);
  hello.mutable_hello()->set_client_nonce(client_nonce);
  ASSERT_TRUE(raw.Send(hello));
  std::optional<proto::ServerMessage> challenge = raw.Read();
  ASSERT_TRUE(challenge.has_value() && challenge->has_challenge());
  EXPECT_THAT(challenge->SerializeAsString(), ::testing::Not(HasSubstr(kToken)));
  const std::string proof = store_auth::Proof(
      kToken, store_auth::Role::kClient, challenge->challenge().server_nonce(), client_nonce, kJob);
  EXPECT_THAT(proof, ::testing::Not(HasSubstr(kToken)));
  EXPECT_EQ(proof.size(), store_auth::kProofBytes);
  // The server's proof is bound to this client's nonce: it verifies only for it.
  EXPECT_TRUE(store_auth::ProofMatches(
      store_auth::Proof(kToken, store_auth::Role::kServer, challenge->challenge().server_nonce(),
                        client_nonce, kJob),
      challenge->challenge().server_proof()));
}

TEST(TcpStoreAuthTest, AJobTheServerDoesNotServeIsRefusedWithPermissionDenied) {
  TcpStoreServerOptions options;
  options.job_tokens = {{"job-a", "token-a"}};
  auto server = StartServer(options);
  auto refused = TcpStore::Connect(ClientOptions(server->port(), "job-b", "token-a"));
  EXPECT_TRUE(absl::IsPermissionDenied(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("job 'job-b'"));
}

TEST(TcpStoreAuthTest, AJobsTokenDoesNotOpenAnotherJob) {
  TcpStoreServerOptions options;
  options.job_tokens = {{"job-a", "token-a"}, {"job-b", "token-b"}};
  auto server = StartServer(options);
  EXPECT_TRUE(TcpStore::Connect(ClientOptions(server->port(), "job-a", "token-a")).ok());
  auto intruder = TcpStore::Connect(ClientOptions(server->port(), "job-b", "token-a"));
  EXPECT_TRUE(absl::IsUnauthenticated(intruder.status())) << intruder.status();
  EXPECT_THAT(std::string(intruder.status().message()), HasSubstr("job 'job-b'"));
}

TEST(TcpStoreAuthTest, ClientsOfOneJobNeverSeeAnotherJobsKeysOrFence) {
  auto server = StartServer();
  auto job_a = OrDie(TcpStore::Connect(ClientOptions(server->port(), "job-a")));
  auto job_b = OrDie(TcpStore::Connect(ClientOptions(server->port(), "job-b")));
  ASSERT_TRUE(job_a->Set("rank/0", "a", kTimeout).ok());
  EXPECT_TRUE(absl::IsNotFound(job_b->Get("rank/0", kTimeout).status()));
  EXPECT_THAT(*job_b->ListKeys("", kTimeout), ::testing::IsEmpty());
  ASSERT_TRUE(job_b->Set("rank/0", "b", kTimeout).ok());
  EXPECT_EQ(*job_a->Get("rank/0", kTimeout), "a");

  ASSERT_TRUE(job_a->RaiseFence(5, kTimeout).ok());
  job_b->SetWriterGeneration(1);
  EXPECT_TRUE(job_b->Set("rank/0", "b1", kTimeout).ok()) << "job A's fence is not job B's";
  job_a->SetWriterGeneration(1);
  absl::Status stale = job_a->Set("rank/0", "a1", kTimeout);
  EXPECT_TRUE(absl::IsFailedPrecondition(stale)) << stale;
  EXPECT_THAT(std::string(stale.message()), HasSubstr("stale generation 1 < fence 5"));
}

// --- Malformed input: each gets an error (where one can be sent) and a closed connection, while
// the server keeps serving everyone else.

TEST(TcpStoreServerFaultTest, GarbageBytesGetAnErrorAndTheConnectionIsClosed) {
  auto server = StartServer();
  auto bystander = ConnectClient(server->port());
  RawConnection raw(server->port());
  // Read as a length prefix, "GET " is 542393671 bytes: over the limit.
  ASSERT_TRUE(raw.SendBytes("GET / HTTP/1.1\r\nHost: store\r\n\r\n"));
  proto::StoreResponse error = raw.ReadResponse();
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(error.message(), HasSubstr("frame of 542393671 bytes exceeds the limit"));
  EXPECT_TRUE(raw.ClosedByServer());
  EXPECT_TRUE(bystander->Set("after/garbage", "ok", kTimeout).ok());
  ExpectServes(*server);
}

TEST(TcpStoreServerFaultTest, AnUnparsableFrameGetsAnErrorAndTheConnectionIsClosed) {
  auto server = StartServer();
  RawConnection raw(server->port());
  ASSERT_TRUE(raw.SendBytes(std::string("\x08\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff", 12)));
  proto::StoreResponse error = raw.ReadResponse();
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(error.message(), HasSubstr("not a valid ClientMessage"));
  EXPECT_TRUE(raw.ClosedByServer());
  EXPECT_GE(server->stats().protocol_errors, 1);
  ExpectServes(*server);
}

TEST(TcpStoreServerFaultTest, AnOversizedLengthPrefixIsRefusedBeforeAnyPayloadArrives) {
  auto server = StartServer();
  RawConnection raw(server->port());
  ASSERT_EQ(raw.Authenticate(kJob, kToken).code(), 0);
  // Only the prefix is sent: the server must answer without waiting for (or allocating) 4 GiB.
  ASSERT_TRUE(raw.SendBytes("\xff\xff\xff\xff"));
  proto::StoreResponse error = raw.ReadResponse();
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(error.message(),
              HasSubstr("frame of 4294967295 bytes exceeds the limit of 67108864"));
  EXPECT_TRUE(raw.ClosedByServer());
  ExpectServes(*server);
}

TEST(TcpStoreServerFaultTest, BeforeAuthenticationOnlyHandshakeSizedFramesAreAccepted) {
  auto server = StartServer();
  RawConnection raw(server->port());
  // 1 MiB is well within the limit for an authenticated client, not for a stranger.
  ASSERT_TRUE(raw.SendBytes(std::string("\x00\x00\x10\x00", 4)));
  proto::StoreResponse error = raw.ReadResponse();
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(error.message(), HasSubstr("frame of 1048576 bytes exceeds the limit of 4096 bytes"));
  EXPECT_THAT(error.message(), HasSubstr("before authentication"));
  EXPECT_TRUE(raw.ClosedByServer());
  ExpectServes(*server);
}

TEST(TcpStoreServerFaultTest, ATruncatedFrameThenCloseLeavesTheServerServing) {
  auto server = StartServer();
  auto bystander = ConnectClient(server->port());
  {
    RawConnection raw(server->port());
    ASSERT_TRUE(raw.SendBytes(std::string("\x64\x00\x00\x00partial...", 14)));
  }  // closed mid-frame
  EXPECT_TRUE(Eventually([&] { return server->stats().connections_open == 1; }))
      << "the truncated connection is forgotten";
  EXPECT_TRUE(bystander->Set("after/truncation", "ok", kTimeout).ok());
  ExpectServes(*server);
}

TEST(TcpStoreServerFaultTest, ARequestBeforeAuthenticationIsRefused) {
  auto server = StartServer();
  RawConnection raw(server->port());
  ASSERT_TRUE(raw.Send(GetRequest(7, "secret")));
  proto::StoreResponse error = raw.ReadResponse();
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(error.message(), HasSubstr("before authentication"));
  EXPECT_TRUE(raw.ClosedByServer());
  ExpectServes(*server);
}

TEST(TcpStoreServerFaultTest, AnEmptyKeyOnTheWireIsRefusedAndTheConnectionClosed) {
  auto server = StartServer();
  RawConnection raw(server->port());
  ASSERT_EQ(raw.Authenticate(kJob, kToken).code(), 0);
  proto::ClientMessage set;
  set.mutable_request()->set_request_id(3);
  set.mutable_request()->mutable_set()->set_value("v");
  ASSERT_TRUE(raw.Send(set));
  proto::StoreResponse error = raw.ReadResponse();
  EXPECT_EQ(error.request_id(), 3u);
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(error.message(), HasSubstr("store key must not be empty (in a Set request)"));
  EXPECT_TRUE(raw.ClosedByServer());
  ExpectServes(*server);
}

TEST(TcpStoreServerFaultTest, ARequestWithAnUnknownOperationIsRefused) {
  auto server = StartServer();
  RawConnection raw(server->port());
  ASSERT_EQ(raw.Authenticate(kJob, kToken).code(), 0);
  // A request (field 3 of ClientMessage) holding id 9 and an operation number 99 this server does
  // not know.
  const std::string request("\x08\x09\x98\x06\x01", 5);
  const std::string message = std::string("\x1a") + static_cast<char>(request.size()) + request;
  const std::string frame =
      std::string(1, static_cast<char>(message.size())) + std::string("\x00\x00\x00", 3) + message;
  ASSERT_TRUE(raw.SendBytes(frame));
  proto::StoreResponse error = raw.ReadResponse();
  EXPECT_EQ(error.request_id(), 9u);
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(error.message(), HasSubstr("no operation this server knows"));
  EXPECT_TRUE(raw.ClosedByServer());
  ExpectServes(*server);
}

TEST(TcpStoreServerFaultTest, ASilentClientIsDroppedAfterTheAuthTimeout) {
  TcpStoreServerOptions options = ServerOptions();
  options.auth_timeout = absl::Milliseconds(200);
  auto server = StartServer(options);
  const absl::Time start = absl::Now();
  RawConnection raw(server->port());
  proto::StoreResponse error = raw.ReadResponse();
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(error.message(), HasSubstr("no authentication within 200ms"));
  EXPECT_TRUE(raw.ClosedByServer());
  EXPECT_GE(waited, absl::Milliseconds(190));
  EXPECT_LT(waited, absl::Seconds(5));
  ExpectServes(*server);
}

TEST(TcpStoreServerFaultTest, AClientThatDoesNotReadItsResponsesIsDisconnected) {
  TcpStoreServerOptions options = ServerOptions();
  options.max_frame_bytes = 64 << 10;
  options.max_pending_write_bytes = 256 << 10;
  auto server = StartServer(options);
  auto writer = ConnectClient(server->port());
  ASSERT_TRUE(writer->Set("big", std::string(60 << 10, 'x'), kTimeout).ok());

  RawConnection greedy(server->port());
  ASSERT_EQ(greedy.Authenticate(kJob, kToken).code(), 0);
  // 2000 pipelined Gets ask for 120 MB of answers; the socket buffers hold a few MB at most.
  std::string requests;
  for (uint64_t id = 1; id <= 2000; ++id) {
    ASSERT_TRUE(store_wire::AppendFrame(GetRequest(id, "big"), 1 << 20, "test", &requests).ok());
  }
  ASSERT_TRUE(greedy.SendBytes(requests));
  EXPECT_TRUE(Eventually([&] {
    return server->stats().last_error.find("does not read its responses") != std::string::npos;
  })) << server->stats().last_error;
  EXPECT_TRUE(writer->Set("after/greedy", "ok", kTimeout).ok());
  EXPECT_TRUE(greedy.ClosedByServer());
  ExpectServes(*server);
}

// --- Load, restart, crash.

TEST(TcpStoreServerTest, SixtyFourConcurrentClientsAllCompleteARendezvous) {
  auto server = StartServer();
  constexpr int kClients = 64;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  threads.reserve(kClients);
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto store = TcpStore::Connect(ClientOptions(server->port()));
      if (!store.ok()) {
        ++failures;
        return;
      }
      const std::string mine = absl::StrCat("rank/", i);
      if (!(*store)->Set(mine, absl::StrCat(i), kTimeout).ok()) ++failures;
      absl::StatusOr<int64_t> arrived = (*store)->Add("arrived", 1, kTimeout);
      if (!arrived.ok()) ++failures;
      if (arrived.ok() && *arrived == kClients && !(*store)->Set("done", "1", kTimeout).ok()) {
        ++failures;
      }
      if (!(*store)->Wait({"done", mine}, kTimeout).ok()) ++failures;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto store = ConnectClient(server->port());
  EXPECT_EQ(*store->Get("arrived", kTimeout), "64");
  EXPECT_EQ(store->ListKeys("rank/", kTimeout)->size(), 64u);
}

// 8 threads each add 1 to `key` 50 times on `shared`: every Add succeeds and the sum is theirs.
void ExpectEightThreadsAddOnOneClient(TcpStore& shared, const std::string& key) {
  constexpr int kThreads = 8;
  constexpr int kAddsEach = 50;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      for (int n = 0; n < kAddsEach; ++n) {
        if (!shared.Add(key, 1, kTimeout).ok()) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(*shared.Get(key, kTimeout), absl::StrCat(kThreads * kAddsEach));
}

TEST(TcpStoreServerTest, OneClientSharedByManyThreadsSerializesTheirCalls) {
  auto server = StartServer();
  auto shared = ConnectClient(server->port());
  ExpectEightThreadsAddOnOneClient(*shared, "shared/sum");
}

TEST(TcpStoreServerTest, AClientReconnectsWhenTheServerRestartsOnTheSamePort) {
  auto server = StartServer();
  const int port = server->port();
  auto client = ConnectClient(port);
  ASSERT_TRUE(client->Set("before", "restart", kTimeout).ok());

  server.reset();
  absl::Status down = client->Set("while", "down", absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsUnavailable(down)) << down;
  EXPECT_THAT(std::string(down.message()), HasSubstr(absl::StrCat("127.0.0.1:", port)));

  TcpStoreServerOptions options = ServerOptions();
  options.port = port;
  server = StartServer(options);
  // Add is not idempotent: it succeeds because the client notices the dead connection before
  // sending, not by retrying blindly.
  absl::StatusOr<int64_t> added = client->Add("after", 1, kTimeout);
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(*added, 1);
  EXPECT_TRUE(absl::IsNotFound(client->Get("before", kTimeout).status()))
      << "a restarted server starts empty";
}

TEST(TcpStoreServerTest, AClientProcessKilledDuringAWaitLeavesTheServerServing) {
  // Fork before any thread exists, so the child is a clean single-threaded process.
  int port_pipe[2];
  ASSERT_EQ(pipe(port_pipe), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(port_pipe[1]);
    int port = 0;
    if (read(port_pipe[0], &port, sizeof(port)) != sizeof(port)) _exit(2);
    auto store = TcpStore::Connect(ClientOptions(port));
    if (!store.ok()) _exit(3);
    (void)(*store)->Wait({"never/set"}, absl::Seconds(60));
    _exit(4);
  }
  close(port_pipe[0]);
  auto server = StartServer();
  const int port = server->port();
  ASSERT_EQ(write(port_pipe[1], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  close(port_pipe[1]);

  ASSERT_TRUE(Eventually([&] { return server->stats().waits_parked == 1; }))
      << "the child never parked its Wait";
  ASSERT_EQ(SignalOwnProcess(child, SIGKILL), absl::OkStatus());
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  EXPECT_TRUE(Eventually([&] {
    TcpStoreServerStats stats = server->stats();
    return stats.waits_parked == 0 && stats.connections_open == 0;
  })) << "the dead client's Wait and connection are released";
  ExpectServes(*server);
}

TEST(TcpStoreServerTest, StatsCountTheBytesEachWayOnTheClientsSockets) {
  auto server = StartServer();
  auto client = ConnectClient(server->port());
  const TcpStoreServerStats before = server->stats();
  const std::string value(10'000, 'v');
  ASSERT_TRUE(client->Set("bytes/counted", value, kTimeout).ok());
  // The value went in before its answer came out (the received bytes are counted as they are
  // read); the answer's bytes are counted once its send returned, which the client may beat.
  EXPECT_GE(server->stats().bytes_received - before.bytes_received, 10'000);
  ASSERT_TRUE(Eventually([&] { return server->stats().bytes_sent > before.bytes_sent; }));
  const TcpStoreServerStats after_set = server->stats();
  EXPECT_LT(after_set.bytes_sent - before.bytes_sent, 10'000) << "an acknowledgement is small";
  absl::StatusOr<std::string> read = client->Get("bytes/counted", kTimeout);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(Eventually([&] {
    return server->stats().bytes_sent - after_set.bytes_sent >= 10'000;
  })) << "the value went out";
}

TEST(TcpStoreServerTest, DestroyingTheServerDoesNotWaitForParkedWaits) {
  auto server = StartServer();
  const std::string address = server->address();
  auto client = ConnectClient(server->port());
  absl::Status waited;
  std::thread waiter([&] { waited = client->Wait({"never/set"}, absl::Seconds(2)); });
  ASSERT_TRUE(Eventually([&] { return server->stats().waits_parked == 1; }));
  const absl::Time start = absl::Now();
  server.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // bounded: it does not wait the 2 s out
  waiter.join();
  EXPECT_TRUE(absl::IsUnavailable(waited)) << waited;
  EXPECT_THAT(std::string(waited.message()), HasSubstr(address));
}

// A listening socket on loopback, for the test servers below: its descriptor, and its port in
// `port`.
int ListenOnLoopback(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0) {
    std::abort();
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

// A server that authenticates clients and then drops every connection as soon as a request
// arrives, without answering: the outcome of that request is unknown to the client.
class RequestSwallowingServer {
 public:
  RequestSwallowingServer() : state_(1 << 20) {
    listen_fd_ = ListenOnLoopback(&port_);
    auth_.default_token = kToken;
    thread_ = std::thread([this] { Serve(); });
  }
  ~RequestSwallowingServer() {
    stop_.store(true);
    shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
    thread_.join();
    close(listen_fd_);
  }
  int port() const { return port_; }
  int requests_swallowed() const { return swallowed_.load(); }

 private:
  void Serve() {
    uint64_t id = 1;
    while (!stop_.load()) {
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      timeval tv{.tv_sec = 5, .tv_usec = 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      StoreSession session(id++, "test-client", &auth_, &state_, 1 << 20);
      char buf[4096];
      std::string out;
      while (true) {
        const ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        if (session.authenticated()) {
          ++swallowed_;
          break;  // a request arrived: hang up without an answer
        }
        out.clear();
        session.OnBytes(std::string_view(buf, n), absl::Now(), &out);
        if (send(fd, out.data(), out.size(), MSG_NOSIGNAL) < 0) break;
      }
      close(fd);
    }
  }

  StoreAuthPolicy auth_;
  StoreState state_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> swallowed_{0};
  std::thread thread_;
};

TEST(TcpStoreClientTest, AnAddWhoseConnectionIsLostAfterSendingReportsTheOutcomeUnknown) {
  RequestSwallowingServer server;
  auto client = ConnectClient(server.port());
  absl::StatusOr<int64_t> added = client->Add("counter", 1, kTimeout);
  EXPECT_TRUE(absl::IsUnavailable(added.status())) << added.status();
  EXPECT_THAT(std::string(added.status().message()),
              HasSubstr(absl::StrCat("connection to 127.0.0.1:", server.port(),
                                     " lost after sending Add(counter); outcome unknown")));
  EXPECT_EQ(server.requests_swallowed(), 1) << "a non-idempotent Add is sent once";

  auto swapped = client->CompareAndSet("leader", std::nullopt, "me", kTimeout);
  EXPECT_TRUE(absl::IsUnavailable(swapped.status())) << swapped.status();
  EXPECT_THAT(std::string(swapped.status().message()), HasSubstr("outcome unknown"));
}

// A server that holds its answer to the first request after authentication until Release, then
// sends it and answers every later request at once; it counts the connections it accepted.
class LateAnsweringServer {
 public:
  LateAnsweringServer() : state_(1 << 20) {
    listen_fd_ = ListenOnLoopback(&port_);
    auth_.default_token = kToken;
    thread_ = std::thread([this] { Serve(); });
  }
  ~LateAnsweringServer() {
    Release();
    stop_.store(true);
    shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
    thread_.join();
    close(listen_fd_);
  }
  int port() const { return port_; }
  int connections() const { return connections_.load(); }
  void Release() { release_.Notify(); }
  // Whether the held answer was sent within `timeout`.
  bool LateAnswerSent(absl::Duration timeout) {
    return late_sent_.WaitForNotificationWithTimeout(timeout);
  }

 private:
  void Serve() {
    uint64_t id = 1;
    bool held = false;
    while (!stop_.load()) {
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      ++connections_;
      timeval tv{.tv_sec = 5, .tv_usec = 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      StoreSession session(id++, "test-client", &auth_, &state_, 1 << 20);
      char buf[4096];
      std::string out;
      while (!stop_.load()) {
        const ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        const bool request = session.authenticated();
        out.clear();
        session.OnBytes(std::string_view(buf, n), absl::Now(), &out);
        if (request && !held) {
          held = true;
          (void)release_.WaitForNotificationWithTimeout(absl::Seconds(30));
        }
        if (send(fd, out.data(), out.size(), MSG_NOSIGNAL) < 0) break;
        if (held && !late_sent_.HasBeenNotified()) late_sent_.Notify();
      }
      close(fd);
    }
  }

  StoreAuthPolicy auth_;
  StoreState state_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  Notification release_;
  Notification late_sent_;
  std::thread thread_;
};

TEST(TcpStoreClientTest, ALateAnswerIsDroppedByTheNextCallOnTheSameConnection) {
  LateAnsweringServer server;
  auto client = ConnectClient(server.port());
  // The first request's answer is held past its call's timeout.
  absl::StatusOr<std::string> late = client->Get("k", absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(late.status())) << late.status();
  server.Release();
  ASSERT_TRUE(server.LateAnswerSent(kTimeout));
  // The next calls read past the late answer to their own, on the connection they had.
  ASSERT_TRUE(client->Set("k", "after", kTimeout).ok());
  absl::StatusOr<std::string> got = client->Get("k", kTimeout);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "after");
  EXPECT_EQ(server.connections(), 1) << "a late answer does not cost a reconnection";
}

TEST(TcpStoreClientTest, AnIdempotentRequestIsRetriedUntilItsTimeout) {
  RequestSwallowingServer server;
  auto client = ConnectClient(server.port());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> got = client->Get("k", absl::Seconds(2));
  // The last attempt ends either with the lost connection (Unavailable) or, on a loaded machine,
  // with the deadline running out while it waits (DeadlineExceeded); both name the server.
  EXPECT_TRUE(absl::IsUnavailable(got.status()) || absl::IsDeadlineExceeded(got.status()))
      << got.status();
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr(absl::StrCat("127.0.0.1:", server.port())));
  EXPECT_GT(server.requests_swallowed(), 1) << "Get is retried on a new connection";
  EXPECT_LT(absl::Now() - start, absl::Seconds(6)) << "the deadline bounds the retries";
}

TEST(TcpStoreClientTest, ConnectingToAPortWithNoServerIsUnavailableNamingTheAddress) {
  const int port = UnusedPort();
  TcpStoreOptions options = ClientOptions(port);
  options.connect_timeout = absl::Milliseconds(300);
  auto store = TcpStore::Connect(options);
  EXPECT_TRUE(absl::IsUnavailable(store.status())) << store.status();
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(absl::StrCat("127.0.0.1:", port)));
}

TEST(TcpStoreClientTest, AClientWithASourceAddressConnectsFromThatAddress) {
  auto listener = OrDie(PeerRecordingListener::Start());
  TcpStoreOptions options = ClientOptions(listener->port());
  options.source_address = "127.0.0.5";
  options.connect_timeout = absl::Seconds(2);
  absl::Status connected;
  std::thread client([&] { connected = TcpStore::Connect(options).status(); });
  absl::StatusOr<std::string> peer = listener->AcceptOnePeer(kTimeout);
  client.join();
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(*peer, "127.0.0.5");
  EXPECT_FALSE(connected.ok()) << "the listener speaks no protocol";
}

TEST(TcpStoreClientTest, OpenStoreWithASourceAddressConnectsFromThatAddress) {
  auto listener = OrDie(PeerRecordingListener::Start());
  OpenStoreOptions options;
  options.source_address = "127.0.0.6";
  absl::Status opened;
  std::thread client([&] {
    opened = OpenStore(absl::StrCat("tcp://127.0.0.1:", listener->port()), kJob, kToken,
                       absl::Seconds(2), options)
                 .status();
  });
  absl::StatusOr<std::string> peer = listener->AcceptOnePeer(kTimeout);
  client.join();
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(*peer, "127.0.0.6");
  EXPECT_FALSE(opened.ok()) << "the listener speaks no protocol";
}

TEST(TcpStoreClientTest, ASourceAddressThatIsNotNumericIsInvalidArgumentNamingIt) {
  auto server = StartServer();
  TcpStoreOptions options = ClientOptions(server->port());
  options.source_address = "host-3";
  auto store = TcpStore::Connect(options);
  EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << store.status();
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("source_address 'host-3'"));
}

TEST(TcpStoreClientTest, ASourceAddressNotOfThisHostIsUnavailableNamingIt) {
  auto server = StartServer();
  TcpStoreOptions options = ClientOptions(server->port());
  options.source_address = "192.0.2.1";  // TEST-NET-1: never an address of this host
  options.connect_timeout = absl::Milliseconds(300);
  auto store = TcpStore::Connect(options);
  EXPECT_TRUE(absl::IsUnavailable(store.status())) << store.status();
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr("cannot bind source address 192.0.2.1"));
}

TEST(TcpStoreClientTest, AValueOverTheServersFrameLimitIsRefusedBeforeSending) {
  TcpStoreServerOptions options = ServerOptions();
  options.max_frame_bytes = 64 << 10;
  options.max_pending_write_bytes = 1 << 20;
  auto server = StartServer(options);
  auto client = ConnectClient(server->port());
  absl::Status s = client->Set("too/big", std::string(100 << 10, 'x'), kTimeout);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("Set(too/big)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("frame limit of 65536 bytes"));
  EXPECT_EQ(server->stats().protocol_errors, 0);
  EXPECT_TRUE(client->Set("small", "ok", kTimeout).ok());
}

TEST(TcpStoreServerTest, AResponseOverTheFrameLimitBecomesAnError) {
  TcpStoreServerOptions options = ServerOptions();
  options.max_frame_bytes = 64 << 10;
  options.max_pending_write_bytes = 1 << 20;
  auto server = StartServer(options);
  auto client = ConnectClient(server->port());
  ASSERT_TRUE(client->Set("half/1", std::string(40 << 10, 'a'), kTimeout).ok());
  ASSERT_TRUE(client->Set("half/2", std::string(40 << 10, 'b'), kTimeout).ok());
  auto both = client->MultiGet({"half/1", "half/2"}, kTimeout);
  EXPECT_TRUE(absl::IsResourceExhausted(both.status())) << both.status();
  EXPECT_THAT(std::string(both.status().message()), HasSubstr("exceeds the frame limit"));
  EXPECT_EQ(client->Get("half/1", kTimeout)->size(), size_t{40 << 10});
}

TEST(TcpStoreServerTest, AnAddThatWouldOverflowIsOutOfRangeAndChangesNothing) {
  auto server = StartServer();
  auto client = ConnectClient(server->port());
  ASSERT_TRUE(client->Set("n", "9223372036854775807", kTimeout).ok());
  auto added = client->Add("n", 1, kTimeout);
  EXPECT_TRUE(absl::IsOutOfRange(added.status())) << added.status();
  EXPECT_EQ(*client->Get("n", kTimeout), "9223372036854775807");
}

// A rank's store client is shared by its threads: one parked in a Wait for minutes (a new
// generation) must not hold up the others' calls (its heartbeats), which would get it killed as
// dead. (Before the connection pool, the Add below waited for the Wait's 2 minutes.)
TEST(TcpStoreServerTest, CallsFromOtherThreadsAreAnsweredWhileOneThreadWaitsOnTheSameClient) {
  auto server = StartServer();
  auto shared = ConnectClient(server->port());
  absl::Status waited = absl::UnknownError("not returned");
  std::atomic<bool> wait_returned{false};
  std::thread waiter([&] {
    waited = shared->Wait({"released", "also_released"}, absl::Minutes(2));
    wait_returned = true;
  });
  ASSERT_TRUE(Eventually([&] { return server->stats().waits_parked == 1; }));
  // A heartbeat's worth of calls while the Wait is parked, and a second Wait of their own.
  for (int beat = 0; beat < 20; ++beat) {
    ASSERT_TRUE(shared->Add("heartbeat", 1, kTimeout).ok());
  }
  EXPECT_EQ(*shared->Get("heartbeat", kTimeout), "20");
  ASSERT_TRUE(shared->Set("released", "1", kTimeout).ok());
  EXPECT_TRUE(shared->Wait({"released"}, kTimeout).ok());
  EXPECT_FALSE(wait_returned.load()) << "the long Wait ended early: " << waited;
  ASSERT_TRUE(shared->Set("also_released", "1", kTimeout).ok());
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited;
}

// The pool opens a connection only when calls overlap: one thread alone, Waits included, keeps to
// the connection Connect opened (a rendezvous of 1,024 clients opens 1,024 connections, not 2,048).
TEST(TcpStoreServerTest, OneThreadAloneUsesOneConnectionAndOverlappingCallsOpenMore) {
  auto server = StartServer();
  auto client = ConnectClient(server->port());
  ASSERT_TRUE(client->Set("k", "v", kTimeout).ok());
  ASSERT_TRUE(client->Wait({"k"}, kTimeout).ok());
  ASSERT_TRUE(client->Add("n", 1, kTimeout).ok());
  EXPECT_EQ(server->stats().connections_accepted, 1);
  std::thread waiter([&] { EXPECT_TRUE(client->Wait({"later"}, kTimeout).ok()); });
  ASSERT_TRUE(Eventually([&] { return server->stats().waits_parked == 1; }));
  ASSERT_TRUE(client->Set("later", "1", kTimeout).ok());  // on a second connection
  waiter.join();
  EXPECT_EQ(server->stats().connections_accepted, 2);
  // Both are kept: later overlapping calls reuse them.
  std::thread again([&] { EXPECT_TRUE(client->Wait({"later2"}, kTimeout).ok()); });
  ASSERT_TRUE(Eventually([&] { return server->stats().waits_parked == 1; }));
  ASSERT_TRUE(client->Set("later2", "1", kTimeout).ok());
  again.join();
  EXPECT_EQ(server->stats().connections_accepted, 2);
}

std::unique_ptr<TcpStore> ConnectCapped(int port, int max_connections) {
  TcpStoreOptions options = ClientOptions(port);
  options.max_connections = max_connections;
  return OrDie(TcpStore::Connect(options));
}

TEST(TcpStoreClientTest, ManyThreadsOnOneClientHoldNoMoreConnectionsThanItsCap) {
  auto server = StartServer();
  auto shared = ConnectCapped(server->port(), 2);
  ExpectEightThreadsAddOnOneClient(*shared, "capped/sum");
  EXPECT_LE(server->stats().connections_accepted, 2);
}

// Waits parked on the server hold connections of their own: a client capped at one connection
// still answers its other threads' calls, and a second wait, while two waits are parked.
TEST(TcpStoreClientTest, ParkedWaitsTakeNoSlotOfTheCapAndNeverHoldUpShortCalls) {
  auto server = StartServer();
  auto shared = ConnectCapped(server->port(), 1);
  std::thread first([&] { EXPECT_TRUE(shared->Wait({"go"}, absl::Minutes(2)).ok()); });
  std::thread second([&] { EXPECT_TRUE(shared->WaitAny({"go", "never"}, absl::Minutes(2)).ok()); });
  ASSERT_TRUE(Eventually([&] { return server->stats().waits_parked == 2; }));
  for (int beat = 0; beat < 10; ++beat) ASSERT_TRUE(shared->Add("beat", 1, kTimeout).ok());
  ASSERT_TRUE(shared->Set("go", "1", kTimeout).ok());
  first.join();
  second.join();
  EXPECT_EQ(server->stats().connections_accepted, 3) << "one per parked wait and one for the rest";
}

TEST(TcpStoreClientTest, ACallThatFindsNoConnectionFreeWithinItsTimeoutFailsNamingTheCap) {
  RequestSwallowingServer server;
  auto client = ConnectCapped(server.port(), 1);
  // An idempotent Get retried on the swallowing server holds the one connection for its timeout.
  std::thread holder([&] { EXPECT_FALSE(client->Get("held", absl::Milliseconds(1500)).ok()); });
  ASSERT_TRUE(Eventually([&] { return server.requests_swallowed() >= 1; }));
  const absl::Status set = client->Set("k", "v", absl::Milliseconds(200));
  holder.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(set)) << set;
  EXPECT_THAT(std::string(set.message()), HasSubstr("Set(k) on store server 127.0.0.1:"));
  EXPECT_THAT(std::string(set.message()),
              HasSubstr("no connection came free within 200ms: all 1 of this client's connections "
                        "(TcpStoreOptions.max_connections) carry other calls"));
}

TEST(TcpStoreClientTest, AConnectionLostUnderACallFreesItsSlot) {
  RequestSwallowingServer server;
  auto client = ConnectCapped(server.port(), 1);
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::atomic<int> outcome_unknown{0};
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      const absl::StatusOr<int64_t> added = client->Add("counter", 1, kTimeout);
      if (absl::IsUnavailable(added.status()) &&
          absl::StrContains(added.status().message(), "outcome unknown")) {
        ++outcome_unknown;
      } else {
        ADD_FAILURE() << added.status();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(outcome_unknown.load(), kThreads) << "each Add got the slot its predecessor freed";
  EXPECT_EQ(server.requests_swallowed(), kThreads);
}

TEST(TcpStoreClientTest, AMaxConnectionsBelowOneIsInvalidArgumentNamingIt) {
  auto server = StartServer();
  TcpStoreOptions options = ClientOptions(server->port());
  options.max_connections = 0;
  absl::StatusOr<std::unique_ptr<TcpStore>> client = TcpStore::Connect(options);
  EXPECT_TRUE(absl::IsInvalidArgument(client.status())) << client.status();
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("TcpStoreOptions.max_connections"));
}

TEST(TcpStoreServerTest, AWaitIsAnsweredWhenItsKeysExistTogether) {
  auto server = StartServer();
  auto waiter = ConnectClient(server->port());
  auto writer = ConnectClient(server->port());
  absl::Status waited;
  std::thread t([&] { waited = waiter->Wait({"x", "y"}, kTimeout); });
  ASSERT_TRUE(Eventually([&] { return server->stats().waits_parked == 1; }));
  ASSERT_TRUE(writer->Set("x", "1", kTimeout).ok());
  ASSERT_TRUE(*writer->Delete("x", kTimeout));
  ASSERT_TRUE(writer->Set("y", "1", kTimeout).ok());
  EXPECT_EQ(server->stats().waits_parked, 1) << "x was deleted before y appeared";
  ASSERT_TRUE(writer->Set("x", "2", kTimeout).ok());
  t.join();
  EXPECT_TRUE(waited.ok()) << waited;
}

// A WaitAny is parked under each of its keys: the first written answers it (with its index),
// a key deleted before it never does, and the parked wait is forgotten once answered.
TEST(TcpStoreServerTest, AParkedWaitAnyIsAnsweredByTheFirstOfItsKeysWritten) {
  auto server = StartServer();
  auto waiter = ConnectClient(server->port());
  auto writer = ConnectClient(server->port());
  ASSERT_TRUE(writer->Set("unrelated", "1", kTimeout).ok());
  absl::StatusOr<size_t> found = absl::UnknownError("not answered");
  std::thread t([&] { found = waiter->WaitAny({"p", "q", "r"}, kTimeout); });
  ASSERT_TRUE(Eventually([&] { return server->stats().waits_parked == 1; }));
  ASSERT_TRUE(writer->Set("unrelated", "2", kTimeout).ok());
  ASSERT_TRUE(*writer->Add("counter", 1, kTimeout) == 1);
  EXPECT_EQ(server->stats().waits_parked, 1) << "no key of the WaitAny was written yet";
  ASSERT_TRUE(writer->Set("r", "3", kTimeout).ok());
  t.join();
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, 2u);
  EXPECT_EQ(server->stats().waits_parked, 0);
  // Answered once: writing its other keys later answers nothing and leaves nothing parked.
  ASSERT_TRUE(writer->Set("p", "1", kTimeout).ok());
  EXPECT_EQ(server->stats().waits_parked, 0);
  ExpectServes(*server);
}

TEST(TcpStoreServerTest, AWaitParkedOnABatchsFirstKeyIsAnsweredWithItsLast) {
  auto server = StartServer();
  auto waiter = ConnectClient(server->port());
  auto writer = ConnectClient(server->port());
  absl::StatusOr<std::vector<std::optional<std::string>>> values =
      absl::UnknownError("not answered");
  std::thread t([&] {
    values = waiter->WaitAndRead({"gen/2/table"}, {"gen/2/changes", "current"}, kTimeout);
  });
  ASSERT_TRUE(Eventually([&] { return server->stats().waits_parked == 1; }));
  absl::StatusOr<std::vector<CompareAndSetResult>> written = writer->WriteBatch(
      {BatchWrite::Set("gen/2/table", "t"), BatchWrite::Set("gen/2/changes", "c"),
       BatchWrite::RaiseFence(2), BatchWrite::CompareAndSet("plan/1", std::nullopt, "superseded"),
       BatchWrite::Set("current", "2")},
      kTimeout);
  t.join();
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ::testing::ElementsAre("c", "2"));
  EXPECT_EQ(server->stats().waits_parked, 0);
  ExpectServes(*server);
}

// A control client (the coordinator's, an agent's: TcpStoreOptions::control) is read in the
// server's control lane, ahead of the other connections, on its job's own keys: its writes answer
// the others' waits and theirs its waits; it leaves the lane when it closes.
TEST(TcpStoreServerTest, AControlClientIsServedInTheControlLaneOnItsJobsKeys) {
  auto server = StartServer();
  TcpStoreOptions options = ClientOptions(server->port());
  options.control = true;
  std::unique_ptr<TcpStore> control = OrDie(TcpStore::Connect(options));
  auto rank = ConnectClient(server->port());
  ASSERT_TRUE(control->Set("plan", "p", kTimeout).ok());
  EXPECT_EQ(server->stats().control_connections, 1) << "its one connection, and the rank's not";
  EXPECT_EQ(OrDie(rank->Get("plan", kTimeout)), "p");

  absl::Status waited = absl::UnknownError("not answered");
  std::thread control_waits([&] { waited = control->Wait({"joined"}, kTimeout); });
  ASSERT_TRUE(Eventually([&] { return server->stats().waits_parked == 1; }));
  ASSERT_TRUE(rank->Set("joined", "1", kTimeout).ok());
  control_waits.join();
  EXPECT_TRUE(waited.ok()) << waited;

  std::thread rank_waits([&] { waited = rank->Wait({"table"}, kTimeout); });
  ASSERT_TRUE(Eventually([&] { return server->stats().waits_parked == 1; }));
  ASSERT_TRUE(control->Set("table", "t", kTimeout).ok());
  rank_waits.join();
  EXPECT_TRUE(waited.ok()) << waited;

  control.reset();
  EXPECT_TRUE(Eventually([&] { return server->stats().control_connections == 0; }));
  ExpectServes(*server);
}

// One write wakes more parked waits than one turn of the server's loop answers
// (TcpStoreServer::kCompletionsPerTurn): the rest go out over the next turns, every wait answered
// once, on its own connection, in the order each connection parked them.
TEST(TcpStoreServerTest, AWriteThatWakesMoreWaitsThanOneTurnAnswersEveryOne) {
  constexpr size_t kPerConnection = StoreState::kMaxParkedWaitsPerSession;
  constexpr size_t kConnections =
      (TcpStoreServer::kCompletionsPerTurn + 100 + kPerConnection - 1) / kPerConnection;
  auto server = StartServer();
  std::vector<std::unique_ptr<RawConnection>> waiters;
  for (size_t i = 0; i < kConnections; ++i) {
    waiters.push_back(std::make_unique<RawConnection>(server->port()));
    ASSERT_TRUE(waiters.back()->connected());
    ASSERT_EQ(waiters.back()->Authenticate(kJob, kToken).code(), 0);
    for (uint64_t id = 1; id <= kPerConnection; ++id) {
      proto::ClientMessage wait;
      wait.mutable_request()->set_request_id(id);
      wait.mutable_request()->mutable_wait()->add_keys("go");
      wait.mutable_request()->mutable_wait()->add_read_keys("go");
      wait.mutable_request()->mutable_wait()->set_timeout_ms(absl::ToInt64Milliseconds(kTimeout));
      ASSERT_TRUE(waiters.back()->Send(wait));
    }
  }
  const int64_t parked = static_cast<int64_t>(kConnections * kPerConnection);
  ASSERT_GT(parked, static_cast<int64_t>(TcpStoreServer::kCompletionsPerTurn));
  ASSERT_TRUE(Eventually([&] { return server->stats().waits_parked == parked; }));
  auto writer = ConnectClient(server->port());
  ASSERT_TRUE(writer->Set("go", "now", kTimeout).ok());
  for (auto& waiter : waiters) {
    for (uint64_t id = 1; id <= kPerConnection; ++id) {
      const proto::StoreResponse answer = waiter->ReadResponse();
      ASSERT_EQ(answer.code(), 0) << answer.message();
      EXPECT_EQ(answer.request_id(), id);
      ASSERT_EQ(answer.values_size(), 1);
      EXPECT_EQ(answer.values(0).value(), "now");
    }
  }
  EXPECT_EQ(server->stats().waits_parked, 0);
  ExpectServes(*server);
}

TEST(TcpStoreServerTest, AWaitAnyThatRunsOutIsForgotten) {
  auto server = StartServer();
  {
    auto waiter = ConnectClient(server->port());
    std::thread t([&] {
      absl::StatusOr<size_t> found = waiter->WaitAny({"never/a", "never/b"}, absl::Seconds(1));
      EXPECT_TRUE(absl::IsDeadlineExceeded(found.status())) << found.status();
    });
    ASSERT_TRUE(Eventually([&] { return server->stats().waits_parked == 1; }));
    t.join();
  }
  EXPECT_TRUE(Eventually([&] { return server->stats().waits_parked == 0; }));
  auto writer = ConnectClient(server->port());
  ASSERT_TRUE(writer->Set("never/a", "1", kTimeout).ok());
  ExpectServes(*server);
}

TEST(TcpStoreServerTest, StartRefusesBadOptionsNamingThem) {
  TcpStoreServerOptions no_token;
  auto s = TcpStoreServer::Start(no_token);
  EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("no token"));

  TcpStoreServerOptions tight = ServerOptions();
  tight.max_pending_write_bytes = tight.max_frame_bytes;
  s = TcpStoreServer::Start(tight);
  EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("max_pending_write_bytes"));

  TcpStoreServerOptions negative_poll = ServerOptions();
  negative_poll.busy_poll = absl::Microseconds(-1);
  s = TcpStoreServer::Start(negative_poll);
  EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("busy_poll"));
}

TEST(TcpStoreClientTest, ANegativeBusyPollIsInvalidArgumentNamingIt) {
  auto server = StartServer();
  TcpStoreOptions options = ClientOptions(server->port());
  options.busy_poll = absl::Microseconds(-1);
  auto store = TcpStore::Connect(options);
  EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << store.status();
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("busy_poll"));
}

TEST(TcpStoreServerTest, StartOnAPortInUseIsUnavailableNamingTheAddress) {
  auto first = StartServer();
  TcpStoreServerOptions options = ServerOptions();
  options.port = first->port();
  auto second = TcpStoreServer::Start(options);
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(first->address()));
}

}  // namespace
}  // namespace trainguard::testing
