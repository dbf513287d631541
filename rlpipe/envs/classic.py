"""Any Gymnasium environment through the contract: spaces mapped onto obs keys and action heads.

Used by the classic-control, lunar_lander and atari types and by `env_mix=gym env_mix.id=<Id>`.

Observations (walked through Dict and Tuple spaces):
- the first image-like part (uint8 Box of HxW or HxWxC, C in 1/3/4) -> `rgb`, resized
  (nearest) to `rgb_shape` when that is given (the buffer's rgb shape);
- every other Box, Discrete (one-hot), MultiBinary and MultiDiscrete part -> flattened and
  concatenated as float32 into `state` (or `vector` via obs_key);
- parts with no numeric form (Text, Graph, ...) are left out.
Actions:
- Discrete(n, start) -> the discrete head with n valid entries (start is added back);
- Box -> the continuous head with prod(shape) dims; the policy's [-1, 1] is mapped linearly
  onto finite bounds (clipped first); dims with an infinite bound get the raw value.
Anything else (MultiDiscrete, MultiBinary, Dict actions) is refused with a clear error.

Ids of plugin packages register on demand: `ALE/...` imports ale_py, `MiniGrid-...`/`BabyAI-...`
import minigrid, and `module:Id` imports `module` (Gymnasium's own syntax).
"""

from __future__ import annotations

import difflib
import importlib
import math
import warnings
from collections.abc import Callable

import gymnasium as gym
import numpy as np

from rlpipe.envs.contract import CONTINUOUS, DISCRETE, EnvInterface, EnvSpec
from rlpipe.envs.image import Resizer, as_rgb_shape
from rlpipe.native.gymstep import DiscreteBoxStep

# id prefix -> package that registers it when imported
PLUGINS = (("ALE/", "ale_py"), ("MiniGrid-", "minigrid"), ("BabyAI-", "minigrid"))
OBS_KEYS_FLAT = ("state", "vector")
_F32 = np.dtype(np.float32)


