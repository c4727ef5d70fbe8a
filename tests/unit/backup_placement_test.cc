#include "sdk/checkpoint/backup_placement.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainguard/topology.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr EvictionClass kHost = EvictionClass::kHost;
constexpr EvictionClass kRack = EvictionClass::kRack;
constexpr EvictionClass kData = EvictionClass::kData;
constexpr EvictionClass kPipeline = EvictionClass::kPipeline;

absl::StatusOr<Topology> MakeTopology(int world_size, int tp, int cp, int pp, int ranks_per_host) {
  TopologySpec spec;
  spec.world_size = world_size;
  spec.tp = tp;
  spec.cp = cp;
  spec.pp = pp;
  spec.ranks_per_host = ranks_per_host;
  return Topology::Create(spec);
}

BackupPlacementSpec Spec(const Topology& topology, int copies, std::vector<EvictionClass> classes,
                         std::vector<std::string> racks = {}) {
  return BackupPlacementSpec{.topology = topology,
                             .copies = copies,
                             .classes = std::move(classes),
                             .racks = std::move(racks)};
}

// Racks of four contiguous host slots: "r0" for hosts 0-3, "r1" for 4-7, ...
std::vector<std::string> RacksOfFour(int hosts) {
  std::vector<std::string> racks;
  racks.reserve(hosts);
  for (int host = 0; host < hosts; ++host) {
    racks.push_back(absl::StrCat("r", host / 4));
  }
  return racks;
}

// The host sets an eviction of each unit of `c` removes, computed from the rank formula
// rank = tp + TP*(cp + CP*(dp + DP*pp)) rather than from EvictionUnits.
std::vector<std::set<int>> BruteForceUnits(const BackupPlacementSpec& spec, EvictionClass c) {
  const Topology& t = spec.topology;
  const int r = t.ranks_per_host();
  std::vector<std::set<int>> units;
  if (c == kHost) {
    for (int host = 0; host < t.num_hosts(); ++host) {
      units.push_back({host});
    }
    return units;
  }
  if (c == kRack) {
    for (const std::string& label : std::set<std::string>(spec.racks.begin(), spec.racks.end())) {
      std::set<int> hosts;
      for (int host = 0; host < t.num_hosts(); ++host) {
        if (spec.racks[host] == label) {
          hosts.insert(host);
        }
      }
      units.push_back(hosts);
    }
    return units;
  }
  const int degrees[4] = {t.tp(), t.cp(), t.dp(), t.pp()};
  const int varying = c == EvictionClass::kTensor    ? 0
                      : c == EvictionClass::kContext ? 1
                      : c == kData                   ? 2
                                                     : 3;
  for (int rank = 0; rank < t.world_size(); ++rank) {
    int digits[4];
    int rest = rank;
    for (int d = 0; d < 4; ++d) {
      digits[d] = rest % degrees[d];
      rest /= degrees[d];
    }
    std::set<int> hosts;
    for (int v = 0; v < degrees[varying]; ++v) {
      digits[varying] = v;
      const int member =
          digits[0] + degrees[0] * (digits[1] + degrees[1] * (digits[2] + degrees[2] * digits[3]));
      hosts.insert(member / r);
    }
    units.push_back(hosts);
  }
  return units;
}

// Evicts every unit of every class in `classes` and counts the ranks left without a copy.
int BruteForceLostRanks(const BackupPlacementSpec& spec, const BackupPlacement& placement,
                        const std::vector<EvictionClass>& classes) {
  int lost = 0;
  const int r = spec.topology.ranks_per_host();
  for (EvictionClass c : classes) {
    for (const std::set<int>& evicted : BruteForceUnits(spec, c)) {
      for (int host : evicted) {
        for (int rank = host * r; rank < (host + 1) * r; ++rank) {
          const std::vector<int> holders = placement.HolderRanks(rank);
          lost += std::none_of(holders.begin(), holders.end(),
                               [&](int holder) { return !evicted.contains(holder / r); })
                      ? 1
                      : 0;
        }
      }
    }
  }
  return lost;
}

