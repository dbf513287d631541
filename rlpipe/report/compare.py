"""`comparison.md` + `comparison_*.png` of a multirun: its jobs side by side."""

from __future__ import annotations

import time
from pathlib import Path

from rlpipe.files import atomic_write
from rlpipe.report import jobs as J, overlay

PLOTS = (  # file, tag, title, y label, leave out values <= 0
    ("comparison_sps.png", "charts/sps", "Throughput, every job (TensorBoard charts/sps)", "env steps / s", False),
    (
        "comparison_loss.png",
        "losses/total",
        "Total PPO loss, every job (TensorBoard losses/total)",
        "loss per update (dimensionless)",
        False,
    ),
    ("comparison_memory.png", "memory/pss_mb", "Memory of the whole run, every job (memory/pss_mb)", "PSS (MiB)", True),
)
RETURNS_PLOT = "comparison_returns.png"


def _f(v, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.{digits}f}" if abs(v) >= 1 or v == 0 else f"{v:.3g}"


def _esc(text: str) -> str:
    return text.replace("|", "\\|")


def write_comparison(multirun_dir: Path) -> tuple[Path, list[Path]]:
    jobs = [J.load_job(d) for d in J.job_dirs(multirun_dir)]
    common, own = J.varying(jobs)
    labels = {j.name: f"job {j.name}: " + (" ".join(own[j.name]) or "(no own overrides)") for j in jobs}
    plots = [overlay.plot_returns(jobs, labels, multirun_dir / RETURNS_PLOT)]
    plots += [
        overlay.plot_tag(jobs, labels, tag, title, ylabel, multirun_dir / name, positive)
        for name, tag, title, ylabel, positive in PLOTS
    ]
    plots = [p for p in plots if p is not None]
    for name in (RETURNS_PLOT, *(row[0] for row in PLOTS)):  # a plot not drawn this time is stale
        if multirun_dir / name not in plots:
            (multirun_dir / name).unlink(missing_ok=True)

    lines = [
        f"# Comparison of {len(jobs)} jobs: {multirun_dir}",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M:%S')} by `python -m rlpipe.report`. "
        "Figures come from each job's summary.json; a job without one (killed or still "
        "running) shows what its TensorBoard scalars say.",
        "",
        "Overrides of every job: " + (" ".join(f"`{o}`" for o in common) or "none"),
        "",
        "| job | own overrides | status | env steps | sps | total loss (last) | loss std (2nd half) "
        "| faults | peak memory (MiB) |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for j in jobs:
        loss = J.losses(j)
        status = "finished" if j.finished else "no summary"
        lines.append(
            f"| [{j.name}]({j.name}/) | {_esc(' '.join(own[j.name])) or '-'} | {status} | "
            f"{_f(J.env_steps(j))} | {_f(J.sps(j), 0)} | {_f(loss['total_last'], 3)} | "
            f"{_f(loss['total_std'], 3)} | {_f(J.faults(j))} | {_f(J.peak_memory_mb(j), 0)} |"
        )
    types = sorted({t for j in jobs for t in J.returns(j)})
    if types:
        lines += [
            "",
            "## Return per env type",
            "",
            "Mean of the last 100 episodes (summary.json), or the last logged window for a job "
            "without a summary; in brackets, the type's random-action return measured beside "
            "that job.",
            "",
            "| job | " + " | ".join(types) + " |",
            "|---|" + "--:|" * len(types),
        ]
        for j in jobs:
            rets, rnd = J.returns(j), J.random_returns(j)
            cells = [(_f(rets.get(t)) + (f" ({_f(rnd[t])})" if t in rnd else "")) for t in types]
            lines.append(f"| {j.name} | " + " | ".join(cells) + " |")
    notes = [f"- job {j.name}: {j.note}" for j in jobs if j.note]
    if notes:
        lines += ["", "## Notes", "", *notes]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    path = multirun_dir / "comparison.md"
    atomic_write(path, "\n".join(lines) + "\n")
    return path, plots
