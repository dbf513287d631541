"""Emulators of the original system's troublemakers: unity_sim, physics_sim, web_sim, faulty.

Each does real work (renders real pixels, integrates real dynamics, builds and parses real
pages, allocates real memory); the trouble it emulates is on top of that work, and every rate,
latency and scale is a constructor parameter, i.e. config (conf/env/<type>.yaml). Defaults are
light: thousands of these must fit on one machine.

- UnitySim: slow warm-up (procedural texture baking for `warmup_ms` of CPU time at build),
  an rgb render of a point-mass navigation scene every step, and slow memory growth
  (`leak_bytes_per_step`, touched pages, capped at `leak_max_mb`). obs: rgb + state.
- PhysicsSim: a spring-mass chain with heavy-tailed step latency (Lomax/Pareto-II around
  `latency_base_ms`, capped at `latency_max_ms`, filled with constraint-solver iterations) and
  rewards in [-reward_scale, +reward_scale] (default +-100). obs: state + vector.
- WebSim: navigating a generated site by clicking links; each step renders and regex-parses
  an HTML page into hashed features; with probability `hang_rate` a step blocks on a socket
  that never answers for `hang_s` seconds (null: until the env is closed). obs: vector.
- Faulty: a small random-walk env that raises on reset/step/render and returns contract
  violations (wrong shape, wrong dtype, NaN, missing key, NaN reward) at configured rates.
  obs: any of state/vector/rgb (by parameters).
"""
from __future__ import annotations

import re
import socket
import time
import zlib
from dataclasses import dataclass

import numpy as np

from rlpipe.envs.contract import CONTINUOUS, DISCRETE, EnvInterface, EnvSpec
from rlpipe.envs.image import as_rgb_shape

DEFAULT_RGB = (64, 64, 3)        # used when rgb_shape is null (a buffer without rgb)
LEAK_CHUNK = 64 * 1024           # memory growth is allocated in chunks of this many bytes


def _rate(name: str, value: float) -> float:
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name}={value!r}: allowed is a probability in [0, 1]")
    return float(value)


def _nonneg(name: str, value: float) -> float:
    if float(value) < 0:
        raise ValueError(f"{name}={value!r}: allowed is a number >= 0")
    return float(value)


def _posint(name: str, value: int) -> int:
    if isinstance(value, bool) or int(value) != value or value <= 0:
        raise ValueError(f"{name}={value!r}: allowed is a positive integer")
    return int(value)


class _Emulator(EnvInterface):
    """Parameters live in a frozen dataclass `Params` (unknown or bad ones are errors at plan
    time, through describe)."""
    Params: type

    def __init__(self, env_id: int, seed: int, **params):
        self.p = self.Params(**params)
        self.env_id = env_id
        self.rng = np.random.default_rng(seed)

    @classmethod
    def describe(cls, **params) -> EnvSpec:
        return cls._spec(cls.Params(**params))


# --- drawing helpers ------------------------------------------------------------------------

def _disc(radius: int) -> np.ndarray:
    y, x = np.mgrid[-radius:radius + 1, -radius:radius + 1]
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
    m = mask[my0:my0 + (y1 - y0), mx0:mx0 + (x1 - x0)]
    frame[y0:y1, x0:x1][m] = color[:frame.shape[2]]


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


# --- unity_sim ------------------------------------------------------------------------------

@dataclass(frozen=True)
class UnityParams:
    rgb_shape: tuple | list | None = None   # the board's rgb shape (null: 64x64x3)
    warmup_ms: float = 250.0                # CPU time spent baking textures at build
    leak_bytes_per_step: int = 256          # memory growth per step (0: none)
    leak_max_mb: float = 2.0                # growth stops here (a rebuild frees it)
    max_steps: int = 300                    # truncation
    success_radius: float = 0.1             # reaching the target ends the episode

    def __post_init__(self):
        object.__setattr__(self, "rgb_shape", as_rgb_shape(self.rgb_shape) or DEFAULT_RGB)
        _nonneg("warmup_ms", self.warmup_ms)
        _nonneg("leak_bytes_per_step", self.leak_bytes_per_step)
        _nonneg("leak_max_mb", self.leak_max_mb)
        _posint("max_steps", self.max_steps)


