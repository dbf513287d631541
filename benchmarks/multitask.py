"""One policy over many env types against one policy per type, on the same per-type budget.

    python benchmarks/multitask.py                       # env_mix=control, the defaults below
    python benchmarks/multitask.py --mix reward_scales --envs 32 --steps 500000
    python benchmarks/multitask.py --skip-grid --json

For a mix of k types, with N envs per type and S env steps per type:

- random:      each type's return under uniformly random actions (`--random-episodes`
               episodes of one env per type, measured here, before the runs);
- specialist:  the type alone: N envs, S steps, PPO updates of N env-rollouts;
- generalist:  the whole mix: N envs per type (k N), k S steps, updates of k N env-rollouts
               and minibatches k times larger, so each update and each gradient step sees
               about as many samples of each type as a specialist's, and there are as many
               updates as a specialist makes;
- baseline:    the generalist with `learner.value_norm=none learner.adv_norm=batch` (one
               critic scale, advantages normalized over mixed minibatches: the learner
               before the multi-task work), same budget;
- score:       per type (generalist - random) / (specialist - random), then the median and
               the minimum over the types (`--unlearnable` names types left out of both,
               e.g. one whose specialist does not beat random at this budget: the table
               still shows them);
- grid:        one Hydra multirun over learner.value_norm x reward_norm x scaling on the mix
               with `--grid-steps` per type, one row per job.

Returns are the mean of the last 100 episodes (summary.json `mean_return_last100`). Every
run writes into `--out` (default: a temporary directory, removed unless `--keep`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from rlpipe.config import conf_dir, register_schema, run_spec  # noqa: E402
from rlpipe.envs.random_return import play_random  # noqa: E402

BASE_MINIBATCH = 512


def mix_types(mix: str) -> dict[str, dict]:
    """The mix's types and their config nodes, as a run composes them."""
    register_schema()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        spec = run_spec(compose(config_name="config", overrides=[f"env_mix={mix}"]))
    return {t.name: t.node for t in spec.env_types}


def run(run_dir: Path, overrides: list[str], multirun: bool = False) -> float:
    """One `python -m rlpipe` job (or a multirun); returns its wall seconds."""
    cmd = [
        sys.executable,
        "-m",
        "rlpipe",
        *(["-m", f"hydra.sweep.dir={run_dir}"] if multirun else [f"hydra.run.dir={run_dir}"]),
        "logging.progress_interval_s=60",
        "logging.random_return_episodes=0",
        *overrides,
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark job failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}")
    print(f"  {run_dir.name}: {time.monotonic() - t0:.0f} s", flush=True)
    return time.monotonic() - t0


def returns_of(run_dir: Path) -> dict[str, float | None]:
    return json.loads((run_dir / "summary.json").read_text())["mean_return_last100"]


def common(mix: str, n_envs: int, steps: int, seed: int) -> list[str]:
    return [
        f"env_mix={mix}",
        f"env_count={n_envs}",
        f"run.total_env_steps={steps}",
        "run.duration_s=null",
        f"run.seed={seed}",
    ]


def generalist_overrides(mix: str, k: int, n: int, steps: int, seed: int) -> list[str]:
    return common(mix, k * n, k * steps, seed) + [
        f"learner.update_envs={k * n}",
        f"learner.minibatch_size={k * BASE_MINIBATCH}",
    ]


