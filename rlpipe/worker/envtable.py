"""A worker's envs: the env_id -> env table, stepping with autoreset, quarantine and rebuild.

Autoreset mode is "same step": when an episode ends, the worker resets the env at once and
publishes the reset obs for that step; reward, terminated and truncated belong to the step
that ended the episode, and the episode's return and length are reported with it.
"""
from __future__ import annotations

import hashlib
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from rlpipe.config import ObsKey
from rlpipe.envs.contract import DISCRETE, ContractViolation, EnvSpec, check_obs, check_step


MAX_BUILD_ATTEMPTS = 10


def fingerprint(exc: BaseException) -> str:
    """md5 of the traceback's frames (file, function, source line) and exception type:
    stable across runs, addresses and line-number drift excluded."""
    frames = traceback.extract_tb(exc.__traceback__)
    text = "|".join(f"{f.filename}:{f.name}:{f.line}" for f in frames) + type(exc).__name__
    return hashlib.md5(text.encode()).hexdigest()


@dataclass
class EnvFault:
    env_id: int
    kind: str            # "env_crash" (exception) | "env_quarantine" (contract violation)
    error: str
    fingerprint: str


class EnvTable:
    """Envs [env_lo, env_lo + n) of one worker, writing into staging rows for the board."""

    def __init__(self, env_lo: int, type_index: np.ndarray, names: tuple[str, ...],
                 specs: tuple[EnvSpec, ...], factories: list, board_keys: tuple[ObsKey, ...],
                 staging: list[np.ndarray], seed: int, threads: int):
        self.env_lo = env_lo
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
        self._writes = [[(key_pos[key], key, int(np.prod(shape))) for key, (shape, _) in s.obs.items()]
                        for s in specs]
        self._discrete = [s.action_kind == DISCRETE for s in specs]
        self._cont_n = [s.action_n for s in specs]
        self.envs: list = [None] * self.n
        self.ep_return = np.zeros(self.n, dtype=np.float64)
        self.ep_len = np.zeros(self.n, dtype=np.int64)
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="step") if threads > 1 else None
        self.faults: list[EnvFault] = []

    def _build(self, i: int):
        t = self.type_index[i]
        env_id = self.env_lo + i
        # A rebuilt env gets a fresh seed so it does not replay the episode that broke it.
        return self.factories[t](env_id=env_id, seed=self.seed + env_id + 1_000_003 * int(self.rebuilds[i]))

    def _write(self, i: int, obs: dict) -> None:
        for k, key, length in self._writes[self.type_index[i]]:
            self.staging[k][i].reshape(-1)[:length] = obs[key].reshape(-1)

    def _fault(self, i: int, exc: BaseException) -> None:
        kind = "env_quarantine" if isinstance(exc, ContractViolation) else "env_crash"
        self.faults.append(EnvFault(self.env_lo + i, kind, f"{type(exc).__name__}: {exc}"[:300],
                                    fingerprint(exc)))

    def start(self, i: int) -> None:
        """Build and reset env i; a broken build is recorded and retried a few times."""
        for _attempt in range(MAX_BUILD_ATTEMPTS):
            try:
                self.envs[i] = self._build(i)
                obs = self.envs[i].reset(self.env_lo + i)
                check_obs(self.specs[self.type_index[i]], obs)
                self._write(i, obs)
                break
            except Exception as exc:  # the env is broken, not the worker: record and rebuild
                self._fault(i, exc)
                self._discard(i)
                self.rebuilds[i] += 1
        else:
            raise RuntimeError(f"env {self.env_lo + i} ({self.names[self.type_index[i]]}) failed to "
                               f"build {MAX_BUILD_ATTEMPTS} times in a row: {self.faults[-1].error}")
        self.ep_return[i] = 0.0
        self.ep_len[i] = 0

    def _discard(self, i: int) -> None:
        env, self.envs[i] = self.envs[i], None
        if env is not None:
            try:
                env.close(self.env_lo + i)
            except Exception:
                pass

    def close_all(self) -> None:
        for i in range(self.n):
            self._discard(i)
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)

    def step_one(self, i: int, disc: np.ndarray, cont: np.ndarray, out: dict) -> None:
        t = self.type_index[i]
        env_id = self.env_lo + i
        action = np.int64(disc[i]) if self._discrete[t] else cont[i, :self._cont_n[t]]
        try:
            obs, reward, terminated, truncated = check_step(
                self.specs[t], self.envs[i].step(env_id, np.asarray(action)))
            done = terminated or truncated
            if done:
                finished = (self.ep_return[i] + reward, self.ep_len[i] + 1)
                obs = self.envs[i].reset(env_id)
                check_obs(self.specs[t], obs)
        except Exception as exc:
            # Crash or contract violation: the episode is cut here (reported as truncated, with
            # no finished-episode stats, so the learner never joins transitions across the
            # rebuild) and the env is rebuilt by id; its neighbours go on.
            self._fault(i, exc)
            self._discard(i)
            self.rebuilds[i] += 1
            out["reward"][i] = 0.0
            out["terminated"][i] = 0
            out["truncated"][i] = 1
            out["ep_len"][i] = 0
            self.start(i)
            return
        out["reward"][i] = reward
        out["terminated"][i] = terminated
        out["truncated"][i] = truncated
        if done:
            out["ep_return"][i], out["ep_len"][i] = finished
            self.ep_return[i] = 0.0
            self.ep_len[i] = 0
        else:
            out["ep_len"][i] = 0          # 0 = no episode finished at this step
            self.ep_return[i] += reward
            self.ep_len[i] += 1
        self._write(i, obs)

    def step_range(self, lo: int, hi: int, disc: np.ndarray, cont: np.ndarray, out: dict) -> None:
        if self.pool is None:
            for i in range(lo, hi):
                self.step_one(i, disc, cont, out)
        else:
            list(self.pool.map(lambda i: self.step_one(i, disc, cont, out), range(lo, hi)))
