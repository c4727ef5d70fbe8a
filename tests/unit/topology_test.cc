#include "trainguard/topology.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainguard/options.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr ParallelDim kAllDims[] = {ParallelDim::kTensor, ParallelDim::kContext, ParallelDim::kData,
                                    ParallelDim::kPipeline};

// TopologySpec, but with a default for every member: GCC 12 -Wextra warns when a designated
// initializer omits TopologySpec::host_names, which has no default member initializer.
struct Shape {
  int world_size = 1;
  int tp = 1;
  int cp = 1;
  int pp = 1;
  int ranks_per_host = 0;
  std::vector<std::string> host_names = {};

  operator TopologySpec() const {  // NOLINT(google-explicit-constructor): reads as a spec literal.
    TopologySpec spec;
    spec.world_size = world_size;
    spec.tp = tp;
    spec.cp = cp;
    spec.pp = pp;
    spec.ranks_per_host = ranks_per_host;
    spec.host_names = host_names;
    return spec;
  }
};

Topology MustCreate(const Shape& spec) {
  absl::StatusOr<Topology> topology = Topology::Create(spec);
  EXPECT_TRUE(topology.ok()) << topology.status();
  return *std::move(topology);
}

// Every valid (world_size, tp, cp, pp) with world_size <= max_world_size, on two host layouts.
std::vector<Shape> AllShapesUpTo(int max_world_size) {
  std::vector<Shape> specs;
  for (int world = 1; world <= max_world_size; ++world) {
    for (int tp = 1; tp <= world; ++tp) {
      for (int cp = 1; tp * cp <= world; ++cp) {
        for (int pp = 1; tp * cp * pp <= world; ++pp) {
          if (world % (tp * cp * pp) != 0) {
            continue;
          }
          // One host, and hosts of one TP x CP block each (how jobs are usually laid out).
          for (int ranks_per_host : {0, tp * cp}) {
            specs.push_back({.world_size = world,
                             .tp = tp,
                             .cp = cp,
                             .pp = pp,
                             .ranks_per_host = ranks_per_host});
          }
        }
      }
    }
  }
  return specs;
}

std::string Describe(const Shape& spec) {
  return absl::StrCat("world=", spec.world_size, " tp=", spec.tp, " cp=", spec.cp, " pp=", spec.pp,
                      " ranks_per_host=", spec.ranks_per_host);
}

absl::Status CreateStatus(const Shape& spec) { return Topology::Create(spec).status(); }

// --- Shape and validation.

TEST(TopologyTest, DerivesDataParallelDegreeFromWorldSizeAndModelParallelDegrees) {
  const Topology topology = MustCreate({.world_size = 48, .tp = 2, .cp = 3, .pp = 2});
  EXPECT_EQ(topology.dp(), 4);
  EXPECT_EQ(topology.degree(ParallelDim::kTensor), 2);
  EXPECT_EQ(topology.degree(ParallelDim::kContext), 3);
  EXPECT_EQ(topology.degree(ParallelDim::kData), 4);
  EXPECT_EQ(topology.degree(ParallelDim::kPipeline), 2);
}

TEST(TopologyTest, DefaultSpecIsASingleRankOnASingleHost) {
  const Topology topology = MustCreate({});
  EXPECT_EQ(topology.ToString(), "world=1 tp=1 cp=1 dp=1 pp=1 hosts=1x1");
}

TEST(TopologyTest, ToStringShowsEveryDegreeAndTheHostLayout) {
  const Topology topology = MustCreate({.world_size = 16, .tp = 2, .pp = 2, .ranks_per_host = 8});
  EXPECT_EQ(topology.ToString(), "world=16 tp=2 cp=1 dp=4 pp=2 hosts=2x8");
}

TEST(TopologyTest, RejectsWorldSizeNotDivisibleByModelParallelDegrees) {
  const absl::Status status = CreateStatus({.world_size = 12, .tp = 4, .pp = 2});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("world_size 12 is not divisible by tp*cp*pp = 8 (tp=4, cp=1, pp=2)"));
}

