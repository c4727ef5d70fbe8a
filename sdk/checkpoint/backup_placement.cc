// BackupPlacement: eviction units, the group search, the proof and the survival probabilities.
#include "sdk/checkpoint/backup_placement.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace trainguard {
namespace {

// Search work (steps x hosts) before a class combination is declared infeasible: 200,000 steps for
// 64 hosts, fewer for larger grids, whose steps cost more. Feasible grids of thousands of hosts
// are found in far fewer; the budget bounds the time spent on an infeasible one (well under a
// second).
constexpr int64_t kSearchWork = int64_t{200'000} * 64;
constexpr int64_t kMinSearchSteps = 2'000;
// Components of the holder graph up to this many hosts are enumerated exactly (2^n subsets).
constexpr int kMaxExactComponent = 12;
// Above this many units the proof lists only the failures.
constexpr size_t kMaxProofLines = 32;

constexpr EvictionClass kAllClasses[] = {EvictionClass::kHost,   EvictionClass::kRack,
                                         EvictionClass::kTensor, EvictionClass::kContext,
                                         EvictionClass::kData,   EvictionClass::kPipeline};

// Debian's Abseil has its own string_view, which absl::StrCat needs.
absl::string_view ClassName(EvictionClass c) {
  const std::string_view name = EvictionClassName(c);
  return absl::string_view(name.data(), name.size());
}

std::string ClassList(const std::vector<EvictionClass>& classes) {
  return absl::StrJoin(
      classes, ",", [](std::string* out, EvictionClass c) { absl::StrAppend(out, ClassName(c)); });
}

std::optional<ParallelDim> DimOf(EvictionClass c) {
  switch (c) {
    case EvictionClass::kTensor:
      return ParallelDim::kTensor;
    case EvictionClass::kContext:
      return ParallelDim::kContext;
    case EvictionClass::kData:
      return ParallelDim::kData;
    case EvictionClass::kPipeline:
      return ParallelDim::kPipeline;
    case EvictionClass::kHost:
    case EvictionClass::kRack:
      return std::nullopt;
  }
  return std::nullopt;
}

// "0-3,5,7-8" for a sorted list.
std::string Ranges(const std::vector<int>& sorted) {
  std::string out;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) {
      ++j;
    }
    absl::StrAppend(&out, out.empty() ? "" : ",", sorted[i]);
    if (j > i) {
      absl::StrAppend(&out, "-", sorted[j]);
    }
    i = j + 1;
  }
  return out;
}

std::vector<int> RanksOf(int host, int ranks_per_host) {
  std::vector<int> ranks(ranks_per_host);
  std::iota(ranks.begin(), ranks.end(), host * ranks_per_host);
  return ranks;
}

// "rank 3" or "ranks 2-3".
std::string RankPhrase(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", Ranges(ranks));
}

// The honoured classes a spec asks for: the host class first when absent, duplicates removed.
std::vector<EvictionClass> Declared(const std::vector<EvictionClass>& classes) {
  std::vector<EvictionClass> out;
  if (std::find(classes.begin(), classes.end(), EvictionClass::kHost) == classes.end()) {
    out.push_back(EvictionClass::kHost);
  }
  for (EvictionClass c : classes) {
    if (std::find(out.begin(), out.end(), c) == out.end()) {
      out.push_back(c);
    }
  }
  return out;
}

// Group sizes for `hosts` hosts and `m` copies: m each, the leftover hosts added to the last
// groups.
std::vector<int> GroupSizes(int hosts, int m) {
  const int groups = hosts / m;
  std::vector<int> sizes(groups, m);
  for (int i = 0; i < hosts % m; ++i) {
    ++sizes[groups - 1 - i % groups];
  }
  return sizes;
}

// Symmetric conflict relation as bit rows; a host conflicts with itself.
class ConflictGraph {
 public:
  explicit ConflictGraph(int hosts)
      : hosts_(hosts), words_((hosts + 63) / 64), bits_(size_t{1} * hosts * words_, 0) {
    for (int h = 0; h < hosts; ++h) {
      Set(h, h);
    }
  }
  void AddClique(const std::vector<int>& members) {
    for (int a : members) {
      for (int b : members) {
        Set(a, b);
      }
    }
  }
  bool Conflict(int a, int b) const { return (Row(a)[b / 64] >> (b % 64)) & 1; }
  const uint64_t* Row(int h) const { return &bits_[size_t{1} * h * words_]; }
  int words() const { return words_; }
  int hosts() const { return hosts_; }

 private:
  void Set(int a, int b) { bits_[size_t{1} * a * words_ + b / 64] |= uint64_t{1} << (b % 64); }