def ensure_registered(gym_id: str) -> None:
    """Import the plugin package an id needs; raise ValueError naming the id if it is unknown."""
    if gym_id is None:
        raise ValueError("no Gymnasium id given: set one, e.g. `env_mix=gym env_mix.id=CartPole-v1`")
    if not isinstance(gym_id, str) or not gym_id:
        raise ValueError(f"Gymnasium id {gym_id!r} is not a non-empty string")
    if ":" in gym_id:  # "module:Id": Gymnasium imports the module itself
        module, _, rest = gym_id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"Gymnasium id {gym_id!r}: module {module!r} cannot be imported ({exc})") from None
        gym_id = rest
    else:
        for prefix, module in PLUGINS:
            if gym_id.startswith(prefix):
                try:
                    mod = importlib.import_module(module)
                except ImportError:
                    raise ValueError(
                        f"Gymnasium id {gym_id!r} needs the package {module!r}, which is not installed"
                    ) from None
                if module == "ale_py" and hasattr(mod, "LoggerMode"):
                    mod.ALEInterface.setLoggerMode(mod.LoggerMode.Error)  # no banner per env
                if hasattr(gym, "register_envs"):
                    gym.register_envs(mod)
    try:
        gym.spec(gym_id)
    except gym.error.Error as exc:
        close = difflib.get_close_matches(gym_id, list(gym.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(
            f"Gymnasium id {gym_id!r} does not exist ({exc}){hint} "
            "(python -c 'import gymnasium; gymnasium.pprint_registry()' lists the "
            "registered ids)"
        ) from None


def _import(path: str):
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"wrapper {path!r} is not a dotted path module.Name")
    return getattr(importlib.import_module(module), name)


def make_gym(gym_id: str, make_kwargs: dict | None = None, wrappers: list | None = None):
    """gym.make plus wrappers: each a dotted path or {path: ..., kwargs: {...}}."""
    ensure_registered(gym_id)
    kwargs = {"disable_env_checker": True, **(make_kwargs or {})}
    env = gym.make(gym_id, **kwargs)
    for w in wrappers or ():
        if isinstance(w, str):
            env = _import(w)(env)
        else:
            env = _wrapped(env, _import(w["path"]), w.get("kwargs") or {})
    return env


def _wrapped(env, wrapper, kwargs: dict):
    """`wrapper(env, **kwargs)`, less one false warning. Gymnasium builds a bound given as a
    Python float (RescaleObservation's `min_obs: -1.0`) as a float64 array, casts it to the
    float32 box and warns, in raw colour codes, that precision was lowered: the first lines
    `+stage=day4` printed, for -1.0 and 1.0, which float32 holds exactly. The warning is
    dropped only where every float in the kwargs is exact in float32, so it still speaks
    where a bound does lose digits."""
    with warnings.catch_warnings():
        if all(float(np.float32(x)) == x for x in _floats(kwargs)):
            warnings.filterwarnings("ignore", message=r".*precision lowered by casting to float32")
        return wrapper(env, **kwargs)


def _floats(value):
    """Every float in a wrapper's kwargs, walked through its lists and mappings."""
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _floats(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _floats(v)


# --- observation mapping --------------------------------------------------------------------


def _leaves(space, path=()):
    if isinstance(space, gym.spaces.Dict):
        for k, sub in space.spaces.items():
            yield from _leaves(sub, path + (k,))
    elif isinstance(space, gym.spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            yield from _leaves(sub, path + (i,))
    else:
        yield path, space


def _is_image(space) -> bool:
    if not isinstance(space, gym.spaces.Box) or space.dtype != np.uint8:
        return False
    s = space.shape
    return (len(s) == 3 and s[2] in (1, 3, 4) and min(s[:2]) >= 8) or (len(s) == 2 and min(s) >= 8)


_FLAT = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiBinary, gym.spaces.MultiDiscrete)


def _get(raw, path):
    for k in path:
        raw = raw[k]
    return raw


class ObsMap:
    """One observation space mapped onto contract keys; `spec` and `convert(raw)`."""

    def __init__(self, space, obs_key: str | None = None, rgb_shape=None):
        if obs_key is not None and obs_key not in OBS_KEYS_FLAT:
            raise ValueError(f"obs_key {obs_key!r} is not one of {', '.join(OBS_KEYS_FLAT)}")
        self.flat_key = obs_key or "state"
        self.image_path = None
        self.flat: list[tuple[tuple, gym.Space]] = []
        for path, sub in _leaves(space):
            if self.image_path is None and _is_image(sub):
                self.image_path, self.image_space = path, sub
            elif isinstance(sub, _FLAT):
                self.flat.append((path, sub))
        if self.image_path is None and not self.flat:
            raise ValueError(
                f"observation space {space} has no Box, Discrete, MultiBinary or "
                "MultiDiscrete part to map onto rgb/state/vector"
            )
        self.spec: dict = {}
        self.resize = None
        if self.image_path is not None:
            src = tuple(self.image_space.shape)
            native = (src[0], src[1], 3)
            out = as_rgb_shape(rgb_shape) or native
            self.resize = Resizer(src, out)
            self.spec["rgb"] = (out, "uint8")
        self.flat_dim = sum(int(gym.spaces.flatdim(sub)) for _, sub in self.flat)
        self._single_box = len(self.flat) == 1 and self.flat[0][0] == () and isinstance(self.flat[0][1], gym.spaces.Box)
        self.flat_only_box = self._single_box and self.image_path is None  # the obs is one flat Box
        if self.flat:
            self.spec[self.flat_key] = ((self.flat_dim,), "float32")

    def convert(self, raw) -> dict[str, np.ndarray]:
        out = {}
        if self.resize is not None:
            out["rgb"] = self.resize(np.asarray(_get(raw, self.image_path)))
        if self.flat:
            if self._single_box:
                if type(raw) is np.ndarray and raw.dtype is _F32 and raw.ndim == 1:
                    out[self.flat_key] = raw  # already the contract's form (CartPole & co.)
                else:
                    out[self.flat_key] = np.asarray(raw, dtype=np.float32).reshape(-1)
            else:
                out[self.flat_key] = np.concatenate(
                    [
                        np.asarray(gym.spaces.flatten(sub, _get(raw, path)), dtype=np.float32).reshape(-1)
                        for path, sub in self.flat
                    ]
                )
        return out


def action_head(space) -> tuple[str, int]:
    if isinstance(space, gym.spaces.Discrete):
        return DISCRETE, int(space.n)
    if isinstance(space, gym.spaces.Box) and space.shape and np.issubdtype(space.dtype, np.floating):
        return CONTINUOUS, int(np.prod(space.shape))
    raise ValueError(f"action space {space} is not supported: rlpipe's heads take one Discrete or one float Box action")


def bare_step(env) -> tuple[Callable | None, float]:
    """(the bare env's step, its time limit) when `env` is gym.make's own chain around it, a
    TimeLimit and an OrderEnforcing and nothing else (no env checker, no wrapper of the user's);
    else (None, inf). The adapter then keeps both wrappers' rules itself (the same truncation at
    the same step; no step before the first reset) and steps the bare env: two Python frames and
    a super() call each less per step, 0.45 us of CartPole's 6.2 (docs/benchmarks.md)."""
    limit, inner = None, env
    while isinstance(inner, gym.Wrapper):
        if type(inner) is gym.wrappers.TimeLimit:
            limit = getattr(inner, "_max_episode_steps", None)
            if limit is None:  # another Gymnasium keeps it elsewhere: the chain is stepped as it is
                return None, math.inf
        elif type(inner) is not gym.wrappers.OrderEnforcing:
            return None, math.inf
        inner = inner.env
    return inner.step, (math.inf if limit is None else limit)


class GymnasiumEnv(EnvInterface):
    """One Gymnasium env per env id. Parameters (all config): id, obs_key (state|vector for
    the flat part), rgb_shape (the board's rgb shape; null keeps the native frame size),
    make_kwargs (passed to gym.make), wrappers (dotted paths or {path, kwargs})."""

    def __init__(
        self,
        id: str,
        env_id: int,
        seed: int,
        obs_key: str | None = None,
        rgb_shape=None,
        make_kwargs: dict | None = None,
        wrappers: list | None = None,
    ):
        self.gym_id = id
        self.env = make_gym(id, make_kwargs, wrappers)
        try:
            self._map = ObsMap(self.env.observation_space, obs_key, rgb_shape)
            space = self.env.action_space
            kind, _n = action_head(space)
        except Exception:
            self.env.close()
            raise
        self._discrete = kind == DISCRETE
        if self._discrete:
            self._start, self._n = int(space.start), int(space.n)
        else:
            self._shape = space.shape
            low = space.low.reshape(-1).astype(np.float64)
            high = space.high.reshape(-1).astype(np.float64)
            finite = np.isfinite(low) & np.isfinite(high)
            self._finite = finite
            self._low = np.where(finite, low, 0.0)
            self._half = np.where(finite, (high - low) / 2, 1.0)
            self._dtype = space.dtype
        self._seed = seed
        self._first_reset = True
        self._bare_step, self._limit = bare_step(self.env)
        self._elapsed = 0  # steps since the last reset: the TimeLimit's count, kept here

    @classmethod
    def preload(cls, id: str, **_params) -> list[str]:
        """The module behind the id's entry point (ale_py, Box2D envs, minigrid, ...)."""
        ensure_registered(id)
        entry = gym.spec(id.partition(":")[2] if ":" in id else id).entry_point
        return [entry.partition(":")[0]] if isinstance(entry, str) else []

    @classmethod
    def describe(
        cls,
        id: str,
        obs_key: str | None = None,
        rgb_shape=None,
        make_kwargs: dict | None = None,
        wrappers: list | None = None,
    ) -> EnvSpec:
        env = make_gym(id, make_kwargs, wrappers)
        try:
            obs_map = ObsMap(env.observation_space, obs_key, rgb_shape)
            kind, n = action_head(env.action_space)
        finally:
            env.close()
        return EnvSpec(dict(obs_map.spec), kind, n)

    def reset(self, env_id: int) -> dict[str, np.ndarray]:
        # Seed once per env id; later resets continue that env's own random stream.
        first = self._first_reset
        seed = self._seed if first else None
        self._first_reset = False
        obs, _info = self.env.reset(seed=seed)
        self._elapsed = 0
        if isinstance(self.step, DiscreteBoxStep):
            self.step.elapsed = 0
        elif first and self._bare_step is not None and self._discrete and self._map.flat_only_box:
            # from the first reset on (OrderEnforcing's rule) the commonest types step in C:
            # rlpipe/native/gymstep.pyx, which the worker's step loop also calls directly
            self.step = DiscreteBoxStep(self._bare_step, self._start, self._n, self._limit, self._map.flat_key)
        return self._map.convert(obs)

    def step(self, env_id: int, action: np.ndarray):
        if self._discrete:
            # An int64 scalar, as Gymnasium's vector envs pass: Discrete.contains takes its
            # cheap path for numpy integers (a Python int costs an np.iinfo lookup per step).
            act = np.int64(self._start + int(action))
        else:
            a = np.clip(np.asarray(action, dtype=np.float64).reshape(-1), -1.0, 1.0)
            a = np.where(self._finite, self._low + (a + 1.0) * self._half, a)
            act = a.astype(self._dtype).reshape(self._shape)
        if self._bare_step is None or self._first_reset:  # (before a reset: OrderEnforcing raises)
            obs, reward, terminated, truncated, info = self.env.step(act)
        else:
            obs, reward, terminated, truncated, info = self._bare_step(act)
            self._elapsed += 1
            truncated = truncated or self._elapsed >= self._limit
        return self._map.convert(obs), float(reward), bool(terminated), bool(truncated), info

    def close(self, env_id: int) -> None:
        self.env.close()
