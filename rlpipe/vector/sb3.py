"""`RlpipeVecEnv`: Stable-Baselines3's `VecEnv` over rlpipe.vector (`pip install rlpipe[sb3]`).

    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecMonitor
    from rlpipe.vector.sb3 import RlpipeVecEnv

    env = VecMonitor(RlpipeVecEnv("CartPole-v1", 8, seed=0))
    PPO("MlpPolicy", env).learn(100_000)

What SB3 expects, and where it comes from:
- `step_async` hands every env its action (rlpipe.vector's `send`), `step_wait` collects them
  (`recv`): the workers step while the caller does whatever it does between the two.
- Autoreset: rlpipe's workers reset an ended env within the step that ended it, which is SB3's
  own rule: the step returns the next episode's first obs, the end obs is
  `info["terminal_observation"]`, `info["TimeLimit.truncated"]` is truncated-and-not-terminated.
- Faults: an env that raised, hung past `worker.step_timeout_s` or broke the contract was
  rebuilt by its worker (a dead worker replaced by the watchdog); that step is a truncation
  (`done`, `TimeLimit.truncated` True, so PPO bootstraps it rather than scoring it an end) with
  `info["rlpipe_fault"]` = {kind, error_type, fingerprint, message} (rlpipe/vector/faults.py)
  and, as the worker has no end obs of a cut step, the obs this adapter last returned for the
  env as `terminal_observation`.
- `seed(s)` seeds env i with s + i at the next reset, as SB3's vectors do (rlpipe's own rule
  too); `set_options` with anything in it is refused at that reset (rlpipe.vector takes none).
- `get_attr` / `env_method` / `env_is_wrapped`: the envs live in worker processes that take
  actions, not calls. What is the same for every env and known here is answered
  (`ANSWERED`: spaces, render_mode, metadata, spec, np_random_seed; `env_is_wrapped` from the
  wrapper chain of one env built here as the workers build theirs; `render` and
  `get_wrapper_attr` by `env_method`); anything else, and every `set_attr`, raises
  `WorkerSideError` (an AttributeError, so `has_attr` says False) naming the attribute and
  what to do instead.
- `VecNormalize`, `VecMonitor`, `VecFrameStack` stack on it as on any VecEnv.
- On few cores, give torch fewer threads than cores (`torch.set_num_threads(1)` on 2): the
  workers need a core while the learner's threads hold them all (SB3's PPO to CartPole 475
  took 11x longer with torch's default on 2 cores: docs/benchmarks.md).
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np

try:
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv
except ImportError as exc:  # an extra, never required by the engine
    raise ImportError("rlpipe.vector.sb3 needs Stable-Baselines3: pip install rlpipe[sb3]") from exc

from rlpipe.vector.env import FAULT_FIELDS, RlpipeVectorEnv
from rlpipe.vector.spaces import GYM_TARGET

ANSWERED = ("observation_space", "action_space", "render_mode", "metadata", "spec", "np_random_seed")
METHODS = ("render", "get_wrapper_attr", "has_wrapper_attr")


class WorkerSideError(AttributeError):
    """An attribute or method of envs that live in rlpipe's worker processes."""


