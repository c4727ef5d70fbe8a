#include "sdk/core/proc_stat.h"

#include <cerrno>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace trainguard {
namespace {

absl::StatusOr<ProcStat> ReadStatFile(const std::string& path) {
  std::ifstream in(path);
  if (!in.is_open()) {
    const int error = errno;
    if (error == ENOENT || error == ESRCH) {
      return absl::NotFoundError(absl::StrCat(path, ": no such process"));
    }
    return absl::UnavailableError(absl::StrCat(path, ": cannot be opened (errno ", error, ")"));
  }
  std::stringstream text;
  text << in.rdbuf();
  // A process that ended between the open and the read leaves the file empty.
  if (text.str().empty()) return absl::NotFoundError(absl::StrCat(path, ": no such process"));
  return ParseProcStat(text.str(), path);
}

}  // namespace

absl::StatusOr<ProcStat> ParseProcStat(std::string_view text_in, std::string_view where_in) {
  // Debian's Abseil has its own string_view.
  const absl::string_view text(text_in.data(), text_in.size());
  const std::string where(where_in);
  const size_t close = text.rfind(')');
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": no ')' closing the command name (field 2)"));
  }
  const std::vector<absl::string_view> fields =
      absl::StrSplit(text.substr(close + 1), ' ', absl::SkipWhitespace());
  // fields[0] is field 3; field N is fields[N - 3].
  auto field = [&](int n) -> absl::string_view {
    return n - 3 < static_cast<int>(fields.size()) ? fields[n - 3] : absl::string_view();
  };
  ProcStat stat;
  if (field(3).size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field 3 (state) is '", field(3), "', not one letter"));
  }
  stat.state = field(3)[0];
  int64_t ppid = 0;
  if (!absl::SimpleAtoi(field(4), &ppid)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": field 4 (ppid) is '", field(4), "'"));
  }
  stat.ppid = static_cast<pid_t>(ppid);
  if (!absl::SimpleAtoi(field(9), &stat.flags)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": field 9 (flags) is '", field(9), "'"));
  }
  if (!absl::SimpleAtoi(field(14), &stat.utime_ticks) ||
      !absl::SimpleAtoi(field(15), &stat.stime_ticks)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": fields 14-15 (utime, stime) are '",
                                                   field(14), "' '", field(15), "'"));
  }
  if (!absl::SimpleAtoi(field(22), &stat.start_time_ticks)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field 22 (starttime) is '", field(22), "'"));
  }
  return stat;
}

absl::StatusOr<ProcStat> ReadProcStat(pid_t pid) {
  if (pid <= 0) return absl::InvalidArgumentError(absl::StrCat("pid ", pid, " is not positive"));
  return ReadStatFile(absl::StrCat("/proc/", pid, "/stat"));
}

absl::StatusOr<ProcStat> ReadThreadStat(pid_t tid) {
  if (tid <= 0) return absl::InvalidArgumentError(absl::StrCat("tid ", tid, " is not positive"));
  return ReadStatFile(absl::StrCat("/proc/self/task/", tid, "/stat"));
}

absl::StatusOr<uint64_t> ReadStatusSignalMask(const std::string& status_path,
                                              std::string_view field_in) {
  const std::string field = absl::StrCat(std::string(field_in), ":");
  std::ifstream in(status_path);
  if (!in.is_open()) return absl::NotFoundError(absl::StrCat(status_path, ": cannot be opened"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest(line);
    if (!absl::ConsumePrefix(&rest, field)) continue;
    uint64_t mask = 0;
    if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(rest), &mask)) {
      return absl::InvalidArgumentError(
          absl::StrCat(status_path, ": ", field, " '", rest, "' is not a hex mask"));
    }
    return mask;
  }
  return absl::NotFoundError(absl::StrCat(status_path, ": no ", field, " line"));
}

}  // namespace trainguard
