#include "sdk/coordinator/hang_coordinator.h"

#include <algorithm>
#include <iterator>
#include <utility>
#include <variant>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/store_keys.h"
#include "sdk/watchdog/hang_diagnosis.h"

namespace trainguard {

absl::Duration SilentHeartbeat(const HangCoordinatorOptions& options, int world_size) {
  return std::min(options.heartbeat_timeout,
                  std::max(options.silent_heartbeat, 2.5 * RankHeartbeatInterval(world_size)));
}

namespace {

// The rank a hang key's value names ("rank R: <report>", as the Runtime writes it), or -1.
int HangDeclarer(const std::string& who) {
  absl::StatusOr<store_keys::HangDeclaration> d = store_keys::DecodeHangDeclaration(who);
  return d.ok() ? d->rank : -1;
}

}  // namespace

HangCoordinator::HangCoordinator(Store* agents_store, Clock* clock, Env* env,
                                 const JobCoordinator* hosts, HangCoordinatorOptions options,
                                 Hooks hooks)
    : agents_store_(agents_store),
      clock_(clock),
      env_(env),
      hosts_(hosts),
      options_(std::move(options)),
      hooks_(std::move(hooks)),
      arbiter_(options_.arbiter),
      reader_(options_.dump_dir, env_, clock_, std::max(options_.read_threads, 1)) {}

void HangCoordinator::Reset(int64_t checked_below) {
  pending_.reset();
  // A restart counts generations from 0 again: what was seen resumed is the old incarnation's.
  resumed_generation_ = -1;
  resumed_.clear();
  checked_below_ = std::max<int64_t>(checked_below, 0);
}

absl::Time HangCoordinator::DumpsSince(int64_t generation) const {
  // A dump's time is its rank's wall clock: the clock is the real one wherever ranks write dumps.
  const absl::Time restarted = hooks_.restarted_at();
  auto withdrawn = withdrawn_at_.find(generation);
  return withdrawn == withdrawn_at_.end() ? restarted : std::max(restarted, withdrawn->second);
}

bool HangCoordinator::EveryRankResumed(int64_t generation) {
  if (generation != resumed_generation_) {
    resumed_generation_ = generation;
    resumed_.clear();
  }
  // A resumed key stays once written (a generation's keys are its own): a rank seen resumed is
  // not asked for again.
  std::vector<int> ranks;
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r) {
    if (resumed_.count(r) != 0) continue;
    ranks.push_back(r);
    keys.push_back(store_keys::Resumed(generation, r));
  }
  if (keys.empty()) return true;
  absl::StatusOr<std::vector<std::optional<std::string>>> values =
      ranks_store()->MultiGet(keys, options_.store_timeout);
  if (!values.ok()) return false;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if ((*values)[i].has_value()) resumed_.insert(ranks[i]);
  }
  return resumed_.size() == static_cast<size_t>(world_size_);
}

absl::StatusOr<bool> HangCoordinator::RefreshDumps(absl::Time deadline) {
  absl::StatusOr<std::vector<std::string>> names = env_->GetChildren(options_.dump_dir);
  if (!names.ok()) return names.status();
  size_t listed_known = 0;  // the names listed that known_dumps_ holds
  // The dumps listed and not read yet, in the listing's order, and their numbers.
  std::vector<HangDumpReader::Dump> unread;
  std::vector<int64_t> numbers;
  for (const std::string& name : *names) {
    std::optional<std::pair<int, int64_t>> parsed = ParseDumpName(name);
    if (!parsed.has_value()) continue;
    if (known_dumps_.count(name) != 0) {
      ++listed_known;
      continue;
    }
    HangDumpReader::Dump& dump = unread.emplace_back();
    dump.name = name;
    dump.rank = parsed->first;
    numbers.push_back(parsed->second);
  }
  if (!unread.empty()) {
    // The names listed, gathered only when a dump not read yet is listed: its digest's name among
    // them.
    const absl::flat_hash_set<absl::string_view> listed(names->begin(), names->end());
    for (HangDumpReader::Dump& dump : unread) {
      dump.digest_listed = listed.contains(HangDumpDigestPath(dump.name));
    }
  }
  const size_t taken = reader_.Read(unread, deadline);
  for (size_t i = 0; i < taken; ++i) {
    HangDumpReader::Dump& dump = unread[i];
    // Vanished between the listing and the read (a run dir cleaned up), or not readable now:
    // looked for again. One that is no flight recorder dump is not read again.
    if (dump.outcome == HangDumpReader::Dump::Outcome::kUnreadable) continue;
    KnownDump& known = known_dumps_[dump.name];
    known.number = numbers[i];
    known.digest = std::move(dump.digest);
    ++listed_known;
  }
  const bool read_all = taken == unread.size();  // else the next poll goes on
  // A dump removed (a run dir cleaned up) is forgotten. Every poll lists the dir, and a job of
  // thousands of ranks has thousands of dumps: the names are gathered again only then.
  if (listed_known != known_dumps_.size()) {
    const std::set<std::string> present(names->begin(), names->end());
    for (auto it = known_dumps_.begin(); it != known_dumps_.end();) {
      it = present.count(it->first) == 0 ? known_dumps_.erase(it) : std::next(it);
    }
  }
  return read_all;
}

