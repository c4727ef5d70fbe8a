// UTF-8 validation and cutting (utf8.h).
#include "sdk/core/utf8.h"

#include <cstdint>
#include <string>

namespace trainguard {
namespace {

constexpr char kReplacement[] = "\xef\xbf\xbd";  // U+FFFD

// The length of the well-formed UTF-8 sequence at text[at], or 0 when it is not one.
size_t SequenceLength(absl::string_view text, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t b0 = byte(at);
  if (b0 < 0x80) return 1;
  size_t n = 0;
  uint8_t low = 0x80, high = 0xbf;  // the range of the second byte
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    n = 2;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    n = 3;
    if (b0 == 0xe0) low = 0xa0;   // no overlong forms
    if (b0 == 0xed) high = 0x9f;  // no surrogates
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    n = 4;
    if (b0 == 0xf0) low = 0x90;   // no overlong forms
    if (b0 == 0xf4) high = 0x8f;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (at + n > text.size()) return 0;
  if (byte(at + 1) < low || byte(at + 1) > high) return 0;
  for (size_t i = 2; i < n; ++i) {
    if (byte(at + i) < 0x80 || byte(at + i) > 0xbf) return 0;
  }
  return n;
}

}  // namespace

std::string ValidUtf8(absl::string_view text) {
  std::string out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t n = SequenceLength(text, at);
    if (n == 0) break;
    at += n;
  }
  if (at == text.size()) return std::string(text);  // the common case: already valid
  out.reserve(text.size() + 8);
  out.append(text.data(), at);
  while (at < text.size()) {
    const size_t n = SequenceLength(text, at);
    if (n == 0) {
      out.append(kReplacement);
      ++at;
    } else {
      out.append(text.data() + at, n);
      at += n;
    }
  }
  return out;
}

absl::string_view Utf8Prefix(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  const auto continuation = [&](size_t i) { return (static_cast<uint8_t>(text[i]) & 0xc0) == 0x80; };
  // text[max_bytes] is the first byte cut off. A continuation byte there means the character it
  // belongs to began before the cut, at most 3 bytes back: the prefix ends before that character.
  if (!continuation(max_bytes)) return text.substr(0, max_bytes);
  size_t lead = max_bytes;
  while (lead > 0 && max_bytes - lead < 3 && continuation(lead)) --lead;
  return continuation(lead) ? text.substr(0, max_bytes) : text.substr(0, lead);
}

}  // namespace trainguard