  int hosts_;
  int words_;
  std::vector<uint64_t> bits_;
};

// Deterministic backtracking over partitions of the hosts into pairwise non-conflicting groups of
// the given sizes. Each group starts with the unassigned host that has the fewest compatible
// partners left (most constrained first); its other members are tried lowest index first. A unit
// of size s needs s distinct groups, which prunes hopeless branches early.
class GroupSearch {
 public:
  GroupSearch(const ConflictGraph& graph, std::vector<std::vector<int>> units,
              const std::vector<int>& sizes)
      : graph_(graph),
        units_(std::move(units)),
        units_of_host_(graph.hosts()),
        free_in_unit_(units_.size()),
        in_open_(units_.size(), 0),
        unassigned_(graph.words(), 0),
        unstarted_(static_cast<int>(sizes.size())),
        budget_(std::max(kMinSearchSteps, kSearchWork / std::max(graph.hosts(), 1))) {
    for (int size : sizes) {
      ++size_count_[size];
    }
    for (size_t u = 0; u < units_.size(); ++u) {
      free_in_unit_[u] = static_cast<int>(units_[u].size());
      for (int h : units_[u]) {
        units_of_host_[h].push_back(static_cast<int>(u));
      }
    }
    for (int h = 0; h < graph.hosts(); ++h) {
      unassigned_[h / 64] |= uint64_t{1} << (h % 64);
    }
  }

  // The groups, or nullopt when none exists or the budget ran out (exhausted() says which).
  std::optional<std::vector<std::vector<int>>> Run() {
    if (!StartGroup()) {
      return std::nullopt;
    }
    return groups_;
  }
  bool exhausted() const { return steps_ > budget_; }
  int64_t steps() const { return std::min(steps_, budget_); }

 private:
  bool Step() { return ++steps_ <= budget_; }

  bool Unassigned(int h) const { return (unassigned_[h / 64] >> (h % 64)) & 1; }

  void Assign(int h) {
    unassigned_[h / 64] &= ~(uint64_t{1} << (h % 64));
    for (int u : units_of_host_[h]) {
      --free_in_unit_[u];
      ++in_open_[u];
    }
    --open_space_;
  }
  void Unassign(int h) {
    unassigned_[h / 64] |= uint64_t{1} << (h % 64);
    for (int u : units_of_host_[h]) {
      ++free_in_unit_[u];
      --in_open_[u];
    }
    ++open_space_;
  }

  // Every unit's unassigned hosts can still go to distinct groups.
  bool UnitsFit() const {
    for (size_t u = 0; u < units_.size(); ++u) {
      const int open = open_space_ > 0 && in_open_[u] == 0 ? 1 : 0;
      if (free_in_unit_[u] > unstarted_ + open) {
        return false;
      }
    }
    return true;
  }

  // Unassigned hosts compatible with every member of `group`, at index >= from.
  std::vector<int> Candidates(const std::vector<int>& group, int from) const {
    std::vector<int> out;
    for (int w = from / 64; w < graph_.words(); ++w) {
      uint64_t bits = unassigned_[w];
      for (int member : group) {
        bits &= ~graph_.Row(member)[w];
      }
      while (bits != 0) {
        const int h = w * 64 + std::countr_zero(bits);
        bits &= bits - 1;
        if (h >= from) {
          out.push_back(h);
        }
      }
    }
    return out;
  }

  int CompatibleCount(int h) const {
    int count = 0;
    for (int w = 0; w < graph_.words(); ++w) {
      count += std::popcount(unassigned_[w] & ~graph_.Row(h)[w]);
    }
    return count;
  }

  bool StartGroup() {
    if (unstarted_ == 0) {
      return true;
    }
    if (!Step()) {
      return false;
    }
    int first = -1;
    int fewest = graph_.hosts() + 1;
    for (int h = 0; h < graph_.hosts(); ++h) {
      if (Unassigned(h)) {
        const int count = CompatibleCount(h);
        if (count < fewest) {
          fewest = count;
          first = h;
        }
      }
    }
    if (first < 0) {  // groups left but no host: the sizes do not add up to the hosts
      return false;
    }
    for (auto& [size, count] : size_count_) {
      if (count == 0 || fewest < size - 1) {
        continue;
      }
      --count;
      --unstarted_;
      open_space_ = size;
      Assign(first);
      std::vector<int> group = {first};
      if (UnitsFit() && Extend(group, size, 0)) {
        return true;
      }
      Unassign(first);
      open_space_ = 0;
      ++unstarted_;
      ++count;
      if (exhausted()) {
        return false;
      }
    }
    return false;
  }

