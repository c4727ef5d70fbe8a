// The rendezvous protocol over a Store: see sdk/rendezvous/rendezvous.h for the key layout.
#include "sdk/rendezvous/rendezvous.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "sdk/core/store_keys.h"
#include "sdk/rendezvous/coordinator_lease.h"

namespace trainguard {
namespace {

constexpr const char* kCurrentKey = store_keys::kRdzvCurrent;
// Values of rdzv/standby/<member>: waiting for an assignment, or claimed by the coordinator.
constexpr char kParked[] = "parked";
constexpr char kTaken[] = "taken";
// How often a rank waiting for its generation's plan checks whether the generation was superseded.
// Only a fallback: the coordinator that publishes the next generation marks the plan superseded
// (Publish), which ends the wait at once; a coordinator that died between its fence and that mark
// leaves the check to this slice. Long, since every waiting rank re-sends its wait at the end of
// each slice: thousands of ranks whose slices end together while the plan is being computed would
// load the store when it is busiest.
constexpr absl::Duration kAgreementSlice = absl::Seconds(5);
// A member that missed more generations than this reads its place from the newest table instead
// of from each generation's changes.
constexpr int64_t kMaxChangesRead = 64;
// Bounds the "left" mark of a member without a heartbeat thread (no interval to bound it).
constexpr absl::Duration kLeftWriteTimeout = absl::Seconds(1);

std::string ClaimKey(int64_t generation) { return store_keys::RdzvClaim(generation); }
std::string TableKey(int64_t generation) { return store_keys::RdzvTable(generation); }
std::string JoinKey(int rank) { return store_keys::RdzvJoin(rank); }
std::string StandbyKey(std::string_view member) {
  return store_keys::RdzvStandby(absl::string_view(member.data(), member.size()));
}
std::string AssignKey(std::string_view member) {
  return store_keys::RdzvAssign(absl::string_view(member.data(), member.size()));
}
std::string HeartbeatKey(std::string_view member) {
  return store_keys::RdzvHeartbeat(absl::string_view(member.data(), member.size()));
}
std::string RenewPrefix(int64_t generation) { return store_keys::RdzvRenewPrefix(generation); }
std::string ChangesKey(int64_t generation) { return store_keys::RdzvChanges(generation); }

// What `next` changes in `previous`'s table: the ranks another member holds. Generation 0 (no
// previous generation) changes nothing: its table is the registrations.
store_keys::GenerationChanges ChangesOf(const Membership& previous, const Membership& next) {
  store_keys::GenerationChanges changes{next.generation, next.world_size, {}};
  if (next.generation == 0) return changes;
  for (int r = 0; r < next.world_size; ++r) {
    if (static_cast<size_t>(r) >= previous.members.size() ||
        previous.members[r] != next.members[r]) {
      changes.taken.emplace_back(r, next.members[r]);
    }
  }
  return changes;
}

// The member that `changes` give `rank` to; nullptr when it stays with its holder.
const std::string* TakerOf(const store_keys::GenerationChanges& changes, int rank) {
  auto it = std::lower_bound(changes.taken.begin(), changes.taken.end(), rank,
                             [](const auto& taken, int r) { return taken.first < r; });
  return it != changes.taken.end() && it->first == rank ? &it->second : nullptr;
}

// `table` (a generation's table, whole or only the ranks its follower needs) after the changes of
// each generation up to `newest`, read in one MultiGet: nullopt when one is missing (its publisher
// wrote none: the caller reads the table) or names another world size, DataLoss naming the key when
// one is malformed.
absl::StatusOr<std::optional<Membership>> FollowTableChanges(Store* store, Membership table,
                                                             int64_t newest,
                                                             absl::Duration timeout) {
  if (newest <= table.generation) return table;
  std::vector<std::string> keys;
  for (int64_t g = table.generation + 1; g <= newest; ++g) keys.push_back(ChangesKey(g));
  absl::StatusOr<std::vector<std::optional<std::string>>> values = store->MultiGet(keys, timeout);
  if (!values.ok()) return values.status();
  for (size_t i = 0; i < keys.size(); ++i) {
    // Published by a coordinator that writes no changes: the caller reads the table.
    if (!(*values)[i].has_value()) return std::nullopt;
    const int64_t g = table.generation + 1;
    absl::StatusOr<store_keys::GenerationChanges> changes =
        store_keys::DecodeGenerationChanges(*(*values)[i]);
    if (!changes.ok() || changes->generation != g) {
      return absl::DataLossError(absl::StrFormat(
          "malformed changes of generation %d at store key %s (following generation %d): %s", g,
          keys[i], table.generation,
          changes.ok() ? absl::StrCat("they name generation ", changes->generation)
                       : std::string(changes.status().message())));
    }
    // Another world size: not a change of holders; the newest table says it all.
    if (changes->world_size != table.world_size) return std::nullopt;
    for (auto& [rank, member] : changes->taken) table.members[rank] = std::move(member);
    table.generation = g;
  }
  return table;
}

std::string EncodeTable(const Membership& m) {
  return absl::StrCat(m.generation, "\n", m.world_size, "\n", absl::StrJoin(m.members, "\n"));
}

absl::StatusOr<Membership> DecodeTable(std::string_view text, std::string_view key) {
  std::vector<std::string> lines =
      absl::StrSplit(absl::string_view(text.data(), text.size()), '\n');
  Membership m;
  if (lines.size() < 2 || !absl::SimpleAtoi(lines[0], &m.generation) ||
      !absl::SimpleAtoi(lines[1], &m.world_size) || m.world_size < 1 ||
      lines.size() != static_cast<size_t>(m.world_size) + 2) {
    return absl::DataLossError(absl::StrFormat("malformed rank table at store key %s", key));
  }
  m.members.assign(lines.begin() + 2, lines.end());
  return m;
}

// Where `member` sits in `table`; -1 when absent.
int RankOf(const Membership& table, std::string_view member) {
  for (size_t r = 0; r < table.members.size(); ++r) {
    if (table.members[r] == member) return static_cast<int>(r);
  }
  return -1;
}

// The changes of `generation` from the value of their key (nullopt: absent, NotFound).
absl::StatusOr<store_keys::GenerationChanges> ChangesFrom(int64_t generation,
                                                          const std::optional<std::string>& value) {
  const std::string key = ChangesKey(generation);
  if (!value.has_value()) {
    return absl::NotFoundError(absl::StrFormat("store key %s not found", key));
  }
  absl::StatusOr<store_keys::GenerationChanges> changes =
      store_keys::DecodeGenerationChanges(*value);
  if (!changes.ok() || changes->generation != generation) {
    return absl::DataLossError(
        absl::StrFormat("malformed changes of generation %d at store key %s: %s", generation, key,
                        changes.ok() ? absl::StrCat("they name generation ", changes->generation)
                                     : std::string(changes.status().message())));
  }
  return changes;
}

absl::Status ValidMemberId(std::string_view id) {
  if (id.empty() || id.find_first_of("\n/") != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rendezvous member id '%s' must be non-empty, without '/' or newline", id));
  }
  return absl::OkStatus();
}

// Time left until `deadline`, never negative.
absl::Duration Left(absl::Time deadline) {
  return std::max(deadline - absl::Now(), absl::ZeroDuration());
}

// The newest published generation (rdzv/current): the store's error (NotFound before generation
// 0), DataLoss for a malformed value.
absl::StatusOr<int64_t> ReadNewestGeneration(Store* store, absl::Duration timeout) {
  absl::StatusOr<std::string> current = store->Get(kCurrentKey, timeout);
  if (!current.ok()) return current.status();
  int64_t generation = -1;
  if (!absl::SimpleAtoi(*current, &generation) || generation < 0) {
    return absl::DataLossError(
        absl::StrFormat("malformed generation '%s' at store key %s", *current, kCurrentKey));
  }
  return generation;
}

// The rank table of `generation`, read whole (O(world size) bytes).
absl::StatusOr<Membership> ReadTable(Store* store, int64_t generation, absl::Duration timeout) {
  const std::string key = TableKey(generation);
  absl::StatusOr<std::string> text = store->Get(key, timeout);
  if (!text.ok()) return text.status();
  return DecodeTable(*text, key);
}

// `held` brought to `newest`: through the changes published since (at most kMaxChangesRead
// generations behind), else from `newest`'s table.
absl::StatusOr<Membership> FollowOrReadTable(Store* store, Membership held, int64_t newest,
                                             absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  if (held.generation >= 0 && newest - held.generation <= kMaxChangesRead) {
    absl::StatusOr<std::optional<Membership>> followed =
        FollowTableChanges(store, std::move(held), newest, timeout);
    if (!followed.ok()) return followed.status();
    if (followed->has_value()) return **std::move(followed);
  }
  return ReadTable(store, newest, Left(deadline));
}

// How long a rank's heartbeat may stand still before the rank is stale: `timeout`, or for a member
// that left (its Runtime closed: the process is exiting) the exit grace.
absl::Duration AllowedSilence(std::string_view value, absl::Duration timeout) {
  return value == kLeftHeartbeat ? std::max(10 * timeout, kLeftGrace) : timeout;
}

}  // namespace

RendezvousMember::RendezvousMember(Store* store, std::string member_id,
                                   absl::Duration heartbeat_interval)
    : store_(store), member_id_(std::move(member_id)), heartbeat_interval_(heartbeat_interval) {
  if (heartbeat_interval_ != absl::InfiniteDuration()) {
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  }
}

RendezvousMember::~RendezvousMember() {
  stop_.Notify();
  if (heartbeat_.joinable()) heartbeat_.join();
  // Rejected (harmlessly) when this member's generation was superseded: it is replaced anyway.
  (void)store_->Set(HeartbeatKey(member_id_), kLeftHeartbeat,
                    std::min(heartbeat_interval_, kLeftWriteTimeout));
}

int64_t RendezvousMember::generation() const {
  MutexLock lock(&mu_);
  return generation_;
}

absl::StatusOr<int64_t> RendezvousMember::HeldGeneration() const {
  const int64_t held = generation();
  if (held < 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("member %s holds no generation to be superseded", member_id_));
  }
  return held;
}

