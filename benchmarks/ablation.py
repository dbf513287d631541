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

from rlpipe.telemetry.tb_events import read_scalars


def first_reach(run_dir: Path, env_type: str, threshold: float):
    scalars = read_scalars(run_dir / "tb")
    curve = scalars.get(f"charts/episodic_return/{env_type}")
    if curve is None:
        return None
    start = float(scalars["charts/sps"].wall_times.min()) - 2.0
    for step, value, wall in zip(curve.steps.tolist(), curve.values.tolist(), curve.wall_times.tolist()):
        if value >= threshold:
            return {"env_steps": step, "seconds": round(wall - start, 1)}
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
