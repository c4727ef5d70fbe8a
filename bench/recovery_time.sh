#!/usr/bin/env bash
# Time to recovery after a SIGKILL, at N ranks: runs the example trainer under `trainguard run` with
# one warm standby, kills one rank once training is under way, and reads the launcher's report
# ("recovered from the loss of rank R in X s": death seen by the launcher -> every rank completed its
# first step of the new generation). Repeats TRIALS times; prints each figure, then p50 and max.
#
#   bench/recovery_time.sh [NPROC=8] [TRIALS=5] [TRAINER_FLAG...]
# (after ./scripts/test.sh has built ${TG_BUILD_DIR:-build}/${TG_PRESET:-default}). Flags after the
# trials go to the trainer: `--extra-state-mib 256` gives each rank 256 MiB more state, which the
# replacement gets by the example's broadcast from a survivor, or, with trainguard's checkpoints on
# (TRAINGUARD_CHECKPOINT_EVERY_STEPS and _DIR in the environment), from the dead rank's arena.
# TG_TRAINER=megatron_like runs examples/megatron_like instead (set TRAINGUARD_TP and TRAINGUARD_PP,
# and checkpointing: its ranks hold shards, restored from a checkpoint; `--state-mib N` gives each
# rank N MiB more state); the rank killed, NPROC/2, is then a tensor-parallel rank of a later stage.
set -euo pipefail
cd "$(dirname "$0")/.."
nproc="${1:-8}"
trials="${2:-5}"
shift $(($# < 2 ? $# : 2))
build="${TG_BUILD_DIR:-build}/${TG_PRESET:-default}"
trainguard="$build/tools/trainguard"
trainer_name="${TG_TRAINER:-cpp_trainer}"
trainer="$build/examples/$trainer_name/$trainer_name"
victim_rank=$((nproc / 2))
figures=()
for t in $(seq "$trials"); do
  run_dir="$(mktemp -d "${TMPDIR:-/tmp}/tg-recovery.XXXXXX")"
  out="$run_dir/out"
  "$trainguard" run --nproc "$nproc" --standby 1 --job-id "recovery$t" --run-dir "$run_dir" -- \
    "$trainer" --steps 600 --print-every 100 --comm-timeout-s 10 "$@" >"$out" 2>&1 &
  launcher=$!
  for _ in $(seq 600); do grep -qs 'step 200 loss' "$out" && break; sleep 0.1; done
  kill -9 "$(cat "$run_dir/pids/rank-$victim_rank")"
  wait "$launcher" || { echo "trial $t: launcher failed"; tail -20 "$out"; exit 1; }
  s="$(grep -oE 'recovered from the loss of rank [0-9]+ in [0-9.]+ s' "$out" | awk '{print $(NF-1)}')"
  echo "trial $t: ${s:-none} s"
  figures+=("$s")
  rm -rf "$run_dir"
done
printf '%s\n' "${figures[@]}" | sort -n | awk -v n="$nproc" '{a[NR]=$1} END {
  printf "time to recovery at %d ranks over %d trials: p50 %.3f s, max %.3f s\n", n, NR, a[int((NR+1)/2)], a[NR]}'
