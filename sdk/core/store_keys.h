// The store keys and values that cross processes (a rank's Runtime, its peers, and the launcher's
// agents and coordinator): built and parsed here and nowhere else, in the manner of LevelDB's
// db/filename.h, so that a key is never spelled in two files. Keys are relative to the job's store
// (the store prefixes them with the job). sdk/rendezvous/rendezvous.h says what the rendezvous' own
// keys (rdzv/..., built here) hold; agent_keys.h has the launcher's host agents' (agents/...,
// coord/lease, job/...).
//
//   job/stop                            why a rank stopped the job (first writer wins)
//   hang/gen<G>                         a hang declared in generation G: "rank R: <report>"
//   hang/gen<G>/aborted/<R>             the declaring rank R aborted its communicators
//   hang/gen<G>/withdrawn/<R>           the declaring rank R withdrew its hang (the reason)
//   hang/gen<G>/progress/<R>            rank R's collective progress while a hang is judged
//   hang/gen<G>/progress_wanted         a rank whose collective ran past its bound asks its peers
//                                       for their progress records: "<R> <wall_unix_ns>"
//   rdzv/gen/<G>/resumed/<R>            the first step rank R completed in generation G
//   rdzv/...                            the rendezvous' own keys (Rdzv*; rdzv/assign/<member> holds
//                                       an Assignment), whose meaning rendezvous.h gives
//   agents/kill/<host>/<member>         the coordinator asks host's agent to kill member's process:
//                                       "<lease term> <what> <why>" (KillRequest)
//
// Every Decode refuses a malformed value with InvalidArgument naming the key and what is wrong.
//
// Thread safety: pure functions.
#ifndef TRAINGUARD_SDK_CORE_STORE_KEYS_H_
#define TRAINGUARD_SDK_CORE_STORE_KEYS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "trainguard/membership.h"

