"""The health report's plots (matplotlib, Agg, object API: no pyplot global state, no display).
Each returns the path it drew, or None when its inputs are missing."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from rlpipe.telemetry.health.inputs import ENV_FAULT_KINDS, MEMORY_TAGS, return_series
from rlpipe.telemetry.tb_events import Series

PLOT_SPS = "health_sps.png"
PLOT_RETURNS = "health_returns.png"
PLOT_MEMORY = "health_memory.png"
PLOT_GROUPS = "health_rewards_by_group.png"
_PANEL_COLS = 4


def _figure(**kw):
    from matplotlib.figure import Figure   # object API: Agg canvas on savefig, no pyplot state
    return Figure(**kw)


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    return path


def _grid(n: int) -> tuple[int, int]:
    cols = min(_PANEL_COLS, max(1, n))
    return math.ceil(n / cols), cols


def plot_sps(scalars: dict[str, Series], path: Path) -> Path | None:
    sps = scalars.get("charts/sps")
    if sps is None:
        return None
    fig = _figure(figsize=(9, 4), layout="constrained")
    ax = fig.subplots()
    ax.plot(sps.steps, sps.values, color="tab:blue", label="charts/sps")
    ax.set_xlabel("env steps")
    ax.set_ylabel("env steps / s")
    ax.grid(alpha=0.3)
    active = scalars.get("envs/active")
    if active is not None:
        ax2 = ax.twinx()
        ax2.plot(active.steps, active.values, color="tab:green", alpha=0.7, label="envs/active")
        ax2.set_ylabel("active envs")
        ax2.set_ylim(bottom=0)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, loc="lower right")
    ax.set_title("Throughput (TensorBoard charts/sps)")
    return _save(fig, path)


def plot_returns(scalars: dict[str, Series], path: Path) -> Path | None:
    rets = return_series(scalars)
    if not rets:
        return None
    rows, cols = _grid(len(rets))
    fig = _figure(figsize=(3.2 * cols, 2.5 * rows + 0.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax, (name, s) in zip(axes, rets.items()):
        ax.plot(s.steps, s.values, marker="." if len(s.steps) < 30 else None)
        ax.set_title(name, fontsize=10)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[len(rets):]:
        ax.set_visible(False)
    fig.supxlabel("env steps", fontsize=9)
    fig.suptitle("Episodic return per env type (TensorBoard charts/episodic_return/<type>)")
    return _save(fig, path)


def plot_memory(scalars: dict[str, Series], path: Path) -> Path | None:
    present = [t for t in MEMORY_TAGS if t in scalars]
    if not present:
        return None
    fig = _figure(figsize=(9, 4), layout="constrained")
    ax = fig.subplots()
    for tag in present:
        s = scalars[tag]
        ax.plot(s.steps, s.values, marker="." if len(s.steps) < 30 else None, label=tag)
    ax.set_xlabel("env steps")
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Memory (TensorBoard memory/ and workers/ tags)")
    return _save(fig, path)


def plot_groups(scalars: dict[str, Series], group_faults: dict[int, dict[str, int]] | None,
                path: Path) -> Path | None:
    rets = return_series(scalars)
    has_faults = group_faults is not None and len(group_faults) > 0
    if not rets and not has_faults:
        return None
    rows, cols = _grid(len(rets)) if rets else (0, _PANEL_COLS)
    total_rows = rows + (1 if has_faults else 0)
    fig = _figure(figsize=(3.2 * cols, 2.6 * rows + (3.2 if has_faults else 0) + 0.8), layout="constrained")
    gs = fig.add_gridspec(total_rows, cols, height_ratios=[1.0] * rows + ([1.2] if has_faults else []))
    for i, (name, s) in enumerate(rets.items()):
        ax = fig.add_subplot(gs[i // cols, i % cols])
        ax.boxplot([s.values], widths=0.5, showfliers=False)
        jitter = np.random.default_rng(i).uniform(-0.12, 0.12, len(s.values))
        ax.scatter(1 + jitter, s.values, s=6, alpha=0.5, color="tab:blue")
        ax.set_xticks([1], [f"{name}\n(n={len(s.values)})"], fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
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
        ax.set_ylabel("env fault rows")
        if bottom.any():
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no env faults in any group", transform=ax.transAxes, ha="center")
        ax.set_title("Env faults per worker group (lifecycle.sqlite)", fontsize=10)
    fig.suptitle("Return distribution per env type: the TensorBoard points (logged means, not single\n"
                 "episodes; per-episode returns per group are not recorded), and env faults per worker group",
                 fontsize=10)
    return _save(fig, path)
