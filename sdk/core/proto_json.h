// ProtoToJson: how trainguard prints a protobuf message as JSON for people and scripts (the
// `--json` output of the trainguard tools). Private to sdk/ and tools/; sdk/core is the bottom
// layer, so any subsystem may include it.
//
// One line of protobuf's canonical proto3 JSON mapping, with the field names of the .proto file
// (snake_case) and every field printed, zeros and empty lists included, so a script never has to
// guess a default. As in any proto3 JSON, 64-bit integers are strings ("step":"20") and bytes
// fields are base64. docs/FORMATS.md ("JSON output") says which message each command prints.
#ifndef TRAINGUARD_SDK_CORE_PROTO_JSON_H_
#define TRAINGUARD_SDK_CORE_PROTO_JSON_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/json_util.h"

namespace trainguard {

// `s` as a JSON string literal, quotes included: `"` and `\` escaped, control bytes as \u00XX
// (for the hand-written JSON of tools and benchmarks that print no protobuf message).
inline std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Internal naming the message type when protobuf refuses to print it (it never does for the
// messages trainguard prints, whose strings are UTF-8).
inline absl::StatusOr<std::string> ProtoToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  if (auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
      !status.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot print ", message.GetTypeName(), " as JSON: ", status.ToString()));
  }
  return json;
}

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CORE_PROTO_JSON_H_
