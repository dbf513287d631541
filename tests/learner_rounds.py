"""A CentralLearner of 8 classic-control envs, rounds for it as the slot table makes them and
rollouts ready for its update, with no engine around it: tests/device_checks.py serves and
trains them on an emulated device, tests/test_gpu_overlap.py on a GPU."""

from __future__ import annotations

import numpy as np
import torch

from conftest import compose_cfg, load_benchmark
from rlpipe.config import run_spec
from rlpipe.envs.registry import plan_mix
from rlpipe.learner import central
from rlpipe.learner.policy import Policy
from rlpipe.protocol import Round


def learner_on(monkeypatch, device, *overrides: str) -> central.CentralLearner:
    monkeypatch.setattr(central, "pick_device", lambda name: torch.device(device))
    spec = run_spec(compose_cfg(["env_mix=classic", "env_count=8", "buffer=lowdim", "scaling=on", *overrides]))
    return central.CentralLearner(spec, plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing))


def round_of(learner, seq: int, seed: int) -> Round:
    """One round of the learner's 8 envs as one slot, some episodes ended by a time limit."""
    rng = np.random.default_rng(seed)
    n, plan = 8, learner.plan
    rows = np.arange(n)
    final_rows = np.array([1, 5]) if seq else np.zeros(0, dtype=np.int64)
    results = {
        "reward": rng.normal(size=n).astype(np.float32),
        "terminated": np.zeros(n, dtype=np.uint8),
        "truncated": np.isin(rows, final_rows).astype(np.uint8),
        "step_ms": np.ones(n, dtype=np.float32),
        "ep_return": np.ones(n, dtype=np.float32),
        "ep_len": np.isin(rows, final_rows).astype(np.int32),
        "score": np.ones(n, dtype=np.float32),
        "exec_discrete": np.zeros(n, dtype=np.int32),
        "exec_continuous": np.zeros((n, max(plan.actions.cont_dim, 1)), dtype=np.float32),
        "behaviour_logp": np.zeros(n, dtype=np.float32),
    }
    obs = {k.name: rng.normal(size=(n,) + k.shape).astype(k.dtype) for k in plan.obs_keys}
    return Round(
        slots=np.array([0]),
        seqs=np.array([seq]),
        starts=np.array([0]),
        counts=np.array([n]),
        rows=rows,
        types=plan.env_type[:n].astype(np.int64),
        obs=obs,
        results=results,
        stepped=np.full(n, seq > 0),
        final_rows=final_rows,
        final_obs={k: v[final_rows] for k, v in obs.items()},
        torn_retries=0,
    )


def ready_blocks(learner, seed: int) -> None:
    """Random rollouts ready to train on, as the serving side queues them (built by
    benchmarks/ppo_update.py's `stage_blocks` from a policy of the learner's shape)."""
    lc, plan = learner.cfg, learner.plan
    policy = Policy(plan, plan.obs_keys, lc.hidden, lc.cnn_channels, lc.cnn_out)
    blocks, types = load_benchmark("ppo_update").stage_blocks(learner.spec, plan, policy, 4, seed=seed)
    learner.ready_blocks, learner.ready_types = blocks, types
    learner.ready_samples = sum(len(b["adv"]) for b in blocks)
