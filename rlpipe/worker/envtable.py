"""A worker's envs: the env_id -> env table, stepping with autoreset, quarantine and rebuild.

Envs are built, reset and closed through the env harness (rlpipe/envs/harness.py); a step runs
in the C StepLoop or `step_one`, the hot-path forms of `harness.step` (the same contract, its
checks split between each step and once per slice).

Autoreset mode is "same step": when an episode ends, the worker resets the env at once and
publishes the reset obs for that step; reward, terminated and truncated belong to the step
that ended the episode, and the episode's return and length are reported with it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from rlpipe.envs import harness
from rlpipe.envs.contract import DISCRETE, ContractViolation, EnvSpec, check_obs
from rlpipe.envs.harness import StepTimeout
from rlpipe.native.steploop import ObsWrite, StepLoop
from rlpipe.shm.errorlog import error_record
from rlpipe.spec import ObsKey
from rlpipe.worker.backoff import PARKED, BackingOff, FaultBackoff

MAX_BUILD_ATTEMPTS = 10
# A crashed, quarantined or hung step: the episode is cut (truncated, no finished stats, no
# end obs), so the learner never joins transitions across the rebuild.
CUT = (0.0, False, True, 0.0, 0, False)


@dataclass
class EnvFault:
    env_id: int
    kind: str  # "env_crash" (exception) | "env_quarantine" (contract violation) | "env_hang"
    record: dict  # the error-log record: ts, env_id, env_type, error_type, stacktrace_hash, ...
    backoff_s: float = 0.0  # how long the env waits before its rebuild (rlpipe.worker.backoff)


class EnvTable:
    """Envs [id_lo, id_lo + n) of one worker, writing into staging rows for the board. `id_lo`
    is the global id of its first env (with a rank's offset under torchrun): the id every env,
    fault and lifecycle event is named by; the rows are local (0..n)."""

    def __init__(
        self,
        id_lo: int,
        type_index: np.ndarray,
        names: tuple[str, ...],
        specs: tuple[EnvSpec, ...],
        factories: list,
        board_keys: tuple[ObsKey, ...],
        staging: list[np.ndarray],
        seed: int,
        final_staging: list[np.ndarray] | None = None,
        final_all: bool = False,
        crash_backoff: bool = True,
    ):
        self.id_lo = id_lo
        self.n = len(type_index)
        self.type_index = type_index
        self.names = names
        self.specs = specs
        self.factories = factories
        self.staging = staging
        self.seed = seed
        self.rebuilds = np.zeros(self.n, dtype=np.int64)
        # per type: (board key index, flat length) for every key the type produces
        key_pos = {k.name: i for i, k in enumerate(board_keys)}
        self._writes = [[(key_pos[key], key, int(np.prod(shape))) for key, (shape, _) in s.obs.items()] for s in specs]
        self._expected = [
            [(key, tuple(shape), np.dtype(dtype)) for key, (shape, dtype) in s.obs.items()] for s in specs
        ]
        # Per env, the staging views its obs are copied into (built once: no per-step slicing).
        self._rows = [
            [(staging[k][i].reshape(-1)[:length], key) for k, key, length in self._writes[type_index[i]]]
            for i in range(self.n)
        ]
        # ... and the rows a time-limit truncation's end obs goes to (the worker's shared
        # final-obs area), when the table has one.
        self.final_all = final_all  # every end obs to the final rows, not only truncations'
        self._final_rows = (
            None
            if final_staging is None
            else [
                [(final_staging[k][i].reshape(-1)[:length], key) for k, key, length in self._writes[type_index[i]]]
                for i in range(self.n)
            ]
        )
        self._float_staging = [block for block in staging if block.dtype.kind == "f"]
        self._discrete = [s.action_kind == DISCRETE for s in specs]
        self._cont_n = [s.action_n for s in specs]
        self._all_discrete = all(self._discrete[t] for t in set(type_index.tolist()))
        self.envs: list = [None] * self.n
        # Running episode return and length per env (written by step_one and the C StepLoop).
        self.ep_return = np.zeros(self.n, dtype=np.float64)
        self.ep_len = np.zeros(self.n, dtype=np.int64)
        self.step_ms = np.zeros(self.n, dtype=np.float32)  # step_one's latest env step() time
        self.faults: list[EnvFault] = []
        # envs whose step stalled and goes on off the slice's path (rlpipe.worker.relief): the
        # C loop cuts their rows instead of stepping them
        self.detached = np.zeros(self.n, dtype=np.uint8)
        self.hangs = 0  # steps cut at the deadline, over this table's life
        self.backoff = FaultBackoff(self.n) if crash_backoff else None  # rlpipe.worker.backoff

    def _build(self, i: int):
        t = self.type_index[i]
        env_id = self.id_lo + i
        # A rebuilt env gets a fresh seed so it does not replay the episode that broke it.
        seed = self.seed + env_id + 1_000_003 * int(self.rebuilds[i])
        return harness.build(self.factories[t], env_id, seed)

    def _write(self, i: int, obs: dict) -> None:
        for view, key in self._rows[i]:
            view[:] = obs[key].reshape(-1)

    def _fault(self, i: int, exc: BaseException) -> None:
        kind = "env_quarantine" if isinstance(exc, ContractViolation) else "env_crash"
        env_id = self.id_lo + i
        self.faults.append(EnvFault(env_id, kind, error_record(env_id, self.names[self.type_index[i]], exc)))

    def start(self, i: int) -> None:
        """Build and reset env i; a broken build is recorded and retried a few times."""
        for _attempt in range(MAX_BUILD_ATTEMPTS):
            try:
                self.envs[i] = self._build(i)
                self._write(i, harness.reset(self.specs[self.type_index[i]], self.envs[i], self.id_lo + i))
                break
            except Exception as exc:  # the env is broken, not the worker: record and rebuild
                self._fault(i, exc)
                self._discard(i)
                self.rebuilds[i] += 1
        else:
            raise RuntimeError(
                f"env {self.id_lo + i} ({self.names[self.type_index[i]]}) failed to "
                f"build {MAX_BUILD_ATTEMPTS} times in a row: {self.faults[-1].record['message']}"
            )
        self.ep_return[i] = 0.0
        self.ep_len[i] = 0

    def _discard(self, i: int) -> None:
        env, self.envs[i] = self.envs[i], None
        harness.close(env, self.id_lo + i)

    def close_all(self) -> None:
        for i in range(self.n):
            self._discard(i)

    def leaked_bytes(self) -> int:
        """What the live envs say they leak on purpose (an emulator's `leaked_bytes`: the
        unity_sim type emulates a leaky simulator); a rebuild frees its env's part."""
        return sum(getattr(env, "leaked_bytes", 0) for env in self.envs if env is not None)

    def _check_fast(self, t: int, obs: object) -> None:
        """Keys, shapes and dtypes of one obs: the hot-path form of contract.check_obs
        (finiteness is checked once per slice on the staged block, in step_range)."""
        expected = self._expected[t]
        if type(obs) is not dict or len(obs) != len(expected):
            check_obs(self.specs[t], obs)  # raises with the full explanation
        for key, shape, dtype in expected:
            value = obs.get(key)
            if type(value) is not np.ndarray or value.shape != shape or value.dtype != dtype:
                check_obs(self.specs[t], obs)

    def step_one(self, i: int, action) -> tuple:
        """Step env i; returns (reward, terminated, truncated, finished return, finished length,
        final) with length 0 when no episode finished at this step; `final`: the end obs of a
        time-limit truncation was written to the env's final-obs rows."""
        t = self.type_index[i]
        env_id = self.id_lo + i
        try:
            t0 = time.perf_counter()
            obs, reward, terminated, truncated, _info = self.envs[i].step(env_id, action)
            self.step_ms[i] = (time.perf_counter() - t0) * 1e3
            self._check_fast(t, obs)
            if type(reward) is not float:
                if not isinstance(reward, (float, np.floating)):
                    raise ContractViolation(f"reward {reward!r} is not a float")
                reward = float(reward)
            if not math.isfinite(reward):
                raise ContractViolation(f"reward {reward!r} is not finite")
            if type(terminated) is not bool or type(truncated) is not bool:
                if not isinstance(terminated, (bool, np.bool_)) or not isinstance(truncated, (bool, np.bool_)):
                    raise ContractViolation("terminated and truncated must be bools")
                terminated, truncated = bool(terminated), bool(truncated)
            final = False
            if terminated or truncated:
                check_obs(self.specs[t], obs)  # the end obs in full (finite too), as StepLoop does
                if self._final_rows is not None and (self.final_all or (truncated and not terminated)):
                    for view, key in self._final_rows[i]:
                        view[:] = obs[key].reshape(-1)
                    final = True
                finished = (self.ep_return[i] + reward, self.ep_len[i] + 1)
                self.ep_return[i] = 0.0
                self.ep_len[i] = 0
                obs = self.envs[i].reset(env_id)
                self._check_fast(t, obs)
            else:
                finished = (0.0, 0)
                self.ep_return[i] += reward
                self.ep_len[i] += 1
            for view, key in self._rows[i]:
                value = obs[key]
                view[:] = value if value.ndim == 1 else value.reshape(-1)
        except Exception as exc:
            # Crash or contract violation: the episode is cut here (reported as truncated, with
            # no finished-episode stats, so the learner never joins transitions across the
            # rebuild) and the env is rebuilt by id; its neighbours go on.
            self.recover(i, exc)
            return CUT
        return reward, terminated, truncated, finished[0], finished[1], final

    def step_loop(self, results: dict, armed: np.ndarray):
        """The C loop that steps slices of this table straight into `results` (the worker's
        shared result arrays), with the step serial in armed[0] for the inline deadline."""
        writes = [
            tuple(
                ObsWrite(key, shape, dtype, view)
                for (view, key), (_, shape, dtype) in zip(self._rows[i], self._expected[self.type_index[i]])
            )
            for i in range(self.n)
        ]
        final_writes = (
            None
            if self._final_rows is None
            else [
                tuple(
                    ObsWrite(key, shape, dtype, view)
                    for (view, key), (_, shape, dtype) in zip(self._final_rows[i], self._expected[self.type_index[i]])
                )
                for i in range(self.n)
            ]
        )
        specs = [self.specs[t] for t in self.type_index]
        return StepLoop(
            self, writes, specs, results, armed, check_obs, ContractViolation, StepTimeout, final_writes, self.final_all
        )

    def recover(self, i: int, exc: BaseException) -> None:
        """Env i raised or broke the contract: record it and rebuild the env by id, or park
        it first when it is in a crash loop (rlpipe.worker.backoff). A parked env's step
        lands here too: rebuilt once its time is up, nothing recorded before."""
        if isinstance(exc, BackingOff):
            if self.backoff.due(i):
                self.envs[i] = None
                self.start(i)
            return
        self._fault(i, exc)
        self._discard(i)
        self.rebuilds[i] += 1
        self._rebuild_or_park(i)

    def _rebuild_or_park(self, i: int) -> None:
        delay = self.backoff.fault(i) if self.backoff is not None else 0.0
        if delay:
            self.faults[-1].backoff_s = delay
            self.envs[i] = PARKED
            self.neutral(i)
        else:
            self.start(i)

    def neutral(self, i: int) -> None:
        """Env i out of play (parked, or its step detached): a neutral obs in its rows, never the
        one that broke it (NaN), and its episode cut, as `start` would begin a new one."""
        for view, _key in self._rows[i]:
            view[:] = 0
        self.ep_return[i] = 0.0
        self.ep_len[i] = 0

    def rejoin(self, i: int) -> None:
        """Env i's detached step came back before its deadline: its episode was cut for the
        learner, so it starts a new one (a reset; a failing one is a fault like any other)."""
        try:
            self._write(i, harness.reset(self.specs[self.type_index[i]], self.envs[i], self.id_lo + i))
            self.ep_return[i] = 0.0
            self.ep_len[i] = 0
        except Exception as exc:
            self.recover(i, exc)

    def actions(self, lo: int, hi: int, disc: np.ndarray, cont: np.ndarray) -> list:
        """The actions of envs [lo, hi) as each env's head expects them."""
        if self._all_discrete:
            return disc[lo:hi].tolist()
        discrete, cont_n, types = self._discrete, self._cont_n, self.type_index
        return [int(disc[i]) if discrete[types[i]] else cont[i, : cont_n[types[i]]] for i in range(lo, hi)]

    def abandon(self, i: int, exc: StepTimeout, interrupted: bool) -> None:
        """Env i's step ran past the deadline; a new env takes the id. An interrupted step
        (the inline deadline raised inside it) left its env idle, so it is closed; an abandoned
        one's thread keeps the old env object (never closed here, it may still be inside step)."""
        env_id = self.id_lo + i
        self.hangs += 1
        self.faults.append(EnvFault(env_id, "env_hang", error_record(env_id, self.names[self.type_index[i]], exc)))
        if interrupted:
            self._discard(i)
        self.envs[i] = None
        self.rebuilds[i] += 1
        self._rebuild_or_park(i)

    def finish(self, lo: int, hi: int, results: list, out: dict) -> None:
        """Write the slice's step_one results with one bulk write per field (the pool path and
        step_range; the inline path's C StepLoop writes them itself). Hung steps (stepper.HUNG
        after abandon) and NaN/inf obs are cut episodes, like crashes."""
        results = [r if type(r) is tuple else CUT for r in results]
        reward, terminated, truncated, ep_return, ep_len, final = zip(*results)
        out["reward"][lo:hi] = reward
        out["terminated"][lo:hi] = terminated
        out["truncated"][lo:hi] = truncated
        out["ep_return"][lo:hi] = ep_return
        out["ep_len"][lo:hi] = ep_len
        if self._final_rows is not None:
            out["final"][lo:hi] = final
        if "step_ms" in out:
            out["step_ms"][lo:hi] = self.step_ms[lo:hi]
        # NaN/inf check over the whole staged block at once; offenders are quarantined.
        for block in self._float_staging:
            rows = block[lo:hi].reshape(hi - lo, -1)
            if not np.isfinite(rows).all():
                for j in np.nonzero(~np.isfinite(rows).all(axis=1))[0]:
                    self.recover(lo + int(j), ContractViolation("obs holds NaN or inf"))
                    out["reward"][lo + j] = 0.0
                    out["terminated"][lo + j] = 0
                    out["truncated"][lo + j] = 1
                    out["ep_return"][lo + j] = 0.0
                    out["ep_len"][lo + j] = 0
                    if self._final_rows is not None:
                        out["final"][lo + j] = 0

    def step_range(self, lo: int, hi: int, disc: np.ndarray, cont: np.ndarray, out: dict) -> None:
        """Step envs [lo, hi) through step_one and finish: the Python reference of the C
        StepLoop (tests hold the two equal) for tests and tools; the worker uses Stepper."""
        actions = self.actions(lo, hi, disc, cont)
        self.finish(lo, hi, [self.step_one(i, a) for i, a in zip(range(lo, hi), actions)], out)