bool RendezvousMember::MarkSuperseded(int64_t held,
                                      std::vector<std::optional<std::string>> prefetched) {
  // Under mu_: a member that adopted a newer generation meanwhile (AdoptGeneration clears the
  // mark) is not superseded by the table it waited for, and what was read with it is dropped.
  MutexLock lock(&mu_);
  if (generation_ == held) {
    superseded_generation_.store(held);
    prefetched_ = Prefetched{held, std::move(prefetched)};
  }
  return superseded_generation_.load() == generation_;
}

absl::StatusOr<bool> RendezvousMember::AwaitNewerGeneration(absl::Duration timeout) {
  absl::StatusOr<int64_t> held = HeldGeneration();
  if (!held.ok()) return held.status();
  if (superseded_generation() == *held) return true;
  absl::StatusOr<std::vector<std::optional<std::string>>> read =
      store_->WaitAndRead({TableKey(*held + 1)}, {kCurrentKey, ChangesKey(*held + 1)}, timeout);
  if (absl::IsDeadlineExceeded(read.status())) return false;
  if (!read.ok()) return read.status();
  return MarkSuperseded(*held, *std::move(read));
}

absl::StatusOr<RendezvousMember::NewerGenerationOrKey> RendezvousMember::AwaitNewerGenerationOr(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  absl::StatusOr<int64_t> held = HeldGeneration();
  if (!held.ok()) return held.status();
  NewerGenerationOrKey seen;
  if (superseded_generation() == *held) {
    seen.superseded = true;
    return seen;
  }
  std::vector<std::string> awaited = {TableKey(*held + 1)};
  awaited.insert(awaited.end(), keys.begin(), keys.end());
  // The generation's number and changes come back with the wake, as AwaitNewerGeneration's do.
  absl::StatusOr<AnyKeyAndValues> found =
      store_->WaitAnyAndRead(awaited, {kCurrentKey, ChangesKey(*held + 1)}, timeout);
  if (absl::IsDeadlineExceeded(found.status())) return seen;
  if (!found.ok()) return found.status();
  if (found->index > 0) {
    seen.key = found->index - 1;
    return seen;
  }
  seen.superseded = MarkSuperseded(*held, std::move(found->values));
  return seen;
}

