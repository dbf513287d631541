"""Memory the learner and the board will take, computed from the run's board (the plan's obs
keys: under buffer=auto already grown to the mix) and env count before anything is allocated,
so a config that cannot fit is refused with the arithmetic.

The rollouts are counted as rlpipe/learner/rollout_store.py keeps them: an obs key only for the
envs whose type produces it (at day4 the rgb key is a quarter of the envs and most of the
bytes). Counting every key for every env asked seed12 at rollout 128 for 10.9 GiB of rollouts
where the driver's whole peak was 2.7 GB (docs/multitask.md, "The memory a longer rollout
costs")."""

from __future__ import annotations

import numpy as np
import psutil

from rlpipe.config import ConfigError, RunSpec
from rlpipe.envs.registry import MixPlan
from rlpipe.learner.backlog import waiting_batches
from rlpipe.shm.layout import WorkerLayout

USABLE_FRACTION = 0.8  # of physical memory: the OS, page cache and env engines need the rest
GIB = 2**30


def _fmt(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def memory_budget(spec: RunSpec, plan: MixPlan, groups: list[tuple[int, int]]) -> dict:
    """Bytes by part: board (all worker segments), rollout storage (per-slice buffers plus
    the finished blocks waiting for an update), the update batch, the inference batch."""
    obs = sum(k.nbytes for k in plan.obs_keys)
    cont = max(plan.actions.cont_dim, 1)
    # per stored transition: the obs keys its env's type produces + discrete action (8) +
    # continuous action + logp, value, reward, weight (4 each) + done flag (1)
    stored_obs = stored_obs_bytes(plan)
    step = stored_obs + 8 + 4 * cont + 4 * 4 + 1  # per env
    T = spec.learner.rollout_len
    n = spec.env_count
    update_envs = min(spec.learner.update_envs, n)
    mean_step = float(step.mean())  # an update's env-rollouts come in the mix's proportions
    waiting = waiting_batches(spec.learner.backlog)  # batches of ready blocks (rlpipe/learner/backlog.py)
    return {
        "board": sum(WorkerLayout.build(hi - lo, plan.obs_keys, plan.actions.cont_dim).size for lo, hi in groups),
        "rollouts": int(T * step.sum()),  # the [T, env] arrays, every env
        "ready_blocks": int(waiting * update_envs * T * mean_step),  # finished blocks waiting for an update
        "update_batch": int(update_envs * T * (mean_step + 8)),  # + advantages and returns
        "inference_batch": n * obs,  # the round's gather holds every key for every row
        "obs_bytes_per_step": obs,
        "stored_obs_bytes_per_step": int(stored_obs.mean()),  # per env, in the mix's proportions
    }


def stored_obs_bytes(plan: MixPlan) -> np.ndarray:
    """Per env: the bytes of one step's obs as the rollout store keeps it (its type's keys)."""
    by_type = np.array([sum(k.nbytes for k in plan.obs_keys if k.name in spec.obs) for spec in plan.specs])
    return by_type[plan.env_type.astype(np.int64)]


NOT_BYTES = ("obs_bytes_per_step", "stored_obs_bytes_per_step")


def check_memory_budget(
    spec: RunSpec, plan: MixPlan, groups: list[tuple[int, int]], total_bytes: int | None = None
) -> dict:
    budget = memory_budget(spec, plan, groups)
    need = sum(v for k, v in budget.items() if k not in NOT_BYTES)
    total = total_bytes if total_bytes is not None else psutil.virtual_memory().total
    usable = int(total * USABLE_FRACTION)
    if need > usable:
        keys = ", ".join(f"{k.name} {list(k.shape)} {k.dtype}" for k in plan.obs_keys)
        if spec.buffer.sizing == "auto":  # say where shapes nobody wrote down come from
            keys += "; buffer=auto sized these to the mix"
        T, n = spec.learner.rollout_len, spec.env_count
        raise ConfigError(
            f"This config needs {_fmt(need)} for the board and the learner's rollouts, more than "
            f"the {_fmt(usable)} usable here ({USABLE_FRACTION:.0%} of {_fmt(total)}): rollout storage "
            f"env_count {n} x learner.rollout_len {T} x {budget['stored_obs_bytes_per_step']:,} B of obs per "
            f"step ({keys}; a key kept only for the envs whose type produces it, on average) = "
            f"{_fmt(budget['rollouts'])}, plus {_fmt(budget['ready_blocks'])} of "
            f"finished rollouts and {_fmt(budget['update_batch'])} of update batch "
            f"(learner.update_envs {min(spec.learner.update_envs, n)}), the board "
            f"{_fmt(budget['board'])} and the inference batch {_fmt(budget['inference_batch'])}. "
            f"Lower env_count, learner.rollout_len or learner.update_envs, or pick smaller obs "
            f"(buffer=small, buffer.keys.rgb.dtype=uint8)."
        )
    return budget
