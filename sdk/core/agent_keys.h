// The store keys and values of `trainguard run`'s host agents and of the coordinator among them
// (sdk/launch/launch_agent.cc, sdk/rendezvous/coordinator_lease.cc), and the launcher's job/ keys:
// built, parsed, encoded and decoded here and nowhere else, as store_keys.h does for the ranks'
// keys. Keys are relative to the job's store (the store prefixes them with the job id).
//
//   agents/seq                          the join counter (join order decides which hosts train)
//   agents/join/<host>                  "<seq> worker|standby <addr> <port>" (JoinRecord)
//   agents/join_count                   the join records written, counted with each (a reader
//                                       that sees it change lists agents/join/ again)
//   agents/plan                         Plan: "<training hosts> <ranks per host> <addr> <port>",
//                                       then "\n<host> <group rank>" per host (-1: a standby host)
//   agents/hb/<host>                    the agent's heartbeat counter
//   agents/dead/<host>                  why the coordinator declared the host dead (it is fenced)
//   agents/left/<host>                  the exit code of an agent that left the job
//   agents/left_count                   the agents/left/ writes, counted with each
//   agents/deaths/<member>              "<rank> <how>[\n<cause>]": an agent saw its rank process
//                                       die (DeathReport)
//   agents/stopped/<member>             the host: its agent sees the rank process stopped (SIGSTOP)
//   agents/kill/<host>/<member>         KillRequest (store_keys.h: AgentKill, AgentKillMember)
//   agents/kills/<host>                 the count of kill requests written for the host
//                                       (store_keys.h: AgentKillCount)
//   agents/finished/<rank>              the member that finished rank <rank> with status 0
//   agents/round<K>/finished/<rank>     the same in restart round K (--restart-all)
//   agents/metrics/<host>               the host's fail-slow sample
//                                       (sdk/health/fail_slow_metrics.h)
//   agents/restart                      "<round> <why>", the newest restart round (RestartRound)
//   coord/lease                         "<term> <holder> <beat>" (LeaseRecord)
//   job/failed                          why an agent failed the job, for every agent
//   job/done                            the coordinator's word that every rank finished
//   job/persist_failed/<step>/<rank>    a checkpoint rank <rank> could not persist (step: 12
//                                       digits, zero-padded), the error as the value
//
// A member id, "<host>:<pid>[:round<K>]:rank<R>|standby<N>", names a process `trainguard run`
// started (MemberId); MemberHost reads the host of any member id.
//
// Every Decode refuses a malformed value with InvalidArgument naming the key and the field; Encode
// writes what Decode reads back (the round-trip tests in tests/unit/agent_keys_test.cc).
//
// Thread safety: pure functions and constants.
#ifndef TRAINGUARD_SDK_CORE_AGENT_KEYS_H_
#define TRAINGUARD_SDK_CORE_AGENT_KEYS_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "sdk/core/store_keys.h"

namespace trainguard::store_keys {

// The keys "<prefix><name>", one per host or member, that a ListKeys(prefix()) finds.
class KeyFamily {
 public:
  // REQUIRES: `prefix` is a string literal.
  constexpr explicit KeyFamily(const char* prefix) : prefix_(prefix) {}
  constexpr const char* prefix() const { return prefix_; }
  std::string Key(std::string_view name) const {
    std::string key(prefix_);
    key.append(name);
    return key;
  }
  // The host or member `key` names; nullopt when it is not of this family.
  std::optional<std::string> Name(std::string_view key) const { return NameAfter(prefix_, key); }
  // Name(key), or InvalidArgument "store key K is not of <prefix><`what`>" (what: "host", ...).
  absl::StatusOr<std::string> NameOrError(std::string_view key, std::string_view what) const {
    std::optional<std::string> name = Name(key);
    if (!name.has_value()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "store key %s is not of %s<%s>", absl::string_view(key.data(), key.size()), prefix_,
          absl::string_view(what.data(), what.size())));
    }
    return *std::move(name);
  }
  // The names of the keys of a ListKeys(prefix()) answer, in its order (others skipped).
  std::vector<std::string> Names(const std::vector<std::string>& keys) const {
    std::vector<std::string> names;
    for (const std::string& key : keys) {
      if (std::optional<std::string> name = Name(key); name.has_value()) {
        names.push_back(*std::move(name));
      }
    }
    return names;
  }

 private:
  const char* prefix_;
};

