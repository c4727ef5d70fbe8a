// libFuzzer target for the server's side of a TcpStore connection: arbitrary bytes go through the
// frame decoder, the ClientMessage parser, the handshake, request validation and execution against
// a real StoreState, with parked Waits expiring and completing. The invariants checked on every
// input: nothing crashes or leaks (ASan, UBSan); every byte the server would send back decodes as
// well-formed frames of ServerMessage; a session that ended sends nothing more; a session never
// parks more Waits than its limit; closing a session releases all of its Waits.
//
// Input layout: byte 0 chooses the mode (bit 0: start authenticated, skipping the handshake, so
// that mutations reach request execution; bits 1-7: the chunk size the stream is cut into, which
// exercises the incremental decoder); the rest is the byte stream a client would send. A second,
// well-behaved session shares the StoreState, so cross-session Wait completion is covered too.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/time/time.h"
#include "sdk/proto/store.pb.h"
#include "sdk/rendezvous/store_frame.h"
#include "sdk/rendezvous/store_session.h"
#include "sdk/rendezvous/store_state.h"

namespace {

using trainguard::StoreAuthPolicy;
using trainguard::StoreSession;
using trainguard::StoreState;

constexpr uint32_t kMaxFrameBytes = 1 << 20;
constexpr uint64_t kFuzzedSession = 1;
constexpr uint64_t kBystanderSession = 2;

void Check(bool condition) {
  if (!condition) __builtin_trap();
}

// Every byte of `out` must be whole frames, each a ServerMessage.
void CheckServerOutput(const std::string& out) {
  trainguard::store_wire::FrameDecoder decoder(kMaxFrameBytes);
  decoder.Append(out);
  while (true) {
    absl::StatusOr<std::optional<std::string_view>> frame = decoder.Next();
    Check(frame.ok());
    if (!frame->has_value()) break;
    trainguard::proto::ServerMessage message;
    Check(message.ParseFromArray((*frame)->data(), static_cast<int>((*frame)->size())));
    Check(message.body_case() != trainguard::proto::ServerMessage::BODY_NOT_SET);
  }
  Check(decoder.buffered_bytes() == 0);
}

const StoreAuthPolicy& Policy() {
  static const StoreAuthPolicy* policy = [] {
    auto* p = new StoreAuthPolicy;
    p->default_token = "fuzz-token";
    p->job_tokens.emplace("job-b", "job-b-token");
    return p;
  }();
  return *policy;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string_view stream(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t chunk = static_cast<size_t>(mode >> 1) * 7 + 1;

  StoreState state(kMaxFrameBytes - 16);
  StoreSession fuzzed(kFuzzedSession, "fuzz:1", &Policy(), &state, kMaxFrameBytes);
  StoreSession bystander(kBystanderSession, "fuzz:2", &Policy(), &state, kMaxFrameBytes);
  if ((mode & 1) != 0) fuzzed.AuthenticateForTesting("fuzz-job");
  bystander.AuthenticateForTesting("fuzz-job");

  // The bystander parks a Wait on a key the fuzzed session may well write.
  {
    trainguard::proto::ClientMessage wait;
    wait.mutable_request()->set_request_id(1);
    wait.mutable_request()->mutable_wait()->add_keys("k");
    wait.mutable_request()->mutable_wait()->set_timeout_ms(50);
    std::string frame, out;
    Check(trainguard::store_wire::AppendFrame(wait, kMaxFrameBytes, "fuzz", &frame).ok());
    Check(bystander.OnBytes(frame, absl::UnixEpoch(), &out) == StoreSession::Verdict::kKeepOpen);
    Check(out.empty());  // parked
  }

  absl::Time now = absl::UnixEpoch();
  std::string out;
  for (size_t offset = 0; offset < stream.size(); offset += chunk) {
    const std::string_view piece = stream.substr(offset, chunk);
    const size_t before = out.size();
    const bool was_closed = fuzzed.closed();
    const StoreSession::Verdict verdict = fuzzed.OnBytes(piece, now, &out);
    if (was_closed) Check(out.size() == before);
    if (verdict != StoreSession::Verdict::kKeepOpen) {
      Check(fuzzed.closed());
      Check(!fuzzed.close_reason().empty());
      state.CancelWaits(kFuzzedSession);
    }
    now += absl::Milliseconds(3);
    state.ExpireWaits(now);
    for (StoreState::Completion& completion : state.TakeCompletions()) {
      Check(completion.session_id == kFuzzedSession || completion.session_id == kBystanderSession);
      if (completion.session_id == kFuzzedSession && !fuzzed.closed()) {
        fuzzed.AppendResponse(completion.response, &out);
      }
    }
    Check(state.parked_waits() <= StoreState::kMaxParkedWaitsPerSession + 1);
  }
  CheckServerOutput(out);
  state.CancelWaits(kFuzzedSession);
  state.CancelWaits(kBystanderSession);
  Check(state.parked_waits() == 0);
  Check(!state.NextWaitDeadline().has_value());
  return 0;
}
