// HostLiveness: which hosts of a multi-host job the coordinator of `trainguard run` finds silent,
// and so declares dead, from the agents' heartbeats it reads at each tick.
//
// Every agent advances its heartbeat (store key agents/hb/<host>) every timeout / 12. A host whose
// heartbeat has not changed for `timeout` of the coordinator's reads is silent: exactly `timeout`
// is silent, a nanosecond less is not. Two rules keep a live host from being blamed for a silence
// that is not its own:
//
//  - A gap in the reads. When the coordinator's previous read is more than timeout / 3 before this
//    one (the store was unavailable to it, say during an etcd leader election, or the coordinator
//    itself stalled), it saw nobody's heartbeat meanwhile: every host's bound starts afresh.
//  - A host seen for the first time gets a full timeout from then, whatever its heartbeat. This
//    holds for the previous lease holder's host after a takeover too: its lease lapsed because the
//    new holder did not see it renewed for `timeout`, which a stalled store causes as well while
//    that host trains on (issue 36). Losing the coordinator's host thus costs the lease's expiry
//    and then a full timeout; any other host, one timeout.
//
// Two ways to read the heartbeats. Observe takes their values: a host's silence counts from the
// read that saw its value change, so it is declared up to two reads late (the read after its last
// beat, and the first read after the bound). ObserveAges takes how long ago the store last wrote
// each (Store::MultiGetWithAges, by the store's own clock), so a host's silence counts from its
// last write itself, as seen from the answer: since = (the answer's arrival - the age), never
// before the write and late by at most the answer's way back; its deadline is since + timeout.
// With ages the caller need not read every host at every tick: only those DueForRead names (their
// beat is `recheck` old: a live host's next beat moves them on; a silent one is read at each call
// until its deadline is confirmed), plus every host at the start, and a host that joins. The
// gap rule holds for ObserveAges as for Observe: the caller calls it at each read of the store,
// with the hosts it read (maybe none), so a call more than timeout / 3 after the previous one is a
// gap. The first-seen rule too: a host is given a full timeout from the read that first saw it,
// whatever its age.
//
// The unit is pure: it does no I/O and reads no clock; the caller passes the heartbeats it read and
// when it read them, so tests drive it with explicit instants. It returns the silent hosts with how
// long they were silent; the launcher does the rest (the fence agents/dead/<host>, replacing the
// host's ranks). A host stays reported at each Observe while silent until the caller forgets it:
// the launcher forgets a host once its death is written, so a write that failed is tried again at
// the next tick.
//
// Thread safety: not thread-safe; one thread (the coordinator's loop, a test) uses an instance.
#ifndef TRAINGUARD_SDK_AGENT_HOST_LIVENESS_H_
#define TRAINGUARD_SDK_AGENT_HOST_LIVENESS_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace trainguard {

class HostLiveness {
 public:
  // A host whose heartbeat did not change for the timeout or longer.
  struct Silent {
    std::string host;
    // When its heartbeat was last seen to change, or its bound last started afresh (first seen, a
    // gap in the reads).
    absl::Time since;
    absl::Duration silent_for;  // now - since, at least the timeout
  };

  // REQUIRES: timeout > 0; 0 < recheck <= timeout.
  explicit HostLiveness(absl::Duration timeout);
  HostLiveness(absl::Duration timeout, absl::Duration recheck);

  // The heartbeats read at `now`: host -> its heartbeat's current value ("" when it has none yet),
  // for the hosts still in the job (the caller leaves out its own host, hosts declared dead and
  // those that left). Returns those of them silent for the timeout or longer, by host name. Hosts
  // not in `beats` keep their record but are neither checked nor returned.
  // REQUIRES: `now` is not before the previous call's.
  std::vector<Silent> Observe(const std::map<std::string, std::string>& beats, absl::Time now);

  // The heartbeats' ages read at `now` (the instant the answer arrived): host -> how long ago the
  // store last wrote its heartbeat (nullopt: it has none yet), for the hosts read (as for Observe,
  // neither this agent's own host nor hosts dead or gone). Each host's silence starts at
  // max(now - age, when its bound last started afresh); returns those of them silent for the
  // timeout or longer at `now`, by host name. Hosts not in `ages` keep their record.
  // REQUIRES: `now` is not before the previous call's (of either Observe).
  std::vector<Silent> ObserveAges(const std::map<std::string, std::optional<absl::Duration>>& ages,
                                  absl::Time now);
  // The hosts observed (and not forgotten) whose heartbeat is `recheck` old or older at `now`, as
  // of the last Observe: the ones to read again (a live one has beaten since; a silent one is
  // confirmed, at its deadline, by such a read). By host name.
  std::vector<std::string> DueForRead(absl::Time now) const;
  // Whether `host` has a record (observed and not forgotten).
  bool Knows(const std::string& host) const { return beats_.count(host) != 0; }

  // Drops `host`'s record: it is not reported again, and should it appear in `beats` again it is a
  // host seen for the first time.
  void Forget(const std::string& host);

  // Whether `host` has been silent for the timeout or longer at `now`, as of the last Observe;
  // false for a host not observed (or forgotten).
  bool IsSilent(const std::string& host, absl::Time now) const;
  // The hosts whose heartbeat has not changed for `quiet` or longer at `now`, as of the last
  // Observe, by host name: silent for less than the timeout, maybe (a host cut off is quiet for a
  // while before it is silent). Hosts forgotten are not among them.
  std::vector<Silent> QuietFor(absl::Duration quiet, absl::Time now) const;
  // When every host's bound last started afresh (the first Observe, or a gap in the reads): until
  // `quiet` after it, QuietFor cannot tell a host silent for `quiet`. InfinitePast before any
  // Observe.
  absl::Time bounds_since() const { return bounds_since_; }

  absl::Duration timeout() const { return timeout_; }
  absl::Duration recheck() const { return recheck_; }

 private:
  // A gap in the reads (the previous more than timeout / 3 before `now`): every bound afresh.
  void StartBoundsAfterGap(absl::Time now);

  struct Beat {
    std::string value;
    absl::Time since;  // Silent::since
  };

  absl::Duration timeout_;
  absl::Duration recheck_;
  std::map<std::string, Beat> beats_;
  absl::Time last_read_ = absl::InfinitePast();
  absl::Time bounds_since_ = absl::InfinitePast();
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_AGENT_HOST_LIVENESS_H_
