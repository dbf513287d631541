"""The health report's inputs: the run's own files (summary.json, tb/, lifecycle.sqlite,
eval/history.jsonl), each read once, with a note saying whether it was present, missing or
unreadable."""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from rlpipe.lifecycle import connect_ro
from rlpipe.lifecycle.store import count_kinds
from rlpipe.telemetry.tb_events import Series, read_scalars

log = logging.getLogger(__name__)

RETURN_PREFIX = "charts/episodic_return/"
MEMORY_TAGS = ("memory/pss_mb", "workers/rss_mb_max", "workers/rss_mb_mean")
ENV_FAULT_KINDS = ("env_crash", "env_hang", "env_quarantine")  # a failed reset is an env_crash
EVAL_HISTORY = "eval/history.jsonl"  # evaluation during training: one line per round
# the random-return probe's files (rlpipe/envs/random_return.py), read where summary.json is
# missing or lacks their figures (a killed run's)
PROBE_FILES = {"random_return": "random_returns.json", "initial_policy_return": "initial_policy_returns.json"}


@dataclass
class RunFiles:
    run_dir: Path
    summary: dict | None = None
    summary_note: str = "missing"
    scalars: dict[str, Series] = field(default_factory=dict)
    tb_note: str = "missing"
    db: Path | None = None
    db_note: str = "missing"
    eval_rounds: list[dict] = field(default_factory=list)
    eval_note: str = "missing"
    notes: list[str] = field(default_factory=list)
    randoms: dict[str, float] = field(default_factory=dict)  # each type's random-action return
    starts: dict[str, float] = field(default_factory=dict)  # ... and its untrained policy's


def _load_summary(run_dir: Path) -> tuple[dict | None, str]:
    path = run_dir / "summary.json"
    if not path.is_file():
        return None, "missing"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return None, f"unreadable ({e})"
    if not isinstance(data, dict):
        return None, "unreadable (not a JSON object)"
    return data, "present"


def _load_tb(run_dir: Path) -> tuple[dict[str, Series], str]:
    tb = run_dir / "tb"
    if not tb.is_dir():
        return {}, "missing"
    files = [p for p in tb.iterdir() if p.is_file() and "tfevents" in p.name]
    if not files:
        return {}, "missing (tb/ holds no event files)"
    try:
        scalars = read_scalars(tb)
    except Exception as e:  # a truncated/corrupt event file must not sink the report
        log.warning("health report: cannot read %s: %s", tb, e)
        return {}, f"unreadable ({type(e).__name__}: {e})"
    return scalars, f"present ({len(files)} event file(s), {len(scalars)} scalar tag(s))"


def _load_db(run_dir: Path) -> tuple[Path | None, str]:
    path = run_dir / "lifecycle.sqlite"
    if not path.is_file():
        return None, "missing"
    try:
        with contextlib.closing(connect_ro(path)) as db:
            n = sum(count_kinds(db).values())
    except sqlite3.DatabaseError as e:
        return None, f"unreadable ({e})"
    return path, f"present ({n:,} rows)"


def _load_eval_rounds(run_dir: Path) -> tuple[list[dict], str]:
    """The rounds of eval/history.jsonl with env_steps and per-type results; a line that is
    not one (a round cut off mid-write by a crash) is counted, not fatal."""
    path = run_dir / EVAL_HISTORY
    if not path.is_file():
        return [], "missing"
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        return [], f"unreadable ({e})"
    rounds, bad = [], 0
    for line in lines:
        try:
            rec = json.loads(line)
            if isinstance(rec.get("types"), dict) and isinstance(rec.get("env_steps"), int):
                rounds.append(rec)
                continue
        except (ValueError, AttributeError):
            pass
        bad += 1
    return rounds, f"present ({len(rounds)} round(s)" + (f", {bad} unreadable line(s))" if bad else ")")


def load_run(run_dir: Path) -> RunFiles:
    run = RunFiles(Path(run_dir))
    run.summary, run.summary_note = _load_summary(run.run_dir)
    run.scalars, run.tb_note = _load_tb(run.run_dir)
    run.db, run.db_note = _load_db(run.run_dir)
    run.eval_rounds, run.eval_note = _load_eval_rounds(run.run_dir)
    run.randoms = _probe_figures(run, "random_return")
    run.starts = _probe_figures(run, "initial_policy_return")
    return run


def _probe_figures(run: RunFiles, key: str) -> dict[str, float]:
    """summary.json's figures of the probe, each type it lacks from the probe's own file."""
    figures = dict((run.summary or {}).get(key) or {})
    try:
        measured = json.loads((run.run_dir / PROBE_FILES[key]).read_text())
    except (OSError, ValueError):
        return figures
    for name, result in measured.items() if isinstance(measured, dict) else ():
        if name not in figures and isinstance(result, dict) and result.get("mean") is not None:
            if key == "random_return" or (result.get("episodes", 0) > 1 and not result.get("cut")):
                figures[name] = round(float(result["mean"]), 3)
    return figures


def query(db_path: Path, sql: str, args: tuple = ()) -> list[tuple]:
    with contextlib.closing(connect_ro(db_path)) as db:
        return db.execute(sql, args).fetchall()


def return_series(scalars: dict[str, Series]) -> dict[str, Series]:
    return {tag[len(RETURN_PREFIX) :]: s for tag, s in sorted(scalars.items()) if tag.startswith(RETURN_PREFIX)}


def eval_curves(rounds: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """type -> (env steps, mean return) of each round where some episode of it finished."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for rec in rounds:
        for name, t in rec["types"].items():
            if isinstance(t, dict) and t.get("mean") is not None:
                steps, means = out.setdefault(name, ([], []))
                steps.append(rec["env_steps"])
                means.append(float(t["mean"]))
    return out
