#include "sdk/rendezvous/store_frame.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "google/protobuf/message_lite.h"

namespace trainguard::store_wire {

uint32_t DecodeFrameLength(const char* header) {
  const auto* b = reinterpret_cast<const unsigned char*>(header);
  return static_cast<uint32_t>(b[0]) | (static_cast<uint32_t>(b[1]) << 8) |
         (static_cast<uint32_t>(b[2]) << 16) | (static_cast<uint32_t>(b[3]) << 24);
}

absl::Status AppendFrame(const google::protobuf::MessageLite& message, uint32_t max_frame_bytes,
                         std::string_view what, std::string* out) {
  const size_t size = message.ByteSizeLong();
  if (size > max_frame_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: message of %d bytes exceeds the frame limit of %d bytes", what, size,
                        max_frame_bytes));
  }
  const auto length = static_cast<uint32_t>(size);
  const unsigned char header[kFrameHeaderBytes] = {
      static_cast<unsigned char>(length), static_cast<unsigned char>(length >> 8),
      static_cast<unsigned char>(length >> 16), static_cast<unsigned char>(length >> 24)};
  const size_t start = out->size();
  out->resize(start + kFrameHeaderBytes + size);
  std::memcpy(out->data() + start, header, kFrameHeaderBytes);
  message.SerializeWithCachedSizesToArray(
      reinterpret_cast<uint8_t*>(out->data() + start + kFrameHeaderBytes));
  return absl::OkStatus();
}

void FrameDecoder::Append(std::string_view bytes) {
  // Compact once the returned prefix dominates, so the buffer stays near one frame's size.
  if (consumed_ > 0 && consumed_ >= buffer_.size() / 2) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  buffer_.append(bytes.data(), bytes.size());
}

absl::StatusOr<std::optional<std::string_view>> FrameDecoder::Next() {
  const size_t available = buffer_.size() - consumed_;
  if (available < kFrameHeaderBytes) return std::nullopt;
  const uint32_t length = DecodeFrameLength(buffer_.data() + consumed_);
  if (length > max_frame_bytes_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "frame of %d bytes exceeds the limit of %d bytes", length, max_frame_bytes_));
  }
  if (available - kFrameHeaderBytes < length) return std::nullopt;
  std::string_view payload(buffer_.data() + consumed_ + kFrameHeaderBytes, length);
  consumed_ += kFrameHeaderBytes + length;
  return payload;
}

}  // namespace trainguard::store_wire
