#include "sdk/runtime/peer_progress.h"

#include <algorithm>
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
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "sdk/core/store_keys.h"
#include "trainguard/communicator.h"

namespace trainguard {
namespace runtime_internal {
namespace {

constexpr absl::string_view kVersion = "v1";

absl::Status Bad(std::string_view field, std::string_view text) {
  return absl::InvalidArgumentError(
      absl::StrFormat("peer progress record \"%s\": bad %s",
                      absl::CHexEscape(absl::string_view(text.data(), text.size())), field));
}

}  // namespace

int64_t ProgressRecord::BegunOn(uint64_t comm_id) const {
  for (const auto& [id, begun_count] : begun) {
    if (id == comm_id) return begun_count;
  }
  return -1;
}

bool ProgressRecord::MemberOfGeneration(uint64_t generation_comm_id) const {
  for (const auto& [id, begun_count] : begun) {
    if (GenerationOfCommId(id) == generation_comm_id) return true;
  }
  return false;
}

std::string EncodeProgressRecord(const ProgressRecord& record) {
  std::string comms = absl::StrJoin(record.begun, ",",
                                    [](std::string* out, const std::pair<uint64_t, int64_t>& comm) {
                                      absl::StrAppend(out, comm.first, ":", comm.second);
                                    });
  return absl::StrCat(kVersion, " ", absl::ToUnixNanos(record.published), " ",
                      absl::ToInt64Nanoseconds(record.progress_age), " ", record.step, " ",
                      comms.empty() ? absl::string_view("-") : absl::string_view(comms));
}

absl::StatusOr<ProgressRecord> ParseProgressRecord(std::string_view text) {
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(text.data(), text.size()), ' ');
  if (fields.size() != 5 || fields[0] != kVersion) return Bad("version or field count", text);
  ProgressRecord r;
  int64_t wall_ns = 0;
  int64_t age_ns = 0;
  if (!absl::SimpleAtoi(fields[1], &wall_ns)) return Bad("wall time", text);
  if (!absl::SimpleAtoi(fields[2], &age_ns) || age_ns < 0) return Bad("progress age", text);
  if (!absl::SimpleAtoi(fields[3], &r.step)) return Bad("step", text);
  r.published = absl::FromUnixNanos(wall_ns);
  r.progress_age = absl::Nanoseconds(age_ns);
  if (fields[4] != "-") {
    for (absl::string_view comm : absl::StrSplit(fields[4], ',')) {
      const std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(comm, ':');
      uint64_t id = 0;
      int64_t begun_count = 0;
      if (!absl::SimpleAtoi(parts.first, &id) || !absl::SimpleAtoi(parts.second, &begun_count) ||
          begun_count < 0) {
        return Bad("communicator entry", text);
      }
      r.begun.emplace_back(id, begun_count);
    }
  }
  return r;
}

std::string ProgressKey(int64_t generation, int rank) {
  return store_keys::HangProgress(generation, rank);
}

std::string EncodeProgressQuestion(int rank, absl::Time asked) {
  return absl::StrCat(rank, " ", absl::ToUnixNanos(asked));
}

absl::StatusOr<absl::Time> ParseProgressQuestion(std::string_view text) {
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(text.data(), text.size()), ' ');
  int rank = 0;
  int64_t asked_ns = 0;
  if (fields.size() != 2 || !absl::SimpleAtoi(fields[0], &rank)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("progress question \"%s\": not \"<rank> <wall_unix_ns>\"", text));
  }
  if (!absl::SimpleAtoi(fields[1], &asked_ns)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("progress question \"%s\": bad wall time", text));
  }
  return absl::FromUnixNanos(asked_ns);
}

std::optional<std::string> AwaitingFirstRecords(absl::Time asked, absl::Time now,
                                                absl::Duration window) {
  const absl::Duration since = now - asked;
  if (since >= window) return std::nullopt;
  return absl::StrCat("the peers were asked for their progress records ",
                      absl::FormatDuration(absl::Trunc(std::max(since, absl::ZeroDuration()),
                                                       absl::Milliseconds(1))),
                      " ago");
}

std::optional<std::string> ExplainWait(const std::vector<std::optional<std::string>>& records,
                                       int self, std::string_view op, uint64_t comm_id,
                                       int64_t comm_seq, absl::Time now, absl::Duration window,
                                       const std::vector<bool>& stopped) {
  for (int rank = 0; rank < static_cast<int>(records.size()); ++rank) {
    if (rank == self || !records[rank].has_value()) continue;
    if (rank < static_cast<int>(stopped.size()) && stopped[rank]) continue;
    absl::StatusOr<ProgressRecord> r = ParseProgressRecord(*records[rank]);
    if (!r.ok()) continue;
    const int64_t begun = r->BegunOn(comm_id);
    if (begun > comm_seq) continue;  // it entered the collective: it waits too
    if (begun < 0 && r->MemberOfGeneration(GenerationOfCommId(comm_id))) {
      continue;  // it has this generation's communicators but not this group: not a member
    }
    const absl::Duration age = now - r->last_progress();
    if (age > window) continue;
    return absl::StrFormat(
        "rank %d has not entered %s #%d (comm %d) and made progress %s ago (step %d)", rank, op,
        comm_seq, comm_id, absl::FormatDuration(absl::Trunc(age, absl::Milliseconds(1))), r->step);
  }
  return std::nullopt;
}

}  // namespace runtime_internal
}  // namespace trainguard