TEST(BackupPlacementTest, EveryGridUpTo64HostsSurvivesEveryUnitOfEveryHonouredClass) {
  const std::vector<std::vector<EvictionClass>> class_sets = {
      {kHost}, {kHost, kData}, {kHost, kPipeline}, {kHost, kData, kPipeline}, {kHost, kRack}};
  int placements = 0;
  int with_drops = 0;
  for (int tp : {1, 2}) {
    for (int cp : {1, 2}) {
      for (int pp : {1, 2, 4}) {
        for (int dp : {1, 2, 3, 4, 5, 8, 16}) {
          for (int ranks_per_host : {1, 2, 4, 8}) {
            const int world = tp * cp * pp * dp;
            if (world % ranks_per_host != 0 || world / ranks_per_host > 64) {
              continue;
            }
            absl::StatusOr<Topology> topology = MakeTopology(world, tp, cp, pp, ranks_per_host);
            ASSERT_TRUE(topology.ok()) << topology.status();
            const int hosts = topology->num_hosts();
            for (int copies : {2, 3}) {
              if (hosts < copies) {
                continue;
              }
              for (const std::vector<EvictionClass>& classes : class_sets) {
                const BackupPlacementSpec spec =
                    Spec(*topology, copies, classes, RacksOfFour(hosts));
                SCOPED_TRACE(absl::StrCat(topology->ToString(), " m=", copies, " classes=",
                                          classes.size(), ":", static_cast<int>(classes.back())));
                absl::StatusOr<BackupPlacement> placement = BackupPlacement::Place(spec);
                ASSERT_TRUE(placement.ok()) << placement.status();
                ++placements;
                with_drops += placement->dropped().empty() ? 0 : 1;
                ASSERT_EQ(placement->honoured().size() + placement->dropped().size(),
                          classes.size());
                EXPECT_EQ(placement->honoured().front(), kHost);
                for (int host = 0; host < hosts; ++host) {
                  const std::vector<int>& holders = placement->HoldersOf(host);
                  ASSERT_EQ(static_cast<int>(holders.size()), copies - 1) << "host " << host;
                  EXPECT_EQ(std::set<int>(holders.begin(), holders.end()).size(), holders.size());
                  EXPECT_EQ(std::count(holders.begin(), holders.end(), host), 0);
                }
                const PlacementProof proof = ProvePlacement(spec, *placement);
                EXPECT_TRUE(proof.holds) << ::testing::PrintToString(proof.lines);
                EXPECT_EQ(BruteForceLostRanks(spec, *placement, placement->honoured()), 0);
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(placements, 500);
  EXPECT_GT(with_drops, 0);
}

TEST(BackupPlacementTest, GroupSurvivalFor32HostsMatchesTheResearchTableAndBeatsTheRing) {
  absl::StatusOr<Topology> topology = MakeTopology(32, 1, 1, 4, 1);
  ASSERT_TRUE(topology.ok()) << topology.status();
  absl::StatusOr<BackupPlacement> group =
      BackupPlacement::Place(Spec(*topology, 2, {kHost, kData, kPipeline}));
  ASSERT_TRUE(group.ok()) << group.status();
  const BackupPlacement ring = BackupPlacement::Ring(32, 1, 2);

  EXPECT_NEAR(SurvivalProbability(*group, 2), 0.968, 0.001);
  EXPECT_NEAR(SurvivalProbability(*group, 4), 0.810, 0.001);
  EXPECT_NEAR(SurvivalProbability(*group, 8), 0.313, 0.001);
  for (int k : {2, 4, 8}) {
    EXPECT_LT(SurvivalProbability(ring, k), SurvivalProbability(*group, k)) << "k=" << k;
  }
}

TEST(BackupPlacementTest, MonteCarloAgreesWithTheExactSurvivalOfAGroupPlacement) {
  absl::StatusOr<Topology> topology = MakeTopology(48, 1, 1, 4, 1);
  ASSERT_TRUE(topology.ok()) << topology.status();
  for (int copies : {2, 3}) {
    absl::StatusOr<BackupPlacement> group =
        BackupPlacement::Place(Spec(*topology, copies, {kHost, kData, kPipeline}));
    ASSERT_TRUE(group.ok()) << group.status();
    for (int k : {2, 4, 8, 16}) {
      EXPECT_NEAR(MonteCarloSurvivalProbability(*group, k), SurvivalProbability(*group, k), 0.01)
          << "m=" << copies << " k=" << k;
    }
  }
}

TEST(BackupPlacementTest, SurvivalIsCertainWithoutFailuresAndZeroWhenEveryHostFails) {
  const BackupPlacement ring = BackupPlacement::Ring(8, 1, 2);
  EXPECT_EQ(SurvivalProbability(ring, 0), 1.0);
  EXPECT_EQ(SurvivalProbability(ring, 1), 1.0);
  EXPECT_EQ(SurvivalProbability(ring, 8), 0.0);
  const BackupPlacement single = BackupPlacement::Ring(8, 1, 1);
  EXPECT_EQ(SurvivalProbability(single, 1), 0.0);
}

TEST(BackupPlacementTest, DpClassIsDroppedWithAReasonWhenPipelineDegreeIsOne) {
  absl::StatusOr<Topology> topology = MakeTopology(8, 1, 1, 1, 1);
  ASSERT_TRUE(topology.ok()) << topology.status();
  const BackupPlacementSpec spec = Spec(*topology, 2, {kHost, kData});
  absl::StatusOr<BackupPlacement> placement = BackupPlacement::Place(spec);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_THAT(placement->honoured(), ElementsAre(kHost));
  EXPECT_THAT(placement->dropped(), ElementsAre(kData));
  EXPECT_THAT(placement->why_dropped(),
              HasSubstr("dp groups span every host: with pp=1 a dp group is the whole job"));
  EXPECT_TRUE(ProvePlacement(spec, *placement).holds);
  EXPECT_THAT(DescribePlacement(spec, *placement), HasSubstr("eviction classes dropped: dp"));
}

TEST(BackupPlacementTest, LastDeclaredClassIsDroppedFirstEvenWhenAnEarlierOneIsTheObstacle) {
  // pp=1: the dp class is impossible; the rack class, declared after it, goes first.
  absl::StatusOr<Topology> topology = MakeTopology(8, 1, 1, 1, 1);
  ASSERT_TRUE(topology.ok()) << topology.status();
  absl::StatusOr<BackupPlacement> placement =
      BackupPlacement::Place(Spec(*topology, 2, {kHost, kData, kRack}, RacksOfFour(8)));
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_THAT(placement->dropped(), ElementsAre(kRack, kData));
  EXPECT_THAT(placement->honoured(), ElementsAre(kHost));
  EXPECT_THAT(placement->why_dropped(), HasSubstr("dropped rack (the last declared)"));
  EXPECT_THAT(placement->why_dropped(), HasSubstr("dropped dp: dp groups span every host"));
}

TEST(BackupPlacementTest, FewerHostsThanCopiesIsInvalidArgument) {
  absl::StatusOr<Topology> topology = MakeTopology(4, 1, 1, 1, 2);
  ASSERT_TRUE(topology.ok()) << topology.status();
  absl::StatusOr<BackupPlacement> placement = BackupPlacement::Place(Spec(*topology, 3, {kHost}));
  EXPECT_EQ(placement.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(placement.status().message(), HasSubstr("3 copies need 3 distinct hosts"));
}

TEST(BackupPlacementTest, CopiesBelowOneAndWrongRackCountAreInvalidArgument) {
  absl::StatusOr<Topology> topology = MakeTopology(4, 1, 1, 1, 1);
  ASSERT_TRUE(topology.ok()) << topology.status();
  EXPECT_EQ(BackupPlacement::Place(Spec(*topology, 0, {kHost})).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<BackupPlacement> racks =
      BackupPlacement::Place(Spec(*topology, 2, {kHost, kRack}, {"a", "b"}));
  EXPECT_EQ(racks.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(racks.status().message(), HasSubstr("2 rack labels for 4 host slots"));
}

TEST(BackupPlacementTest, OneCopyMeansNoHolders) {
  absl::StatusOr<Topology> topology = MakeTopology(4, 1, 1, 1, 2);
  ASSERT_TRUE(topology.ok()) << topology.status();
  absl::StatusOr<BackupPlacement> placement = BackupPlacement::Place(Spec(*topology, 1, {kHost}));
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_THAT(placement->HoldersOf(0), IsEmpty());
  EXPECT_THAT(placement->HolderRanks(3), IsEmpty());
  EXPECT_EQ(placement->Encode(), "m=1 r=2 h=-,-");
}

// 4 hosts x 2 ranks, pp=2, dp=4: host slots form a 2 (stages) x 2 (hosts per stage) grid; a dp
// group is a row, a pp group a column, so the only valid partner is the diagonal one.
TEST(BackupPlacementTest, TwoByTwoHostGridPairsEachHostWithItsDiagonal) {
  absl::StatusOr<Topology> topology = MakeTopology(8, 1, 1, 2, 2);
  ASSERT_TRUE(topology.ok()) << topology.status();
  const BackupPlacementSpec spec = Spec(*topology, 2, {kHost, kData, kPipeline});
  absl::StatusOr<BackupPlacement> placement = BackupPlacement::Place(spec);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_THAT(placement->dropped(), IsEmpty());
  EXPECT_THAT(placement->HoldersOf(0), ElementsAre(3));
  EXPECT_THAT(placement->HoldersOf(1), ElementsAre(2));
  EXPECT_THAT(placement->HoldersOf(2), ElementsAre(1));
  EXPECT_THAT(placement->HoldersOf(3), ElementsAre(0));
  EXPECT_EQ(placement->Encode(), "m=2 r=2 h=3,2,1,0");

  const std::string description = DescribePlacement(spec, *placement);
  EXPECT_THAT(description, HasSubstr("eviction classes honoured: host,dp,pp\n"));
  EXPECT_THAT(description, HasSubstr("host slot 0 (ranks 0-1) -> backups on 3\n"));
  EXPECT_THAT(description, HasSubstr("dp group 0 (hosts 0-1): every rank keeps a copy\n"));
  EXPECT_THAT(description, HasSubstr("pp group 0 (hosts 0,2): every rank keeps a copy\n"));
  EXPECT_THAT(description, HasSubstr("k=2: 66.7% | 33.3%\n"));
}

TEST(BackupPlacementTest, ProofNamesTheRanksARingPlacementLosesToADpEviction) {
  absl::StatusOr<Topology> topology = MakeTopology(8, 1, 1, 2, 2);
  ASSERT_TRUE(topology.ok()) << topology.status();
  const BackupPlacementSpec spec = Spec(*topology, 2, {kHost, kData});
  const BackupPlacement ring = BackupPlacement::Ring(4, 2, 2);
  const PlacementProof proof = ProvePlacement(spec, ring);
  EXPECT_FALSE(proof.holds);
  // The independent check of the exhaustive test sees the same losses (it is not vacuous).
  EXPECT_GT(BruteForceLostRanks(spec, ring, {kHost, kData}), 0);
  EXPECT_THAT(
      proof.lines,
      testing::Contains("dp group 0 (hosts 0-1): loses ranks 0-1 (host 0 and its holder 1)"));
  EXPECT_THAT(proof.lines, testing::Contains("host slot 0: every rank keeps a copy"));
}

TEST(BackupPlacementTest, ProofFailsForAPlacementOfAnotherShape) {
  absl::StatusOr<Topology> topology = MakeTopology(8, 1, 1, 2, 2);
  ASSERT_TRUE(topology.ok()) << topology.status();
  const PlacementProof proof =
      ProvePlacement(Spec(*topology, 2, {kHost}), BackupPlacement::Ring(8, 1, 2));
  EXPECT_FALSE(proof.holds);
  EXPECT_THAT(proof.lines, ElementsAre(HasSubstr("for 8 hosts x 1 ranks")));
}

TEST(BackupPlacementTest, DescriptionOfManyUnitsSummarisesTheProof) {
  absl::StatusOr<Topology> topology = MakeTopology(64, 1, 1, 4, 1);
  ASSERT_TRUE(topology.ok()) << topology.status();
  const BackupPlacementSpec spec = Spec(*topology, 2, {kHost, kData, kPipeline});
  absl::StatusOr<BackupPlacement> placement = BackupPlacement::Place(spec);
  ASSERT_TRUE(placement.ok()) << placement.status();
  const std::string description = DescribePlacement(spec, *placement);
  EXPECT_THAT(description,
              HasSubstr("proof: 84 eviction units checked, every one leaves every rank a copy\n"));
  EXPECT_THAT(description, HasSubstr("k=8: "));
}

TEST(BackupPlacementTest, HolderRanksKeepTheLocalRankAndSourceRanksInvertThem) {
  absl::StatusOr<Topology> topology = MakeTopology(48, 2, 1, 4, 4);
  ASSERT_TRUE(topology.ok()) << topology.status();
  for (int copies : {2, 3}) {
    absl::StatusOr<BackupPlacement> placement =
        BackupPlacement::Place(Spec(*topology, copies, {kHost, kData, kPipeline}));
    ASSERT_TRUE(placement.ok()) << placement.status();
    for (int rank = 0; rank < 48; ++rank) {
      const std::vector<int> holders = placement->HolderRanks(rank);
      ASSERT_EQ(static_cast<int>(holders.size()), copies - 1);
      for (int holder : holders) {
        EXPECT_EQ(holder % 4, rank % 4) << "rank " << rank << " -> " << holder;
        EXPECT_NE(holder / 4, rank / 4);
        const std::vector<int> sources = placement->SourceRanks(holder);
        EXPECT_EQ(std::count(sources.begin(), sources.end(), rank), 1)
            << "rank " << rank << " -> " << holder;
      }
      for (int source : placement->SourceRanks(rank)) {
        const std::vector<int> back = placement->HolderRanks(source);
        EXPECT_EQ(std::count(back.begin(), back.end(), rank), 1);
      }
    }
  }
}

TEST(BackupPlacementTest, EncodeDecodeRoundTrips) {
  absl::StatusOr<Topology> topology = MakeTopology(14, 1, 1, 1, 2);
  ASSERT_TRUE(topology.ok()) << topology.status();
  for (int copies : {1, 2, 3}) {
    absl::StatusOr<BackupPlacement> placement =
        BackupPlacement::Place(Spec(*topology, copies, {kHost}));
    ASSERT_TRUE(placement.ok()) << placement.status();
    absl::StatusOr<BackupPlacement> decoded = BackupPlacement::Decode(placement->Encode());
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, *placement) << placement->Encode();
  }
  absl::StatusOr<BackupPlacement> three = BackupPlacement::Decode("m=3 r=1 h=1/2,2/0,0/1");
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_THAT(three->HoldersOf(1), ElementsAre(2, 0));
  EXPECT_EQ(three->Encode(), "m=3 r=1 h=1/2,2/0,0/1");
}

TEST(BackupPlacementTest, DecodeNamesTheMalformedToken) {
  struct Case {
    std::string text;
    std::string named;
  };
  for (const Case& c : std::vector<Case>{
           {"", "expected \"m=<copies>"},
           {"m=2 r=2", "expected \"m=<copies>"},
           {"m=x r=2 h=1,0", "\"m=x\""},
           {"m=2 r=0 h=1,0", "\"r=0\""},
           {"m=2 r=2 h=1,x", "holder \"x\""},
           {"m=2 r=2 h=5,0", "holder \"5\""},
           {"m=2 r=2 h=0,0", "host slot 0's holders \"0\""},
           {"m=3 r=1 h=1/2,2/0,0", "host slot 2's holders \"0\""},
           {"m=3 r=1 h=1/1,2/0,0/1", "host slot 0's holders \"1/1\""},
           {"m=2 r=1 h=-,0", "host slot 0's holders \"-\""},
           {"m=3 r=1 h=1,0", "2 host slots cannot hold 3 copies"},
       }) {
    absl::StatusOr<BackupPlacement> decoded = BackupPlacement::Decode(c.text);
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(decoded.status().message(), HasSubstr(c.named)) << c.text;
  }
}

TEST(BackupPlacementTest, PlacementDependsOnlyOnTheSpec) {
  absl::StatusOr<Topology> topology = MakeTopology(40, 1, 1, 4, 2);
  ASSERT_TRUE(topology.ok()) << topology.status();
  const BackupPlacementSpec spec =
      Spec(*topology, 3, {kHost, kData, kPipeline, kRack}, RacksOfFour(20));
  absl::StatusOr<BackupPlacement> first = BackupPlacement::Place(spec);
  absl::StatusOr<BackupPlacement> second = BackupPlacement::Place(spec);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*first, *second);
  EXPECT_EQ(first->honoured(), second->honoured());
  EXPECT_EQ(first->dropped(), second->dropped());
  EXPECT_EQ(first->why_dropped(), second->why_dropped());
}

TEST(BackupPlacementTest, ParseEvictionClassesPutsHostFirstAndRejectsUnknownNames) {
  absl::StatusOr<std::vector<EvictionClass>> classes = ParseEvictionClasses("dp, pp,dp");
  ASSERT_TRUE(classes.ok()) << classes.status();
  EXPECT_THAT(*classes, ElementsAre(kHost, kData, kPipeline));
  absl::StatusOr<std::vector<EvictionClass>> bad = ParseEvictionClasses("host,nodes");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("\"nodes\""));
}

}  // namespace
}  // namespace trainguard
