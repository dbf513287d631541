"""One policy over many env types against one policy per type, on the same per-type budget.

    python benchmarks/multitask.py                       # env_mix=control, the defaults below
    python benchmarks/multitask.py --mix reward_scales --envs 32 --steps 500000
    python benchmarks/multitask.py --skip-grid --json
    python benchmarks/multitask.py --random-mixes 4 --seed 1 --results /tmp/mixes   # benchmarks/random_mixes.py
    python benchmarks/multitask.py --mix seed12 --envs 32 --steps 131072 --envs-of mountaincar_cont=96 \
        --set env_mix.types.minigrid.view=symbolic --skip-grid --skip-baseline --keep --out /tmp/seed12

For a mix of k types, with N envs per type and S env steps per type (`--envs-of TYPE=N_t`
gives a type its own N_t envs and a budget of S N_t / N steps: every env steps S / N times, in
its specialist and in the generalist alike, so a type that needs more episodes gets more envs):

- random:      each type's return under uniformly random actions (`--random-episodes`
               episodes of one env per type, measured here, before the runs);
- specialist:  the type alone: N envs, S steps, PPO updates of N env-rollouts (`--defaults`:
               no learner override, the learner's `auto` settings for the type alone);
- generalist:  the whole mix: N envs per type (k N; the mix's weights are replaced by the
               envs per type), k S steps, updates of k N env-rollouts and minibatches k times
               larger, so each update and each gradient step sees about as many samples of
               each type as a specialist's, and there are as many updates as a specialist makes
               (`--generalist-minibatch B`: minibatches of B samples, so k x 512 / B times the
               gradient steps on the same samples and epochs; `--defaults`: no learner
               override, the update the learner's `auto` settings give the mix, as a user
               composing the mix gets it: rlpipe/mix_learner.py);
- baseline:    the generalist with `learner.value_norm=none learner.adv_norm=batch` (one
               critic scale, advantages normalized over mixed minibatches: the learner
               before the multi-task work), same budget;
- learnable:   the specialist's verdict in its summary.json (`learned`: its last 100 episodes
               clearly above random and above its own first 100, docs/multitask.md);
- score:       per type (generalist - random) / (specialist - random), then the median and
               the minimum over the learnable types (`--unlearnable` leaves out more; the
               table still shows every type);
- grid:        one Hydra multirun over learner.value_norm x reward_norm x scaling on the mix
               with `--grid-steps` per type, one row per job.

Returns are the mean of the last 100 episodes (summary.json `mean_return_last100`). Every
run writes into `--out` (default: a temporary directory, removed unless `--keep`); a run whose
summary.json is already there is read, not run again (`--out` of an interrupted invocation
resumes it). `--set` adds overrides to every run (e.g. MiniGrid on its symbolic view).
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
from rlpipe.envs import random_return  # noqa: E402

BASE_MINIBATCH = 512


def mix_types(mix: str, overrides: list[str]) -> dict[str, dict]:
    """The mix's types and their config nodes, as a run with these overrides composes them
    (the random returns are played on the nodes the runs train on)."""
    register_schema()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        spec = run_spec(compose(config_name="config", overrides=[f"env_mix={mix}", *overrides]))
    return {t.name: t.node for t in spec.env_types}


def run(run_dir: Path, overrides: list[str], random: dict[str, dict] | None, multirun: bool = False) -> float | None:
    """One `python -m rlpipe` job (or a multirun); returns its wall seconds (None: it had run
    in an earlier invocation, and is only read). A job's verdicts (summary.json `learned`) are
    judged against this script's `random` returns: they are written where the run reads its
    own (random_return.RESULT_FILE), and the run measures none
    (`logging.random_return_episodes=0`; the grid's jobs, given none, have no verdicts)."""
    if not multirun and (run_dir / "summary.json").exists():
        print(f"  {run_dir.name}: read from an earlier invocation", flush=True)
        return None
    if random is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / random_return.RESULT_FILE).write_text(json.dumps(random, indent=1))
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


def verdict_of(run_dir: Path, name: str) -> str:
    return json.loads((run_dir / "summary.json").read_text())["learned"].get(name, "unknown")


def only_for(name: str, names: list[str], overrides: list[str]) -> list[str]:
    """The overrides a run of type `name` alone takes: none that tune another type's node."""
    others = {o for o in names if o != name}

    def tunes_another(override: str) -> bool:
        key = override.lstrip("+~").split("=")[0].split(".")
        return len(key) > 2 and key[0] == "env_mix" and key[1] in ("types", "weights") and key[2] in others

    return [o for o in overrides if not tunes_another(o)]


