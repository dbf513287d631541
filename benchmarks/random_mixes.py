"""`benchmarks/multitask.py --random-mixes K --seed S`: K mixes drawn at random, each trained on
the defaults a user gets, against each type alone on its defaults.

    python benchmarks/multitask.py --random-mixes 4 --seed 1 --results /tmp/mixes
    python benchmarks/multitask.py --random-mixes 4 --seed 2 --budget-scale 0.5 --results /tmp/mixes

- the pool:       the types with a published specialist (docs/multitask.md, "Specialists"), each
                  with that specialist's budget: the types this benchmark judges learnable. A
                  drawn type whose specialist does not learn at the run's budget is shown and
                  left out of the scores ("not counted");
- a mix:          2 to 4 types drawn from the pool by the seed (random.Random(S)); type t runs on
                  64 x S_t / S_min envs (S_min the smallest budget of the mix), so with every env
                  stepping equally often each type gets its own budget S_t, and the run ends at
                  the sum of them;
- specialist:     `python -m rlpipe env_mix=<type> env_count=64 run.total_env_steps=S_t`, the
                  type's env_mix file as it is (the quick start's for cartpole);
- generalist:     the mix composed on the command line as a user would (`env_mix=<one type>
                  +env@env_mix.types.<other>=<other>` and the other types' env_mix tunings, such
                  as MiniGrid's symbolic view), no learner override on either side: the learner's
                  `auto` settings follow the mix (rlpipe/mix_learner.py). The base is a type other
                  than cartpole where the mix has one (drawn so before env_mix=cartpole's
                  update held for CartPole alone only: rlpipe/mix_learner.py, `alone`; the
                  runs of docs/multitask.md are comparable across seeds);
- random:         each type's random-action return, `--random-episodes` episodes, measured here;
- score:          (generalist - random) / (specialist - random) per type, then per mix the median
                  and the minimum over the counted types, and whether the mix meets the bar
                  (every counted type `learned` in the generalist, median >= 0.9, minimum >= 0.5).

Every run goes under `--results`: specialists by (type, budget, seed), so the mixes of a seed
and later invocations share them, random returns by (type, seed), mixes by (seed, index, types,
budget). A run whose summary.json is there is read, not run again. `--budget-scale F` runs every
budget at F times its size (a quick check); the table says which scale it used.
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

from omegaconf import OmegaConf

from rlpipe.config import conf_dir

# type -> its specialist's budget in env steps (docs/multitask.md, "Specialists"; 64 envs each)
POOL = {
    "cartpole": 500_000,
    "acrobot": 500_000,
    "pendulum": 500_000,
    "lunar_lander": 1_000_000,
    "mountaincar_cont": 1_000_000,
    "minigrid": 500_000,
    "bullet_reacher": 1_000_000,
}
ENVS = 64  # a specialist's env_count, and the generalist's for the type with the smallest budget
BAR = {"median": 0.9, "min": 0.5}


def draw_mixes(k: int, seed: int, pool: dict[str, int] = POOL) -> list[list[str]]:
    """K mixes of 2 to 4 distinct types, in pool order, drawn by `seed` alone."""
    rng = random.Random(seed)
    names = list(pool)
    mixes = []
    for _ in range(k):
        drawn = set(rng.sample(names, rng.randint(2, min(4, len(names)))))
        mixes.append([n for n in names if n in drawn])
    return mixes


def budgets(types: list[str], scale: float) -> dict[str, int]:
    return {t: int(POOL[t] * scale) for t in types}


def env_tunings(name: str) -> list[str]:
    """The scalar tunings of a type in its own env_mix file (MiniGrid's `view: symbolic`), as the
    command-line overrides that give the type the same node inside another mix."""
    node = OmegaConf.to_container(OmegaConf.load(conf_dir() / "env_mix" / f"{name}.yaml"))
    tuned = (node.get("types") or {}).get(name) or {}
    return [f"env_mix.types.{name}.{key}={value}" for key, value in tuned.items() if not isinstance(value, dict)]


def specialist_overrides(name: str, steps: int, seed: int) -> list[str]:
    return [
        f"env_mix={name}",
        f"env_count={ENVS}",
        f"run.total_env_steps={steps}",
        "run.duration_s=null",
        f"run.seed={seed}",
    ]


def generalist_overrides(types: list[str], steps: dict[str, int], seed: int) -> tuple[list[str], dict[str, int]]:
    """The mix as a user composes it, and each type's envs (64 x S_t / S_min: every env steps
    S_min / 64 times, so type t makes S_t steps)."""
    smallest = min(steps.values())
    envs = {t: round(ENVS * steps[t] / smallest) for t in types}
    base = next((t for t in types if t != "cartpole"), types[0])
    overrides = [f"env_mix={base}", f"env_mix.weights.{base}={envs[base]}"]
    for t in types:
        if t != base:
            overrides += [f"+env@env_mix.types.{t}={t}", f"+env_mix.weights.{t}={envs[t]}", *env_tunings(t)]
    overrides += [
        f"env_count={sum(envs.values())}",
        f"run.total_env_steps={sum(steps.values())}",
        "run.duration_s=null",
        f"run.seed={seed}",
    ]
    return overrides, envs


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def score(gen, spec, rnd):
    if None in (gen, spec, rnd) or spec == rnd:
        return None
    return (gen - rnd) / (spec - rnd)


def run_random_mixes(args, run, play_random) -> dict:
    """Draws the mixes, runs what --results does not hold yet (`run` is multitask.run;
    `play_random(type, episodes, seed)` a type's random-action return), prints the tables and
    returns them as a dict."""
    results: Path = args.results
    results.mkdir(parents=True, exist_ok=True)
    seed, scale = args.seed, args.budget_scale
    mixes = draw_mixes(args.random_mixes, seed)
    print(
        f"random mixes: {len(mixes)} drawn by seed {seed} from {', '.join(POOL)}; budgets x{scale:g} "
        f"of the specialists'; results in {results}",
        flush=True,
    )
    for i, types in enumerate(mixes):
        print(f"  mix {i}: {' + '.join(types)}", flush=True)
    rnd = {}
    for name in dict.fromkeys(t for m in mixes for t in m):
        cached = results / "random" / f"{name}-seed{seed}.json"
        if not cached.exists():
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps(play_random(name, args.random_episodes, seed)))
        rnd[name] = json.loads(cached.read_text())
    rows, per_mix = [], []
    for i, types in enumerate(mixes):
        steps = budgets(types, scale)
        spec = {}
        for t in types:
            run_dir = results / "specialists" / f"{t}-{steps[t]}-seed{seed}"
            run(run_dir, specialist_overrides(t, steps[t], seed), {t: rnd[t]})
            spec[t] = summary_of(run_dir)
        overrides, envs = generalist_overrides(types, steps, seed)
        gen_dir = results / "mixes" / f"seed{seed}-{i}-{'+'.join(types)}-x{scale:g}"
        run(gen_dir, overrides, {t: rnd[t] for t in types})
        gen = summary_of(gen_dir)
        mix_rows = []
        for t in types:
            s_ret, g_ret = spec[t]["mean_return_last100"][t], gen["mean_return_last100"][t]
            mix_rows.append(
                {
                    "mix": i,
                    "type": t,
                    "envs": envs[t],
                    "steps": steps[t],
                    "random": rnd[t]["mean"],
                    "specialist": s_ret,
                    "specialist_verdict": spec[t]["learned"].get(t, "unknown"),
                    "specialist_learner": spec[t].get("learner"),
                    "generalist": g_ret,
                    "generalist_verdict": gen["learned"].get(t, "unknown"),
                    "score": score(g_ret, s_ret, rnd[t]["mean"]),
                }
            )
        counted = [r for r in mix_rows if r["specialist_verdict"] == "learned" and r["score"] is not None]
        scores = [r["score"] for r in counted]
        med, low = (statistics.median(scores), min(scores)) if scores else (None, None)
        all_learned = all(r["generalist_verdict"] == "learned" for r in counted)
        per_mix.append(
            {
                "mix": i,
                "types": types,
                "env_count": sum(envs.values()),
                "learner": gen.get("learner"),
                "median": med,
                "min": low,
                "all_learned": all_learned,
                "meets_bar": bool(scores) and all_learned and med >= BAR["median"] and low >= BAR["min"],
                "wall_s": gen["wall_s"],
            }
        )
        rows += mix_rows
    print_tables(rows, per_mix, seed, scale)
    return {"seed": seed, "budget_scale": scale, "mixes": per_mix, "rows": rows}


def _f(v, fmt="{:.1f}"):
    return "-" if v is None else fmt.format(v)


def print_tables(rows: list[dict], per_mix: list[dict], seed: int, scale: float) -> None:
    print(f"\nseed {seed}, budgets x{scale:g} of the specialists' (64 envs a specialist), defaults only")
    print("| mix | type | envs | steps | random | specialist (verdict) | generalist (verdict) | score |")
    print("|---|---|---:|---:|---:|---|---|---:|")
    for r in rows:
        counted = "" if r["specialist_verdict"] == "learned" else " (not counted)"
        print(
            f"| {r['mix']} | {r['type']}{counted} | {r['envs']} | {r['steps']:,} | {_f(r['random'])} | "
            f"{_f(r['specialist'])} ({r['specialist_verdict']}) | {_f(r['generalist'])} "
            f"({r['generalist_verdict']}) | {_f(r['score'], '{:.2f}')} |"
        )
    print("\n| mix | types | envs | learner (rollout, update envs, minibatch) | median | min | all learned | bar |")
    print("|---|---|---:|---|---:|---:|---|---|")
    for m in per_mix:
        lc = m["learner"] or {}
        shape = f"{lc.get('rollout_len')}, {lc.get('update_envs')}, {lc.get('minibatch_size')}"
        print(
            f"| {m['mix']} | {' + '.join(m['types'])} | {m['env_count']} | {shape} | {_f(m['median'], '{:.2f}')} | "
            f"{_f(m['min'], '{:.2f}')} | {'yes' if m['all_learned'] else 'no'} | "
            f"{'met' if m['meets_bar'] else 'not met'} |"
        )
    met = sum(m["meets_bar"] for m in per_mix)
    print(f"\n{met} of {len(per_mix)} mixes meet the bar (every type learned, median >= 0.9, min >= 0.5)")