void RendezvousMember::AdoptGeneration(const Membership& place) {
  MutexLock lock(&mu_);
  generation_ = place.generation;
  rank_ = place.rank;
  world_size_ = place.world_size;
  store_->SetWriterGeneration(place.generation);
  superseded_generation_.store(-1);
  prefetched_.reset();
}

absl::Duration RankHeartbeatInterval(int world_size) {
  return std::clamp(absl::Seconds(1) * (static_cast<double>(world_size) / kRankBeatsPerSecond),
                    absl::Seconds(1), kMaxRankHeartbeatInterval);
}

absl::Status RendezvousMember::Beat(absl::Duration timeout) {
  const int64_t beat_generation = generation();
  absl::Status s = store_->Add(HeartbeatKey(member_id_), 1, timeout).status();
  // A rejection of a beat sent before this member adopted a newer generation says nothing.
  if (absl::IsFailedPrecondition(s) && beat_generation == generation()) {
    superseded_generation_.store(beat_generation);
  }
  return s;
}

void RendezvousMember::HeartbeatLoop() {
  while (!stop_.WaitForNotificationWithTimeout(heartbeat_interval_)) {
    // Errors (the store briefly unreachable) are retried at the next beat.
    (void)Beat(heartbeat_interval_);
  }
}

absl::StatusOr<Membership> RendezvousMember::ReadRankTable(int64_t generation,
                                                           absl::Duration timeout) {
  absl::StatusOr<Membership> table = ReadTable(store_, generation, timeout);
  if (!table.ok()) return table.status();
  table->rank = RankOf(*table, member_id_);
  return table;
}

absl::StatusOr<store_keys::GenerationChanges> RendezvousMember::ReadChanges(
    int64_t generation, absl::Duration timeout) {
  const std::string key = ChangesKey(generation);
  absl::StatusOr<std::vector<std::optional<std::string>>> value =
      store_->WaitAndRead({key}, {key}, timeout);
  if (!value.ok()) return value.status();
  if (!value->at(0).has_value()) {
    return absl::NotFoundError(absl::StrFormat("store key %s not found", key));
  }
  return ChangesFrom(generation, *value->at(0));
}

Membership RendezvousMember::Held() const {
  Membership place;
  MutexLock lock(&mu_);
  place.generation = generation_;
  place.rank = rank_;
  place.world_size = world_size_;
  return place;
}

absl::StatusOr<std::optional<Membership>> RendezvousMember::FollowChanges(
    Membership place, const std::vector<std::optional<std::string>>& changes) const {
  const int64_t held = place.generation;
  for (size_t i = 0; i < changes.size(); ++i) {
    const int64_t g = held + 1 + static_cast<int64_t>(i);
    // Published by a coordinator that writes no changes: the caller reads the table.
    if (!changes[i].has_value()) return std::nullopt;
    absl::StatusOr<store_keys::GenerationChanges> decoded =
        store_keys::DecodeGenerationChanges(*changes[i]);
    if (!decoded.ok() || decoded->generation != g || decoded->world_size != place.world_size) {
      return absl::DataLossError(absl::StrFormat(
          "malformed changes of generation %d at store key %s (member %s holds rank %d of %d)", g,
          ChangesKey(g), member_id_, place.rank, place.world_size));
    }
    if (const std::string* taker = TakerOf(*decoded, place.rank);
        taker != nullptr && *taker != member_id_) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "member %s is not part of generation %d: it was replaced (rank %d is held by %s since "
          "generation %d)",
          member_id_, held + static_cast<int64_t>(changes.size()), place.rank, *taker, g));
    }
  }
  place.generation = held + static_cast<int64_t>(changes.size());
  return place;
}

absl::StatusOr<Membership> RendezvousMember::PlaceFromTable(int64_t generation,
                                                            absl::Duration timeout) {
  absl::StatusOr<Membership> table = ReadRankTable(generation, timeout);
  if (!table.ok()) return table.status();
  if (table->rank < 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "member %s is not part of generation %d: it was replaced", member_id_, generation));
  }
  table->members.clear();  // a rank's answers carry no member ids (rendezvous.h, Cost)
  return table;
}

absl::StatusOr<Membership> RendezvousMember::JoinInitial(int rank, int world_size,
                                                         absl::Duration timeout) {
  if (absl::Status s = ValidMemberId(member_id_); !s.ok()) return s;
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d is outside world size %d", rank, world_size));
  }
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<CompareAndSetResult> claimed =
      store_->CompareAndSet(JoinKey(rank), std::nullopt, member_id_, timeout);
  if (!claimed.ok()) return claimed.status();
  if (!claimed->swapped && claimed->current != member_id_) {
    return absl::AlreadyExistsError(absl::StrFormat("rank %d is already registered by member %s",
                                                    rank, claimed->current.value_or("?")));
  }
  // Generation 0's table is the registrations: this member holds `rank`, which it registered.
  // Its changes say the world size the coordinator formed it with: waited for and read at once.
  absl::StatusOr<std::vector<std::optional<std::string>>> published =
      store_->WaitAndRead({ChangesKey(0)}, {ChangesKey(0)}, Left(deadline));
  if (!published.ok()) {
    return absl::Status(
        published.status().code(),
        absl::StrCat("rank ", rank, " waiting for generation 0: ", published.status().message()));
  }
  absl::StatusOr<store_keys::GenerationChanges> changes = ChangesFrom(0, published->at(0));
  if (!changes.ok()) return changes.status();
  if (changes->world_size != world_size || !changes->taken.empty()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("generation 0 has world size %d; member %s asked for rank %d of %d",
                        changes->world_size, member_id_, rank, world_size));
  }
  Membership m;
  m.generation = 0;
  m.world_size = world_size;
  m.rank = rank;
  AdoptGeneration(m);
  return m;
}

