// StoreSession: the server's side of one TcpStore connection, without the socket. It decodes the
// frames the peer sends, runs the handshake (sdk/rendezvous/store_auth.h), validates requests and
// executes them against a StoreState, and encodes every frame to send back. Anything malformed
// ends the session with an error frame naming the problem.
//
// Thread safety: none; the thread that owns the StoreState owns its sessions.
#ifndef TRAINGUARD_SDK_RENDEZVOUS_STORE_SESSION_H_
#define TRAINGUARD_SDK_RENDEZVOUS_STORE_SESSION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "sdk/proto/store.pb.h"
#include "sdk/rendezvous/store_frame.h"
#include "sdk/rendezvous/store_state.h"

namespace trainguard {

// Which token each job's clients must prove.
struct StoreAuthPolicy {
  // For every job not in `job_tokens`; empty: such jobs are refused.
  std::string default_token;
  std::map<std::string, std::string, std::less<>> job_tokens;

  // The token of `job`, or nullptr when the job is not served.
  const std::string* TokenFor(std::string_view job) const;
};

class StoreSession {
 public:
  // The frame limit before authentication: handshake messages are small, and a peer that has not
  // proven anything must not make the server buffer megabytes.
  static constexpr uint32_t kMaxHandshakeFrameBytes = 4096;

  enum class Verdict {
    kKeepOpen,
    // The peer broke the protocol (malformed, oversized, out of order, unauthenticated).
    kCloseProtocolError,
    // The peer failed to authenticate.
    kCloseAuthenticationFailure,
  };

  // REQUIRES: `auth` and `state` outlive the session.
  StoreSession(uint64_t id, std::string peer, const StoreAuthPolicy* auth, StoreState* state,
               uint32_t max_frame_bytes);

  StoreSession(const StoreSession&) = delete;
  StoreSession& operator=(const StoreSession&) = delete;

  // Consumes `bytes` received from the peer, appending every frame to send to `out`. After a
  // verdict other than kKeepOpen the session ignores further bytes and the connection is to be
  // closed once `out` is sent; its last frame is the error response naming the problem.
  Verdict OnBytes(std::string_view bytes, absl::Time now, std::string* out);

  // Appends `response` (e.g. the answer of a parked Wait) as a frame.
  void AppendResponse(const proto::StoreResponse& response, std::string* out) const;

  // Ends the session with `error` sent to the peer (request id 0), e.g. when it did not
  // authenticate in time.
  void Close(const absl::Status& error, std::string* out);

  bool authenticated() const { return phase_ == Phase::kAuthenticated; }
  bool closed() const { return phase_ == Phase::kClosed; }
  uint64_t id() const { return id_; }
  // "host:port" of the peer, and its job once known.
  const std::string& peer() const { return peer_; }
  const std::string& job() const { return job_; }
  // Whether its ClientHello said it is a control connection (ClientHello.control).
  bool control() const { return control_; }
  // Requests executed (including Waits parked).
  int64_t requests_executed() const { return requests_executed_; }
  // The error that closed the session, naming the peer; empty while open.
  const std::string& close_reason() const { return close_reason_; }

  // Skips the handshake: the session is authenticated as `job` (for the fuzzer and tests).
  void AuthenticateForTesting(std::string job);

 private:
  enum class Phase { kAwaitHello, kAwaitProof, kAuthenticated, kClosed };

  Verdict HandleFrame(std::string_view payload, absl::Time now, std::string* out);
  Verdict HandleHello(const proto::ClientHello& hello, std::string* out);
  Verdict HandleProof(const proto::ClientProof& proof, std::string* out);
  Verdict HandleRequest(const proto::StoreRequest& request, absl::Time now, std::string* out);
  // Sends `error` in answer to `request_id` and ends the session.
  Verdict Fail(uint64_t request_id, const absl::Status& error, Verdict verdict, std::string* out);
  std::string Who() const;

  const uint64_t id_;
  const std::string peer_;
  const StoreAuthPolicy* const auth_;
  StoreState* const state_;
  const uint32_t max_frame_bytes_;
  store_wire::FrameDecoder decoder_;
  Phase phase_ = Phase::kAwaitHello;
  Verdict verdict_ = Verdict::kKeepOpen;
  std::string job_;
  bool control_ = false;
  const std::string* token_ = nullptr;
  std::string server_nonce_;
  std::string client_nonce_;
  int64_t requests_executed_ = 0;
  std::string close_reason_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RENDEZVOUS_STORE_SESSION_H_