absl::StatusOr<std::vector<const HangDumpDigest*>> HangCoordinator::DumpsOf(
    int64_t generation) const {
  std::map<int, const KnownDump*> newest;  // by rank
  for (const auto& [name, known] : known_dumps_) {
    if (!known.digest.has_value() || known.digest->generation != generation) continue;
    const KnownDump*& kept = newest[known.digest->rank];
    if (kept == nullptr || kept->number < known.number) kept = &known;
  }
  if (newest.empty()) {
    return absl::NotFoundError(absl::StrCat("no flight recorder dump of generation ", generation,
                                            " in ", options_.dump_dir));
  }
  std::vector<const HangDumpDigest*> dumps;
  dumps.reserve(newest.size());
  for (const auto& [rank, known] : newest) dumps.push_back(&*known->digest);
  return dumps;
}

absl::StatusOr<std::string> HangCoordinator::SupersededHang(int64_t generation,
                                                            absl::Time deadline) {
  // Called every poll while a superseded generation is watched: each dump is read once
  // (RefreshDumps).
  absl::StatusOr<bool> read_all = RefreshDumps(deadline);
  if (!read_all.ok()) return read_all.status();
  for (const auto& [name, known] : known_dumps_) {
    if (!known.digest.has_value()) continue;
    const HangDumpDigest& d = *known.digest;
    // Dumps written before a restart (--restart-all) are an earlier incarnation's. Of another
    // host's rank nothing could be done once its generation moved on.
    if (d.generation != generation || !absl::StartsWith(d.reason, "hang: ") ||
        d.dumped_at < DumpsSince(generation) || !Holder(d.rank).here) {
      continue;
    }
    return store_keys::EncodeHangDeclaration(
        {d.rank, absl::StrFormat("%s (its dump; generation %d was superseded before it could "
                                 "publish the hang)",
                                 d.reason.substr(6), generation)});
  }
  if (!*read_all) {
    // Not NotFound: a generation whose hang may be in a dump not read yet is not settled.
    return absl::UnavailableError(
        absl::StrCat("dumps of generation ", generation, " remain to be read"));
  }
  return absl::NotFoundError(absl::StrCat("no hang dump of generation ", generation));
}

