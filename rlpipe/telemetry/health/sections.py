"""The sections of the health report: each reads what `load_lifecycle` and the inputs hold and
adds its lines; a section that fails says why and the report goes on."""

from __future__ import annotations

import logging
import math
import re
import time
from pathlib import Path
from typing import Callable

import numpy as np

from rlpipe.lifecycle import FAULT_KINDS, kind_counts
from rlpipe.lifecycle.recovery import recovery_report, restart_reasons
from rlpipe.telemetry.health.evaluation import EvaluationSections
from rlpipe.telemetry.health.inputs import ENV_FAULT_KINDS, MEMORY_TAGS, RunFiles, query, return_series
from rlpipe.telemetry.health.markdown import MISSING, fmt, md_table, types_text
from rlpipe.telemetry.health.plots import PLOT_GROUPS, PLOT_MEMORY, PLOT_RETURNS, PLOT_SPS

log = logging.getLogger(__name__)

_CKPT = re.compile(r"^ckpt_(\d+)\.pt$")


class Report(EvaluationSections):
    def __init__(self, run: RunFiles):
        self.run = run
        self.s = run.summary or {}
        self.lines: list[str] = []
        self.plots: dict[str, Path | None] = {}
        self.recovery: dict | None = None
        self.group_faults: dict[int, dict[str, int]] | None = None
        self.groups: dict[int, dict] | None = None
        self.life_counts: dict[str, int] | None = None
        self.verdicts: list[tuple[str, str, str]] = []  # (check, yes|no|n/a, evidence)
        self.randoms = run.randoms  # summary.json's, else random_returns.json's (a killed run)

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def section(self, title: str, build: Callable[[], None]) -> None:
        self.add("", f"## {title}", "")
        try:
            build()
        except Exception as e:  # one broken section must not cost the whole report
            log.warning("health report: section %r failed", title, exc_info=True)
            self.add(f"_This section could not be built: {type(e).__name__}: {e}_")

    # lifecycle data shared by several sections
    def load_lifecycle(self) -> None:
        db = self.run.db
        if db is None:
            return
        self.life_counts = kind_counts(db)
        env_group: dict[int, int] = {}
        groups: dict[int, dict] = {}
        for worker_id, env_id, env_type in query(
            db,
            "SELECT DISTINCT worker_id, env_id, env_type FROM events WHERE kind = 'env_create' "
            "AND worker_id IS NOT NULL AND env_id IS NOT NULL",
        ):
            if env_id in env_group:
                continue
            env_group[env_id] = worker_id
            g = groups.setdefault(worker_id, {"envs": 0, "types": {}, "generations": 0, "restarts": 0})
            g["envs"] += 1
            g["types"][env_type] = g["types"].get(env_type, 0) + 1
        for worker_id, gen in query(
            db,
            "SELECT worker_id, MAX(generation) FROM events WHERE kind = "
            "'worker_spawn' AND worker_id IS NOT NULL GROUP BY worker_id",
        ):
            groups.setdefault(worker_id, {"envs": 0, "types": {}, "generations": 0, "restarts": 0})
            groups[worker_id]["generations"] = gen or 0
        for worker_id, n in query(
            db,
            "SELECT worker_id, COUNT(*) FROM events WHERE kind = "
            "'worker_restart' AND worker_id IS NOT NULL GROUP BY worker_id",
        ):
            groups.setdefault(worker_id, {"envs": 0, "types": {}, "generations": 0, "restarts": 0})
            groups[worker_id]["restarts"] = n
        faults: dict[int, dict[str, int]] = {g: {} for g in groups}
        for env_id, worker_id, kind, n in query(
            db,
            f"SELECT env_id, worker_id, kind, COUNT(*) FROM events WHERE kind IN "
            f"({', '.join('?' * len(ENV_FAULT_KINDS))}) GROUP BY env_id, worker_id, kind",
            ENV_FAULT_KINDS,
        ):
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
            ids = [r[0] for r in query(run.db, "SELECT DISTINCT run_id FROM events WHERE run_id IS NOT NULL")]
            rows.append(["run id (lifecycle)", ", ".join(map(str, ids)) or MISSING])
        overrides = run.run_dir / ".hydra" / "overrides.yaml"
        if overrides.is_file():
            ov = [ln[2:].strip() for ln in overrides.read_text().splitlines() if ln.startswith("- ")]
            rows.append(["overrides", " ".join(f"`{o}`" for o in ov) if ov else "(none)"])
        rows += [
            ["stage", fmt(s.get("stage")) if run.summary else MISSING],
            ["env_count", fmt(s.get("env_count"))],
            ["cgroup driver", fmt(s.get("cgroup_driver"))],
            ["redis", fmt(s.get("redis"))],
            ["resumed from step", fmt(s.get("resumed_from_step"))],
        ]
        self.add(md_table(["", ""], rows, right=set()), "")
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
        self.add(
            md_table(
                ["env type", "envs", "version(s)"],
                [[t, n, ", ".join(f"`{v}`" for v in versions.get(t, [])) or "-"] for t, n in types.items()],
                right={1},
            )
        )

    def headline(self) -> None:
        if self.run.summary is None:
            self.add(f"summary.json is {self.run.summary_note}: no headline figures.")
            return
        s = self.s
        keys = [
            "sps",
            "env_steps",
            "wall_s",
            "startup_first_step_s",
            "all_envs_ready_s",
            "active_envs_end",
            "peak_rss_mb",
            "shm_bytes",
            "updates",
            "episodes",
            "loss_std",
            "loss_std_checkpoints",
        ]
        rows = [[f"`{k}`", fmt(s.get(k))] for k in keys]
        rows.append(["`board.torn_retries`", fmt((s.get("board") or {}).get("torn_retries"))])
        dist = s.get("dist") or {}
        if dist.get("world_size") not in (None, 1):
            rows.append(["`dist`", fmt(dist)])
        self.add("From summary.json:", "", md_table(["figure", "value"], rows))

    def returns(self) -> None:
        last100 = self.s.get("mean_return_last100") or {}
        counts = self.s.get("env_types") or {}
        tb = return_series(self.run.scalars)
        names = list(dict.fromkeys([*counts, *last100, *tb]))
        if not names:
            self.add("No returns: summary.json and TensorBoard both lack them.")
            return
        randoms, starts = self.randoms, self.run.starts
        learned = self.s.get("learned") or {}
        rows = []
        for name in names:
            s = tb.get(name)
            mine = [
                name,
                counts.get(name),
                last100.get(name),
                randoms.get(name),
                starts.get(name),
                learned.get(name, "unknown"),
            ]
            if s is None:
                rows.append(mine + [None, None, "-", 0])
                continue
            delta = s.last - s.first
            trend = "flat" if math.isclose(delta, 0.0, abs_tol=1e-9) else ("up" if delta > 0 else "down")
            rows.append(mine + [s.first, s.last, f"{trend} ({delta:+.3g})", len(s.steps)])
        self.add(
            "Last-100 mean, the type's random-action return and its untrained policy's "
            "(both measured beside the run) and the verdict (`learned`: above random and above "
            "the untrained policy, or the type's first 100 episodes where that was not measured, "
            "each by three standard errors and 5 %; `unknown` before 200 episodes) from "
            "summary.json; first and last value of `charts/episodic_return/<type>` from "
            "TensorBoard (`missing`: not logged, e.g. no episode finished).",
            "",
        )
        self.add(
            md_table(
                [
                    "env type",
                    "envs",
                    "last-100 mean",
                    "random",
                    "untrained",
                    "verdict",
                    "TB first",
                    "TB last",
                    "trend",
                    "TB points",
                ],
                rows,
            )
        )
        self._image(PLOT_RETURNS, "returns per env type")
        self._evaluation()

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
                rows.append(
                    [
                        f"`{tag}`",
                        len(s.steps),
                        float(s.values.min()),
                        float(np.median(s.values)),
                        float(s.values.max()),
                        s.last,
                    ]
                )
        self.add(md_table(["TensorBoard tag", "points", "min", "median", "max", "last"], rows))
        self._image(PLOT_SPS, "throughput")
        self._image(PLOT_MEMORY, "memory")

    def faults(self) -> None:
        sf = self.s.get("faults") if self.run.summary else None
        lc = self.life_counts
        rows = []
        for key, kind in FAULT_KINDS.items():
            rows.append(
                [f"`{key}`", fmt(sf.get(key)) if sf else MISSING, fmt(lc.get(kind, 0)) if lc is not None else MISSING]
            )
        self.add(f"summary.json is {self.run.summary_note}; lifecycle.sqlite is {self.run.db_note}.", "")
        self.add(md_table(["fault", "summary.json", f"lifecycle rows ({'`kind`'})"], rows))
        if sf and "lifecycle_dropped" in sf:
            self.add(
                "",
                f"Lifecycle events the workers dropped at the ZMQ high-water mark: "
                f"{fmt(sf['lifecycle_dropped'])} (summary.json `faults.lifecycle_dropped`).",
            )
        if lc:
            self.add(
                "",
                "All lifecycle events by kind:",
                "",
                md_table(["kind", "rows"], [[f"`{k}`", n] for k, n in sorted(lc.items())]),
            )
            by_type = query(
                self.run.db,
                f"SELECT env_type, kind, COUNT(*) FROM events WHERE kind IN "
                f"({', '.join('?' * len(ENV_FAULT_KINDS))}) AND env_type IS NOT NULL "
                f"GROUP BY env_type, kind",
                ENV_FAULT_KINDS,
            )
            if by_type:
                table: dict[str, dict[str, int]] = {}
                for t, kind, n in by_type:
                    table.setdefault(t, {})[kind] = n
                self.add(
                    "",
                    "Env faults by env type (lifecycle):",
                    "",
                    md_table(
                        ["env type", *ENV_FAULT_KINDS],
                        [[t, *[table[t].get(k, 0) for k in ENV_FAULT_KINDS]] for t in sorted(table)],
                    ),
                )

    def groups_section(self) -> None:
        if self.groups is None:
            self.add(f"lifecycle.sqlite is {self.run.db_note}: no worker groups.")
            self._image(PLOT_GROUPS, "returns per env type and faults per worker group")
            return
        rows = []
        for g in sorted(self.groups):
            info, f = self.groups[g], (self.group_faults or {}).get(g, {})
            rows.append(
                [
                    str(g),
                    info["envs"],
                    types_text(info["types"]) or "-",
                    info["generations"],
                    info["restarts"],
                    *[f.get(k, 0) for k in ENV_FAULT_KINDS],
                ]
            )
        self.add(
            "Groups are the env ids each worker created (lifecycle `env_create` rows). Finished-episode "
            "returns are not recorded per group, so the plot shows the per-type distribution of the "
            "TensorBoard return points next to the env faults of each group.",
            "",
        )
        self.add(
            md_table(
                ["worker", "envs", "env types", "generations", "restarts", *ENV_FAULT_KINDS],
                rows,
                right={1, 3, 4, 5, 6, 7, 8},
            )
        )
        self._image(PLOT_GROUPS, "returns per env type and faults per worker group")

    def restarts(self) -> None:
        if self.run.db is None:
            self.add(f"lifecycle.sqlite is {self.run.db_note}.")
            return
        reasons = restart_reasons(self.run.db)
        if not reasons:
            self.add("No worker restarts.")
            return
        self.add(md_table(["reason", "restarts"], [[f"`{r}`", n] for r, n in reasons.items()]))

    def chaos(self) -> None:
        if self.run.db is None:
            self.add(f"lifecycle.sqlite is {self.run.db_note}.")
            return
        rep = recovery_report(self.run.db, summary=self.run.summary)
        self.recovery = rep
        if rep["injected"] == 0:
            self.add("No faults were injected (no `chaos_inject` rows).")
            return
        lost = rep["lost_env_steps_est"]
        self.add(
            f"- injected: {rep['injected']}, recovered: {rep['recovered']}, unrecovered: {rep['unrecovered']}",
            f"- time to recover: p50 {fmt(rep['recover_s_p50'])} s, p99 {fmt(rep['recover_s_p99'])} s",
            f"- lost env-steps (estimate: down time × worker's envs × per-env step rate "
            f"{fmt(rep['per_env_sps'])}/s): " + (fmt(lost) if lost is not None else "missing (needs summary.json)"),
            "",
        )
        self.add(
            md_table(
                ["fault", "injected", "recovered", "p50 s", "p99 s"],
                [
                    [f"`{w}`", k["injected"], k["recovered"], k["p50_s"], k["p99_s"]]
                    for w, k in sorted(rep["by_kind"].items())
                ],
            )
        )
        events = rep["events"]
        shown = events[:50]
        self.add("", "Injections (t: seconds into the run):", "")
        self.add(
            md_table(
                ["t", "fault", "worker", "gen", "recovered by", "recover s"],
                [
                    [
                        e["t"],
                        f"`{e['what']}`",
                        e["worker_id"] if e["worker_id"] is not None else "-",
                        e["generation"] if e["generation"] is not None else "-",
                        e["recovered_by"] or "**not recovered**",
                        e["recover_s"],
                    ]
                    for e in shown
                ],
                right={0, 2, 3, 5},
            )
        )
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
        files = sorted((p for p in d.iterdir() if p.is_file() and not p.name.startswith(".")), key=lambda p: p.name)
        if not files:
            self.add("checkpoints/ is empty: no checkpoint was written.")
            return
        rows = []
        for p in files:
            m = _CKPT.match(p.name)
            st = p.stat()
            rows.append(
                [
                    f"`{p.name}`",
                    int(m.group(1)) if m else "-",
                    round(st.st_size / 2**20, 2),
                    time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(st.st_mtime)),
                ]
            )
        self.add(md_table(["file", "step", "MiB", "written (UTC)"], rows, right={1, 2}))

    def _image(self, name: str, alt: str) -> None:
        path = self.plots.get(name)
        if path is not None:
            self.add("", f"![{alt}]({name})")
        else:
            self.add("", f"_{name}: not drawn (its inputs are missing)._")
