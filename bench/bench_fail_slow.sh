#!/bin/sh
# Records labelled fail-slow runs on simulated hosts and replays them through the detector and its
# baselines (bench/bench_fail_slow.cc). Needs root (simulated hosts, a CPU cgroup).
#
#   bench/bench_fail_slow.sh [BUILD_DIR] [REPEATS] [SECONDS]
#
# Scenarios, each REPEATS times for SECONDS: throttle (host3's ranks capped at 2% of a CPU),
# delay (host3's ranks sleep 20 ms per step), healthy, rl (RL-shaped steps, no fault). The trainer's
# seeds are fixed; the scheduling of the simulated hosts on the machine is not, so repeats differ.
set -eu
build=${1:-build/default}
repeats=${2:-2}
seconds=${3:-60}
bench=$build/bench/bench_fail_slow
out=$(realpath -m "$build/bench/fail-slow-traces")
mkdir -p "$out"
specs=""
watchdog=""
for scenario in throttle delay healthy rl; do
  i=1
  while [ "$i" -le "$repeats" ]; do
    trace=$out/$scenario-$i.trace
    line=$("$bench" record --scenario "$scenario" --seconds "$seconds" --out "$trace")
    echo "$line"
    case $scenario in throttle|delay) faulty=host3 ;; *) faulty=none ;; esac
    specs="$specs $scenario-$i:$faulty:$trace"
    hangs=$(echo "$line" | sed -n 's/.*watchdog hang events: \([0-9]*\).*/\1/p')
    # A hang the watchdog declared names the job, not a host: it counts as naming host3 only in
    # a run where host3 is the faulty one (the most favourable reading for the baseline).
    if [ "${hangs:-0}" -gt 0 ]; then watchdog="$watchdog --watchdog-named $scenario-$i=host3"; fi
    i=$((i + 1))
  done
done
echo
echo "== defaults (continuity 10 s, window 9 s, metrics in priority order)"
# shellcheck disable=SC2086
"$bench" --continuity 10 $watchdog $specs
for metric in compute_ms cpu_wait_ms collective_ms cpu_util; do
  echo
  echo "== $metric alone"
  # shellcheck disable=SC2086
  "$bench" --continuity 10 --metrics "$metric" $watchdog $specs | tail -3 | head -1
done
