"""The health report's plots (matplotlib, Agg, object API: no pyplot global state, no display).
Each returns the path it drew, or None when its inputs are missing.

Every curve is drawn over env steps on the same x range (0 to the run's last logged step), so
the plots line up when read side by side; every axis label carries its unit; figures are at
least MIN_WIDTH inches wide, so a run with one env type still has room for its title."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from rlpipe.files import atomic_write
from rlpipe.telemetry.health.inputs import ENV_FAULT_KINDS, MEMORY_TAGS, eval_curves, return_series
from rlpipe.telemetry.tb_events import Series

PLOT_SPS = "health_sps.png"
PLOT_RETURNS = "health_returns.png"
PLOT_MEMORY = "health_memory.png"
PLOT_GROUPS = "health_rewards_by_group.png"
_PANEL_COLS = 4
MIN_WIDTH = 8.0
RETURN_LABEL = "episodic return (mean per 2 s window)"


def _figure(**kw):
    from matplotlib.figure import Figure  # object API: Agg canvas on savefig, no pyplot state

    return Figure(**kw)


def fixed_margins(fig, left, right, top, bottom, rows=1, cols=1, wgap=0.0, hgap=0.0) -> None:
    """Place the axes with margins and gaps in inches. matplotlib's constrained layout
    measures every text's extent to do it, at the end of every run: the four plots of a short
    run took 1.4-1.5 s of CPU with it, 0.8-0.9 s so (2026-12-03). These plots' texts are
    known, so their room is set here once."""
    w, h = fig.get_size_inches()
    axes_w = (w - left - right - (cols - 1) * wgap) / cols
    axes_h = (h - top - bottom - (rows - 1) * hgap) / rows
    fig.subplots_adjust(
        left=left / w,
        right=1 - right / w,
        top=1 - top / h,
        bottom=bottom / h,
        wspace=wgap / axes_w,
        hspace=hgap / axes_h,
    )


def save_png(fig, path: Path) -> Path:
    """`fig` as a PNG at `path`, renamed in once whole: a report stopped half-way (a stop signal
    to `python -m rlpipe.report`, a full disk) leaves the earlier plot, not half of one."""
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
    return path


def _grid(n: int) -> tuple[int, int]:
    cols = min(_PANEL_COLS, max(1, n))
    return math.ceil(n / cols), cols


def _last_step(scalars: dict[str, Series]) -> int:
    """The run's last logged env step: the right end of every env-steps axis."""
    return max((int(s.steps.max()) for s in scalars.values() if len(s.steps)), default=0)


def _steps_axis(ax, last_step: int, label: bool = True) -> None:
    from matplotlib.ticker import EngFormatter

    ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 250k, 1.5M
    if last_step > 0:
        ax.set_xlim(0, last_step * 1.02)
    if label:
        ax.set_xlabel("env steps")
    ax.grid(alpha=0.3)


def plot_sps(scalars: dict[str, Series], path: Path) -> Path | None:
    sps = scalars.get("charts/sps")
    if sps is None:
        return None
    fig = _figure(figsize=(MIN_WIDTH + 1, 4))
    fixed_margins(fig, left=0.85, right=0.8, top=0.4, bottom=0.6)
    ax = fig.subplots()
    ax.plot(sps.steps, sps.values, color="tab:blue", label="charts/sps")
    _steps_axis(ax, _last_step(scalars))
    ax.set_ylabel("throughput (env steps / s)")
    active = scalars.get("envs/active")
    if active is not None:
        ax2 = ax.twinx()
        ax2.plot(active.steps, active.values, color="tab:green", alpha=0.7, label="envs/active")
        ax2.set_ylabel("active envs (count)")
        ax2.set_ylim(bottom=0)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, loc="lower right")
    ax.set_title("Throughput and active envs (TensorBoard charts/sps, envs/active)", fontsize=11)
    return save_png(fig, path)


