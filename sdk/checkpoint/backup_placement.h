// BackupPlacement: which hosts hold the in-memory backups of which host's snapshots, chosen so that
// no single eviction unit (a host, a rack, or every host of a TP, CP, DP or PP group when the
// operator declares that class) removes every copy of any rank's snapshot (docs/GUIDE.md,
// "Redundant in-memory backups"; shared research notes, checkpointing section 5.2).
//
// The unit of placement is the host slot: host g holds ranks g*R .. g*R+R-1 (R = ranks per host,
// Topology's HostOf). A replacement host inherits its predecessor's slot, so a placement is stable
// across recoveries. Backups are rail-aligned: local rank i of host g sends its snapshot to local
// rank i of each holder host, so HolderRanks(rank) = holder_host * R + rank % R.
//
// Every host has m - 1 holders (m = copies, the original included). Where the conflict graph
// allows it, hosts are partitioned into groups of m pairwise non-conflicting hosts that back each
// other up (Gemini's group placement); a number of hosts not divisible by m puts the leftover hosts
// into the last groups, whose members then back up to the next m - 1 members of their group in a
// cycle. Two hosts conflict when some eviction unit of an honoured class contains both. When no
// valid placement exists, classes are dropped, last declared first, until one does; `dropped` and
// `why_dropped` say which and why (the host class is never dropped: fewer than m hosts is an
// error).
//
// Thread safety: plain values and pure functions.
#ifndef TRAINGUARD_SDK_CHECKPOINT_BACKUP_PLACEMENT_H_
#define TRAINGUARD_SDK_CHECKPOINT_BACKUP_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainguard/topology.h"

namespace trainguard {

enum class EvictionClass { kHost, kRack, kTensor, kContext, kData, kPipeline };

// "host", "rack", "tp", "cp", "dp", "pp".
std::string_view EvictionClassName(EvictionClass c);
// A comma-separated list of the names above, e.g. "host,dp,pp". "host" is added first when absent;
// duplicates are removed. InvalidArgument naming an unknown class.
absl::StatusOr<std::vector<EvictionClass>> ParseEvictionClasses(absl::string_view csv);

struct BackupPlacementSpec {
  // world_size, the TP/CP/PP degrees and ranks_per_host (the rank -> host slot map).
  Topology topology;
  int copies = 2;  // m >= 1; 1: no backups
  // In priority order: when a placement is infeasible the last one is dropped first.
  std::vector<EvictionClass> classes = {EvictionClass::kHost};
  // One rack label per host slot, or empty (then the rack class has no units and never conflicts).
  std::vector<std::string> racks = {};
};

// One eviction unit: the hosts that evicting it removes, e.g. "dp group 1" = hosts {0, 1}.
struct EvictionUnit {
  EvictionClass eviction_class;
  std::string name;
  std::vector<int> hosts;
};

class BackupPlacement {
 public:
  // InvalidArgument when fewer than `copies` hosts exist, copies < 1, or the racks list has the
  // wrong length.
  static absl::StatusOr<BackupPlacement> Place(const BackupPlacementSpec& spec);
  // The ring placement of Gemini's comparison: host g -> g+1, ..., g+m-1 (mod hosts), ignoring
  // every eviction class but the host. REQUIRES: 1 <= copies <= num_hosts (clamped otherwise).
  static BackupPlacement Ring(int num_hosts, int ranks_per_host, int copies);

  // "m=2 r=2 h=3,2,1,0": copies, ranks per host, then each host slot's holders ('/'-separated
  // when m > 2, '-' for none). Decode(Encode()) == *this; Decode names what is malformed.
  std::string Encode() const;
  static absl::StatusOr<BackupPlacement> Decode(absl::string_view text);

  int copies() const { return copies_; }
  int num_hosts() const { return static_cast<int>(holders_.size()); }
  int ranks_per_host() const { return ranks_per_host_; }
  const std::vector<EvictionClass>& honoured() const { return honoured_; }
  const std::vector<EvictionClass>& dropped() const { return dropped_; }
  const std::string& why_dropped() const { return why_dropped_; }
  // The m - 1 holder host slots of `host`, in the order restores try them.
  const std::vector<int>& HoldersOf(int host) const { return holders_[host]; }
  // The hosts whose snapshots `host` holds.
  std::vector<int> SourcesOf(int host) const;
  // The ranks holding `rank`'s backups (same local rank on each holder host), and the reverse.
  std::vector<int> HolderRanks(int rank) const;
  std::vector<int> SourceRanks(int rank) const;

  // The same holders for the same copies and ranks per host. The classes honoured and dropped
  // are how the placement was chosen, not part of it (Encode does not carry them).
  bool operator==(const BackupPlacement& other) const;

 private:
  int copies_ = 1;
  int ranks_per_host_ = 1;
  std::vector<std::vector<int>> holders_;
  std::vector<EvictionClass> honoured_;
  std::vector<EvictionClass> dropped_;
  std::string why_dropped_;
};

// Every eviction unit of `classes` for the spec's topology and racks. TP/CP/DP/PP groups that cover
// the same hosts are one unit; units are numbered per class in order of their lowest rank.
std::vector<EvictionUnit> EvictionUnits(const BackupPlacementSpec& spec,
                                        const std::vector<EvictionClass>& classes);

// The proof that a placement survives every single eviction unit of the honoured classes (the
// spec's classes less the placement's dropped ones, so a decoded placement is checked against all
// of them): one line per unit ("dp group 1 (hosts 0,1): every rank keeps a copy" or what is lost).
// holds is false, with one line saying so, when the placement does not match the topology's hosts.
struct PlacementProof {
  bool holds = true;
  std::vector<std::string> lines;
};
PlacementProof ProvePlacement(const BackupPlacementSpec& spec, const BackupPlacement& placement);

// The probability that `failed_hosts` hosts failing at once, uniformly at random, leave every rank
// at least one copy: exact when the placement is a partition into groups whose members hold each
// other (precisely: every connected part of the host-holder graph has at most 12 hosts, so Place's
// groups always are), else estimated with `samples` seeded Monte Carlo draws (deterministic for a
// seed). 1 for failed_hosts <= 0, 0 for failed_hosts >= hosts.
double SurvivalProbability(const BackupPlacement& placement, int failed_hosts,
                           int samples = 200'000, uint64_t seed = 1);
// The Monte Carlo estimate alone, whatever the placement's shape.
double MonteCarloSurvivalProbability(const BackupPlacement& placement, int failed_hosts,
                                     int samples = 200'000, uint64_t seed = 1);

// What `trainguard run` prints at start-up: the classes honoured and dropped, every host's holders,
// the proof, and the survival probability for k = 1, 2, 4, 8 random host failures (k < hosts) next
// to a ring placement's.
std::string DescribePlacement(const BackupPlacementSpec& spec, const BackupPlacement& placement);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_BACKUP_PLACEMENT_H_
