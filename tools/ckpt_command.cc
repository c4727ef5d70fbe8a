#include "tools/ckpt_command.h"

#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "sdk/checkpoint/persister.h"
#include "sdk/core/human_bytes.h"
#include "tools/cli_output.pb.h"
#include "tools/print_json.h"
#include "tools/safetensors_export.h"
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
  std::string out;  // export: the file to write
  int rank = 0;     // export: the rank whose shard is written
  // For manifests that do not record the world size: the highest rank in the directory plus one.
  int inferred_world = 0;
};

// The committed shards of one step, and the ranks whose shards it lacks: a step is complete only
// with a shard of every rank below the world size its manifests recorded.
struct StepShards {
  std::vector<const ShardRecord*> shards;
  std::vector<int> missing;
  uint64_t bytes = 0;
  bool complete() const { return missing.empty(); }
};

std::map<int64_t, StepShards> ByStep(const CkptArgs& a, const std::vector<ShardRecord>& shards) {
  std::map<int64_t, StepShards> steps;
  for (const ShardRecord& r : shards) {
    steps[r.step].shards.push_back(&r);
    steps[r.step].bytes += r.payload_bytes;
  }
  for (auto& [step, s] : steps) {
    int world = 0;
    for (const ShardRecord* r : s.shards) world = std::max(world, r->world_size);
    if (world == 0) world = a.inferred_world;
    std::vector<bool> present(world, false);
    for (const ShardRecord* r : s.shards) {
      if (r->rank < world) present[r->rank] = true;
    }
    for (int r = 0; r < world; ++r) {
      if (!present[r]) s.missing.push_back(r);
    }
  }
  return steps;
}

// Where the missing shard of `rank` would be: next to the step's other shards.
std::string MissingShardPath(const StepShards& s, int rank) {
  const std::string& sibling = s.shards.front()->shard_path;
  return absl::StrFormat("%s/rank-%05d.shard", sibling.substr(0, sibling.rfind('/')), rank);
}

bool IsVerb(const std::string& verb) {
  return verb == "list" || verb == "inspect" || verb == "verify" || verb == "export";
}

std::optional<CkptArgs> Parse(const std::vector<std::string>& args) {
  CkptArgs a;
  bool has_rank = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--json") {
      a.json = true;
    } else if (args[i] == "--step" && i + 1 < args.size()) {
      int64_t step;
      if (!absl::SimpleAtoi(args[++i], &step)) return std::nullopt;
      a.step = step;
    } else if (args[i] == "--out" && i + 1 < args.size()) {
      a.out = args[++i];
      if (a.out.empty()) return std::nullopt;
    } else if (args[i] == "--rank" && i + 1 < args.size()) {
      if (!absl::SimpleAtoi(args[++i], &a.rank) || a.rank < 0) return std::nullopt;
      has_rank = true;
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
  if (a.dir.empty() || !IsVerb(a.verb)) return std::nullopt;
  if (a.step && a.verb == "list") return std::nullopt;
  // --out and --rank belong to export, which requires --out and prints no JSON.
  if ((a.verb == "export") != !a.out.empty()) return std::nullopt;
  if (a.verb == "export" && a.json) return std::nullopt;
  if (has_rank && a.verb != "export") return std::nullopt;
  return a;
}

int List(const CkptArgs& a, const std::vector<ShardRecord>& shards) {
  const std::map<int64_t, StepShards> steps = ByStep(a, shards);
  auto ranks = [](const StepShards& s) {
    std::vector<int> out;
    for (const ShardRecord* r : s.shards) out.push_back(r->rank);
    return absl::StrJoin(out, ",");
  };
  if (a.json) {
    cli::CkptList list;
    list.set_dir(a.dir);
    for (const auto& [step, s] : steps) {
      cli::CkptList::Step* item = list.add_steps();
      item->set_step(step);
      for (const ShardRecord* r : s.shards) item->add_ranks(r->rank);
      item->set_payload_bytes(s.bytes);
      item->set_complete(s.complete());
      item->mutable_missing_ranks()->Add(s.missing.begin(), s.missing.end());
    }
    return PrintJson(list, "ckpt list") ? kExitOk : kExitDataError;
  }
  if (steps.empty()) absl::PrintF("no committed checkpoint shards in %s\n", a.dir.c_str());
  for (const auto& [step, s] : steps) {
    absl::PrintF("step %d: %d shard%s, ranks %s, %s%s\n", step, s.shards.size(),
                 s.shards.size() == 1 ? "" : "s", ranks(s), HumanBytes(s.bytes).c_str(),
                 s.complete() ? ""
                              : absl::StrFormat(", INCOMPLETE: no shard of rank%s %s",
                                                s.missing.size() == 1 ? "" : "s",
                                                absl::StrJoin(s.missing, ",")));
  }
  return kExitOk;
}

