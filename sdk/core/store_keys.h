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

}  // namespace trainguard::store_keys

#endif  // TRAINGUARD_SDK_CORE_STORE_KEYS_H_
