"""The table of an ablation multirun: one row per job, from each job's own files.

    python -m rlpipe -m env_mix=reward_scales scaling=on,off reward_norm=per_env,off env_count=200 run.duration_s=90
    python benchmarks/ablation.py multirun/<date>/<time> [--threshold cartpole=100] [--json]

Columns: the job's overrides; loss_std (summary.json: std of the total loss over the second
half of the run, in the loss's own units, which reward_norm changes); two scale-free
stability figures over the second half of the run (TensorBoard): `ret_chg_cv`, the std of
the change in mean return of the threshold's env type between successive chart samples,
over that type's mean |return| (raw env returns: the same units with reward_norm on or off),
and `loss_cv`, the std of `losses/total` over its mean |loss| (it blows up when the mean
loss is near 0, so the verdict does not use it); mean return of the last 100 episodes per env
type; and time-to-threshold: env steps and seconds until the curve
charts/episodic_return/<type> first reaches the threshold (never: '-').

Seconds to threshold are counted from the run's first env step, on the run's own records:
summary.json `started_at_unix` (the wall-clock time of the run's t0, the origin of its *_s
figures) + `startup_first_step_s`, against the TensorBoard event's wall time. Runs from
before `started_at_unix` existed fall back to the wall time of the first `charts/sps` sample
(written when the driver's loop starts, before the first step); the `from` column says which.
The stability verdict ranks the jobs by `ret_chg_cv` (lower: steadier).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import yaml

from rlpipe.telemetry.tb_events import read_scalars

VERDICT_FIGURE = "ret_chg_cv"


def _second_half(series, t_mid: float) -> list[float]:
    if series is None:
        return []
    return [v for v, w in zip(series.values.tolist(), series.wall_times.tolist()) if w >= t_mid]


def _cv(values) -> float | None:
    """std / mean |value|: scale-free (None with fewer than 3 values or a zero mean)."""
    if len(values) < 3:
        return None
    scale = float(np.mean(np.abs(values)))
    return round(float(np.std(values)) / scale, 4) if scale > 0 else None


def tb_figures(run_dir: Path, summary: dict, env_type: str, threshold: float) -> dict:
    scalars = read_scalars(run_dir / "tb")
    sps = scalars.get("charts/sps")
    if summary.get("started_at_unix") is not None and summary.get("startup_first_step_s") is not None:
        start, anchor = summary["started_at_unix"] + summary["startup_first_step_s"], "first step"
        t_mid = summary["started_at_unix"] + summary["wall_s"] / 2
    elif sps is not None:
        start, anchor = float(sps.wall_times.min()), "first charts/sps"
        t_mid = (start + float(sps.wall_times.max())) / 2
    else:
        return {"to_threshold": None, "from": "-", "ret_chg_cv": None, "loss_cv": None}
    out = {"from": anchor, "to_threshold": None}
    curve = scalars.get(f"charts/episodic_return/{env_type}")
    if curve is not None:
        for step, value, wall in zip(curve.steps.tolist(), curve.values.tolist(), curve.wall_times.tolist()):
            if value >= threshold:
                out["to_threshold"] = {"env_steps": step, "seconds": round(wall - start, 1)}
                break
    late = _second_half(curve, t_mid)
    scale = float(np.mean(np.abs(late))) if late else 0.0
    out["ret_chg_cv"] = round(float(np.std(np.diff(late))) / scale, 4) if len(late) >= 3 and scale > 0 else None
    out["loss_cv"] = _cv(_second_half(scalars.get("losses/total"), t_mid))
    return out


def job_row(run_dir: Path, threshold: tuple[str, float]) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    return {
        "job": run_dir.name,
        "overrides": " ".join(overrides),
        "loss_std": summary["loss_std"],
        "env_steps": summary["env_steps"],
        "returns": summary["mean_return_last100"],
        **tb_figures(run_dir, summary, *threshold),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("--threshold", default="cartpole=100", help="type=value on its return curve")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    name, value = args.threshold.split("=")
    rows = [
        job_row(d, (name, float(value)))
        for d in sorted(args.sweep_dir.iterdir(), key=lambda p: p.name)
        if (d / "summary.json").exists()
    ]
    types = list(rows[0]["returns"]) if rows else []
    print(
        "| job | overrides | loss_std | loss_cv | ret_chg_cv | env steps | "
        + " | ".join(types)
        + f" | steps to {name} ≥ {value} | from |"
    )
    print("|---" * (8 + len(types)) + "|")
    for r in rows:
        reach = r["to_threshold"]
        rets = " | ".join("-" if r["returns"][t] is None else f"{r['returns'][t]:.1f}" for t in types)
        print(
            f"| {r['job']} | {r['overrides']} | {r['loss_std']} | {r['loss_cv'] if r['loss_cv'] is not None else '-'} | "
            f"{r['ret_chg_cv'] if r['ret_chg_cv'] is not None else '-'} | {r['env_steps']:,} | {rets} | "
            + (f"{reach['env_steps']:,} ({reach['seconds']} s)" if reach else "-")
            + f" | {r['from']} |"
        )
    ranked = sorted((r for r in rows if r[VERDICT_FIGURE] is not None), key=lambda r: r[VERDICT_FIGURE])
    print(
        f"\nStability verdict by {VERDICT_FIGURE} (std of the change in mean {name} return between "
        f"chart samples / mean |return|, second half; lower is steadier; loss_std and loss_cv "
        f"are shown, not used): "
        + (
            ", ".join(f"{r['job']} ({r['overrides']}) {r[VERDICT_FIGURE]}" for r in ranked)
            if ranked
            else f"no job has enough {name} return samples"
        )
    )
    if args.json:
        print(json.dumps({"verdict_figure": VERDICT_FIGURE, "rows": rows}))


if __name__ == "__main__":
    main()