absl::StatusOr<Membership> RendezvousMember::ParkAsStandby(absl::Duration timeout) {
  if (absl::Status s = ValidMemberId(member_id_); !s.ok()) return s;
  const absl::Time deadline = absl::Now() + timeout;
  // Parks unless a coordinator already claimed this standby ("taken"): a standby whose previous
  // bounded wait ended just as it was being assigned must not park itself a second time.
  absl::StatusOr<CompareAndSetResult> parked =
      store_->CompareAndSet(StandbyKey(member_id_), std::nullopt, kParked, timeout);
  if (!parked.ok()) return parked.status();
  const std::string assign_key = AssignKey(member_id_);
  absl::StatusOr<std::vector<std::optional<std::string>>> read =
      store_->WaitAndRead({assign_key}, {assign_key}, Left(deadline));
  if (!read.ok()) {
    return absl::Status(read.status().code(),
                        absl::StrFormat("standby %s parked without an assignment: %s", member_id_,
                                        std::string(read.status().message())));
  }
  if (!read->at(0).has_value()) {
    return absl::NotFoundError(absl::StrFormat("store key %s not found", assign_key));
  }
  const std::string& assignment = *read->at(0);
  absl::StatusOr<store_keys::Assignment> assigned = store_keys::DecodeAssignment(assignment);
  if (!assigned.ok()) {
    return absl::DataLossError(
        absl::StrFormat("malformed assignment '%s' at %s", assignment, assign_key));
  }
  // The assignment gives the rank; the generation's changes, the world size, and name this member
  // at that rank. Written with the assignment, or (a publication of more assignments than one
  // store batch holds) just after it: waited for.
  absl::StatusOr<store_keys::GenerationChanges> changes =
      ReadChanges(assigned->generation, Left(deadline));
  if (!changes.ok()) return changes.status();
  const std::string* taker = TakerOf(*changes, assigned->rank);
  if (taker == nullptr || *taker != member_id_) {
    return absl::DataLossError(absl::StrFormat(
        "standby %s is assigned rank %d of generation %d, which that generation's changes (%s) "
        "give to %s",
        member_id_, assigned->rank, assigned->generation, ChangesKey(assigned->generation),
        taker == nullptr ? "nobody new" : *taker));
  }
  Membership m;
  m.generation = assigned->generation;
  m.world_size = changes->world_size;
  m.rank = assigned->rank;
  AdoptGeneration(m);
  return m;
}

absl::StatusOr<Membership> RendezvousMember::AwaitGeneration(int64_t after,
                                                             absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // In the round trip of the wait: the newest generation (several may have been published
  // meanwhile: join the newest) and the changes since the one this member holds (usually one
  // generation's, the one waited for).
  const Membership held = Held();
  const bool follow = held.generation >= 0 && held.generation <= after &&
                      after + 1 - held.generation <= kMaxChangesRead;
  std::vector<std::string> keys = {kCurrentKey};
  for (int64_t g = held.generation + 1; follow && g <= after + 1; ++g) {
    keys.push_back(ChangesKey(g));
  }
  // Read already by the wait that saw the next generation appear (AwaitNewerGeneration), when it
  // is the generation waited for and its changes were there (a coordinator that writes none: as
  // below).
  std::optional<std::vector<std::optional<std::string>>> prefetched;
  {
    MutexLock lock(&mu_);
    if (prefetched_.has_value() && prefetched_->after == after && held.generation == after &&
        prefetched_->values.size() == keys.size() && prefetched_->values.back().has_value()) {
      prefetched = std::move(prefetched_->values);
    }
    prefetched_.reset();
  }
  absl::StatusOr<std::vector<std::optional<std::string>>> values =
      prefetched.has_value() ? *std::move(prefetched)
                             : store_->WaitAndRead({ChangesKey(after + 1)}, keys, timeout);
  if (!values.ok()) {
    return absl::Status(values.status().code(),
                        absl::StrFormat("member %s waiting for a generation after %d: %s",
                                        member_id_, after, std::string(values.status().message())));
  }
  int64_t newest = after + 1;
  if ((*values)[0].has_value() && !absl::SimpleAtoi(*(*values)[0], &newest)) {
    return absl::DataLossError(absl::StrFormat("malformed %s: '%s'", kCurrentKey, *(*values)[0]));
  }
  // The announcement comes after the changes: it may still name an older generation.
  newest = std::max(newest, after + 1);
  std::vector<std::optional<std::string>> changes(values->begin() + 1, values->end());
  if (follow && newest > after + 1 && newest - held.generation <= kMaxChangesRead) {
    std::vector<std::string> more;
    for (int64_t g = after + 2; g <= newest; ++g) more.push_back(ChangesKey(g));
    absl::StatusOr<std::vector<std::optional<std::string>>> rest =
        store_->MultiGet(more, Left(deadline));
    if (!rest.ok()) return rest.status();
    changes.insert(changes.end(), rest->begin(), rest->end());
  }
  std::optional<Membership> place;
  if (follow && static_cast<int64_t>(changes.size()) == newest - held.generation) {
    absl::StatusOr<std::optional<Membership>> followed = FollowChanges(held, changes);
    if (!followed.ok()) return followed.status();
    place = *std::move(followed);
  }
  if (!place.has_value()) {
    absl::StatusOr<Membership> from_table = PlaceFromTable(newest, Left(deadline));
    if (!from_table.ok()) return from_table.status();
    place = *std::move(from_table);
  }
  AdoptGeneration(*place);
  return *place;
}

absl::Status RendezvousMember::Barrier(const Membership& membership, std::string_view name,
                                       absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const absl::string_view barrier(name.data(), name.size());
  const std::string passed = store_keys::RdzvBarrierPassed(membership.generation, barrier);
  // A count, not a key per rank: the rank whose arrival completes it opens the barrier for all,
  // so that no rank waits on (or the store scans) the world size's keys.
  absl::StatusOr<int64_t> arrived =
      store_->Add(store_keys::RdzvBarrierArrived(membership.generation, barrier), 1, timeout);
  if (!arrived.ok()) return arrived.status();
  if (*arrived == membership.world_size) {
    return store_->Set(passed, absl::StrCat(membership.rank), Left(deadline));
  }
  if (absl::Status s = store_->Wait({passed}, Left(deadline)); !s.ok()) {
    return absl::Status(s.code(), absl::StrFormat("rank %d at barrier %s of generation %d (%d of "
                                                  "%d ranks arrived when it did): %s",
                                                  membership.rank, barrier, membership.generation,
                                                  *arrived, membership.world_size, s.message()));
  }
  return absl::OkStatus();
}

