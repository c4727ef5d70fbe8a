#!/usr/bin/env bash
# The trainguard demo: the example trainer (examples/cpp_trainer) as a 4-rank data-parallel job under
# `trainguard run` with 1 warm standby, every step guarded. Two faults are injected for real:
#   - at step 100, rank 1's loss is made NaN (a corrupt example): the guard names rank 1 and every
#     rank skips that update;
#   - once step 300 is passed, this script kills rank 2 with SIGKILL: the standby takes rank 2 in the
#     next generation, the survivors keep their processes, and every rank restores the newest
#     committed checkpoint (the guard snapshots every 50 steps into a shared-memory arena per rank,
#     every 4th snapshot also to disk): the replacement from the dead rank's arena, without disk and
#     without a peer broadcast. Training goes on from that step. The launcher prints the time to recovery (death seen to the
#     first step of the new generation completed on every rank).
# At the end: whether every rank finished, the loss before and after, whether the replicas are
# bit-identical, and the replacement as recorded in the ranks' event files.
#
#   ./scripts/demo.sh              the above
#   ./scripts/demo.sh --no-fault   the same job without faults
#   ./scripts/demo.sh -- ARGS      extra trainer flags, e.g. -- --lr 0.2
#
# Build output goes to ${TG_BUILD_DIR:-build}/default; the job's files (events, logs, pids, store
# token) to a fresh temporary run directory, printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

faults=1
trainer_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-fault) faults=0 ;;
    --) shift; trainer_args=("$@"); break ;;
    *) echo "usage: $0 [--no-fault] [-- trainer flags]" >&2; exit 2 ;;
  esac
  shift
done

./scripts/setup.sh

build_dir="${TG_BUILD_DIR:-build}/default"
mkdir -p "$build_dir"
cmake --preset default -B "$build_dir" >"$build_dir/configure.log" 2>&1 \
  || { cat "$build_dir/configure.log"; exit 1; }
cmake --build "$build_dir" --target cpp_trainer trainguard_cli
trainer="$build_dir/examples/cpp_trainer/cpp_trainer"
trainguard="$build_dir/tools/trainguard"

run_dir="$(mktemp -d "${TMPDIR:-/tmp}/trainguard-demo.XXXXXX")"
out="$run_dir/launcher.out"
steps=1000
inject=()
[ "$faults" = 1 ] && inject=(--inject-nan 1:100)

TRAINGUARD_CHECKPOINT_EVERY_STEPS=50 TRAINGUARD_CHECKPOINT_PERSIST_EVERY=4 \
"$trainguard" run --nproc 4 --standby 1 --job-id demo --run-dir "$run_dir" -- \
  "$trainer" --steps "$steps" --print-every 100 --comm-timeout-s 10 "${inject[@]}" "${trainer_args[@]}" >"$out" 2>&1 &
launcher=$!
trap 'kill -TERM $launcher 2>/dev/null || true' EXIT
tail -n +1 -f "$out" --pid "$launcher" &

if [ "$faults" = 1 ]; then
  # Bounded wait (60 s) for step 300, then kill rank 2.
  for _ in $(seq 600); do
    grep -q 'step 300 loss' "$out" && break
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.1
  done
  if grep -q 'step 300 loss' "$out"; then
    victim="$(cat "$run_dir/pids/rank-2")"
    echo "demo: kill -9 rank 2 (pid $victim)"
    kill -9 "$victim"
  fi
fi

status=0
wait "$launcher" || status=$?
trap - EXIT
sleep 0.2  # let tail print the last lines

echo
echo "================ demo summary ================"
echo "launcher exit status: $status"
grep -E 'takes rank|recovered from|fault step_failure|restored step' "$out" | sed 's/^/  /' || true
echo "checkpoints on disk (trainguard ckpt list $run_dir/checkpoints):"
"$trainguard" ckpt list "$run_dir/checkpoints" | sed 's/^/  /' | head -8 || true
first="$(grep -m1 -oE 'step 0 loss [0-9.]+' "$out" | awk '{print $4}')"
last="$(grep -oE 'final_loss [0-9.a-z]+' "$out" | tail -1 | awk '{print $2}')"
echo "loss: step 0 $first -> final $last"
sums="$(grep -oE 'params_checksum [0-9a-f]+' "$out" | awk '{print $2}' | sort -u)"
n_sums="$(grep -c 'params_checksum' "$out" || true)"
if [ "$n_sums" = 4 ] && [ "$(echo "$sums" | wc -l)" = 1 ]; then
  echo "replicas: all 4 ranks end with parameters checksum $sums (bit-identical)"
else
  echo "replicas: DIFFER or missing: $(echo "$sums" | tr '\n' ' ')"
  status=1
fi
echo "events of the replacement (trainguard events $run_dir):"
"$trainguard" events "$run_dir" | grep -E 'replaced rank|decision=re_rendezvous|loss is not finite|restored the state' \
  | sed 's/^/  /' | head -8 || true
echo "run dir: $run_dir"
exit "$status"
