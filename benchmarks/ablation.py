"""The table of an ablation multirun: one row per job, from each job's own files.

    python -m rlpipe -m env_mix=reward_scales scaling=on,off reward_norm=per_env,off env_count=200 run.duration_s=90
    python benchmarks/ablation.py multirun/<date>/<time> [--threshold cartpole=100] [--json]

Columns: the job's overrides, loss_std (summary.json: std of the total loss over the second
half of the run), mean return of the last 100 episodes per env type, and time-to-threshold:
env steps and seconds until the TensorBoard curve charts/episodic_return/<type> first reaches
the threshold (never: '-').
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def first_reach(run_dir: Path, env_type: str, threshold: float):
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tag = f"charts/episodic_return/{env_type}"
    if tag not in acc.Tags()["scalars"]:
        return None
    events = acc.Scalars(tag)
    start = min(e.wall_time for e in acc.Scalars("charts/sps")) - 2.0
    for e in events:
        if e.value >= threshold:
            return {"env_steps": e.step, "seconds": round(e.wall_time - start, 1)}
    return None


def job_row(run_dir: Path, threshold: tuple[str, float]) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    return {"job": run_dir.name, "overrides": " ".join(overrides), "loss_std": summary["loss_std"],
            "env_steps": summary["env_steps"], "returns": summary["mean_return_last100"],
            "to_threshold": first_reach(run_dir, *threshold)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("--threshold", default="cartpole=100", help="type=value on its return curve")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    name, value = args.threshold.split("=")
    rows = [job_row(d, (name, float(value))) for d in sorted(args.sweep_dir.iterdir(), key=lambda p: p.name)
            if (d / "summary.json").exists()]
    types = list(rows[0]["returns"]) if rows else []
    print("| job | overrides | loss_std | env steps | " + " | ".join(types)
          + f" | steps to {name} ≥ {value} |")
    print("|---" * (5 + len(types)) + "|")
    for r in rows:
        reach = r["to_threshold"]
        rets = " | ".join("-" if r["returns"][t] is None else f"{r['returns'][t]:.1f}" for t in types)
        print(f"| {r['job']} | {r['overrides']} | {r['loss_std']} | {r['env_steps']:,} | {rets} | "
              + (f"{reach['env_steps']:,} ({reach['seconds']} s)" if reach else "-") + " |")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