int Inspect(const CkptArgs& a, const std::vector<ShardRecord>& shards) {
  if (shards.empty()) {
    absl::FPrintF(stderr, "trainguard ckpt inspect: no committed shards in %s%s\n", a.dir.c_str(),
                  a.step ? absl::StrFormat(" for step %d", *a.step) : std::string());
    return kExitDataError;
  }
  // Without --step: the newest complete step (the one a restore would take), else the newest.
  const std::map<int64_t, StepShards> steps = ByStep(a, shards);
  auto chosen = std::prev(steps.end());
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (it->second.complete()) {
      chosen = std::prev(it.base());
      break;
    }
  }
  const int64_t step = chosen->first;
  cli::CkptInspect inspect;
  inspect.set_dir(a.dir);
  inspect.set_step(step);
  inspect.set_complete(chosen->second.complete());
  if (!a.json) {
    absl::PrintF("step %d%s\n", step,
                 chosen->second.complete()
                     ? ""
                     : absl::StrFormat(" (INCOMPLETE: no shard of rank %s)",
                                       absl::StrJoin(chosen->second.missing, ",")));
  }
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
  // A step without every rank's shard cannot be restored: it fails like a corrupt one.
  int missing_count = 0;
  for (const auto& [step, s] : ByStep(a, shards)) {
    for (int rank : s.missing) {
      ++bad_count;
      ++missing_count;
      const std::string file = MissingShardPath(s, rank);
      if (a.json) {
        cli::CkptVerify::Missing* gap = verify.add_missing();
        gap->set_file(file);
        gap->set_rank(rank);
        gap->set_step(step);
      } else {
        absl::PrintF("MISSING %s rank %d step %d: no committed shard (the step is incomplete)\n",
                     file.c_str(), rank, step);
      }
    }
  }
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
    absl::PrintF("%s: %d shard%s, %s checked, %d corrupt, %d missing\n",
                 bad_count == 0 ? "OK" : "FAILED", shards.size(), shards.size() == 1 ? "" : "s",
                 HumanBytes(total).c_str(), bad_count - missing_count, missing_count);
  }
  return bad_count == 0 ? kExitOk : kExitDataError;
}

// The step export takes: --step's, which must be committed and complete, or the newest complete
// step. An error message when there is none.
absl::StatusOr<int64_t> ExportStep(const CkptArgs& a, const std::map<int64_t, StepShards>& steps) {
  auto missing = [](const StepShards& s) {
    std::vector<std::string> files;
    for (int rank : s.missing) files.push_back(MissingShardPath(s, rank));
    return absl::StrJoin(files, ", ");
  };
  if (a.step) {
    auto it = steps.find(*a.step);
    if (it == steps.end()) {
      std::vector<int64_t> known;
      for (const auto& [step, s] : steps) known.push_back(step);
      return absl::NotFoundError(
          absl::StrFormat("no committed shard of step %d in %s (committed steps: %s)", *a.step,
                          a.dir, known.empty() ? "none" : absl::StrJoin(known, ", ")));
    }
    if (!it->second.complete()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "step %d in %s is incomplete: no committed %s", *a.step, a.dir, missing(it->second)));
    }
    return *a.step;
  }
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (it->second.complete()) return it->first;
  }
  return absl::NotFoundError(
      absl::StrFormat("no complete committed step in %s%s", a.dir,
                      steps.empty() ? " (no committed shards)"
                                    : absl::StrFormat(" (step %d lacks %s)", steps.rbegin()->first,
                                                      missing(steps.rbegin()->second))));
}

