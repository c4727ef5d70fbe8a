// The fail-slow dumps: see fail_slow_dump.h.
#include "sdk/health/fail_slow_dump.h"

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "sdk/health/fail_slow_metrics.h"

namespace trainguard {

void HostMetricsHistory::Record(int64_t second, const std::map<std::string, std::string>& records) {
  if (!ring_.empty() && second <= ring_.back().first) return;
  ring_.emplace_back(second, records);
  while (!ring_.empty() && ring_.front().first <= second - seconds_) ring_.pop_front();
}

std::string FailSlowTraceLines(int64_t second, const std::map<std::string, std::string>& records) {
  std::string out;
  for (const auto& [host, record] : records)
    absl::StrAppend(&out, second, " ", host, " ", record, "\n");
  return out;
}

std::string HostMetricsHistory::Lines() const {
  std::string out;
  for (const auto& [second, records] : ring_) out += FailSlowTraceLines(second, records);
  return out;
}

std::string FormatFailSlowDumpHeader(const FailSlowDumpHeader& h) {
  return absl::StrFormat(
      "# suspect_host host=%s metric=%s z=%.3f deviation=%.3f windows=%d second=%d unix=%d "
      "action=%s",
      h.host, h.metric, h.z, h.deviation, h.windows, h.second, h.unix_second, h.action);
}

std::string FailSlowDumpDir(const std::string& run_dir) {
  return absl::StrCat(run_dir, "/events/fail_slow");
}

namespace {

constexpr absl::string_view kDumpSuffix = ".trace";

// A dump's unix second from its name "<unix>-<host>.trace", or -1 for another file.
int64_t DumpUnixSecond(const std::string& name) {
  if (!absl::EndsWith(name, kDumpSuffix)) return -1;
  const size_t dash = name.find('-');
  int64_t unix_second = -1;
  if (dash == std::string::npos || !absl::SimpleAtoi(name.substr(0, dash), &unix_second)) return -1;
  return unix_second;
}

// The dumps of `dir` as (unix second, name), oldest first.
std::vector<std::pair<int64_t, std::string>> SortedDumps(Env* env, const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> dumps;
  absl::StatusOr<std::vector<std::string>> names = env->GetChildren(dir);
  if (!names.ok()) return dumps;
  for (const std::string& name : *names) {
    if (const int64_t s = DumpUnixSecond(name); s >= 0) dumps.emplace_back(s, name);
  }
  std::sort(dumps.begin(), dumps.end());
  return dumps;
}

}  // namespace

absl::StatusOr<std::string> WriteFailSlowDump(Env* env, const std::string& dir,
                                              const FailSlowDumpHeader& header,
                                              const std::string& lines, int max_dumps) {
  if (absl::Status s = env->CreateDirs(dir); !s.ok()) return s;
  const std::string name = absl::StrCat(header.unix_second, "-", header.host, kDumpSuffix);
  const std::string path = absl::StrCat(dir, "/", name);
  // A leading dot and no .trace suffix: a reader listing dumps never takes it for one.
  const std::string temp = absl::StrCat(dir, "/.", name, ".tmp");
  auto fail = [&](const absl::Status& s) {
    (void)env->RemoveFile(temp);
    return absl::Status(s.code(), absl::StrCat("fail-slow dump ", path, ": ", s.message()));
  };
  {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = env->NewWritableFile(temp);
    if (!file.ok()) return fail(file.status());
    if (absl::Status s = (*file)->Append(FormatFailSlowDumpHeader(header) + "\n"); !s.ok()) {
      return fail(s);
    }
    if (absl::Status s = (*file)->Append(lines); !s.ok()) return fail(s);
    if (absl::Status s = (*file)->Close(); !s.ok()) return fail(s);
  }
  if (absl::Status s = env->RenameFile(temp, path); !s.ok()) return fail(s);
  std::vector<std::pair<int64_t, std::string>> dumps = SortedDumps(env, dir);
  for (size_t i = 0; i + std::max(0, max_dumps) < dumps.size(); ++i) {
    (void)env->RemoveFile(absl::StrCat(dir, "/", dumps[i].second));
  }
  return path;
}

absl::StatusOr<FailSlowDump> ParseFailSlowDump(const std::string& text) {
  FailSlowDump dump;
  bool have_header = false;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    ++line_number;
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat("fail-slow dump line ", line_number, " \"",
                                                     std::string(line), "\": ", std::string(what)));
    };
    if (absl::StartsWith(line, "#")) {
      if (!absl::StartsWith(line, "# suspect_host ")) continue;  // another comment
      FailSlowDumpHeader& h = dump.header;
      absl::string_view rest = line.substr(std::string_view("# suspect_host ").size());
      // action= is last and takes the rest of the line, spaces included.
      if (const size_t a = rest.find(" action="); a != absl::string_view::npos) {
        h.action = std::string(rest.substr(a + std::string_view(" action=").size()));
        rest = rest.substr(0, a);
      }
      for (absl::string_view field : absl::StrSplit(rest, ' ', absl::SkipEmpty())) {
        const size_t eq = field.find('=');
        if (eq == absl::string_view::npos) return bad("a header field is not key=value");
        const absl::string_view key = field.substr(0, eq), value = field.substr(eq + 1);
        bool ok = true;
        if (key == "host") {
          h.host = std::string(value);
        } else if (key == "metric") {
          h.metric = std::string(value);
        } else if (key == "z") {
          ok = absl::SimpleAtod(value, &h.z);
        } else if (key == "deviation") {
          ok = absl::SimpleAtod(value, &h.deviation);
        } else if (key == "windows") {
          ok = absl::SimpleAtoi(value, &h.windows);
        } else if (key == "second") {
          ok = absl::SimpleAtoi(value, &h.second);
        } else if (key == "unix") {
          ok = absl::SimpleAtoi(value, &h.unix_second);
        }  // an unknown key is a newer writer's: skipped
        if (!ok) return bad(absl::StrCat("header field ", std::string(key), " is not a number"));
      }
      if (h.host.empty()) return bad("the header names no host");
      have_header = true;
      continue;
    }
    const std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(' ', 2));
    FailSlowDumpPoint point;
    if (f.size() != 3 || !absl::SimpleAtoi(f[0], &point.second)) {
      return bad("want \"<second> <host> <record>\"");
    }
    absl::StatusOr<HostMetricsRecord> record =
        ParseHostMetricsRecord(std::string_view(f[2].data(), f[2].size()));
    if (!record.ok()) return bad(record.status().message());
    point.work = record->work;
    for (const auto& [metric, value] : record->metrics) point.metrics[metric] = value;
    dump.hosts[std::string(f[1])].push_back(std::move(point));
  }
  if (!have_header) {
    return absl::InvalidArgumentError("fail-slow dump: no \"# suspect_host ...\" header line");
  }
  return dump;
}

std::vector<std::string> ListFailSlowDumps(Env* env, const std::string& dir) {
  std::vector<std::string> paths;
  for (const auto& [unix_second, name] : SortedDumps(env, dir)) {
    paths.push_back(absl::StrCat(dir, "/", name));
  }
  return paths;
}

}  // namespace trainguard
