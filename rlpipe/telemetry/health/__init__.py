"""The health report of a finished (or interrupted) run: `health_report.md` plus PNG plots in
the run directory (the day6 stage, docs/architecture.md).

Everything in it is read back from the run's own files (summary.json, tb/, lifecycle.sqlite,
errors_top10.md, checkpoints/, .hydra/overrides.yaml, eval/history.jsonl): never from config.
An input that is missing is said to be missing; a section that cannot be built says why and
the rest of the report is still written, so `write_health_report` can be called at the end of
every run.

The package: inputs.py reads the files, plots.py draws, sections.py writes the sections,
verdicts.py draws the checks, markdown.py formats; this module puts the report together.

Plots (matplotlib, Agg, object API: no pyplot global state, no display):
- health_sps.png              charts/sps (and envs/active) over env steps
- health_returns.png          charts/episodic_return/<type> over env steps, one panel per type,
                              with the evaluation rounds (eval/history.jsonl) beside it
- health_memory.png           memory/pss_mb, workers/rss_mb_max (and _mean) over env steps
- health_rewards_by_group.png per-type distribution of the logged returns (TensorBoard points)
                              and env faults per worker group (lifecycle)
- health_resources.png        resources/* (driver, workers, run dir, Redis) over hours
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from rlpipe.files import atomic_write, space_error
from rlpipe.telemetry.health.inputs import load_run
from rlpipe.telemetry.health.longrun import PLOT_RESOURCES, long_run_section, plot_resources
from rlpipe.telemetry.health.markdown import md_table
from rlpipe.telemetry.health.plots import (
    PLOT_GROUPS,
    PLOT_MEMORY,
    PLOT_RETURNS,
    PLOT_SPS,
    plot_groups,
    plot_memory,
    plot_returns,
    plot_sps,
)
from rlpipe.telemetry.health.sections import Report
from rlpipe.telemetry.health.verdicts import build_verdicts

log = logging.getLogger(__name__)

REPORT_NAME = "health_report.md"

__all__ = [
    "PLOT_GROUPS",
    "PLOT_MEMORY",
    "PLOT_RESOURCES",
    "PLOT_RETURNS",
    "PLOT_SPS",
    "REPORT_NAME",
    "write_health_report",
]


def write_health_report(run_dir: str | Path) -> Path:
    """Write `health_report.md` and the `health_*.png` plots into `run_dir`; return the md's
    path. Missing inputs are reported as missing; nothing here raises for a broken run."""
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    rep = Report(run)
    try:
        rep.load_lifecycle()
    except Exception as e:
        log.warning("health report: cannot read lifecycle rows", exc_info=True)
        run.notes.append(f"lifecycle rows could not be read: {type(e).__name__}: {e}")

    # plots first, so the sections can link what was drawn
    for name, draw in (
        (PLOT_SPS, lambda p: plot_sps(run.scalars, p)),
        (PLOT_RETURNS, lambda p: plot_returns(run.scalars, p, run.eval_rounds)),
        (PLOT_MEMORY, lambda p: plot_memory(run.scalars, p)),
        (PLOT_GROUPS, lambda p: plot_groups(run.scalars, rep.group_faults, p)),
        (PLOT_RESOURCES, lambda p: plot_resources(run.scalars, p)),
    ):
        path = run_dir / name
        try:
            rep.plots[name] = draw(path)
        except Exception as e:
            # a full disk is said once by the driver (rlpipe.supervisor.diskfull): no traceback
            log.warning("health report: plot %s failed", name, exc_info=space_error(e) is None)
            run.notes.append(f"{name} could not be drawn: {type(e).__name__}: {e}")
            rep.plots[name] = None
        if rep.plots[name] is None and path.exists():
            path.unlink()  # a stale plot of an earlier report must not pass for this run's

    rep.section("Run", rep.identity)
    rep.section("Headline figures", rep.headline)
    rep.section("Returns per env type", rep.returns)
    rep.section("Evaluation during training", rep.eval_rounds)
    rep.section("Throughput and memory", rep.throughput_memory)
    rep.section("Faults", rep.faults)
    rep.section("Worker groups", rep.groups_section)
    rep.section("Worker restarts by reason", rep.restarts)
    rep.section("Chaos recovery", rep.chaos)
    rep.section("Top errors", rep.errors)
    rep.section("Checkpoints", rep.checkpoints)
    rep.section("Long run", lambda: long_run_section(rep))
    try:
        build_verdicts(rep)
    except Exception as e:
        log.warning("health report: verdicts failed", exc_info=True)
        run.notes.append(f"verdicts incomplete: {type(e).__name__}: {e}")
    stuck = (run.summary or {}).get("types_without_episodes") or {}
    if stuck:  # a crash loop, or episodes longer than the run: said as a failed check
        evidence = "; ".join(f"{name}: no episode finished, {n} env faults" for name, n in stuck.items())
        rep.verdicts.append(("every env type finished an episode", "no", evidence))

    head = [
        f"# Health report: {run_dir.name}",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC from this run's files only "
        f"(never from config).",
        "",
        md_table(
            ["input", "state"],
            [
                ["`summary.json`", run.summary_note],
                ["`tb/`", run.tb_note],
                ["`lifecycle.sqlite`", run.db_note],
                ["`eval/history.jsonl`", run.eval_note],
                ["`errors_top10.md`", "present" if (run_dir / "errors_top10.md").is_file() else "missing"],
                ["`checkpoints/`", "present" if (run_dir / "checkpoints").is_dir() else "missing"],
            ],
            right=set(),
        ),
    ]
    passed = sum(1 for _, r, _ in rep.verdicts if r == "yes")
    failed = sum(1 for _, r, _ in rep.verdicts if r == "no")
    head += [
        "",
        "## Verdict",
        "",
        f"{passed} check(s) passed, {failed} failed, {len(rep.verdicts) - passed - failed} not applicable.",
        "",
    ]
    mark = {"yes": "✅", "no": "❌", "n/a": "➖"}
    head += [f"- {mark.get(r, '')} {check}: **{r}**: {evidence}" for check, r, evidence in rep.verdicts]
    if run.notes:
        head += ["", "Notes:", ""] + [f"- {n}" for n in run.notes]

    return atomic_write(run_dir / REPORT_NAME, "\n".join(head + rep.lines) + "\n")
