#include "sdk/watchdog/hang_diagnosis.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "sdk/proto/flight_recorder.pb.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/stack_trace.h"
#include "trainguard/env.h"

namespace trainguard {

std::optional<std::string> EvidenceOf(const FlightRecorderDump& dump, absl::string_view key) {
  for (const auto& [k, v] : dump.evidence) {
    if (k == key) return v;
  }
  return std::nullopt;
}

int64_t DumpGeneration(const FlightRecorderDump& dump) {
  int64_t generation = -1;
  if (std::optional<std::string> g = EvidenceOf(dump, "generation"); g.has_value()) {
    if (!absl::SimpleAtoi(*g, &generation)) generation = -1;
  }
  return generation;
}

std::optional<std::pair<int, int64_t>> ParseDumpName(absl::string_view name) {
  int rank = -1;
  int64_t number = -1;
  if (!absl::ConsumePrefix(&name, "rank-") || !absl::ConsumeSuffix(&name, ".pb")) {
    return std::nullopt;
  }
  const size_t dot = name.find('.');
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(name.substr(0, dot), &rank) ||
      !absl::SimpleAtoi(name.substr(dot + 1), &number) || rank < 0) {
    return std::nullopt;
  }
  return std::make_pair(rank, number);
}

namespace {

// The rank's training thread (the dump's "step_thread", else the main thread, whose tid is the
// process id): its frames, or one pseudo-frame saying why there are none.
std::vector<std::string> TrainingThreadFrames(const FlightRecorderDump& dump) {
  std::optional<std::string> text = EvidenceOf(dump, "stacks");
  if (!text.has_value()) return {"(no stacks in the dump)"};
  absl::StatusOr<std::vector<ThreadStack>> stacks = ParseThreadStacks(*text);
  if (!stacks.ok()) return {absl::StrCat("(unreadable stacks: ", stacks.status().message(), ")")};
  int tid = dump.contents.writer_pid;
  if (std::optional<std::string> step_thread = EvidenceOf(dump, "step_thread");
      step_thread.has_value()) {
    int parsed = 0;
    if (absl::SimpleAtoi(*step_thread, &parsed) && parsed > 0) tid = parsed;
  }
  for (const ThreadStack& t : *stacks) {
    if (t.tid != tid) continue;
    if (!t.answered) return {absl::StrCat("(no answer: ", t.note, ")")};
    return t.frames;
  }
  return {"(training thread not among the stacks)"};
}

// Module names, innermost first, consecutive repeats collapsed. A pseudo-frame is its own module.
std::vector<std::string> ModuleSequence(const std::vector<std::string>& frames) {
  std::vector<std::string> modules;
  for (const std::string& frame : frames) {
    std::string module = absl::StartsWith(frame, "(") ? frame : FrameModule(frame);
    if (modules.empty() || modules.back() != module) modules.push_back(std::move(module));
  }
  return modules;
}

std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ","));
}

// The first `n` frames of a signature, innermost first, joined with " <- ".
std::string Abbreviate(const std::vector<std::string>& signature, size_t n) {
  std::vector<std::string> head(signature.begin(),
                                signature.begin() + std::min(n, signature.size()));
  std::string out = absl::StrJoin(head, " <- ");
  if (signature.size() > n) absl::StrAppend(&out, " <- ...");
  return out;
}

// A frame of trainguard's own recovery: a rank whose training thread runs it has left the step.
bool IsRecoveryFrame(const std::string& frame) {
  for (absl::string_view recovery :
       {"trainguard::Runtime::recover(", "trainguard::Runtime::ReRendezvous(",
        "trainguard::RendezvousMember::"}) {
    if (absl::StrContains(frame, recovery)) return true;
  }
  return false;
}

// The groups still where the hang found them (not recovering), in their order: only these are
// compared for outliers.
std::vector<const StackGroup*> StuckGroups(const std::vector<StackGroup>& groups) {
  std::vector<const StackGroup*> stuck;
  for (const StackGroup& group : groups) {
    if (!group.recovering) stuck.push_back(&group);
  }
  return stuck;
}

}  // namespace

std::string FrameModule(const std::string& frame) {
  absl::string_view f = frame;
  const size_t open = f.rfind(" (");
  if (open == absl::string_view::npos || !absl::EndsWith(f, ")")) return "?";
  absl::string_view module = f.substr(open + 2, f.size() - open - 3);
  const size_t offset = module.rfind("+0x");
  if (offset != absl::string_view::npos) module = module.substr(0, offset);
  const size_t slash = module.rfind('/');
  if (slash != absl::string_view::npos) module.remove_prefix(slash + 1);
  return module.empty() ? "?" : std::string(module);
}