  bool Extend(std::vector<int>& group, int size, int from) {
    if (static_cast<int>(group.size()) == size) {
      return CloseGroup(group);
    }
    if (!Step()) {
      return false;
    }
    const std::vector<int> candidates = Candidates(group, from);
    const size_t needed = size - group.size();
    for (size_t i = 0; i + needed <= candidates.size(); ++i) {
      const int h = candidates[i];
      Assign(h);
      group.push_back(h);
      if (UnitsFit() && Extend(group, size, h + 1)) {
        return true;
      }
      group.pop_back();
      Unassign(h);
      if (exhausted()) {
        return false;
      }
    }
    return false;
  }

  bool CloseGroup(const std::vector<int>& group) {
    // The closed group's members no longer count as open for their units.
    for (int h : group) {
      for (int u : units_of_host_[h]) {
        --in_open_[u];
      }
    }
    groups_.push_back(group);
    if (UnitsFit() && StartGroup()) {
      return true;
    }
    groups_.pop_back();
    for (int h : group) {
      for (int u : units_of_host_[h]) {
        ++in_open_[u];
      }
    }
    return false;
  }

  const ConflictGraph& graph_;
  std::vector<std::vector<int>> units_;
  std::vector<std::vector<int>> units_of_host_;
  std::vector<int> free_in_unit_;
  std::vector<int> in_open_;  // members of the open group in each unit
  std::vector<uint64_t> unassigned_;
  std::map<int, int> size_count_;  // group size -> groups of that size not yet started
  int unstarted_;
  int open_space_ = 0;
  const int64_t budget_;
  int64_t steps_ = 0;
  std::vector<std::vector<int>> groups_;
};

// Gemini's diagonal groups on the (pipeline stage, host within stage) grid, when every host lies
// in one stage and m divides both sides: group(s, c) = {(s + k*S/m, c + k*C/m)}. nullopt when the
// grid does not have that shape.
std::optional<std::vector<std::vector<int>>> DiagonalGroups(const Topology& topology, int m) {
  const int stage_size = topology.world_size() / topology.pp();
  const int r = topology.ranks_per_host();
  if (stage_size % r != 0) {
    return std::nullopt;
  }
  const int columns = stage_size / r;
  const int rows = topology.pp();
  if (rows % m != 0 || columns % m != 0) {
    return std::nullopt;
  }
  std::vector<std::vector<int>> groups;
  std::vector<bool> taken(static_cast<size_t>(rows) * columns, false);
  for (int host = 0; host < rows * columns; ++host) {
    if (taken[host]) {
      continue;
    }
    std::vector<int> group;
    for (int k = 0; k < m; ++k) {
      const int s = (host / columns + k * rows / m) % rows;
      const int c = (host % columns + k * columns / m) % columns;
      group.push_back(s * columns + c);
      taken[s * columns + c] = true;
    }
    std::sort(group.begin(), group.end());
    groups.push_back(std::move(group));
  }
  return groups;
}

bool Independent(const ConflictGraph& graph, const std::vector<std::vector<int>>& groups) {
  for (const std::vector<int>& group : groups) {
    for (size_t i = 0; i < group.size(); ++i) {
      for (size_t j = i + 1; j < group.size(); ++j) {
        if (graph.Conflict(group[i], group[j])) {
          return false;
        }
      }
    }
  }
  return true;
}

// Why a unit that spans every host makes its class impossible, with the usual cause.
std::string WholeJobReason(const Topology& topology, const EvictionUnit& unit) {
  std::string why = absl::StrCat(
      ClassName(unit.eviction_class),
      unit.eviction_class == EvictionClass::kRack ? "s span" : " groups span", " every host");
  if (unit.eviction_class == EvictionClass::kData && topology.pp() == 1) {
    absl::StrAppend(&why, ": with pp=1 a dp group is the whole job");
  } else if (unit.eviction_class == EvictionClass::kPipeline && topology.dp() == 1) {
    absl::StrAppend(&why, ": with dp=1 a pp group is the whole job");
  } else {
    absl::StrAppend(&why, ": ", unit.name, " covers all ", topology.num_hosts(), " host slots");
  }
  return why;
}

struct SearchOutcome {
  std::optional<std::vector<std::vector<int>>> groups;
  std::string why_not;  // when groups is empty
  EvictionClass culprit = EvictionClass::kHost;
  bool culprit_known = false;
};

