// UTF-8 for strings that go into protobuf `string` fields. proto3 refuses to parse a `string` that
// is not valid UTF-8, so one such field makes a whole record unreadable (an event file's
// reader stops there with DataLoss). Text from elsewhere (a library's error message, a file
// name, a message cut to a byte budget in the middle of a character) is made valid first.
//
// Thread safety: pure functions.
#ifndef TRAINGUARD_SDK_CORE_UTF8_H_
#define TRAINGUARD_SDK_CORE_UTF8_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace trainguard {

// `text` with every byte that does not begin a well-formed UTF-8 sequence (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF) replaced by U+FFFD; valid text is returned as is.
std::string ValidUtf8(absl::string_view text);

// The longest prefix of `text` of at most `max_bytes` that does not end inside a UTF-8 sequence
// (a message cut to a budget). Bytes that are not UTF-8 at all are left to ValidUtf8.
absl::string_view Utf8Prefix(absl::string_view text, size_t max_bytes);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CORE_UTF8_H_