def envs_per_type(names: list[str], n: int, envs_of: list[str]) -> dict[str, int]:
    """N_t per type: N, but for the types `--envs-of TYPE=N_t` names."""
    counts = dict.fromkeys(names, n)
    for item in envs_of:
        name, _, value = item.partition("=")
        if name not in counts or not value.isdigit() or int(value) < 1:
            raise SystemExit(
                f"--envs-of {item!r}: expected TYPE=N with TYPE one of the mix's types "
                f"({', '.join(names)}) and N a positive integer"
            )
        counts[name] = int(value)
    return counts


def common(mix: str, n_envs: int, steps: int, seed: int) -> list[str]:
    return [
        f"env_mix={mix}",
        f"env_count={n_envs}",
        f"run.total_env_steps={steps}",
        "run.duration_s=null",
        f"run.seed={seed}",
    ]


def generalist_overrides(
    mix: str,
    counts: dict[str, int],
    steps_per_env: int,
    seed: int,
    minibatch: int | None = None,
    defaults: bool = False,
) -> list[str]:
    """The generalist's run: every type's envs in one mix, updates of all of them, minibatches of
    `minibatch` samples (None: k x BASE_MINIBATCH, one specialist's minibatch per type).
    `defaults`: no learner override, the update the learner's `auto` settings give the mix."""
    total = sum(counts.values())
    learner = [f"learner.update_envs={total}", f"learner.minibatch_size={minibatch or len(counts) * BASE_MINIBATCH}"]
    return (
        common(mix, total, total * steps_per_env, seed)
        + [f"env_mix.weights.{name}={count}" for name, count in counts.items()]
        + ([] if defaults else learner)
    )


def score(gen, spec, rnd):
    if None in (gen, spec, rnd) or spec == rnd:
        return None
    return (gen - rnd) / (spec - rnd)


