"""`RlpipeVectorEnv`: a `gymnasium.vector.VectorEnv` whose envs run in rlpipe's workers.

Sync form: `reset` / `step` over every env, as SyncVectorEnv. Async form (EnvPool's):
`async_reset()`, then `recv()` returns the envs whose slices are ready (at least
`batch_size`, whole slices, with their ids in `info["env_id"]`), and `send(actions, env_ids)`
hands those envs their next actions; the learner never waits for the slowest worker.

Autoreset: rlpipe's workers reset an ended env within the step that ended it
(rlpipe/worker/envtable.py), so this vector is `AutoresetMode.SAME_STEP`, as
`SyncVectorEnv(..., autoreset_mode=AutoresetMode.SAME_STEP)`: the step that ends an episode
returns its reward and end flags with the next episode's first obs, and the end obs in
`info["final_obs"]` (an object array, None for the other envs; `info["_final_obs"]` masks it;
`info["final_info"]` is an empty dict under its mask: the worker does not carry env infos).

Faults are data: an env that raised, broke the contract or ran past `worker.step_timeout_s`
was rebuilt by its worker; that step reports it truncated, with `info["rlpipe_fault"]`
(rlpipe/vector/faults.py) under the mask `info["_rlpipe_fault"]`, and no final obs. A worker
that died or fell silent is replaced (the fleet's watchdog); each of its envs reports
truncated with kind `worker_restart`. Only wrong calls raise.

Copies: obs are gathered from the board (seqlock-checked, without the GIL) into one buffer
per board key, owned by the vector; the returned batch views those buffers (`copy=False`) or
is a copy of them (`copy=True`, the default, as Gymnasium's). `recv` returns a copy of its rows.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rlpipe.config_checks import SEED_LIMIT
from rlpipe.vector import lifetime
from rlpipe.vector.compose import vector_spec
from rlpipe.vector.engine import Engine
from rlpipe.vector.faults import WORKER_RESTART, fault_info
from rlpipe.vector.spaces import SpaceMap

FAULT_FIELDS = ("kind", "error_type", "fingerprint", "message")
EPOCH_SEED_STRIDE = 1_000_000_007  # seed offset of each reset(seed=None); rebuilds use 1_000_003


class ClosedError(RuntimeError):
    """A call on a vector after close()."""


class RlpipeVectorEnv(VectorEnv):
    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
    # also as the attribute SyncVectorEnv and AsyncVectorEnv have: TorchRL's GymWrapper (0.14)
    # reads `env.autoreset_mode`, not the metadata, to take a Gymnasium vector as it is
    autoreset_mode = AutoresetMode.SAME_STEP

    def __init__(
        self,
        env_id_or_type: str,
        num_envs: int,
        *,
        seed: int | None = None,
        overrides: list[str] | tuple = (),
        batch_size: int | None = None,
        copy: bool = True,
        episode_info: bool = False,
        run_dir: str | None = None,
    ):
        self.spec_run = vector_spec(env_id_or_type, num_envs, seed, list(overrides))
        self.env_id = env_id_or_type
        self.num_envs = num_envs
        self.copy = copy
        self.episode_info = episode_info  # info["episode"] = {"r", "l"} as RecordEpisodeStatistics
        self.batch_size = num_envs if batch_size is None else int(batch_size)
        if not 1 <= self.batch_size <= num_envs:
            raise ValueError(f"batch_size must be in [1, num_envs={num_envs}], got {batch_size!r}")
        self.metadata = dict(type(self).metadata)
        self.engine = Engine(self.spec_run, run_dir)
        self.closed = False
        self._started = False
        self._seed = self.spec_run.run.seed  # conf's run.seed unless `seed` is given
        self._epoch = 0  # resets without a seed since the last seeded one
        lifetime.register(self)
        try:
            plan = self.engine.describe()
            self.spaces = SpaceMap(self.spec_run.env_types[0].node, plan.specs[0])
            self.single_observation_space = self.spaces.observation_space
            self.single_action_space = self.spaces.action_space
            self.observation_space = batch_space(self.single_observation_space, num_envs)
            self.action_space = batch_space(self.single_action_space, num_envs)
            self._bufs = {k.name: np.zeros((num_envs,) + k.shape, dtype=k.dtype) for k in plan.obs_keys}
            self._keys = [k.name for k in plan.obs_keys]
            # An env type with an rgb obs renders it into every step (the board's frame)
            self.render_mode = "rgb_array" if "rgb" in self.spaces.keys else None
            self._obs = self.spaces.obs_views(self._bufs)
            self._disc = np.zeros(num_envs, dtype=np.int32)
            cont_dim = plan.actions.cont_dim
            self._cont = np.zeros((num_envs, cont_dim), dtype=np.float32) if cont_dim else None
            self.slice_of_env = np.zeros(num_envs, dtype=np.int64)
        except BaseException:
            self.close()
            raise
        # What finished episodes returned, as Gymnasium's RecordEpisodeStatistics keeps them.
        self.return_queue: collections.deque = collections.deque(maxlen=100)
        self.length_queue: collections.deque = collections.deque(maxlen=100)
        self.episode_returns: list[float] = []  # finished episodes' returns, in order (the first million)
        self.fault_count = 0

    # -- properties Gymnasium's vectors have ----------------------------------------------
    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """Each env's seed, as SyncVectorEnv's: env i's first reset is seeded seed + i (the
        worker seeds env id i with run.seed + i, rlpipe/worker/envtable.py)."""
        return tuple(self._seed + i for i in range(self.num_envs))

    @property
    def run_dir(self):
        """The run dir (lifecycle.sqlite, errors_top10.md); a temp dir removed at close unless given."""
        return self.engine.run_dir

    def __repr__(self) -> str:
        return f"RlpipeVectorEnv({self.env_id}, num_envs={self.num_envs})"

    # -- reset ------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Fresh envs: the first reset starts the workers; later ones replace them with a new
        generation (every env rebuilt; `seed` None reseeds from the vector's own stream)."""
        self._start(seed, options)
        self.engine.wait(lambda: not self.engine.flight.any())
        self._gather(np.arange(self.engine.n_slots))
        obs = self._obs
        return (
            obs.copy() if isinstance(obs, np.ndarray) else {k: v.copy() for k, v in obs.items()}
        ) if self.copy else obs, {}

    def _start(self, seed, options) -> None:
        self._check_open()
        if options:
            raise ValueError(f"reset options are not supported by rlpipe.vector, got {sorted(options)}")
        if seed is not None and not isinstance(seed, (int, np.integer)):
            raise TypeError(
                f"seed must be an int or None, got {type(seed).__name__} "
                "(rlpipe seeds env i with seed + i, as SyncVectorEnv does for an int)"
            )
        if seed is not None and not 0 <= seed < SEED_LIMIT:
            raise ValueError(f"seed must be an int from 0 to {SEED_LIMIT - 1} or None, got {seed} (run.seed's range)")
        engine = self.engine
        if seed is not None:
            self._seed, self._epoch = int(seed), 0
        elif self._started:
            # reset(seed=None) after the first: new episodes, not the first ones again, while
            # np_random_seed stays the seed given (as a SyncVectorEnv's envs keep theirs)
            self._epoch += 1
        # what Fleet.worker_spec hands the next workers (env i is seeded run.seed + i)
        engine.spec.run.seed = self._seed + EPOCH_SEED_STRIDE * self._epoch
        if not self._started:
            self._started = True
            engine.start()
            self.slice_of_env[:] = np.repeat(np.arange(engine.n_slots), engine.slot_envs)
        else:
            engine.restart_all()
        engine.faults.forget(range(self.num_envs))

    def async_reset(self, *, seed: int | None = None, options: dict | None = None) -> None:
        """Fresh envs as `reset`, without waiting: `recv` hands them out as their slices come up."""
        self._start(seed, options)

    # -- step -------------------------------------------------------------------------------
    def step(self, actions):
        self._check_open()
        engine = self.engine
        if not self._started:
            raise RuntimeError("step() before reset(): call reset() first")
        if not engine.held.all():
            raise RuntimeError("step() while envs are out with send(): recv() them first, or use send/recv throughout")
        self.spaces.encode(actions, self.num_envs, self._disc, self._cont, slice(None))
        slots = np.arange(engine.n_slots)
        engine.send(slots, self._disc, self._cont)
        engine.wait(lambda: not engine.flight.any())
        rew, term, trunc, info = self._results(slots, np.arange(self.num_envs))
        obs = self._obs
        if self.copy:
            obs = obs.copy() if isinstance(obs, np.ndarray) else {k: v.copy() for k, v in obs.items()}
        return obs, rew, term, trunc, info

    # -- async form -------------------------------------------------------------------------
    def send(self, actions, env_ids=None) -> None:
        """Actions for the envs `recv` handed out (`env_ids`: all of them at once, or whole
        slices of them; None: every env, which must all be held)."""
        self._check_open()
        engine = self.engine
        if env_ids is None:
            ids = np.arange(self.num_envs)
        else:
            ids = np.asarray(env_ids, dtype=np.int64).reshape(-1)
            if ids.size and (ids.min() < 0 or ids.max() >= self.num_envs):
                raise ValueError(f"env ids must be in [0, {self.num_envs}), got {ids.min()}..{ids.max()}")
        slots = np.unique(self.slice_of_env[ids])
        covered = int(engine.slot_envs[slots].sum())
        if covered != len(ids) or len(np.unique(ids)) != len(ids):
            raise ValueError("send: env_ids must be whole slices as recv() handed them out, each once")
        not_held = int((~engine.held[slots]).sum())
        if not_held:
            raise RuntimeError(
                f"send: envs of {not_held} slice(s) are not waiting for actions "
                "(already sent, or not yet received with recv())"
            )
        self.spaces.encode(actions, len(ids), self._disc, self._cont, ids)
        engine.send(slots, self._disc, self._cont)

    def recv(self):
        """Whichever envs are ready, at least `batch_size` of them (whole slices):
        (obs, rewards, terminations, truncations, info) with their ids in info["env_id"]."""
        self._check_open()
        engine = self.engine
        if not self._started:
            raise RuntimeError("recv() before async_reset() or reset()")
        out = ~engine.held  # in flight or arrived
        if not out.any():
            raise RuntimeError("recv() with nothing sent: send() actions first")
        want = min(self.batch_size, engine.envs_in(out))
        engine.wait(lambda: engine.envs_in(engine.arrived) >= want)
        slots = np.flatnonzero(engine.arrived)  # ascending slots: ascending env ids
        ids = engine.rows_of(slots)
        rew, term, trunc, info = self._results(slots, ids)
        info["env_id"] = ids
        obs = self._obs
        obs = obs[ids] if isinstance(obs, np.ndarray) else {k: v[ids] for k, v in obs.items()}
        return obs, rew, term, trunc, info

    # -- results ----------------------------------------------------------------------------
    def _gather(self, slots):
        """The slices' obs into the vector's buffers, their results and final obs beside them:
        one gather for all of them (an rlpipe.protocol.Round, rows in the order of `slots`),
        the slices handed out."""
        rnd = self.engine.recv(slots)
        for k in self._keys:
            self._bufs[k][rnd.rows] = rnd.obs[k]
        return rnd

    def _results(self, slots, ids: np.ndarray):
        """Obs into the buffers; rewards, flags and infos of the slices `slots` (rows `ids`, in
        the same order), handed out."""
        engine = self.engine
        m = len(ids)
        rnd = self._gather(slots)
        res = rnd.results
        restarted = np.repeat(rnd.restarted, rnd.counts)
        stepped = rnd.stepped & ~restarted
        rew = np.where(stepped, res["reward_raw"], 0.0).astype(np.float64)
        term = stepped & res["terminated"].astype(bool)
        trunc = restarted | (stepped & res["truncated"].astype(bool))
        ep_len = np.where(stepped, res["ep_len"], 0).astype(np.int64)
        ep_ret = np.where(stepped, res["ep_return"], 0.0).astype(np.float64)
        final_obs = np.full(m, None, dtype=object)
        has_final = np.zeros(m, dtype=np.bool_)
        for i, j in enumerate(rnd.final_rows.tolist()):
            if stepped[j]:
                final_obs[j] = self.spaces.final_obs({k: rnd.final_obs[k][i] for k in self.spaces.keys})
                has_final[j] = True
        faults: dict[int, dict] = {}
        for j in np.flatnonzero(restarted).tolist():
            faults[j] = WORKER_RESTART
        if restarted.any():
            engine.faults.forget(ids[restarted].tolist())
        worker = np.repeat(engine.slot_worker[rnd.slots], rnd.counts)
        for j in np.flatnonzero(trunc & ~term & (ep_len == 0) & stepped).tolist():
            faults[j] = fault_info(engine.faults.take(int(ids[j]), int(worker[j])))
        info: dict[str, Any] = {}
        ended = (term | trunc) & (ep_len > 0)  # a cut step (a fault) has no end obs
        if ended.any():
            info["final_obs"], info["_final_obs"] = final_obs, has_final
            info["final_info"], info["_final_info"] = {}, has_final.copy()
            rets = ep_ret[ended]
            self.return_queue.extend(rets.tolist())
            self.length_queue.extend(ep_len[ended].tolist())
            if len(self.episode_returns) < 1_000_000:
                self.episode_returns.extend(rets.tolist())
            if self.episode_info:
                info["episode"] = {"r": np.where(ended, ep_ret, 0.0), "l": np.where(ended, ep_len, 0)}
                info["_episode"] = ended
        if faults:
            self.fault_count += len(faults)
            mask = np.zeros(m, dtype=np.bool_)
            mask[list(faults)] = True
            block: dict[str, Any] = {}
            for f in FAULT_FIELDS:
                col = np.full(m, None, dtype=object)
                for j, fault in faults.items():
                    col[j] = fault[f]
                block[f], block[f"_{f}"] = col, mask.copy()
            info["rlpipe_fault"], info["_rlpipe_fault"] = block, mask
        return rew, term, trunc, info

    def render(self):
        """The latest rgb frame of every env, for types that render one into their obs (the
        board's rgb rows, as the last step or reset gathered them); None for the others (their
        workers render nothing)."""
        self._check_open()
        if self.render_mode is None:
            return None
        rgb = self.spaces.obs_views(self._bufs)
        rgb = rgb["rgb"] if isinstance(rgb, dict) else rgb
        return tuple(np.array(frame) for frame in rgb)

    # -- close ------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError(f"{self!r} is closed")

    def close_extras(self, **kwargs) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()
        lifetime.unregister(self)

    def close(self, **kwargs) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_extras(**kwargs)

    def __del__(self):
        if not getattr(self, "closed", True):
            self.close()


def make(env_id_or_type: str, num_envs: int, **options) -> RlpipeVectorEnv:
    """A vector of `num_envs` envs of one Gymnasium id (`"CartPole-v1"`, `"module:Id"`) or one
    of rlpipe's env types (a node of conf/env/: `"cartpole"`, `"faulty"`, ...), stepped by
    rlpipe's workers. Options: seed, overrides (Hydra overrides of conf/, e.g.
    ["worker.step_timeout_s=2", "groups.size=35"]), batch_size (recv's minimum), copy,
    episode_info, run_dir (kept after close; default a temp dir that close removes)."""
    return RlpipeVectorEnv(env_id_or_type, num_envs, **options)


__all__ = ["ClosedError", "RlpipeVectorEnv", "make"]
