#include "tools/shm_command.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tools/usage.h"

namespace trainguard::tools {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsageError = 2;
constexpr char kShmDir[] = "/dev/shm";
constexpr char kPrefix[] = "trainguard.";

struct Segment {
  std::string name;  // in /dev/shm, e.g. "trainguard.job-1.rank0"
  std::string job;
  std::string kind;  // "snapshot arena", "flight recorder", "backup arena", "other"
  int rank = -1;
  uint64_t bytes = 0;
  std::set<pid_t> holders;  // live processes that map it or hold it open
};

// "<job>.<suffix>" -> the suffix's kind and rank; the job id may hold dots itself, so the known
// suffixes are matched from the right (sdk/checkpoint/snapshotter.cc ArenaName,
// sdk/watchdog/flight_recorder.cc SegmentName, sdk/checkpoint/backup_service.cc SegmentPrefix).
void Classify(Segment& s) {
  const std::string rest = s.name.substr(std::strlen(kPrefix));
  struct Suffix {
    const char* marker;
    const char* kind;
  };
  for (const Suffix& suffix : {Suffix{".fr.rank", "flight recorder"},
                               Suffix{".backup.rank", "backup arena"},
                               Suffix{".spare.pid", "spare arena"},
                               Suffix{".rank", "snapshot arena"}}) {
    const size_t at = rest.rfind(suffix.marker);
    if (at == std::string::npos || at == 0) continue;
    std::string digits = rest.substr(at + std::strlen(suffix.marker));
    // A backup arena's rank is followed by more of its name; keep its leading digits.
    digits = digits.substr(0, digits.find_first_not_of("0123456789"));
    int rank = -1;
    if (digits.empty() || !absl::SimpleAtoi(digits, &rank)) continue;
    if (std::string(suffix.marker) == ".rank" &&
        at + std::strlen(suffix.marker) + digits.size() != rest.size()) {
      continue;
    }
    s.job = rest.substr(0, at);
    s.kind = suffix.kind;
    // A standby's spare arena (sdk/checkpoint/spare_arena.h) is named after its pid: no rank yet.
    s.rank = std::string(suffix.marker) == ".spare.pid" ? -1 : rank;
    return;
  }
  s.job = rest;
  s.kind = "other";
}

std::vector<Segment> ListSegments(const std::string& job) {
  std::vector<Segment> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(kShmDir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!absl::StartsWith(name, kPrefix)) continue;
    Segment s;
    s.name = name;
    Classify(s);
    if (!job.empty() && s.job != job) continue;
    struct stat st;
    if (stat(entry.path().c_str(), &st) == 0) s.bytes = static_cast<uint64_t>(st.st_size);
    found.push_back(std::move(s));
  }
  std::sort(found.begin(), found.end(),
            [](const Segment& a, const Segment& b) { return a.name < b.name; });
  return found;
}

// Which live processes map or hold open each segment: every process's maps and fds (the caller
// needs the right to read them: root sees all, a user its own processes).
void FindHolders(std::vector<Segment>& segments) {
  if (segments.empty()) return;
  std::map<std::string, Segment*> by_path;
  for (Segment& s : segments) by_path[absl::StrCat(kShmDir, "/", s.name)] = &s;
  std::error_code ec;
  for (const auto& proc : std::filesystem::directory_iterator("/proc", ec)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(proc.path().filename().string(), &pid) || pid <= 0) continue;
    std::ifstream maps(proc.path() / "maps");
    std::string line;
    while (std::getline(maps, line)) {
      const size_t at = line.find(kShmDir);
      if (at == std::string::npos) continue;
      std::string path = line.substr(at);
      if (absl::EndsWith(path, " (deleted)")) continue;
      auto it = by_path.find(path);
      if (it != by_path.end()) it->second->holders.insert(pid);
    }
    std::error_code fd_ec;
    for (const auto& fd : std::filesystem::directory_iterator(proc.path() / "fd", fd_ec)) {
      std::error_code link_ec;
      const std::filesystem::path target = std::filesystem::read_symlink(fd.path(), link_ec);
      if (link_ec) continue;
      auto it = by_path.find(target.string());
      if (it != by_path.end()) it->second->holders.insert(pid);
    }
  }
}