int Export(const CkptArgs& a, const std::vector<ShardRecord>& shards) {
  const std::map<int64_t, StepShards> steps = ByStep(a, shards);
  absl::StatusOr<int64_t> step = ExportStep(a, steps);
  if (!step.ok()) {
    absl::FPrintF(stderr, "trainguard ckpt export: %s\n", step.status().message());
    return kExitDataError;
  }
  const StepShards& chosen = steps.at(*step);
  const ShardRecord* shard = nullptr;
  int world = 0;
  for (const ShardRecord* r : chosen.shards) {
    if (r->rank == a.rank) shard = r;
    world = std::max(world, r->world_size);
  }
  if (world == 0) world = a.inferred_world;
  if (shard == nullptr) {
    absl::FPrintF(stderr, "trainguard ckpt export: step %d in %s has no rank %d (world size %d)\n",
                  *step, a.dir, a.rank, world);
    return kExitDataError;
  }
  const std::vector<std::pair<std::string, std::string>> metadata = {
      {"format", "pt"},
      {"trainguard_step", absl::StrCat(*step)},
      {"trainguard_rank", absl::StrCat(a.rank)},
      {"trainguard_world_size", absl::StrCat(world)},
      {"trainguard_generation", absl::StrCat(shard->generation)},
      {"trainguard_layout_hash", absl::StrFormat("%016x", shard->layout_hash)},
      {"trainguard_shard", shard->shard_path},
  };
  absl::StatusOr<SafetensorsExportSummary> summary =
      ExportShardAsSafetensors(Env::Default(), *shard, metadata, a.out);
  if (!summary.ok()) {
    absl::FPrintF(stderr, "trainguard ckpt export: %s\n", summary.status().message());
    return kExitDataError;
  }
  absl::PrintF("exported step %d rank %d of %d (%d tensors, %d blobs, %s) to %s\n", *step, a.rank,
               world, summary->tensors, summary->blobs, HumanBytes(summary->file_bytes), a.out);
  return kExitOk;
}

}  // namespace

std::string CkptUsage() {
  return "usage: trainguard ckpt list DIR [--json]\n"
         "       trainguard ckpt inspect DIR [--step S] [--json]\n"
         "       trainguard ckpt verify DIR [--step S] [--json]\n"
         "       trainguard ckpt export DIR [--step S] [--rank R] --out FILE\n";
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
  if (verb == "export") {
    return absl::StrCat(
        "usage: trainguard ckpt export DIR [--step S] [--rank R] --out FILE\n\n",
        "Writes rank R's shard (default 0) of step S (default: the newest complete committed\n"
        "step) as one safetensors file: every registered buffer as a tensor under its name, every\n"
        "blob as a U8 tensor \"__blob__/<name>\"; the step, rank and world size in __metadata__.\n"
        "Every chunk of the shard is verified first; FILE appears only once complete. The ranks\n"
        "of a data-parallel job hold the same state, so rank 0's is the model; with tensor or\n"
        "pipeline parallelism each rank holds its own part.\n"
        "\nExit status: 0 success, 1 no such step or rank, a corrupt or missing shard, or FILE\n"
        "cannot be written, 2 bad usage.\n");
  }
  return absl::StrCat(CkptUsage(),
                      "\n"
                      "Reads the checkpoint shards a Persister wrote to DIR; no job needs to run.\n"
                      "  list     the committed steps\n"
                      "  inspect  one step's shards\n"
                      "  verify   every chunk of every committed shard\n"
                      "  export   one rank's shard of a step as a safetensors file\n"
                      "`trainguard ckpt VERB --help` describes one verb.\n",
                      kCkptExitStatus);
}

}  // namespace

int RunCkptCommand(const std::vector<std::string>& args) {
  if (AsksForHelp(args)) {
    // The verb, when one was named, is the first word; an unknown one is still bad usage.
    const std::string verb = args.empty() || args[0].starts_with("-") ? "" : args[0];
    if (!verb.empty() && !IsVerb(verb)) {
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
  for (const ShardRecord& r : *shards) a->inferred_world = std::max(a->inferred_world, r.rank + 1);
  if (a->verb == "export") return Export(*a, *shards);
  if (a->step) {
    std::erase_if(*shards, [&](const ShardRecord& r) { return r.step != *a->step; });
  }
  if (a->verb == "list") return List(*a, *shards);
  if (a->verb == "inspect") return Inspect(*a, *shards);
  return Verify(*a, *shards);
}

}  // namespace trainguard::tools
