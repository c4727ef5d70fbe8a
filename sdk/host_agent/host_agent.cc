#include "sdk/host_agent/host_agent.h"

#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "sdk/agent/host_roster.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/store_keys.h"
#include "sdk/health/fail_slow_metrics.h"

namespace trainguard {

std::string HostWorker::Label() const {
  return rank >= 0 ? absl::StrCat("rank ", rank) : absl::StrCat("standby ", standby_index);
}

std::string HostAssignment::Describe(const std::string& host, int64_t round) const {
  if (group_rank < 0) return absl::StrFormat("host %s is a standby host: %d standbys", host, standbys);
  return absl::StrFormat("host %s is group %d of %d: ranks %d..%d%s", host, group_rank,
                         training_hosts, ranks.front(), ranks.back(),
                         round > 0 ? absl::StrCat(" (restart round ", round, ")") : "");
}

absl::StatusOr<HostAssignment> AssignmentOf(const store_keys::Plan& plan, const std::string& host,
                                            int ranks_per_host, int spares, bool restart_all) {
  if (plan.ranks_per_host != ranks_per_host) {
    return absl::FailedPreconditionError(
        absl::StrFormat("host %s has --nproc-per-node %d but the job has %d per host", host,
                        ranks_per_host, plan.ranks_per_host));
  }
  HostAssignment a;
  a.group_rank = plan.GroupOf(host);
  a.training_hosts = plan.training_hosts;
  a.world_size = plan.training_hosts * plan.ranks_per_host;
  a.master_addr = plan.master_addr;
  a.master_port = plan.master_port;
  const bool trains = a.group_rank >= 0;
  for (int i = 0; trains && i < ranks_per_host; ++i) {
    a.ranks.push_back(a.group_rank * ranks_per_host + i);
  }
  // Under --restart-all a standby host holds no processes until a restart gives it a group rank.
  a.standbys = restart_all ? 0 : trains ? spares : ranks_per_host;
  return a;
}

HostAssignment OneHostAssignment(int ranks, int spares, const std::string& master_addr,
                                 int master_port) {
  HostAssignment a;
  a.group_rank = 0;
  a.training_hosts = 1;
  a.world_size = ranks;
  a.master_addr = master_addr;
  a.master_port = master_port;
  for (int r = 0; r < ranks; ++r) a.ranks.push_back(r);
  a.standbys = spares;
  return a;
}

HostAgent::HostAgent(Store* store, Clock* clock, ProcessSupervisor* supervisor,
                     HostAgentOptions options, Hooks hooks)
    : store_(store),
      clock_(clock),
      supervisor_(supervisor),
      options_(std::move(options)),
      hooks_(std::move(hooks)),
      store_rank_reports_(store, options_.report_timeout),
      store_seen_(clock_->Now()),
      loop_turned_(store_seen_) {}

HostAgent::~HostAgent() { StopBeating(); }

absl::Status HostAgent::BeatOnce() {
  const absl::Time now = clock_->Now();
  int64_t next = 0;
  {
    MutexLock lock(&beat_mu_);
    if (now - loop_turned_ > options_.loop_stall_bound) {
      // Wedged: the coordinator is to see this host silent, and declare it dead.
      return absl::FailedPreconditionError(
          absl::StrFormat("host %s's agent has not turned for %s (bound %s): not beating",
                          options_.host_id, absl::FormatDuration(now - loop_turned_),
                          absl::FormatDuration(options_.loop_stall_bound)));
    }
    next = beats_ + 1;
  }
  // A Set of a counter of our own, not an Add: a Set may be retried on another etcd member after
  // a broken connection (an Add's outcome would be unknown), so a leader election costs no beat.
  const absl::Status beat = store_->Set(store_keys::kAgentHeartbeats.Key(options_.host_id),
                                        absl::StrCat(next), options_.call_timeout);
  MutexLock lock(&beat_mu_);
  last_beat_ = beat;
  if (beat.ok()) {
    beats_ = next;
    store_seen_ = now;
  }
  return beat;
}

std::optional<std::string> HostAgent::Heartbeat() {
  const absl::Time now = clock_->Now();
  {
    MutexLock lock(&beat_mu_);
    loop_turned_ = now;
  }
  if (beater_ == nullptr) (void)BeatOnce();
  MutexLock lock(&beat_mu_);
  if (now - store_seen_ <= options_.store_loss_bound) return std::nullopt;
  return absl::StrFormat("host %s has not reached the job's store (%s) for %s: %s",
                         options_.host_id, options_.store_url,
                         absl::FormatDuration(now - store_seen_), last_beat_.ToString());
}

void HostAgent::StartBeating(absl::Duration interval) {
  if (beater_ != nullptr) return;
  DutyThreadOptions options;
  options.period = interval;
  // Each beat is bounded by call_timeout; a failure shows in Heartbeat past the store-loss bound.
  options.duties = [this] { (void)BeatOnce(); };
  beater_ = std::make_unique<DutyThread>(std::move(options));
}

void HostAgent::StopBeating() { beater_.reset(); }

absl::StatusOr<HostAssignment> HostAgent::ReadPlan() {
  absl::StatusOr<std::string> value = store_->Get(store_keys::kAgentPlan, options_.call_timeout);
  if (!value.ok()) return value.status();
  absl::StatusOr<store_keys::Plan> plan = store_keys::DecodePlan(*value);
  if (!plan.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("malformed plan: ", plan.status().message()));
  }
  return AssignmentOf(*plan, options_.host_id, options_.ranks_per_host, options_.spares,
                      options_.restart_all);
}

