"""Faulty: a random walk that raises and breaks the contract at configured rates.

One of the four emulators described in rlpipe/envs/emulators/__init__.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlpipe.envs.contract import CONTINUOUS, DISCRETE, EnvSpec
from rlpipe.envs.emulators.base import Emulator, check_posint, check_rate
from rlpipe.envs.image import as_rgb_shape

VIOLATIONS = ("shape", "dtype", "nan", "key", "reward")


class InjectedFault(RuntimeError):
    """An exception the faulty emulator raises on purpose."""


@dataclass(frozen=True)
class FaultyParams:
    """The parameters of conf/env/faulty.yaml, checked. No defaults: the YAML node is their one
    home (what each means is said there)."""

    state_dim: int  # 0: no state key
    vector_dim: int  # 0: no vector key
    rgb_shape: tuple | list | None  # null: no rgb key (no render)
    action_kind: str  # discrete | continuous
    action_n: int
    max_steps: int
    reset_error_rate: float
    step_error_rate: float
    render_error_rate: float  # reset and step both render
    violation_rate: float
    violations: tuple | list  # kinds drawn from, uniformly

    def __post_init__(self):
        if self.state_dim < 0 or self.vector_dim < 0:
            raise ValueError("state_dim and vector_dim must be >= 0")
        object.__setattr__(self, "rgb_shape", as_rgb_shape(self.rgb_shape))
        if not self.state_dim and not self.vector_dim and self.rgb_shape is None:
            raise ValueError("faulty needs at least one obs key (state_dim, vector_dim, rgb_shape)")
        if self.action_kind not in (DISCRETE, CONTINUOUS):
            raise ValueError(f"action_kind={self.action_kind!r}: allowed are discrete, continuous")
        check_posint("action_n", self.action_n)
        check_posint("max_steps", self.max_steps)
        for name in ("reset_error_rate", "step_error_rate", "render_error_rate", "violation_rate"):
            check_rate(name, getattr(self, name))
        object.__setattr__(self, "violations", tuple(self.violations))
        bad = [v for v in self.violations if v not in VIOLATIONS]
        if bad or not self.violations:
            raise ValueError(
                f"violations={list(self.violations)}: allowed kinds are {', '.join(VIOLATIONS)} (at least one)"
            )


class Faulty(Emulator):
    """A random walk that breaks on purpose. The state decays towards the action's direction;
    reward = -mean |state| (in [-1, 0]); truncated after max_steps; rgb (if any) draws the
    state as bars."""

    Params = FaultyParams

    @classmethod
    def _spec(cls, p: FaultyParams) -> EnvSpec:
        obs = {}
        if p.rgb_shape is not None:
            obs["rgb"] = (p.rgb_shape, "uint8")
        if p.state_dim:
            obs["state"] = ((p.state_dim,), "float32")
        if p.vector_dim:
            obs["vector"] = ((p.vector_dim,), "float32")
        return EnvSpec(obs, p.action_kind, p.action_n)

    @classmethod
    def declared_fault_rates(cls, **params) -> tuple[float, float]:
        p = FaultyParams(**params)
        render = p.render_error_rate if p.rgb_shape is not None else 0.0
        return p.reset_error_rate + render, p.step_error_rate + p.violation_rate + render

    def __init__(self, env_id: int, seed: int, **params):
        super().__init__(env_id, seed, **params)
        self.fault_rng = np.random.default_rng([seed, 13])
        self.dim = max(self.p.state_dim, self.p.vector_dim, 1)
        self.x = np.zeros(self.dim)
        self.t = 0
        self.frame = np.zeros(self.p.rgb_shape, dtype=np.uint8) if self.p.rgb_shape else None

    def _roll(self, rate: float) -> bool:
        return rate > 0 and self.fault_rng.random() < rate

    def _render(self) -> np.ndarray:
        if self._roll(self.p.render_error_rate):
            raise InjectedFault("faulty: injected render crash")
        f = self.frame
        f.fill(16)
        h, w = f.shape[:2]
        bar_w = max(1, w // self.dim)
        for i, v in enumerate(self.x[: w // bar_w]):
            top = int((1 - (np.tanh(v) + 1) / 2) * (h - 1))
            f[top:, i * bar_w : (i + 1) * bar_w] = (200, 180, 40, 255)[: f.shape[2]]
        return f.copy()

    def _obs(self) -> dict[str, np.ndarray]:
        obs = {}
        if self.frame is not None:
            obs["rgb"] = self._render()
        if self.p.state_dim:
            obs["state"] = np.resize(self.x, self.p.state_dim).astype(np.float32)
        if self.p.vector_dim:
            obs["vector"] = np.resize(np.tanh(self.x), self.p.vector_dim).astype(np.float32)
        return obs

    def reset(self, env_id: int) -> dict[str, np.ndarray]:
        if self._roll(self.p.reset_error_rate):
            raise InjectedFault("faulty: injected reset crash")
        self.x = self.rng.normal(0, 1, self.dim)
        self.t = 0
        return self._obs()

    def _violate(self, obs: dict, reward: float):
        kind = self.p.violations[int(self.fault_rng.integers(len(self.p.violations)))]
        key = next(iter(obs))
        if kind == "shape":
            obs[key] = obs[key].reshape(-1)[:-1]
        elif kind == "dtype":
            obs[key] = obs[key].astype(np.float64)
        elif kind == "nan":
            obs[key] = obs[key].astype(np.float32)
            obs[key].reshape(-1)[0] = np.nan
        elif kind == "key":
            obs["bogus"] = obs.pop(key)
        elif kind == "reward":
            reward = float("nan")
        return obs, reward

    def step(self, env_id: int, action: np.ndarray):
        if self._roll(self.p.step_error_rate):
            raise InjectedFault("faulty: injected step crash")
        if self.p.action_kind == DISCRETE:
            push = np.zeros(self.dim)
            push[int(action) % self.dim] = 1.0
        else:
            push = np.resize(np.clip(np.asarray(action, dtype=np.float64).reshape(-1), -1, 1), self.dim)
        self.x = 0.9 * self.x + 0.1 * push + self.rng.normal(0, 0.05, self.dim)
        self.t += 1
        reward = -float(np.mean(np.abs(np.tanh(self.x))))
        obs = self._obs()
        if self._roll(self.p.violation_rate):
            obs, reward = self._violate(obs, reward)
        return obs, reward, False, self.t >= self.p.max_steps, {}

    def close(self, env_id: int) -> None:
        pass
