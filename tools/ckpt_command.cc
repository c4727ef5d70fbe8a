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
#include "sdk/checkpoint/persister.h"
#include "tools/cli_output.pb.h"
#include "tools/print_json.h"
#include "tools/usage.h"
#include "trainguard/env.h"

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
    cli::CkptList list;
    list.set_dir(a.dir);
    for (const auto& [step, s] : steps) {
      cli::CkptList::Step* item = list.add_steps();
      item->set_step(step);
      item->mutable_ranks()->Add(s.ranks.begin(), s.ranks.end());
      item->set_payload_bytes(s.bytes);
    }
    return PrintJson(list, "ckpt list") ? kExitOk : kExitDataError;
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
  cli::CkptInspect inspect;
  inspect.set_dir(a.dir);
  inspect.set_step(step);
  if (!a.json) absl::PrintF("step %d\n", step);
  for (const ShardRecord& r : shards) {
    if (r.step != step) continue;
    if (a.json) {
      cli::CkptInspect::Shard* shard = inspect.add_shards();
      shard->set_rank(r.rank);
      shard->set_generation(r.generation);
      shard->set_layout_hash(absl::StrFormat("%016x", r.layout_hash));
      shard->set_payload_bytes(r.payload_bytes);
      shard->set_chunk_bytes(r.chunk_bytes);
      shard->set_chunk_count(static_cast<uint32_t>(r.chunk_checksums.size()));
      shard->set_file(r.shard_path);
    } else {
      absl::PrintF("  rank %d: generation %d, layout hash %016x, %s in %d chunks of %s, %s\n",
                   r.rank, r.generation, r.layout_hash, HumanBytes(r.payload_bytes).c_str(),
                   r.chunk_checksums.size(), HumanBytes(r.chunk_bytes).c_str(),
                   r.shard_path.c_str());
    }
  }
  if (a.json && !PrintJson(inspect, "ckpt inspect")) return kExitDataError;
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
  cli::CkptVerify verify;
  int bad_count = 0;
  auto corrupt = [&](const ShardRecord& r, uint64_t offset, const std::string& what) {
    ++bad_count;
    if (a.json) {
      cli::CkptVerify::Corrupt* bad = verify.add_corrupt();
      bad->set_file(r.shard_path);
      bad->set_payload_offset(offset);
      bad->set_file_offset(offset + kShardHeaderBytes);
      bad->set_rank(r.rank);
      bad->set_step(r.step);
      bad->set_what(what);
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
    verify.set_dir(a.dir);
    verify.set_shards_checked(static_cast<uint32_t>(shards.size()));
    verify.set_bytes_checked(total);
    verify.set_ok(bad_count == 0);
    if (!PrintJson(verify, "ckpt verify")) return kExitDataError;
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
