#include "sdk/coordinator/job_coordinator.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "sdk/core/agent_keys.h"
#include "trainguard/membership.h"

namespace trainguard {
namespace {

// How old a host's heartbeat is when the coordinator reads it again (with ages): a quarter of the
// host timeout, below the third the hang's diagnosis and the rank watch ask HostsQuietFor about, so
// that a live host (beating every twelfth) is seen to beat again before it would count as quiet.
absl::Duration HostRecheck(absl::Duration host_timeout) { return host_timeout / 4; }

}  // namespace

JobCoordinator::JobCoordinator(Store* store, Clock* clock, RendezvousCoordinator* rendezvous,
                               ReplacementPolicy* replacement_policy, RenewalPolicy* renewal_policy,
                               FailureHistory* failures, JobCoordinatorOptions options, Hooks hooks)
    : store_(store),
      clock_(clock),
      rendezvous_(rendezvous),
      replacement_policy_(replacement_policy),
      renewal_policy_(renewal_policy),
      failures_(failures),
      options_(std::move(options)),
      hooks_(std::move(hooks)),
      host_liveness_(options_.host_timeout, HostRecheck(options_.host_timeout)) {}

void JobCoordinator::CoordinateHosts() {
  const absl::Duration timeout = options_.call_timeout;
  if (done_published_) return;
  bool answered = ReadHostsByAge(/*tick=*/true);
  // The store keeps no write instants (etcd): every watched host's heartbeat value at every tick.
  if (ages_unsupported_) answered = ReadHostsByValue();
  // The store did not answer (or every rank finished): the rest waits for the next tick.
  if (!answered || done_published_) return;
  ReadDeathReports();
  // Completion: every rank finished with status 0.
  if (!done_published_ && world_size_ > 0) {
    absl::StatusOr<std::vector<std::string>> finished =
        store_->ListKeys(store_keys::AgentFinishedPrefix(round_), timeout);
    if (finished.ok() && finished->size() >= static_cast<size_t>(world_size_) && coordinating()) {
      done_published_ = store_->Set(store_keys::kJobDone, "every rank finished", timeout).ok();
    }
  }
}

bool JobCoordinator::ReadHostsByValue() {
  const absl::Duration timeout = options_.call_timeout;
  // Host liveness: every joined host's agent beats; one that stops for host_timeout is dead. An
  // agent that left (the job ended for it) beats no more, and once every rank finished nobody is
  // replaced.
  if (!ListHosts()) return false;
  std::vector<std::string> hosts(watched_hosts_.begin(), watched_hosts_.end()), beat_keys;
  for (const std::string& host : hosts) beat_keys.push_back(store_keys::kAgentHeartbeats.Key(host));
  absl::StatusOr<std::vector<std::optional<std::string>>> beats =
      store_->MultiGet(beat_keys, timeout);
  if (!beats.ok()) return false;
  // A gap in this coordinator's reads (the store was unavailable to it, or it was stalled) gives
  // every host a fresh bound (HostLiveness).
  std::map<std::string, std::string> host_beats;
  for (size_t i = 0; i < hosts.size(); ++i) host_beats[hosts[i]] = (*beats)[i].value_or("");
  if (!coordinating()) return true;
  for (const HostLiveness::Silent& silent : host_liveness_.Observe(host_beats, clock_->Now())) {
    DeclareSilentHostDead(silent);
  }
  return true;
}

bool JobCoordinator::ListHosts() {
  const absl::Duration timeout = options_.call_timeout;
  absl::StatusOr<std::vector<std::string>> joined =
      store_->ListKeys(store_keys::kAgentJoins.prefix(), timeout);
  absl::StatusOr<std::vector<std::string>> left =
      store_->ListKeys(store_keys::kAgentsLeft.prefix(), timeout);
  if (!joined.ok() || !left.ok() || done_published_) return false;
  const std::vector<std::string> left_names = store_keys::kAgentsLeft.Names(*left);
  const std::set<std::string> left_hosts(left_names.begin(), left_names.end());
  // This agent's own host is alive while it runs this.
  watched_hosts_.clear();
  for (std::string& host : store_keys::kAgentJoins.Names(*joined)) {
    if (host == options_.host_id || dead_hosts_.count(host) != 0 || left_hosts.count(host) != 0) {
      continue;
    }
    watched_hosts_.insert(std::move(host));
  }
  hosts_listed_at_ = clock_->Now();
  return true;
}

bool JobCoordinator::ReadHostsByAge(bool tick) {
  const absl::Time now = clock_->Now();
  // The hosts to read: those never read (just joined; every host after a takeover), and those
  // whose heartbeat is old enough that a live host has beaten since (HostLiveness::DueForRead).
  std::set<std::string> hosts;
  for (const std::string& host : watched_hosts_) {
    if (!host_liveness_.Knows(host)) hosts.insert(host);
  }
  for (std::string& host : host_liveness_.DueForRead(now)) {
    if (watched_hosts_.count(host) != 0 && dead_hosts_.count(host) == 0) {
      hosts.insert(std::move(host));
    }
  }
  // Between ticks a read only when some host is due; at a tick always, with the counts of the
  // joins and departures (one request): the read that tells HostLiveness the store answers.
  if (!tick && hosts.empty()) return true;
  std::vector<std::string> keys;
  if (tick) keys = {store_keys::kAgentJoinCount, store_keys::kAgentLeftCount};
  const size_t first_beat = keys.size();
  for (const std::string& host : hosts) keys.push_back(store_keys::kAgentHeartbeats.Key(host));
  absl::StatusOr<std::vector<std::optional<Store::AgedValue>>> aged =
      store_->MultiGetWithAges(keys, options_.call_timeout);
  if (absl::IsUnimplemented(aged.status())) {
    ages_unsupported_ = true;  // CoordinateHosts falls back to the values
    return false;
  }
  if (!aged.ok()) return false;
  // The instant the answer arrived: every age is measured back from it.
  const absl::Time read_at = clock_->Now();
  bool listed = false;
  if (tick) {
    // The joins and departures are listed again only when their counts changed (each record is
    // written before it is counted, so every record a count includes is listed), and once per
    // host timeout whatever the counts say.
    const std::string joins = (*aged)[0].has_value() ? (*aged)[0]->value : "";
    const std::string lefts = (*aged)[1].has_value() ? (*aged)[1]->value : "";
    if (joins != join_count_listed_ || lefts != left_count_listed_ ||
        read_at - hosts_listed_at_ >= options_.host_timeout) {
      listed = ListHosts();
      if (listed) {
        join_count_listed_ = joins;
        left_count_listed_ = lefts;
      }
    }
    if (done_published_) return true;
  }
  // Hosts new to the list (neither known nor in this read) are read at once after it: a second
  // request, only when some joined; their full bound starts at that read.
  const bool joined =
      listed &&
      std::any_of(watched_hosts_.begin(), watched_hosts_.end(), [&](const std::string& host) {
        return !host_liveness_.Knows(host) && hosts.count(host) == 0;
      });
  ObserveAgedBeats(hosts, *aged, first_beat, read_at);
  return joined ? ReadHostsByAge(/*tick=*/false) : true;
}

void JobCoordinator::ObserveAgedBeats(const std::set<std::string>& hosts,
                                      const std::vector<std::optional<Store::AgedValue>>& aged,
                                      size_t first_beat, absl::Time read_at) {
  std::map<std::string, std::optional<absl::Duration>> ages;
  size_t i = first_beat;
  for (const std::string& host : hosts) {
    const std::optional<Store::AgedValue>& beat = aged[i++];
    // Gone from the job meanwhile (left, declared dead): no longer judged.
    if (watched_hosts_.count(host) == 0 || dead_hosts_.count(host) != 0) continue;
    ages[host] = beat.has_value() ? std::optional<absl::Duration>(beat->age) : std::nullopt;
  }
  if (!coordinating()) return;
  for (const HostLiveness::Silent& silent : host_liveness_.ObserveAges(ages, read_at)) {
    DeclareSilentHostDead(silent);
  }
}

void JobCoordinator::DeclareSilentHostDead(const HostLiveness::Silent& silent) {
  DeclareHostDead(silent.host, silent.since,
                  absl::StrFormat("no heartbeat for %s", absl::FormatDuration(silent.silent_for)));
}

void JobCoordinator::CoordinateBetweenTicks() {
  if (done_published_) return;
  ReadDeathReports();
  if (!ages_unsupported_) {
    (void)ReadHostsByAge(/*tick=*/false);
    return;
  }
  const absl::Time now = clock_->Now();
  std::vector<std::string> hosts, beat_keys;
  for (const HostLiveness::Silent& quiet :
       host_liveness_.QuietFor(options_.host_timeout / 2, now)) {
    if (watched_hosts_.count(quiet.host) == 0 || dead_hosts_.count(quiet.host) != 0) continue;
    hosts.push_back(quiet.host);
    beat_keys.push_back(store_keys::kAgentHeartbeats.Key(quiet.host));
  }
  if (hosts.empty()) return;
  absl::StatusOr<std::vector<std::optional<std::string>>> beats =
      store_->MultiGet(beat_keys, options_.call_timeout);
  if (!beats.ok()) return;
  std::map<std::string, std::string> host_beats;
  for (size_t i = 0; i < hosts.size(); ++i) host_beats[hosts[i]] = (*beats)[i].value_or("");
  if (!coordinating()) return;
  // The instant of the read, not of the call's start: HostLiveness judges the beats as read then.
  for (const HostLiveness::Silent& silent : host_liveness_.Observe(host_beats, clock_->Now())) {
    DeclareSilentHostDead(silent);
  }
}

void JobCoordinator::ReadDeathReports() {
  const absl::Duration timeout = options_.call_timeout;
  absl::StatusOr<std::vector<std::string>> keys =
      store_->ListKeys(store_keys::kAgentDeaths.prefix(), timeout);
  if (!keys.ok()) return;
  const Membership current = rendezvous_->current();
  for (const std::string& member : store_keys::kAgentDeaths.Names(*keys)) {
    if (handled_deaths_.count(member) != 0) continue;
    const std::string key = store_keys::kAgentDeaths.Key(member);
    absl::StatusOr<std::string> value = store_->Get(key, timeout);
    if (!value.ok()) continue;
    if (!coordinating()) return;
    // A report that does not decode still says that the member died: its text is the how.
    const absl::StatusOr<store_keys::DeathReport> report =
        store_keys::DecodeDeathReport(key, *value);
    ReportedDeath death{member, -1, *value, ""};
    if (report.ok()) {
      death.rank = report->rank;
      death.how = report->how;
      death.cause = report->cause;
    }
    failures_->Record({report.ok() ? absl::StrFormat("rank %d (%s)", report->rank, member) : member,
                       death.how, death.cause});
    // Once per member, whatever the strategy makes of it.
    handled_deaths_.insert(member);
    if (!strategy_->OnDeathReported(death, current)) return;
  }
}

bool JobCoordinator::QueueReportedDeath(const ReportedDeath& death, const Membership& current) {
  if (current.generation < 0) {
    hooks_.fail(
        absl::StrFormat("%s died before generation 0 formed (%s)", death.member, death.how));
    return false;
  }
  const auto held = std::find(current.members.begin(), current.members.end(), death.member);
  if (held == current.members.end()) {  // a standby, or a rank already replaced
    (void)rendezvous_->ForgetStandby(death.member, options_.call_timeout);
    return true;
  }
  return QueueDeadMember(static_cast<int>(held - current.members.begin()), death.member, death.how,
                         death.cause);
}

bool JobCoordinator::QueueDeadMember(int rank, const std::string& member, const std::string& how,
                                     const std::string& cause) {
  handled_deaths_.insert(member);
  const absl::Time now = clock_->Now();
  const ReplacementPolicy::Decision decision = replacement_policy_->OnRankDeath(rank, how, now);
  const auto* replace = std::get_if<ReplacementPolicy::Replace>(&decision);
  if (replace == nullptr) {  // on several hosts only the bound fails (ReplacementOptions)
    hooks_.fail(absl::StrFormat(
        "rank %d died %d time(s) (last: %s); --max-replacements=%d "
        "reached",
        rank, replacement_policy_->history(rank).deaths, how, options_.max_replacements));
    return false;
  }
  const absl::Duration delay = replace->delay;
  hooks_.say(absl::StrFormat(
      "rank %d (%s) %s: replacing it%s%s", rank, member, how,
      delay > absl::ZeroDuration() ? absl::StrCat(" in ", absl::FormatDuration(delay)) : "",
      cause.empty() ? "" : absl::StrCat("; its error: ", cause)));
  PendingReplacement dead{rank, how, now, now + delay + options_.standby_wait, now + delay};
  dead.host = store_keys::MemberHost(member);
  replacements_.push_back(std::move(dead));
  return true;
}

void JobCoordinator::QueueRankReplacement(int rank, const std::string& how, absl::Time died,
                                          absl::Time not_before) {
  replacements_.push_back({rank, how, died, not_before + options_.standby_wait, not_before});
}

void JobCoordinator::TryReplacements(absl::Time now) {
  while (!replacements_.empty()) {
    const PendingReplacement dead = replacements_.front();
    if (now < dead.not_before) return;  // backing off a crash loop
    // The rendezvous coordinator's gate also refuses (Aborted) right before its first write.
    if (!coordinating()) return;
    const std::vector<int> ranks = dead.rank < 0 ? dead.ranks : std::vector<int>{dead.rank};
    // A host's ranks go to the preferred standbys (one standby host's), to others only with
    // --spread-standbys; a single rank (one that died, or a host's only one) to any parked
    // standby when none is preferred: one rank cannot be spread over hosts.
    absl::StatusOr<Membership> next = rendezvous_->ReplaceRanks(
        ranks, hooks_.preferred_standbys(dead.host, ranks),
        ranks.size() > 1 ? options_.spread_standbys : true, options_.replace_timeout);
    // Another coordinator acted, or this one's lease lapsed: look again.
    if (absl::IsAborted(next.status())) {
      (void)coordinating();  // says so if the lease lapsed
      return;
    }
    if (absl::IsFailedPrecondition(next.status())) {
      // No standby has parked yet: wait for one still starting up (or about to), until give_up.
      if (hooks_.standby_starting() && now < dead.give_up) return;
      return FailForLackOfStandbys(dead, next.status());
    }
    if (!next.ok()) {
      return hooks_.fail(absl::StrCat(
          "replacing ", dead.rank < 0 ? "host " + dead.host : absl::StrCat("rank ", dead.rank),
          ": ", next.status().ToString()));
    }
    replacements_.pop_front();
    if (dead.rank < 0) {
      HostReplaced(dead, *next);
    } else {
      replacement_policy_->OnReplacementsMade(1);
      // When the standby took the rank (the publication, maybe a store round trip after `now`):
      // the start of its healthy run.
      replacement_policy_->OnRankTaken(dead.rank, clock_->Now());
      hooks_.rank_taken(dead.rank, next->members[dead.rank], next->generation);
      recoveries_.push_back({dead.rank, next->generation, dead.died});
    }
  }
}

void JobCoordinator::HostReplaced(const PendingReplacement& dead, const Membership& next) {
  std::vector<std::string> by;
  for (int rank : dead.ranks) by.push_back(absl::StrCat(rank, "<-", next.members[rank]));
  const std::string what = absl::StrFormat("generation %d: host %s's ranks taken by %s",
                                           next.generation, dead.host, absl::StrJoin(by, ", "));
  hooks_.say(what);
  hooks_.record(-1, EventKind::kHostReplaced, what,
                {{"host", dead.host}, {"ranks", absl::StrJoin(dead.ranks, ",")}});
  replacement_policy_->OnReplacementsMade(static_cast<int>(dead.ranks.size()));
  hooks_.say(
      absl::StrFormat("host %s's shared memory died with it: its ranks' replacements "
                      "restore from their backup holders' memory (peer backups), else the "
                      "newest durable checkpoint on disk, else the survivors' state",
                      dead.host));
  recoveries_.push_back({-1, next.generation, dead.died, dead.host});
}

void JobCoordinator::FailForLackOfStandbys(const PendingReplacement& dead,
                                           const absl::Status& refused) {
  // The standbys' own deaths, when there were any, are why none is parked.
  std::string why = std::string(refused.message());
  if (replacement_policy_->standby_deaths() > 0) {
    why = absl::StrFormat("standbys died %d times while parked (last: %s)",
                          replacement_policy_->standby_deaths(),
                          replacement_policy_->standby_last_death());
  }
  if (dead.rank < 0) {
    return hooks_.fail(absl::StrFormat(
        "host %s died (%s) and no standby host has %d parked standbys%s: %s", dead.host, dead.how,
        dead.ranks.size(),
        options_.spread_standbys ? " (nor all hosts together)" : " (see --spread-standbys)", why));
  }
  hooks_.fail(absl::StrFormat("rank %d died (%s) and no standby is available: %s", dead.rank,
                              dead.how, why));
}

void JobCoordinator::RenewGenerationWhenAsked(RenewalHolds holds) {
  RenewalObservations observed;
  observed.world_size = world_size_;
  observed.death_pending = !replacements_.empty();
  observed.hang_pending = holds.hang_pending;
  observed.killed_rank_unreaped = holds.killed_rank_unreaped;
  RenewalPolicy::Action action = renewal_policy_->Decide(observed, clock_->Now());
  if (!std::holds_alternative<RenewalPolicy::ReadRequests>(action)) return;
  observed.generation = rendezvous_->generation();
  absl::StatusOr<std::map<int, std::string>> asked =
      rendezvous_->NewGenerationRequests(options_.replace_timeout);
  if (!asked.ok() || asked->empty()) return;  // the store briefly unreachable: look again next time
  // The lease's gate, right before the decision acts.
  if (!coordinating()) return;
  observed.requests = *std::move(asked);
  // Decided when the requests were read (the read may have waited on the store).
  action = renewal_policy_->Decide(observed, clock_->Now());
  if (const auto* wait = std::get_if<RenewalPolicy::Wait>(&action)) {
    if (!wait->first_ask.empty()) hooks_.say(wait->first_ask);
    return;
  }
  if (const auto* restart = std::get_if<RenewalPolicy::RestartAll>(&action)) {
    return strategy_->OnRestartRequested(restart->why);
  }
  const auto* renew = std::get_if<RenewalPolicy::Renew>(&action);
  if (renew == nullptr) return;
  if (!renew->first_ask.empty()) hooks_.say(renew->first_ask);
  absl::StatusOr<Membership> next = rendezvous_->RenewGeneration(options_.replace_timeout);
  if (!next.ok()) {
    if (!coordinating()) return;  // refused by the gate: "no longer coordinating" says why
    hooks_.say(
        absl::StrCat("renewing generation ", observed.generation, ": ", next.status().ToString()));
    return;  // tried again next time
  }
  const std::string asked_by = absl::StrJoin(renew->asked_by, ",");
  hooks_.say(absl::StrFormat("generation %d renewed with the same ranks (asked by %s)",
                             next->generation, asked_by));
  hooks_.record(-1, EventKind::kGenerationRenewed,
                absl::StrFormat("generation %d renewed with the same ranks", next->generation),
                {{"asked_by", asked_by}});
  recoveries_.push_back({-1, next->generation, renew->first_asked});
}

void JobCoordinator::DeclareHostDead(const std::string& host, absl::Time last_beat,
                                     const std::string& why) {
  const absl::Duration timeout = options_.call_timeout;
  if (!coordinating()) return;
  // First the fence, so that the host's agent, should it come back, stops its processes.
  if (absl::Status s = store_->Set(store_keys::kAgentsDead.Key(host), why, timeout); !s.ok()) {
    return;  // tried again next tick
  }
  dead_hosts_.insert(host);
  host_liveness_.Forget(host);
  failures_->Record({absl::StrCat("host ", host), "died", why});
  const std::string prefix = host + ":";
  if (absl::StatusOr<std::vector<std::string>> parked = rendezvous_->ParkedStandbys(timeout);
      parked.ok()) {
    for (const std::string& member : *parked) {
      if (absl::StartsWith(member, prefix)) (void)rendezvous_->ForgetStandby(member, timeout);
    }
  }
  const Membership current = rendezvous_->current();
  absl::StatusOr<std::vector<std::string>> finished =
      store_->ListKeys(store_keys::AgentFinishedPrefix(round_), timeout);
  std::vector<int> ranks;
  for (size_t r = 0; r < current.members.size(); ++r) {
    if (!absl::StartsWith(current.members[r], prefix)) continue;
    const std::string key = store_keys::AgentFinished(round_, static_cast<int>(r));
    if (finished.ok() && std::find(finished->begin(), finished->end(), key) != finished->end()) {
      continue;  // it finished before the host died
    }
    ranks.push_back(static_cast<int>(r));
    handled_deaths_.insert(current.members[r]);
  }
  hooks_.say(absl::StrFormat("host %s is dead (%s)%s", host, why,
                             ranks.empty() ? "; it held no rank"
                                           : absl::StrCat(": replacing its ranks ",
                                                          absl::StrJoin(ranks, ","), " at once")));
  // The record `trainguard report` matches a host fault with (host, the ranks it held).
  hooks_.record(-1, EventKind::kHostLost, absl::StrFormat("host %s is dead (%s)", host, why),
                {{"host", host}, {"ranks", absl::StrJoin(ranks, ",")}});
  strategy_->OnHostDeclaredDead({host, std::move(ranks), why, last_beat}, current);
}

void JobCoordinator::QueueDeadHost(const DeadHost& dead, const Membership& current) {
  if (dead.ranks.empty()) return;
  if (current.generation < 0) {
    return hooks_.fail(absl::StrFormat("host %s died before generation 0 formed", dead.host));
  }
  const absl::Time now = clock_->Now();
  PendingReplacement entry{-1, dead.why, dead.last_beat, now, now};
  entry.ranks = dead.ranks;
  entry.host = dead.host;
  // The rendezvous' liveness and the survivors' failed collectives may already have queued ranks
  // of this host: the host's entry replaces them.
  const std::string prefix = dead.host + ":";
  for (auto it = replacements_.begin(); it != replacements_.end();) {
    it = it->rank >= 0 && absl::StartsWith(current.members[it->rank], prefix)
             ? replacements_.erase(it)
             : std::next(it);
  }
  replacements_.push_back(std::move(entry));
}

void JobCoordinator::TakeOver(absl::Duration timeout) {
  // Every host gets a full host_timeout from this agent's first read of its heartbeat, the previous
  // holder's too: its lease lapsing shows only that this agent did not see it renewed, which a
  // stalled store causes as well while that host trains on (HostLiveness).
  host_liveness_ = HostLiveness(options_.host_timeout, HostRecheck(options_.host_timeout));
  took_over_at_ = clock_->Now();
  // The joins and departures are listed afresh at the next tick.
  hosts_listed_at_ = absl::InfinitePast();
  join_count_listed_.reset();
  left_count_listed_.reset();
  handled_deaths_.clear();
  dead_hosts_.clear();
  if (absl::StatusOr<std::vector<std::string>> dead =
          store_->ListKeys(store_keys::kAgentsDead.prefix(), timeout);
      dead.ok()) {
    for (std::string& host : store_keys::kAgentsDead.Names(*dead)) {
      dead_hosts_.insert(std::move(host));
    }
  }
}

}  // namespace trainguard