SearchOutcome FindGroups(const BackupPlacementSpec& spec,
                         const std::vector<EvictionClass>& classes) {
  const Topology& topology = spec.topology;
  const int hosts = topology.num_hosts();
  const std::vector<int> sizes = GroupSizes(hosts, spec.copies);
  SearchOutcome outcome;
  std::vector<std::vector<int>> cliques;
  for (const EvictionUnit& unit : EvictionUnits(spec, classes)) {
    if (unit.hosts.size() < 2) {
      continue;
    }
    // Each group holds at most one host of a unit: a unit larger than the number of groups cannot
    // be spread.
    if (unit.hosts.size() > sizes.size()) {
      outcome.culprit = unit.eviction_class;
      outcome.culprit_known = true;
      outcome.why_not =
          static_cast<int>(unit.hosts.size()) == hosts
              ? WholeJobReason(topology, unit)
              : absl::StrCat(unit.name, " spans ", unit.hosts.size(), " hosts but ", hosts,
                             " hosts form only ", sizes.size(),
                             sizes.size() == 1 ? " group of " : " groups of ", spec.copies,
                             ", and a group may hold only one host of it");
      return outcome;
    }
    cliques.push_back(unit.hosts);
  }
  ConflictGraph graph(hosts);
  for (const std::vector<int>& clique : cliques) {
    graph.AddClique(clique);
  }
  if (std::optional<std::vector<std::vector<int>>> diagonal = DiagonalGroups(topology, spec.copies);
      diagonal.has_value() && Independent(graph, *diagonal)) {
    outcome.groups = std::move(diagonal);
    return outcome;
  }
  GroupSearch search(graph, std::move(cliques), sizes);
  outcome.groups = search.Run();
  if (!outcome.groups.has_value()) {
    outcome.why_not = search.exhausted()
                          ? absl::StrCat("no grouping of ", hosts, " hosts into groups of ",
                                         spec.copies, " keeping ", ClassList(classes),
                                         " apart was found in ", search.steps(), " search steps")
                          : absl::StrCat("no grouping of ", hosts, " hosts into groups of ",
                                         spec.copies, " keeps ", ClassList(classes),
                                         " apart (exhaustive search, ", search.steps(), " steps)");
  }
  return outcome;
}

// Union-find components of the undirected holder graph.
std::vector<std::vector<int>> HolderComponents(const BackupPlacement& placement) {
  const int hosts = placement.num_hosts();
  std::vector<int> parent(hosts);
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&parent](int h) {
    while (parent[h] != h) {
      h = parent[h] = parent[parent[h]];
    }
    return h;
  };
  for (int h = 0; h < hosts; ++h) {
    for (int holder : placement.HoldersOf(h)) {
      parent[find(h)] = find(holder);
    }
  }
  std::map<int, std::vector<int>> by_root;
  for (int h = 0; h < hosts; ++h) {
    by_root[find(h)].push_back(h);
  }
  std::vector<std::vector<int>> components;
  components.reserve(by_root.size());
  for (auto& [root, members] : by_root) {
    components.push_back(std::move(members));
  }
  return components;
}

// Exact: the number of k-subsets that lose no rank is the coefficient of x^k in the product over
// components of (sum over safe subsets S of the component of x^|S|).
double ExactSurvival(const BackupPlacement& placement,
                     const std::vector<std::vector<int>>& components, int failed_hosts) {
  std::vector<long double> safe_ways = {1.0L};
  std::vector<int> index_in_component(placement.num_hosts());
  for (const std::vector<int>& component : components) {
    const int n = static_cast<int>(component.size());
    for (int i = 0; i < n; ++i) {
      index_in_component[component[i]] = i;
    }
    std::vector<uint32_t> holder_masks(n, 0);
    for (int i = 0; i < n; ++i) {
      for (int holder : placement.HoldersOf(component[i])) {
        holder_masks[i] |= uint32_t{1} << index_in_component[holder];
      }
    }
    std::vector<long double> by_size(n + 1, 0.0L);
    for (uint32_t failed = 0; failed < (uint32_t{1} << n); ++failed) {
      bool safe = true;
      for (int i = 0; i < n && safe; ++i) {
        safe = !((failed >> i) & 1) || (holder_masks[i] & ~failed) != 0;
      }
      if (safe) {
        by_size[std::popcount(failed)] += 1.0L;
      }
    }
    std::vector<long double> product(std::min<size_t>(safe_ways.size() + n, failed_hosts + 1),
                                     0.0L);
    for (size_t a = 0; a < safe_ways.size(); ++a) {
      for (int b = 0; b <= n && a + b < product.size(); ++b) {
        product[a + b] += safe_ways[a] * by_size[b];
      }
    }
    safe_ways = std::move(product);
  }
  long double all_ways = 1.0L;  // C(hosts, k)
  for (int i = 0; i < failed_hosts; ++i) {
    all_ways = all_ways * (placement.num_hosts() - i) / (i + 1);
  }
  const long double safe =
      failed_hosts < static_cast<int>(safe_ways.size()) ? safe_ways[failed_hosts] : 0.0L;
  return static_cast<double>(safe / all_ways);
}