std::string FrameSignature(const std::string& frame) {
  absl::string_view f = frame;
  // The module part: the last " (" ... ")" (a demangled name has parentheses of its own).
  absl::string_view module;
  const size_t open = f.rfind(" (");
  if (open != absl::string_view::npos && absl::EndsWith(f, ")")) {
    module = f.substr(open + 2, f.size() - open - 3);
    f = f.substr(0, open);
  }
  if (absl::StartsWith(f, "0x") || f.empty()) {
    // No symbol: the module and the offset in it, without the module's directory.
    const size_t slash = module.rfind('/');
    if (slash != absl::string_view::npos) module.remove_prefix(slash + 1);
    return module.empty() ? std::string(f) : std::string(module);
  }
  const size_t offset = f.rfind("+0x");
  if (offset != absl::string_view::npos) f = f.substr(0, offset);
  return std::string(f);
}

absl::StatusOr<std::vector<FlightRecorderDump>> ReadHangDumps(const std::string& dir,
                                                              int64_t generation, Env* env) {
  if (env == nullptr) env = Env::Default();
  absl::StatusOr<std::vector<std::string>> names = env->GetChildren(dir);
  if (!names.ok()) {
    const std::string message =
        absl::StrCat("reading hang dumps: listing ", dir, ": ", names.status().message());
    return absl::IsNotFound(names.status()) ? absl::NotFoundError(message)
                                            : absl::InternalError(message);
  }
  // Per (generation, rank): the dump with the highest number.
  std::map<std::pair<int64_t, int>, std::pair<int64_t, FlightRecorderDump>> newest;
  for (const std::string& name : *names) {
    std::optional<std::pair<int, int64_t>> parsed = ParseDumpName(name);
    if (!parsed.has_value()) continue;
    absl::StatusOr<FlightRecorderDump> dump =
        ReadFlightRecorderDump(absl::StrCat(dir, "/", name), env);
    if (!dump.ok()) return dump.status();
    const auto key = std::make_pair(DumpGeneration(*dump), parsed->first);
    auto it = newest.find(key);
    if (it == newest.end() || it->second.first < parsed->second) {
      newest[key] = {parsed->second, *std::move(dump)};
    }
  }
  if (newest.empty()) {
    return absl::NotFoundError(absl::StrCat("no flight recorder dump (rank-*.pb) in ", dir));
  }
  if (generation < 0) generation = newest.rbegin()->first.first;
  std::vector<FlightRecorderDump> dumps;
  for (auto& [key, value] : newest) {
    if (key.first == generation) dumps.push_back(std::move(value.second));
  }
  if (dumps.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no flight recorder dump of generation ", generation, " in ", dir));
  }
  return dumps;
}

namespace {

HangDumpDigest DigestOf(const FlightRecorderDump& dump, CollectivePositions positions) {
  HangDumpDigest digest;
  digest.rank = dump.rank;
  digest.generation = DumpGeneration(dump);
  digest.dumped_at = dump.dumped_at;
  digest.reason = EvidenceOf(dump, "reason").value_or("");
  digest.positions = std::move(positions);
  digest.training = TrainingThreadFrames(dump);
  return digest;
}

}  // namespace

HangDumpDigest DigestHangDump(const FlightRecorderDump& dump) {
  return DigestOf(dump, PositionsOf(dump.contents));
}

HangDumpDigest DigestHangDump(const FlightRecorderDumpPositions& read) {
  return DigestOf(read.dump, read.positions);
}

namespace {

constexpr uint32_t kDigestFormatVersion = 1;

}  // namespace

std::string HangDumpDigestPath(absl::string_view dump_path) {
  absl::ConsumeSuffix(&dump_path, ".pb");
  return absl::StrCat(dump_path, ".digest");
}

std::string EncodeHangDumpDigest(const HangDumpDigest& digest) {
  proto::HangDumpDigestProto p;
  p.set_format_version(kDigestFormatVersion);
  p.set_rank(digest.rank);
  p.set_generation(digest.generation);
  p.set_dumped_unix_micros(absl::ToUnixMicros(digest.dumped_at));
  p.set_reason(digest.reason);
  for (const auto& [comm, position] : digest.positions) {
    proto::CollectivePositionProto* q = p.add_positions();
    q->set_comm_id(comm);
    q->set_entered_any(position.entered_any);
    q->set_entered(position.entered);
    q->set_op(position.op);
    q->set_left(position.left);
    q->set_member(position.member);
    q->set_comm_name(position.comm_name);
  }
  for (const std::string& frame : digest.training) p.add_training_frames(frame);
  return p.SerializeAsString();
}

