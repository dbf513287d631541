"""Overlay plots of a multirun: every job on the same axes, env steps on x, one colour per job
(the same colour in every plot), the legend once under the plot.

matplotlib's object API (Figure, no pyplot state), Agg when saved.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from rlpipe.report.jobs import Job
from rlpipe.telemetry.health.plots import save_png

PANEL_COLS = 3


def _figure(**kw):
    from matplotlib.figure import Figure

    return Figure(layout="constrained", **kw)


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _steps_axis(ax) -> None:
    from matplotlib.ticker import EngFormatter

    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.grid(alpha=0.3)


def _legend(fig, handles, labels) -> None:
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(3, len(labels)), fontsize=8, frameon=False)


def plot_tag(
    jobs: list[Job], labels: dict[str, str], tag: str, title: str, ylabel: str, path: Path, positive_only: bool = False
) -> Path | None:
    """One scalar tag of every job over env steps; None when no job logged it.
    `positive_only`: leave out values <= 0 (a memory figure logged before its first sample)."""
    curves = {}
    for j in jobs:
        s = j.scalars.get(tag)
        if s is not None:
            keep = s.values > 0 if positive_only else np.ones(len(s.values), dtype=bool)
            if keep.any():
                curves[j.name] = (s.steps[keep], s.values[keep])
    # One point per job (a run shorter than the tag's cadence) is no curve to compare.
    if not any(len(steps) >= 2 for steps, _ in curves.values()):
        return None
    fig = _figure(figsize=(8, 4.2))
    ax = fig.subplots()
    colors = dict(zip((j.name for j in jobs), _colors(len(jobs))))
    for name, (steps, values) in curves.items():
        ax.plot(steps, values, color=colors[name], label=labels[name], marker="." if len(steps) < 30 else None)
    if positive_only:
        ax.set_ylim(bottom=0)
    _steps_axis(ax)
    ax.set_xlabel("env steps")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    _legend(fig, *ax.get_legend_handles_labels())
    return save_png(fig, path)


def plot_returns(jobs: list[Job], labels: dict[str, str], path: Path) -> Path | None:
    """One panel per env type, every job's return curve in it."""
    types = sorted({name for j in jobs for name in j.returns()})
    if not types:
        return None
    cols = min(PANEL_COLS, len(types))
    rows = math.ceil(len(types) / cols)
    fig = _figure(figsize=(max(8.0, 3.6 * cols), 2.9 * rows + 1.4))
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    colors = dict(zip((j.name for j in jobs), _colors(len(jobs))))
    handles: dict[str, object] = {}
    for ax, name in zip(axes, types):
        for j in jobs:
            s = j.returns().get(name)
            if s is None or not len(s.steps):
                continue
            (line,) = ax.plot(s.steps, s.values, color=colors[j.name], marker="." if len(s.steps) < 30 else None)
            handles.setdefault(j.name, line)
        _steps_axis(ax)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("env steps", fontsize=8)
        ax.tick_params(labelsize=8)
    for ax in axes[len(types) :]:
        ax.set_visible(False)
    fig.supylabel("episodic return (mean per 2 s window)", fontsize=9)
    fig.suptitle("Return per env type, every job", fontsize=11)
    order = [j.name for j in jobs if j.name in handles]
    _legend(fig, [handles[n] for n in order], [labels[n] for n in order])
    return save_png(fig, path)