def random_mixes(args) -> None:
    """--random-mixes K: benchmarks/random_mixes.py, with this script's runner."""
    from random_mixes import run_random_mixes

    if args.random_mixes < 1 or args.budget_scale <= 0:
        raise SystemExit("--random-mixes K needs K >= 1 and --budget-scale a positive number")
    args.results = args.results or Path(tempfile.mkdtemp(prefix="rlpipe_mixes_"))

    def play_random(name: str, episodes: int, seed: int) -> dict:
        return random_return.play_random(mix_types(name, [])[name], episodes, 120.0, seed)

    table = run_random_mixes(args, run, play_random)
    if args.json:
        print(json.dumps(table))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mix", default="control")
    ap.add_argument("--envs", type=int, default=32, help="N: envs per type")
    ap.add_argument("--steps", type=int, default=600_000, help="S: env steps per type")
    ap.add_argument("--envs-of", nargs="*", default=[], metavar="TYPE=N", help="a type's own N_t envs")
    ap.add_argument("--set", nargs="*", default=[], metavar="OVERRIDE", help="overrides added to every run")
    ap.add_argument(
        "--generalist-minibatch",
        type=int,
        default=None,
        metavar="B",
        help="the generalist's minibatch in samples (default: k x 512, as many gradient steps as a specialist)",
    )
    ap.add_argument(
        "--defaults",
        action="store_true",
        help="no learner override on either side: the learner's auto settings follow each run's mix",
    )
    ap.add_argument("--grid-steps", type=int, default=150_000, help="env steps per type in each grid job")
    ap.add_argument("--random-episodes", type=int, default=100)
    ap.add_argument("--unlearnable", default="", help="comma-separated types left out of median/min")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skip-grid", action="store_true")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument(
        "--random-mixes", type=int, default=0, metavar="K", help="K mixes drawn by --seed (benchmarks/random_mixes.py)"
    )
    ap.add_argument("--budget-scale", type=float, default=1.0, help="--random-mixes: every budget times this")
    ap.add_argument("--results", type=Path, default=None, help="--random-mixes: where runs are kept and shared")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.defaults and args.generalist_minibatch:
        raise SystemExit("--defaults runs the learner's own minibatch: leave out --generalist-minibatch")
    if args.random_mixes:
        random_mixes(args)
        return
    out = args.out or Path(tempfile.mkdtemp(prefix="rlpipe_multitask_"))
    out.mkdir(parents=True, exist_ok=True)
    nodes = mix_types(args.mix, args.set)
    names, k, n, steps = list(nodes), len(nodes), args.envs, args.steps
    counts = envs_per_type(names, n, args.envs_of)
    steps_per_env = steps // n
    own = ", ".join(f"{t} {c} envs, {c * steps_per_env:,} steps" for t, c in counts.items() if c != n)
    print(
        f"multitask benchmark: mix {args.mix} ({', '.join(names)}), N={n} envs per type, "
        f"S={steps:,} env steps per type{f' (but {own})' if own else ''}; runs in {out}",
        flush=True,
    )
    t_start = time.monotonic()
    try:
        print("random-action returns:", flush=True)
        random = {
            name: random_return.play_random(node, args.random_episodes, 120.0, args.seed + i)
            for i, (name, node) in enumerate(nodes.items())
        }
        for name, r in random.items():
            print(f"  {name}: {r['mean']:.1f} over {r['episodes']} episodes", flush=True)

        print("runs:", flush=True)
        mixed = (
            generalist_overrides(args.mix, counts, steps_per_env, args.seed, args.generalist_minibatch, args.defaults)
            + args.set
        )
        wall = {"generalist": run(out / "generalist", mixed, random)}
        generalist = returns_of(out / "generalist")
        baseline = {}
        if not args.skip_baseline:
            wall["baseline"] = run(
                out / "baseline", mixed + ["learner.value_norm=none", "learner.adv_norm=batch"], random
            )
            baseline = returns_of(out / "baseline")
        specialist, learnable = {}, {}
        for name in names:
            others = [f"~env_mix.{part}.{o}" for o in names if o != name for part in ("types", "weights")]
            n_t = counts[name]
            wall[f"specialist_{name}"] = run(
                out / f"specialist_{name}",
                common(args.mix, n_t, n_t * steps_per_env, args.seed)
                + ([] if args.defaults else [f"learner.update_envs={n_t}"])
                + others
                + only_for(name, names, args.set),
                {name: random[name]},
            )
            specialist[name] = returns_of(out / f"specialist_{name}")[name]
            learnable[name] = verdict_of(out / f"specialist_{name}", name)

        skip = {t for t in args.unlearnable.split(",") if t} | {t for t in names if learnable[t] != "learned"}
        rows = []
        for name in names:
            rnd = random[name]["mean"]
            rows.append(
                {
                    "type": name,
                    "envs": counts[name],
                    "steps": counts[name] * steps_per_env,
                    "specialist_verdict": learnable[name],
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

        print(
            "\n| type | envs | steps | random | specialist (verdict) | generalist | score "
            "| baseline learner | baseline score |"
        )
        print("|---|---|---|---|---|---|---|---|---|")

        def f(v, fmt="{:.1f}"):
            return "-" if v is None else fmt.format(v)

        for r in rows:
            mark = "" if r["counted"] else " (not counted)"
            print(
                f"| {r['type']}{mark} | {r['envs']} | {r['steps']:,} | {f(r['random'])} | "
                f"{f(r['specialist'])} ({r['specialist_verdict']}) | {f(r['generalist'])} | "
                f"{f(r['score'], '{:.2f}')} | {f(r['baseline'])} | {f(r['baseline_score'], '{:.2f}')} |"
            )
        med, low = summary("score")
        bmed, blow = summary("baseline_score")
        learned = sum(v == "learned" for v in learnable.values())
        print(f"\nlearnable at this budget (the specialist learned): {learned} of {k}")
        print(
            f"normalized score (generalist - random) / (specialist - random): median {f(med, '{:.2f}')}, "
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
                generalist_overrides(
                    args.mix, counts, args.grid_steps // n, args.seed, args.generalist_minibatch, args.defaults
                )
                + args.set
                + ["learner.value_norm=popart,none", "reward_norm=off,per_type", "scaling=off,on"],
                None,
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
        ran = ", ".join(f"{k_} {v:.0f} s" for k_, v in wall.items() if v is not None)
        print(f"\nwall: {total / 60:.1f} min ({ran or 'every run read from an earlier invocation'})")
        if args.json:
            print(
                json.dumps(
                    {
                        "mix": args.mix,
                        "envs_per_type": n,
                        "steps_per_type": steps,
                        "random": random,
                        "rows": rows,
                        "learnable": learned,
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