absl::Status RendezvousMember::RequestNewGeneration(const Membership& membership,
                                                    std::string_view why, absl::Duration timeout) {
  absl::Status s =
      store_->Set(absl::StrCat(RenewPrefix(membership.generation), membership.rank), why, timeout);
  // Fenced out: a newer generation is published already, which is what was asked for.
  if (absl::IsFailedPrecondition(s)) return absl::OkStatus();
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrFormat("rank %d asking for a generation after %d: %s", membership.rank,
                                  membership.generation, std::string(s.message())));
  }
  return s;
}

absl::StatusOr<std::string> RendezvousMember::AwaitAgreedKey(const Membership& membership,
                                                             const std::string& key,
                                                             const absl::Status& superseded,
                                                             absl::Time deadline) {
  // A rank that dies now may be the one to write `key`; the launcher then publishes the next
  // generation and marks `key` superseded. Wait in slices all the same and look for a newer
  // generation between them, should a coordinator have died before the mark.
  const std::string next_table = TableKey(membership.generation + 1);
  while (true) {
    absl::StatusOr<std::vector<std::optional<std::string>>> value =
        store_->WaitAndRead({key}, {key}, std::min(Left(deadline), kAgreementSlice));
    if (value.ok()) {
      if (!value->at(0).has_value()) {
        return absl::NotFoundError(absl::StrFormat("store key %s not found", key));
      }
      return *std::move(value->at(0));
    }
    const absl::Status& s = value.status();
    // Unavailable: the store did not answer in time (overloaded, or reconnecting): tried again
    // until the deadline, as a slice that ran out.
    if (!(absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s)) || absl::Now() >= deadline) {
      return absl::Status(
          s.code(),
          absl::StrFormat("rank %d agreeing on the resume step of generation %d: %s",
                          membership.rank, membership.generation, std::string(s.message())));
    }
    absl::StatusOr<std::vector<std::optional<std::string>>> newer =
        store_->MultiGet({next_table}, Left(deadline));
    if (newer.ok() && (*newer)[0].has_value()) return superseded;
  }
}

absl::StatusOr<RecoveryPlan> RendezvousMember::AgreeOnResume(const Membership& membership,
                                                             int64_t next_step,
                                                             absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::string prefix = store_keys::RdzvProgressPrefix(membership.generation);
  const std::string plan_key = store_keys::RdzvPlan(membership.generation);
  const absl::Status superseded = absl::AbortedError(
      absl::StrFormat("generation %d was superseded while rank %d was agreeing on its resume step",
                      membership.generation, membership.rank));
  // Its progress written and counted in one call (the count after the progress): the rank whose
  // count reaches the world size knows that every rank's is written, reads them (once, for all)
  // and publishes the plan; the others wait for it. Fenced out: the fence is already past it.
  absl::StatusOr<int64_t> counted =
      store_->SetAndAdd(absl::StrCat(prefix, membership.rank), absl::StrCat(next_step),
                        store_keys::RdzvAgreed(membership.generation), 1, timeout);
  if (absl::IsFailedPrecondition(counted.status())) return superseded;
  if (!counted.ok()) return counted.status();
  if (*counted != membership.world_size) {
    absl::StatusOr<std::string> value = AwaitAgreedKey(membership, plan_key, superseded, deadline);
    if (!value.ok()) return value.status();
    if (store_keys::IsSupersededPlan(*value)) return superseded;
    absl::StatusOr<RecoveryPlan> plan = store_keys::DecodeRecoveryPlan(*value);
    if (!plan.ok() || plan->generation != membership.generation) {
      return absl::DataLossError(absl::StrFormat("malformed plan '%s' at %s", *value, plan_key));
    }
    return plan;
  }
  std::vector<std::string> keys;
  for (int r = 0; r < membership.world_size; ++r) keys.push_back(absl::StrCat(prefix, r));
  absl::StatusOr<std::vector<std::optional<std::string>>> values =
      store_->MultiGet(keys, Left(deadline));
  if (!values.ok()) return values.status();
  RecoveryPlan plan;
  plan.generation = membership.generation;
  int64_t furthest = -1;
  for (int r = 0; r < membership.world_size; ++r) {
    int64_t step = -1;
    if (!(*values)[r].has_value() || !absl::SimpleAtoi(*(*values)[r], &step)) {
      return absl::DataLossError(absl::StrFormat(
          "malformed or missing progress of rank %d at %s%d (the count %s says every rank's is "
          "written)",
          r, prefix, r, store_keys::RdzvAgreed(membership.generation)));
    }
    if (step < 0) {
      plan.new_ranks.push_back(r);
    } else if (step > furthest) {
      furthest = step;
      plan.state_source_rank = r;
    }
  }
  plan.resume_step = std::max<int64_t>(furthest, 0);
  absl::Status s = store_->Set(plan_key, store_keys::EncodeRecoveryPlan(plan), Left(deadline));
  if (absl::IsFailedPrecondition(s)) return superseded;
  if (!s.ok()) return s;
  return plan;
}

RendezvousCoordinator::RendezvousCoordinator(Store* store, Clock* clock, std::string name,
                                             const CoordinatorLease* lease)
    : store_(store), clock_(clock), name_(std::move(name)), lease_(lease) {}

absl::Status RendezvousCoordinator::CheckLease() const {
  return lease_ == nullptr ? absl::OkStatus() : lease_->CheckHeld();
}

absl::Status RendezvousCoordinator::Resume(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<int64_t> newest = ReadNewestGeneration(store_, timeout);
  if (!newest.ok()) return newest.status();
  Membership held;
  {
    MutexLock lock(&mu_);
    if (*newest <= current_.generation) return absl::OkStatus();  // known already: no table read
    held = current_;
  }
  // Following: the changes since the generation it holds, O(ranks changed), where every host's
  // agent reading the whole table at each generation would cost the store O(world size x hosts).
  absl::StatusOr<Membership> next =
      FollowOrReadTable(store_, std::move(held), *newest, Left(deadline));
  if (!next.ok()) return next.status();
  MutexLock lock(&mu_);
  if (next->generation > current_.generation) current_ = *std::move(next);
  return absl::OkStatus();
}

