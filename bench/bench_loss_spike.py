"""False alarms of check_loss on a healthy, converging loop: examples/python_ddp/train.py's model
and batches, trained as its 2-rank job does (each step averages the gradients of rank 0's and rank
1's batch, SGD with momentum), in one process. Every loss of each rank is judged by trainguard's
detector (a Runtime per rank, `s.check_loss`, at --mads scaled MADs on the log scale: the
default) and, as the baseline, by the same rule on the loss itself (median and scaled MAD of the
last 100 losses, 20 of warm-up; numpy). A judged step is one after the warm-up. No fault is
injected: every flagged loss is a false alarm. No thresholds; deterministic (the batches are a
function of the step and the rank). From the repository root:

    PYTHONPATH=build/default/python .venv/bin/python bench/bench_loss_spike.py --steps 3000
"""
import argparse
import importlib.util
import tempfile
import uuid
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import trainguard

TRAIN = Path(__file__).resolve().parents[1] / "examples" / "python_ddp" / "train.py"
WINDOW, WARMUP = 100, 20


def linear_rule_flags(losses, mads):
    """The rule on the loss itself: flagged losses stay out of the window, as in trainguard."""
    window, flagged, judged = [], 0, 0
    for loss in losses:
        if len(window) >= WARMUP:
            judged += 1
            a = np.array(window[-WINDOW:])
            median = np.median(a)
            mad = 1.4826 * np.median(np.abs(a - median))
            if (loss - median) / max(mad, 1e-6 * abs(median), 1e-12) > mads:
                flagged += 1
                continue
        window.append(loss)
    return flagged, judged


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--mads", type=int, nargs="+", default=[6, 8])
    args = p.parse_args()
    spec = importlib.util.spec_from_file_location("python_ddp_train", TRAIN)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.set_num_threads(1)
    model = example.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = {r: [] for r in range(args.world)}
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        for r in range(args.world):
            x, y = example.batch(step, r, args.batch)
            loss = F.mse_loss(model(x), y)
            losses[r].append(loss.item())
            (loss / args.world).backward()
        optimizer.step()
    print(f"{args.steps} steps x {args.world} ranks, batch {args.batch}; median loss of the first "
          f"and last 100 steps (rank 0): {np.median(losses[0][:100]):.4f} -> "
          f"{np.median(losses[0][-100:]):.4f}")
    for r in range(args.world):
        logs = np.log(np.array(losses[r][-WINDOW:]))
        mad = 1.4826 * np.median(np.abs(logs - np.median(logs)))
        print(f"rank {r}: scaled MAD of log(loss), last {WINDOW} steps: {mad:.3f}; the smallest "
              "spike flagged: " + ", ".join(f"{np.exp(m * mad):.3g}x the median at {m} MADs"
                                            for m in args.mads))
    with tempfile.TemporaryDirectory() as run_dir:
        for mads in args.mads:
            flagged = judged = 0
            for r in range(args.world):
                rt = trainguard.Runtime(job_id=f"bench-spike-{uuid.uuid4().hex[:8]}",
                                        run_dir=run_dir, loss_spike_mads=mads)
                for step, loss in enumerate(losses[r]):
                    with rt.step(step) as s:
                        s.check_loss(loss)
                    flagged += not s.result.ok
                judged += max(len(losses[r]) - WARMUP, 0)
                rt.close()
            base = [linear_rule_flags(losses[r], mads) for r in range(args.world)]
            base_flagged = sum(f for f, _ in base)
            print(f"{mads} scaled MADs: trainguard (log scale) {flagged} false alarms in {judged} "
                  f"judged losses ({100 * flagged / judged:.3f} %); on the loss itself "
                  f"{base_flagged} ({100 * base_flagged / judged:.3f} %)")


if __name__ == "__main__":
    main()
