"""The figures behind docs/scale-out.md, measured on this machine: per policy (the cartpole mix,
the 12-type seed12 mix, the rgb-only images mix) its parameter count and the bytes one gradient
all-reduce moves, the time of a gloo all-reduce of that size between two local ranks, the
time of one PPO update on one rank, and the memory budget (rlpipe.learner.budget) per env.

    python benchmarks/dist_allreduce.py            # prints one JSON object
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hydra import compose, initialize_config_dir  # noqa: E402

from rlpipe.config import conf_dir, register_schema, run_spec  # noqa: E402

MIXES = {"cartpole": ["env_mix=cartpole"], "seed12": ["env_mix=seed12"], "images": ["env_mix=images"]}
REPEATS = 20


def _spec(overrides):
    register_schema()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return run_spec(compose(config_name="config", overrides=["env_count=1000", *overrides]))


def _policy(spec):
    from rlpipe.envs.registry import plan_mix
    from rlpipe.learner.policy import Policy

    plan = plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)
    lc = spec.learner
    return plan, Policy(plan, plan.obs_keys, lc.hidden, lc.cnn_channels, lc.cnn_out)


def _allreduce_rank(rank: int, init: str, sizes: list[int], out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    times = {}
    for n in sizes:
        t = torch.ones(n)
        dist.all_reduce(t)  # warm the connection
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(REPEATS):
            dist.all_reduce(t)
        times[n] = (time.perf_counter() - t0) / REPEATS
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def _update_seconds(spec, plan, policy) -> float:
    """One PPO update (epochs x minibatches of the default learner) on update_envs x T samples."""
    from rlpipe.learner.ppo import ppo_update

    lc = spec.learner
    n = lc.update_envs * lc.rollout_len
    g = torch.Generator().manual_seed(0)
    obs = {
        k.name: (
            torch.randint(0, 255, (n,) + k.shape, generator=g, dtype=torch.uint8)
            if k.dtype == "uint8"
            else torch.randn((n,) + k.shape, generator=g)
        )
        for k in plan.obs_keys
    }
    types = torch.randint(0, len(plan.names), (n,), generator=g)
    batch = {
        "obs": obs,
        "types": types,
        "a_disc": torch.zeros(n, dtype=torch.int64),
        "a_cont": torch.zeros(n, max(plan.actions.cont_dim, 1)),
        "logp": torch.full((n,), -0.7),
        "value": torch.zeros(n),
        "adv": torch.randn(n, generator=g),
        "ret": torch.randn(n, generator=g),
    }
    opt = torch.optim.Adam(policy.parameters(), lr=1e-4)
    ppo_update(policy, opt, batch, lc, g)  # first call builds lazily-initialized pieces
    t0 = time.perf_counter()
    ppo_update(policy, opt, batch, lc, g)
    return time.perf_counter() - t0


def main() -> None:
    import torch.multiprocessing as tmp_mp

    from rlpipe.learner.budget import NOT_BYTES, memory_budget
    from rlpipe.supervisor.workers import group_ranges

    torch.set_num_threads(1)
    result = {"cores": len(os.sched_getaffinity(0)), "torch": torch.__version__, "mixes": {}}
    sizes = []
    for name, overrides in MIXES.items():
        spec = _spec(overrides)
        plan, policy = _policy(spec)
        params = sum(p.numel() for p in policy.parameters())
        budget = memory_budget(spec, plan, group_ranges(spec.env_count, spec.groups.size))
        per_env = sum(v for k, v in budget.items() if k not in NOT_BYTES) / spec.env_count
        lc = spec.learner
        samples = lc.update_envs * lc.rollout_len
        minibatches = -(-samples // lc.minibatch_size)
        result["mixes"][name] = {
            "params": params,
            "allreduce_bytes": 4 * (params + len(list(policy.parameters())) + 1),
            "allreduces_per_update": lc.epochs * minibatches + 2,
            "update_samples": samples,
            "update_s": round(_update_seconds(spec, plan, policy), 4),
            "obs_bytes_per_step": budget["obs_bytes_per_step"],
            "budget_bytes_per_env": round(per_env),
        }
        sizes.append(params + len(list(policy.parameters())) + 1)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "times.json"
        tmp_mp.start_processes(
            _allreduce_rank, args=(str(Path(d) / "init"), sizes, str(out)), nprocs=2, join=True, start_method="fork"
        )
        times = json.loads(out.read_text())
    for m, n in zip(result["mixes"].values(), sizes):
        m["gloo_allreduce_s_2ranks_local"] = round(times[str(n)], 6)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