bool HangCoordinator::FindHang(absl::Time now) {
  const int64_t current = rendezvous()->generation();
  // A generation superseded by the next may still hang: its ranks wait in its collectives until
  // their bounds run out, and publish the hang then. It has none left to publish once every rank
  // completed a step of a later one (read before its key, so that a hang published meanwhile is
  // seen).
  const bool superseded = checked_below_ < current && EveryRankResumed(current);
  for (int64_t g = checked_below_; g <= current; ++g) {
    absl::StatusOr<std::string> who =
        ranks_store()->Get(store_keys::Hang(g), absl::Milliseconds(200));
    if (absl::IsNotFound(who.status()) && g < current) {
      who = SupersededHang(g, now + options_.dump_read_budget);
    }
    if (!who.ok()) {
      if (absl::IsNotFound(who.status()) && g < current && superseded) checked_below_ = g + 1;
      continue;
    }
    if (!coordinating()) return false;
    // Announced once the arbiter knows what it is (HangArbiter::Headline), or before it is acted
    // on: a hang that is withdrawn, or explained by a death, is a line of its own.
    PendingHang hang{g, now, hooks_.live_rings(), {}, {}, HangDeclarer(*who), false, {}, *who,
                     false, {}, {}, {}};
    const Membership membership = rendezvous()->current();
    if (membership.generation == g) {
      for (const std::string& member : membership.members) {
        const std::string host = store_keys::MemberHost(member);
        hang.hosts.insert(host);
        if (hosts_->dead_hosts().count(host) != 0) hang.dead_when_seen.insert(host);
      }
    }
    pending_ = std::move(hang);
    // A rank seen stopped (here, or by its agent) is replaced before the dumps are read: parsing
    // every dump in the run's flight_recorder folder takes tens of milliseconds on a busy machine,
    // and a PyTorch rank's dump is a few hundred kilobytes.
    std::set<int> stopped;
    std::set<int> elsewhere;
    for (int r = 0; r < world_size_; ++r) {
      const LocalHolder holder = Holder(r);
      if (!holder.here) {
        elsewhere.insert(r);
      } else if (holder.running && holder.stopped && holder.rank_generation <= g) {
        stopped.insert(r);
      }
    }
    if (!elsewhere.empty() && membership.generation == g) {
      for (const auto& [rank, member] :
           StoppedMembers(agents_store_, membership, options_.store_timeout)
               .value_or(std::map<int, std::string>())) {
        if (elsewhere.count(rank) == 0) continue;
        stopped.insert(rank);
        pending_->agent_stopped.insert(rank);
        Announce();
        hooks_.say(absl::StrCat("hang diagnosis: rank ", rank, " (", member,
                                ") is stopped, its agent says: it will not dump"));
      }
    }
    ReplaceStoppedRanksNow(stopped, /*through_agents=*/!elsewhere.empty());
    return true;
  }
  return false;
}

HangCoordinator::Seen HangCoordinator::Observe(
    const absl::StatusOr<std::vector<const HangDumpDigest*>>& dumps) {
  Seen seen;
  // Not running: stopped, sending no heartbeat, or replaced already for being stopped.
  seen.not_running = pending_->replaced;
  std::map<int, LocalHolder> here;
  std::set<int> elsewhere;
  for (int rank = 0; rank < world_size_; ++rank) {
    LocalHolder holder = Holder(rank);
    if (holder.here) {
      here[rank] = std::move(holder);
    } else {
      elsewhere.insert(rank);
    }
  }
  seen.through_agents = !elsewhere.empty();
  if (!dumps.ok()) return seen;
  for (const HangDumpDigest* d : *dumps) seen.dumped.insert(d->rank);
  const int64_t g = pending_->generation;
  for (const auto& [rank, holder] : here) {
    // A rank of this host whose process is stopped will never dump, and neither will one that no
    // process of the hung generation holds any more (it died; its replacement, if any, took it in
    // a later generation and watches that one).
    if (seen.dumped.count(rank) != 0) continue;
    if (holder.running && holder.stopped && holder.rank_generation <= g) {
      seen.not_running.insert(rank);
      seen.stopped.insert(rank);
    } else if (!holder.running || holder.rank_generation > g) {
      seen.no_longer_held.insert(rank);
    }
  }
  if (elsewhere.empty() || rendezvous()->generation() != g) return seen;
  // Other hosts' processes are out of sight, but every rank's heartbeat thread writes to the store
  // every heartbeat_interval_ms (by default RankHeartbeatInterval of the job's size: 1 s up to
  // 4,096 ranks) while the process runs, hung training thread or not: a rank whose heartbeat stood
  // still for silent_heartbeat (and at least two and a half of its periods) is stopped or frozen
  // whole, and will not dump either.
  const absl::Duration still =
      SilentHeartbeat(options_, static_cast<int>(rendezvous()->current().members.size()));
  absl::StatusOr<std::vector<int>> quiet =
      rendezvous()->RanksWithStaleHeartbeats(still, options_.store_timeout);
  if (quiet.ok()) {
    for (int rank : *quiet) {
      if (elsewhere.count(rank) == 0 || seen.dumped.count(rank) != 0) continue;
      seen.not_running.insert(rank);
      if (pending_->heartbeat_silent.insert(rank).second) {
        Announce();
        hooks_.say(absl::StrFormat(
            "hang diagnosis: rank %d has sent no heartbeat for %s: it will not dump", rank,
            absl::FormatDuration(still)));
      }
    }
  }
  // Sooner: the agent of a stopped rank's host sees it stopped (HostAgent::ReportStoppedWorkers),
  // so the diagnosis need not wait for its heartbeat to go stale.
  for (const auto& [rank, member] :
       StoppedMembers(agents_store_, rendezvous()->current(), options_.store_timeout)
           .value_or(std::map<int, std::string>())) {
    if (elsewhere.count(rank) == 0 || seen.dumped.count(rank) != 0) continue;
    seen.not_running.insert(rank);
    seen.stopped.insert(rank);
    if (pending_->agent_stopped.insert(rank).second) {
      Announce();
      hooks_.say(absl::StrCat("hang diagnosis: rank ", rank, " (", member,
                              ") is stopped, its agent says: it will not dump"));
    }
  }
  return seen;
}