absl::Status GenerationFollower::Follow(const std::vector<int>& own_ranks, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<int64_t> read_newest = ReadNewestGeneration(store_, timeout);
  if (!read_newest.ok()) return read_newest.status();
  const int64_t newest = *read_newest;
  if (newest <= current_.generation) return absl::OkStatus();
  Membership held = current_;
  if (held.generation < 0 && newest <= kMaxChangesRead) {
    // Generation 0 as this host needs it: its own ranks' registrations, and the world size.
    std::vector<std::string> keys = {ChangesKey(0)};
    for (int rank : own_ranks) keys.push_back(JoinKey(rank));
    absl::StatusOr<std::vector<std::optional<std::string>>> values =
        store_->MultiGet(keys, Left(deadline));
    if (!values.ok()) return values.status();
    bool complete = (*values)[0].has_value();
    if (complete) {
      absl::StatusOr<store_keys::GenerationChanges> zero =
          store_keys::DecodeGenerationChanges(*(*values)[0]);
      if (!zero.ok() || zero->generation != 0) {
        return absl::DataLossError(
            absl::StrFormat("malformed changes of generation 0 at store key %s", keys[0]));
      }
      held.generation = 0;
      held.world_size = zero->world_size;
      held.members.assign(zero->world_size, "");
      for (size_t i = 0; i < own_ranks.size(); ++i) {
        const std::optional<std::string>& member = (*values)[i + 1];
        if (!member.has_value() || own_ranks[i] < 0 || own_ranks[i] >= zero->world_size) {
          complete = false;  // not this generation 0's rank: the table says who holds what
          break;
        }
        held.members[own_ranks[i]] = *member;
      }
    }
    if (!complete) held = Membership();
  }
  absl::StatusOr<Membership> next =
      FollowOrReadTable(store_, std::move(held), newest, Left(deadline));
  if (!next.ok()) return next.status();
  current_ = *std::move(next);
  return absl::OkStatus();
}

absl::Status PublishResumed(Store* store, int64_t generation, int rank, int64_t step,
                            absl::Duration timeout) {
  // Counted only by the call that writes the key: one round trip on a TcpStore.
  return store
      ->CreateAndAdd(store_keys::Resumed(generation, rank), absl::StrCat(step),
                     store_keys::ResumedCount(generation), 1, timeout)
      .status();
}

Membership RendezvousCoordinator::current() const {
  MutexLock lock(&mu_);
  return current_;
}

int64_t RendezvousCoordinator::generation() const {
  MutexLock lock(&mu_);
  return current_.generation;
}

absl::StatusOr<Membership> RendezvousCoordinator::FormInitialGeneration(int world_size,
                                                                        absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(JoinKey(r));
  // The registrations are read in the round trip that finds them all.
  absl::StatusOr<std::vector<std::optional<std::string>>> members =
      store_->WaitAndRead(keys, keys, timeout);
  if (!members.ok()) {
    return absl::Status(members.status().code(),
                        absl::StrCat("forming generation 0: ", members.status().message()));
  }
  Membership m;
  m.generation = 0;
  m.world_size = world_size;
  for (const std::optional<std::string>& member : *members)
    m.members.push_back(member.value_or(""));
  return Publish(/*previous=*/Membership(), std::move(m), /*assignments=*/{}, Left(deadline));
}

absl::StatusOr<std::vector<int>> RendezvousCoordinator::RanksWithStaleHeartbeats(
    absl::Duration timeout, absl::Duration store_timeout) {
  int64_t generation = -1;
  std::shared_ptr<const std::vector<std::string>> keys;
  // With the store's ages, only the ranks whose beat is a quarter of the timeout old are read: a
  // live rank has beaten since, and a silent one is read at each call until it is stale.
  std::vector<size_t> due;
  bool by_age = false;
  {
    MutexLock lock(&mu_);
    // A new generation raised the fence: members still in the old one cannot beat until they
    // adopt it. Everyone gets a full timeout from the publication on.
    if (beats_generation_ != current_.generation || heartbeat_keys_ == nullptr) {
      auto built = std::make_shared<std::vector<std::string>>();
      built->reserve(current_.members.size());
      for (const std::string& member : current_.members) built->push_back(HeartbeatKey(member));
      heartbeat_keys_ = std::move(built);
      // From now: no rank is read before a quarter of its timeout has passed (with ages), so the
      // members taking their places are not met by a read of every rank's heartbeat.
      beats_.assign(current_.members.size(), Beat{"", clock_->MonotonicNanos()});
      beats_generation_ = current_.generation;
    }
    generation = beats_generation_;
    keys = heartbeat_keys_;
    by_age = ages_supported_ != false;
    if (by_age) {
      const int64_t now_ns = clock_->MonotonicNanos();
      const int64_t recheck_ns = absl::ToInt64Nanoseconds(timeout / 4);
      for (size_t r = 0; r < beats_.size(); ++r) {
        // Until the store has answered with ages once, every rank: the first call tells.
        if (!ages_supported_.has_value() || now_ns - beats_[r].since_ns >= recheck_ns) {
          due.push_back(r);
        }
      }
      if (due.empty()) return std::vector<int>();
    }
  }
  if (by_age) {
    std::vector<std::string> due_keys;
    due_keys.reserve(due.size());
    for (size_t r : due) due_keys.push_back((*keys)[r]);
    absl::StatusOr<std::vector<std::optional<Store::AgedValue>>> aged =
        store_->MultiGetWithAges(due_keys, store_timeout);
    if (aged.ok()) return JudgeAgedBeats(generation, due, *aged, timeout);
    if (!absl::IsUnimplemented(aged.status())) return aged.status();
    MutexLock lock(&mu_);
    ages_supported_ = false;  // this store keeps no write instants: every value, every call
  }
  absl::StatusOr<std::vector<std::optional<std::string>>> values =
      store_->MultiGet(*keys, store_timeout);
  if (!values.ok()) return values.status();
  const int64_t now_ns = clock_->MonotonicNanos();
  std::vector<int> stale;
  MutexLock lock(&mu_);
  // A generation published during the read: its ranks are judged from the next read on.
  if (beats_generation_ != generation) return stale;
  for (size_t r = 0; r < beats_.size() && r < values->size(); ++r) {
    const std::string_view value =
        (*values)[r].has_value() ? std::string_view(*(*values)[r]) : std::string_view();
    Beat& beat = beats_[r];
    if (!beat.read || beat.value != value) beat = Beat{std::string(value), now_ns, true};
    if (absl::Nanoseconds(now_ns - beat.since_ns) >= AllowedSilence(value, timeout)) {
      stale.push_back(static_cast<int>(r));
    }
  }
  return stale;
}