class UnitySim(_Emulator):
    """A Unity-like simulator: navigate a point mass to a target in a rendered 2-D arena.

    state (9): position, velocity, target, target - position, time fraction. Continuous
    action (2): force. reward: -0.05 * distance per step, +1 on reaching the target
    (terminated); truncated after max_steps.
    """
    Params = UnityParams
    STATE = 9

    @classmethod
    def _spec(cls, p: UnityParams) -> EnvSpec:
        return EnvSpec({"rgb": (p.rgb_shape, "uint8"), "state": ((cls.STATE,), "float32")},
                       CONTINUOUS, 2)

    def __init__(self, env_id: int, seed: int, **params):
        super().__init__(env_id, seed, **params)
        h, w, c = self.p.rgb_shape
        self.background = self._warm_up(h, w, c)       # the slow part, like loading a scene
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
        return np.array([*self.pos, *self.vel, *self.target, *rel, self.t / self.p.max_steps],
                        dtype=np.float32)

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
            self._leak.append(np.ones(LEAK_CHUNK, dtype=np.uint8))   # touched pages: real RSS
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


# --- physics_sim ----------------------------------------------------------------------------

@dataclass(frozen=True)
class PhysicsParams:
    n_masses: int = 6                 # chain length; state is 2 * n_masses, vector n_masses + 2
    substeps: int = 4                 # integration substeps per env step
    dt: float = 0.02                  # seconds of simulated time per env step
    reward_scale: float = 100.0       # rewards lie in [-reward_scale, +reward_scale]
    latency_base_ms: float = 0.2      # step latency: base * (1 + Lomax(alpha)), heavy-tailed
    latency_alpha: float = 1.5        # tail index (smaller: heavier tail; mean needs > 1)
    latency_max_ms: float = 50.0      # cap on one step's latency
    max_steps: int = 500

    def __post_init__(self):
        _posint("n_masses", self.n_masses)
        _posint("substeps", self.substeps)
        _posint("max_steps", self.max_steps)
        for name in ("dt", "reward_scale", "latency_base_ms", "latency_max_ms"):
            _nonneg(name, getattr(self, name))
        if self.latency_alpha <= 0:
            raise ValueError(f"latency_alpha={self.latency_alpha!r}: allowed is a number > 0")


class PhysicsSim(_Emulator):
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
        return EnvSpec({"state": ((2 * p.n_masses,), "float32"),
                        "vector": ((p.n_masses + 2,), "float32")}, CONTINUOUS, 2)

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
        return {"state": self.pos.astype(np.float32).reshape(-1),
                "vector": np.concatenate([np.tanh(tension / self.K), self.target]).astype(np.float32)}

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
            f = -tension[:, None] * unit                       # spring on its lower mass
            f[:-1] += tension[1:, None] * unit[1:]             # ... and on its upper mass
            f -= self.DAMP * self.vel
            f[:, 1] -= self.MASS * self.G
            f[-1] += self.FORCE * a
            self.vel += h * f / self.MASS                      # semi-implicit Euler
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


# --- web_sim --------------------------------------------------------------------------------

_WORDS = ("home", "news", "sport", "cart", "login", "search", "offer", "help", "blog", "about",
          "price", "review", "share", "video", "map", "menu", "account", "order", "faq", "deal")
_HREF = re.compile(r'<a href="/page/(\d+)">')
_HINT = re.compile(r'data-goal-hops="(\d+)"')
_WORD = re.compile(r"[a-z]{3,}")