namespace trainguard::store_keys {

// The part of `key` after `prefix`: the host or member that a key of the family `prefix` names.
// nullopt when `key` is not of the family or names nothing.
inline std::optional<std::string> NameAfter(std::string_view prefix, std::string_view key) {
  if (key.size() <= prefix.size() || key.substr(0, prefix.size()) != prefix) return std::nullopt;
  return std::string(key.substr(prefix.size()));
}

inline constexpr char kJobStop[] = "job/stop";
// "<epoch>/<step>\n<line>[\n<line>...]": the latest silent-corruption verdict, one line per
// data-parallel group whose replicas disagreed (replica_check.h); `trainguard run` prints each new
// one.
inline constexpr char kJobSilentCorruption[] = "job/silent_corruption";
// + "host <host>" or "group <group>": how many silent-corruption verdicts named it (a counter).
inline constexpr char kJobSilentCorruptionNamedPrefix[] = "job/silent_corruption_named/";
// + "<host>": "<times named> <silent_corruption>\n<the verdict's line>": the host is to be evicted
// (silent_corruption=evict, or named a second time); the coordinating agent evicts it or says why
// not (and, under repair or evict, stops the job when it was named twice).
inline constexpr char kJobSilentCorruptionEvictPrefix[] = "job/silent_corruption_evict/";
// "<step> <epoch>": every rank's snapshot of <step> is in memory with all its backups (the
// checkpointer writes "protected" in its "ckpt/" namespace; the coordinator reports each epoch).
inline constexpr char kCkptProtected[] = "ckpt/protected";

inline std::string Hang(int64_t generation) { return absl::StrCat("hang/gen", generation); }
inline std::string HangAborted(int64_t generation, int rank) {
  return absl::StrCat(Hang(generation), "/aborted/", rank);
}
inline std::string HangWithdrawn(int64_t generation, int rank) {
  return absl::StrCat(Hang(generation), "/withdrawn/", rank);
}
inline std::string HangProgress(int64_t generation, int rank) {
  return absl::StrCat(Hang(generation), "/progress/", rank);
}
inline std::string HangProgressWanted(int64_t generation) {
  return absl::StrCat(Hang(generation), "/progress_wanted");
}

// The rendezvous' keys (sdk/rendezvous/rendezvous.h says what each holds).
inline constexpr char kRdzvCurrent[] = "rdzv/current";
inline constexpr char kRdzvStandbyPrefix[] = "rdzv/standby/";
inline std::string RdzvGeneration(int64_t generation) {
  return absl::StrCat("rdzv/gen/", generation, "/");
}
inline std::string RdzvTable(int64_t generation) {
  return absl::StrCat(RdzvGeneration(generation), "table");
}
inline std::string RdzvClaim(int64_t generation) { return absl::StrCat("rdzv/claim/", generation); }
inline std::string RdzvJoin(int rank) { return absl::StrCat("rdzv/join/", rank); }
inline std::string RdzvStandby(absl::string_view member) {
  return absl::StrCat(kRdzvStandbyPrefix, member);
}
// The member a key of kRdzvStandbyPrefix parks; nullopt when it is not one.
inline std::optional<std::string> RdzvStandbyMember(std::string_view key) {
  return NameAfter(kRdzvStandbyPrefix, key);
}
inline std::string RdzvAssign(absl::string_view member) {
  return absl::StrCat("rdzv/assign/", member);
}
inline std::string RdzvHeartbeat(absl::string_view member) {
  return absl::StrCat("rdzv/hb/", member);
}
// Written by a rank's generation watcher as it stops, to end its own parked wait at once
// (sdk/runtime/generation_watcher.h); `nonce` tells one watcher of the member from another.
inline std::string RdzvWake(absl::string_view member, uint64_t nonce) {
  return absl::StrCat("rdzv/wake/", member, "/", nonce);
}
inline std::string RdzvRenewPrefix(int64_t generation) {
  return absl::StrCat(RdzvGeneration(generation), "renew/");
}
inline std::string RdzvBarrierPrefix(int64_t generation, absl::string_view name) {
  return absl::StrCat(RdzvGeneration(generation), "barrier/", name, "/");
}
inline std::string RdzvProgressPrefix(int64_t generation) {
  return absl::StrCat(RdzvGeneration(generation), "progress/");
}
inline std::string RdzvChanges(int64_t generation) {
  return absl::StrCat(RdzvGeneration(generation), "changes");
}
inline std::string RdzvAgreed(int64_t generation) {
  return absl::StrCat(RdzvGeneration(generation), "agreed");
}
inline std::string RdzvPlan(int64_t generation) {
  return absl::StrCat(RdzvGeneration(generation), "plan");
}
inline std::string RdzvBarrierArrived(int64_t generation, absl::string_view name) {
  return absl::StrCat(RdzvGeneration(generation), "barrier/", name, "/arrived");
}
inline std::string RdzvBarrierPassed(int64_t generation, absl::string_view name) {
  return absl::StrCat(RdzvGeneration(generation), "barrier/", name, "/passed");
}
inline std::string Resumed(int64_t generation, int rank) {
  return absl::StrCat(RdzvGeneration(generation), "resumed/", rank);
}
// How many ranks wrote their Resumed key of `generation` (each adds one after its first write of
// it): the coordinator reads one key per turn to learn that a recovery ended, not every rank's.
inline std::string ResumedCount(int64_t generation) {
  return absl::StrCat(RdzvGeneration(generation), "resumed_count");
}

// The value of RdzvAssign(member): the coordinator gives a parked standby `rank` in `generation`.
struct Assignment {
  int64_t generation = -1;
  int rank = -1;
};
inline std::string EncodeAssignment(const Assignment& a) {
  return absl::StrCat(a.generation, " ", a.rank);
}
// InvalidArgument for a value that is not "<generation> <rank>" with both >= 0.
inline absl::StatusOr<Assignment> DecodeAssignment(std::string_view value) {
  const absl::string_view v(value.data(), value.size());
  const size_t space = v.find(' ');
  Assignment a;
  if (space == absl::string_view::npos || !absl::SimpleAtoi(v.substr(0, space), &a.generation) ||
      a.generation < 0 || !absl::SimpleAtoi(v.substr(space + 1), &a.rank) || a.rank < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "store key rdzv/assign/<member> holds \"%s\": not \"<generation> <rank>\"", v));
  }
  return a;
}

