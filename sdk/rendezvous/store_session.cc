#include "sdk/rendezvous/store_session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "sdk/core/job_id.h"
#include "sdk/rendezvous/store_auth.h"

namespace trainguard {

const std::string* StoreAuthPolicy::TokenFor(std::string_view job) const {
  auto it = job_tokens.find(job);
  if (it != job_tokens.end()) return &it->second;
  return default_token.empty() ? nullptr : &default_token;
}

StoreSession::StoreSession(uint64_t id, std::string peer, const StoreAuthPolicy* auth,
                           StoreState* state, uint32_t max_frame_bytes)
    : id_(id),
      peer_(std::move(peer)),
      auth_(auth),
      state_(state),
      max_frame_bytes_(max_frame_bytes),
      decoder_(std::min(max_frame_bytes, kMaxHandshakeFrameBytes)) {}

std::string StoreSession::Who() const {
  if (job_.empty()) return absl::StrCat("client ", peer_);
  return absl::StrCat("client ", peer_, " of job '", job_, "'");
}

void StoreSession::AuthenticateForTesting(std::string job) {
  job_ = std::move(job);
  phase_ = Phase::kAuthenticated;
  decoder_.set_max_frame_bytes(max_frame_bytes_);
}

void StoreSession::AppendResponse(const proto::StoreResponse& response, std::string* out) const {
  proto::ServerMessage message;
  *message.mutable_response() = response;
  absl::Status s = store_wire::AppendFrame(message, max_frame_bytes_, "store response", out);
  if (!s.ok()) {
    // StoreState keeps responses within the limit (less the envelope's few bytes); this is a last
    // line of defence.
    proto::ServerMessage error;
    *error.mutable_response() = StatusResponse(response.request_id(), s);
    (void)store_wire::AppendFrame(error, ~uint32_t{0}, "store error", out);
  }
}

void StoreSession::Close(const absl::Status& error, std::string* out) {
  if (phase_ == Phase::kClosed) return;
  (void)Fail(0, error, Verdict::kCloseProtocolError, out);
}

StoreSession::Verdict StoreSession::Fail(uint64_t request_id, const absl::Status& error,
                                         Verdict verdict, std::string* out) {
  AppendResponse(StatusResponse(request_id, error), out);
  phase_ = Phase::kClosed;
  verdict_ = verdict;
  close_reason_ = absl::StrCat(Who(), ": ", error.ToString());
  return verdict;
}

StoreSession::Verdict StoreSession::OnBytes(std::string_view bytes, absl::Time now,
                                            std::string* out) {
  if (phase_ == Phase::kClosed) return verdict_;
  decoder_.Append(bytes);
  while (phase_ != Phase::kClosed) {
    absl::StatusOr<std::optional<std::string_view>> frame = decoder_.Next();
    if (!frame.ok()) {
      return Fail(0,
                  absl::Status(frame.status().code(),
                               absl::StrCat(frame.status().message(), " (from ", Who(),
                                            authenticated() ? "" : ", before authentication", ")")),
                  Verdict::kCloseProtocolError, out);
    }
    if (!frame->has_value()) break;
    if (HandleFrame(**frame, now, out) != Verdict::kKeepOpen) break;
  }
  return phase_ == Phase::kClosed ? verdict_ : Verdict::kKeepOpen;
}

StoreSession::Verdict StoreSession::HandleFrame(std::string_view payload, absl::Time now,
                                                std::string* out) {
  proto::ClientMessage message;
  if (!message.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return Fail(0,
                absl::InvalidArgumentError(absl::StrFormat(
                    "frame of %d bytes from %s is not a valid ClientMessage (unparsable protobuf)",
                    payload.size(), Who())),
                Verdict::kCloseProtocolError, out);
  }
  switch (message.body_case()) {
    case proto::ClientMessage::kHello:
      if (phase_ != Phase::kAwaitHello) {
        return Fail(0,
                    absl::FailedPreconditionError(
                        absl::StrCat("unexpected ClientHello from ", Who(), " after the first")),
                    Verdict::kCloseProtocolError, out);
      }
      return HandleHello(message.hello(), out);
    case proto::ClientMessage::kProof:
      if (phase_ != Phase::kAwaitProof) {
        return Fail(0,
                    absl::FailedPreconditionError(absl::StrCat(
                        "unexpected ClientProof from ", Who(),
                        phase_ == Phase::kAwaitHello ? " before its ClientHello" : " (repeated)")),
                    Verdict::kCloseProtocolError, out);
      }
      return HandleProof(message.proof(), out);
    case proto::ClientMessage::kRequest:
      if (phase_ != Phase::kAuthenticated) {
        return Fail(message.request().request_id(),
                    absl::UnauthenticatedError(absl::StrCat(
                        "store request from ", Who(),
                        " before authentication: send ClientHello and ClientProof first")),
                    Verdict::kCloseProtocolError, out);
      }
      return HandleRequest(message.request(), now, out);
    case proto::ClientMessage::BODY_NOT_SET:
      break;
  }
  return Fail(0,
              absl::InvalidArgumentError(absl::StrFormat(
                  "frame of %d bytes from %s holds no message this server knows (empty or an "
                  "unknown kind)",
                  payload.size(), Who())),
              Verdict::kCloseProtocolError, out);
}

StoreSession::Verdict StoreSession::HandleHello(const proto::ClientHello& hello, std::string* out) {
  if (hello.protocol_version() != store_wire::kProtocolVersion) {
    return Fail(0,
                absl::FailedPreconditionError(absl::StrFormat(
                    "%s speaks store protocol version %d; this server speaks version %d", Who(),
                    hello.protocol_version(), store_wire::kProtocolVersion)),
                Verdict::kCloseProtocolError, out);
  }
  if (absl::Status s = ValidateJobId(hello.job_id()); !s.ok()) {
    return Fail(
        0, absl::InvalidArgumentError(absl::StrCat("ClientHello from ", Who(), ": ", s.message())),
        Verdict::kCloseProtocolError, out);
  }
  job_ = hello.job_id();
  control_ = hello.control();
  if (hello.client_nonce().size() != store_auth::kNonceBytes) {
    return Fail(0,
                absl::InvalidArgumentError(
                    absl::StrFormat("ClientHello from %s has a nonce of %d bytes; %d expected",
                                    Who(), hello.client_nonce().size(), store_auth::kNonceBytes)),
                Verdict::kCloseProtocolError, out);
  }
  token_ = auth_->TokenFor(job_);
  if (token_ == nullptr) {
    return Fail(0,
                absl::PermissionDeniedError(
                    absl::StrCat("job '", job_, "' is not served by this store server")),
                Verdict::kCloseAuthenticationFailure, out);
  }
  absl::StatusOr<std::string> nonce = store_auth::NewNonce();
  if (!nonce.ok()) return Fail(0, nonce.status(), Verdict::kCloseProtocolError, out);
  server_nonce_ = *std::move(nonce);
  client_nonce_ = hello.client_nonce();
  proto::ServerMessage message;
  proto::ServerChallenge* challenge = message.mutable_challenge();
  challenge->set_server_nonce(server_nonce_);
  challenge->set_server_proof(
      store_auth::Proof(*token_, store_auth::Role::kServer, server_nonce_, client_nonce_, job_));
  challenge->set_max_frame_bytes(max_frame_bytes_);
  (void)store_wire::AppendFrame(message, max_frame_bytes_, "ServerChallenge", out);
  phase_ = Phase::kAwaitProof;
  return Verdict::kKeepOpen;
}

StoreSession::Verdict StoreSession::HandleProof(const proto::ClientProof& proof, std::string* out) {
  const std::string expected =
      store_auth::Proof(*token_, store_auth::Role::kClient, server_nonce_, client_nonce_, job_);
  if (!store_auth::ProofMatches(expected, proof.client_proof())) {
    return Fail(0,
                absl::UnauthenticatedError(absl::StrCat(
                    "authentication failed for job '", job_, "' (", Who(),
                    "): the client's proof does not match the job token this server holds")),
                Verdict::kCloseAuthenticationFailure, out);
  }
  phase_ = Phase::kAuthenticated;
  decoder_.set_max_frame_bytes(max_frame_bytes_);
  AppendResponse(StatusResponse(0, absl::OkStatus()), out);
  return Verdict::kKeepOpen;
}

StoreSession::Verdict StoreSession::HandleRequest(const proto::StoreRequest& request,
                                                  absl::Time now, std::string* out) {
  if (absl::Status s = ValidateStoreRequest(request); !s.ok()) {
    return Fail(request.request_id(),
                absl::Status(s.code(), absl::StrCat(s.message(), " (from ", Who(), ")")),
                Verdict::kCloseProtocolError, out);
  }
  ++requests_executed_;
  std::optional<proto::StoreResponse> response = state_->Execute(id_, job_, request, now);
  if (response.has_value()) AppendResponse(*response, out);
  return Verdict::kKeepOpen;
}

}  // namespace trainguard
