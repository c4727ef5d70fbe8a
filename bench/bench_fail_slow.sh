#!/bin/sh
# Records labelled fail-slow runs on simulated hosts and replays them through the detector and its
# baselines (bench/bench_fail_slow.cc). Needs root (simulated hosts, a CPU cgroup, tc, iptables).
#
#   bench/bench_fail_slow.sh [BUILD_DIR] [REPEATS] [SECONDS] [LONG_SECONDS]
#
# Three sets of runs, host3 the degraded host in each faulty one (bench_fail_slow_record.cc):
#   4 hosts x 2 ranks, REPEATS runs of SECONDS each of: throttle (host3's ranks capped at 2% of a
#     CPU), delay (they sleep 20 ms per step), slowlink (host3's packets shaped to 2 Mbit/s),
#     lossy (5% of them dropped), membw (a memory-bandwidth hog on host3), healthy, rl;
#   8 hosts x 1 rank, REPEATS runs of SECONDS each of: throttle, slowlink, lossy, healthy;
#   4 hosts x 2 ranks with --fail-slow evict and a standby host, one run of LONG_SECONDS each of:
#     healthy, rl (the long fault-free evidence: false alarms and evictions; 0 skips them).
# REPLAY_ONLY=1 skips the recording and replays the traces already in the trace folder; SETS
# (default "h4 h8 long") records only the sets named and SCENARIOS only those 4-host scenarios;
# every trace found is replayed.
# The trainer's seeds are fixed; the scheduling of the simulated hosts on the machine is not, so
# repeats differ.
set -eu
build=${1:-build/default}
repeats=${2:-2}
seconds=${3:-60}
long_seconds=${4:-600}
bench=$build/bench/bench_fail_slow
out=$(realpath -m "$build/bench/fail-slow-traces")
mkdir -p "$out"
specs=""        # LABEL:FAULTY:TRACE of every run
watchdog=""     # --watchdog-named flags
set_specs=""    # "set|spec" lines, to replay each set alone

sets=${SETS:-h4 h8 long}
scenarios=${SCENARIOS:-throttle delay slowlink lossy membw healthy rl}

# record SET LABEL SCENARIO SECONDS [record flags...]
record() {
  set_name=$1 label=$2 scenario=$3 secs=$4
  shift 4
  trace=$out/$label.trace
  if [ "${REPLAY_ONLY:-0}" = 1 ] || ! echo " $sets " | grep -q " $set_name " ||
    { [ "$set_name" = h4 ] && ! echo " $scenarios " | grep -q " $scenario "; }; then
    [ -s "$trace" ] || return 0
    line=$(cat "$trace.line" 2>/dev/null || echo "")
  else
    line=$("$bench" record --scenario "$scenario" --seconds "$secs" --out "$trace" "$@")
    echo "$line" > "$trace.line"
    echo "$line"
  fi
  case $scenario in healthy|rl) faulty=none ;; *) faulty=host3 ;; esac
  specs="$specs $label:$faulty:$trace"
  set_specs="$set_specs
$set_name|$label:$faulty:$trace"
  hangs=$(echo "$line" | sed -n 's/.*watchdog hang events: \([0-9]*\).*/\1/p')
  # A hang the watchdog declared names the job, not a host: it counts as naming host3 only in
  # a run where host3 is the faulty one (the most favourable reading for the baseline).
  if [ "${hangs:-0}" -gt 0 ]; then watchdog="$watchdog --watchdog-named $label=host3"; fi
}

for scenario in throttle delay slowlink lossy membw healthy rl; do
  i=1
  while [ "$i" -le "$repeats" ]; do
    record h4 "$scenario-$i" "$scenario" "$seconds"
    i=$((i + 1))
  done
done
for scenario in throttle slowlink lossy healthy; do
  i=1
  while [ "$i" -le "$repeats" ]; do
    record h8 "h8-$scenario-$i" "$scenario" "$seconds" --hosts 8 --ranks-per-host 1
    i=$((i + 1))
  done
done
if [ "$long_seconds" -gt 0 ]; then
  for scenario in healthy rl; do
    record long "long-$scenario" "$scenario" "$long_seconds" --fail-slow evict
  done
fi

echo
echo "== all runs: defaults (continuity 10 s, window 9 s, metrics in priority order)"
# shellcheck disable=SC2086
"$bench" --continuity 10 $watchdog $specs
for set_name in h4 h8 long; do
  these=$(echo "$set_specs" | sed -n "s/^$set_name|//p" | tr '\n' ' ')
  [ -n "$these" ] || continue
  echo
  echo "== set $set_name alone"
  # shellcheck disable=SC2086
  "$bench" --continuity 10 $watchdog $these | tail -3
done
for scenario in throttle delay slowlink lossy membw; do
  these=$(echo "$set_specs" | sed -n "s/^h4|\($scenario-[0-9]*:\)/\1/p" | tr '\n' ' ')
  [ -n "$these" ] || continue
  echo
  echo "== $scenario runs alone (4 hosts): recall and latency"
  # shellcheck disable=SC2086
  "$bench" --continuity 10 $watchdog $these | tail -3
done
for metric in compute_ms cpu_wait_ms tcp_retrans tcp_rtt_ms collective_ms cpu_util; do
  echo
  echo "== $metric alone, all runs"
  # shellcheck disable=SC2086
  "$bench" --continuity 10 --metrics "$metric" $watchdog $specs | tail -3 | head -1
done