bool HangCoordinator::HoldOff(absl::Time now) {
  PendingHang& hang = *pending_;
  if (hang.hosts.empty()) return false;
  for (const std::string& host : hang.hosts) {
    if (hosts_->dead_hosts().count(host) == 0 || hang.dead_when_seen.count(host) != 0) continue;
    // The survivors waited in a collective for ranks whose host is gone; their replacements are
    // the recovery (the host's death queued them), and the dumps of the cut-off ranks, which a
    // shared run dir may still hold, say nothing of who else is at fault.
    if (!coordinating()) return true;
    hooks_.say(absl::StrCat("hang in generation ", hang.generation, " explained by the loss of host ",
                            host, " (its ranks' replacements take over): ", hang.declaration));
    checked_below_ = hang.generation + 1;
    pending_.reset();
    return true;
  }
  if (hang.hold_off_over) return false;
  std::vector<HostLiveness::Silent> quiet;
  for (HostLiveness::Silent& silent : hosts_->HostsQuietFor(options_.host_quiet, now)) {
    if (hang.hosts.count(silent.host) != 0) quiet.push_back(std::move(silent));
  }
  // A view of the hosts younger than the quiet time (this agent just took the lease over, or its
  // reads had a gap) cannot tell a host cut off before it from a live one yet: wait that long.
  const bool young_view = now - hosts_->HostBoundsSince() < options_.host_quiet;
  if (quiet.empty() && !young_view) return false;
  hang.held_off_since = std::min(hang.held_off_since, now);
  if (now - hang.held_off_since >= options_.max_hold_off) {
    hang.hold_off_over = true;
    if (coordinating()) {
      hooks_.say(absl::StrFormat("hang diagnosis: held off for %s: diagnosing without the silent "
                                 "host(s)",
                                 absl::FormatDuration(options_.max_hold_off)));
    }
    return false;
  }
  for (const HostLiveness::Silent& silent : quiet) {
    if (!hang.held_off_by.insert(silent.host).second || !coordinating()) continue;
    Announce();
    hooks_.say(absl::StrFormat(
        "hang diagnosis: host %s has sent no heartbeat for %s: the diagnosis waits until it beats "
        "again or is declared dead",
        silent.host, absl::FormatDuration(absl::Trunc(silent.silent_for, absl::Milliseconds(1)))));
  }
  return true;
}

