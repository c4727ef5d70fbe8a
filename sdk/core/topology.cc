#include "trainguard/topology.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sdk/core/parallel_shape.h"

namespace trainguard {
namespace {

// Fastest-varying first: the order of the digits of a rank.
constexpr ParallelDim kAllDims[] = {ParallelDim::kTensor, ParallelDim::kContext, ParallelDim::kData,
                                    ParallelDim::kPipeline};

absl::Status CheckHosts(const TopologySpec& spec) {
  if (spec.ranks_per_host < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks_per_host must be >= 0 (0 means one host), got ", spec.ranks_per_host));
  }
  const int ranks_per_host = spec.ranks_per_host == 0 ? spec.world_size : spec.ranks_per_host;
  if (spec.world_size % ranks_per_host != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ranks_per_host ", ranks_per_host, " does not divide world_size ", spec.world_size));
  }
  const int num_hosts = spec.world_size / ranks_per_host;
  if (spec.host_names.empty()) {
    return absl::OkStatus();
  }
  if (static_cast<int>(spec.host_names.size()) != num_hosts) {
    return absl::InvalidArgumentError(absl::StrCat("host_names has ", spec.host_names.size(),
                                                   " names but the topology has ", num_hosts,
                                                   " hosts"));
  }
  // Hosts are failure domains: two hosts sharing a name would look like one to backup placement.
  absl::flat_hash_map<absl::string_view, int> first_host_named;
  for (int host = 0; host < num_hosts; ++host) {
    const std::string& name = spec.host_names[host];
    if (name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("host_names[", host, "] is empty"));
    }
    const auto [it, inserted] = first_host_named.emplace(name, host);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("host_names[", it->second, "] and host_names[",
                                                     host, "] are both \"", name, "\""));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckInRange(absl::string_view what, int value, int limit) {
  if (value < 0 || value >= limit) {
    return absl::OutOfRangeError(
        absl::StrCat(what, " ", value, " is out of range [0, ", limit, ")"));
  }
  return absl::OkStatus();
}

// A rank is a mixed-radix number with digits (tp, cp, dp, pp), tp least significant; the stride of
// a dimension is the product of the degrees of the faster-varying ones.
int StrideOf(const Topology& topology, ParallelDim dim) {
  int stride = 1;
  for (ParallelDim faster : kAllDims) {
    if (faster == dim) {
      break;
    }
    stride *= topology.degree(faster);
  }
  return stride;
}

// Debian's Abseil has its own string_view, which absl::StrCat needs.
absl::string_view DimName(ParallelDim dim) {
  const std::string_view name = ParallelDimName(dim);
  return absl::string_view(name.data(), name.size());
}

}  // namespace

std::string_view ParallelDimName(ParallelDim dim) {
  switch (dim) {
    case ParallelDim::kTensor:
      return "tp";
    case ParallelDim::kContext:
      return "cp";
    case ParallelDim::kData:
      return "dp";
    case ParallelDim::kPipeline:
      return "pp";
  }
  return "unknown";
}

int RankCoordinates::Get(ParallelDim dim) const {
  switch (dim) {
    case ParallelDim::kTensor:
      return tp;
    case ParallelDim::kContext:
      return cp;
    case ParallelDim::kData:
      return dp;
    case ParallelDim::kPipeline:
      return pp;
  }
  return 0;
}

absl::Status CheckParallelShape(int world_size, int tp, int cp, int pp) {
  for (const auto& [name, value] : {std::pair<absl::string_view, int>{"world_size", world_size},
                                    {"tp", tp},
                                    {"cp", cp},
                                    {"pp", pp}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be >= 1, got ", value));
    }
  }
  // In 64 bits: three int degrees can overflow int, and an overflowed product could divide
  // world_size.
  const int64_t model_parallel = int64_t{tp} * cp * pp;
  if (world_size % model_parallel != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size ", world_size, " is not divisible by tp*cp*pp = ", model_parallel,
                     " (tp=", tp, ", cp=", cp, ", pp=", pp, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Topology> Topology::Create(const TopologySpec& spec) {
  if (absl::Status status = CheckParallelShape(spec.world_size, spec.tp, spec.cp, spec.pp);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckHosts(spec); !status.ok()) {
    return status;
  }
  Topology topology;
  topology.world_size_ = spec.world_size;
  topology.tp_ = spec.tp;
  topology.cp_ = spec.cp;
  topology.pp_ = spec.pp;
  topology.dp_ = spec.world_size / (spec.tp * spec.cp * spec.pp);
  topology.ranks_per_host_ = spec.ranks_per_host == 0 ? spec.world_size : spec.ranks_per_host;
  topology.host_names_ = spec.host_names;
  if (topology.host_names_.empty()) {
    for (int host = 0; host < spec.world_size / topology.ranks_per_host_; ++host) {
      topology.host_names_.push_back(absl::StrCat("host", host));
    }
  }
  return topology;
}

int Topology::degree(ParallelDim dim) const {
  switch (dim) {
    case ParallelDim::kTensor:
      return tp_;
    case ParallelDim::kContext:
      return cp_;
    case ParallelDim::kData:
      return dp_;
    case ParallelDim::kPipeline:
      return pp_;
  }
  return 1;
}

absl::StatusOr<RankCoordinates> Topology::CoordinatesOf(int rank) const {
  if (absl::Status status = CheckInRange("rank", rank, world_size_); !status.ok()) {
    return status;
  }
  RankCoordinates coordinates;
  coordinates.tp = rank % tp_;
  coordinates.cp = rank / tp_ % cp_;
  coordinates.dp = rank / (tp_ * cp_) % dp_;
  coordinates.pp = rank / (tp_ * cp_ * dp_);
  return coordinates;
}

absl::StatusOr<int> Topology::RankAt(const RankCoordinates& coordinates) const {
  for (ParallelDim dim : kAllDims) {
    const int value = coordinates.Get(dim);
    if (value < 0 || value >= degree(dim)) {
      return absl::OutOfRangeError(absl::StrCat("coordinate ", DimName(dim), "=", value,
                                                " is out of range [0, ", degree(dim), ")"));
    }
  }
  return coordinates.tp + tp_ * (coordinates.cp + cp_ * (coordinates.dp + dp_ * coordinates.pp));
}

absl::StatusOr<std::vector<int>> Topology::GroupOf(int rank, ParallelDim dim) const {
  absl::StatusOr<RankCoordinates> coordinates = CoordinatesOf(rank);
  if (!coordinates.ok()) {
    return coordinates.status();
  }
  const int stride = StrideOf(*this, dim);
  const int first = rank - coordinates->Get(dim) * stride;
  std::vector<int> group(degree(dim));
  for (int i = 0; i < degree(dim); ++i) {
    group[i] = first + i * stride;
  }
  return group;
}

absl::StatusOr<int> Topology::GroupIndexOf(int rank, ParallelDim dim) const {
  if (absl::Status status = CheckInRange("rank", rank, world_size_); !status.ok()) {
    return status;
  }
  // The rank with its `dim` digit deleted: the digits below it, then the digits above it.
  const int stride = StrideOf(*this, dim);
  return rank % stride + stride * (rank / (stride * degree(dim)));
}

absl::StatusOr<std::vector<int>> Topology::ModelParallelGroupOf(int rank) const {
  absl::StatusOr<RankCoordinates> coordinates = CoordinatesOf(rank);
  if (!coordinates.ok()) {
    return coordinates.status();
  }
  std::vector<int> group;
  group.reserve(static_cast<size_t>(tp_) * cp_ * pp_);
  for (int pp = 0; pp < pp_; ++pp) {
    for (int cp = 0; cp < cp_; ++cp) {
      for (int tp = 0; tp < tp_; ++tp) {
        group.push_back(tp + tp_ * (cp + cp_ * (coordinates->dp + dp_ * pp)));
      }
    }
  }
  return group;
}

absl::StatusOr<int> Topology::HostOf(int rank) const {
  if (absl::Status status = CheckInRange("rank", rank, world_size_); !status.ok()) {
    return status;
  }
  return rank / ranks_per_host_;
}

absl::StatusOr<std::string> Topology::HostName(int host) const {
  if (absl::Status status = CheckInRange("host", host, num_hosts()); !status.ok()) {
    return status;
  }
  return host_names_[host];
}

absl::StatusOr<std::vector<int>> Topology::RanksOnHost(int host) const {
  if (absl::Status status = CheckInRange("host", host, num_hosts()); !status.ok()) {
    return status;
  }
  std::vector<int> ranks(ranks_per_host_);
  for (int i = 0; i < ranks_per_host_; ++i) {
    ranks[i] = host * ranks_per_host_ + i;
  }
  return ranks;
}

std::string Topology::ToString() const {
  return absl::StrCat("world=", world_size_, " tp=", tp_, " cp=", cp_, " dp=", dp_, " pp=", pp_,
                      " hosts=", num_hosts(), "x", ranks_per_host_);
}

}  // namespace trainguard
