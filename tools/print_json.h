// PrintJson: how every trainguard command prints its --json document (docs/FORMATS.md, "JSON
// output"): one line, the message in ProtoToJson's form.
#ifndef TRAINGUARD_TOOLS_PRINT_JSON_H_
#define TRAINGUARD_TOOLS_PRINT_JSON_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/message.h"
#include "sdk/core/proto_json.h"

namespace trainguard::tools {

// Prints `json` (or, when it is an error, says so on stderr as `command`); false on an error.
inline bool PrintJson(const absl::StatusOr<std::string>& json, std::string_view command) {
  if (!json.ok()) {
    absl::FPrintF(stderr, "trainguard %s: %s\n", command, json.status().ToString());
    return false;
  }
  absl::PrintF("%s\n", *json);
  return true;
}

inline bool PrintJson(const google::protobuf::Message& message, std::string_view command) {
  return PrintJson(ProtoToJson(message), command);
}

}  // namespace trainguard::tools

#endif  // TRAINGUARD_TOOLS_PRINT_JSON_H_
