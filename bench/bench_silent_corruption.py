"""What comparing the replicas costs a training job, and how fast a flipped bit is named and
repaired: examples/cpp_trainer under `trainguard run` (3 ranks, one host, snapshots every
--every steps), its parameters and optimizer state registered as replicated.

Cost: the same fault-free job with TRAINGUARD_SILENT_CORRUPTION=off (the baseline), =repair, and
=repair with the reduced gradients compared every step (--check-reduced-grad 1:
Step::CheckReplicated), alternated --runs times; the step time is rank 0's, from its step_done events (--progress-events 1),
between step 50 and the last, so the start-up is not in it. The ratio repair/off is the comparison's
cost per step (its hashing is the snapshot's own; the vote and the judge run on the checkpointer's
worker thread).

Detection and repair: the job once more, rank 1 flipping one bit of its parameters after step
--flip (--flip-bit): the snapshot that names it (steps after the flip), and the time from the
verdict (the judge's silent_corruption event) to the first step_done of the new generation (every
rank rolled back and training again). From the repository root:

    python3 bench/bench_silent_corruption.py --steps 600 --every 10 --runs 3
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = REPO / "build" / "default" / "tools" / "trainguard"
TRAINER = REPO / "build" / "default" / "examples" / "cpp_trainer" / "cpp_trainer"


def events(run_dir, rank):
    out = subprocess.run([str(CLI), "events", "--json",
                          str(run_dir / "events" / f"rank-{rank:05d}.tgev")],
                         check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def attribute(event, key):
    for a in event.get("attributes", []):
        if a["key"] == key:
            return a["value"]
    return None


def run(tmp, mode, args, flip=None):
    run_dir = Path(tmp) / f"{mode.replace('+', '-')}-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, TRAINGUARD_CHECKPOINT_EVERY_STEPS=str(args.every),
               TRAINGUARD_SILENT_CORRUPTION=mode.split("+")[0])
    trainer = [str(TRAINER), "--steps", str(args.steps), "--print-every", "1000",
               "--step-time-ms", str(args.step_ms), "--progress-events", "1"]
    if mode.endswith("+grad"):
        trainer += ["--check-reduced-grad", "1"]
    if flip is not None:
        trainer += ["--flip-bit", f"1:{flip}"]
    done = subprocess.run([str(CLI), "run", "--nproc", "3", "--job-id", run_dir.name,
                           "--run-dir", str(run_dir), "--", *trainer],
                          env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{mode}: trainguard run exited {done.returncode}\n{done.stdout}")
    return run_dir, done.stdout


def step_times(run_dir):
    """step -> time (s) of rank 0's last step_done of that step."""
    out = {}
    for e in events(run_dir, 0):
        if attribute(e, "what") == "step_done":
            out[int(e["step"])] = int(e["time_unix_micros"]) / 1e6
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--step-ms", type=int, default=10)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--flip", type=int, default=105)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        modes = ("off", "repair", "repair+grad")
        per_step = {m: [] for m in modes}
        saves = {m: [] for m in modes}
        for _ in range(args.runs):
            for mode in modes:
                run_dir, _ = run(tmp, mode, args)
                t = step_times(run_dir)
                first, last = 50, max(t)
                per_step[mode].append((t[last] - t[first]) / (last - first) * 1e3)
                whats = [attribute(e, "what") for e in events(run_dir, 0)]
                saves[mode].append((whats.count("saved"), whats.count("skipped")))
        for mode, values in per_step.items():
            print(f"{mode:11s} step ms: " + ", ".join(f"{v:.3f}" for v in values) +
                  f" (median {statistics.median(values):.3f}); rank 0's snapshots saved/skipped: " +
                  ", ".join(f"{a}/{b}" for a, b in saves[mode]))
        for mode in modes[1:]:
            ratio = statistics.median(per_step[mode]) / statistics.median(per_step["off"])
            print(f"{mode}/off step time: {ratio:.4f}")

        run_dir, out = run(tmp, "repair", args, flip=args.flip)
        m = re.search(r"silent corruption: step (\d+): .*", out)
        if not m:
            raise SystemExit(f"no verdict:\n{out}")
        verdict = None
        for r in range(3):
            for e in events(run_dir, r):
                if attribute(e, "what") == "silent_corruption":
                    verdict = int(e["time_unix_micros"]) / 1e6
        resumed = None
        for e in events(run_dir, 0):
            if attribute(e, "what") == "step_done" and int(e["generation"]) >= 1:
                resumed = int(e["time_unix_micros"]) / 1e6
                break
        print(f"flip after step {args.flip}: named at the snapshot of step {m.group(1)} "
              f"({int(m.group(1)) - args.flip} steps later); verdict -> first step of the "
              f"repaired generation {1e3 * (resumed - verdict):.1f} ms")
        print(m.group(0))


if __name__ == "__main__":
    main()