inline constexpr char kAgentSeq[] = "agents/seq";
inline constexpr char kAgentJoinCount[] = "agents/join_count";
inline constexpr char kAgentLeftCount[] = "agents/left_count";
inline constexpr char kAgentPlan[] = "agents/plan";
inline constexpr char kAgentRestart[] = "agents/restart";
inline constexpr char kCoordLease[] = "coord/lease";
inline constexpr char kJobFailed[] = "job/failed";
inline constexpr char kJobDone[] = "job/done";

inline constexpr KeyFamily kAgentJoins("agents/join/");       // per host
inline constexpr KeyFamily kAgentHeartbeats("agents/hb/");    // per host
inline constexpr KeyFamily kAgentsDead("agents/dead/");       // per host
inline constexpr KeyFamily kAgentsLeft("agents/left/");       // per host
inline constexpr KeyFamily kAgentMetrics("agents/metrics/");  // per host
inline constexpr KeyFamily kAgentDeaths("agents/deaths/");    // per member
inline constexpr KeyFamily kAgentStopped("agents/stopped/");  // per member

// agents/finished/ in round 0, agents/round<K>/finished/ in restart round K: a restart round counts
// the finished ranks anew.
inline std::string AgentFinishedPrefix(int64_t round) {
  return round == 0 ? std::string("agents/finished/")
                    : absl::StrCat("agents/round", round, "/finished/");
}
inline std::string AgentFinished(int64_t round, int rank) {
  return absl::StrCat(AgentFinishedPrefix(round), rank);
}

inline constexpr char kJobPersistFailedPrefix[] = "job/persist_failed/";
inline std::string JobPersistFailed(int64_t step, int rank) {
  return absl::StrFormat("%s%012d/%d", kJobPersistFailedPrefix, step, rank);
}

// The host a member id ("<host>:<pid>:<role>") runs on: the text before its first ':'. Unlike
// DecodeMemberId it takes any member id, a rank's own ("<host>:<pid>" when no launcher named it).
inline std::string MemberHost(std::string_view member) {
  return std::string(member.substr(0, member.find(':')));
}

namespace agent_keys_internal {
// (absl::string_view is not std::string_view in every Abseil build: the decoders work on it.)
inline absl::string_view View(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline absl::Status Malformed(absl::string_view key, absl::string_view value,
                              absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrFormat("store key %s holds \"%s\": %s %s", key, value, field, why));
}
// `text` as a whole number in [low, high], else InvalidArgument naming `field`.
inline absl::Status ParseNumber(absl::string_view key, absl::string_view value,
                                absl::string_view field, absl::string_view text, int64_t low,
                                int64_t high, int64_t* out) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(text, &n)) {
    return Malformed(key, value, field, absl::StrCat("'", text, "' is not a number"));
  }
  if (n < low || n > high) {
    return Malformed(key, value, field,
                     absl::StrFormat("%d is out of range [%d, %d]", n, low, high));
  }
  *out = n;
  return absl::OkStatus();
}
inline constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
inline constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();
}  // namespace agent_keys_internal

