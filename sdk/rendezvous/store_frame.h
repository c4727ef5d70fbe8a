// The frame codec of the TcpStore wire protocol: a little-endian u32 payload length, then the
// payload (one serialized ClientMessage or ServerMessage of sdk/proto/store.proto).
//
// A length above the limit is an error as soon as its four bytes have arrived: nothing of the
// payload is buffered or allocated first.
//
// Thread safety: FrameDecoder is not thread-safe; the functions are.
#ifndef TRAINGUARD_SDK_RENDEZVOUS_STORE_FRAME_H_
#define TRAINGUARD_SDK_RENDEZVOUS_STORE_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace google::protobuf {
class MessageLite;
}  // namespace google::protobuf

namespace trainguard::store_wire {

// Sent in ClientHello; the server refuses other versions.
inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 4;

// The payload length in the four bytes at `header`.
uint32_t DecodeFrameLength(const char* header);

// Appends `message` to `out` as one frame. InvalidArgument (naming `what` and both sizes) when the
// serialized message is larger than `max_frame_bytes`; `out` is then unchanged.
absl::Status AppendFrame(const google::protobuf::MessageLite& message, uint32_t max_frame_bytes,
                         std::string_view what, std::string* out);

// Splits a byte stream into frame payloads.
class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_frame_bytes) : max_frame_bytes_(max_frame_bytes) {}

  FrameDecoder(const FrameDecoder&) = delete;
  FrameDecoder& operator=(const FrameDecoder&) = delete;

  // Changes the limit for the frames not yet returned.
  void set_max_frame_bytes(uint32_t max_frame_bytes) { max_frame_bytes_ = max_frame_bytes; }

  // Appends bytes received from the stream.
  void Append(std::string_view bytes);

  // The next complete payload, or nullopt when more bytes are needed. ResourceExhausted (naming
  // the length and the limit) when the next frame is larger than the limit; the stream is then
  // unusable. The view stays valid until the next call of Append or Next.
  absl::StatusOr<std::optional<std::string_view>> Next();

  // Drops every buffered byte (the stream restarts, e.g. on a new connection).
  void Clear() {
    buffer_.clear();
    consumed_ = 0;
  }

  // Bytes received and not yet returned by Next.
  size_t buffered_bytes() const { return buffer_.size() - consumed_; }

 private:
  uint32_t max_frame_bytes_;
  std::string buffer_;
  size_t consumed_ = 0;  // bytes at the front of buffer_ already returned
};

}  // namespace trainguard::store_wire

#endif  // TRAINGUARD_SDK_RENDEZVOUS_STORE_FRAME_H_
