"""The health report's verdicts: yes / no / n/a checks, each with its evidence, drawn from what
the sections found."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from rlpipe.telemetry.health.inputs import query
from rlpipe.telemetry.health.markdown import fmt
from rlpipe.telemetry.health.sections import Report

PEAK_MEMORY_LIMIT_MB = 12 * 1024


def verdict(check: str, ok: bool, evidence: str) -> tuple[str, str, str]:
    """A verdict the report could decide: yes when `ok`, else no."""
    return check, "yes" if ok else "no", evidence


def build_verdicts(report: Report) -> None:
    """Append the report's checks to `report.verdicts`, each (check, yes|no|n/a, evidence);
    what is appended before a failure stays."""
    s, v = report.s, report.verdicts
    if report.run.summary is not None and s.get("active_envs_end") is not None and s.get("env_count"):
        ok = s["active_envs_end"] >= s["env_count"]
        v.append(
            verdict("all envs active at end", ok, f"{s['active_envs_end']:,}/{s['env_count']:,} active (summary.json)")
        )
    else:
        v.append(("all envs active at end", "n/a", "summary.json missing"))

    rep = report.recovery
    if rep is None:
        v.append(("every injected fault recovered", "n/a", "lifecycle.sqlite missing"))
    elif rep["injected"] == 0:
        v.append(("every injected fault recovered", "n/a", "no faults injected"))
    else:
        v.append(
            verdict(
                "every injected fault recovered",
                rep["unrecovered"] == 0,
                f"{rep['recovered']}/{rep['injected']} recovered (lifecycle)",
            )
        )

    if report.run.db is None:
        v.append(("no worker lost", "n/a", "lifecycle.sqlite missing"))
    else:
        lost = lost_workers(report.run.db)
        n_restarts = (report.life_counts or {}).get("worker_restart", 0)
        v.append(
            verdict(
                "no worker lost",
                not lost,
                f"{n_restarts} restart(s), each followed by a new generation's worker_ready (lifecycle)"
                if not lost
                else "worker(s) restarted without a replacement that stepped: " + ", ".join(map(str, lost)),
            )
        )

    peak, src = None, None
    if s.get("peak_rss_mb"):
        peak, src = float(s["peak_rss_mb"]), "summary.json peak_rss_mb"
    else:  # a killed run's: the sampler's own curve, else the driver's chart (0: no sample yet)
        for tag in ("resources/tree/pss_mb", "memory/pss_mb"):
            series = report.run.scalars.get(tag)
            if series is not None and len(series.values) and float(series.values.max()) > 0:
                peak, src = float(series.values.max()), f"TensorBoard {tag}"
                break
    if peak is None:
        v.append(("peak memory under 12 GiB", "n/a", "not measured (no memory sample was taken)"))
    else:
        v.append(verdict("peak memory under 12 GiB", peak < PEAK_MEMORY_LIMIT_MB, f"{peak:,.1f} MiB ({src})"))

    if report.run.summary is not None and s.get("updates") is not None:
        ls = s.get("loss_std")
        finite = ls is None or (isinstance(ls, (int, float)) and math.isfinite(ls))
        ok = s["updates"] > 0 and finite
        v.append(verdict("learner updated, loss finite", ok, f"{s['updates']:,} update(s), loss_std {fmt(ls)}"))
    else:
        v.append(("learner updated, loss finite", "n/a", "summary.json missing"))

    learned = s.get("learned") or {}
    judged = {k: v for k, v in learned.items() if v != "unknown"}
    if judged:
        missed = sorted(k for k, v in judged.items() if v != "learned")
        v.append(
            verdict(
                "every env type learned (above its random return)",
                not missed,
                f"{len(judged) - len(missed)}/{len(judged)} learned"
                + (f"; did not learn: {', '.join(missed)}" if missed else "")
                + " (summary.json learned)",
            )
        )
    elif report.randoms:
        v.append(
            (
                "every env type learned (above its random return)",
                "n/a",
                "every verdict `unknown`: fewer than 200 episodes of each type"
                if learned
                else "no verdicts (summary.json missing)",
            )
        )
    else:
        v.append(("every env type learned (above its random return)", "n/a", "no random-return figures"))

    sps = report.run.scalars.get("charts/sps")
    if sps is not None and len(sps.values) >= 3:
        med = float(np.median(sps.values))
        ok = sps.last >= 0.5 * med
        v.append(
            verdict(
                "throughput held up (last sps ≥ half the median)",
                ok,
                f"last {sps.last:,.0f}, median {med:,.0f} (TensorBoard charts/sps)",
            )
        )
    else:
        v.append(("throughput held up (last sps ≥ half the median)", "n/a", "too few charts/sps points"))

    d = report.run.run_dir / "checkpoints"
    n = len([p for p in d.glob("ckpt_*.pt")]) if d.is_dir() else 0
    v.append(verdict("checkpoint written", n > 0, f"{n} file(s) in checkpoints/"))


def lost_workers(db: Path) -> list[int]:
    """Workers with a worker_restart row not followed by the `worker_ready` of a newer
    generation (a spawned replacement that never stepped its envs is still a lost worker)."""
    restarts = query(
        db, "SELECT worker_id, generation, ts FROM events WHERE kind = 'worker_restart' AND worker_id IS NOT NULL"
    )
    readies = query(
        db, "SELECT worker_id, generation, ts FROM events WHERE kind = 'worker_ready' AND worker_id IS NOT NULL"
    )
    newest: dict[int, tuple[int, float]] = {}  # worker -> (newest generation, its ready ts)
    for w, gen, ts in readies:
        if w not in newest or (gen or 0) >= newest[w][0]:
            newest[w] = (gen or 0, ts)
    lost = set()
    for w, gen, ts in restarts:
        new_gen, new_ts = newest.get(w, (-1, float("-inf")))
        if not (new_gen > (gen or 0) and new_ts >= ts):
            lost.add(w)
    return sorted(lost)