void HostAgent::FollowMembership(const Membership& current) {
  for (HostWorker* w : workers()) {
    if (!w->running) continue;
    const auto held = std::find(current.members.begin(), current.members.end(), w->member_id);
    const int rank =
        held == current.members.end() ? -1 : static_cast<int>(held - current.members.begin());
    if (rank >= 0 && rank != w->rank) {
      TakeRank(*w, rank, current.generation);
    } else if (rank < 0 && w->rank >= 0 && !w->killed_for_liveness) {
      // A stopped rank is replaced when the coordinator asks for its kill, and the request is
      // written before the generation that replaces it: carried out first, it records why (the
      // culprit a report names), not only that the process lost its rank.
      ExecuteKillRequests();
      if (w->killed_for_liveness) continue;
      hooks_.say(
          absl::StrFormat("%s (pid %d) no longer holds its rank in generation %d: killing it",
                          w->Label(), w->pid, current.generation));
      w->killed_for_liveness = true;
      w->kill_reason =
          absl::StrFormat("the launcher killed it: it no longer holds its rank in generation %d",
                          current.generation);
      (void)supervisor_->Signal(w->worker, SIGKILL);
    }
  }
}

void HostAgent::TakeRank(HostWorker& w, int rank, int64_t generation) {
  hooks_.say(absl::StrFormat("%s (pid %d) takes rank %d in generation %d", w.Label(), w.pid, rank,
                             generation));
  w.rank = rank;
  w.rank_generation = generation;
  (void)supervisor_->WritePidFile(w.worker, hooks_.pid_file(rank));
  hooks_.rank_taken(w);
}

bool HostAgent::TakeAssignedRank(HostWorker& w, Store* ranks_store) {
  if (w.rank >= 0) return false;
  absl::StatusOr<std::string> value =
      ranks_store->Get(store_keys::RdzvAssign(w.member_id), options_.call_timeout);
  if (!value.ok()) return false;
  absl::StatusOr<store_keys::Assignment> assigned = store_keys::DecodeAssignment(*value);
  if (!assigned.ok()) return false;
  TakeRank(w, assigned->rank, assigned->generation);
  return true;
}

std::optional<AgentExit> HostAgent::WatchJobEnd() {
  const absl::Duration timeout = options_.call_timeout;
  // job/failed first: an agent that failed the job may have finished its ranks before, and the job
  // did not succeed.
  if (absl::StatusOr<std::string> failed = store_->Get(store_keys::kJobFailed, timeout);
      failed.ok()) {
    hooks_.say(absl::StrCat("job failed: ", *failed));
    return AgentExit{options_.failed_exit_code, *failed};
  }
  if (store_->Get(store_keys::kJobDone, timeout).ok()) return AgentExit{0, ""};
  return std::nullopt;
}

std::optional<AgentExit> HostAgent::CheckFenced() {
  absl::StatusOr<std::string> fenced =
      store_->Get(store_keys::kAgentsDead.Key(options_.host_id), options_.call_timeout);
  if (!fenced.ok()) return std::nullopt;  // absent, or the store briefly unreachable
  std::string failure = absl::StrFormat(
      "this host (%s) was declared dead by the coordinator (%s); its ranks were given to others: "
      "stopping them",
      options_.host_id, *fenced);
  hooks_.say(absl::StrCat("fenced out: ", failure));
  // Their ranks train elsewhere now: the stop starts at once, not at the launcher's next turn.
  SignalStop();
  return AgentExit{options_.failed_exit_code, std::move(failure)};
}

