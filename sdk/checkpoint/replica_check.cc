// Replica comparison: the replica part of a snapshot vote, the verdict on a ballot and the naming
// of the buffers that differ.
#include "sdk/checkpoint/replica_check.h"

#include <xxhash.h>

#include <algorithm>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace trainguard {
namespace {

constexpr std::string_view kReplicaTag = " replica=";
constexpr std::string_view kCanaryTag = " canary=";

// The part of `vote` after `tag`, up to the next part.
std::optional<std::string_view> PartOf(std::string_view vote, std::string_view tag) {
  const size_t at = vote.find(tag);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view part = vote.substr(at + tag.size());
  return part.substr(0, part.find(' '));
}

std::string Sanitized(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c == ' ' || c == ':' || c == '@' || c == ',' || c == '\n') c = '_';
  }
  return out;
}

std::optional<uint64_t> ParseHex(std::string_view text) {
  uint64_t value = 0;
  if (text.size() != 16 ||
      !absl::SimpleHexAtoi(absl::string_view(text.data(), text.size()), &value)) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

uint64_t ReplicaFingerprint(const std::vector<uint64_t>& replica_digests) {
  return XXH3_64bits(replica_digests.data(), replica_digests.size() * sizeof(uint64_t));
}

std::string EncodeReplicaVote(const ReplicaReport& report) {
  return absl::StrFormat("%s%s:%016x@%s", kReplicaTag, Sanitized(report.group), report.fingerprint,
                         Sanitized(report.host));
}

absl::StatusOr<std::optional<ReplicaReport>> DecodeReplicaVote(int rank, std::string_view vote) {
  const std::optional<std::string_view> found = PartOf(vote, kReplicaTag);
  if (!found.has_value()) return std::optional<ReplicaReport>();
  const std::string_view part = *found;
  const size_t colon = part.find(':');
  const size_t sign = part.find('@');
  std::optional<uint64_t> fingerprint;
  if (colon != std::string_view::npos && sign == colon + 17) {
    fingerprint = ParseHex(part.substr(colon + 1, 16));
  }
  if (!fingerprint.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d's snapshot vote has a malformed replica part \"%s\" (want "
                        "replica=GROUP:<16 hex digits>@HOST)",
                        rank, part));
  }
  return std::optional<ReplicaReport>(ReplicaReport{
      rank, std::string(part.substr(0, colon)), std::string(part.substr(sign + 1)), *fingerprint});
}

std::string EncodeCanaryVote(uint64_t fingerprint, std::string_view host) {
  return absl::StrFormat("%s%016x@%s", kCanaryTag, fingerprint, Sanitized(host));
}

absl::StatusOr<std::optional<ReplicaReport>> DecodeCanaryVote(int rank, std::string_view vote) {
  const std::optional<std::string_view> found = PartOf(vote, kCanaryTag);
  if (!found.has_value()) return std::optional<ReplicaReport>();
  const std::string_view part = *found;
  std::optional<uint64_t> fingerprint;
  if (part.size() > 16 && part[16] == '@') fingerprint = ParseHex(part.substr(0, 16));
  if (!fingerprint.has_value()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank %d's snapshot vote has a malformed canary part \"%s\" (want canary=<16 hex "
        "digits>@HOST)",
        rank, part));
  }
  return std::optional<ReplicaReport>(
      ReplicaReport{rank, kCanaryGroup, std::string(part.substr(17)), *fingerprint});
}

size_t ReplicaDisagreement::IndexOf(int rank) const {
  return static_cast<size_t>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
}

std::vector<ReplicaDisagreement> JudgeReplicas(const std::vector<ReplicaReport>& reports) {
  std::map<std::string, std::vector<const ReplicaReport*>> groups;
  for (const ReplicaReport& r : reports) groups[r.group].push_back(&r);
  std::vector<ReplicaDisagreement> out;
  for (auto& [group, members] : groups) {
    if (members.size() < 2) continue;
    std::sort(members.begin(), members.end(),
              [](const ReplicaReport* a, const ReplicaReport* b) { return a->rank < b->rank; });
    std::map<uint64_t, size_t> counts;
    for (const ReplicaReport* m : members) ++counts[m->fingerprint];
    if (counts.size() == 1) continue;
    ReplicaDisagreement d;
    d.group = group;
    for (const ReplicaReport* m : members) {
      d.ranks.push_back(m->rank);
      d.hosts.push_back(m->host);
      d.fingerprints.push_back(m->fingerprint);
    }
    for (const auto& [fingerprint, count] : counts) {
      if (2 * count > members.size()) d.majority = fingerprint;
    }
    if (d.majority.has_value()) {
      for (const ReplicaReport* m : members) {
        if (m->fingerprint != *d.majority) {
          d.minority.push_back(m->rank);
        } else if (d.reference < 0) {
          d.reference = m->rank;
        }
      }
    }
    out.push_back(std::move(d));
  }
  return out;
}

