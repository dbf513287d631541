"""The health report's long-run part: `summary.json`'s `long_run` verdicts as a table, a check
that no figure grows past its budget, and the resource figures over the run's hours
(`health_resources.png`, from the TensorBoard `resources/*` series)."""

from __future__ import annotations

from pathlib import Path

from rlpipe.telemetry.health.markdown import md_table
from rlpipe.telemetry.health.plots import fixed_margins, save_png
from rlpipe.telemetry.tb_events import Series

PLOT_RESOURCES = "health_resources.png"
# The figures a six-day run is judged by, one panel each (the table lists every figure).
PANELS = (
    ("memory (MiB)", ("driver/rss_mb", "driver/pss_mb", "tree/pss_mb", "workers/rss_mb_max", "update/rss_mb")),
    ("count", ("driver/fds", "driver/threads", "workers/fds_max", "redis/keys")),
    ("disk (MiB)", ("run_dir/total_mb", "run_dir/tb_mb", "run_dir/lifecycle_mb", "run_dir/checkpoints_mb")),
    ("Redis (MiB)", ("redis/used_memory_mb", "redis/rss_mb")),
)
VERDICT_ORDER = {"grows past budget": 0, "grows": 1, "falls": 2, "flat": 3}


def _pct(v) -> str:
    return "-" if v is None else f"{v:+.2f}"


def long_run_section(rep) -> None:
    """Adds the section's lines and its verdict to `rep` (sections.Report)."""
    verdicts = rep.s.get("long_run")
    if not verdicts:
        why = (
            "its stepping loop was shorter than `logging.long_run_min_s`"
            if "long_run" in rep.s
            else "summary.json has no long_run key"
        )
        rep.add(f"No long-run verdict: {why}.")
        rep.verdicts.append(("no resource figure grows past its budget", "n/a", why))
        return
    horizon_h = next(iter(verdicts.values()))["project_to_s"] / 3600
    rep.add(
        f"Each figure's Theil-Sen slope over the second half of the stepping loop, with its 95 % "
        f"interval, and the figure projected to {horizon_h:,.1f} h from the run's start "
        f"(`logging.project_to_s`). Flat: no trend beyond 1 % of the figure's level per hour that "
        f"the samples can tell from noise."
    )
    rows = []
    for name, v in sorted(verdicts.items(), key=lambda kv: (VERDICT_ORDER.get(kv[1]["verdict"], 9), kv[0])):
        lo, hi = v["slope_ci_pct_per_h"]
        rows.append(
            [
                f"`{name}`",
                v["level"],
                v["slope_per_h"],
                _pct(v["slope_pct_per_h"]),
                f"[{_pct(lo)}, {_pct(hi)}]",
                v["projected"],
                v["budget"] if v["budget"] is not None else "-",
                v["points"],
                v["verdict"],
            ]
        )
    rep.add(
        md_table(
            [
                "figure",
                "level",
                "slope / h",
                "% / h",
                "95 % interval (% / h)",
                "projected",
                "budget",
                "points",
                "verdict",
            ],
            rows,
            right={1, 2, 3, 5, 6, 7},
        )
    )
    past = sorted(n for n, v in verdicts.items() if v["verdict"] == "grows past budget")
    grows = sorted(n for n, v in verdicts.items() if v["verdict"] == "grows")
    evidence = (f"past budget: {', '.join(past)}" if past else "none past its budget") + (
        f"; growing within it: {', '.join(grows)}" if grows else ""
    )
    rep.verdicts.append(("no resource figure grows past its budget", "no" if past else "yes", evidence))
    rep._image(PLOT_RESOURCES, "resources over time")


def plot_resources(scalars: dict[str, Series], path: Path) -> Path | None:
    """The PANELS' figures over hours since the first resource sample."""
    panels = [(unit, [t for t in tags if f"resources/{t}" in scalars]) for unit, tags in PANELS]
    panels = [(unit, tags) for unit, tags in panels if tags]
    if not panels:
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 2.4 * len(panels)))
    fixed_margins(fig, left=0.85, right=0.2, top=0.45, bottom=0.6, rows=len(panels), hgap=0.35)
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    start = min(scalars[f"resources/{t}"].wall_times.min() for _u, tags in panels for t in tags)
    for ax, (unit, tags) in zip(axes, panels):
        for tag in tags:
            s = scalars[f"resources/{tag}"]
            ax.plot((s.wall_times - start) / 3600, s.values, label=tag)
        ax.set_ylabel(unit)
        ax.legend(fontsize=7, loc="upper left")
    axes[-1].set_xlabel("hours since the first sample")
    fig.suptitle("Resources of the run (TensorBoard resources/*)", fontsize=11)
    return save_png(fig, path)