// The value of RdzvChanges(g): what generation g changed in the rank table of generation g - 1,
// so that a member holding g - 1 learns its place in g from a few bytes, not from the table's
// O(world size). Generation 0 changes nothing: its table is the initial ranks' registrations
// (rdzv/join/<rank>), so an initial rank knows its place from its own registration.
//   "<generation>\n<world size>" then "\n<rank> <member id>" for each rank that changed hands.
struct GenerationChanges {
  int64_t generation = -1;
  int world_size = 0;
  // The ranks whose member differs from the previous generation's, in rank order.
  std::vector<std::pair<int, std::string>> taken;
};
inline std::string EncodeGenerationChanges(const GenerationChanges& c) {
  std::string text = absl::StrCat(c.generation, "\n", c.world_size);
  for (const auto& [rank, member] : c.taken) absl::StrAppend(&text, "\n", rank, " ", member);
  return text;
}
// InvalidArgument, naming the generation's key, for a value that is not as above with generation
// >= 0, world size >= 1, ranks inside it in increasing order and non-empty member ids.
inline absl::StatusOr<GenerationChanges> DecodeGenerationChanges(std::string_view value) {
  auto malformed = [value](std::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrFormat("store key rdzv/gen/<g>/changes holds \"%s\": %s",
                        absl::CHexEscape(absl::string_view(value.data(), value.size())), what));
  };
  const std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(value.data(), value.size()), '\n');
  GenerationChanges c;
  if (!absl::SimpleAtoi(lines[0], &c.generation) || c.generation < 0) {
    return malformed("no generation >= 0 on its first line");
  }
  if (lines.size() < 2 || !absl::SimpleAtoi(lines[1], &c.world_size) || c.world_size < 1) {
    return malformed("no world size >= 1 on its second line");
  }
  for (size_t i = 2; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    const size_t space = line.find(' ');
    int rank = -1;
    if (space == absl::string_view::npos || !absl::SimpleAtoi(line.substr(0, space), &rank) ||
        rank < 0 || rank >= c.world_size || space + 1 == line.size() ||
        (!c.taken.empty() && rank <= c.taken.back().first)) {
      return malformed(
          "a line is not \"<rank> <member id>\" with ranks increasing within the world size");
    }
    c.taken.emplace_back(rank, std::string(line.substr(space + 1)));
  }
  return c;
}

// The value of RdzvPlan(g): the RecoveryPlan every rank of generation g agreed on, computed once
// by the rank whose progress completed the count (RdzvAgreed) and read by the others.
//   "<generation> <resume step> <state source rank> <new ranks>", the new ranks as runs
//   "a-b,c" ("-" for none), so that a generation in which most ranks are new stays short.
inline std::string EncodeRecoveryPlan(const RecoveryPlan& p) {
  std::string runs;
  for (size_t i = 0; i < p.new_ranks.size();) {
    size_t j = i;
    while (j + 1 < p.new_ranks.size() && p.new_ranks[j + 1] == p.new_ranks[j] + 1) ++j;
    if (!runs.empty()) runs.push_back(',');
    absl::StrAppend(&runs, p.new_ranks[i]);
    if (j > i) absl::StrAppend(&runs, "-", p.new_ranks[j]);
    i = j + 1;
  }
  return absl::StrCat(p.generation, " ", p.resume_step, " ", p.state_source_rank, " ",
                      runs.empty() ? "-" : runs);
}
// What the coordinator leaves at RdzvPlan(g) when it publishes generation `newer` before the ranks
// of g agreed: those still waiting for the plan leave for the newer generation at once.
inline std::string SupersededPlan(int64_t newer) { return absl::StrCat("superseded by ", newer); }
inline bool IsSupersededPlan(std::string_view value) {
  return value.substr(0, 14) == "superseded by ";
}
// InvalidArgument for a value that is not as above: a generation >= 0, a resume step >= 0, a state
// source >= -1, runs of ranks >= 0 in increasing order.
inline absl::StatusOr<RecoveryPlan> DecodeRecoveryPlan(std::string_view value) {
  auto malformed = [value](std::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrFormat("store key rdzv/gen/<g>/plan holds \"%s\": %s",
                        absl::CHexEscape(absl::string_view(value.data(), value.size())), what));
  };
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(value.data(), value.size()), ' ');
  RecoveryPlan p;
  if (fields.size() != 4 || !absl::SimpleAtoi(fields[0], &p.generation) || p.generation < 0 ||
      !absl::SimpleAtoi(fields[1], &p.resume_step) || p.resume_step < 0 ||
      !absl::SimpleAtoi(fields[2], &p.state_source_rank) || p.state_source_rank < -1) {
    return malformed("not \"<generation> <resume step> <state source rank> <new ranks>\"");
  }
  if (fields[3] == "-") return p;
  for (absl::string_view run : absl::StrSplit(fields[3], ',')) {
    const size_t dash = run.find('-');
    int first = -1;
    int last = -1;
    if (!absl::SimpleAtoi(run.substr(0, dash), &first) ||
        (dash != absl::string_view::npos && !absl::SimpleAtoi(run.substr(dash + 1), &last))) {
      return malformed("a new rank is not a number or a run \"a-b\"");
    }
    if (dash == absl::string_view::npos) last = first;
    if (first < 0 || last < first || (!p.new_ranks.empty() && first <= p.new_ranks.back())) {
      return malformed("the new ranks are not increasing");
    }
    for (int r = first; r <= last; ++r) p.new_ranks.push_back(r);
  }
  return p;
}

