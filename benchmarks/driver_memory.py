"""What the driver's memory is made of, at a stage's size (default day4, 7,000 envs).

    python benchmarks/driver_memory.py [overrides...]

Builds, in this one process and in the driver's order, what the driver holds, and reads this
process's RSS (smaps_rollup) after each part, so every row is a measured increment, not an
estimate: the interpreter with numpy; torch and the env modules imported; the learner
(policy, its acting copy) and the slot table's inference batch buffers, written as gathers
write them; the (time x env) rollout storage filled for T steps as `observe` fills it (each key
kept only for the envs whose type produces it); one PPO update on a full
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
    from rlpipe.protocol import slice_bounds, slot_count
    from rlpipe.shm.layout import WorkerLayout
    from rlpipe.supervisor.slot_table import SlotTable
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
    ranges = group_ranges(n, spec.groups.size)
    learner = CentralLearner(spec, plan)
    n_slots = slot_count(n, spec.groups.size, spec.worker.slices)
    table = SlotTable(n_slots, [lo for lo, _ in ranges], plan.env_type, plan.obs_keys, plan.actions.cont_dim)
    for buf in table.obs_buf.values():
        buf.fill(1)  # the gathers write every row
    params = sum(p.numel() * p.element_size() for p in learner.policy.parameters())
    mark("learner: policy, acting copy; the slot table's inference batch", 2 * params + n * row_bytes)

    layouts = [WorkerLayout.build(hi - lo, plan.obs_keys, plan.actions.cont_dim) for lo, hi in ranges]
    board_bytes = sum(lay.size for lay in layouts)

    T = lc.rollout_len
    store = learner.rollouts  # every env's (time x env) arrays, written over T rounds as observe writes them
    parts = [*store.obs.values(), store.a_disc, store.a_cont, store.logp, store.value, store.reward, store.done]
    for arr in parts + ([store.weight] if store.weight is not None else []):
        arr.fill(1)
    stored = sum(a.nbytes for a in store.obs.values())
    mark(
        f"rollout storage: {n:,} envs x T={T} (obs {stored / MB:,.0f} MB of "
        f"{T * n * row_bytes / MB:,.0f} MB if every env kept every key)",
        stored,
    )

    taken = 0
    slices = [(lo + a, b - a) for lo, hi in ranges for a, b in slice_bounds(hi - lo, spec.worker.slices)]
    for slot, (env_lo, k) in enumerate(slices):
        if taken >= learner.update_samples:
            break
        zeros = np.zeros((T, k), np.float32)
        block, types = store._block(slot, env_lo, k, zeros, zeros, plan.env_type[env_lo : env_lo + k].astype(np.int64))
        learner.ready_blocks.append(block)
        learner.ready_types.append(types)
        taken += k * T
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