std::vector<int> RendezvousCoordinator::JudgeAgedBeats(
    int64_t generation, const std::vector<size_t>& ranks,
    const std::vector<std::optional<Store::AgedValue>>& aged, absl::Duration timeout) {
  // The instant the answer arrived: every age is measured back from it, so a deadline is never
  // early and late by at most the answer's way back.
  const int64_t read_ns = clock_->MonotonicNanos();
  std::vector<int> stale;
  MutexLock lock(&mu_);
  ages_supported_ = true;
  if (beats_generation_ != generation) return stale;
  for (size_t i = 0; i < ranks.size() && i < aged.size(); ++i) {
    Beat& beat = beats_[ranks[i]];
    const std::optional<Store::AgedValue>& read = aged[i];
    // From its last write as the store dates it, but not before the generation (a later answer's
    // estimate of the same write, earlier by its shorter way back, never moves it back).
    if (read.has_value()) {
      beat.since_ns = std::max(beat.since_ns, read_ns - absl::ToInt64Nanoseconds(read->age));
    }
    beat.value = read.has_value() ? read->value : std::string();
    beat.read = true;
    if (absl::Nanoseconds(read_ns - beat.since_ns) >= AllowedSilence(beat.value, timeout)) {
      stale.push_back(static_cast<int>(ranks[i]));
    }
  }
  return stale;
}

absl::StatusOr<std::vector<std::string>> RendezvousCoordinator::ParkedStandbys(
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<std::vector<std::string>> keys =
      store_->ListKeys(store_keys::kRdzvStandbyPrefix, timeout);
  if (!keys.ok()) return keys;
  absl::StatusOr<std::vector<std::optional<std::string>>> states =
      store_->MultiGet(*keys, Left(deadline));
  if (!states.ok()) return states.status();
  std::vector<std::string> parked;
  for (size_t i = 0; i < keys->size(); ++i) {
    if ((*states)[i] != kParked) continue;
    if (std::optional<std::string> member = store_keys::RdzvStandbyMember((*keys)[i]);
        member.has_value()) {
      parked.push_back(*std::move(member));
    }
  }
  return parked;
}

absl::StatusOr<std::map<int, std::string>> RendezvousCoordinator::NewGenerationRequests(
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // The generation and its size only: the loop asks at every turn, and the members (O(world size)
  // strings) are not needed.
  Membership current;
  {
    MutexLock lock(&mu_);
    current.generation = current_.generation;
    current.world_size = current_.world_size;
  }
  std::map<int, std::string> requests;
  if (current.generation < 0) return requests;
  const std::string prefix = RenewPrefix(current.generation);
  absl::StatusOr<std::vector<std::string>> keys = store_->ListKeys(prefix, timeout);
  if (!keys.ok()) return keys.status();
  if (keys->empty()) return requests;
  absl::StatusOr<std::vector<std::optional<std::string>>> reasons =
      store_->MultiGet(*keys, Left(deadline));
  if (!reasons.ok()) return reasons.status();
  for (size_t i = 0; i < keys->size(); ++i) {
    int rank = -1;
    // A key that is not a rank of this generation was not written by RequestNewGeneration.
    if (!absl::SimpleAtoi(absl::string_view((*keys)[i]).substr(prefix.size()), &rank) || rank < 0 ||
        rank >= current.world_size) {
      continue;
    }
    requests[rank] = (*reasons)[i].value_or("");
  }
  return requests;
}

absl::StatusOr<Membership> RendezvousCoordinator::RenewGeneration(absl::Duration timeout) {
  Membership previous;
  {
    MutexLock lock(&mu_);
    if (current_.generation < 0) {
      return absl::FailedPreconditionError(
          "cannot renew a generation before generation 0 is formed");
    }
    previous = current_;
  }
  Membership next = previous;
  next.generation += 1;
  return Publish(previous, std::move(next), /*assignments=*/{}, timeout);
}

absl::Status RendezvousCoordinator::ForgetStandby(const std::string& member_id,
                                                  absl::Duration timeout) {
  // Not gated by the lease: a standby's death is a fact, which the agent that saw it (the
  // standby's own, rarely the coordinator) records, and forgetting a dead standby can never make
  // another coordinator's decision wrong.
  return store_->Delete(StandbyKey(member_id), timeout).status();
}

absl::StatusOr<Membership> RendezvousCoordinator::ReplaceRank(int dead_rank,
                                                              absl::Duration timeout) {
  return ReplaceRanks({dead_rank}, /*preferred=*/{}, /*any_standby=*/true, timeout);
}