// The value of Hang(G): which rank declared it, and its report.
struct HangDeclaration {
  int rank = -1;
  std::string report;
};
inline std::string EncodeHangDeclaration(const HangDeclaration& d) {
  return absl::StrCat("rank ", d.rank, ": ", d.report);
}
// InvalidArgument for a value that is not "rank R: ..." with R >= 0.
inline absl::StatusOr<HangDeclaration> DecodeHangDeclaration(std::string_view value) {
  absl::string_view rest(value.data(), value.size());
  size_t colon = absl::string_view::npos;
  int rank = -1;
  if (absl::ConsumePrefix(&rest, "rank ")) colon = rest.find(": ");
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, colon), &rank) ||
      rank < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "store key hang/gen<G> holds \"%s\": not \"rank <R>: <report>\" with R >= 0", value));
  }
  return HangDeclaration{rank, std::string(rest.substr(colon + 2))};
}

// A kill request: the coordinator of lease term `term` asks the agent of `host` to kill the process
// of `member` ("<host>:<pid>:<role>"), for `what` (an event kind such as "hang_suspect") because of
// `why`. The agent carries out only requests of the newest term it knows of the lease: a deposed
// coordinator that still acts (cut off, then back) cannot have a process killed.
inline std::string AgentKillPrefix(absl::string_view host) {
  return absl::StrCat("agents/kill/", host, "/");
}
inline std::string AgentKill(absl::string_view host, absl::string_view member) {
  return absl::StrCat(AgentKillPrefix(host), member);
}
// agents/kills/<host>: how many kill requests were written for `host` (an Add after each request),
// so that its agent, which reads the count with the rest of its turn, lists its requests only when
// the count moved, not in every turn.
inline std::string AgentKillCount(absl::string_view host) {
  return absl::StrCat("agents/kills/", host);
}
// The member whose kill `key` (one of AgentKillPrefix(host)) requests; nullopt when it is not one.
inline std::optional<std::string> AgentKillMember(absl::string_view host, std::string_view key) {
  return NameAfter(AgentKillPrefix(host), key);
}
struct KillRequest {
  int64_t term = 0;
  std::string what;  // one word
  std::string why;
};
inline std::string EncodeKillRequest(const KillRequest& r) {
  return absl::StrCat(r.term, " ", r.what, " ", r.why);
}
// InvalidArgument for a value that is not "<term> <what> <why>" with term >= 1 and a non-empty
// `what`, naming the field.
inline absl::StatusOr<KillRequest> DecodeKillRequest(std::string_view value) {
  auto malformed = [value](std::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrFormat("store key agents/kill/<host>/<member> holds \"%s\": %s", value, what));
  };
  const size_t first = value.find(' ');
  if (first == std::string_view::npos) return malformed("not \"<term> <what> <why>\"");
  KillRequest r;
  if (!absl::SimpleAtoi(absl::string_view(value.data(), first), &r.term) || r.term < 1) {
    return malformed("term is not a lease term (a number >= 1)");
  }
  const std::string_view rest = value.substr(first + 1);
  const size_t second = rest.find(' ');
  r.what = std::string(rest.substr(0, second));
  if (r.what.empty()) return malformed("what is empty");
  if (second != std::string_view::npos) r.why = std::string(rest.substr(second + 1));
  return r;
}

}  // namespace trainguard::store_keys

#endif  // TRAINGUARD_SDK_CORE_STORE_KEYS_H_
