"""Whole episodes of one env type under a policy (trained, or the probe's untrained one), laid out as
the board lays them out.

The policy was trained on board rows, so its input here must be those rows exactly: one array
per key of the run's board (`plan.obs_keys`, in that order) whose first `prod(shape)` entries
hold the env's obs for that key flattened, and zeros after it and in every key the type does
not produce (what `EnvTable` does when it copies an obs dict into its staging rows). Actions
go back the way `EnvTable.actions` hands them to an env: an int for a discrete type, the
first `action_n` entries of the continuous head (float32) for a continuous one.

The `n` episodes of a type run in lockstep, one env each, so each policy call is one batch.
Each env is built, reset, stepped and closed through the env harness (rlpipe/envs/harness.py),
each call under its `AlarmDeadline`. An env that raises, breaks the contract, or runs past
`step_timeout_s` or `max_steps` has its episode cut: it is counted, not averaged; so is every
episode still running when `budget_s` (the whole call's time, evaluation during training) runs
out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from rlpipe.envs import harness
from rlpipe.envs.contract import CONTINUOUS
from rlpipe.envs.registry import MixPlan


@dataclass
class Episodes:
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    cut: int = 0  # episodes cut by an exception, a contract break or a limit

    def stats(self) -> dict:
        r = np.asarray(self.returns, dtype=np.float64)
        some = len(r) > 0
        return {
            "mean": float(r.mean()) if some else None,
            "std": float(r.std()) if some else None,
            "min": float(r.min()) if some else None,
            "max": float(r.max()) if some else None,
            "episodes": int(len(r)),
            "cut": int(self.cut),
            "mean_length": float(np.mean(self.lengths)) if some else None,
        }


class BoardLayout:
    """Obs dicts of one type -> the policy's input batch, as board rows."""

    def __init__(self, plan: MixPlan, type_index: int):
        self.keys = plan.obs_keys
        spec = plan.specs[type_index]
        self.writes = [(k.name, int(np.prod(spec.obs[k.name][0]))) for k in self.keys if k.name in spec.obs]
        self.type_index = type_index

    def batch(self, obs: list[dict]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        n = len(obs)
        rows = {k.name: np.zeros((n,) + k.shape, dtype=k.dtype) for k in self.keys}
        for i, o in enumerate(obs):
            for name, length in self.writes:
                rows[name][i].reshape(-1)[:length] = o[name].reshape(-1)
        types = torch.full((n,), self.type_index, dtype=torch.int64)
        return {k: torch.from_numpy(v) for k, v in rows.items()}, types


def env_action(kind: str, n: int, a_disc: int, a_cont: np.ndarray):
    """One env's action from the policy's two heads, as EnvTable.actions converts it."""
    if kind == CONTINUOUS:
        return np.ascontiguousarray(a_cont[:n], dtype=np.float32)
    return int(a_disc)


def play(
    policy,
    plan: MixPlan,
    type_index: int,
    factory,
    n: int,
    deterministic: bool,
    seed: int,
    max_steps: int,
    step_timeout_s: float | None = None,
    on_episode: Callable[[], None] | None = None,
    observe: Callable[[object, dict], None] | None = None,
    budget_s: float | None = None,
) -> Episodes:
    """`n` episodes of type `type_index`, env i built as `factory(env_id=i, seed=seed + i)`.
    `observe(env, obs)` is called for env 0 after its reset and after each of its steps (the
    video recorder); `on_episode()` after each episode, finished or cut. Past `budget_s`
    seconds the episodes not yet finished are cut."""
    spec = plan.specs[type_index]
    layout = BoardLayout(plan, type_index)
    out = Episodes()
    envs: list = []
    obs: list[dict | None] = []
    steps, totals = [0] * n, [0.0] * n
    deadline = time.monotonic() + budget_s if budget_s is not None else math.inf
    # a call that hangs is cut at its timeout, or where the budget ends
    alarm = harness.AlarmDeadline(step_timeout_s, deadline if budget_s is not None else None)

    def end(i: int, finished: float | None) -> None:
        if finished is None:
            out.cut += 1
        else:
            out.returns.append(finished)
            out.lengths.append(steps[i])
        obs[i] = None
        harness.close(envs[i], i)
        envs[i] = None
        if on_episode is not None:
            on_episode()

    try:
        for i in range(n):
            envs.append(None)
            obs.append(None)
            if time.monotonic() >= deadline:
                end(i, None)
                continue
            try:
                envs[i] = harness.build(factory, i, seed + i, alarm)
                first = harness.reset(spec, envs[i], i, alarm)
                obs[i] = first
                if i == 0 and observe is not None:
                    observe(envs[i], first)
            except harness.CUTS:  # a broken build or reset cuts that episode
                end(i, None)
        while True:
            live = [i for i in range(n) if obs[i] is not None]
            if not live:
                break
            if time.monotonic() >= deadline:
                for i in live:
                    end(i, None)
                break
            batch, types = layout.batch([obs[i] for i in live])
            a_disc, a_cont, _logp, _value = policy.act(batch, types, deterministic=deterministic)
            a_disc, a_cont = a_disc.numpy(), a_cont.numpy()
            for j, i in enumerate(live):
                action = env_action(spec.action_kind, spec.action_n, a_disc[j], a_cont[j])
                try:
                    o, reward, terminated, truncated = harness.step(spec, envs[i], i, action, alarm)
                except harness.CUTS:
                    end(i, None)
                    continue
                steps[i] += 1
                totals[i] += reward
                obs[i] = o
                if i == 0 and observe is not None:
                    observe(envs[i], o)
                if terminated or truncated:
                    end(i, totals[i] if math.isfinite(totals[i]) else None)
                elif steps[i] >= max_steps:
                    end(i, None)
    finally:
        for i, env in enumerate(envs):
            harness.close(env, i)
        alarm.close()
    return out