@dataclass(frozen=True)
class WebParams:
    n_pages: int = 32                 # pages on the generated site
    n_links: int = 5                  # links per page = discrete actions
    vector_dim: int = 16              # obs vector: hashed page features + 4 navigation values
    page_kb: float = 2.0              # approximate size of each rendered page
    max_steps: int = 50
    hang_rate: float = 0.0005         # probability that a step blocks (a hung page load)
    hang_s: float | None = 2.0        # how long it blocks; null: until the env is closed
    hang_raises: bool = False         # after the block: raise TimeoutError (true) or go on

    def __post_init__(self):
        for name in ("n_pages", "n_links", "max_steps"):
            _posint(name, getattr(self, name))
        if self.n_links < 2 or self.vector_dim < 6:
            raise ValueError("web_sim needs n_links >= 2 and vector_dim >= 6")
        _nonneg("page_kb", self.page_kb)
        _rate("hang_rate", self.hang_rate)
        if self.hang_s is not None:
            _nonneg("hang_s", self.hang_s)


class WebSim(_Emulator):
    """A web agent: reach the goal page of a generated site by clicking links.

    Each step renders the target page as HTML (links, a hint of how many clicks remain, filler
    text) and parses it back with regular expressions into the obs vector: hashed word
    counts, then hops-to-goal, links found, step fraction, at-goal. reward: -0.01 per step,
    +1 on reaching the goal (terminated); truncated after max_steps.
    """
    Params = WebParams

    @classmethod
    def _spec(cls, p: WebParams) -> EnvSpec:
        return EnvSpec({"vector": ((p.vector_dim,), "float32")}, DISCRETE, p.n_links)

    @classmethod
    def declared_fault_rates(cls, **params) -> tuple[float, float]:
        p = WebParams(**params)
        return 0.0, (p.hang_rate if p.hang_raises else 0.0)

    def __init__(self, env_id: int, seed: int, **params):
        super().__init__(env_id, seed, **params)
        p = self.p
        self.hang_rng = np.random.default_rng([seed, 11])
        # a ring keeps the site connected; the other links are random
        self.links = self.rng.integers(0, p.n_pages, (p.n_pages, p.n_links))
        self.links[:, 0] = (np.arange(p.n_pages) + 1) % p.n_pages
        self.filler_words = max(1, int(p.page_kb * 1024 / 8))
        self._hang_sock: socket.socket | None = None
        self._closed = False
        self.hangs = 0

    def _hops_to(self, goal: int) -> np.ndarray:
        """BFS on the reversed link graph: clicks from every page to `goal`."""
        n = self.p.n_pages
        hops = np.full(n, n, dtype=np.int64)
        hops[goal] = 0
        frontier = [goal]
        while frontier:
            nxt = []
            for page in frontier:
                for src in np.nonzero((self.links == page).any(axis=1))[0]:
                    if hops[src] > hops[page] + 1:
                        hops[src] = hops[page] + 1
                        nxt.append(int(src))
            frontier = nxt
        return hops

    def _render_page(self, page: int) -> str:
        words = self.rng.integers(0, len(_WORDS), self.filler_words)
        filler = " ".join(_WORDS[i] for i in words)
        links = "".join(f'<li><a href="/page/{int(t)}">{_WORDS[int(t) % len(_WORDS)]}</a></li>'
                        for t in self.links[page])
        return (f'<html><head><title>page {page}</title></head><body data-goal-hops='
                f'"{int(self.hops[page])}"><ul>{links}</ul><p>{filler}</p></body></html>')

    def _parse(self, html: str) -> np.ndarray:
        d = self.p.vector_dim - 4
        feats = np.zeros(d, dtype=np.float64)
        for w in _WORD.findall(html):
            feats[zlib.crc32(w.encode()) % d] += 1.0
        feats /= max(1.0, feats.sum())
        links = len(_HREF.findall(html))
        hint = _HINT.search(html)
        hops = int(hint.group(1)) if hint else self.p.n_pages
        nav = [min(hops, 10) / 10.0, links / self.p.n_links, self.t / self.p.max_steps,
               float(self.page == self.goal)]
        return np.concatenate([feats, nav]).astype(np.float32)

    def _hang(self) -> None:
        """Block on a socket that never answers, like a page whose script never returns."""
        self.hangs += 1
        rx, tx = socket.socketpair()
        self._hang_sock = tx
        try:
            rx.settimeout(self.p.hang_s)
            try:
                data = rx.recv(1)
            except socket.timeout:
                if self.p.hang_raises:
                    raise TimeoutError(f"web_sim: page load hung for {self.p.hang_s} s") from None
                return
            if not data or self._closed:
                raise ConnectionAbortedError("web_sim: closed while a page load hung")
        finally:
            self._hang_sock = None
            rx.close()
            tx.close()

    def reset(self, env_id: int) -> dict[str, np.ndarray]:
        self.goal = int(self.rng.integers(self.p.n_pages))
        self.hops = self._hops_to(self.goal)
        self.page = int(self.rng.choice(np.nonzero(self.hops > 0)[0])) if self.p.n_pages > 1 else 0
        self.t = 0
        return {"vector": self._parse(self._render_page(self.page))}

    def step(self, env_id: int, action: np.ndarray):
        if self.hang_rng.random() < self.p.hang_rate:
            self._hang()
        self.page = int(self.links[self.page, int(action) % self.p.n_links])
        self.t += 1
        obs = {"vector": self._parse(self._render_page(self.page))}
        terminated = self.page == self.goal
        reward = (1.0 if terminated else 0.0) - 0.01
        return obs, reward, terminated, self.t >= self.p.max_steps, {}

    def close(self, env_id: int) -> None:
        self._closed = True
        sock = self._hang_sock
        if sock is not None:             # wake a step blocked in _hang (another thread)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


