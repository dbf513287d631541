"""Between the Gymnasium spaces a user sees and rlpipe's board and action heads.

Observations: the board holds each env's obs as fixed keys (`state`/`vector` float32 rows,
`rgb` uint8 images), each type's values in a prefix of its key's row (rlpipe/worker/envtable.py).
A vector of one type reads that prefix back as the type's space:
- a Gymnasium id whose observation space is one Box (CartPole and most of Gymnasium) gets
  that Box's shape and bounds back, as float32 (the board's dtype: a float64 Box comes back
  as float32 values, and the space says so); an image-only id (uint8 HxWx3, not resized) its
  image;
- anything the contract flattens (Dict, Tuple, Discrete obs, an image beside numbers) and
  rlpipe's own types come back in the contract's form: one Box per key, a Dict of them when
  the type produces several keys.
Actions: a Discrete space goes to the discrete head (its `start` taken off and added back by
the env), a Box to the continuous head, mapped onto the policy's [-1, 1] where its bounds are
finite (the env maps it back, rlpipe/envs/classic.py).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from rlpipe.envs.classic import ObsMap, make_gym
from rlpipe.envs.contract import DISCRETE, EnvSpec

GYM_TARGET = "rlpipe.envs.classic.GymnasiumEnv"


def _key_box(key: str, shape, dtype) -> gym.spaces.Box:
    if key == "rgb":
        return gym.spaces.Box(0, 255, tuple(shape), np.uint8)
    return gym.spaces.Box(-np.inf, np.inf, tuple(shape), np.dtype(dtype))


class SpaceMap:
    """One env type's single observation and action spaces, and the conversions."""

    def __init__(self, node: dict, spec: EnvSpec):
        self.spec = spec
        self.keys = list(spec.obs)  # the type's keys, in its spec's order
        self.lengths = {k: int(np.prod(shape)) for k, (shape, _) in spec.obs.items()}
        native_obs = native_act = None
        if node.get("_target_") == GYM_TARGET:
            native_obs, native_act = self._native_spaces(node)
        # obs: a single key read back as `shape` (None: the contract's form for every key)
        self.single_key: str | None = None
        self.shape: tuple | None = None
        if native_obs is not None:
            self.single_key, self.shape, self.observation_space = native_obs
        elif len(self.keys) == 1:
            key = self.keys[0]
            shape, dtype = spec.obs[key]
            self.single_key, self.shape = key, tuple(shape)
            self.observation_space = _key_box(key, shape, dtype)
        else:
            self.observation_space = gym.spaces.Dict(
                {k: _key_box(k, shape, dtype) for k, (shape, dtype) in spec.obs.items()}
            )
        self.discrete = spec.action_kind == DISCRETE
        self.start = 0
        if native_act is not None:
            self.action_space = native_act
        elif self.discrete:
            self.action_space = gym.spaces.Discrete(spec.action_n)
        else:
            self.action_space = gym.spaces.Box(-1.0, 1.0, (spec.action_n,), np.float32)
        if self.discrete:
            self.start = int(self.action_space.start)
            self.n = int(self.action_space.n)
        else:
            box = self.action_space
            low = box.low.reshape(-1).astype(np.float64)
            high = box.high.reshape(-1).astype(np.float64)
            self.finite = np.isfinite(low) & np.isfinite(high)
            self.low = np.where(self.finite, low, 0.0)
            self.half = np.where(self.finite, (high - low) / 2, 1.0)

    def _native_spaces(self, node: dict):
        """The id's own spaces (one env built here, in the caller's process, and closed)."""
        env = make_gym(node["id"], node.get("make_kwargs"), node.get("wrappers"))
        try:
            obs_space, act_space = env.observation_space, env.action_space
        finally:
            env.close()
        obs_map = ObsMap(obs_space, node.get("obs_key"), node.get("rgb_shape"))
        native = None
        if obs_map._single_box and obs_map.resize is None:
            key = obs_map.flat_key
            native = (
                key,
                tuple(obs_space.shape),
                gym.spaces.Box(
                    obs_space.low.astype(np.float32), obs_space.high.astype(np.float32), obs_space.shape, np.float32
                ),
            )
        elif not obs_map.flat and obs_map.image_path == () and tuple(obs_space.shape) == self.spec.obs["rgb"][0]:
            native = ("rgb", tuple(obs_space.shape), obs_space)
        return native, act_space

    # -- observations ------------------------------------------------------------------------
    def obs_views(self, board_bufs: dict[str, np.ndarray]):
        """The obs of every env as the single space's batch, viewing `board_bufs` (the
        vector's gather buffers, one per board key, (num_envs,) + key shape). A view while the
        type's values fill the key's row (the usual case: buffer=auto sizes the board to the
        type), else numpy copies the prefix when the caller copies."""

        def read(key, shape):
            buf = board_bufs[key]
            flat = buf.reshape(len(buf), -1)
            part = flat if flat.shape[1] == self.lengths[key] else flat[:, : self.lengths[key]]
            return part.reshape((len(buf),) + tuple(shape))

        if self.single_key is not None:
            return read(self.single_key, self.shape)
        return {k: read(k, self.spec.obs[k][0]) for k in self.keys}

    def final_obs(self, rows: dict[str, np.ndarray]):
        """One env's end obs from its rows of the final-obs arrays (a copy)."""

        def one(key, shape):
            return np.array(rows[key].reshape(-1)[: self.lengths[key]].reshape(shape))

        if self.single_key is not None:
            return one(self.single_key, self.shape)
        return {k: one(k, self.spec.obs[k][0]) for k in self.keys}

    # -- actions -----------------------------------------------------------------------------
    def encode(self, actions, n: int, disc: np.ndarray, cont: np.ndarray, rows) -> None:
        """Check `actions` (n of them, the batched action space's form) and write them into the
        heads' arrays at `rows` (discrete: index into [0, n); continuous: the [-1, 1] form)."""
        if np.isscalar(actions) or (isinstance(actions, np.ndarray) and actions.ndim == 0):
            raise TypeError(f"actions must be a batch of {n} actions, got the scalar {actions!r}")
        a = np.asarray(actions)
        want = (n,) + tuple(self.action_space.shape)
        if a.shape != want:
            raise ValueError(f"actions have shape {a.shape}, expected {want} ({n} envs x {self.action_space})")
        if self.discrete:
            if a.dtype.kind not in "iub":
                if a.dtype.kind == "f" and np.all(a == np.round(a)):
                    a = a.astype(np.int64)
                else:
                    raise ValueError(f"discrete actions must be integers, got dtype {a.dtype}")
            idx = a.astype(np.int64) - self.start
            if idx.size and (idx.min() < 0 or idx.max() >= self.n):
                bad = a[(idx < 0) | (idx >= self.n)][0]
                raise ValueError(f"action {bad} is outside {self.action_space}")
            disc[rows] = idx
        else:
            x = a.reshape(n, -1).astype(np.float64)
            if not np.isfinite(x).all():
                raise ValueError("continuous actions hold NaN or inf")
            cont[rows, : x.shape[1]] = np.where(self.finite, (x - self.low) / self.half - 1.0, x)