absl::StatusOr<Membership> RendezvousCoordinator::ReplaceRanks(
    const std::vector<int>& dead_ranks, const std::vector<std::string>& preferred,
    bool any_standby, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Membership previous;
  {
    MutexLock lock(&mu_);
    if (current_.generation < 0) {
      return absl::FailedPreconditionError("cannot replace a rank before generation 0 is formed");
    }
    previous = current_;
  }
  Membership next = previous;
  for (int rank : dead_ranks) {
    if (rank < 0 || rank >= next.world_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("rank %d is outside world size %d", rank, next.world_size));
    }
  }
  // The standbys' claims are this coordinator's first writes.
  if (absl::Status s = CheckLease(); !s.ok()) return s;
  std::map<std::string, int> assignments;
  std::vector<std::string> claimed_order;
  // Parks the claimed standbys again, so that a later attempt may use them.
  auto release_claimed = [&] {
    for (const std::string& standby : claimed_order) {
      (void)store_->CompareAndSet(StandbyKey(standby), std::string(kTaken), kParked,
                                  Left(deadline));
    }
  };
  // Claim standbys still parked, in order: compare-and-set, so one that was forgotten meanwhile (it
  // died) or already claimed is skipped. The preferred ones first; the others parked are read
  // (`any_standby`) only once those run out: a caller that chose its preferred standbys from a
  // read of its own (the launcher's backup placement) does not pay the store a second one.
  std::vector<std::string> candidates = preferred;
  bool others_read = !any_standby;
  size_t candidate = 0;
  for (int rank : dead_ranks) {
    bool found = false;
    while (!found) {
      if (candidate == candidates.size()) {
        if (others_read) break;
        others_read = true;
        absl::StatusOr<std::vector<std::string>> parked = ParkedStandbys(Left(deadline));
        if (!parked.ok()) {
          release_claimed();
          return parked.status();
        }
        for (const std::string& standby : *parked) {
          if (std::find(candidates.begin(), candidates.end(), standby) == candidates.end()) {
            candidates.push_back(standby);
          }
        }
        continue;
      }
      const std::string standby = candidates[candidate++];
      absl::StatusOr<CompareAndSetResult> claimed =
          store_->CompareAndSet(StandbyKey(standby), std::string(kParked), kTaken, Left(deadline));
      if (!claimed.ok()) return claimed.status();
      if (!claimed->swapped) continue;
      assignments[standby] = rank;
      claimed_order.push_back(standby);
      next.members[rank] = standby;
      found = true;
    }
    if (found) continue;
    // Not enough standbys.
    release_claimed();
    return absl::FailedPreconditionError(absl::StrFormat(
        "no standby is parked to replace rank%s %s of generation %d",
        dead_ranks.size() == 1 ? "" : "s", absl::StrJoin(dead_ranks, ","), next.generation));
  }
  if (absl::Status s = CheckLease(); !s.ok()) {
    // The lease lapsed while the standbys were claimed: they go back, parked, for the successor.
    release_claimed();
    return s;
  }
  next.generation += 1;
  return Publish(previous, std::move(next), assignments, Left(deadline));
}

absl::StatusOr<Membership> RendezvousCoordinator::Publish(
    const Membership& previous, Membership next, const std::map<std::string, int>& assignments,
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // The gate right before the claim, the publication's point of no return: once claimed, the
  // generation is completed whatever the lease does meanwhile, since a claim left without its table
  // would stop every later coordinator from publishing it.
  if (absl::Status s = CheckLease(); !s.ok()) return s;
  // The claim first: of two coordinators (one deposed but still acting), one publishes g.
  absl::StatusOr<CompareAndSetResult> claim =
      store_->CompareAndSet(ClaimKey(next.generation), std::nullopt, name_, timeout);
  if (!claim.ok()) return claim.status();
  // Our own claim: an earlier attempt of this publication that ran out of time after claiming.
  if (!claim->swapped && claim->current != name_) {
    (void)Resume(Left(deadline));
    return absl::AbortedError(absl::StrFormat("generation %d was published by %s, not by %s",
                                              next.generation, claim->current.value_or("?"),
                                              name_));
  }
  // The rest in one batch, applied by the store as one: nobody sees the new generation before all
  // of it is written (each standby's assignment; its table, which the ranks wait for; its changes,
  // from which they learn their place; the fence; the previous plan's mark; the announcement), and
  // a coordinator that dies here leaves all of it or none (its claim alone: a retry of its own
  // publication completes it). The ranks' wake-ups then never queue ahead of the publication's
  // last writes, and by the time anyone acts in the new generation the old one can no longer
  // write.
  std::vector<BatchWrite> writes;
  // The assignments first: the store wakes the waits on a batch's keys in the batch's order, and a
  // standby, which reads the generation's changes once woken, would otherwise have that read
  // queued behind the wake-ups of every rank (16,384 of them: 0.4 s on one core).
  for (const auto& [standby, rank] : assignments) {
    writes.push_back(
        BatchWrite::Set(AssignKey(standby), store_keys::EncodeAssignment({next.generation, rank})));
  }
  writes.push_back(BatchWrite::Set(TableKey(next.generation), EncodeTable(next)));
  // The ranks learn their place from the changes, and so do the coordinators and agents that hold
  // the generation before (Resume).
  writes.push_back(BatchWrite::Set(ChangesKey(next.generation),
                                   store_keys::EncodeGenerationChanges(ChangesOf(previous, next))));
  writes.push_back(BatchWrite::RaiseFence(next.generation));
  // Ranks of the generation before, still waiting for its plan (its computing rank died, or has yet
  // to write it and now cannot: fenced), leave for this one at once. Not written when the plan is
  // (the compare-and-set skips it).
  if (next.generation > 0) {
    writes.push_back(BatchWrite::CompareAndSet(store_keys::RdzvPlan(next.generation - 1),
                                               std::nullopt,
                                               store_keys::SupersededPlan(next.generation)));
  }
  writes.push_back(BatchWrite::Set(kCurrentKey, absl::StrCat(next.generation)));
  // Beyond what one batch holds (more than a hundred ranks replaced at once), the first standbys'
  // assignments go ahead in batches of their own: a standby woken by its assignment waits for the
  // generation's changes (ParkAsStandby).
  while (writes.size() > Store::kMaxBatchWrites) {
    const size_t ahead = std::min(writes.size() - Store::kMaxBatchWrites, Store::kMaxBatchWrites);
    const auto first = writes.begin();
    std::vector<BatchWrite> early(std::make_move_iterator(first),
                                  std::make_move_iterator(first + static_cast<ptrdiff_t>(ahead)));
    writes.erase(first, first + static_cast<ptrdiff_t>(ahead));
    if (absl::Status s = store_->WriteBatch(early, Left(deadline)).status(); !s.ok()) return s;
  }
  if (absl::Status s = store_->WriteBatch(writes, Left(deadline)).status(); !s.ok()) return s;
  MutexLock lock(&mu_);
  current_ = next;
  return next;
}

}  // namespace trainguard