absl::StatusOr<HangDumpDigest> DecodeHangDumpDigest(absl::string_view bytes) {
  proto::HangDumpDigestProto p;
  if (!p.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())) ||
      p.format_version() != kDigestFormatVersion || p.rank() < 0) {
    return absl::DataLossError(absl::StrCat(
        "not a hang dump digest (", bytes.size(),
        " bytes that do not parse as format version 1 of trainguard.proto.HangDumpDigestProto)"));
  }
  HangDumpDigest digest;
  digest.rank = p.rank();
  digest.generation = p.generation();
  digest.dumped_at = absl::FromUnixMicros(p.dumped_unix_micros());
  digest.reason = p.reason();
  for (const proto::CollectivePositionProto& q : p.positions()) {
    digest.positions[q.comm_id()] = {q.entered_any(), q.entered(), q.op(),
                                     q.left(),        q.member(),  q.comm_name()};
  }
  digest.training.assign(p.training_frames().begin(), p.training_frames().end());
  return digest;
}

absl::StatusOr<std::string> WriteHangDump(
    const FlightRecorderContents& contents, int rank,
    const std::vector<std::pair<std::string, std::string>>& evidence, const std::string& prefix,
    int64_t first, Env* env) {
  if (env == nullptr) env = Env::Default();
  FlightRecorderDump dump;
  dump.rank = rank;
  dump.contents = contents;
  dump.evidence = evidence;
  absl::StatusOr<std::string> path = WriteNewFlightRecorderDump(&dump, prefix, first);
  if (!path.ok()) return path;
  // The dump is written to the microsecond (dumped_unix_micros): so is its digest, and the two
  // read back alike.
  dump.dumped_at = absl::FromUnixMicros(absl::ToUnixMicros(dump.dumped_at));
  const std::string digest_path = HangDumpDigestPath(*path);
  // Renamed into place whole, synced first: a digest torn by a crash could decode as a shorter
  // one. Its name is its dump's, which no other dump takes.
  const std::string temp_path = absl::StrCat(digest_path, ".tmp");
  absl::StatusOr<std::unique_ptr<WritableFile>> file = env->NewWritableFile(temp_path);
  absl::Status written = file.status();
  if (written.ok()) written = (*file)->Append(EncodeHangDumpDigest(DigestHangDump(dump)));
  if (written.ok()) written = (*file)->Sync();
  if (written.ok()) written = (*file)->Close();
  if (written.ok()) written = env->RenameFile(temp_path, digest_path);
  if (!written.ok() && file.ok()) env->RemoveFile(temp_path).IgnoreError();
  return path;
}

