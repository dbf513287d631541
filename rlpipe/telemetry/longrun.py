"""The long-run verdict: does a figure of the run grow, and would it outlast the run?

For each resource figure (resources.py in the supervisor samples them) the verdict takes
the samples of the run's second half, where start-up and the cold/hot ramp are over, and
fits a line with the Theil-Sen estimator: the median of the slopes between every pair of
samples. A sawtooth (an allocator that frees in bursts, a WAL checkpoint) moves a least-
squares slope with every tooth; the median slope ignores up to ~29 % of outlying samples.
Its 95 % interval is Sen's (1968) rank interval on those pairwise slopes. That interval
assumes independent noise: samples of a sawtooth taken closer together than a tooth are
not, so for such a figure the interval is narrower than the truth; the soak benchmark
prints the figure over time beside it.

A figure's verdict, in this order:
- `grows past budget`: it grows and its projection to `project_to_s` exceeds its budget
  (the machine's memory for memory, the disk the run dir may still fill, the fd limit);
- `grows`: the whole 95 % interval is above zero and the slope is more than
  `FLAT_PCT_PER_H` of the figure's level per hour;
- `falls`: the same, below zero;
- `flat`: otherwise (no trend the samples can tell from noise, or one too small to matter).

It imports numpy only: the driver calls it at the end of a run, the soak benchmark on a
finished run's samples.
"""

from __future__ import annotations

import math

import numpy as np

FLAT_PCT_PER_H = 1.0  # a slope under 1 % of the figure's level per hour is flat
MIN_POINTS = 6  # fewer samples in the second half: no verdict for that figure
Z95 = 1.959964


def theil_sen(t: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """(slope, 95 % low, 95 % high, intercept) of y over t: the median pairwise slope, Sen's
    rank interval, and the median of y - slope * t."""
    t = np.asarray(t, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    i, j = np.triu_indices(len(t), k=1)
    dt = t[j] - t[i]
    keep = dt != 0
    slopes = np.sort((y[j] - y[i])[keep] / dt[keep])
    n_pairs = len(slopes)
    if n_pairs == 0:
        return 0.0, 0.0, 0.0, float(np.median(y))
    slope = float(np.median(slopes))
    n = len(t)
    # Sen's interval: the ranks of the pairwise slopes that bound 95 % of Kendall's S
    spread = Z95 * math.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    lo_rank = int(max(0, math.floor((n_pairs - spread) / 2.0)))
    hi_rank = int(min(n_pairs - 1, math.ceil((n_pairs + spread) / 2.0)))
    intercept = float(np.median(y - slope * t))
    return slope, float(slopes[lo_rank]), float(slopes[hi_rank]), intercept


def figure_verdict(t_s: np.ndarray, y: np.ndarray, end_s: float, project_to_s: float, budget: float | None) -> dict:
    """One figure's slope per hour (with its interval, in the figure's unit and in % of its
    level), its value projected to `project_to_s` seconds after the run's start, and the verdict."""
    slope, lo, hi, intercept = theil_sen(t_s, y)
    level = float(np.median(y))
    fitted_end = intercept + slope * end_s
    projected = fitted_end + slope * (project_to_s - end_s)
    per_h, lo_h, hi_h = slope * 3600, lo * 3600, hi * 3600
    pct = (lambda v: _round(100.0 * v / abs(level))) if level else (lambda v: None)  # no level: no %
    tolerance = FLAT_PCT_PER_H / 100.0 * abs(level)
    if lo_h > 0 and per_h > tolerance:
        verdict = "grows past budget" if budget is not None and projected > budget else "grows"
    elif hi_h < 0 and -per_h > tolerance:
        verdict = "falls"
    else:
        verdict = "flat"
    return {
        "level": _round(level),
        "slope_per_h": _round(per_h),
        "slope_ci_per_h": [_round(lo_h), _round(hi_h)],
        "slope_pct_per_h": pct(per_h),
        "slope_ci_pct_per_h": [pct(lo_h), pct(hi_h)],
        "end": _round(fitted_end),
        "projected": _round(projected),
        "project_to_s": project_to_s,
        "budget": _round(budget) if budget is not None else None,
        "points": int(len(t_s)),
        "verdict": verdict,
    }


def long_run(
    samples: list[tuple[float, dict[str, float]]], end_s: float, project_to_s: float, budgets: dict[str, float]
) -> dict[str, dict]:
    """The verdict of every figure over the second half of [0, end_s] (seconds from the run's
    start). `samples` are (t_s, {figure: value}) in time order; `budgets` maps a figure to
    its budget in the figure's own unit (a figure with none cannot grow past one)."""
    half = [(t, fig) for t, fig in samples if end_s / 2 <= t <= end_s]
    names = sorted({name for _t, fig in half for name in fig})
    out = {}
    for name in names:
        points = [(t, fig[name]) for t, fig in half if fig.get(name) is not None]
        if len(points) < MIN_POINTS:
            continue
        t, y = (np.array(v, dtype=np.float64) for v in zip(*points))
        out[name] = figure_verdict(t, y, end_s, project_to_s, budgets.get(name))
    return out


def _round(v: float) -> float:
    if not math.isfinite(v):
        return v
    return float(f"{v:.6g}")
