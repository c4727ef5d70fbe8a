// Topology: how the ranks of a job are arranged in parallel dimensions and on hosts.
//
// A job of `world_size` ranks is split into tensor (TP), context (CP), data (DP) and pipeline (PP)
// parallel groups. The rank order is Megatron-LM's default "tp-cp-ep-dp-pp" (without expert
// parallelism): the tensor coordinate varies fastest, the pipeline coordinate slowest:
//
//     rank = tp + TP * (cp + CP * (dp + DP * pp)),     DP = world_size / (TP * CP * PP)
//
// so a TP group is a block of TP consecutive ranks (usually on one host) and consecutive pipeline
// stages are world_size / PP ranks apart. Expert parallelism is not modelled yet.
//
// Ranks are placed on hosts in blocks of `ranks_per_host` consecutive ranks (host = rank /
// ranks_per_host), which is how torchrun, Slurm and Kubernetes jobs number them. A host is the
// failure domain that placement of checkpoint backups avoids.
//
// Thread safety: a Topology is immutable after Create(); all methods are const and thread-safe.
#ifndef TRAINGUARD_TOPOLOGY_H_
#define TRAINGUARD_TOPOLOGY_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace trainguard {

enum class ParallelDim { kTensor, kContext, kData, kPipeline };

// "tp", "cp", "dp", "pp".
std::string_view ParallelDimName(ParallelDim dim);

// The position of one rank in the parallel grid.
struct RankCoordinates {
  int tp = 0;
  int cp = 0;
  int dp = 0;
  int pp = 0;

  int Get(ParallelDim dim) const;
  bool operator==(const RankCoordinates&) const = default;
};

struct TopologySpec {
  int world_size = 1;
  int tp = 1;  // tensor-parallel degree
  int cp = 1;  // context-parallel degree
  int pp = 1;  // pipeline-parallel degree
  // 0 means every rank on one host. Must divide world_size.
  int ranks_per_host = 0;
  // Optional: one name per host (world_size / ranks_per_host of them). Defaults to "host0",
  // "host1", ...
  std::vector<std::string> host_names = {};
};

class Topology {
 public:
  // Fails with InvalidArgument naming the mismatch, e.g. "world_size 12 is not divisible by
  // tp*cp*pp = 8 (tp=4, cp=1, pp=2)".
  static absl::StatusOr<Topology> Create(const TopologySpec& spec);

  int world_size() const { return world_size_; }
  int tp() const { return tp_; }
  int cp() const { return cp_; }
  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int degree(ParallelDim dim) const;
  int ranks_per_host() const { return ranks_per_host_; }
  int num_hosts() const { return static_cast<int>(host_names_.size()); }

  // OutOfRange when rank is not in [0, world_size).
  absl::StatusOr<RankCoordinates> CoordinatesOf(int rank) const;
  // OutOfRange naming the coordinate that is outside its degree.
  absl::StatusOr<int> RankAt(const RankCoordinates& coordinates) const;

  // The ranks that share every coordinate with `rank` except `dim`, ordered by their `dim`
  // coordinate (so element i is the rank with coordinate i). E.g. GroupOf(r, kData) is r's
  // data-parallel group.
  absl::StatusOr<std::vector<int>> GroupOf(int rank, ParallelDim dim) const;
  // Which group of kind `dim` the rank is in: an index in [0, world_size / degree(dim)).
  absl::StatusOr<int> GroupIndexOf(int rank, ParallelDim dim) const;
  // The ranks that share `rank`'s data-parallel coordinate: one full replica of the model (TP x CP
  // x PP).
  absl::StatusOr<std::vector<int>> ModelParallelGroupOf(int rank) const;

  absl::StatusOr<int> HostOf(int rank) const;
  // OutOfRange when host is not in [0, num_hosts).
  absl::StatusOr<std::string> HostName(int host) const;
  absl::StatusOr<std::vector<int>> RanksOnHost(int host) const;

  // E.g. "world=16 tp=2 cp=1 dp=4 pp=2 hosts=2x8".
  std::string ToString() const;

 private:
  Topology() = default;

  int world_size_ = 1;
  int tp_ = 1;
  int cp_ = 1;
  int dp_ = 1;
  int pp_ = 1;
  int ranks_per_host_ = 1;
  std::vector<std::string> host_names_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_TOPOLOGY_H_
