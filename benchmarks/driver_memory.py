"""What the driver's memory is made of, at a stage's size (default day4, 7,000 envs).

    python benchmarks/driver_memory.py [overrides...]

Builds, in this one process and in the driver's order, what the driver holds, and reads this
process's RSS (smaps_rollup) after each part, so every row is a measured increment, not an
estimate: the interpreter with numpy; torch and the env modules imported; the learner
(policy, its acting copy, the inference batch buffers, written as gathers write them); every
slice's rollout storage filled for T steps as `serve` fills it (each key kept only for the envs
whose type produces it); one PPO update on a full
batch of those rollouts (its peak: the concatenated batch, the policy's activations and
gradients, Adam's moments). Beside them the nominal bytes of each part from the layout and
the config, and the board: the worker segments the driver maps, whose pages count in its
RSS as they are touched (nominal size; not allocated here: no workers run).

Nothing is timed. The figures are the driver's fixed cost at that size; whatever a soak
sees above them is what the run adds while it goes.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MB = 2**20


def rss_mb() -> float:
    with open("/proc/self/smaps_rollup", "rb") as f:
        for line in f:
            if line.startswith(b"Rss:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    import numpy as np

    rows: list[tuple[str, float, float | None]] = []  # (part, measured MB, nominal MB)
    last = rss_mb()
    rows.append(("interpreter, numpy", last, None))

    def mark(part: str, nominal_bytes: float | None = None) -> None:
        nonlocal last
        now = rss_mb()
        rows.append((part, now - last, nominal_bytes / MB if nominal_bytes is not None else None))
        last = now

    overrides = sys.argv[1:] or ["+stage=day4", "env_count=7000"]
    import torch
    from hydra import compose, initialize_config_dir

    from rlpipe.config import conf_dir, register_schema, run_spec
    from rlpipe.envs.registry import plan_mix, preload_modules
    from rlpipe.learner.central import CentralLearner
    from rlpipe.learner.rollout import SliceRollout, key_rows
    from rlpipe.protocol import slice_bounds
    from rlpipe.shm.layout import WorkerLayout
    from rlpipe.supervisor.workers import group_ranges

    register_schema()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        spec = run_spec(compose(config_name="config", overrides=overrides))
    for module in preload_modules(spec.env_types):
        __import__(module)
    torch.set_num_threads(spec.learner.torch_threads)
    plan = plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)
    mark("torch, the env modules, the mix planned")

    n, lc = spec.env_count, spec.learner
    row_bytes = sum(k.nbytes for k in plan.obs_keys)
    learner = CentralLearner(spec, plan)
    for buf in learner.obs_buf.values():
        buf.fill_(1)  # the gathers write every row
    params = sum(p.numel() * p.element_size() for p in learner.policy.parameters())
    mark("learner: policy, acting copy, inference batch", 2 * params + n * row_bytes)

    ranges = group_ranges(n, spec.groups.size)
    layouts = [WorkerLayout.build(hi - lo, plan.obs_keys, plan.actions.cont_dim) for lo, hi in ranges]
    board_bytes = sum(lay.size for lay in layouts)

    T = lc.rollout_len
    rollouts = []
    for lo, hi in ranges:
        for s_lo, s_hi in slice_bounds(hi - lo, spec.worker.slices):
            k = s_hi - s_lo
            slice_types = plan.env_type[lo + s_lo : lo + s_hi].astype(np.int64)
            ro = SliceRollout(
                k,
                T,
                plan.obs_keys,
                plan.actions.cont_dim,
                spec.scaling.enabled,
                key_rows=key_rows(learner.plan, slice_types),
            )
            for _t in range(T):
                ro.add_step(
                    {key.name: np.ones((k,) + key.shape, dtype=key.dtype) for key in plan.obs_keys},
                    np.zeros(k, np.int64),
                    np.zeros((k, max(plan.actions.cont_dim, 1)), np.float32),
                    np.zeros(k, np.float32),
                    np.zeros(k, np.float32),
                )
                ro.add_outcome(np.zeros(k, np.float32), np.zeros(k, bool), np.zeros(k, bool), lc.gamma)
            rollouts.append(ro)
    stored = sum(a.nbytes for ro in rollouts for a in ro.obs.values())
    mark(
        f"rollout storage: {len(rollouts)} slices x T={T} (obs {stored / MB:,.0f} MB of "
        f"{T * n * row_bytes / MB:,.0f} MB if every env kept every key)",
        stored,
    )

    types = []
    taken = 0
    env_lo = 0
    for ro in rollouts:
        if taken >= learner.update_samples:
            break
        learner.ready_blocks.append(ro.finish(np.zeros(ro.n, np.float32), lc.gamma, lc.gae_lambda))
        types.append(np.repeat(plan.env_type[env_lo : env_lo + ro.n][None].astype(np.int64), T, 0).reshape(-1))
        env_lo += ro.n
        taken += ro.n * T
    learner.ready_types.extend(types)
    learner.ready_samples = taken
    mark(
        f"ready blocks: {taken:,} transitions (one update's batch)",
        sum(a.nbytes for b in learner.ready_blocks for a in b["obs"].values()),
    )
    before_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    learner.start_update()
    learner.poll_update(wait=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows.append(("PPO update, peak above the rows before it", max(0.0, peak - max(before_peak, last)), None))
    mark("after the update (allocator keeps)")
    rows.append(("board: worker segments (mapped; counted as touched)", float("nan"), board_bytes / MB))

    print(
        f"driver memory at {' '.join(overrides)} ({n:,} envs, {len(ranges)} workers, "
        f"{row_bytes:,} obs bytes per env row)\n"
    )
    print(f"{'part':56s} {'measured MB':>12s} {'nominal MB':>11s}")
    for part, measured, nominal in rows:
        m = "-" if measured != measured else f"{measured:,.0f}"
        nom = "-" if nominal is None else f"{nominal:,.0f}"
        print(f"{part:56s} {m:>12s} {nom:>11s}")
    total = rss_mb()
    print(f"{'RSS now (board pages not counted)':56s} {total:>12,.0f}")
    print(f"{'peak RSS of this process':56s} {peak:>12,.0f}")
    print(
        json.dumps(
            {
                "overrides": overrides,
                "rows": [
                    {
                        "part": p,
                        "measured_mb": None if m != m else round(m, 1),
                        "nominal_mb": None if nm is None else round(nm, 1),
                    }
                    for p, m, nm in rows
                ],
                "rss_mb": round(total, 1),
                "peak_rss_mb": round(peak, 1),
                "board_mb": round(board_bytes / MB, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
