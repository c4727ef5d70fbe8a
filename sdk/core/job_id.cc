#include "sdk/core/job_id.h"

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace trainguard {

absl::Status ValidateJobId(std::string_view id) {
  const absl::string_view job_id(id.data(), id.size());
  if (job_id.empty()) {
    return absl::InvalidArgumentError(
        "job_id must not be empty (it names the job's files and shared-memory segments)");
  }
  if (job_id.size() > kMaxJobIdBytes) {
    // Not quoted: it may be a megabyte from a hostile peer.
    return absl::InvalidArgumentError(absl::StrCat(
        "job_id has ", job_id.size(), " characters; at most ", kMaxJobIdBytes, " are allowed"));
  }
  if (job_id == "." || job_id == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("job_id \"", job_id, "\" is not allowed (it would name a directory)"));
  }
  for (size_t i = 0; i < job_id.size(); ++i) {
    const char c = job_id[i];
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("job_id \"", absl::CHexEscape(job_id), "\" has character '",
                       absl::CHexEscape(absl::string_view(&c, 1)), "' at position ", i,
                       "; allowed are A-Z a-z 0-9 . _ -"));
    }
  }
  return absl::OkStatus();
}

}  // namespace trainguard