// SplitMix64: a tiny, seedable, well-mixed generator; the same seed gives the same estimate.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) by Lemire's multiply-shift (bias below 2^-32 for the sizes used here).
  uint32_t Below(uint32_t n) { return static_cast<uint32_t>(((Next() >> 32) * uint64_t{n}) >> 32); }

 private:
  uint64_t state_;
};

bool ParseInt(absl::string_view text, int* out) { return absl::SimpleAtoi(text, out); }

}  // namespace

std::string_view EvictionClassName(EvictionClass c) {
  switch (c) {
    case EvictionClass::kHost:
      return "host";
    case EvictionClass::kRack:
      return "rack";
    case EvictionClass::kTensor:
      return "tp";
    case EvictionClass::kContext:
      return "cp";
    case EvictionClass::kData:
      return "dp";
    case EvictionClass::kPipeline:
      return "pp";
  }
  return "unknown";
}

absl::StatusOr<std::vector<EvictionClass>> ParseEvictionClasses(absl::string_view csv) {
  std::vector<EvictionClass> classes;
  for (absl::string_view token : absl::StrSplit(csv, ',')) {
    token = absl::StripAsciiWhitespace(token);
    if (token.empty()) {
      continue;
    }
    const EvictionClass* match = nullptr;
    for (const EvictionClass& c : kAllClasses) {
      if (ClassName(c) == token) {
        match = &c;
      }
    }
    if (match == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown eviction class \"", token, "\" in \"",
                                                     csv,
                                                     "\" (known: host, rack, tp, cp, dp, pp)"));
    }
    classes.push_back(*match);
  }
  return Declared(classes);
}

std::vector<EvictionUnit> EvictionUnits(const BackupPlacementSpec& spec,
                                        const std::vector<EvictionClass>& classes) {
  const Topology& topology = spec.topology;
  const int r = topology.ranks_per_host();
  std::vector<EvictionUnit> units;
  for (EvictionClass c : classes) {
    if (c == EvictionClass::kHost) {
      for (int host = 0; host < topology.num_hosts(); ++host) {
        units.push_back({c, absl::StrCat("host slot ", host), {host}});
      }
    } else if (c == EvictionClass::kRack) {
      std::vector<std::string> labels;  // in order of first appearance
      std::map<std::string, std::vector<int>> hosts_of;
      for (int host = 0; host < static_cast<int>(spec.racks.size()); ++host) {
        std::vector<int>& hosts = hosts_of[spec.racks[host]];
        if (hosts.empty()) {
          labels.push_back(spec.racks[host]);
        }
        hosts.push_back(host);
      }
      for (const std::string& label : labels) {
        units.push_back({c, absl::StrCat("rack ", label), hosts_of[label]});
      }
    } else {
      // Numbered in order of their lowest rank, after groups on the same hosts are merged.
      const ParallelDim dim = *DimOf(c);
      std::set<std::vector<int>> seen;
      int index = 0;
      for (int rank = 0; rank < topology.world_size(); ++rank) {
        // A group is listed by its lowest rank, the one whose coordinate in `dim` is 0: the others
        // are not asked for their group (a DP group of a large job has hundreds of members).
        const absl::StatusOr<RankCoordinates> coordinates = topology.CoordinatesOf(rank);
        if (!coordinates.ok() || coordinates->Get(dim) != 0) {
          continue;
        }
        const absl::StatusOr<std::vector<int>> group = topology.GroupOf(rank, dim);
        if (!group.ok()) {
          continue;
        }
        std::vector<int> hosts;
        for (int member : *group) {
          hosts.push_back(member / r);
        }
        std::sort(hosts.begin(), hosts.end());
        hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
        if (seen.insert(hosts).second) {
          units.push_back({c, absl::StrCat(ClassName(c), " group ", index++), std::move(hosts)});
        }
      }
    }
  }
  return units;
}