def plot_returns(scalars: dict[str, Series], path: Path, eval_rounds: list[dict] | None = None) -> Path | None:
    """Training return per type and, beside it in the same panel, the return of the
    deterministic evaluation rounds (eval/history.jsonl) when the run had them."""
    rets = return_series(scalars)
    evals = eval_curves(eval_rounds or [])
    names = list(dict.fromkeys([*rets, *evals]))
    if not names:
        return None
    rows, cols = _grid(len(names))
    last = max(_last_step(scalars), max((max(st) for st, _ in evals.values()), default=0))
    fig = _figure(figsize=(max(MIN_WIDTH, 3.2 * cols), 2.5 * rows + 0.9))
    # room for the title (two lines with evals) over the first row's panel titles, and for
    # the y label (two lines with evals) left of the tick labels
    fixed_margins(
        fig,
        left=1.05 if evals else 0.85,
        right=0.2,
        top=0.95 if evals else 0.75,
        bottom=0.6,
        rows=rows,
        cols=cols,
        wgap=0.6,
        hgap=0.7,
    )
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False, sharex=True)).ravel()
    for i, (ax, name) in enumerate(zip(axes, names)):
        s = rets.get(name)
        if s is not None:
            ax.plot(s.steps, s.values, marker="." if len(s.steps) < 30 else None, label="training")
        if name in evals:
            steps, means = evals[name]
            ax.plot(steps, means, marker="o", markersize=4, color="tab:orange", label="eval (deterministic)")
        ax.set_title(name, fontsize=10)
        ax.tick_params(labelsize=7)
        # x labels under the lowest panel of each column only (the axis is shared)
        _steps_axis(ax, last, label=i + cols >= len(names))
        ax.tick_params(axis="x", labelbottom=True)
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    if evals:  # both curves named in the first panel, even where it holds only one of them
        from matplotlib.lines import Line2D

        axes[0].legend(
            [
                Line2D([], [], color="tab:blue", marker="."),
                Line2D([], [], color="tab:orange", marker="o", markersize=4),
            ],
            ["training", "eval (deterministic)"],
            fontsize=7,
        )
    fig.supylabel(RETURN_LABEL + (";\neval: mean of a round's episodes" if evals else ""), fontsize=9)
    fig.suptitle(
        "Episodic return per env type (TensorBoard charts/episodic_return/<type>"
        + (")\nand the deterministic eval rounds (eval/history.jsonl)" if evals else ")"),
        fontsize=11,
    )
    return save_png(fig, path)


def plot_memory(scalars: dict[str, Series], path: Path) -> Path | None:
    present = [t for t in MEMORY_TAGS if t in scalars]
    if not present:
        return None
    fig = _figure(figsize=(MIN_WIDTH + 1, 4))
    fixed_margins(fig, left=0.85, right=0.25, top=0.4, bottom=0.6)
    ax = fig.subplots()
    for tag in present:
        s = scalars[tag]
        sampled = s.values > 0  # a point logged before the first memory sample reads 0
        ax.plot(s.steps[sampled], s.values[sampled], marker="." if len(s.steps) < 30 else None, label=tag)
    _steps_axis(ax, _last_step(scalars))
    ax.set_ylabel("memory (MiB)")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.set_title("Memory: PSS of the run, RSS per worker (TensorBoard memory/, workers/)", fontsize=11)
    return save_png(fig, path)


def plot_groups(scalars: dict[str, Series], group_faults: dict[int, dict[str, int]] | None, path: Path) -> Path | None:
    rets = return_series(scalars)
    has_faults = group_faults is not None and len(group_faults) > 0
    if not rets and not has_faults:
        return None
    rows, cols = _grid(len(rets)) if rets else (0, _PANEL_COLS)
    total_rows = rows + (1 if has_faults else 0)
    fig = _figure(figsize=(max(MIN_WIDTH, 3.2 * cols), 2.6 * rows + (3.2 if has_faults else 0) + 0.9))
    # the panels' two-line tick labels (type, n) and the fault panel's title between rows
    fixed_margins(fig, left=0.8, right=0.2, top=0.7, bottom=0.6, rows=total_rows, cols=cols, wgap=0.6, hgap=0.85)
    gs = fig.add_gridspec(total_rows, cols, height_ratios=[1.0] * rows + ([1.2] if has_faults else []))
    for i, (name, s) in enumerate(rets.items()):
        ax = fig.add_subplot(gs[i // cols, i % cols])
        ax.boxplot([s.values], widths=0.5, showfliers=False)
        jitter = np.random.default_rng(i).uniform(-0.12, 0.12, len(s.values))
        ax.scatter(1 + jitter, s.values, s=6, alpha=0.5, color="tab:blue")
        ax.set_xticks([1], [f"{name}\n(n={len(s.values)})"], fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        if i % cols == 0:
            ax.set_ylabel("episodic return", fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    if has_faults:
        ax = fig.add_subplot(gs[rows, :])
        groups = sorted(group_faults)
        x = np.arange(len(groups))
        bottom = np.zeros(len(groups))
        for kind in ENV_FAULT_KINDS:
            counts = np.array([group_faults[g].get(kind, 0) for g in groups], dtype=float)
            if counts.any():
                ax.bar(x, counts, bottom=bottom, label=kind)
                bottom += counts
        if len(groups) <= 40:
            ax.set_xticks(x, [str(g) for g in groups], fontsize=7)
        ax.set_xlabel("worker group (worker id)")
        ax.set_ylabel("env faults (lifecycle rows)")
        if bottom.any():
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no env faults in any group", transform=ax.transAxes, ha="center")
        ax.set_title("Env faults per worker group (lifecycle.sqlite)", fontsize=10)
    fig.suptitle(
        "Logged return windows per env type (2 s means, not single episodes)\nand env faults per worker group",
        fontsize=10,
    )
    return save_png(fig, path)
