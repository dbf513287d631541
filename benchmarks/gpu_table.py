"""The table of benchmarks/gpu_check.sh: what each of its steps measured, read from the files
the steps left in its output folder.

    python benchmarks/gpu_table.py OUT_DIR [--device cuda]

Rows: tests/test_gpu_overlap.py's outcome (pytest's summary); CartPole's env steps and seconds
to a 100-episode mean of 475 with the learner on the device (cartpole_bar.py's JSON line);
day4's env steps/s and trained samples/s with the learner on the CPU and on the device
(summary.json: `sps` is env steps over the stepping loop, and trained/s is `trained_samples`
over the same seconds, `env_steps / sps`); engine_sps.py's rows at its one count (its JSON
line): SyncVectorEnv, PufferLib's rows where they ran, random actions, and PPO hold with
trained samples/s and their share of the random-action rate; random actions again in groups
of 70 (engine_layout.log, beside its own SyncVectorEnv run). A step that left nothing
readable is a row saying so, never a figure.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def last_json(path: Path) -> dict | None:
    """The last line of `path` that parses as a JSON object (the benchmarks print one last)."""
    if not path.is_file():
        return None
    for line in reversed(path.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def overlap_rows(out: Path) -> list[tuple[str, str, str]]:
    """tests/test_gpu_overlap.py's outcome: pytest's last line (passed, failed, skipped)."""
    what = "tests/test_gpu_overlap.py (update stream, pinned copies)"
    path = out / "overlap_tests.log"
    lines = [line.strip("= ") for line in path.read_text(errors="replace").splitlines()] if path.is_file() else []
    said = [line for line in lines if " in " in line and ("passed" in line or "failed" in line or "error" in line)]
    if not said:
        return [(what, "not measured", "no pytest summary in overlap_tests.log")]
    outcome, _, took = said[-1].rpartition(" in ")
    return [(what, outcome, f"in {took}")]


def cartpole_rows(out: Path, device: str) -> list[tuple[str, str, str]]:
    data = last_json(out / "cartpole.log")
    runs = (data or {}).get("runs", {}).get(device) or []
    if not runs:
        return [(f"CartPole to 475, learner on {device}", "not measured", "no result in cartpole.log")]
    r = runs[0]
    if r.get("steps") is None:
        return [(f"CartPole to 475, learner on {device}", "not reached", f"final mean {r.get('final')}")]
    return [
        (
            f"CartPole to 475, learner on {device}",
            f"{r['steps']:,} steps",
            f"{r['to_475_s']:.1f} s from the process's start",
        )
    ]


def day4_rows(out: Path, devices: list[str]) -> list[tuple[str, str, str]]:
    rows = []
    for dev in devices:
        path = out / f"day4_{dev}" / "summary.json"
        if not path.is_file():
            rows.append((f"day4 without bullet_reacher, learner on {dev}", "not measured", f"no {path.name}"))
            continue
        s = json.loads(path.read_text())
        stepping_s = s["env_steps"] / s["sps"] if s.get("sps") else None
        trained = s["trained_samples"] / stepping_s if stepping_s else None
        rows.append(
            (
                f"day4 without bullet_reacher ({s['env_count']:,} envs, {s['wall_s']:.0f} s), learner on {dev}",
                f"{s['sps']:,.0f} env steps/s",
                f"{trained:,.0f} trained samples/s, {s['updates']} updates" if trained is not None else "no stepping",
            )
        )
    return rows


def engine_rows(out: Path, device: str) -> list[tuple[str, str, str]]:
    data = last_json(out / "engine_sps.log")
    if not data or not data.get("counts"):
        return [("engine_sps.py", "not measured", "no result in engine_sps.log")]
    n, row = next(iter(data["counts"].items()))
    sync = row.get("sync_vector_env", {}).get("env_sps_median")
    rows = [(f"SyncVectorEnv, {int(n):,} CartPoles", f"{sync:,.0f} env steps/s", "1.00x")]
    for key, what in (("puffer_all", "batch = all"), ("puffer_half", "batch = half")):
        p = row.get(key)
        if isinstance(p, dict) and p.get("env_sps_median"):
            rows.append((f"PufferLib Multiprocessing, {what}", f"{p['env_sps_median']:,.0f} env steps/s", ""))
    random = row.get("engine_random@auto")
    rate = random.get("env_sps_median") if random else None
    if rate:
        rows.append(
            (
                "engine, random actions, auto layout",
                f"{rate:,.0f} env steps/s",
                f"{random['env_over_sync']}x Sync; {random['layout_note']}",
            )
        )
    hold = row.get("engine_hold@auto")
    if hold:
        share = f", {hold['trained_per_s'] / rate:.2f}x random actions" if rate else ""
        rows.append(
            (
                f"engine, PPO backlog=hold, learner on {device}",
                f"{hold['trained_per_s']:,.0f} trained/s",
                f"{hold['trained_over_sync']}x Sync{share}",
            )
        )
    else:
        rows.append((f"engine, PPO backlog=hold, learner on {device}", "not measured", "no steady window"))
    return rows


def layout_rows(out: Path) -> list[tuple[str, str, str]]:
    """Random actions in groups of 70 (engine_layout.log), beside the auto layout's row."""
    what = "engine, random actions, groups of 70"
    data = last_json(out / "engine_layout.log")
    if not data or not data.get("counts"):
        return [(what, "not measured", "no result in engine_layout.log")]
    row = next(iter(data["counts"].values()))
    r = row.get("engine_random@70")
    if not r or not r.get("env_sps_median"):
        return [(what, "not measured", "no steady window")]
    return [
        (what, f"{r['env_sps_median']:,.0f} env steps/s", f"{r['env_over_sync']}x its own Sync; {r['layout_note']}")
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    devices = ["cpu"] if args.device == "cpu" else ["cpu", args.device]
    rows = (
        overlap_rows(args.out)
        + cartpole_rows(args.out, args.device)
        + day4_rows(args.out, devices)
        + engine_rows(args.out, args.device)
        + layout_rows(args.out)
    )
    width = max(len(r[0]) for r in rows)
    print(f"\n{'what':<{width}}  {'figure':>24}  notes")
    for what, figure, note in rows:
        print(f"{what:<{width}}  {figure:>24}  {note}")


if __name__ == "__main__":
    main()
