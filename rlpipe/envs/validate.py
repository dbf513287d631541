"""day0: validate every env type of the mix (docs/architecture.md), no learner and no workers.

`python -m rlpipe +stage=day0 env_mix=seed12` (run.mode=validate). For each type:
1. describe it and check that its obs fit the buffer (as the driver's plan does);
2. CYCLES times: build ENVS_PER_CYCLE envs of the type side by side (types that share
   resources, like PyBullet clients, share them here too), reset each, step each
   STEPS_PER_ENV times with uniform random actions in the worker's action format (episode
   ends reset in place, as the worker's autoreset does), then close them;
3. every build, reset, step and close goes through the env harness (rlpipe/envs/harness.py):
   the contract checker (keys, shapes, dtypes, NaN/inf, float reward, bool
   terminated/truncated) and each call timed and watched (`harness.WatchedCalls`). An
   exception or a violation is a fault: it is recorded with its stage and fingerprint, the env
   is closed and rebuilt by id, and the cycle goes on, as in the worker.

A type fails when it cannot be described, does not fit the buffer, fails to build
MAX_BUILD_ATTEMPTS times in a row, hangs (one call longer than CALL_TIMEOUT_S), or faults more
than it declares: a type that declares no fault rates (EnvInterface.declared_fault_rates) may
not fault at all; one that does (faulty, web_sim with hang_raises) may fault up to its declared
rates' expectation plus 5 standard deviations plus 3.

Writes env_validation.json ({"types": {name: {"ok", "reset_ms_p50", "step_ms_p50",
"step_ms_p99", "error", ...}}}) and env_validation.md in the run dir; returns 0 when every
type passed, 1 otherwise (naming the failed types on stderr).
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rlpipe.envs import harness
from rlpipe.envs.contract import ContractViolation, EnvSpec, check_fits
from rlpipe.envs.registry import describe, make_factory
from rlpipe.shm.errorlog import stacktrace_hash
from rlpipe.spec import ObsKey

if TYPE_CHECKING:  # the day0 entry takes the app's RunSpec; nothing here imports Hydra
    from rlpipe.config import RunSpec

CYCLES = 3  # build -> reset -> step -> close cycles per type
ENVS_PER_CYCLE = 2  # envs of one type alive together in a cycle
STEPS_PER_ENV = 150  # random-action steps per env per cycle
MAX_BUILD_ATTEMPTS = 10  # consecutive failed build+reset of one env that fail the type
CALL_TIMEOUT_S = 30.0  # one build/reset/step/close call longer than this: the type hangs
TYPE_BUDGET_S = 60.0  # a slower type stops stepping early (reported, not failed)
FAULT_SIGMAS = 5.0  # tolerance above a declared fault rate's expectation ...
FAULT_SLACK = 3  # ... plus this many faults


class _TypeFailed(Exception):
    pass


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


class _TypeRun:
    """Validates one env type; run() executes in a thread so a hung call can be abandoned."""

    def __init__(self, name: str, node: dict, board_keys: tuple[ObsKey, ...], seed: int):
        self.name, self.node, self.board_keys, self.seed = name, node, board_keys, seed
        self.calls = harness.WatchedCalls(("build", "reset", "step", "close"))  # timed, watched
        self.faults: list[dict] = []
        self.steps = self.resets = self.episodes = 0
        self.rebuilds = 0
        self.error: str | None = None
        self.note: str | None = None
        self.spec: EnvSpec | None = None
        self.allowed = 0
        self.expected = 0.0
        self.rates = (0.0, 0.0)
        self.done = threading.Event()

    # -- faults and env calls -----------------------------------------------------------------
    def _fault(self, stage: str, env_id: int, exc: BaseException) -> None:
        self.faults.append(
            {
                "stage": stage,
                "env_id": env_id,
                "kind": "env_quarantine" if isinstance(exc, ContractViolation) else "env_crash",
                "error": f"{type(exc).__name__}: {exc}"[:300],
                "fingerprint": stacktrace_hash(exc),
            }
        )

    def _close(self, env, env_id: int) -> None:
        harness.close(env, env_id, self.calls, on_error=lambda exc: self._fault("close", env_id, exc))

    def _start(self, env_id: int, attempt_seed: int):
        """Build and reset one env; a broken build is recorded, closed and retried."""
        last = None
        for attempt in range(MAX_BUILD_ATTEMPTS):
            env = None
            stage = "build"
            try:
                seed = attempt_seed + 1_000_003 * (self.rebuilds + attempt)
                env = harness.build(self.factory, env_id, seed, self.calls)
                stage = "reset"
                self.resets += 1
                harness.reset(self.spec, env, env_id, self.calls)
                return env
            except Exception as exc:
                self._fault(stage, env_id, exc)
                self._close(env, env_id)
                last = self.faults[-1]["error"]
        raise _TypeFailed(f"failed to build and reset {MAX_BUILD_ATTEMPTS} times in a row: {last}")

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._run()
        except _TypeFailed as exc:
            self.error = str(exc)
        except Exception as exc:  # describe/fit/factory errors and anything unforeseen
            self.error = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            self.done.set()

    def _run(self) -> None:
        self.spec = describe(self.node)
        check_fits(self.name, self.spec, self.board_keys)
        self.factory = make_factory(self.node)
        cls = self.factory.func
        self.rates = tuple(float(r) for r in cls.declared_fault_rates(**self.factory.keywords))
        rng = np.random.default_rng(self.seed)
        deadline = time.perf_counter() + TYPE_BUDGET_S
        for cycle in range(CYCLES):
            ids = [cycle * ENVS_PER_CYCLE + k for k in range(ENVS_PER_CYCLE)]
            envs: list = [None] * ENVS_PER_CYCLE
            try:
                for k, env_id in enumerate(ids):
                    envs[k] = self._start(env_id, self.seed + env_id)
                for _ in range(STEPS_PER_ENV):
                    if time.perf_counter() > deadline:
                        self.note = f"stopped early after {self.steps} steps ({TYPE_BUDGET_S:.0f} s budget)"
                        break
                    for k, env_id in enumerate(ids):
                        self._step(envs, k, env_id, rng)
            finally:
                for k, env_id in enumerate(ids):
                    self._close(envs[k], env_id)
                    envs[k] = None
            if self.note:
                break

    def _step(self, envs: list, k: int, env_id: int, rng: np.random.Generator) -> None:
        env = envs[k]
        stage = "step"
        try:
            self.steps += 1
            _obs, _r, terminated, truncated = harness.step(
                self.spec, env, env_id, harness.random_action(self.spec, rng), self.calls
            )
            if terminated or truncated:
                self.episodes += 1
                stage = "reset"
                self.resets += 1
                harness.reset(self.spec, env, env_id, self.calls)
        except Exception as exc:
            self._fault(stage, env_id, exc)
            self._close(env, env_id)
            envs[k] = None
            self.rebuilds += 1
            envs[k] = self._start(env_id, self.seed + env_id)

    # -- verdict ------------------------------------------------------------------------------
    def result(self) -> dict:
        r_reset, r_step = self.rates
        timings = self.calls.timings
        self.expected = r_reset * self.resets + r_step * self.steps
        declared = r_reset > 0 or r_step > 0
        self.allowed = (
            math.ceil(self.expected + FAULT_SIGMAS * math.sqrt(self.expected)) + FAULT_SLACK if declared else 0
        )
        error = self.error
        if error is None and len(self.faults) > self.allowed:
            first = self.faults[0]
            how = f"{self.allowed} allowed by its declared rates" if declared else "it declares no fault rates"
            error = (
                f"{len(self.faults)} faults in {self.steps} steps and {self.resets} resets, "
                f"{how}; first: {first['stage']}: {first['error']}"
            )
        if error is None and self.steps == 0:
            error = "no step completed"
        by_fp = Counter(f["fingerprint"] for f in self.faults)
        examples = {f["fingerprint"]: f for f in reversed(self.faults)}
        spec = self.spec
        return {
            "ok": error is None,
            "reset_ms_p50": _pct(timings["reset"], 50),
            "step_ms_p50": _pct(timings["step"], 50),
            "step_ms_p99": _pct(timings["step"], 99),
            "error": error,
            "build_ms_p50": _pct(timings["build"], 50),
            "close_ms_p50": _pct(timings["close"], 50),
            "step_ms_max": round(max(timings["step"]), 3) if timings["step"] else None,
            "steps": self.steps,
            "resets": self.resets,
            "episodes": self.episodes,
            "faults": len(self.faults),
            "faults_allowed": self.allowed,
            "declared_fault_rates": {"reset": r_reset, "step": r_step},
            "fault_fingerprints": [
                {
                    "fingerprint": fp,
                    "count": n,
                    "stage": examples[fp]["stage"],
                    "kind": examples[fp]["kind"],
                    "error": examples[fp]["error"],
                }
                for fp, n in by_fp.most_common(10)
            ],
            "obs": {k: [list(s), d] for k, (s, d) in spec.obs.items()} if spec else None,
            "action": f"{spec.action_kind}({spec.action_n})" if spec else None,
            "note": self.note,
        }


def _run_type(name: str, node: dict, board_keys, seed: int) -> dict:
    tr = _TypeRun(name, node, board_keys, seed)
    thread = threading.Thread(target=tr.run, name=f"day0-{name}", daemon=True)
    thread.start()
    while not tr.done.wait(0.2):
        stage = tr.calls.overdue(CALL_TIMEOUT_S)
        if stage is not None:
            tr.error = f"hung: a {stage} call did not return within {CALL_TIMEOUT_S:.0f} s (abandoned)"
            return tr.result()
    return tr.result()


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if v < 10 else f"{v:.1f}"
    return str(v)


def render_markdown(report: dict) -> str:
    lines = [
        f"# Env validation ({report['stage'] or 'validate'})",
        "",
        "Buffer: " + ", ".join(f"{k} {v['shape']} {v['dtype']}" for k, v in report["buffer"].items()),
        f"Per type: {CYCLES} cycles x {ENVS_PER_CYCLE} envs x {STEPS_PER_ENV} random-action "
        "steps, every reset and step through the contract checker.",
        "",
        "| type | ok | obs | action | build ms p50 | reset ms p50 | step ms p50 | step ms p99 "
        "| steps | faults (allowed) | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in report["types"].items():
        obs = " ".join(f"{k}{'x'.join(map(str, s))}" for k, (s, _d) in (r["obs"] or {}).items())
        err = (r["error"] or r.get("note") or "").replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {name} | {'yes' if r['ok'] else '**NO**'} | {obs or '-'} | {r['action'] or '-'} "
            f"| {_fmt(r['build_ms_p50'])} | {_fmt(r['reset_ms_p50'])} | {_fmt(r['step_ms_p50'])} "
            f"| {_fmt(r['step_ms_p99'])} | {r['steps']} | {r['faults']} ({r['faults_allowed']}) "
            f"| {err} |"
        )
    faulted = {n: r for n, r in report["types"].items() if r["fault_fingerprints"]}
    if faulted:
        lines += ["", "## Faults by fingerprint", ""]
        for name, r in faulted.items():
            for f in r["fault_fingerprints"]:
                lines.append(
                    f"- {name}: {f['count']} x `{f['fingerprint'][:12]}` {f['kind']} at {f['stage']}: {f['error']}"
                )
    failed = [n for n, r in report["types"].items() if not r["ok"]]
    lines += ["", f"**{'FAILED: ' + ', '.join(failed) if failed else 'All types passed.'}**", ""]
    return "\n".join(lines)


def validate_types(spec: RunSpec, run_dir: Path) -> int:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    types = {}
    for i, t in enumerate(spec.env_types):
        print(f"rlpipe day0: validating {t.name} ...", flush=True)
        types[t.name] = _run_type(t.name, t.node, spec.obs_keys, spec.run.seed + 7919 * i)
    try:
        from rlpipe.envs.bullet import ClientPool

        ClientPool.shutdown()
    except Exception:
        pass
    failed = [n for n, r in types.items() if not r["ok"]]
    report = {
        "stage": spec.stage,
        "ok": not failed,
        "failed": failed,
        "wall_s": round(time.perf_counter() - t0, 1),
        "buffer": {k.name: {"shape": list(k.shape), "dtype": k.dtype} for k in spec.obs_keys},
        "constants": {
            "cycles": CYCLES,
            "envs_per_cycle": ENVS_PER_CYCLE,
            "steps_per_env": STEPS_PER_ENV,
            "call_timeout_s": CALL_TIMEOUT_S,
        },
        "types": types,
    }
    (run_dir / "env_validation.json").write_text(json.dumps(report, indent=2) + "\n")
    md = render_markdown(report)
    (run_dir / "env_validation.md").write_text(md)
    print(md)
    if failed:
        print("rlpipe day0: FAILED types: " + "; ".join(f"{n} ({types[n]['error']})" for n in failed), file=sys.stderr)
        print(f"rlpipe day0: report in {run_dir / 'env_validation.md'}", file=sys.stderr)
        return 1
    print(
        f"rlpipe day0: all {len(types)} types passed ({report['wall_s']} s); report in {run_dir / 'env_validation.md'}"
    )
    return 0
