"""What one central-inference round costs the learner: the policy's forward over every env's obs.

    python benchmarks/inference_round.py                          # +stage=day4: 7,000 seed12 envs
    python benchmarks/inference_round.py --baseline-rev 8b93796   # ... beside the policy of a git revision
    python benchmarks/inference_round.py --overrides env_mix=cartpole env_count=7000

The batch is the stage's plan (types as the run assigns them, one row per env, random obs
of the board's keys and dtypes); the policy is built from the composed config as the learner
builds it, and called as the learner calls it (`act_explore` when scaling is on, else `act`),
with `learner.torch_threads` threads, on the driver's C heap (`run.mmap_threshold_mb`,
`run.trim_threshold_mb`: rlpipe/heap.py). With `--baseline-rev`, the `rlpipe/learner/policy.py`
of that revision is loaded from git and timed on the same batch, the two interleaved round
by round so machine drift hits both. Prints the median and p90 ms per round of each and the
ratio of medians.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from rlpipe import heap  # noqa: E402
from rlpipe.config import conf_dir, register_schema, run_spec  # noqa: E402
from rlpipe.envs.registry import plan_mix  # noqa: E402

POLICY = "rlpipe/learner/policy.py"


def module_at_rev(rev: str | None, path: str):
    """The module at `path` (relative to the repository) of git revision `rev`, loaded under a
    name of its own; None: this tree's, imported as usual."""
    if rev is None:
        return importlib.import_module(path.removesuffix(".py").replace("/", "."))
    shown = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, text=True)
    if shown.returncode != 0:
        print(
            f"--baseline-rev {rev}: git has no {path} at that revision ({shown.stderr.strip()}); "
            "give a commit of this repository that has it",
            file=sys.stderr,
        )
        raise SystemExit(2)
    source = shown.stdout
    name = f"{Path(path).stem}_{rev}"
    with tempfile.TemporaryDirectory(prefix="rlpipe_rev_") as tmp:  # gone once loaded
        file = Path(tmp) / f"{name}.py"
        file.write_text(source)
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # where dataclasses look their module up
        spec.loader.exec_module(module)
    return module


def has_file_at_rev(rev: str, path: str) -> bool:
    """Whether git revision `rev` holds `path`."""
    return subprocess.run(["git", "cat-file", "-e", f"{rev}:{path}"], cwd=REPO, capture_output=True).returncode == 0


def stage_plan(overrides: list[str]):
    """The run spec and mix plan of the composed config."""
    register_schema()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        spec = run_spec(compose(config_name="config", overrides=overrides))
    return spec, plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--overrides", nargs="*", default=["+stage=day4"])
    ap.add_argument("--baseline-rev", default=None)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    spec, plan = stage_plan(args.overrides)
    lc = spec.learner
    # the driver's C heap, where the learner serves: without it a 7,000-row round's activations
    # are fresh mappings, faulted in every round
    heap.configure(spec.run.mmap_threshold_mb, spec.run.malloc_arena_max, spec.run.trim_threshold_mb)
    torch.set_num_threads(lc.torch_threads)
    rng = np.random.default_rng(0)
    obs = {}
    for k in plan.obs_keys:
        shape = (spec.env_count,) + k.shape
        obs[k.name] = torch.from_numpy(
            rng.integers(0, 256, shape, dtype=np.uint8)
            if k.dtype == "uint8"
            else rng.normal(size=shape).astype(k.dtype)
        )
    types = torch.from_numpy(plan.env_type.astype(np.int64))
    contenders = {"current": module_at_rev(None, POLICY).Policy}
    if args.baseline_rev:
        contenders[args.baseline_rev] = module_at_rev(args.baseline_rev, POLICY).Policy
    policies = {
        name: cls(plan, plan.obs_keys, lc.hidden, lc.cnn_channels, lc.cnn_out) for name, cls in contenders.items()
    }
    gen = torch.Generator().manual_seed(1)

    def one(policy) -> float:
        t0 = time.perf_counter()
        if spec.scaling.enabled:
            policy.act_explore(obs, types, gen)
        else:
            policy.act(obs, types)
        return (time.perf_counter() - t0) * 1e3

    for p in policies.values():  # warm-up: allocator, first-call paths
        one(p)
    times = {name: [] for name in policies}
    for _ in range(args.rounds):
        for name, p in policies.items():
            times[name].append(one(p))
    rows = {
        name: {"median_ms": statistics.median(t), "p90_ms": float(np.percentile(t, 90))} for name, t in times.items()
    }
    rgb = sum(1 for t in plan.env_type if "rgb" in plan.specs[t].obs)
    print(
        f"inference round: {spec.env_count} rows ({rgb} with rgb), {len(plan.names)} types, "
        f"{'act_explore' if spec.scaling.enabled else 'act'}, {lc.torch_threads} torch thread(s), "
        f"{args.rounds} rounds"
    )
    for name, r in rows.items():
        print(f"  {name}: median {r['median_ms']:.1f} ms, p90 {r['p90_ms']:.1f} ms")
    if args.baseline_rev:
        ratio = rows["current"]["median_ms"] / rows[args.baseline_rev]["median_ms"]
        print(f"  current / {args.baseline_rev} (median): {ratio:.3f}")
        rows["ratio"] = ratio
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