// The member id of a process `trainguard run` started (its rendezvous member,
// TRAINGUARD_MEMBER_ID):
// "<host>:<pid>:rank<R>" or "<host>:<pid>:standby<N>", with ":round<K>" before the role in restart
// round K >= 1 (--restart-all on several hosts), so that a death reported from an earlier round is
// never taken for one of this round's. Keys per member (agents/deaths/, agents/stopped/,
// rdzv/standby/, ...) carry it as is.
struct MemberId {
  enum class Role { kRank, kStandby };
  std::string host;   // the host id, or the machine's name on one host; not empty, no ':'
  int64_t pid = 0;    // the launcher's (agent's) pid: with the role, unique on the host
  int64_t round = 0;  // the restart round; 0: the job's first start (nothing written)
  Role role = Role::kRank;
  int index = 0;  // the rank (kRank) or the standby's index (kStandby)
};
inline std::string EncodeMemberId(const MemberId& m) {
  return absl::StrCat(m.host, ":", m.pid, m.round > 0 ? absl::StrCat(":round", m.round) : "", ":",
                      m.role == MemberId::Role::kRank ? "rank" : "standby", m.index);
}
// InvalidArgument naming the member id and the field when `member` is not one EncodeMemberId
// writes (a round of 0 is refused too: round 0 is written as no round).
inline absl::StatusOr<MemberId> DecodeMemberId(std::string_view member) {
  using namespace agent_keys_internal;  // NOLINT(google-build-using-namespace)
  const absl::string_view id = View(member);
  const auto malformed = [&](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat("member id \"%s\": %s %s", id, field, why));
  };
  // Digits only (SimpleAtoi alone takes a sign and spaces), so that what decodes encodes back to
  // the same bytes. ParseNumber's errors name a store key: here the member id is the subject.
  const auto number = [&](absl::string_view field, absl::string_view text, int64_t low,
                          int64_t high, int64_t* out) -> absl::Status {
    int64_t n = 0;
    if (text.empty() || !std::all_of(text.begin(), text.end(), absl::ascii_isdigit) ||
        !absl::SimpleAtoi(text, &n)) {
      return malformed(field, absl::StrCat("'", text, "' is not a number"));
    }
    if (text.size() > 1 && text[0] == '0') {
      return malformed(field, absl::StrCat("'", text, "' has a leading zero"));
    }
    if (n < low || n > high) {
      return malformed(field, absl::StrFormat("%d is out of range [%d, %d]", n, low, high));
    }
    *out = n;
    return absl::OkStatus();
  };
  const std::vector<absl::string_view> f = absl::StrSplit(id, ':');
  if (f.size() != 3 && f.size() != 4) {
    return malformed("the id", "is not \"<host>:<pid>[:round<K>]:rank<R>|standby<N>\"");
  }
  MemberId m;
  if (f[0].empty()) return malformed("host", "is empty");
  m.host = std::string(f[0]);
  if (absl::Status s = number("pid", f[1], 0, kMaxInt64, &m.pid); !s.ok()) return s;
  if (f.size() == 4) {
    if (!absl::StartsWith(f[2], "round")) {
      return malformed("round", absl::StrCat("'", f[2], "' is not round<K>"));
    }
    if (absl::Status s = number("round", f[2].substr(5), 1, kMaxInt64, &m.round); !s.ok()) {
      return s;
    }
  }
  absl::string_view role = f.back();
  if (absl::ConsumePrefix(&role, "rank")) {
    m.role = MemberId::Role::kRank;
  } else if (absl::ConsumePrefix(&role, "standby")) {
    m.role = MemberId::Role::kStandby;
  } else {
    return malformed("role", absl::StrCat("'", f.back(), "' is not rank<R> or standby<N>"));
  }
  int64_t index = 0;
  if (absl::Status s = number(m.role == MemberId::Role::kRank ? "rank" : "standby index", role, 0,
                              kMaxInt, &index);
      !s.ok()) {
    return s;
  }
  m.index = static_cast<int>(index);
  return m;
}

// agents/join/<host>: a host that joined the job, the `seq`-th to.
struct JoinRecord {
  std::string host;      // from the key
  int64_t seq = 0;       // >= 1
  bool standby = false;  // --standby-host: it trains only in place of a dead host
  std::string addr;      // its address (no space), where rank 0 listens if it is group 0
  int port = 0;          // the master port it offers
};
inline std::string EncodeJoinRecord(const JoinRecord& j) {
  return absl::StrFormat("%d %s %s %d", j.seq, j.standby ? "standby" : "worker", j.addr, j.port);
}
// `key` is the record's key (kAgentJoins.Key(host)): the host comes from it.
inline absl::StatusOr<JoinRecord> DecodeJoinRecord(std::string_view join_key,
                                                   std::string_view join_value) {
  using namespace agent_keys_internal;  // NOLINT(google-build-using-namespace)
  const absl::string_view key = View(join_key), value = View(join_value);
  JoinRecord j;
  absl::StatusOr<std::string> host = kAgentJoins.NameOrError(join_key, "host");
  if (!host.ok()) return host.status();
  j.host = *std::move(host);
  const std::vector<absl::string_view> f = absl::StrSplit(value, ' ');
  if (f.size() != 4) {
    return Malformed(key, value, "the record", "is not \"<seq> worker|standby <addr> <port>\"");
  }
  if (absl::Status s = ParseNumber(key, value, "seq", f[0], 1, kMaxInt64, &j.seq); !s.ok()) {
    return s;
  }
  if (f[1] != "worker" && f[1] != "standby") {
    return Malformed(key, value, "role", absl::StrCat("'", f[1], "' is not worker or standby"));
  }
  j.standby = f[1] == "standby";
  if (f[2].empty()) return Malformed(key, value, "addr", "is empty");
  j.addr = std::string(f[2]);
  int64_t port = 0;
  if (absl::Status s = ParseNumber(key, value, "port", f[3], 0, 65535, &port); !s.ok()) return s;
  j.port = static_cast<int>(port);
  return j;
}

