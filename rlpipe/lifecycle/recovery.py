"""How a run healed from the faults it injected into itself (chaos), read from its lifecycle
log after the fact.

Every `chaos_inject` row is matched with the row that says the fault is healed, by the rule
its fault class declares (`healed_by`, rlpipe.chaos_faults): the first row of that kind at or
after the injection; for a worker fault, of the same worker id with a higher generation (the
replacement has stepped its envs once); for a Redis fault, one `redis_recovered` per
injection (the driver writes it once every live worker has beaten into Redis again, not when
the server merely answers a ping); a frozen driver heals at the `driver_stall` row (the stall
detector ended the run for its supervisor to restart; the restart is a new run in the same
log). An injection whose fault the registry does not know is counted and never healed.

Time to recover is the difference of the two rows' timestamps (both wall clock, written by
the driver). `lost_env_steps_est` estimates how much stepping the worker faults (those with
`costs_env_steps`) cost: for each healed one, the seconds its envs did not step (injection ->
ready) times the worker's env count (its `worker_spawn` detail "envs") times the run's per-env
step rate (summary.json: env_steps / env_count / wall_s). Without a summary.json beside the db
the estimate is None.

Read-only: safe on a finished run and on one that is still writing. The one module of rlpipe
this package imports: rlpipe.chaos_faults, which imports nothing of rlpipe.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from rlpipe.chaos_faults import BY_WHAT, FAULTS, Healed
from rlpipe.lifecycle.readers import connect_ro


def _detail(text: str | None) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return {"text": text}
    return value if isinstance(value, dict) else {"value": value}


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


def _rows(db: sqlite3.Connection, kinds: tuple[str, ...]) -> list[dict]:
    db.row_factory = sqlite3.Row
    rows = db.execute(
        f"SELECT id, ts, kind, env_id, worker_id, generation, detail FROM events "
        f"WHERE kind IN ({', '.join('?' * len(kinds))}) ORDER BY ts, id",
        kinds,
    ).fetchall()
    out = []
    for r in rows:
        d = dict(r)
        d["detail"] = _detail(d["detail"])
        out.append(d)
    return out


def _first(rows: list[dict], start: int, ok) -> dict | None:
    """The first of rows[start:] that passes `ok` (no copy of the tail)."""
    for i in range(start, len(rows)):
        if ok(rows[i]):
            return rows[i]
    return None


class _Healings:
    """The rows that can heal an injection, by kind (and by worker id for the rules that
    follow a worker), each list in time order, and the rows already used by a `one_each` rule."""

    def __init__(self, rows_of: dict[str, list[dict]]):
        self.rows_of = rows_of
        self.ts_of = {kind: [r["ts"] for r in rows] for kind, rows in rows_of.items()}
        self.by_worker: dict[tuple[str, int], list[dict]] = {}
        for kind, rows in rows_of.items():
            for r in rows:
                if r["worker_id"] is not None and r["generation"] is not None:
                    self.by_worker.setdefault((kind, r["worker_id"]), []).append(r)
        self.by_worker_ts = {k: [r["ts"] for r in rows] for k, rows in self.by_worker.items()}
        self.used: set[int] = set()

    def match(self, rule: Healed, inj: dict) -> dict | None:
        if rule.newer_generation:
            wid = inj["worker_id"]
            if wid is None:
                return None
            gen0 = inj["generation"] if inj["generation"] is not None else -1
            rows = self.by_worker.get((rule.kind, wid), [])
            start = bisect.bisect_left(self.by_worker_ts.get((rule.kind, wid), []), inj["ts"])
            return _first(rows, start, lambda r: r["generation"] > gen0)
        start = bisect.bisect_left(self.ts_of[rule.kind], inj["ts"])
        if not rule.one_each:
            return _first(self.rows_of[rule.kind], start, lambda r: True)
        match = _first(self.rows_of[rule.kind], start, lambda r: r["id"] not in self.used)
        if match is not None:
            self.used.add(match["id"])
        return match


def per_env_step_rate(summary: dict | None) -> float | None:
    """env steps per env per second over the run, from summary.json figures; None if unknown."""
    if not summary:
        return None
    try:
        steps = float(summary["env_steps"])
        envs = float(summary["env_count"])
        wall = float(summary["wall_s"])
    except (KeyError, TypeError, ValueError):
        return None
    if envs <= 0 or wall <= 0:
        return None
    return steps / envs / wall


def _load_summary(db_path: Path) -> dict | None:
    path = db_path.parent / "summary.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _worker_env_counts(spawns: list[dict], creates: list[tuple[int, int]]) -> tuple[dict, dict]:
    """(worker_id, generation) -> envs, and worker_id -> envs (any generation; the env_create
    rows as a last resort)."""
    by_gen: dict[tuple[int, int], int] = {}
    by_worker: dict[int, int] = {}
    for s in spawns:
        n = s["detail"].get("envs")
        if s["worker_id"] is None or not isinstance(n, (int, float)):
            continue  # e.g. a worker_spawn that only carries a warning
        by_gen[(s["worker_id"], s["generation"])] = int(n)
        by_worker[s["worker_id"]] = int(n)
    envs_of: dict[int, set] = {}
    for worker_id, env_id in creates:
        envs_of.setdefault(worker_id, set()).add(env_id)
    for worker_id, ids in envs_of.items():
        by_worker.setdefault(worker_id, len(ids))
    return by_gen, by_worker


def recovery_report(db_path: str | Path, summary: dict | None = None) -> dict[str, Any]:
    """Match every chaos injection of a run with its recovery; see the module docstring.

    `summary` defaults to the summary.json beside the db (None if there is none). Returns
    {"injected", "recovered", "unrecovered",
     "by_kind": {what: {"injected", "recovered", "p50_s", "p99_s"}},
     "recover_s_p50", "recover_s_p99", "lost_env_steps_est", "per_env_sps",
     "events": [{"id", "what", "worker_id", "generation", "t", "recover_s", "recovered_by"}]}
    with times in seconds (None where nothing was recovered).
    """
    db_path = Path(db_path)
    if summary is None:
        summary = _load_summary(db_path)
    rate = per_env_step_rate(summary)
    with contextlib.closing(connect_ro(db_path)) as db:
        injects = _rows(db, ("chaos_inject",))
        healings = _Healings({kind: _rows(db, (kind,)) for kind in sorted({f.healed_by.kind for f in FAULTS})})
        spawns = _rows(db, ("worker_spawn",))
        creates = db.execute(
            "SELECT DISTINCT worker_id, env_id FROM events WHERE kind = 'env_create' "
            "AND worker_id IS NOT NULL AND env_id IS NOT NULL"
        ).fetchall()
    envs_by_gen, envs_by_worker = _worker_env_counts(spawns, creates)

    events: list[dict] = []
    by_kind: dict[str, dict] = {}
    times: dict[str, list[float]] = {}
    lost = 0.0
    for inj in injects:
        what = str(inj["detail"].get("what", "unknown"))
        wid, gen = inj["worker_id"], inj["generation"]
        fault = BY_WHAT.get(what)
        match = healings.match(fault.healed_by, inj) if fault is not None else None
        k = by_kind.setdefault(what, {"injected": 0, "recovered": 0, "p50_s": None, "p99_s": None})
        k["injected"] += 1
        recover_s = None
        if match is not None:
            recover_s = round(match["ts"] - inj["ts"], 3)
            k["recovered"] += 1
            times.setdefault(what, []).append(recover_s)
            if fault.costs_env_steps:
                n_envs = envs_by_gen.get((wid, gen), envs_by_worker.get(wid, 0))
                lost += recover_s * n_envs * (rate or 0.0)
        events.append(
            {
                "id": inj["id"],
                "what": what,
                "worker_id": wid,
                "generation": gen,
                "t": inj["detail"].get("t"),
                "recover_s": recover_s,
                "recovered_by": None if match is None else fault.healed_by.label(match),
            }
        )
    for what, k in by_kind.items():
        k["p50_s"] = _pct(times.get(what, []), 50)
        k["p99_s"] = _pct(times.get(what, []), 99)
    all_times = [t for ts in times.values() for t in ts]
    recovered = sum(k["recovered"] for k in by_kind.values())
    return {
        "injected": len(injects),
        "recovered": recovered,
        "unrecovered": len(injects) - recovered,
        "by_kind": by_kind,
        "recover_s_p50": _pct(all_times, 50),
        "recover_s_p99": _pct(all_times, 99),
        "lost_env_steps_est": round(lost) if rate is not None else None,
        "per_env_sps": round(rate, 3) if rate is not None else None,
        "events": events,
    }


def restart_reasons(db_path: str | Path) -> dict[str, int]:
    """worker_restart rows counted by their detail "reason" ("unknown" when it has none),
    most frequent first."""
    with contextlib.closing(connect_ro(db_path)) as db:
        rows = db.execute("SELECT detail FROM events WHERE kind = 'worker_restart'").fetchall()
    counts = Counter(str(_detail(d).get("reason") or "unknown") for (d,) in rows)
    return dict(counts.most_common())