// Watches for a hang a rank published, then reads every rank's dump of it (and the live rings of
// ranks that wrote none, as they were when the hang was seen) and names the suspects
// (hang_diagnosis.h): the rank that never entered the collective, or that entered it and stalled
// there while the others wait.
void HangCoordinator::Poll() {
  const absl::Time now = clock_->Now();
  if (now < next_check_) return;
  next_check_ = now + options_.poll_interval;
  if (!pending_.has_value() && !FindHang(now)) return;
  if (!pending_.has_value()) return;
  absl::StatusOr<bool> read_all = RefreshDumps(now + options_.dump_read_budget);
  // The dumps not read yet are read at the next polls: nothing is decided on part of them.
  if (read_all.ok() && !*read_all) return;
  absl::StatusOr<std::vector<const HangDumpDigest*>> dumps =
      read_all.ok() ? DumpsOf(pending_->generation) : read_all.status();
  // After a restart (--restart-all) generations count from 0 again, and the run dir still holds
  // the old processes' dumps of the same generation numbers: they are not this hang's evidence.
  // So are the dumps of an earlier hang of this generation, withdrawn.
  if (dumps.ok()) {
    const absl::Time since = DumpsSince(pending_->generation);
    dumps->erase(std::remove_if(dumps->begin(), dumps->end(),
                                [&](const HangDumpDigest* d) { return d->dumped_at < since; }),
                 dumps->end());
  }
  Seen seen = Observe(dumps);
  if (!coordinating()) return;  // the dumps and the store were read: the diagnosis is acted on below
  ReplaceStoppedRanksNow(seen.stopped, seen.through_agents);
  if (HoldOff(now)) return;
  HangObservations observed;
  observed.generation = pending_->generation;
  observed.seen = pending_->seen;
  observed.world_size = world_size_;
  observed.dumped = seen.dumped;
  observed.not_running = seen.not_running;
  observed.no_longer_held = seen.no_longer_held;
  observed.declarer = pending_->declarer;
  if (pending_->aborted) observed.verdict = HangVerdict{HangVerdict::Kind::kAborted, {}};
  HangArbiter::Action action = arbiter_.Decide(observed, now);
  if (std::holds_alternative<HangArbiter::ReadVerdict>(action)) {
    absl::StatusOr<std::vector<std::optional<std::string>>> verdict = ranks_store()->MultiGet(
        {store_keys::HangAborted(pending_->generation, pending_->declarer),
         store_keys::HangWithdrawn(pending_->generation, pending_->declarer)},
        options_.store_timeout);
    observed.verdict = HangVerdict{};
    if (verdict.ok() && (*verdict)[0].has_value()) {
      pending_->aborted = true;
      observed.verdict->kind = HangVerdict::Kind::kAborted;
    } else if (verdict.ok() && (*verdict)[1].has_value()) {
      observed.verdict->kind = HangVerdict::Kind::kWithdrawn;
      observed.verdict->withdrawal = *(*verdict)[1];
    }
    action = arbiter_.Decide(observed, now);
  }
  if (std::holds_alternative<HangArbiter::Wait>(action) || !coordinating()) return;
  if (const auto* withdraw = std::get_if<HangArbiter::Withdraw>(&action)) {
    hooks_.say(withdraw->message);
    // A later hang of this generation is a new one: its key, its dumps.
    (void)ranks_store()->Delete(store_keys::Hang(pending_->generation), options_.store_timeout);
    (void)ranks_store()->Delete(
        store_keys::HangWithdrawn(pending_->generation, pending_->declarer),
        options_.store_timeout);
    withdrawn_at_[pending_->generation] = clock_->Now();
    pending_.reset();
    return;
  }
  std::vector<HangDumpDigest> evidence;
  if (dumps.ok()) {
    evidence.reserve(dumps->size());
    for (const HangDumpDigest* d : *dumps) evidence.push_back(*d);
  }
  HangDiagnosis diagnosis = DiagnoseHang(evidence, pending_->live_rings, world_size_);
  const HangArbiter::Headline headline =
      arbiter_.Announce(observed, diagnosis.suspects, pending_->declaration);
  if (headline.explained_by_death) {
    hooks_.say(headline.line);
    checked_below_ = pending_->generation + 1;
    pending_.reset();
    return;
  }
  Announce();
  const HangArbiter::SuspectReplacement replacement = arbiter_.SuspectsToReplace(
      diagnosis.suspects, seen.not_running, pending_->replaced, seen.through_agents);
  if (!replacement.narrowed.empty()) hooks_.say(replacement.narrowed);
  diagnosis.suspects = replacement.suspects;
  for (absl::string_view line : absl::StrSplit(diagnosis.ToString(), '\n')) {
    hooks_.say(absl::StrCat("hang diagnosis: ", line));
  }
  const int64_t generation = pending_->generation;
  checked_below_ = generation + 1;
  pending_.reset();
  if (!replacement.replaced_already.empty()) hooks_.say(replacement.replaced_already);
  ReplaceSuspects(replacement.replace, generation, seen.not_running);
}

