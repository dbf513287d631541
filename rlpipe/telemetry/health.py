"""The health report of a finished (or interrupted) run: `health_report.md` plus PNG plots in
the run directory (the day6 stage, docs/architecture.md).

Everything in it is read back from the run's own files (summary.json, tb/, lifecycle.sqlite,
errors_top10.md, checkpoints/, .hydra/overrides.yaml): never from config. An input that is
missing is said to be missing; a section that cannot be built says why and the rest of the
report is still written, so `write_health_report` can be called at the end of every run.

Plots (matplotlib, Agg, object API: no pyplot global state, no display):
- health_sps.png              charts/sps (and envs/active) over env steps
- health_returns.png          charts/episodic_return/<type> over env steps, one panel per type
- health_memory.png           memory/pss_mb, workers/rss_mb_max (and _mean) over env steps
- health_rewards_by_group.png per-type distribution of the logged returns (TensorBoard points)
                              and env faults per worker group (lifecycle)
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rlpipe.files import atomic_write
from rlpipe.lifecycle import FAULT_KINDS, connect_ro
from rlpipe.lifecycle.recovery import recovery_report, restart_reasons
from rlpipe.telemetry.tb_events import Series, read_scalars

log = logging.getLogger(__name__)

REPORT_NAME = "health_report.md"
PLOT_SPS = "health_sps.png"
PLOT_RETURNS = "health_returns.png"
PLOT_MEMORY = "health_memory.png"
PLOT_GROUPS = "health_rewards_by_group.png"

RETURN_PREFIX = "charts/episodic_return/"
MEMORY_TAGS = ("memory/pss_mb", "workers/rss_mb_max", "workers/rss_mb_mean")
ENV_FAULT_KINDS = ("env_crash", "env_hang", "env_quarantine", "env_reset_fail")
PEAK_MEMORY_LIMIT_MB = 12 * 1024
_CKPT = re.compile(r"^ckpt_(\d+)\.pt$")
_PANEL_COLS = 4


# --- inputs --------------------------------------------------------------------------------

@dataclass
class RunFiles:
    run_dir: Path
    summary: dict | None = None
    summary_note: str = "missing"
    scalars: dict[str, Series] = field(default_factory=dict)
    tb_note: str = "missing"
    db: Path | None = None
    db_note: str = "missing"
    notes: list[str] = field(default_factory=list)


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
    except Exception as e:          # a truncated/corrupt event file must not sink the report
        log.warning("health report: cannot read %s: %s", tb, e)
        return {}, f"unreadable ({type(e).__name__}: {e})"
    return scalars, f"present ({len(files)} event file(s), {len(scalars)} scalar tag(s))"


def _load_db(run_dir: Path) -> tuple[Path | None, str]:
    path = run_dir / "lifecycle.sqlite"
    if not path.is_file():
        return None, "missing"
    try:
        with contextlib.closing(connect_ro(path)) as db:
            n = db.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    except sqlite3.DatabaseError as e:
        return None, f"unreadable ({e})"
    return path, f"present ({n:,} rows)"


def load_run(run_dir: Path) -> RunFiles:
    run = RunFiles(Path(run_dir))
    run.summary, run.summary_note = _load_summary(run.run_dir)
    run.scalars, run.tb_note = _load_tb(run.run_dir)
    run.db, run.db_note = _load_db(run.run_dir)
    return run


def _query(db_path: Path, sql: str, args: tuple = ()) -> list[tuple]:
    with contextlib.closing(connect_ro(db_path)) as db:
        return db.execute(sql, args).fetchall()


# --- formatting ----------------------------------------------------------------------------

MISSING = "missing"


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if abs(v) >= 1000:
            return f"{v:,.1f}"
        return f"{round(v, digits):g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_fmt(x, digits)}" for k, x in v.items()) or "-"
    return str(v).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]], right: set[int] | None = None) -> str:
    right = set(range(1, len(header))) if right is None else right
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("--:" if i in right else "---" for i in range(len(header))) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(c if isinstance(c, str) else _fmt(c) for c in row) + " |")
    return "\n".join(lines)


def _types_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}×{v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


# --- plots ---------------------------------------------------------------------------------

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


def _return_series(scalars: dict[str, Series]) -> dict[str, Series]:
    return {tag[len(RETURN_PREFIX):]: s for tag, s in sorted(scalars.items()) if tag.startswith(RETURN_PREFIX)}


def plot_returns(scalars: dict[str, Series], path: Path) -> Path | None:
    rets = _return_series(scalars)
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
    rets = _return_series(scalars)
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


# --- sections ------------------------------------------------------------------------------

class _Report:
    def __init__(self, run: RunFiles):
        self.run = run
        self.s = run.summary or {}
        self.lines: list[str] = []
        self.plots: dict[str, Path | None] = {}
        self.recovery: dict | None = None
        self.group_faults: dict[int, dict[str, int]] | None = None
        self.groups: dict[int, dict] | None = None
        self.life_counts: dict[str, int] | None = None
        self.verdicts: list[tuple[str, str, str]] = []     # (check, yes|no|n/a, evidence)

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def section(self, title: str, build: Callable[[], None]) -> None:
        self.add("", f"## {title}", "")
        try:
            build()
        except Exception as e:       # one broken section must not cost the whole report
            log.warning("health report: section %r failed", title, exc_info=True)
            self.add(f"_This section could not be built: {type(e).__name__}: {e}_")

    # lifecycle data shared by several sections
    def load_lifecycle(self) -> None:
        db = self.run.db
        if db is None:
            return
        self.life_counts = dict(_query(db, "SELECT kind, COUNT(*) FROM events GROUP BY kind"))
        env_group: dict[int, int] = {}
        groups: dict[int, dict] = {}
        for worker_id, env_id, env_type in _query(
                db, "SELECT DISTINCT worker_id, env_id, env_type FROM events WHERE kind = 'env_create' "
                    "AND worker_id IS NOT NULL AND env_id IS NOT NULL"):
            if env_id in env_group:
                continue
            env_group[env_id] = worker_id
            g = groups.setdefault(worker_id, {"envs": 0, "types": {}, "generations": 0, "restarts": 0})
            g["envs"] += 1
            g["types"][env_type] = g["types"].get(env_type, 0) + 1
        for worker_id, gen in _query(db, "SELECT worker_id, MAX(generation) FROM events WHERE kind = "
                                         "'worker_spawn' AND worker_id IS NOT NULL GROUP BY worker_id"):
            groups.setdefault(worker_id, {"envs": 0, "types": {}, "generations": 0, "restarts": 0})
            groups[worker_id]["generations"] = gen or 0
        for worker_id, n in _query(db, "SELECT worker_id, COUNT(*) FROM events WHERE kind = "
                                       "'worker_restart' AND worker_id IS NOT NULL GROUP BY worker_id"):
            groups.setdefault(worker_id, {"envs": 0, "types": {}, "generations": 0, "restarts": 0})
            groups[worker_id]["restarts"] = n
        faults: dict[int, dict[str, int]] = {g: {} for g in groups}
        for env_id, worker_id, kind, n in _query(
                db, f"SELECT env_id, worker_id, kind, COUNT(*) FROM events WHERE kind IN "
                    f"({', '.join('?' * len(ENV_FAULT_KINDS))}) GROUP BY env_id, worker_id, kind",
                ENV_FAULT_KINDS):
            g = env_group.get(env_id, worker_id)
            if g is None:
                continue
            faults.setdefault(g, {})
            faults[g][kind] = faults[g].get(kind, 0) + n
        self.groups, self.group_faults = groups, faults

    def identity(self) -> None:
        s, run = self.s, self.run
        rows = [["run directory", f"`{run.run_dir}`"]]
        if run.db is not None:
            ids = [r[0] for r in _query(run.db, "SELECT DISTINCT run_id FROM events WHERE run_id IS NOT NULL")]
            rows.append(["run id (lifecycle)", ", ".join(map(str, ids)) or MISSING])
        overrides = run.run_dir / ".hydra" / "overrides.yaml"
        if overrides.is_file():
            ov = [ln[2:].strip() for ln in overrides.read_text().splitlines() if ln.startswith("- ")]
            rows.append(["overrides", " ".join(f"`{o}`" for o in ov) if ov else "(none)"])
        rows += [["stage", _fmt(s.get("stage")) if run.summary else MISSING],
                 ["env_count", _fmt(s.get("env_count"))],
                 ["cgroup driver", _fmt(s.get("cgroup_driver"))],
                 ["redis", _fmt(s.get("redis"))],
                 ["resumed from step", _fmt(s.get("resumed_from_step"))]]
        self.add(_table(["", ""], rows, right=set()), "")
        types = s.get("env_types")
        source = "summary.json"
        if not types and self.groups:
            types = {}
            for g in self.groups.values():
                for t, n in g["types"].items():
                    types[t] = types.get(t, 0) + n
            source = "lifecycle env_create rows"
        if not types:
            self.add("Env types: missing (no summary.json and no env_create rows).")
            return
        versions = s.get("env_versions") or {}
        self.add(f"Env types ({len(types)}, from {source}):", "")
        self.add(_table(["env type", "envs", "version(s)"],
                        [[t, n, ", ".join(f"`{v}`" for v in versions.get(t, [])) or "-"]
                         for t, n in types.items()], right={1}))

    def headline(self) -> None:
        if self.run.summary is None:
            self.add(f"summary.json is {self.run.summary_note}: no headline figures.")
            return
        s = self.s
        keys = ["sps", "env_steps", "wall_s", "startup_first_step_s", "all_envs_ready_s", "active_envs_end",
                "peak_rss_mb", "shm_bytes", "updates", "episodes", "loss_std", "loss_std_checkpoints"]
        rows = [[f"`{k}`", _fmt(s.get(k))] for k in keys]
        rows.append(["`board.torn_retries`", _fmt((s.get("board") or {}).get("torn_retries"))])
        dist = s.get("dist") or {}
        if dist.get("world_size") not in (None, 1):
            rows.append(["`dist`", _fmt(dist)])
        self.add("From summary.json:", "", _table(["figure", "value"], rows))

    def returns(self) -> None:
        last100 = self.s.get("mean_return_last100") or {}
        counts = self.s.get("env_types") or {}
        tb = _return_series(self.run.scalars)
        names = list(dict.fromkeys([*counts, *last100, *tb]))
        if not names:
            self.add("No returns: summary.json and TensorBoard both lack them.")
            return
        rows = []
        for name in names:
            s = tb.get(name)
            if s is None:
                rows.append([name, counts.get(name), last100.get(name), None, None, "-", 0])
                continue
            delta = s.last - s.first
            trend = "flat" if math.isclose(delta, 0.0, abs_tol=1e-9) else ("up" if delta > 0 else "down")
            rows.append([name, counts.get(name), last100.get(name), s.first, s.last,
                         f"{trend} ({delta:+.3g})", len(s.steps)])
        self.add("Last-100 mean from summary.json; first and last value of "
                 "`charts/episodic_return/<type>` from TensorBoard (`missing`: not logged, e.g. no "
                 "episode finished).", "")
        self.add(_table(["env type", "envs", "last-100 mean", "TB first", "TB last", "trend", "TB points"],
                        rows))
        self._image(PLOT_RETURNS, "returns per env type")

    def throughput_memory(self) -> None:
        sc = self.run.scalars
        if not sc:
            self.add(f"TensorBoard events are {self.run.tb_note}: no curves.")
            return
        rows = []
        for tag in ("charts/sps", "envs/active", *MEMORY_TAGS):
            s = sc.get(tag)
            if s is None:
                rows.append([f"`{tag}`", 0, None, None, None, None])
            else:
                rows.append([f"`{tag}`", len(s.steps), float(s.values.min()), float(np.median(s.values)),
                             float(s.values.max()), s.last])
        self.add(_table(["TensorBoard tag", "points", "min", "median", "max", "last"], rows))
        self._image(PLOT_SPS, "throughput")
        self._image(PLOT_MEMORY, "memory")

    def faults(self) -> None:
        sf = self.s.get("faults") if self.run.summary else None
        lc = self.life_counts
        rows = []
        for key, kind in FAULT_KINDS.items():
            rows.append([f"`{key}`", _fmt(sf.get(key)) if sf else MISSING,
                         _fmt(lc.get(kind, 0)) if lc is not None else MISSING])
        self.add(f"summary.json is {self.run.summary_note}; lifecycle.sqlite is {self.run.db_note}.", "")
        self.add(_table(["fault", "summary.json", f"lifecycle rows ({'`kind`'})"], rows))
        if lc:
            self.add("", "All lifecycle events by kind:", "",
                     _table(["kind", "rows"], [[f"`{k}`", n] for k, n in sorted(lc.items())]))
            by_type = _query(self.run.db,
                             f"SELECT env_type, kind, COUNT(*) FROM events WHERE kind IN "
                             f"({', '.join('?' * len(ENV_FAULT_KINDS))}) AND env_type IS NOT NULL "
                             f"GROUP BY env_type, kind", ENV_FAULT_KINDS)
            if by_type:
                table: dict[str, dict[str, int]] = {}
                for t, kind, n in by_type:
                    table.setdefault(t, {})[kind] = n
                self.add("", "Env faults by env type (lifecycle):", "",
                         _table(["env type", *ENV_FAULT_KINDS],
                                [[t, *[table[t].get(k, 0) for k in ENV_FAULT_KINDS]] for t in sorted(table)]))

    def groups_section(self) -> None:
        if self.groups is None:
            self.add(f"lifecycle.sqlite is {self.run.db_note}: no worker groups.")
            self._image(PLOT_GROUPS, "returns per env type and faults per worker group")
            return
        rows = []
        for g in sorted(self.groups):
            info, f = self.groups[g], (self.group_faults or {}).get(g, {})
            rows.append([str(g), info["envs"], _types_text(info["types"]) or "-", info["generations"],
                         info["restarts"], *[f.get(k, 0) for k in ENV_FAULT_KINDS]])
        self.add("Groups are the env ids each worker created (lifecycle `env_create` rows). Finished-episode "
                 "returns are not recorded per group, so the plot shows the per-type distribution of the "
                 "TensorBoard return points next to the env faults of each group.", "")
        self.add(_table(["worker", "envs", "env types", "generations", "restarts", *ENV_FAULT_KINDS], rows,
                        right={1, 3, 4, 5, 6, 7, 8}))
        self._image(PLOT_GROUPS, "returns per env type and faults per worker group")

    def restarts(self) -> None:
        if self.run.db is None:
            self.add(f"lifecycle.sqlite is {self.run.db_note}.")
            return
        reasons = restart_reasons(self.run.db)
        if not reasons:
            self.add("No worker restarts.")
            return
        self.add(_table(["reason", "restarts"], [[f"`{r}`", n] for r, n in reasons.items()]))

    def chaos(self) -> None:
        if self.run.db is None:
            self.add(f"lifecycle.sqlite is {self.run.db_note}.")
            return
        rep = recovery_report(self.run.db, summary=self.run.summary)
        self.recovery = rep
        if rep["injected"] == 0:
            self.add("No faults were injected (no `chaos_inject` rows).")
            return
        lost = rep["lost_env_steps"]
        self.add(f"- injected: {rep['injected']}, recovered: {rep['recovered']}, "
                 f"unrecovered: {rep['unrecovered']}",
                 f"- time to recover: p50 {_fmt(rep['recover_s_p50'])} s, p99 {_fmt(rep['recover_s_p99'])} s",
                 f"- lost env-steps (estimate: down time × worker's envs × per-env step rate "
                 f"{_fmt(rep['per_env_sps'])}/s): "
                 + (_fmt(lost) if lost is not None else "missing (needs summary.json)"), "")
        self.add(_table(["fault", "injected", "recovered", "p50 s", "p99 s"],
                        [[f"`{w}`", k["injected"], k["recovered"], k["p50_s"], k["p99_s"]]
                         for w, k in sorted(rep["by_kind"].items())]))
        events = rep["events"]
        shown = events[:50]
        self.add("", "Injections (t: seconds into the run):", "")
        self.add(_table(["t", "fault", "worker", "gen", "recovered by", "recover s"],
                        [[e["t"], f"`{e['what']}`", e["worker_id"] if e["worker_id"] is not None else "-",
                          e["generation"] if e["generation"] is not None else "-",
                          e["recovered_by"] or "**not recovered**", e["recover_s"]] for e in shown],
                        right={0, 2, 3, 5}))
        if len(events) > len(shown):
            self.add("", f"({len(events) - len(shown)} more injections not listed.)")

    def errors(self) -> None:
        path = self.run.run_dir / "errors_top10.md"
        if not path.is_file():
            self.add("errors_top10.md is missing.")
            return
        lines = path.read_text(errors="replace").splitlines()
        self.add("Full report with samples: [errors_top10.md](errors_top10.md).", "")
        intro = next((ln for ln in lines if ln.strip() and not ln.startswith(("#", "|"))), None)
        if intro:
            self.add(intro, "")
        start = next((i for i, ln in enumerate(lines) if ln.startswith("|")), None)
        if start is None:
            self.add("(no error table in it)")
            return
        table = []
        for ln in lines[start:]:
            if not ln.startswith("|"):
                break
            table.append(ln)
        self.add(*table[:12])

    def checkpoints(self) -> None:
        d = self.run.run_dir / "checkpoints"
        if not d.is_dir():
            self.add("checkpoints/ is missing: no checkpoint was written.")
            return
        files = sorted((p for p in d.iterdir() if p.is_file() and not p.name.startswith(".")),
                       key=lambda p: p.name)
        if not files:
            self.add("checkpoints/ is empty: no checkpoint was written.")
            return
        rows = []
        for p in files:
            m = _CKPT.match(p.name)
            st = p.stat()
            rows.append([f"`{p.name}`", int(m.group(1)) if m else "-", round(st.st_size / 2**20, 2),
                         time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(st.st_mtime))])
        self.add(_table(["file", "step", "MiB", "written (UTC)"], rows, right={1, 2}))

    def _image(self, name: str, alt: str) -> None:
        path = self.plots.get(name)
        if path is not None:
            self.add("", f"![{alt}]({name})")
        else:
            self.add("", f"_{name}: not drawn (its inputs are missing)._")

    # verdicts, from what the sections found
    def build_verdicts(self) -> None:
        s, v = self.s, self.verdicts
        if self.run.summary is not None and s.get("active_envs_end") is not None and s.get("env_count"):
            ok = s["active_envs_end"] >= s["env_count"]
            v.append(("all envs active at end", "yes" if ok else "no",
                      f"{s['active_envs_end']:,}/{s['env_count']:,} active (summary.json)"))
        else:
            v.append(("all envs active at end", "n/a", "summary.json missing"))

        rep = self.recovery
        if rep is None:
            v.append(("every injected fault recovered", "n/a", "lifecycle.sqlite missing"))
        elif rep["injected"] == 0:
            v.append(("every injected fault recovered", "n/a", "no faults injected"))
        else:
            v.append(("every injected fault recovered", "yes" if rep["unrecovered"] == 0 else "no",
                      f"{rep['recovered']}/{rep['injected']} recovered (lifecycle)"))

        if self.run.db is None:
            v.append(("no worker lost", "n/a", "lifecycle.sqlite missing"))
        else:
            lost = self._lost_workers()
            n_restarts = (self.life_counts or {}).get("worker_restart", 0)
            v.append(("no worker lost", "yes" if not lost else "no",
                      f"{n_restarts} restart(s), each followed by a new generation's spawn (lifecycle)" if not lost
                      else "worker(s) restarted without a replacement: " + ", ".join(map(str, lost))))

        peak, src = None, None
        if s.get("peak_rss_mb") is not None:
            peak, src = float(s["peak_rss_mb"]), "summary.json peak_rss_mb"
        elif "memory/pss_mb" in self.run.scalars:
            peak, src = float(self.run.scalars["memory/pss_mb"].values.max()), "TensorBoard memory/pss_mb"
        if peak is None:
            v.append(("peak memory under 12 GiB", "n/a", "no memory figure"))
        else:
            v.append(("peak memory under 12 GiB", "yes" if peak < PEAK_MEMORY_LIMIT_MB else "no",
                      f"{peak:,.1f} MiB ({src})"))

        if self.run.summary is not None and s.get("updates") is not None:
            ls = s.get("loss_std")
            finite = ls is None or (isinstance(ls, (int, float)) and math.isfinite(ls))
            ok = s["updates"] > 0 and finite
            v.append(("learner updated, loss finite", "yes" if ok else "no",
                      f"{s['updates']:,} update(s), loss_std {_fmt(ls)}"))
        else:
            v.append(("learner updated, loss finite", "n/a", "summary.json missing"))

        sps = self.run.scalars.get("charts/sps")
        if sps is not None and len(sps.values) >= 3:
            med = float(np.median(sps.values))
            ok = sps.last >= 0.5 * med
            v.append(("throughput held up (last sps ≥ half the median)", "yes" if ok else "no",
                      f"last {sps.last:,.0f}, median {med:,.0f} (TensorBoard charts/sps)"))
        else:
            v.append(("throughput held up (last sps ≥ half the median)", "n/a", "too few charts/sps points"))

        d = self.run.run_dir / "checkpoints"
        n = len([p for p in d.glob("ckpt_*.pt")]) if d.is_dir() else 0
        v.append(("checkpoint written", "yes" if n else "no", f"{n} file(s) in checkpoints/"))

    def _lost_workers(self) -> list[int]:
        """Workers with a worker_restart row not followed by a spawn of a newer generation."""
        db = self.run.db
        restarts = _query(db, "SELECT worker_id, generation, ts FROM events WHERE kind = 'worker_restart' "
                              "AND worker_id IS NOT NULL")
        spawns = _query(db, "SELECT worker_id, generation, ts FROM events WHERE kind = 'worker_spawn' "
                            "AND worker_id IS NOT NULL")
        newest: dict[int, tuple[int, float]] = {}     # worker -> (newest generation, its spawn ts)
        for w, gen, ts in spawns:
            if w not in newest or (gen or 0) >= newest[w][0]:
                newest[w] = (gen or 0, ts)
        lost = set()
        for w, gen, ts in restarts:
            new_gen, new_ts = newest.get(w, (-1, float("-inf")))
            if not (new_gen > (gen or 0) and new_ts >= ts):
                lost.add(w)
        return sorted(lost)


def write_health_report(run_dir: str | Path) -> Path:
    """Write `health_report.md` and the `health_*.png` plots into `run_dir`; return the md's
    path. Missing inputs are reported as missing; nothing here raises for a broken run."""
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    rep = _Report(run)
    try:
        rep.load_lifecycle()
    except Exception as e:
        log.warning("health report: cannot read lifecycle rows", exc_info=True)
        run.notes.append(f"lifecycle rows could not be read: {type(e).__name__}: {e}")

    # plots first, so the sections can link what was drawn
    for name, draw in ((PLOT_SPS, lambda p: plot_sps(run.scalars, p)),
                       (PLOT_RETURNS, lambda p: plot_returns(run.scalars, p)),
                       (PLOT_MEMORY, lambda p: plot_memory(run.scalars, p)),
                       (PLOT_GROUPS, lambda p: plot_groups(run.scalars, rep.group_faults, p))):
        path = run_dir / name
        try:
            rep.plots[name] = draw(path)
        except Exception as e:
            log.warning("health report: plot %s failed", name, exc_info=True)
            run.notes.append(f"{name} could not be drawn: {type(e).__name__}: {e}")
            rep.plots[name] = None
        if rep.plots[name] is None and path.exists():
            path.unlink()          # a stale plot of an earlier report must not pass for this run's

    rep.section("Run", rep.identity)
    rep.section("Headline figures", rep.headline)
    rep.section("Returns per env type", rep.returns)
    rep.section("Throughput and memory", rep.throughput_memory)
    rep.section("Faults", rep.faults)
    rep.section("Worker groups", rep.groups_section)
    rep.section("Worker restarts by reason", rep.restarts)
    rep.section("Chaos recovery", rep.chaos)
    rep.section("Top errors", rep.errors)
    rep.section("Checkpoints", rep.checkpoints)
    try:
        rep.build_verdicts()
    except Exception as e:
        log.warning("health report: verdicts failed", exc_info=True)
        run.notes.append(f"verdicts incomplete: {type(e).__name__}: {e}")

    head = [f"# Health report: {run_dir.name}", "",
            f"Written {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC from this run's files only "
            f"(never from config).", "",
            _table(["input", "state"], [
                ["`summary.json`", run.summary_note], ["`tb/`", run.tb_note],
                ["`lifecycle.sqlite`", run.db_note],
                ["`errors_top10.md`", "present" if (run_dir / "errors_top10.md").is_file() else "missing"],
                ["`checkpoints/`", "present" if (run_dir / "checkpoints").is_dir() else "missing"]], right=set()),
            ]
    passed = sum(1 for _, r, _ in rep.verdicts if r == "yes")
    failed = sum(1 for _, r, _ in rep.verdicts if r == "no")
    head += ["", "## Verdict", "",
             f"{passed} check(s) passed, {failed} failed, {len(rep.verdicts) - passed - failed} not applicable.", ""]
    mark = {"yes": "✅", "no": "❌", "n/a": "➖"}
    head += [f"- {mark.get(r, '')} {check}: **{r}**: {evidence}" for check, r, evidence in rep.verdicts]
    if run.notes:
        head += ["", "Notes:", ""] + [f"- {n}" for n in run.notes]

    return atomic_write(run_dir / REPORT_NAME, "\n".join(head + rep.lines) + "\n")
