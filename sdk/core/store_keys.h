// The store keys and values that cross processes (a rank's Runtime, its peers, and the launcher's
// agents and coordinator): built and parsed here and nowhere else, in the manner of LevelDB's
// db/filename.h, so that a key is never spelled in two files. Keys are relative to the job's store
// (the store prefixes them with the job). sdk/rendezvous/rendezvous.h lists the rendezvous' own
// keys (rdzv/...), built in rendezvous.cc.
//
//   job/stop                            why a rank stopped the job (first writer wins)
//   hang/gen<G>                         a hang declared in generation G: "rank R: <report>"
//   hang/gen<G>/aborted/<R>             the declaring rank R aborted its communicators
//   hang/gen<G>/withdrawn/<R>           the declaring rank R withdrew its hang (the reason)
//   hang/gen<G>/progress/<R>            rank R's collective progress while a hang is judged
//   rdzv/gen/<G>/resumed/<R>            the first step rank R completed in generation G
//   agents/kill/<host>/<member>         the coordinator asks host's agent to kill member's process:
//                                       "<lease term> <what> <why>" (KillRequest)
//
// Thread safety: pure functions.
#ifndef TRAINGUARD_SDK_CORE_STORE_KEYS_H_
#define TRAINGUARD_SDK_CORE_STORE_KEYS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace trainguard::store_keys {

inline constexpr char kJobStop[] = "job/stop";

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
inline std::string Resumed(int64_t generation, int rank) {
  return absl::StrCat("rdzv/gen/", generation, "/resumed/", rank);
}

// The value of Hang(G): which rank declared it, and its report.
struct HangDeclaration {
  int rank = -1;
  std::string report;
};
inline std::string EncodeHangDeclaration(const HangDeclaration& d) {
  return absl::StrCat("rank ", d.rank, ": ", d.report);
}
// nullopt for a value that is not "rank R: ..." with R >= 0.
inline std::optional<HangDeclaration> DecodeHangDeclaration(std::string_view value) {
  absl::string_view rest(value.data(), value.size());
  if (!absl::ConsumePrefix(&rest, "rank ")) return std::nullopt;
  const size_t colon = rest.find(": ");
  int rank = -1;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, colon), &rank) ||
      rank < 0) {
    return std::nullopt;
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
struct KillRequest {
  int64_t term = 0;
  std::string what;  // one word
  std::string why;
};
inline std::string EncodeKillRequest(const KillRequest& r) {
  return absl::StrCat(r.term, " ", r.what, " ", r.why);
}
// nullopt for a value that is not "<term> <what> <why>" with term >= 1 and a non-empty `what`.
inline std::optional<KillRequest> DecodeKillRequest(std::string_view value) {
  const size_t first = value.find(' ');
  if (first == std::string_view::npos) return std::nullopt;
  KillRequest r;
  if (!absl::SimpleAtoi(absl::string_view(value.data(), first), &r.term) || r.term < 1) {
    return std::nullopt;
  }
  const std::string_view rest = value.substr(first + 1);
  const size_t second = rest.find(' ');
  r.what = std::string(rest.substr(0, second));
  if (r.what.empty()) return std::nullopt;
  if (second != std::string_view::npos) r.why = std::string(rest.substr(second + 1));
  return r;
}

}  // namespace trainguard::store_keys

#endif  // TRAINGUARD_SDK_CORE_STORE_KEYS_H_