absl::StatusOr<HangDumpDigest> ReadHangDumpDigest(const std::string& path, Env* env) {
  if (env == nullptr) env = Env::Default();
  absl::StatusOr<std::string> bytes = env->ReadFileToString(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<HangDumpDigest> digest = DecodeHangDumpDigest(*bytes);
  if (!digest.ok()) {
    return absl::DataLossError(
        absl::StrCat("hang dump digest ", path, ": ", digest.status().message()));
  }
  return digest;
}

HangDiagnosis DiagnoseHang(const HangEvidence& evidence) {
  std::vector<HangDumpDigest> digests;
  digests.reserve(evidence.dumps.size());
  for (const FlightRecorderDump& dump : evidence.dumps) digests.push_back(DigestHangDump(dump));
  return DiagnoseHang(digests, evidence.live_rings, evidence.world_size);
}

HangDiagnosis DiagnoseHang(const std::vector<HangDumpDigest>& dumps,
                           const std::map<int, FlightRecorderContents>& live_rings,
                           int world_size) {
  HangDiagnosis d;
  std::map<int, const HangDumpDigest*> by_rank;
  for (const HangDumpDigest& dump : dumps) {
    by_rank[dump.rank] = &dump;
    d.generation = std::max(d.generation, dump.generation);
  }
  for (const auto& [rank, dump] : by_rank) d.dumped.push_back(rank);
  for (int r = 0; r < world_size; ++r) {
    if (by_rank.count(r) == 0) d.missing.push_back(r);
  }

  // 1. Rings: the dumped ones, and the live ones of ranks without a dump.
  std::vector<int> ranks;
  std::vector<CollectivePositions> positions;
  for (const auto& [rank, dump] : by_rank) {
    ranks.push_back(rank);
    positions.push_back(dump->positions);
  }
  for (const auto& [rank, ring] : live_rings) {
    if (by_rank.count(rank) != 0) continue;
    ranks.push_back(rank);
    positions.push_back(PositionsOf(ring));
  }
  d.laggards = FindLaggards(ranks, positions);
  d.roots = FindHangRoots(ranks, positions).roots;

  // 2. Stacks: group the training threads by the modules they run in.
  std::map<std::vector<std::string>, StackGroup> groups;
  for (const auto& [rank, dump] : by_rank) {
    const std::vector<std::string>& frames = dump->training;
    StackGroup& group = groups[ModuleSequence(frames)];
    if (group.ranks.empty()) {
      for (const std::string& frame : frames) {
        group.frames.push_back(absl::StartsWith(frame, "(") ? frame : FrameSignature(frame));
      }
    }
    group.ranks.push_back(rank);  // ascending: by_rank is ordered
  }
  for (auto& [modules, group] : groups) {
    group.modules = modules;
    group.recovering = std::any_of(group.frames.begin(), group.frames.end(), IsRecoveryFrame);
    d.stack_groups.push_back(std::move(group));
  }
  std::sort(d.stack_groups.begin(), d.stack_groups.end(),
            [](const StackGroup& a, const StackGroup& b) {
              if (a.ranks.size() != b.ranks.size()) return a.ranks.size() > b.ranks.size();
              return a.ranks.front() < b.ranks.front();
            });
  // A rank that has moved on to recovery is neither the majority nor an outlier.
  const std::vector<const StackGroup*> stuck = StuckGroups(d.stack_groups);
  if (stuck.size() >= 2 && stuck[0]->ranks.size() > stuck[1]->ranks.size()) {
    for (size_t i = 1; i < stuck.size(); ++i) {
      d.stack_outliers.insert(d.stack_outliers.end(), stuck[i]->ranks.begin(),
                              stuck[i]->ranks.end());
    }
    std::sort(d.stack_outliers.begin(), d.stack_outliers.end());
  }

  // 3. Suspects.
  // The laggards themselves are not: one that waits in another communicator for someone else is
  // where a wait passes, not where it ends.
  std::set<int> suspects(d.missing.begin(), d.missing.end());
  suspects.insert(d.stack_outliers.begin(), d.stack_outliers.end());
  for (const HangRoot& root : d.roots) suspects.insert(root.rank);
  d.suspects.assign(suspects.begin(), suspects.end());
  return d;
}

std::string HangDiagnosis::ToString() const {
  constexpr size_t kFramesShown = 8;
  std::string out = suspects.empty() ? "suspects: none found"
                                     : absl::StrCat("suspects: ", RankList(suspects));
  absl::StrAppend(&out, "\n", "generation ", generation, ", dumps from ",
                  dumped.empty() ? "no rank" : RankList(dumped));
  for (const HangRoot& root : roots) absl::StrAppend(&out, "\n", root.ToString());
  for (const LaggardReport& report : laggards) absl::StrAppend(&out, "\n", report.ToString());
  if (!missing.empty()) {
    absl::StrAppend(&out, "\n", RankList(missing),
                    missing.size() == 1 ? " wrote no dump" : " wrote no dumps",
                    " (stopped, dead or unable to write)");
  }
  for (const StackGroup& group : stack_groups) {
    if (!group.recovering) continue;
    absl::StrAppend(&out, "\n", RankList(group.ranks),
                    group.ranks.size() == 1 ? " had" : " had all",
                    " moved on to recovery when dumping: ", Abbreviate(group.frames, kFramesShown));
  }
  const std::vector<const StackGroup*> stuck = StuckGroups(stack_groups);
  if (!stack_outliers.empty()) {
    absl::StrAppend(&out, "\n", RankList(stuck[0]->ranks),
                    " wait together in: ", Abbreviate(stuck[0]->frames, kFramesShown));
    for (size_t i = 1; i < stuck.size(); ++i) {
      absl::StrAppend(
          &out, "\n", RankList(stuck[i]->ranks),
          stuck[i]->ranks.size() == 1 ? "'s training thread is" : "' training threads are",
          " elsewhere: ", Abbreviate(stuck[i]->frames, kFramesShown));
    }
  } else if (stuck.size() > 1) {
    absl::StrAppend(&out, "\n", "no majority among the training threads' stacks (", stuck.size(),
                    " groups)");
  }
  return out;
}

}  // namespace trainguard
