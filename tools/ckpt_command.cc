#include "tools/ckpt_command.h"

#include <unistd.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tools/usage.h"
#include "trainguard/env.h"
#include "trainguard/persister.h"

namespace trainguard::tools {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitDataError = 1;
constexpr int kExitUsageError = 2;
// A verify of more than this many bytes reports progress on stderr even when it is not a TTY.
constexpr uint64_t kLongVerifyBytes = 1ull << 30;
constexpr uint64_t kShardHeaderBytes = 4096;  // payload offset -> file offset (docs/FORMATS.md)

struct CkptArgs {
  std::string verb;
  std::string dir;
  std::optional<int64_t> step;
  bool json = false;
};

std::string Json(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string HumanBytes(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return absl::StrFormat("%.2f GiB", bytes / double(1ull << 30));
  if (bytes >= (1ull << 20)) return absl::StrFormat("%.2f MiB", bytes / double(1ull << 20));
  if (bytes >= (1ull << 10)) return absl::StrFormat("%.2f KiB", bytes / double(1ull << 10));
  return absl::StrFormat("%d B", bytes);
}

std::optional<CkptArgs> Parse(const std::vector<std::string>& args) {
  CkptArgs a;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--json") {
      a.json = true;
    } else if (args[i] == "--step" && i + 1 < args.size()) {
      int64_t step;
      if (!absl::SimpleAtoi(args[++i], &step)) return std::nullopt;
      a.step = step;
    } else if (!args[i].empty() && args[i][0] == '-') {
      return std::nullopt;  // an unknown flag, not a DIR
    } else if (a.verb.empty()) {
      a.verb = args[i];
    } else if (a.dir.empty()) {
      a.dir = args[i];
    } else {
      return std::nullopt;
    }
  }
  if (a.dir.empty() || (a.verb != "list" && a.verb != "inspect" && a.verb != "verify")) {
    return std::nullopt;
  }
  if (a.step && a.verb == "list") return std::nullopt;
  return a;
}

int List(const CkptArgs& a, const std::vector<ShardRecord>& shards) {
  struct Step {
    std::vector<int> ranks;
    uint64_t bytes = 0;
  };
  std::map<int64_t, Step> steps;
  for (const ShardRecord& r : shards) {
    steps[r.step].ranks.push_back(r.rank);
    steps[r.step].bytes += r.payload_bytes;
  }
  if (a.json) {
    std::vector<std::string> items;
    for (const auto& [step, s] : steps) {
      items.push_back(absl::StrFormat(R"({"step":%d,"ranks":[%s],"payload_bytes":%d})", step,
                                      absl::StrJoin(s.ranks, ","), s.bytes));
    }
    absl::PrintF("{\"dir\":%s,\"steps\":[%s]}\n", Json(a.dir).c_str(),
                 absl::StrJoin(items, ",").c_str());
    return kExitOk;
  }
  if (steps.empty()) absl::PrintF("no committed checkpoint shards in %s\n", a.dir.c_str());
  for (const auto& [step, s] : steps) {
    absl::PrintF("step %d: %d shard%s, ranks %s, %s\n", step, s.ranks.size(),
                 s.ranks.size() == 1 ? "" : "s", absl::StrJoin(s.ranks, ",").c_str(),
                 HumanBytes(s.bytes).c_str());
  }
  return kExitOk;
}

int Inspect(const CkptArgs& a, const std::vector<ShardRecord>& shards) {
  if (shards.empty()) {
    absl::FPrintF(stderr, "trainguard ckpt inspect: no committed shards in %s%s\n", a.dir.c_str(),
                  a.step ? absl::StrFormat(" for step %d", *a.step) : std::string());
    return kExitDataError;
  }
  const int64_t step = shards.back().step;
  std::vector<std::string> items;
  if (!a.json) absl::PrintF("step %d\n", step);
  for (const ShardRecord& r : shards) {
    if (r.step != step) continue;
    if (a.json) {
      items.push_back(
          absl::StrFormat(R"({"rank":%d,"generation":%d,"layout_hash":"%016x","payload_bytes":%d,)"
                          R"("chunk_bytes":%d,"chunk_count":%d,"file":%s})",
                          r.rank, r.generation, r.layout_hash, r.payload_bytes, r.chunk_bytes,
                          r.chunk_checksums.size(), Json(r.shard_path)));
    } else {
      absl::PrintF("  rank %d: generation %d, layout hash %016x, %s in %d chunks of %s, %s\n",
                   r.rank, r.generation, r.layout_hash, HumanBytes(r.payload_bytes).c_str(),
                   r.chunk_checksums.size(), HumanBytes(r.chunk_bytes).c_str(),
                   r.shard_path.c_str());
    }
  }
  if (a.json) {
    absl::PrintF("{\"dir\":%s,\"step\":%d,\"shards\":[%s]}\n", Json(a.dir).c_str(), step,
                 absl::StrJoin(items, ",").c_str());
  }
  return kExitOk;
}