TEST(TopologyTest, RejectsDegreesBelowOne) {
  EXPECT_THAT(std::string(CreateStatus({.world_size = 8, .tp = 0}).message()),
              HasSubstr("tp must be >= 1, got 0"));
  EXPECT_THAT(std::string(CreateStatus({.world_size = 8, .cp = -2}).message()),
              HasSubstr("cp must be >= 1, got -2"));
  EXPECT_THAT(std::string(CreateStatus({.world_size = 8, .pp = 0}).message()),
              HasSubstr("pp must be >= 1, got 0"));
  EXPECT_THAT(std::string(CreateStatus({.world_size = 0}).message()),
              HasSubstr("world_size must be >= 1, got 0"));
  EXPECT_EQ(CreateStatus({.world_size = 8, .tp = 0}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(TopologyTest, RejectsDegreesWhoseProductOverflowsInt) {
  const absl::Status status =
      CreateStatus({.world_size = 1 << 30, .tp = 1 << 16, .cp = 1 << 16, .pp = 1});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("tp*cp*pp = 4294967296"));
}

TEST(TopologyTest, OptionsRefuseExactlyTheShapesTopologyRefusesWithTheSameMessage) {
  for (int world_size = 1; world_size <= 12; ++world_size) {
    for (int tp = -1; tp <= 4; ++tp) {
      for (int cp = 0; cp <= 3; ++cp) {
        for (int pp = 0; pp <= 3; ++pp) {
          SCOPED_TRACE(absl::StrCat("world_size=", world_size, " tp=", tp, " cp=", cp, " pp=", pp));
          Options options;
          options.world_size = world_size;
          options.tp = tp;
          options.cp = cp;
          options.pp = pp;
          const absl::Status from_options = options.Validate();
          const absl::Status from_topology =
              CreateStatus({.world_size = world_size, .tp = tp, .cp = cp, .pp = pp});
          EXPECT_EQ(from_options, from_topology);
        }
      }
    }
  }
}

TEST(TopologyTest, RejectsRanksPerHostThatDoesNotDivideWorldSize) {
  const absl::Status status = CreateStatus({.world_size = 8, .ranks_per_host = 3});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("ranks_per_host 3 does not divide world_size 8"));
}

TEST(TopologyTest, RejectsNegativeRanksPerHost) {
  EXPECT_THAT(std::string(CreateStatus({.world_size = 8, .ranks_per_host = -1}).message()),
              HasSubstr("ranks_per_host must be >= 0 (0 means one host), got -1"));
}

TEST(TopologyTest, RejectsHostNamesOfTheWrongCount) {
  const absl::Status status =
      CreateStatus({.world_size = 8, .ranks_per_host = 4, .host_names = {"a", "b", "c"}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("host_names has 3 names but the topology has 2 hosts"));
}

TEST(TopologyTest, RejectsDuplicateHostNamesBecauseHostsAreFailureDomains) {
  EXPECT_THAT(std::string(CreateStatus(
                              {.world_size = 6, .ranks_per_host = 2, .host_names = {"a", "b", "a"}})
                              .message()),
              HasSubstr("host_names[0] and host_names[2] are both \"a\""));
}

TEST(TopologyTest, RejectsEmptyHostName) {
  EXPECT_THAT(
      std::string(
          CreateStatus({.world_size = 4, .ranks_per_host = 2, .host_names = {"a", ""}}).message()),
      HasSubstr("host_names[1] is empty"));
}

// --- Rank order.

TEST(TopologyTest, EveryRankRoundTripsThroughItsCoordinatesForEveryShape) {
  for (const Shape& spec : AllShapesUpTo(64)) {
    SCOPED_TRACE(Describe(spec));
    const Topology topology = MustCreate(spec);
    for (int rank = 0; rank < topology.world_size(); ++rank) {
      absl::StatusOr<RankCoordinates> coordinates = topology.CoordinatesOf(rank);
      ASSERT_TRUE(coordinates.ok()) << coordinates.status();
      for (ParallelDim dim : kAllDims) {
        EXPECT_GE(coordinates->Get(dim), 0);
        EXPECT_LT(coordinates->Get(dim), topology.degree(dim));
      }
      absl::StatusOr<int> back = topology.RankAt(*coordinates);
      ASSERT_TRUE(back.ok()) << back.status();
      ASSERT_EQ(*back, rank);
    }
  }
}

TEST(TopologyTest, TensorCoordinateVariesFastestAndPipelineSlowest) {
  const Topology topology = MustCreate({.world_size = 24, .tp = 2, .cp = 3, .pp = 2});
  // rank = tp + 2 * (cp + 3 * (dp + 2 * pp))
  EXPECT_EQ(*topology.CoordinatesOf(0), (RankCoordinates{.tp = 0, .cp = 0, .dp = 0, .pp = 0}));
  EXPECT_EQ(*topology.CoordinatesOf(1), (RankCoordinates{.tp = 1, .cp = 0, .dp = 0, .pp = 0}));
  EXPECT_EQ(*topology.CoordinatesOf(2), (RankCoordinates{.tp = 0, .cp = 1, .dp = 0, .pp = 0}));
  EXPECT_EQ(*topology.CoordinatesOf(6), (RankCoordinates{.tp = 0, .cp = 0, .dp = 1, .pp = 0}));
  EXPECT_EQ(*topology.CoordinatesOf(12), (RankCoordinates{.tp = 0, .cp = 0, .dp = 0, .pp = 1}));
  EXPECT_EQ(*topology.CoordinatesOf(23), (RankCoordinates{.tp = 1, .cp = 2, .dp = 1, .pp = 1}));
}

TEST(TopologyTest, CoordinatesOfRejectsRanksOutsideTheWorld) {
  const Topology topology = MustCreate({.world_size = 16, .tp = 2});
  for (int rank : {-1, 16}) {
    const absl::Status status = topology.CoordinatesOf(rank).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(absl::StrCat("rank ", rank, " is out of range [0, 16)")));
  }
}

TEST(TopologyTest, RankAtNamesTheCoordinateOutsideItsDegree) {
  const Topology topology = MustCreate({.world_size = 16, .tp = 2, .pp = 2});
  const absl::Status status = topology.RankAt({.tp = 1, .dp = 0, .pp = 2}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(status.message()), HasSubstr("coordinate pp=2 is out of range [0, 2)"));
  EXPECT_THAT(std::string(topology.RankAt({.tp = -1}).status().message()),
              HasSubstr("coordinate tp=-1 is out of range [0, 2)"));
  EXPECT_THAT(std::string(topology.RankAt({.dp = 4}).status().message()),
              HasSubstr("coordinate dp=4 is out of range [0, 4)"));
}

// --- Groups.

TEST(TopologyTest, EveryGroupHasDegreeMembersThatDifferFromTheRankOnlyInThatDimension) {
  for (const Shape& spec : AllShapesUpTo(64)) {
    SCOPED_TRACE(Describe(spec));
    const Topology topology = MustCreate(spec);
    for (int rank = 0; rank < topology.world_size(); ++rank) {
      const RankCoordinates mine = *topology.CoordinatesOf(rank);
      for (ParallelDim dim : kAllDims) {
        absl::StatusOr<std::vector<int>> group = topology.GroupOf(rank, dim);
        ASSERT_TRUE(group.ok()) << group.status();
        ASSERT_EQ(static_cast<int>(group->size()), topology.degree(dim));
        EXPECT_EQ((*group)[mine.Get(dim)], rank);
        for (int i = 0; i < topology.degree(dim); ++i) {
          const RankCoordinates theirs = *topology.CoordinatesOf((*group)[i]);
          EXPECT_EQ(theirs.Get(dim), i);
          for (ParallelDim other : kAllDims) {
            if (other != dim) {
              EXPECT_EQ(theirs.Get(other), mine.Get(other));
            }
          }
        }
      }
    }
  }
}

TEST(TopologyTest, GroupsOfOneKindPartitionTheWorldAndAgreeWithGroupIndexOf) {
  for (const Shape& spec : AllShapesUpTo(64)) {
    SCOPED_TRACE(Describe(spec));
    const Topology topology = MustCreate(spec);
    for (ParallelDim dim : kAllDims) {
      const int num_groups = topology.world_size() / topology.degree(dim);
      // The group each index names, as seen from its first member found.
      std::vector<std::vector<int>> group_at_index(num_groups);
      for (int rank = 0; rank < topology.world_size(); ++rank) {
        const std::vector<int> group = *topology.GroupOf(rank, dim);
        absl::StatusOr<int> index = topology.GroupIndexOf(rank, dim);
        ASSERT_TRUE(index.ok()) << index.status();
        ASSERT_GE(*index, 0);
        ASSERT_LT(*index, num_groups);
        if (group_at_index[*index].empty()) {
          group_at_index[*index] = group;
        }
        // Two ranks with one index are in one group, so the groups are disjoint.
        EXPECT_EQ(group_at_index[*index], group) << "rank " << rank;
      }
      std::multiset<int> covered;
      for (const std::vector<int>& group : group_at_index) {
        covered.insert(group.begin(), group.end());
      }
      ASSERT_EQ(static_cast<int>(covered.size()), topology.world_size());
      for (int rank = 0; rank < topology.world_size(); ++rank) {
        EXPECT_EQ(covered.count(rank), 1u) << "rank " << rank;
      }
    }
  }
}

TEST(TopologyTest, MegatronExampleWorld16Tp2Pp2) {
  const Topology topology = MustCreate({.world_size = 16, .tp = 2, .pp = 2, .ranks_per_host = 8});
  EXPECT_EQ(topology.dp(), 4);
  EXPECT_THAT(*topology.GroupOf(0, ParallelDim::kTensor), ElementsAre(0, 1));
  EXPECT_THAT(*topology.GroupOf(3, ParallelDim::kTensor), ElementsAre(2, 3));
  EXPECT_THAT(*topology.GroupOf(14, ParallelDim::kTensor), ElementsAre(14, 15));
  EXPECT_THAT(*topology.GroupOf(0, ParallelDim::kData), ElementsAre(0, 2, 4, 6));
  EXPECT_THAT(*topology.GroupOf(9, ParallelDim::kData), ElementsAre(9, 11, 13, 15));
  EXPECT_THAT(*topology.GroupOf(0, ParallelDim::kPipeline), ElementsAre(0, 8));
  EXPECT_THAT(*topology.GroupOf(13, ParallelDim::kPipeline), ElementsAre(5, 13));
  EXPECT_THAT(*topology.GroupOf(5, ParallelDim::kContext), ElementsAre(5));
  EXPECT_THAT(*topology.ModelParallelGroupOf(0), ElementsAre(0, 1, 8, 9));
  EXPECT_THAT(*topology.ModelParallelGroupOf(7), ElementsAre(6, 7, 14, 15));
  EXPECT_EQ(*topology.GroupIndexOf(5, ParallelDim::kTensor), 2);
  EXPECT_EQ(*topology.GroupIndexOf(13, ParallelDim::kPipeline), 5);
  EXPECT_EQ(*topology.GroupIndexOf(0, ParallelDim::kData), 0);
  EXPECT_EQ(*topology.GroupIndexOf(1, ParallelDim::kData), 1);
  EXPECT_EQ(*topology.GroupIndexOf(8, ParallelDim::kData), 2);
  EXPECT_EQ(*topology.HostOf(7), 0);
  EXPECT_EQ(*topology.HostOf(8), 1);
}

TEST(TopologyTest, ModelParallelGroupIsOneReplicaSharingTheDataParallelCoordinate) {
  for (const Shape& spec : AllShapesUpTo(32)) {
    SCOPED_TRACE(Describe(spec));
    const Topology topology = MustCreate(spec);
    for (int rank = 0; rank < topology.world_size(); ++rank) {
      const std::vector<int> group = *topology.ModelParallelGroupOf(rank);
      ASSERT_EQ(static_cast<int>(group.size()), topology.tp() * topology.cp() * topology.pp());
      EXPECT_TRUE(std::is_sorted(group.begin(), group.end()));
      EXPECT_NE(std::find(group.begin(), group.end(), rank), group.end());
      for (int member : group) {
        EXPECT_EQ(topology.CoordinatesOf(member)->dp, topology.CoordinatesOf(rank)->dp);
      }
    }
  }
}

TEST(TopologyTest, GroupQueriesRejectRanksOutsideTheWorld) {
  const Topology topology = MustCreate({.world_size = 8, .tp = 2});
  EXPECT_EQ(topology.GroupOf(8, ParallelDim::kData).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(topology.GroupIndexOf(-1, ParallelDim::kTensor).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(topology.ModelParallelGroupOf(9).status().message()),
              HasSubstr("rank 9 is out of range [0, 8)"));
}

// --- Hosts.

TEST(TopologyTest, ZeroRanksPerHostPutsEveryRankOnOneHost) {
  const Topology topology = MustCreate({.world_size = 8, .tp = 2});
  EXPECT_EQ(topology.num_hosts(), 1);
  EXPECT_EQ(topology.ranks_per_host(), 8);
  EXPECT_EQ(*topology.HostOf(7), 0);
  EXPECT_THAT(*topology.RanksOnHost(0), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
}

TEST(TopologyTest, HostsHoldBlocksOfConsecutiveRanks) {
  const Topology topology = MustCreate({.world_size = 12, .ranks_per_host = 4});
  EXPECT_EQ(topology.num_hosts(), 3);
  for (int rank = 0; rank < 12; ++rank) {
    EXPECT_EQ(*topology.HostOf(rank), rank / 4) << "rank " << rank;
  }
  EXPECT_THAT(*topology.RanksOnHost(0), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(*topology.RanksOnHost(2), ElementsAre(8, 9, 10, 11));
}

TEST(TopologyTest, HostNamesDefaultToHostIndex) {
  const Topology topology = MustCreate({.world_size = 4, .ranks_per_host = 2});
  EXPECT_EQ(*topology.HostName(0), "host0");
  EXPECT_EQ(*topology.HostName(1), "host1");
}

TEST(TopologyTest, HostNamesComeFromTheSpecInHostOrder) {
  const Topology topology = MustCreate(
      {.world_size = 4, .ranks_per_host = 2, .host_names = {"node-a.cluster", "node-b.cluster"}});
  EXPECT_EQ(*topology.HostName(0), "node-a.cluster");
  EXPECT_EQ(*topology.HostName(1), "node-b.cluster");
}

TEST(TopologyTest, HostQueriesRejectHostsAndRanksOutOfRange) {
  const Topology topology = MustCreate({.world_size = 4, .ranks_per_host = 2});
  for (int host : {-1, 2}) {
    const std::string expected = absl::StrCat("host ", host, " is out of range [0, 2)");
    EXPECT_EQ(topology.HostName(host).status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_THAT(std::string(topology.HostName(host).status().message()), HasSubstr(expected));
    EXPECT_THAT(std::string(topology.RanksOnHost(host).status().message()), HasSubstr(expected));
  }
  EXPECT_THAT(std::string(topology.HostOf(4).status().message()),
              HasSubstr("rank 4 is out of range [0, 4)"));
}

// --- Names.

TEST(TopologyTest, ParallelDimNamesAreMegatronAbbreviations) {
  EXPECT_EQ(ParallelDimName(ParallelDim::kTensor), "tp");
  EXPECT_EQ(ParallelDimName(ParallelDim::kContext), "cp");
  EXPECT_EQ(ParallelDimName(ParallelDim::kData), "dp");
  EXPECT_EQ(ParallelDimName(ParallelDim::kPipeline), "pp");
}

}  // namespace
}  // namespace trainguard
