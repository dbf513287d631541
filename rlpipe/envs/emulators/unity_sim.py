"""UnitySim: slow warm-up, an rgb render every step, slow memory growth.

One of the four emulators described in rlpipe/envs/emulators/__init__.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from rlpipe.envs.contract import CONTINUOUS, EnvSpec
from rlpipe.envs.emulators.base import Emulator, check_nonneg, check_posint
from rlpipe.envs.image import as_rgb_shape

DEFAULT_RGB = (64, 64, 3)  # used when rgb_shape is null (a buffer without rgb)
LEAK_CHUNK = 64 * 1024  # memory growth is allocated in chunks of this many bytes


# --- drawing helpers ------------------------------------------------------------------------


def _disc(radius: int) -> np.ndarray:
    y, x = np.mgrid[-radius : radius + 1, -radius : radius + 1]
    return (x * x + y * y) <= radius * radius


def _stamp(frame: np.ndarray, mask: np.ndarray, cy: int, cx: int, color) -> None:
    """Paint `color` where `mask` (centered at cy, cx) covers the frame, clipped at edges."""
    r = mask.shape[0] // 2
    h, w = frame.shape[:2]
    y0, y1, x0, x1 = cy - r, cy + r + 1, cx - r, cx + r + 1
    my0, mx0 = max(0, -y0), max(0, -x0)
    y0, x0, y1, x1 = max(y0, 0), max(x0, 0), min(y1, h), min(x1, w)
    if y0 >= y1 or x0 >= x1:
        return
    m = mask[my0 : my0 + (y1 - y0), mx0 : mx0 + (x1 - x0)]
    frame[y0:y1, x0:x1][m] = color[: frame.shape[2]]


def _value_noise(rng: np.random.Generator, h: int, w: int, cells: int) -> np.ndarray:
    """One octave of bilinear value noise in [0, 1], h x w."""
    grid = rng.random((cells + 1, cells + 1))
    ys = np.linspace(0, cells, h, endpoint=False)
    xs = np.linspace(0, cells, w, endpoint=False)
    y0, x0 = ys.astype(int), xs.astype(int)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    g00, g01 = grid[np.ix_(y0, x0)], grid[np.ix_(y0, x0 + 1)]
    g10, g11 = grid[np.ix_(y0 + 1, x0)], grid[np.ix_(y0 + 1, x0 + 1)]
    return (g00 * (1 - fx) + g01 * fx) * (1 - fy) + (g10 * (1 - fx) + g11 * fx) * fy


@dataclass(frozen=True)
class UnityParams:
    """The parameters of conf/env/unity_sim.yaml, checked. No defaults: the YAML node is their
    one home (what each means is said there)."""

    rgb_shape: tuple | list | None  # null: DEFAULT_RGB
    warmup_ms: float
    leak_bytes_per_step: int
    leak_max_mb: float
    max_steps: int
    success_radius: float

    def __post_init__(self):
        object.__setattr__(self, "rgb_shape", as_rgb_shape(self.rgb_shape) or DEFAULT_RGB)
        check_nonneg("warmup_ms", self.warmup_ms)
        check_nonneg("leak_bytes_per_step", self.leak_bytes_per_step)
        check_nonneg("leak_max_mb", self.leak_max_mb)
        check_posint("max_steps", self.max_steps)


class UnitySim(Emulator):
    """A Unity-like simulator: navigate a point mass to a target in a rendered 2-D arena.

    state (9): position, velocity, target, target - position, time fraction. Continuous
    action (2): force. reward: -0.05 * distance per step, +1 on reaching the target
    (terminated); truncated after max_steps.
    """

    Params = UnityParams
    STATE = 9

    @classmethod
    def _spec(cls, p: UnityParams) -> EnvSpec:
        return EnvSpec({"rgb": (p.rgb_shape, "uint8"), "state": ((cls.STATE,), "float32")}, CONTINUOUS, 2)

    def __init__(self, env_id: int, seed: int, **params):
        super().__init__(env_id, seed, **params)
        h, w, c = self.p.rgb_shape
        self.background = self._warm_up(h, w, c)  # the slow part, like loading a scene
        self.frame = np.empty((h, w, c), dtype=np.uint8)
        scale = min(h, w)
        self._agent_mask = _disc(max(1, scale // 20))
        self._target_mask = _disc(max(1, scale // 14))
        self._leak: list[np.ndarray] = []
        self._leak_pending = 0
        self._leak_cap = int(self.p.leak_max_mb * 1024 * 1024)
        self.leaked_bytes = 0
        self.t = 0

    def _warm_up(self, h: int, w: int, c: int) -> np.ndarray:
        """Bake a procedural texture, octave after octave, until warmup_ms of work is done."""
        deadline = time.perf_counter() + self.p.warmup_ms / 1000.0
        tex = np.zeros((h, w), dtype=np.float64)
        octave = 0
        while True:
            cells = 2 ** (1 + octave % 5)
            amp = 0.5 ** (octave % 5)
            tex += amp * _value_noise(self.rng, h, w, cells)
            octave += 1
            if time.perf_counter() >= deadline and octave >= 1:
                break
        tex -= tex.min()
        tex /= max(float(tex.max()), 1e-9)
        tint = np.array([0.35, 0.55, 0.35, 1.0])[:c]
        return (tex[:, :, None] * tint * 255).clip(0, 255).astype(np.uint8)

    def _state(self) -> np.ndarray:
        rel = self.target - self.pos
        return np.array([*self.pos, *self.vel, *self.target, *rel, self.t / self.p.max_steps], dtype=np.float32)

    def _render(self) -> np.ndarray:
        h, w = self.frame.shape[:2]
        np.copyto(self.frame, self.background)
        # the light moves with time: a real per-frame shading pass over the scene
        shade = 0.75 + 0.25 * np.cos(self.t * 0.05)
        np.multiply(self.frame, shade, out=self.frame, casting="unsafe")

        def px(v):
            return int((v[1] + 1) / 2 * (h - 1)), int((v[0] + 1) / 2 * (w - 1))

        _stamp(self.frame, self._target_mask, *px(self.target), (220, 40, 40, 255))
        _stamp(self.frame, self._agent_mask, *px(self.pos), (40, 80, 230, 255))
        return self.frame.copy()

    def _grow(self) -> None:
        if self.leaked_bytes >= self._leak_cap:
            return
        self._leak_pending += self.p.leak_bytes_per_step
        while self._leak_pending >= LEAK_CHUNK and self.leaked_bytes < self._leak_cap:
            self._leak.append(np.ones(LEAK_CHUNK, dtype=np.uint8))  # touched pages: real RSS
            self._leak_pending -= LEAK_CHUNK
            self.leaked_bytes += LEAK_CHUNK

    def reset(self, env_id: int) -> dict[str, np.ndarray]:
        self.pos = self.rng.uniform(-0.9, 0.9, 2)
        self.vel = np.zeros(2)
        self.target = self.rng.uniform(-0.8, 0.8, 2)
        self.t = 0
        return {"rgb": self._render(), "state": self._state()}

    def step(self, env_id: int, action: np.ndarray):
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[:2], -1.0, 1.0)
        self.vel = 0.9 * self.vel + 0.02 * a
        self.pos = self.pos + self.vel
        hit = np.abs(self.pos) > 1.0
        self.pos = np.clip(self.pos, -1.0, 1.0)
        self.vel[hit] = 0.0
        self.t += 1
        self._grow()
        dist = float(np.linalg.norm(self.target - self.pos))
        terminated = dist < self.p.success_radius
        reward = -0.05 * dist + (1.0 if terminated else 0.0)
        truncated = self.t >= self.p.max_steps
        obs = {"rgb": self._render(), "state": self._state()}
        return obs, reward, terminated, truncated, {}

    def close(self, env_id: int) -> None:
        self._leak.clear()
