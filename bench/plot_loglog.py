#!/usr/bin/env python3
"""Draws figures against ranks on log-log axes as an SVG, and prints each series' slope.

    python3 bench/plot_loglog.py OUT.svg FILE [FILE...]

Each FILE is either a figures file or a `bench_simulate --json` output. The simulator's files are
merged: each of its per-fault and steady-state figures becomes a series, and the runs of one size
are its repeated measurements. A figures file:
    {"title": "...", "x_label": "ranks", "y_label": "seconds",
     "series": [{"label": "generation 0 formed", "points": [[8, 0.004], [64, 0.01], ...]}, ...]}

A point's y may be a list of repeated measurements: the median is drawn and the range as a bar.
The slope of a series is the least-squares fit of log(y) against log(x) over its points (1.0:
linear in the ranks; 2.0: quadratic), printed and written in the legend, which is what issue 37
asks to show of each per-fault cost. Standard library only: no plotting package is a dependency of
the project.
"""

import json
import math
import statistics
import sys
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 760, 480
LEFT, RIGHT, TOP, BOTTOM = 70, 250, 40, 50
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
          "#bcbd22", "#7f7f7f"]


def median_and_range(y):
    values = y if isinstance(y, list) else [y]
    return statistics.median(values), min(values), max(values)


def slope(points):
    """Least-squares slope of log(y) on log(x); None with fewer than two usable points."""
    logs = [(math.log(x), math.log(median_and_range(y)[0])) for x, y in points
            if x > 0 and median_and_range(y)[0] > 0]
    if len(logs) < 2:
        return None
    mean_x = sum(lx for lx, _ in logs) / len(logs)
    mean_y = sum(ly for _, ly in logs) / len(logs)
    sxx = sum((lx - mean_x) ** 2 for lx, _ in logs)
    if sxx == 0:
        return None
    return sum((lx - mean_x) * (ly - mean_y) for lx, ly in logs) / sxx


def decades(lo, hi):
    return range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)


# The simulator's figures drawn, and their labels.
SIMULATE_SERIES = [
    ("generation0_after_last_join_s", "generation 0 formed (s after the last join)"),
    ("rank_replaced_s", "a rank replaced (s after its death)"),
    ("host_replaced_beyond_bound_s", "a host lost (s beyond the bound)"),
    ("coordinator_host_replaced_beyond_bounds_s", "the coordinator's host lost (s beyond 2 bounds)"),
    ("steady_coordinator_cpu_per_s", "coordinator CPU, steady state (cores)"),
    ("steady_server_cpu_per_s", "store server CPU, steady state (cores)"),
    ("steady_requests_per_rank_s", "store requests per rank per s"),
    ("hang_suspects_named_s", "a hang's suspects named (s after it)"),
    ("slow_host_named_s", "a slow host named (s after the slowdown)"),
    ("slow_detector_cpu_per_s", "fail-slow detector CPU (cores)"),
]


def load(paths):
    """The spec to draw from `paths`: a figures file as is, or the simulator's runs merged."""
    simulate = {}
    spec = None
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        if data.get("benchmark") != "bench_simulate":
            spec = data
            continue
        for size in data["sizes"]:
            if not size.get("ok"):
                continue
            for key, _ in SIMULATE_SERIES:
                if key in size:
                    simulate.setdefault(key, {}).setdefault(size["ranks"], []).append(size[key])
    if simulate:
        series = [{"label": label, "points": [[r, v] for r, v in sorted(simulate[key].items())]}
                  for key, label in SIMULATE_SERIES if key in simulate]
        spec = {"title": "bench_simulate: each figure against ranks (8 per host)",
                "x_label": "ranks", "y_label": "seconds, cores, or requests per rank per s",
                "series": series}
    if spec is None:
        sys.exit("no figures in " + " ".join(paths))
    return spec


def main(argv):
    if len(argv) < 3:
        sys.exit("usage: plot_loglog.py OUT.svg FILE [FILE...]")
    spec = load(argv[2:])
    series = spec["series"]
    xs = [x for s in series for x, _ in s["points"]]
    ys = [v for s in series for _, y in s["points"]
          for v in (y if isinstance(y, list) else [y]) if v > 0]
    if not xs or not ys:
        sys.exit("no positive point to draw")
    x_decades = decades(min(xs), max(xs))
    y_decades = decades(min(ys), max(ys))
    x_lo, x_hi = x_decades[0], x_decades[-1]
    y_lo, y_hi = y_decades[0], y_decades[-1]
    if x_hi == x_lo:
        x_hi += 1
    if y_hi == y_lo:
        y_hi += 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x):
        return LEFT + (math.log10(x) - x_lo) / (x_hi - x_lo) * plot_w

    def py(y):
        return TOP + plot_h - (math.log10(y) - y_lo) / (y_hi - y_lo) * plot_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="14">{escape(spec.get("title", ""))}</text>']
    for d in range(x_lo, x_hi + 1):
        x = px(10 ** d)
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + plot_h}" '
                   'stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">'
                   f'{10 ** d:g}</text>')
    for d in range(y_lo, y_hi + 1):
        y = py(10 ** d)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" '
                   'stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{10.0 ** d:g}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" '
               'stroke="black"/>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 12}" text-anchor="middle">'
               f'{escape(spec.get("x_label", "ranks"))}</text>')
    out.append(f'<text x="16" y="{TOP + plot_h / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {TOP + plot_h / 2})">'
               f'{escape(spec.get("y_label", "seconds"))}</text>')
    for i, s in enumerate(series):
        color = COLORS[i % len(COLORS)]
        points = sorted(s["points"])
        drawn = [(x, *median_and_range(y)) for x, y in points if median_and_range(y)[0] > 0]
        path = " ".join(f"{px(x):.1f},{py(m):.1f}" for x, m, _, _ in drawn)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, m, lo, hi in drawn:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(m):.1f}" r="3" fill="{color}"/>')
            if hi > lo > 0:
                out.append(f'<line x1="{px(x):.1f}" y1="{py(lo):.1f}" x2="{px(x):.1f}" '
                           f'y2="{py(hi):.1f}" stroke="{color}"/>')
        k = slope(points)
        label = s["label"] + (f" (slope {k:.2f})" if k is not None else "")
        print(label)
        ly = TOP + 10 + 18 * i
        out.append(f'<line x1="{LEFT + plot_w + 12}" y1="{ly}" x2="{LEFT + plot_w + 32}" '
                   f'y2="{ly}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{LEFT + plot_w + 36}" y="{ly + 4}">{escape(label)}</text>')
    out.append("</svg>")
    with open(argv[1], "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main(sys.argv)