absl::StatusOr<BackupPlacement> BackupPlacement::Place(const BackupPlacementSpec& spec) {
  const int hosts = spec.topology.num_hosts();
  if (spec.copies < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("backup placement: copies must be >= 1, got ", spec.copies));
  }
  if (hosts < spec.copies) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backup placement: ", spec.copies, " copies need ", spec.copies,
        " distinct hosts but the topology (", spec.topology.ToString(), ") has ", hosts));
  }
  if (!spec.racks.empty() && static_cast<int>(spec.racks.size()) != hosts) {
    return absl::InvalidArgumentError(absl::StrCat("backup placement: ", spec.racks.size(),
                                                   " rack labels for ", hosts,
                                                   " host slots (one per host slot, or none)"));
  }
  BackupPlacement placement;
  placement.copies_ = spec.copies;
  placement.ranks_per_host_ = spec.topology.ranks_per_host();
  placement.holders_.assign(hosts, {});
  std::vector<EvictionClass> classes = Declared(spec.classes);
  if (spec.copies == 1) {
    placement.honoured_ = classes;
    return placement;
  }
  std::vector<std::string> whys;
  while (true) {
    SearchOutcome outcome = FindGroups(spec, classes);
    if (outcome.groups.has_value()) {
      for (std::vector<int>& group : *outcome.groups) {
        std::sort(group.begin(), group.end());
        const int n = static_cast<int>(group.size());
        for (int i = 0; i < n; ++i) {
          for (int k = 1; k < spec.copies; ++k) {
            placement.holders_[group[i]].push_back(group[(i + k) % n]);
          }
        }
      }
      break;
    }
    if (classes.size() <= 1) {
      // The host class alone is always feasible with at least `copies` hosts.
      return absl::InternalError(absl::StrCat("backup placement: no placement of ", hosts,
                                              " hosts even for the host class: ", outcome.why_not));
    }
    const EvictionClass dropped = classes.back();
    if (outcome.culprit_known && outcome.culprit == dropped) {
      whys.push_back(absl::StrCat("dropped ", ClassName(dropped), ": ", outcome.why_not));
    } else {
      whys.push_back(absl::StrCat("dropped ", ClassName(dropped), " (the last declared) because ",
                                  ClassList(classes),
                                  " cannot all be honoured: ", outcome.why_not));
    }
    placement.dropped_.push_back(dropped);
    classes.pop_back();
  }
  placement.honoured_ = classes;
  placement.why_dropped_ = absl::StrJoin(whys, "; ");
  return placement;
}

BackupPlacement BackupPlacement::Ring(int num_hosts, int ranks_per_host, int copies) {
  BackupPlacement placement;
  placement.copies_ = std::clamp(copies, 1, std::max(num_hosts, 1));
  placement.ranks_per_host_ = ranks_per_host;
  placement.holders_.assign(std::max(num_hosts, 0), {});
  for (int host = 0; host < num_hosts; ++host) {
    for (int k = 1; k < placement.copies_; ++k) {
      placement.holders_[host].push_back((host + k) % num_hosts);
    }
  }
  placement.honoured_ = {EvictionClass::kHost};
  return placement;
}

std::string BackupPlacement::Encode() const {
  std::string out = absl::StrCat("m=", copies_, " r=", ranks_per_host_, " h=");
  for (size_t host = 0; host < holders_.size(); ++host) {
    absl::StrAppend(&out, host == 0 ? "" : ",",
                    holders_[host].empty() ? "-" : absl::StrJoin(holders_[host], "/"));
  }
  return out;
}

absl::StatusOr<BackupPlacement> BackupPlacement::Decode(absl::string_view text) {
  auto bad = [text](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("backup placement \"", text, "\": ", what));
  };
  const std::vector<absl::string_view> fields = absl::StrSplit(text, ' ', absl::SkipEmpty());
  if (fields.size() != 3 || !absl::StartsWith(fields[0], "m=") ||
      !absl::StartsWith(fields[1], "r=") || !absl::StartsWith(fields[2], "h=")) {
    return bad("expected \"m=<copies> r=<ranks per host> h=<holders>,...\"");
  }
  BackupPlacement placement;
  if (!ParseInt(fields[0].substr(2), &placement.copies_) || placement.copies_ < 1) {
    return bad(absl::StrCat("copies \"", fields[0], "\" is not a number >= 1"));
  }
  if (!ParseInt(fields[1].substr(2), &placement.ranks_per_host_) || placement.ranks_per_host_ < 1) {
    return bad(absl::StrCat("ranks per host \"", fields[1], "\" is not a number >= 1"));
  }
  const std::vector<absl::string_view> entries = absl::StrSplit(fields[2].substr(2), ',');
  const int hosts = static_cast<int>(entries.size());
  if (hosts < placement.copies_) {
    return bad(absl::StrCat(hosts, " host slots cannot hold ", placement.copies_, " copies"));
  }
  for (int host = 0; host < hosts; ++host) {
    const absl::string_view entry = entries[host];
    std::vector<int> holders;
    if (entry != "-") {
      for (absl::string_view token : absl::StrSplit(entry, '/')) {
        int holder = 0;
        if (!ParseInt(token, &holder) || holder < 0 || holder >= hosts) {
          return bad(absl::StrCat("host slot ", host, "'s holder \"", token,
                                  "\" is not a host slot in [0, ", hosts, ")"));
        }
        if (holder == host || std::find(holders.begin(), holders.end(), holder) != holders.end()) {
          return bad(absl::StrCat("host slot ", host, "'s holders \"", entry,
                                  "\" repeat a host or name the host itself"));
        }
        holders.push_back(holder);
      }
    }
    if (static_cast<int>(holders.size()) != placement.copies_ - 1) {
      return bad(absl::StrCat("host slot ", host, "'s holders \"", entry, "\" are ", holders.size(),
                              ", not copies - 1 = ", placement.copies_ - 1));
    }
    placement.holders_.push_back(std::move(holders));
  }
  return placement;
}