std::string Holders(const Segment& s) {
  if (s.holders.empty()) return "-";
  std::vector<std::string> pids;
  for (pid_t p : s.holders) pids.push_back(absl::StrCat(p));
  return absl::StrCat("pid ", absl::StrJoin(pids, ","));
}

int List(const std::string& job) {
  std::vector<Segment> segments = ListSegments(job);
  FindHolders(segments);
  if (segments.empty()) {
    absl::PrintF("no trainguard segments in %s%s\n", kShmDir,
                 job.empty() ? "" : absl::StrCat(" for job ", job));
    return kExitOk;
  }
  absl::PrintF("%-48s %-24s %-16s %5s %10s  %s\n", "segment", "job", "kind", "rank", "MiB",
               "held by");
  uint64_t total = 0;
  for (const Segment& s : segments) {
    total += s.bytes;
    absl::PrintF("%-48s %-24s %-16s %5s %10.2f  %s\n", s.name, s.job, s.kind,
                 s.rank >= 0 ? absl::StrCat(s.rank) : "-", s.bytes / double(1 << 20), Holders(s));
  }
  absl::PrintF("%d segments, %.2f MiB\n", segments.size(), total / double(1 << 20));
  return kExitOk;
}

int Remove(const std::string& job, bool unused) {
  std::vector<Segment> segments = ListSegments(job);
  FindHolders(segments);
  int failed = 0;
  int removed = 0;
  for (const Segment& s : segments) {
    if (!s.holders.empty()) {
      if (!unused) {
        absl::FPrintF(stderr, "trainguard shm remove: %s/%s is held by %s: kept\n", kShmDir,
                      s.name, Holders(s));
        ++failed;
      }
      continue;
    }
    const std::string path = absl::StrCat(kShmDir, "/", s.name);
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      absl::FPrintF(stderr, "trainguard shm remove: %s: %s\n", path, std::strerror(errno));
      ++failed;
      continue;
    }
    absl::PrintF("removed %s (%s, %.2f MiB)\n", path, s.kind, s.bytes / double(1 << 20));
    ++removed;
  }
  if (removed == 0 && failed == 0) {
    absl::PrintF("nothing to remove%s\n", job.empty() ? "" : absl::StrCat(" for job ", job));
  }
  return failed == 0 ? kExitOk : kExitFailed;
}

}  // namespace

std::string ShmUsage() {
  return "usage: trainguard shm list [--job J]\n"
         "       trainguard shm remove --job J | --unused\n";
}

int RunShmCommand(const std::vector<std::string>& args) {
  static constexpr char kHelp[] =
      "\nThe shared-memory segments trainguard leaves in /dev/shm: snapshot arenas, "
      "flight-recorder\nrings, backup arenas and standbys' spare arenas, with the live processes "
      "that map or hold each.\n"
      "  list            every trainguard segment, or job J's\n"
      "  remove --job J  job J's segments that no live process holds (one in use: exit 1)\n"
      "  remove --unused every trainguard segment that no live process holds\n";
  if (AsksForHelp(args)) {
    if (!args.empty() && args[0] == "remove") {
      absl::PrintF("usage: trainguard shm remove --job J | --unused\n%s", kHelp);
    } else if (!args.empty() && args[0] == "list") {
      absl::PrintF("usage: trainguard shm list [--job J]\n%s", kHelp);
    } else {
      absl::PrintF("%s%s", ShmUsage(), kHelp);
    }
    return kExitOk;
  }
  std::string verb;
  std::string job;
  bool unused = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--job" && i + 1 < args.size()) {
      job = args[++i];
    } else if (args[i] == "--unused") {
      unused = true;
    } else if (verb.empty() && (args[i] == "list" || args[i] == "remove")) {
      verb = args[i];
    } else {
      absl::FPrintF(stderr, "trainguard shm: unexpected argument %s\n%s", args[i], ShmUsage());
      return kExitUsageError;
    }
  }
  if (verb == "list" && !unused) return List(job);
  if (verb == "remove" && (job.empty() != !unused)) return Remove(job, unused);
  absl::FPrintF(stderr, "%s", ShmUsage());
  return kExitUsageError;
}

}  // namespace trainguard::tools