# --- faulty ---------------------------------------------------------------------------------

VIOLATIONS = ("shape", "dtype", "nan", "key", "reward")


class InjectedFault(RuntimeError):
    """An exception the faulty emulator raises on purpose."""


@dataclass(frozen=True)
class FaultyParams:
    state_dim: int = 8                    # 0: no state key
    vector_dim: int = 0                   # 0: no vector key
    rgb_shape: tuple | list | None = None # null: no rgb key (no render)
    action_kind: str = "discrete"         # discrete | continuous
    action_n: int = 4
    max_steps: int = 200
    reset_error_rate: float = 0.02        # reset raises
    step_error_rate: float = 0.002        # step raises
    render_error_rate: float = 0.002      # rendering the rgb obs raises (reset and step)
    violation_rate: float = 0.002         # step returns a contract violation
    violations: tuple | list = ("shape", "dtype", "nan")   # kinds drawn from, uniformly

    def __post_init__(self):
        if self.state_dim < 0 or self.vector_dim < 0:
            raise ValueError("state_dim and vector_dim must be >= 0")
        object.__setattr__(self, "rgb_shape", as_rgb_shape(self.rgb_shape))
        if not self.state_dim and not self.vector_dim and self.rgb_shape is None:
            raise ValueError("faulty needs at least one obs key (state_dim, vector_dim, rgb_shape)")
        if self.action_kind not in (DISCRETE, CONTINUOUS):
            raise ValueError(f"action_kind={self.action_kind!r}: allowed are discrete, continuous")
        _posint("action_n", self.action_n)
        _posint("max_steps", self.max_steps)
        for name in ("reset_error_rate", "step_error_rate", "render_error_rate", "violation_rate"):
            _rate(name, getattr(self, name))
        object.__setattr__(self, "violations", tuple(self.violations))
        bad = [v for v in self.violations if v not in VIOLATIONS]
        if bad or not self.violations:
            raise ValueError(f"violations={list(self.violations)}: allowed kinds are "
                             f"{', '.join(VIOLATIONS)} (at least one)")


class Faulty(_Emulator):
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
            f[top:, i * bar_w:(i + 1) * bar_w] = (200, 180, 40, 255)[:f.shape[2]]
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