bool BackupPlacement::operator==(const BackupPlacement& other) const {
  return copies_ == other.copies_ && ranks_per_host_ == other.ranks_per_host_ &&
         holders_ == other.holders_;
}

std::vector<int> BackupPlacement::SourcesOf(int host) const {
  std::vector<int> sources;
  for (int source = 0; source < num_hosts(); ++source) {
    const std::vector<int>& holders = holders_[source];
    if (std::find(holders.begin(), holders.end(), host) != holders.end()) {
      sources.push_back(source);
    }
  }
  return sources;
}

std::vector<int> BackupPlacement::HolderRanks(int rank) const {
  std::vector<int> ranks;
  for (int holder : holders_[rank / ranks_per_host_]) {
    ranks.push_back(holder * ranks_per_host_ + rank % ranks_per_host_);
  }
  return ranks;
}

std::vector<int> BackupPlacement::SourceRanks(int rank) const {
  std::vector<int> ranks;
  for (int source : SourcesOf(rank / ranks_per_host_)) {
    ranks.push_back(source * ranks_per_host_ + rank % ranks_per_host_);
  }
  return ranks;
}

PlacementProof ProvePlacement(const BackupPlacementSpec& spec, const BackupPlacement& placement) {
  PlacementProof proof;
  const int hosts = spec.topology.num_hosts();
  const int r = spec.topology.ranks_per_host();
  if (placement.num_hosts() != hosts || placement.ranks_per_host() != r) {
    proof.holds = false;
    proof.lines.push_back(absl::StrCat("the placement is for ", placement.num_hosts(), " hosts x ",
                                       placement.ranks_per_host(), " ranks, the topology has ",
                                       hosts, " x ", r));
    return proof;
  }
  std::vector<EvictionClass> classes;
  for (EvictionClass c : Declared(spec.classes)) {
    const std::vector<EvictionClass>& dropped = placement.dropped();
    if (std::find(dropped.begin(), dropped.end(), c) == dropped.end()) {
      classes.push_back(c);
    }
  }
  std::vector<bool> evicted(hosts, false);
  for (const EvictionUnit& unit : EvictionUnits(spec, classes)) {
    for (int h : unit.hosts) {
      evicted[h] = true;
    }
    std::vector<std::string> losses;
    for (int h : unit.hosts) {
      const std::vector<int>& holders = placement.HoldersOf(h);
      if (std::all_of(holders.begin(), holders.end(), [&](int x) { return evicted[x]; })) {
        losses.push_back(absl::StrCat(
            RankPhrase(RanksOf(h, r)), " (host ", h,
            holders.empty()
                ? " has no holders"
                : absl::StrCat(holders.size() == 1 ? " and its holder " : " and its holders ",
                               absl::StrJoin(holders, ",")),
            ")"));
      }
    }
    for (int h : unit.hosts) {
      evicted[h] = false;
    }
    const std::string where = unit.eviction_class == EvictionClass::kHost
                                  ? unit.name
                                  : absl::StrCat(unit.name, " (hosts ", Ranges(unit.hosts), ")");
    if (losses.empty()) {
      proof.lines.push_back(absl::StrCat(where, ": every rank keeps a copy"));
    } else {
      proof.holds = false;
      proof.lines.push_back(absl::StrCat(where, ": loses ", absl::StrJoin(losses, ", ")));
    }
  }
  return proof;
}