def score(gen, spec, rnd):
    if None in (gen, spec, rnd) or spec == rnd:
        return None
    return (gen - rnd) / (spec - rnd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mix", default="control")
    ap.add_argument("--envs", type=int, default=32, help="N: envs per type")
    ap.add_argument("--steps", type=int, default=600_000, help="S: env steps per type")
    ap.add_argument("--grid-steps", type=int, default=150_000, help="env steps per type in each grid job")
    ap.add_argument("--random-episodes", type=int, default=100)
    ap.add_argument("--unlearnable", default="", help="comma-separated types left out of median/min")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skip-grid", action="store_true")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="rlpipe_multitask_"))
    out.mkdir(parents=True, exist_ok=True)
    nodes = mix_types(args.mix)
    names, k, n, steps = list(nodes), len(nodes), args.envs, args.steps
    print(
        f"multitask benchmark: mix {args.mix} ({', '.join(names)}), N={n} envs per type, "
        f"S={steps:,} env steps per type; runs in {out}",
        flush=True,
    )
    t_start = time.monotonic()
    try:
        print("random-action returns:", flush=True)
        random = {
            name: play_random(node, args.random_episodes, 120.0, args.seed + i)
            for i, (name, node) in enumerate(nodes.items())
        }
        for name, r in random.items():
            print(f"  {name}: {r['mean']:.1f} over {r['episodes']} episodes", flush=True)

        print("runs:", flush=True)
        wall = {"generalist": run(out / "generalist", generalist_overrides(args.mix, k, n, steps, args.seed))}
        generalist = returns_of(out / "generalist")
        baseline = {}
        if not args.skip_baseline:
            wall["baseline"] = run(
                out / "baseline",
                generalist_overrides(args.mix, k, n, steps, args.seed)
                + ["learner.value_norm=none", "learner.adv_norm=batch"],
            )
            baseline = returns_of(out / "baseline")
        specialist = {}
        for name in names:
            others = [f"~env_mix.{part}.{o}" for o in names if o != name for part in ("types", "weights")]
            wall[f"specialist_{name}"] = run(
                out / f"specialist_{name}",
                common(args.mix, n, steps, args.seed) + [f"learner.update_envs={n}"] + others,
            )
            specialist[name] = returns_of(out / f"specialist_{name}")[name]

        skip = {t for t in args.unlearnable.split(",") if t}
        rows = []
        for name in names:
            rnd = random[name]["mean"]
            rows.append(
                {
                    "type": name,
                    "random": rnd,
                    "specialist": specialist[name],
                    "generalist": generalist[name],
                    "score": score(generalist[name], specialist[name], rnd),
                    "baseline": baseline.get(name),
                    "baseline_score": score(baseline.get(name), specialist[name], rnd),
                    "counted": name not in skip,
                }
            )

        def summary(key):
            vals = [r[key] for r in rows if r["counted"] and r[key] is not None]
            return (statistics.median(vals), min(vals)) if vals else (None, None)

        print("\n| type | random | specialist | generalist | score | baseline learner | baseline score |")
        print("|---|---|---|---|---|---|---|")

        def f(v, fmt="{:.1f}"):
            return "-" if v is None else fmt.format(v)

        for r in rows:
            mark = "" if r["counted"] else " (not counted)"
            print(
                f"| {r['type']}{mark} | {f(r['random'])} | {f(r['specialist'])} | {f(r['generalist'])} | "
                f"{f(r['score'], '{:.2f}')} | {f(r['baseline'])} | {f(r['baseline_score'], '{:.2f}')} |"
            )
        med, low = summary("score")
        bmed, blow = summary("baseline_score")
        print(
            f"\nnormalized score (generalist - random) / (specialist - random): median {f(med, '{:.2f}')}, "
            f"min {f(low, '{:.2f}')}; baseline learner: median {f(bmed, '{:.2f}')}, min {f(blow, '{:.2f}')}"
        )

        grid = []
        if not args.skip_grid:
            print(
                f"\nablation grid (learner.value_norm x reward_norm x scaling), {args.grid_steps:,} steps per type:",
                flush=True,
            )
            wall["grid"] = run(
                out / "grid",
                generalist_overrides(args.mix, k, n, args.grid_steps, args.seed)
                + ["learner.value_norm=popart,none", "reward_norm=off,per_type", "scaling=off,on"],
                multirun=True,
            )
            for job in sorted((out / "grid").iterdir(), key=lambda p: p.name):
                if not (job / "summary.json").exists():
                    continue
                picked = [
                    o
                    for o in yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
                    if o.split("=")[0] in ("learner.value_norm", "reward_norm", "scaling")
                ]
                rets = returns_of(job)
                grid.append(
                    {
                        "job": " ".join(picked),
                        "returns": rets,
                        "scores": {t: score(rets[t], specialist[t], random[t]["mean"]) for t in names},
                    }
                )
            print("| job | " + " | ".join(names) + " | median score |")
            print("|---" * (len(names) + 2) + "|")
            for g in grid:
                counted = [g["scores"][t] for t in names if t not in skip and g["scores"][t] is not None]
                print(
                    f"| {g['job']} | "
                    + " | ".join(f"{f(g['returns'][t])} ({f(g['scores'][t], '{:.2f}')})" for t in names)
                    + f" | {f(statistics.median(counted) if counted else None, '{:.2f}')} |"
                )
        total = time.monotonic() - t_start
        print(f"\nwall: {total / 60:.1f} min ({', '.join(f'{k_} {v:.0f} s' for k_, v in wall.items())})")
        if args.json:
            print(
                json.dumps(
                    {
                        "mix": args.mix,
                        "envs_per_type": n,
                        "steps_per_type": steps,
                        "random": random,
                        "rows": rows,
                        "median_score": med,
                        "min_score": low,
                        "baseline_median_score": bmed,
                        "baseline_min_score": blow,
                        "grid": grid,
                        "wall_s": wall,
                    }
                )
            )
    finally:
        if not args.keep and args.out is None:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