// agents/plan: which hosts train, as which group rank, and where rank 0 listens. Written once by
// the coordinator when enough hosts joined, and again for each restart round that gives a dead
// host's group rank to a standby host (--restart-all).
struct Plan {
  int training_hosts = 0;  // >= 1
  int ranks_per_host = 0;  // >= 1
  std::string master_addr;
  int master_port = 0;
  struct Host {
    std::string host;
    int group = -1;  // -1: a standby host
  };
  std::vector<Host> hosts;  // every host that joined, in join order

  // host -> group rank (-1: standby), of every host the plan names.
  std::map<std::string, int> Groups() const {
    std::map<std::string, int> groups;
    for (const Host& h : hosts) groups[h.host] = h.group;
    return groups;
  }
  // The group rank of `host`; -1 when it is a standby host or not named.
  int GroupOf(std::string_view host) const {
    for (const Host& h : hosts) {
      if (h.host == host) return h.group;
    }
    return -1;
  }
};
inline std::string EncodePlan(const Plan& p) {
  std::string value = absl::StrFormat("%d %d %s %d", p.training_hosts, p.ranks_per_host,
                                      p.master_addr, p.master_port);
  for (const Plan::Host& h : p.hosts) absl::StrAppendFormat(&value, "\n%s %d", h.host, h.group);
  return value;
}
inline absl::StatusOr<Plan> DecodePlan(std::string_view plan_value) {
  using namespace agent_keys_internal;  // NOLINT(google-build-using-namespace)
  const absl::string_view key = kAgentPlan, value = View(plan_value);
  const std::vector<absl::string_view> lines = absl::StrSplit(value, '\n');
  const std::vector<absl::string_view> head = absl::StrSplit(lines[0], ' ');
  if (head.size() != 4) {
    return Malformed(key, value, "line 1",
                     "is not \"<training hosts> <ranks per host> <master addr> <port>\"");
  }
  Plan p;
  int64_t n = 0;
  if (absl::Status s = ParseNumber(key, value, "training hosts", head[0], 1, kMaxInt, &n);
      !s.ok()) {
    return s;
  }
  p.training_hosts = static_cast<int>(n);
  if (absl::Status s = ParseNumber(key, value, "ranks per host", head[1], 1, kMaxInt, &n);
      !s.ok()) {
    return s;
  }
  p.ranks_per_host = static_cast<int>(n);
  if (head[2].empty()) return Malformed(key, value, "master addr", "is empty");
  p.master_addr = std::string(head[2]);
  if (absl::Status s = ParseNumber(key, value, "port", head[3], 0, 65535, &n); !s.ok()) return s;
  p.master_port = static_cast<int>(n);
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<absl::string_view> f = absl::StrSplit(lines[i], ' ');
    const std::string field = absl::StrCat("line ", i + 1);
    if (f.size() != 2 || f[0].empty()) {
      return Malformed(key, value, field, "is not \"<host> <group rank>\"");
    }
    if (absl::Status s =
            ParseNumber(key, value, absl::StrCat(field, "'s group rank"), f[1], -1, kMaxInt, &n);
        !s.ok()) {
      return s;
    }
    p.hosts.push_back({std::string(f[0]), static_cast<int>(n)});
  }
  return p;
}