double MonteCarloSurvivalProbability(const BackupPlacement& placement, int failed_hosts,
                                     int samples, uint64_t seed) {
  const int hosts = placement.num_hosts();
  if (failed_hosts <= 0 || hosts == 0) {
    return 1.0;
  }
  if (failed_hosts >= hosts || samples <= 0) {
    return failed_hosts >= hosts ? 0.0 : 1.0;
  }
  SplitMix64 rng(seed);
  std::vector<int> order(hosts);
  std::iota(order.begin(), order.end(), 0);
  std::vector<bool> failed(hosts, false);
  int survived = 0;
  for (int sample = 0; sample < samples; ++sample) {
    // A partial Fisher-Yates shuffle: the first k entries are a uniform k-subset.
    for (int i = 0; i < failed_hosts; ++i) {
      std::swap(order[i], order[i + rng.Below(static_cast<uint32_t>(hosts - i))]);
      failed[order[i]] = true;
    }
    bool lost = false;
    for (int i = 0; i < failed_hosts && !lost; ++i) {
      const std::vector<int>& holders = placement.HoldersOf(order[i]);
      lost = std::all_of(holders.begin(), holders.end(), [&](int h) { return failed[h]; });
    }
    survived += lost ? 0 : 1;
    for (int i = 0; i < failed_hosts; ++i) {
      failed[order[i]] = false;
    }
  }
  return static_cast<double>(survived) / samples;
}

double SurvivalProbability(const BackupPlacement& placement, int failed_hosts, int samples,
                           uint64_t seed) {
  const int hosts = placement.num_hosts();
  if (failed_hosts <= 0 || hosts == 0) {
    return 1.0;
  }
  if (failed_hosts >= hosts) {
    return 0.0;
  }
  const std::vector<std::vector<int>> components = HolderComponents(placement);
  const bool small = std::all_of(components.begin(), components.end(), [](const auto& c) {
    return static_cast<int>(c.size()) <= kMaxExactComponent;
  });
  if (small) {
    return ExactSurvival(placement, components, failed_hosts);
  }
  return MonteCarloSurvivalProbability(placement, failed_hosts, samples, seed);
}

std::string DescribePlacement(const BackupPlacementSpec& spec, const BackupPlacement& placement) {
  const int hosts = placement.num_hosts();
  const int r = placement.ranks_per_host();
  std::string out =
      absl::StrCat("backup placement: ", hosts, " host slots x ", r, " ranks, ", placement.copies(),
                   " copies of every snapshot (", spec.topology.ToString(), ")\n");
  absl::StrAppend(&out, "eviction classes honoured: ", ClassList(placement.honoured()), "\n");
  if (!placement.dropped().empty()) {
    absl::StrAppend(&out, "eviction classes dropped: ", ClassList(placement.dropped()), "\n");
    for (absl::string_view why : absl::StrSplit(placement.why_dropped(), "; ")) {
      absl::StrAppend(&out, "  ", why, "\n");
    }
  }
  for (int host = 0; host < hosts; ++host) {
    const std::vector<int>& holders = placement.HoldersOf(host);
    absl::StrAppend(
        &out, "host slot ", host, " (", RankPhrase(RanksOf(host, r)), ") -> ",
        holders.empty() ? "no backups" : absl::StrCat("backups on ", absl::StrJoin(holders, ", ")),
        "\n");
  }
  const PlacementProof proof = ProvePlacement(spec, placement);
  if (proof.lines.size() <= kMaxProofLines) {
    absl::StrAppend(&out, "proof (every eviction unit of the honoured classes):\n");
    for (const std::string& line : proof.lines) {
      absl::StrAppend(&out, "  ", line, "\n");
    }
  } else {
    const size_t failures = std::count_if(
        proof.lines.begin(), proof.lines.end(),
        [](const std::string& line) { return line.find(": loses ") != std::string::npos; });
    absl::StrAppend(&out, "proof: ", proof.lines.size(), " eviction units checked, ",
                    failures == 0 ? "every one leaves every rank a copy"
                                  : absl::StrCat(failures, " lose ranks:"),
                    "\n");
    for (const std::string& line : proof.lines) {
      if (line.find(": loses ") != std::string::npos) {
        absl::StrAppend(&out, "  ", line, "\n");
      }
    }
  }
  absl::StrAppend(&out,
                  "survival with k random host failures (this placement | ring placement):\n");
  const BackupPlacement ring = BackupPlacement::Ring(hosts, r, placement.copies());
  for (int k : {1, 2, 4, 8}) {
    if (k < hosts) {
      absl::StrAppend(&out, absl::StrFormat("  k=%d: %.1f%% | %.1f%%\n", k,
                                            100 * SurvivalProbability(placement, k),
                                            100 * SurvivalProbability(ring, k)));
    }
  }
  return out;
}

}  // namespace trainguard