class RlpipeVecEnv(VecEnv):
    """SB3's VecEnv over an rlpipe.vector: `RlpipeVecEnv(env_id_or_type, num_envs, **make
    options)` (seed, overrides, run_dir: rlpipe.vector.make's), or `RlpipeVecEnv(vector)` over
    one made already (its batch_size is irrelevant here: step_wait waits for every env)."""

    def __init__(self, env: str | RlpipeVectorEnv, num_envs: int | None = None, **make_options):
        if isinstance(env, RlpipeVectorEnv):
            if num_envs is not None or make_options:
                raise TypeError("RlpipeVecEnv(vector) takes no num_envs or make options: the vector has them")
            self.vector = env
        else:
            if num_envs is None:
                raise TypeError("RlpipeVecEnv(env_id_or_type, num_envs, ...): num_envs is missing")
            self.vector = RlpipeVectorEnv(env, num_envs, copy=False, **make_options)
        vec = self.vector
        self._reference: dict | None = None  # facts of one env built here (see _reference_facts)
        self._actions_sent = False
        self._last_obs: Any = None  # the batch last returned: a cut env's terminal_observation
        super().__init__(vec.num_envs, vec.single_observation_space, vec.single_action_space)

    # -- stepping ---------------------------------------------------------------------------
    def reset(self):
        seeds = self._seeds
        seed = seeds[0]
        if seed is not None and any(s != seed + i for i, s in enumerate(seeds)):
            raise ValueError(f"rlpipe seeds env i with seed + i; seeds {seeds[:4]}... are not of that form")
        if any(self._options):
            self._reset_options()
            raise ValueError(
                "set_options: rlpipe.vector's reset takes no options (a reset rebuilds every env from "
                "its config); give the env's settings as overrides=['+env_mix.types.gym.make_kwargs.KEY=VALUE']"
            )
        obs, _ = self.vector.reset(seed=seed)
        self._reset_seeds()
        self._reset_options()
        self.reset_infos = [{} for _ in range(self.num_envs)]
        self._actions_sent = False
        self._last_obs = _copy_obs(obs)
        return self._last_obs

    def step_async(self, actions) -> None:
        if self._actions_sent:
            raise RuntimeError("step_async() twice without step_wait()")
        self.vector.send(np.asarray(actions))
        self._actions_sent = True

    def step_wait(self):
        if not self._actions_sent:
            raise RuntimeError("step_wait() without step_async()")
        self._actions_sent = False
        n = self.num_envs
        parts = []
        got = 0
        while got < n:  # one recv unless the vector was made with a smaller batch_size
            part = self.vector.recv()
            parts.append(part)
            got += len(part[4]["env_id"])
        if len(parts) == 1 and np.array_equal(parts[0][4]["env_id"], np.arange(n)):
            obs, rew, term, trunc, info = parts[0]
        else:
            obs, rew, term, trunc, info = _merge(parts, n)
        dones = term | trunc
        # every env's info says TimeLimit.truncated, as DummyVecEnv's and SubprocVecEnv's do
        infos: list[dict[str, Any]] = [{"TimeLimit.truncated": False} for _ in range(n)]
        ended = np.flatnonzero(dones)
        if ended.size:
            has_final = info.get("_final_obs")
            final = info.get("final_obs")
            fault = info.get("rlpipe_fault")
            has_fault = info.get("_rlpipe_fault")
            for i in ended.tolist():
                one = infos[i]
                one["TimeLimit.truncated"] = bool(trunc[i] and not term[i])
                if has_final is not None and has_final[i]:
                    one["terminal_observation"] = final[i]
                else:  # a cut step (a fault) has no end obs: the env's last obs the learner saw
                    one["terminal_observation"] = _row(self._last_obs, i)
                if has_fault is not None and has_fault[i]:
                    one["rlpipe_fault"] = {f: fault[f][i] for f in FAULT_FIELDS}
        self._last_obs = obs
        return obs, rew.astype(np.float32), dones, infos

    def close(self) -> None:
        self.vector.close()

    # -- rendering --------------------------------------------------------------------------
    def get_images(self):
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` to obtain images.",
                stacklevel=2,
            )
            return [None] * self.num_envs
        return list(self.vector.render())

    # -- what crosses processes -------------------------------------------------------------
    def get_attr(self, attr_name: str, indices=None) -> list[Any]:
        idx = list(self._get_indices(indices))
        vec = self.vector
        if attr_name == "observation_space":
            return [vec.single_observation_space] * len(idx)
        if attr_name == "action_space":
            return [vec.single_action_space] * len(idx)
        if attr_name == "render_mode":
            return [vec.render_mode] * len(idx)
        if attr_name == "np_random_seed":
            seeds = vec.np_random_seed
            return [seeds[i] for i in idx]
        if attr_name in ("metadata", "spec"):
            value = self._reference_facts()[attr_name]
            return [value] * len(idx)
        raise WorkerSideError(
            f"get_attr({attr_name!r}): rlpipe's envs live in its worker processes, which take actions, "
            f"not calls; the attributes answered are {', '.join(ANSWERED)}. An env's own state reaches the "
            "learner through its observation (or the vector's fault records and lifecycle log)."
        )

    def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
        raise WorkerSideError(
            f"set_attr({attr_name!r}): rlpipe's envs live in its worker processes, which take actions, "
            "not calls. Give the value to the env's constructor instead: "
            f"RlpipeVecEnv(id, n, overrides=['+env_mix.types.gym.make_kwargs.{attr_name}=VALUE'])."
        )

    def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> list[Any]:
        idx = list(self._get_indices(indices))
        if method_name == "render":
            images = self.get_images()
            return [images[i] for i in idx]
        if method_name == "get_wrapper_attr":
            return self.get_attr(*method_args, indices=idx, **method_kwargs)
        if method_name == "has_wrapper_attr":
            return [self.has_attr(*method_args)] * len(idx)
        raise WorkerSideError(
            f"env_method({method_name!r}): rlpipe's envs live in its worker processes, which take actions, "
            f"not calls; the methods answered are {', '.join(METHODS)}."
        )

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices=None) -> list[bool]:
        wrapped = any(issubclass(w, wrapper_class) for w in self._reference_facts()["wrappers"])
        return [wrapped] * len(list(self._get_indices(indices)))

    def _reference_facts(self) -> dict:
        """metadata, spec and the wrapper chain's classes of one env built here as every worker
        builds its envs (rlpipe/envs/classic.py make_gym: the same id, make_kwargs and
        wrappers), then closed. rlpipe's own types (conf/env/) are not Gymnasium envs: {}, None
        and no wrappers."""
        if self._reference is None:
            node = self.vector.spec_run.env_types[0].node
            facts: dict[str, Any] = {"metadata": {}, "spec": None, "wrappers": ()}
            if node.get("_target_") == GYM_TARGET:
                from rlpipe.envs.classic import make_gym

                env = make_gym(node["id"], node.get("make_kwargs"), node.get("wrappers"))
                try:
                    chain = []
                    e = env
                    while isinstance(e, gym.Wrapper):
                        chain.append(type(e))
                        e = e.env
                    facts = {"metadata": dict(env.metadata), "spec": env.spec, "wrappers": tuple(chain)}
                finally:
                    env.close()
            self._reference = facts
        return self._reference

    def __repr__(self) -> str:
        return f"RlpipeVecEnv({self.vector!r})"


def _copy_obs(obs):
    return {k: np.array(v) for k, v in obs.items()} if isinstance(obs, dict) else np.array(obs)


def _row(obs, i: int):
    return {k: np.array(v[i]) for k, v in obs.items()} if isinstance(obs, dict) else np.array(obs[i])


def _merge(parts, n: int):
    """recv's batches (each with its env ids) into one batch in env order."""
    first_obs = parts[0][0]
    if isinstance(first_obs, dict):
        obs = {k: np.empty((n,) + v.shape[1:], v.dtype) for k, v in first_obs.items()}
    else:
        obs = np.empty((n,) + first_obs.shape[1:], first_obs.dtype)
    rew = np.zeros(n, np.float64)
    term = np.zeros(n, np.bool_)
    trunc = np.zeros(n, np.bool_)
    info: dict[str, Any] = {"env_id": np.arange(n)}
    final = np.full(n, None, dtype=object)
    has_final = np.zeros(n, np.bool_)
    fault = {f: np.full(n, None, dtype=object) for f in FAULT_FIELDS}
    has_fault = np.zeros(n, np.bool_)
    for o, r, te, tr, inf in parts:
        ids = inf["env_id"]
        if isinstance(obs, dict):
            for k in obs:
                obs[k][ids] = o[k]
        else:
            obs[ids] = o
        rew[ids], term[ids], trunc[ids] = r, te, tr
        if "_final_obs" in inf:
            final[ids], has_final[ids] = inf["final_obs"], inf["_final_obs"]
        if "_rlpipe_fault" in inf:
            has_fault[ids] = inf["_rlpipe_fault"]
            for f in FAULT_FIELDS:
                fault[f][ids] = inf["rlpipe_fault"][f]
    info["final_obs"], info["_final_obs"] = final, has_final
    info["rlpipe_fault"], info["_rlpipe_fault"] = fault, has_fault
    return obs, rew, term, trunc, info


__all__ = ["ANSWERED", "METHODS", "RlpipeVecEnv", "WorkerSideError"]