std::vector<std::string> DifferingBuffers(const std::vector<Snapshotter::ReplicaPiece>& pieces,
                                          const std::vector<uint64_t>& a,
                                          const std::vector<uint64_t>& b) {
  std::vector<std::string> out;
  if (a.size() != pieces.size() || b.size() != pieces.size()) return out;
  int64_t decided_chunk = -1;  // a chunk whose first differing piece was found
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].chunk == decided_chunk || a[i] == b[i]) continue;
    decided_chunk = pieces[i].chunk;
    if (std::find(out.begin(), out.end(), pieces[i].buffer) == out.end()) {
      out.push_back(pieces[i].buffer);
    }
  }
  return out;
}

std::string DescribeDisagreement(int64_t step, const ReplicaDisagreement& d) {
  auto buffers_of = [&](size_t i) -> std::string {
    if (i < d.buffers.size() && !d.buffers[i].empty()) {
      return absl::StrCat("buffer ", absl::StrJoin(d.buffers[i], ","));
    }
    return absl::StrCat("buffer unknown", d.digests_missing.empty()
                                              ? ""
                                              : absl::StrCat(" (", d.digests_missing, ")"));
  };
  if (d.group == kCanaryGroup) {
    std::vector<std::string> each;
    for (size_t i = 0; i < d.ranks.size(); ++i) {
      if (d.majority.has_value() && d.fingerprints[i] == *d.majority) continue;
      each.push_back(absl::StrFormat("rank %d (host %s) computed %016x", d.ranks[i], d.hosts[i],
                                     d.fingerprints[i]));
    }
    if (d.majority.has_value()) {
      return absl::StrFormat(
          "step %d: compute canary: %s, the job's majority %016x (rank %d): its arithmetic is "
          "wrong",
          step, absl::StrJoin(each, "; "), *d.majority, d.reference);
    }
    return absl::StrFormat(
        "step %d: compute canary: the ranks' results differ and no majority decides (%s); nobody "
        "is named",
        step, absl::StrJoin(each, ", "));
  }
  if (d.majority.has_value()) {
    std::vector<std::string> named;
    for (size_t m = 0; m < d.minority.size(); ++m) {
      const size_t i = d.IndexOf(d.minority[m]);
      named.push_back(absl::StrFormat("rank %d (host %s) %s: fingerprint %016x", d.minority[m],
                                      d.hosts[i], buffers_of(m), d.fingerprints[i]));
    }
    return absl::StrFormat(
        "step %d: data-parallel group %s (ranks %s): %s; the majority's fingerprint %016x "
        "(rank %d)",
        step, d.group, absl::StrJoin(d.ranks, ","), absl::StrJoin(named, "; "), *d.majority,
        d.reference);
  }
  std::vector<std::string> each;
  for (size_t i = 0; i < d.ranks.size(); ++i) {
    each.push_back(
        absl::StrFormat("rank %d (host %s) %016x", d.ranks[i], d.hosts[i], d.fingerprints[i]));
  }
  return absl::StrFormat(
      "step %d: data-parallel group %s: its %d replicas disagree and no majority decides (%s); "
      "%s differs between them; nobody is named: the job goes back to the last step they agreed "
      "on",
      step, d.group, d.ranks.size(), absl::StrJoin(each, ", "), buffers_of(0));
}

std::string VerdictRecord(std::string_view id, int64_t step,
                          const std::vector<ReplicaDisagreement>& verdict) {
  std::string record(id);
  for (const ReplicaDisagreement& d : verdict) {
    absl::StrAppend(&record, "\n", DescribeDisagreement(step, d));
  }
  return record;
}

std::string EncodeDigests(const std::vector<uint64_t>& digests) {
  return absl::StrJoin(
      digests, ",", [](std::string* out, uint64_t d) { absl::StrAppendFormat(out, "%016x", d); });
}

absl::StatusOr<std::vector<uint64_t>> DecodeDigests(std::string_view text) {
  std::vector<uint64_t> out;
  if (text.empty()) return out;
  for (absl::string_view field : absl::StrSplit(absl::string_view(text.data(), text.size()), ',')) {
    std::optional<uint64_t> d = ParseHex(std::string_view(field.data(), field.size()));
    if (!d.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("replica digests: \"%s\" is not 16 hex digits", std::string(field)));
    }
    out.push_back(*d);
  }
  return out;
}

}  // namespace trainguard