// agents/deaths/<member>: the agent of `member`'s host saw it die, holding `rank`.
// The value is "<rank> <how>", then "\n<cause>" when there is a cause: a record of an agent that
// writes no cause (an older one) decodes with an empty cause, and an older agent reading a newer
// record sees the cause as a second line of the how. `how` and `cause` are one line each: Encode
// writes a newline in either as a space.
struct DeathReport {
  std::string member;  // from the key
  int rank = -1;       // >= 0
  std::string how;     // "exited with status 1", "killed by signal 9 (Killed)", ...
  // The evidence of the death, for the message that fails the job (sdk/agent/failure_history.h):
  // the last error line the rank printed, or why its agent killed it; empty when there is none.
  std::string cause;
};
inline std::string EncodeDeathReport(const DeathReport& d) {
  const auto one_line = [](std::string text) {
    std::replace(text.begin(), text.end(), '\n', ' ');
    return text;
  };
  std::string value = absl::StrCat(d.rank, " ", one_line(d.how));
  if (!d.cause.empty()) absl::StrAppend(&value, "\n", one_line(d.cause));
  return value;
}
// `key` is the report's key (kAgentDeaths.Key(member)): the member comes from it.
inline absl::StatusOr<DeathReport> DecodeDeathReport(std::string_view death_key,
                                                     std::string_view death_value) {
  using namespace agent_keys_internal;  // NOLINT(google-build-using-namespace)
  const absl::string_view key = View(death_key), value = View(death_value);
  DeathReport d;
  absl::StatusOr<std::string> member = kAgentDeaths.NameOrError(death_key, "member");
  if (!member.ok()) return member.status();
  d.member = *std::move(member);
  const size_t space = value.find(' ');
  if (space == absl::string_view::npos) {
    return Malformed(key, value, "the report", "is not \"<rank> <how>\"");
  }
  int64_t rank = 0;
  if (absl::Status s = ParseNumber(key, value, "rank", value.substr(0, space), 0, kMaxInt, &rank);
      !s.ok()) {
    return s;
  }
  d.rank = static_cast<int>(rank);
  const absl::string_view rest = value.substr(space + 1);
  const size_t newline = rest.find('\n');
  d.how = std::string(rest.substr(0, newline));
  if (newline != absl::string_view::npos) d.cause = std::string(rest.substr(newline + 1));
  return d;
}

// agents/restart: the newest restart round (--restart-all), and why it was started.
struct RestartRound {
  int64_t round = 0;  // >= 1
  std::string why;
};
inline std::string EncodeRestartRound(const RestartRound& r) {
  return absl::StrCat(r.round, " ", r.why);
}
inline absl::StatusOr<RestartRound> DecodeRestartRound(std::string_view restart_value) {
  using namespace agent_keys_internal;  // NOLINT(google-build-using-namespace)
  const absl::string_view value = View(restart_value);
  RestartRound r;
  const size_t space = value.find(' ');
  if (absl::Status s = ParseNumber(kAgentRestart, value, "round", value.substr(0, space), 1,
                                   kMaxInt64, &r.round);
      !s.ok()) {
    return s;
  }
  if (space != absl::string_view::npos) r.why = std::string(value.substr(space + 1));
  return r;
}

// coord/lease: the coordinator lease (sdk/rendezvous/coordinator_lease.h) of term `term`, held by
// the agent `holder` (CoordinatorLease::kReleasedHolder once released), renewed `beat` times.
struct LeaseRecord {
  int64_t term = 0;
  std::string holder;  // no space
  int64_t beat = 0;
};
inline std::string EncodeLeaseRecord(const LeaseRecord& l) {
  return absl::StrCat(l.term, " ", l.holder, " ", l.beat);
}
inline absl::StatusOr<LeaseRecord> DecodeLeaseRecord(std::string_view lease_value) {
  using namespace agent_keys_internal;  // NOLINT(google-build-using-namespace)
  const absl::string_view value = View(lease_value);
  const std::vector<absl::string_view> f = absl::StrSplit(value, ' ');
  if (f.size() != 3) {
    return Malformed(kCoordLease, value, "the lease", "is not \"<term> <holder> <beat>\"");
  }
  LeaseRecord l;
  if (absl::Status s = ParseNumber(kCoordLease, value, "term", f[0], 0, kMaxInt64, &l.term);
      !s.ok()) {
    return s;
  }
  if (f[1].empty()) return Malformed(kCoordLease, value, "holder", "is empty");
  l.holder = std::string(f[1]);
  if (absl::Status s = ParseNumber(kCoordLease, value, "beat", f[2], 0, kMaxInt64, &l.beat);
      !s.ok()) {
    return s;
  }
  return l;
}

}  // namespace trainguard::store_keys

#endif  // TRAINGUARD_SDK_CORE_AGENT_KEYS_H_