absl::Status RequestKill(Store* store, std::string_view host, std::string_view member,
                         const store_keys::KillRequest& request, absl::Duration timeout) {
  const absl::string_view h(host.data(), host.size());
  if (absl::Status s =
          store->Set(store_keys::AgentKill(h, absl::string_view(member.data(), member.size())),
                     store_keys::EncodeKillRequest(request), timeout);
      !s.ok()) {
    return s;
  }
  return store->Add(store_keys::AgentKillCount(h), 1, timeout).status();
}

void HostAgent::ExecuteKillRequests() {
  const absl::Duration timeout = options_.call_timeout;
  // The count first (read with the rest of the turn): the requests are listed only when it moved.
  absl::StatusOr<std::string> count =
      store_->Get(store_keys::AgentKillCount(options_.host_id), timeout);
  if (!count.ok() && !absl::IsNotFound(count.status())) return;  // the next tick reads them
  const std::string seen = count.ok() ? *count : "0";
  if (kill_count_seen_ == seen) return;
  const std::string prefix = store_keys::AgentKillPrefix(options_.host_id);
  absl::StatusOr<std::vector<std::string>> keys = store_->ListKeys(prefix, timeout);
  if (!keys.ok()) return;  // the store briefly unreachable: the next tick reads them
  kill_count_seen_ = seen;
  for (const std::string& key : *keys) {
    const std::string member = store_keys::AgentKillMember(options_.host_id, key).value_or("");
    absl::StatusOr<std::string> value = store_->Get(key, timeout);
    if (!value.ok()) continue;  // gone meanwhile, or the store briefly unreachable
    const absl::StatusOr<store_keys::KillRequest> request = store_keys::DecodeKillRequest(*value);
    const std::optional<EventKind> what =
        request.ok() ? ParseEventKind(request->what) : std::nullopt;
    const int64_t latest_term = hooks_.latest_term();
    if (!what.has_value()) {
      hooks_.say(absl::StrFormat("ignoring a malformed kill request of %s (%s: \"%s\")", member,
                                 key, *value));
    } else if (request->term < latest_term) {
      // A coordinator deposed meanwhile asked (cut off, it did not know): its successor decides.
      hooks_.say(absl::StrFormat(
          "ignoring the kill request of %s from lease term %d: the lease is at term %d (%s)",
          member, request->term, latest_term, request->why));
    } else {
      for (HostWorker* w : workers()) {
        if (w->member_id != member || !w->running || w->killed_for_liveness) continue;
        KillWorker(*w, *what, absl::StrCat(" for the coordinator: ", request->why));
      }
    }
    (void)store_->Delete(key, timeout);
  }
}

void HostAgent::KillWorker(HostWorker& w, EventKind what, const std::string& why) {
  hooks_.say(absl::StrFormat("%s (pid %d): killing it%s", w.Label(), w.pid, why));
  hooks_.record(w.rank, what, absl::StrFormat("%s (pid %d): killed%s", w.Label(), w.pid, why),
                {{"pid", absl::StrCat(w.pid)}});
  w.killed_for_liveness = true;
  w.kill_reason = absl::StrCat("the launcher killed it", why);
  // Refused once its exit was seen: nothing left to reach. Reaped and reported like any death.
  (void)supervisor_->Signal(w.worker, SIGKILL);
}

void HostAgent::ReportDeath(HostWorker& w, const std::string& how) {
  if (w.death_reported) return;
  // The coordinator, maybe on another host, decides; the report names the member, so a death
  // reported twice, or after the rank was given to someone else, is handled once.
  absl::Status s = rank_reports_->Death({w.member_id, w.rank, how, w.Cause()});
  if (!s.ok()) {
    hooks_.say(absl::StrCat("cannot report the death of ", w.Label(), ": ", s.ToString()));
    return;
  }
  w.death_reported = true;
}

void HostAgent::ReportFinished(HostWorker& w, int64_t round) {
  // Best effort, bounded by report_timeout: the rank has exited, there is no one to tell.
  (void)rank_reports_->Finished(round, w.rank, w.member_id);
}

void HostAgent::ReportStoppedWorkers() {
  for (HostWorker* w : workers()) {
    const bool stopped = w->running && w->rank >= 0 && supervisor_->IsStopped(w->worker);
    if (stopped == w->reported_stopped) continue;
    const std::string key = store_keys::kAgentStopped.Key(w->member_id);
    const absl::Status written = stopped ? store_->Set(key, options_.host_id, options_.call_timeout)
                                         : store_->Delete(key, options_.call_timeout).status();
    if (written.ok()) w->reported_stopped = stopped;  // else tried again at the next tick
  }
}

