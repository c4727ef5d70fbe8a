#!/usr/bin/env bash
# The megatron_like example (tensor 2 x pipeline 2 x data 2 = 8 ranks) against the example
# trainer (8 data-parallel ranks, one communicator), under `trainguard run` on this machine:
#
#   overhead   the median step time (its guard included) with the groups' operations tracked
#              and without (--track 0), TRIALS runs of each, alternated, at --micro-batches 16
#              --blocks-per-stage 8: 256 tensor-parallel allreduces, 32 sends and receives and 2
#              data-parallel collectives per step, ~290 tracked operations
#   culprit    a hang's culprit named: the script SIGSTOPs rank 1 once training is under way and
#              polls the launcher's output every 10 ms for "hang diagnosis: suspects: rank 1";
#              the time from the SIGSTOP to that line, for both trainers, TRIALS runs each
#
#   bench/bench_megatron_like.sh [overhead|culprit|all] [TRIALS=3]
# (after ./scripts/test.sh has built ${TG_BUILD_DIR:-build}/${TG_PRESET:-default}).
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
trials="${2:-3}"
build="${TG_BUILD_DIR:-build}/${TG_PRESET:-default}"
trainguard="$build/tools/trainguard"
megatron="$build/examples/megatron_like/megatron_like"
cpp_trainer="$build/examples/cpp_trainer/cpp_trainer"

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

overhead() {
  local tracked=() untracked=()
  for t in $(seq "$trials"); do
    for track in 1 0; do
      run_dir="$(mktemp -d "${TMPDIR:-/tmp}/tg-megatron.XXXXXX")"
      TRAINGUARD_TP=2 TRAINGUARD_PP=2 "$trainguard" run --nproc 8 --job-id "mo$t$track" \
        --run-dir "$run_dir" -- "$megatron" --steps 40 --print-every 100 --micro-batches 16 \
        --blocks-per-stage 8 --track "$track" >"$run_dir/out" 2>&1
      us="$(grep -oE 'median_step_us [0-9]+' "$run_dir/out" | awk '{print $2}' | median)"
      echo "trial $t track $track: median step ${us} us (median over the 8 ranks)"
      if [ "$track" = 1 ]; then tracked+=("$us"); else untracked+=("$us"); fi
      rm -rf "$run_dir"
    done
  done
  a="$(printf '%s\n' "${tracked[@]}" | median)"
  b="$(printf '%s\n' "${untracked[@]}" | median)"
  awk -v a="$a" -v b="$b" 'BEGIN {printf "overhead: tracked %d us, untracked %d us per step (medians of the trials): ratio %.4f\n", a, b, a / b}'
}

# One run: `trainer` with its flags on 8 ranks; SIGSTOP rank 1 after `progress` appears; prints the
# seconds from the stop to the culprit named.
culprit_once() {
  local name="$1" progress="$2"
  shift 2
  run_dir="$(mktemp -d "${TMPDIR:-/tmp}/tg-culprit.XXXXXX")"
  out="$run_dir/out"
  "$trainguard" run --nproc 8 --standby 1 --heartbeat-timeout 600 --job-id "culprit-$name-$$" \
    --run-dir "$run_dir" -- "$@" >"$out" 2>&1 &
  launcher=$!
  for _ in $(seq 1200); do grep -qs "$progress" "$out" && break; sleep 0.05; done
  pid="$(cat "$run_dir/pids/rank-1")"
  start="$(date +%s.%N)"
  kill -STOP "$pid"
  for _ in $(seq 3000); do
    grep -qs 'hang diagnosis: suspects: rank 1$' "$out" && break
    sleep 0.01
  done
  end="$(date +%s.%N)"
  kill -TERM "$launcher" 2>/dev/null || true
  wait "$launcher" 2>/dev/null || true
  "$trainguard" shm remove --job "culprit-$name-$$" >/dev/null 2>&1 || true
  if ! grep -qs 'hang diagnosis: suspects: rank 1$' "$out"; then
    echo "$name: no culprit named" >&2
    grep 'hang diagnosis' "$out" >&2 || true
    return 1
  fi
  awk -v a="$start" -v b="$end" 'BEGIN {printf "%.3f\n", b - a}'
  rm -rf "$run_dir"
}

culprit() {
  local m=() d=()
  for t in $(seq "$trials"); do
    s="$(TRAINGUARD_TP=2 TRAINGUARD_PP=2 culprit_once megatron 'step 20 loss' "$megatron" \
      --steps 100000 --print-every 10 --comm-timeout-s 30)"
    echo "trial $t megatron_like (tp, pp links, dp: 26 tracked operations a step): ${s} s"
    m+=("$s")
    s="$(TRAINGUARD_TP=1 TRAINGUARD_PP=1 culprit_once cpp_trainer 'step 200 loss' "$cpp_trainer" \
      --steps 1000000 --print-every 100 --comm-timeout-s 30)"
    echo "trial $t cpp_trainer (one data-parallel communicator): ${s} s"
    d+=("$s")
  done
  printf 'culprit named after the SIGSTOP: megatron_like median %s s (max %s), cpp_trainer median %s s (max %s)\n' \
    "$(printf '%s\n' "${m[@]}" | median)" "$(printf '%s\n' "${m[@]}" | sort -n | tail -1)" \
    "$(printf '%s\n' "${d[@]}" | median)" "$(printf '%s\n' "${d[@]}" | sort -n | tail -1)"
}

case "$what" in
  overhead) overhead ;;
  culprit) culprit ;;
  all) overhead; culprit ;;
  *) echo "usage: $0 [overhead|culprit|all] [TRIALS]" >&2; exit 2 ;;
esac
