#!/usr/bin/env bash
# The Python demo: examples/python_ddp/train.py (a small MLP trained with PyTorch DDP on gloo, every
# step guarded, snapshotted every 10 steps into a shared-memory arena per rank, every 2nd snapshot
# also to disk) as a 3-rank job under `trainguard run` with 1 warm standby. Two faults are injected:
#   - at step 60, rank 1's gradients hold a NaN: the DDP hook names rank 1 and the bucket, and
#     every rank skips that update;
#   - at step 150 every rank waits (the trainer's --gate) while this script kills rank 2 with
#     SIGKILL: the survivors' allreduce fails (a communication failure), the standby takes rank 2
#     in the next generation and restores the dead rank's arena, every rank restores the newest
#     committed checkpoint, rebuilds its process group and DDP for the new generation, and
#     training goes on.
# At the end: whether every rank finished and whether the replicas are bit-identical.
#
#   ./scripts/demo_python.sh              the above
#   ./scripts/demo_python.sh --no-fault   the same job without faults
#
# Needs ./scripts/setup.sh's .venv (torch). The job's files go to a fresh temporary run directory.
set -euo pipefail
cd "$(dirname "$0")/.."

faults=1
case "${1:-}" in
  --no-fault) faults=0 ;;
  "") ;;
  *) echo "usage: $0 [--no-fault]" >&2; exit 2 ;;
esac

./scripts/setup.sh

build_dir="${TG_BUILD_DIR:-build}/default"
mkdir -p "$build_dir"
cmake --preset default -B "$build_dir" -DTRAINGUARD_PYTHON=ON "-DPython_EXECUTABLE=$PWD/.venv/bin/python" \
  >"$build_dir/configure.log" 2>&1 || { cat "$build_dir/configure.log"; exit 1; }
cmake --build "$build_dir" --target trainguard_python trainguard_cli
trainguard="$build_dir/tools/trainguard"
export PYTHONPATH="$PWD/$build_dir/python${PYTHONPATH:+:$PYTHONPATH}"

run_dir="$(mktemp -d "${TMPDIR:-/tmp}/trainguard-demo-python.XXXXXX")"
out="$run_dir/launcher.out"
gate="$run_dir/gate-150"
steps=300
trainer_args=(--steps "$steps" --print-every 25)
[ "$faults" = 1 ] && trainer_args+=(--inject-nan-grad 1:60 --gate "150:$gate")

TRAINGUARD_CHECKPOINT_EVERY_STEPS=10 TRAINGUARD_CHECKPOINT_PERSIST_EVERY=2 \
"$trainguard" run --nproc 3 --standby 1 --job-id demo-python --run-dir "$run_dir" -- \
  .venv/bin/python examples/python_ddp/train.py "${trainer_args[@]}" >"$out" 2>&1 &
launcher=$!
trap 'touch "$gate"; kill -TERM $launcher 2>/dev/null || true' EXIT
tail -n +1 -f "$out" --pid "$launcher" &

if [ "$faults" = 1 ]; then
  # Bounded wait (120 s) for rank 2 to reach the gate at step 150, then kill it and open the gate.
  for _ in $(seq 1200); do
    grep -q 'rank 2 waiting at step 150' "$out" && break
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.1
  done
  if grep -q 'rank 2 waiting at step 150' "$out"; then
    victim="$(cat "$run_dir/pids/rank-2")"
    # Only a positive pid whose parent is this demo's launcher.
    if [ "${victim:-0}" -gt 1 ] && [ "$(awk '{print $4}' "/proc/$victim/stat" 2>/dev/null)" = "$launcher" ]; then
      echo "demo: kill -9 rank 2 (pid $victim)"
      kill -9 "$victim"
    fi
  fi
  touch "$gate"
fi

status=0
wait "$launcher" || status=$?
trap - EXIT
sleep 0.2  # let tail print the last lines

echo
echo "================ demo summary ================"
echo "launcher exit status: $status"
grep -E 'takes rank|recovered from|fault step_failure|fault communication_failure' "$out" \
  | cut -c1-220 | sed 's/^/  /' || true
finals="$(grep -E 'final_loss' "$out" || true)"
echo "$finals" | sed 's/^/  /'
ranks="$(echo "$finals" | grep -c final_loss || true)"
distinct="$(echo "$finals" | grep -o 'params_checksum [0-9a-f]*' | sort -u | wc -l)"
if [ "$ranks" = 3 ] && [ "$distinct" = 1 ]; then
  echo "every rank finished; the 3 replicas are bit-identical"
else
  echo "NOT every rank finished with identical parameters (ranks $ranks, distinct checksums $distinct)"
  status=1
fi
echo "run directory: $run_dir"
exit "$status"