// A rank whose process is stopped (SIGSTOP: state T; of another host, its agent says so) makes no
// progress whatever the dumps will say, and writes none itself: it is replaced now, not once the
// other ranks' dumps are in, which takes a while per PyTorch rank (docs/PERFORMANCE.md). The
// diagnosis still follows when they are, and replaces no one else.
void HangCoordinator::ReplaceStoppedRanksNow(const std::set<int>& stopped, bool through_agents) {
  const HangArbiter::StoppedReplacement now =
      arbiter_.StoppedToReplaceNow(stopped, pending_->replaced, world_size_, through_agents);
  if (now.ranks.empty() || !coordinating()) return;
  Announce();
  hooks_.say(now.message);
  for (int rank : now.ranks) KillSuspect(rank, pending_->generation, /*stopped=*/true);
  pending_->replaced = now.ranks;
}

void HangCoordinator::Announce() {
  if (pending_->announced) return;
  hooks_.say(HangArbiter::Declared(pending_->generation, pending_->declaration));
  pending_->announced = true;
}

void HangCoordinator::ReplaceSuspects(const std::vector<int>& suspects, int64_t generation,
                                      const std::set<int>& not_running) {
  if (suspects.empty()) return;
  // A suspect named by the dumps alone is replaced only as a minority: the evidence is the others'
  // view, and half the job waiting on the other half says nothing of which half is at fault. A
  // suspect that is not running (stopped, silent) is at fault whatever the count, as long as some
  // rank is not a suspect.
  const bool all_not_running = std::all_of(suspects.begin(), suspects.end(), [&](int rank) {
    return not_running.count(rank) != 0;
  });
  if (2 * suspects.size() >= static_cast<size_t>(world_size_) &&
      !(all_not_running && suspects.size() < static_cast<size_t>(world_size_))) {
    hooks_.say("hang diagnosis: too many suspects to replace; the ranks' own timeouts decide");
    return;
  }
  for (int rank : suspects) KillSuspect(rank, generation, /*stopped=*/false);
}

void HangCoordinator::KillSuspect(int rank, int64_t generation, bool stopped) {
  if (!coordinating()) return;
  const LocalHolder holder = Holder(rank);
  if (!holder.here) {
    // Another host's rank: only the coordinator's view of it is at hand, so the generation must
    // not have moved on (its member then holds the rank in the hung generation).
    const Membership current = rendezvous()->current();
    if (current.generation != generation || rank >= static_cast<int>(current.members.size())) {
      return;
    }
    if (stopped) {
      hooks_.kill_and_replace_stopped(rank, current.members[rank], EventKind::kHangSuspect,
                                      "the hang's suspect, stopped (its agent says)");
    } else {
      hooks_.kill_member(current.members[rank], EventKind::kHangSuspect, "the hang's suspect");
    }
    return;
  }
  // This host's rank, known per process: a hang is often overtaken by another fault (a rank dies
  // while the others wait for the hung one), and the new generation then waits for the hung
  // process, which never joins, until its heartbeat runs out unless it is killed here.
  if (!holder.running) return;
  if (holder.rank_generation > generation) {
    hooks_.say(absl::StrFormat("%s (pid %d) took rank %d after generation %d hung: not its hang",
                               holder.label, holder.pid, rank, generation));
    return;
  }
  const int64_t current = rendezvous()->generation();
  if (current != generation &&
      ranks_store()->Get(store_keys::Resumed(current, rank), options_.store_timeout).ok()) {
    hooks_.say(absl::StrFormat("%s (pid %d) has trained in generation %d since: not hung",
                               holder.label, holder.pid, current));
    return;
  }
  hooks_.say(absl::StrFormat("%s (pid %d) is the hang's suspect: killing it", holder.label,
                             holder.pid));
  hooks_.kill_local(rank, generation);
}

}  // namespace trainguard
