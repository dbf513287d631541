"""The jobs of a multirun, read back from their directories: overrides, figures, curves.

A multirun directory (Hydra's `multirun/<date>/<time>/`, or any `hydra.sweep.dir`) holds one
folder per job, each with `.hydra/overrides.yaml`. Each figure of a job comes from its
`summary.json` when the job finished; a job without one (killed, or still running) gets what
its TensorBoard scalars say, and is marked so in the table.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from rlpipe.telemetry.tb_events import Series, read_scalars

RETURN_PREFIX = "charts/episodic_return/"
CURVE_TAGS = ("charts/sps", "losses/total", "memory/pss_mb")


@dataclass
class Job:
    name: str  # the job's folder name (Hydra numbers them 0, 1, ...)
    run_dir: Path
    overrides: list[str]
    summary: dict | None
    scalars: dict[str, Series] = field(default_factory=dict)
    note: str = ""  # why a figure is missing or estimated

    @property
    def finished(self) -> bool:
        return self.summary is not None

    def returns(self) -> dict[str, Series]:
        return {t[len(RETURN_PREFIX) :]: s for t, s in sorted(self.scalars.items()) if t.startswith(RETURN_PREFIX)}


def _natural(name: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def is_run_dir(path: Path) -> bool:
    return (path / ".hydra" / "config.yaml").is_file()


def job_dirs(path: Path) -> list[Path]:
    """The job folders directly under a multirun directory, in Hydra's job order."""
    if not path.is_dir():
        return []
    return sorted(
        (p for p in path.iterdir() if (p / ".hydra" / "overrides.yaml").is_file()), key=lambda p: _natural(p.name)
    )


def load_job(run_dir: Path) -> Job:
    try:
        overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()) or []
    except (OSError, yaml.YAMLError):
        overrides = []
    summary, note = None, ""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except FileNotFoundError:
        note = "no summary.json (killed or still running): figures from TensorBoard"
    except (OSError, ValueError) as exc:
        note = f"summary.json unreadable ({exc}): figures from TensorBoard"
    scalars = {}
    if (run_dir / "tb").is_dir():
        try:
            scalars = read_scalars(run_dir / "tb")
        except Exception as exc:  # a truncated event file leaves the job's curves out
            note = (note + "; " if note else "") + f"tb/ unreadable ({type(exc).__name__})"
    return Job(run_dir.name, run_dir, [str(o) for o in overrides], summary, scalars, note)


def varying(jobs: list[Job]) -> tuple[list[str], dict[str, list[str]]]:
    """(overrides every job shares, each job's own overrides)."""
    common = [o for o in jobs[0].overrides if all(o in j.overrides for j in jobs)] if jobs else []
    return common, {j.name: [o for o in j.overrides if o not in common] for j in jobs}


# --- figures of one job (summary first, TensorBoard otherwise) --------------------------------


def env_steps(job: Job) -> int | None:
    if job.summary:
        return job.summary.get("env_steps")
    steps = [int(s.steps[-1]) for s in job.scalars.values() if len(s.steps)]
    return max(steps) if steps else None


def sps(job: Job) -> float | None:
    if job.summary:
        return job.summary.get("sps")
    s = job.scalars.get("charts/sps")
    return float(np.mean(s.values)) if s is not None and len(s.values) else None


def returns(job: Job) -> dict[str, float | None]:
    if job.summary and job.summary.get("mean_return_last100"):
        return dict(job.summary["mean_return_last100"])
    return {name: s.last for name, s in job.returns().items()}


def random_returns(job: Job) -> dict[str, float]:
    return dict((job.summary or {}).get("random_return") or {})


def losses(job: Job) -> dict[str, float | None]:
    """The last total loss, the std of the total loss over the run's second half (summary's
    loss_std) and the last value loss."""
    out = {}
    for key, tag in (("total_last", "losses/total"), ("value_last", "losses/value")):
        s = job.scalars.get(tag)
        out[key] = s.last if s is not None and len(s.values) else None
    out["total_std"] = (job.summary or {}).get("loss_std")
    return out


def faults(job: Job) -> int | None:
    f = (job.summary or {}).get("faults")
    return sum(v for v in f.values() if isinstance(v, (int, float))) if isinstance(f, dict) else None


def peak_memory_mb(job: Job) -> float | None:
    if job.summary:
        return job.summary.get("peak_rss_mb")
    s = job.scalars.get("memory/pss_mb")
    return float(s.values.max()) if s is not None and len(s.values) else None
