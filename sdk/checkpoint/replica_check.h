// Silent data corruption: the replicas of a data-parallel group hold bit-identical replicated
// state (StateBuffer::replicated) after every optimizer step, so their snapshots' replica digests
// (Snapshotter::ReplicaPiece, taken while the snapshot's chunk checksums are) must be equal. Each
// rank's snapshot vote carries the fingerprint of its replicated region and its group (its
// model-parallel coordinates); the rank that completes the ballot judges every group
// (JudgeReplicas). A step whose replicas disagree is never committed. The ranks of a disagreeing
// group then publish their replica digests (Snapshotter::ReplicaPiece), and DifferingBuffers names
// the buffers where a minority rank's bytes differ from the majority's. docs/GUIDE.md, "Silent data
// corruption".
//
// Thread safety: plain values and pure functions.
#ifndef TRAINGUARD_SDK_CHECKPOINT_REPLICA_CHECK_H_
#define TRAINGUARD_SDK_CHECKPOINT_REPLICA_CHECK_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sdk/checkpoint/snapshotter.h"

namespace trainguard {

// What one rank says of its replicated state at a step.
struct ReplicaReport {
  int rank = 0;
  std::string group;  // the rank's model-parallel coordinates, e.g. "tp0.cp0.pp1"
  std::string host;   // where the rank runs
  uint64_t fingerprint = 0;
};

// XXH3-64 of a snapshot's replica digests (Snapshotter::View::replica_digests): the replicated
// region's identity.
uint64_t ReplicaFingerprint(const std::vector<uint64_t>& replica_digests);

// The replica part of a snapshot vote: "replica=GROUP:FINGERPRINT@HOST" (a group and host without
// spaces, ':' or '@'; others are replaced by '_').
std::string EncodeReplicaVote(const ReplicaReport& report);
// The report in a vote value ("<snapshot fingerprint>[ replica=...]") of `rank`; nullopt when
// the vote has none. InvalidArgument for a malformed replica part.
absl::StatusOr<std::optional<ReplicaReport>> DecodeReplicaVote(int rank, std::string_view vote);

// The compute canary's part of a vote: " canary=FINGERPRINT@HOST" (compute_canary.h). Its reports
// form one group, kCanaryGroup, of every rank of the job: a healthy machine computes the same
// bits as every other.
inline constexpr char kCanaryGroup[] = "canary";
std::string EncodeCanaryVote(uint64_t fingerprint, std::string_view host);
// The canary report (group kCanaryGroup) in a vote of `rank`; nullopt when it has none.
// InvalidArgument for a malformed canary part.
absl::StatusOr<std::optional<ReplicaReport>> DecodeCanaryVote(int rank, std::string_view vote);

// One data-parallel group whose replicas disagree (or, group kCanaryGroup, ranks whose compute
// canary differs).
struct ReplicaDisagreement {
  std::string group;
  std::vector<int> ranks;  // the group's ranks, ascending
  std::vector<std::string> hosts;
  std::vector<uint64_t> fingerprints;  // each rank's, in `ranks` order
  // The strict majority's fingerprint; nullopt when no fingerprint is held by more than half of
  // the group (two replicas that differ, or no two alike): undecidable, nobody is named.
  std::optional<uint64_t> majority;
  std::vector<int> minority;  // the ranks that differ from the majority; empty when undecidable
  int reference = -1;         // the lowest rank holding the majority's fingerprint; -1 undecidable
  // Filled in once the group's replica digests are compared (DifferingBuffers): per rank of
  // `minority` (or, undecidable, per rank of `ranks` after the first, against the first), the
  // buffers that differ; empty when the digests did not arrive.
  std::vector<std::vector<std::string>> buffers;
  std::string digests_missing;  // why `buffers` is empty, if it is

  // Where `rank` is in `ranks` (and so in `hosts`, `fingerprints`); ranks.size() if absent.
  size_t IndexOf(int rank) const;
};

// Every group of more than one rank whose fingerprints are not all equal, in group order. Ranks
// alone in their group have nobody to agree with and are not judged.
std::vector<ReplicaDisagreement> JudgeReplicas(const std::vector<ReplicaReport>& reports);

// The buffers whose bytes differ between two replicas' digests of the same layout: in each chunk,
// the first piece whose digest differs (the digests after it cover it too, so they cannot tell),
// each buffer once, in payload order. Empty when the digests agree or do not match `pieces`.
std::vector<std::string> DifferingBuffers(const std::vector<Snapshotter::ReplicaPiece>& pieces,
                                          const std::vector<uint64_t>& a,
                                          const std::vector<uint64_t>& b);

// The operator's line for one disagreement at `step`, as `trainguard run` prints it and the
// silent_corruption event says it.
std::string DescribeDisagreement(int64_t step, const ReplicaDisagreement& d);

// The record of a verdict in job/silent_corruption (store_keys.h): `id` (what was judged, unique
// per verdict), then DescribeDisagreement's line of each disagreement, newline-separated.
std::string VerdictRecord(std::string_view id, int64_t step,
                          const std::vector<ReplicaDisagreement>& verdict);

// Replica digests as store text (16 hex digits each, comma-separated) and back; InvalidArgument
// for malformed text.
std::string EncodeDigests(const std::vector<uint64_t>& digests);
absl::StatusOr<std::vector<uint64_t>> DecodeDigests(std::string_view text);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_REPLICA_CHECK_H_