int Verify(const CkptArgs& a, const std::vector<ShardRecord>& shards) {
  uint64_t total = 0;
  for (const ShardRecord& r : shards) total += r.payload_bytes;
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  const bool report = tty || total >= kLongVerifyBytes;
  uint64_t done_before = 0;
  int last_reported = -1;
  auto progress = [&](uint64_t done, uint64_t) {
    if (!report || total == 0) return;
    const int percent = static_cast<int>((done_before + done) * 100 / total);
    if (tty ? percent == last_reported : percent / 10 == last_reported / 10) return;
    last_reported = percent;
    const std::string done_text = HumanBytes(done_before + done), total_text = HumanBytes(total);
    if (tty) {
      absl::FPrintF(stderr, "\rverify: %s of %s (%d%%)", done_text, total_text, percent);
    } else {
      absl::FPrintF(stderr, "verify: %s of %s (%d%%)\n", done_text, total_text, percent);
    }
  };
  std::vector<std::string> bad;  // JSON objects
  int bad_count = 0;
  auto corrupt = [&](const ShardRecord& r, uint64_t offset, const std::string& what) {
    ++bad_count;
    if (a.json) {
      bad.push_back(absl::StrFormat(
          R"({"file":%s,"payload_offset":%d,"file_offset":%d,"rank":%d,"step":%d,"what":%s})",
          Json(r.shard_path), offset, offset + kShardHeaderBytes, r.rank, r.step, Json(what)));
    } else {
      absl::PrintF("CORRUPT %s payload offset %d (file offset %d) rank %d step %d: %s\n",
                   r.shard_path.c_str(), offset, offset + kShardHeaderBytes, r.rank, r.step,
                   what.c_str());
    }
  };
  for (const ShardRecord& r : shards) {
    absl::StatusOr<std::vector<CorruptChunk>> result = VerifyShard(Env::Default(), r, progress);
    if (!result.ok()) {
      corrupt(r, 0, std::string(result.status().message()));
    } else {
      for (const CorruptChunk& c : *result) corrupt(r, c.offset, c.what);
    }
    done_before += r.payload_bytes;
  }
  if (tty && report) absl::FPrintF(stderr, "\n");
  if (a.json) {
    absl::PrintF(
        "{\"dir\":%s,\"shards_checked\":%d,\"bytes_checked\":%d,\"ok\":%s,\"corrupt\":[%s]}\n",
        Json(a.dir).c_str(), shards.size(), total, bad_count == 0 ? "true" : "false",
        absl::StrJoin(bad, ",").c_str());
  } else {
    absl::PrintF("%s: %d shard%s, %s checked, %d corrupt\n", bad_count == 0 ? "OK" : "FAILED",
                 shards.size(), shards.size() == 1 ? "" : "s", HumanBytes(total).c_str(),
                 bad_count);
  }
  return bad_count == 0 ? kExitOk : kExitDataError;
}

}  // namespace

std::string CkptUsage() {
  return "usage: trainguard ckpt list DIR [--json]\n"
         "       trainguard ckpt inspect DIR [--step S] [--json]\n"
         "       trainguard ckpt verify DIR [--step S] [--json]\n";
}

namespace {

constexpr char kCkptExitStatus[] =
    "\nExit status: 0 success, 1 DIR cannot be read or a shard is corrupt, 2 bad usage.\n";

// What --help prints: the usage of `verb`, or of the whole command when no verb was named.
std::string CkptHelp(const std::string& verb) {
  if (verb == "list") {
    return absl::StrCat("usage: trainguard ckpt list DIR [--json]\n\n",
                        "Lists the committed steps in DIR: each step's ranks and payload size.\n",
                        kCkptExitStatus);
  }
  if (verb == "inspect") {
    return absl::StrCat(
        "usage: trainguard ckpt inspect DIR [--step S] [--json]\n\n",
        "Shows the shards of step S (default: the newest committed step): generation, layout\n"
        "hash, payload size, chunks and file of each rank's shard.\n",
        kCkptExitStatus);
  }
  if (verb == "verify") {
    return absl::StrCat(
        "usage: trainguard ckpt verify DIR [--step S] [--json]\n\n",
        "Reads every chunk of every committed shard (of step S only, with --step) and checks it;\n"
        "prints one CORRUPT line per bad chunk (file, offset, rank, step) and exits 1 if any.\n",
        kCkptExitStatus);
  }
  return absl::StrCat(CkptUsage(),
                      "\n"
                      "Reads the checkpoint shards a Persister wrote to DIR; no job needs to run.\n"
                      "  list     the committed steps\n"
                      "  inspect  one step's shards\n"
                      "  verify   every chunk of every committed shard\n"
                      "`trainguard ckpt VERB --help` describes one verb.\n",
                      kCkptExitStatus);
}

}  // namespace

int RunCkptCommand(const std::vector<std::string>& args) {
  if (AsksForHelp(args)) {
    // The verb, when one was named, is the first word; an unknown one is still bad usage.
    const std::string verb = args.empty() || args[0].starts_with("-") ? "" : args[0];
    if (!verb.empty() && verb != "list" && verb != "inspect" && verb != "verify") {
      absl::FPrintF(stderr, "trainguard ckpt: unknown verb %s\n%s", verb, CkptUsage());
      return kExitUsageError;
    }
    absl::PrintF("%s", CkptHelp(verb));
    return kExitOk;
  }
  std::optional<CkptArgs> a = Parse(args);
  if (!a) {
    absl::FPrintF(stderr, "%s", CkptUsage().c_str());
    return kExitUsageError;
  }
  absl::StatusOr<std::vector<ShardRecord>> shards = ListCommittedShards(Env::Default(), a->dir);
  if (!shards.ok()) {
    absl::FPrintF(stderr, "trainguard ckpt %s: %s\n", a->verb.c_str(),
                  std::string(shards.status().message()).c_str());
    return kExitDataError;
  }
  if (a->step) {
    std::erase_if(*shards, [&](const ShardRecord& r) { return r.step != *a->step; });
  }
  if (a->verb == "list") return List(*a, *shards);
  if (a->verb == "inspect") return Inspect(*a, *shards);
  return Verify(*a, *shards);
}

}  // namespace trainguard::tools
