"""What one PPO update costs the learner: `ppo_update` on a batch made the way the learner makes it.

    python benchmarks/ppo_update.py                          # +stage=day4: 7,000 seed12 envs
    python benchmarks/ppo_update.py --baseline-rev f66fdfc   # ... beside the update of a git revision
    python benchmarks/ppo_update.py --overrides +stage=day4 learner.epochs=1

The batch is the stage's: slices of `--slice-envs` consecutive envs of the plan (types as the
run assigns them, so each slice mixes them in the stage's proportions) collect one rollout each
through `SliceRollout` (the learner's `key_rows`, actions and values from the policy, random
obs of the board's keys and dtypes, random rewards and episode ends) until `update_envs x
rollout_len` samples are ready, and `concat_blocks` makes the batch as `CentralLearner` does.
The policy, the optimizer (`rlpipe.learner.adam.FusedAdam`) and the per-type settings are built
from the composed config as the learner builds them, with `learner.torch_threads` threads, and
with the C heap of where the config trains: the update process's (`learner.update_in`;
rlpipe.heap.keep_freed_blocks), or in a thread the driver's (`run.mmap_threshold_mb`: every
large tensor a mapping of its own, its pages faulted in anew; `run.trim_after_update`, timed
with the update).

With `--baseline-rev`, `rlpipe/learner/ppo.py`, `policy.py` and `adam.py` of that revision
are loaded from git (before `adam.py` existed, torch.optim.Adam(fused=True), which its learner
built). What they import, `scaling.py`'s loss terms and `ppo_kernels.py` among it, is this
tree's: to time a change there, run the script in a worktree of each revision. Both
start from the same weights and train on the same blocks, one update each in turn (machine
drift hits both), and after the first update their parameters and stats are compared bit for
bit. Prints the median thread CPU time (`time.thread_time()`:
the update runs on this thread alone) and wall time per update of each, and their ratios.
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))  # inference_round: the stage's plan, modules of a git revision

import numpy as np  # noqa: E402
import torch  # noqa: E402
from inference_round import has_file_at_rev, module_at_rev, stage_plan  # noqa: E402

from rlpipe import heap  # noqa: E402
from rlpipe.learner.rollout import SliceRollout  # noqa: E402
from rlpipe.learner.rollout_store import key_rows  # noqa: E402
from rlpipe.learner.type_settings import TypeSettings  # noqa: E402
from rlpipe.learner.update_process import updates_in_process  # noqa: E402


def stage_blocks(spec, plan, policy, slice_envs: int, seed: int = 0) -> tuple[list[dict], list[np.ndarray]]:
    """One finished rollout block per slice, as many slices as one update takes (the learner's
    `_take_batch`: blocks until update_envs x rollout_len samples), and each block's row types."""
    lc = spec.learner
    rng = np.random.default_rng(seed)
    want = min(lc.update_envs, spec.env_count) * lc.rollout_len
    starts = rng.permutation(spec.env_count // slice_envs) * slice_envs
    blocks, types, samples = [], [], 0
    for lo in starts:
        if samples >= want:
            break
        env_types = plan.env_type[lo : lo + slice_envs].astype(np.int64)
        n = len(env_types)
        ro = SliceRollout(
            n,
            lc.rollout_len,
            plan.obs_keys,
            plan.actions.cont_dim,
            spec.scaling.enabled,
            key_rows=key_rows(plan, env_types),
        )
        t_types = torch.from_numpy(env_types)
        for t in range(lc.rollout_len + 1):
            obs = {}
            for k in plan.obs_keys:
                shape = (n,) + k.shape
                x = rng.integers(0, 256, shape, dtype=np.uint8) if k.dtype == "uint8" else rng.normal(size=shape)
                x = x.astype(k.dtype)
                x[[k.name not in plan.specs[e].obs for e in env_types]] = 0  # the board's zeros
                obs[k.name] = x
            a_disc, a_cont, logp, value = (
                v.numpy() for v in policy.act({k: torch.from_numpy(v) for k, v in obs.items()}, t_types)
            )
            if t:
                ro.add_outcome(
                    rng.normal(size=n).astype(np.float32), rng.random(n) < 0.01, rng.random(n) < 0.005, lc.gamma
                )
                if spec.scaling.enabled:
                    ro.add_behaviour(a_disc, a_cont, logp, (0.3 + 0.7 * rng.random(n)).astype(np.float32))
            if t == lc.rollout_len:
                blocks.append(ro.finish(value, lc.gamma, lc.gae_lambda))
                types.append(np.repeat(env_types[None], lc.rollout_len, 0).reshape(-1))
                samples += len(blocks[-1]["adv"])
            else:
                ro.add_step(obs, a_disc, a_cont, logp, value)
    return blocks, types


def _faults() -> int:
    """Page faults of this thread so far (minor: a fresh mapping's pages touched)."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


class Contender:
    """One revision's policy, optimizer and update on the shared blocks."""

    def __init__(self, name, ppo, policy_cls, adam_cls, spec, plan, init_state, blocks, types, trim: bool):
        lc = spec.learner
        self.name, self.ppo, self.cfg = name, ppo, lc
        self.policy = policy_cls(plan, plan.obs_keys, lc.hidden, lc.cnn_channels, lc.cnn_out)
        self.policy.load_state_dict(init_state)
        self.optimizer = adam_cls(self.policy.parameters(), lr=lc.learning_rate, eps=1e-5)  # as the learner's
        self.per_type = TypeSettings.of(lc, spec.env_types)
        self.generator = torch.Generator().manual_seed(spec.run.seed)
        self.blocks, self.types = blocks, types
        self.trim = trim  # run.trim_after_update where the update runs in the driver's thread
        self.times = {"batch_cpu_s": [], "cpu_s": [], "wall_s": [], "faults": []}

    def update(self):
        """One update as the learner runs it: the batch made (in the driver's thread), then
        trained on (in the update's)."""
        c0 = time.thread_time()
        batch = self.ppo.concat_blocks(self.blocks, self.types, "cpu")
        c1, w1, f1 = time.thread_time(), time.perf_counter(), _faults()
        stats = self.ppo.ppo_update(
            self.policy, self.optimizer, batch, self.cfg, self.generator, per_type=self.per_type
        )
        if self.trim:
            heap.trim()  # as the learner's update thread does after each update
        self.times["batch_cpu_s"].append(c1 - c0)
        self.times["cpu_s"].append(time.thread_time() - c1)
        self.times["wall_s"].append(time.perf_counter() - w1)
        self.times["faults"].append(_faults() - f1)
        return stats


def optimizer_at(rev: str | None):
    """The optimizer class the learner of revision `rev` builds: rlpipe.learner.adam.FusedAdam,
    or before it existed (20f571d) torch.optim.Adam(fused=True), the same arithmetic."""
    if rev is None or has_file_at_rev(rev, "rlpipe/learner/adam.py"):
        return module_at_rev(rev, "rlpipe/learner/adam.py").FusedAdam
    return functools.partial(torch.optim.Adam, fused=True)


def same_training(runs: list[Contender], stats: list) -> bool:
    """Both contenders' parameters, buffers and update stats equal bit for bit (the stats by
    field: each revision has its own UpdateStats class)."""
    a, b = (r.policy.state_dict() for r in runs)
    return vars(stats[0]) == vars(stats[1]) and all(torch.equal(a[k], b[k]) for k in a)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--overrides", nargs="*", default=["+stage=day4"])
    ap.add_argument("--baseline-rev", default=None)
    ap.add_argument("--updates", type=int, default=5, help="timed updates of each (at least 1)")
    ap.add_argument("--slice-envs", type=int, default=70, help="envs per slice (day4 on 2 CPUs: 70)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    spec, plan = stage_plan(args.overrides)
    run, lc = spec.run, spec.learner
    in_process = updates_in_process(lc, torch.device("cpu"))
    if in_process:  # the update process's C heap, or the driver's
        heap.keep_freed_blocks()
    else:
        heap.configure(run.mmap_threshold_mb, run.malloc_arena_max, run.trim_threshold_mb)
    torch.set_num_threads(lc.torch_threads)
    revs = [None] + ([args.baseline_rev] if args.baseline_rev else [])
    modules = {rev: [module_at_rev(rev, f"rlpipe/learner/{m}.py") for m in ("ppo", "policy")] for rev in revs}
    optimizers = {rev: optimizer_at(rev) for rev in revs}
    torch.manual_seed(spec.run.seed)
    actor = modules[None][1].Policy(plan, plan.obs_keys, lc.hidden, lc.cnn_channels, lc.cnn_out)
    blocks, types = stage_blocks(spec, plan, actor, args.slice_envs)
    init = actor.state_dict()
    runs = [
        Contender(
            rev or "current",
            ppo,
            pol.Policy,
            optimizers[rev],
            spec,
            plan,
            init,
            blocks,
            types,
            run.trim_after_update and not in_process,
        )
        for rev, (ppo, pol) in modules.items()
    ]
    stats = [r.update() for r in runs]  # not timed: first-call paths, the optimizer's state
    identical = {"first update": same_training(runs, stats)} if len(runs) == 2 else {}
    for r in runs:
        r.times = {k: [] for k in r.times}
    for _ in range(args.updates):
        stats = [r.update() for r in runs]
    if len(runs) == 2:
        identical["last update"] = same_training(runs, stats)
    types_all = np.concatenate(types)
    rgb = int(np.isin(types_all, [t for t, s in enumerate(plan.specs) if "rgb" in s.obs]).sum())
    print(
        f"ppo update: {len(types_all)} samples ({rgb} with rgb) in {len(blocks)} blocks of {args.slice_envs} envs, "
        f"{len(plan.names)} types, {lc.epochs} epochs of {lc.minibatch_size}-sample minibatches, "
        f"{lc.torch_threads} torch thread(s), {args.updates} updates each"
    )
    rows = {r.name: {k: statistics.median(v) for k, v in r.times.items()} for r in runs}
    for name, row in rows.items():
        print(
            f"  {name}: median update thread CPU {row['cpu_s']:.3f} s, wall {row['wall_s']:.3f} s; "
            f"{row['faults']:,.0f} page faults; batch (driver thread) CPU {row['batch_cpu_s']:.3f} s"
        )
    if args.baseline_rev:
        base = rows[args.baseline_rev]
        ratios = {k: rows["current"][k] / base[k] if base[k] else float("nan") for k in base}  # 0 faults
        print(
            f"  current / {args.baseline_rev} (medians): update CPU {ratios['cpu_s']:.3f}, wall {ratios['wall_s']:.3f}, "
            f"batch CPU {ratios['batch_cpu_s']:.3f}; parameters and stats bit-identical: "
            + ", ".join(f"{k} {v}" for k, v in identical.items())
        )
        rows.update(ratios=ratios, bit_identical=identical)
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
