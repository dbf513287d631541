"""PhysicsSim: a spring-mass chain with heavy-tailed step latency and rewards up to +-100.

One of the four emulators described in rlpipe/envs/emulators/__init__.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from rlpipe.envs.contract import CONTINUOUS, EnvSpec
from rlpipe.envs.emulators.base import Emulator, check_nonneg, check_posint


@dataclass(frozen=True)
class PhysicsParams:
    """The parameters of conf/env/physics_sim.yaml, checked. No defaults: the YAML node is their
    one home (what each means is said there)."""

    n_masses: int  # chain length; state is 2 * n_masses, vector n_masses + 2
    substeps: int
    dt: float
    reward_scale: float
    latency_base_ms: float
    latency_alpha: float  # the mean latency needs > 1
    latency_max_ms: float
    max_steps: int

    def __post_init__(self):
        check_posint("n_masses", self.n_masses)
        check_posint("substeps", self.substeps)
        check_posint("max_steps", self.max_steps)
        for name in ("dt", "reward_scale", "latency_base_ms", "latency_max_ms"):
            check_nonneg(name, getattr(self, name))
        if self.latency_alpha <= 0:
            raise ValueError(f"latency_alpha={self.latency_alpha!r}: allowed is a number > 0")


class PhysicsSim(Emulator):
    """A spring-mass chain hanging from an anchor; the action pushes its free end (2-D force)
    towards a target. reward = reward_scale * (1 - 2 * min(distance / chain length, 1)), so
    +scale at the target and -scale a chain length away. Truncated after max_steps.

    state: mass positions (2n). vector: spring tensions (n) and the target (2).
    Latency: every step integrates the chain (fixed substeps, deterministic), then keeps
    iterating a position-based constraint solver on a scratch copy until the sampled latency
    has passed: the heavy tail is spent on real work, as in an engine's collision/solver
    passes, and does not change the dynamics.
    """

    Params = PhysicsParams
    REST, K, DAMP, MASS, FORCE, G = 0.2, 60.0, 0.6, 1.0, 20.0, 9.81

    @classmethod
    def _spec(cls, p: PhysicsParams) -> EnvSpec:
        return EnvSpec(
            {"state": ((2 * p.n_masses,), "float32"), "vector": ((p.n_masses + 2,), "float32")}, CONTINUOUS, 2
        )

    def __init__(self, env_id: int, seed: int, **params):
        super().__init__(env_id, seed, **params)
        self.latency_rng = np.random.default_rng([seed, 7])
        n = self.p.n_masses
        self.pos = np.zeros((n, 2))
        self.vel = np.zeros((n, 2))
        self.length = n * self.REST
        self.t = 0
        self.last_latency_ms = 0.0

    def _tensions(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        prev = np.vstack([np.zeros((1, 2)), pos[:-1]])
        d = pos - prev
        length = np.linalg.norm(d, axis=1)
        tension = self.K * (length - self.REST)
        unit = d / np.maximum(length, 1e-9)[:, None]
        return tension, unit

    def _obs(self, tension: np.ndarray) -> dict[str, np.ndarray]:
        return {
            "state": self.pos.astype(np.float32).reshape(-1),
            "vector": np.concatenate([np.tanh(tension / self.K), self.target]).astype(np.float32),
        }

    def reset(self, env_id: int) -> dict[str, np.ndarray]:
        n = self.p.n_masses
        self.pos = np.stack([np.zeros(n), -self.REST * np.arange(1, n + 1)], axis=1)
        self.pos += self.rng.normal(0, 0.02, self.pos.shape)
        self.vel = np.zeros((n, 2))
        angle = self.rng.uniform(-np.pi, 0)
        radius = self.rng.uniform(0.3, 0.9) * self.length
        self.target = np.array([np.cos(angle), np.sin(angle)]) * radius
        self.t = 0
        return self._obs(self._tensions(self.pos)[0])

    def _solver_pass(self, scratch: np.ndarray) -> None:
        """One Jacobi pass projecting every spring back to its rest length."""
        prev = np.vstack([np.zeros((1, 2)), scratch[:-1]])
        d = scratch - prev
        length = np.maximum(np.linalg.norm(d, axis=1), 1e-9)
        scratch -= 0.5 * ((length - self.REST) / length)[:, None] * d

    def step(self, env_id: int, action: np.ndarray):
        start = time.perf_counter()
        latency = self.p.latency_base_ms * (1.0 + self.latency_rng.pareto(self.p.latency_alpha))
        latency = min(latency, self.p.latency_max_ms)
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[:2], -1.0, 1.0)
        h = self.p.dt / self.p.substeps
        for _ in range(self.p.substeps):
            tension, unit = self._tensions(self.pos)
            f = -tension[:, None] * unit  # spring on its lower mass
            f[:-1] += tension[1:, None] * unit[1:]  # ... and on its upper mass
            f -= self.DAMP * self.vel
            f[:, 1] -= self.MASS * self.G
            f[-1] += self.FORCE * a
            self.vel += h * f / self.MASS  # semi-implicit Euler
            self.pos += h * self.vel
        self.t += 1
        tension, _ = self._tensions(self.pos)
        dist = float(np.linalg.norm(self.pos[-1] - self.target))
        reward = self.p.reward_scale * (1.0 - 2.0 * min(dist / self.length, 1.0))
        deadline = start + latency / 1000.0
        scratch = self.pos.copy()
        while time.perf_counter() < deadline:
            self._solver_pass(scratch)
        self.last_latency_ms = (time.perf_counter() - start) * 1000.0
        truncated = self.t >= self.p.max_steps
        return self._obs(tension), float(reward), False, truncated, {}

    def close(self, env_id: int) -> None:
        pass