void HostAgent::KillRanksStoppedFor(absl::Duration bound, const std::string& context) {
  const absl::Time now = clock_->Now();
  for (HostWorker* w : workers()) {
    if (!w->running || w->killed_for_liveness || w->rank < 0) continue;
    if (!supervisor_->IsStopped(w->worker)) {
      w->stopped_since = absl::InfiniteFuture();
      continue;
    }
    if (w->stopped_since == absl::InfiniteFuture()) w->stopped_since = now;
    if (now - w->stopped_since >= bound) {
      KillWorker(*w, EventKind::kRankUnresponsive,
                 absl::StrFormat(": stopped for %s %s",
                                 absl::FormatDuration(now - w->stopped_since), context));
    }
  }
}

void HostAgent::Leave(int exit_code) {
  StopBeating();  // a host that left is not watched: its heartbeat says nothing more
  // Counted with the record, so that the coordinator lists agents/left/ only when it changed.
  (void)store_->SetAndAdd(store_keys::kAgentsLeft.Key(options_.host_id), absl::StrCat(exit_code),
                          store_keys::kAgentLeftCount, 1, absl::Seconds(1));
}

bool HostAgent::WaitForOthersToLeave(absl::Duration bound) {
  const absl::Time deadline = clock_->Now() + bound;
  // The hosts that `family`'s keys name, or nullopt if unreadable.
  auto hosts = [&](const store_keys::KeyFamily& family) -> std::optional<std::set<std::string>> {
    absl::StatusOr<std::vector<std::string>> keys =
        store_->ListKeys(family.prefix(), absl::Seconds(1));
    if (!keys.ok()) return std::nullopt;
    const std::vector<std::string> names = family.Names(*keys);
    return std::set<std::string>(names.begin(), names.end());
  };
  std::set<std::string> still_in_job;
  while (clock_->Now() < deadline) {
    std::optional<std::set<std::string>> joined = hosts(store_keys::kAgentJoins);
    std::optional<std::set<std::string>> left = hosts(store_keys::kAgentsLeft);
    std::optional<std::set<std::string>> dead = hosts(store_keys::kAgentsDead);
    if (joined && left && dead) {
      still_in_job = HostsStillInJob(*joined, *left, *dead);
      if (still_in_job.empty()) return true;
    }
    clock_->SleepFor(absl::Milliseconds(50));  // bounded by the deadline
  }
  hooks_.say(absl::StrCat("stopping the store before every host left (still in the job: ",
                          still_in_job.empty() ? "unknown" : absl::StrJoin(still_in_job, ", "),
                          "; they may report the store lost)"));
  return false;
}

void HostAgent::SignalStop() {
  for (HostWorker* w : workers()) {
    if (!w->running || w->stop_signalled) continue;
    w->stop_signalled = true;
    (void)supervisor_->Signal(w->worker, SIGTERM);  // refused once it exited: nothing to reach
  }
}

void HostAgent::PublishHostSample(HostSampler& sampler, int ranks_per_host) {
  const absl::Time now = clock_->Now();
  if (now < next_host_sample_) return;
  next_host_sample_ = now + absl::Seconds(1);
  std::vector<HostSampler::RankProcess> ranks;
  std::vector<std::string> keys;
  for (const HostWorker* w : workers()) {
    if (w->rank < 0 || !w->running) continue;
    ranks.push_back({w->rank, w->pid, std::nullopt, w->rank % std::max(1, ranks_per_host)});
    keys.push_back(RankWorkKey(w->rank));
  }
  if (ranks.empty()) return;
  // The ranks write their work records only once asked (they cost every rank a request a second).
  if (!work_records_asked_) {
    work_records_asked_ =
        store_->Set(kRankWorkWantedKey, options_.host_id, options_.call_timeout).ok();
  }
  // Without the work records the sample still holds what the agent reads itself (CPU, TCP, GPUs).
  absl::StatusOr<std::vector<std::optional<std::string>>> records =
      store_->MultiGet(keys, options_.call_timeout);
  if (records.ok()) {
    for (size_t i = 0; i < ranks.size(); ++i) ranks[i].work_record = (*records)[i];
  }
  std::optional<HostMetricsRecord> sample = sampler.Sample(now, ranks);
  if (!sample.has_value()) return;
  (void)store_->Set(HostMetricsKey(options_.host_id), EncodeHostMetricsRecord(*sample),
                    options_.call_timeout);
}

}  // namespace trainguard
