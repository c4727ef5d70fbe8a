// ReplacementPolicy: what `trainguard run` does when a rank or a parked standby dies under standby
// replacement (sdk/coordinator/standby_replacement.h; --restart-all is another recovery strategy,
// sdk/coordinator/restart_all.h). A rank's death is answered by replacing it with a standby (at
// once, or after a crash-loop backoff), or by failing the job (no standbys, or --max-replacements
// reached); a parked standby's death by starting another one (after a backoff) or, past the bound,
// by starting no more.
//
// A crash loop: a process that dies again within `healthy_run` of taking its rank (a standby: of
// starting) extends its streak; any later death starts a new streak of 1. The first death of a
// streak is replaced at once (a machine fault), the k-th (k >= 2) after restart_backoff * 2^(k-2),
// capped at max_backoff.
//
// The policy is pure: it does no I/O and reads no clock; the caller passes the time each event was
// seen, so tests drive it with explicit instants. It returns decisions with the message the
// launcher prints; the launcher does the rest (printing, events, queueing the replacement, failing
// the job). It owns the job's replacement history: per rank, its deaths and streak and when it was
// last taken; the standbys' deaths; the replacements made.
//
// Not decided here: whether the job had formed when the rank died (a death before generation 0
// formed fails the job). That depends on the launcher's formation state; the strategy checks it
// before asking the policy. On several hosts the coordinator asks the policy for the bound and the
// backoff only: standbys live on standby hosts.
//
// Thread safety: not thread-safe; one thread (the launcher's loop, a test) uses an instance.
#ifndef TRAINGUARD_SDK_AGENT_REPLACEMENT_POLICY_H_
#define TRAINGUARD_SDK_AGENT_REPLACEMENT_POLICY_H_

#include <map>
#include <string>
#include <string_view>
#include <variant>

#include "absl/time/time.h"

namespace trainguard {

struct ReplacementPolicyOptions {
  // Replacements over the job's life; a rank death past it fails the job. Also how many parked
  // standbys may die and be started again: the next death stops their respawning.
  int max_replacements = 10;
  // The backoff of a streak's second death; doubled for each further one.
  absl::Duration restart_backoff = absl::Seconds(1);
  // A process that lived this long after taking its rank (a standby: after starting) is not in a
  // crash loop: its next death starts a new streak, replaced at once.
  absl::Duration healthy_run = absl::Seconds(60);
  absl::Duration max_backoff = absl::Seconds(30);
  // False: a rank's death fails the job (no --standby).
  bool has_standbys = true;
};

// One rank's deaths, for the backoff and for the message that ends the job.
struct RankHistory {
  int deaths = 0;
  std::string last;  // how the last death was described ("exited with status 1")
  int streak = 0;    // deaths in a row within healthy_run of taking the rank
  absl::Time took_rank = absl::InfinitePast();  // InfinitePast: the rank's first process
};

class ReplacementPolicy {
 public:
  // Replace the rank with a standby, not before `not_before` (now + delay).
  struct Replace {
    absl::Time not_before;
    absl::Duration delay;
    int streak = 0;
    int deaths = 0;
    // "rank 0 died 2 times (last: ...), 2 in a row within 1m of taking its rank: replacing it in
    // 1s"; empty when the replacement is at once (nothing to explain).
    std::string message;
  };
  // Fail the job for `why`.
  struct Fail {
    std::string why;
  };
  using Decision = std::variant<Replace, Fail>;

  struct StandbyDecision {
    // False: start no standby for this death (the bound was reached, now or before).
    bool respawn = false;
    absl::Time not_before;  // with respawn
    // Either the backoff ("standbys died 2 times in a row within 1m of starting: the next starts
    // in 1s") or, once, the end of respawning ("...; --max-replacements=2 reached: no more standbys
    // are started"). Empty when there is nothing to say.
    std::string message;
  };

  explicit ReplacementPolicy(ReplacementPolicyOptions options) : options_(options) {}

  // Counts the death of `rank` (described by `how`, seen at `now`) and decides what follows.
  // REQUIRES: the job had formed (see above).
  Decision OnRankDeath(int rank, std::string_view how, absl::Time now);

  // A standby took `rank` at `now`: the healthy-run window of its next death starts there.
  void OnRankTaken(int rank, absl::Time now);

  // `n` ranks were given to standbys (one rank, or a whole host's ranks at once); they count
  // towards max_replacements.
  void OnReplacementsMade(int n) { replacements_ += n; }

  // Counts the death of a parked standby that started at `started` (seen at `now`) and decides
  // whether another one starts.
  StandbyDecision OnStandbyDeath(std::string_view how, absl::Time started, absl::Time now);

  // The history of `rank`; empty if it never died.
  RankHistory history(int rank) const;
  int replacements() const { return replacements_; }
  int standby_deaths() const { return standby_deaths_; }
  const std::string& standby_last_death() const { return standby_last_death_; }
  // Parked standbys died past max_replacements: none is started any more.
  bool standbys_exhausted() const { return standby_deaths_ > options_.max_replacements; }

 private:
  // The wait before replacing a process whose death is the `streak`-th in a row.
  absl::Duration Backoff(int streak) const;

  const ReplacementPolicyOptions options_;
  std::map<int, RankHistory> ranks_;
  int replacements_ = 0;
  int standby_deaths_ = 0;
  int standby_streak_ = 0;
  std::string standby_last_death_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_AGENT_REPLACEMENT_POLICY_H_
