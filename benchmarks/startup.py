"""Start-up of the full engine at 1,000 / 3,000 / 5,000 / 7,000 envs, cgroups on and off.

    python benchmarks/startup.py [--counts 1000 3000 5000 7000] [--json] [overrides...]

Each run is `python -m rlpipe +stage=day4 env_count=N groups.cgroup=auto|none` (the seed12
mix, day4's cold/hot ramp) for long enough that every group wakes; the figures are the run's
own summary.json: startup_first_step_s (driver process start to the first env step) and
all_envs_ready_s (to every env built and stepping), plus peak PSS.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SECONDS = {1000: 40, 3000: 55, 5000: 70, 7000: 80}


def run(n: int, cgroup: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="rls", dir="/tmp") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "rlpipe", f"hydra.run.dir={run_dir}", "+stage=day4",
               f"env_count={n}", f"groups.cgroup={cgroup}",
               f"run.duration_s={SECONDS.get(n, 80)}", "run.total_env_steps=null", *extra]
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"run failed ({n} envs, cgroup {cgroup}):\n{out.stderr[-3000:]}")
        s = json.loads((run_dir / "summary.json").read_text())
        return {k: s[k] for k in ("startup_first_step_s", "all_envs_ready_s", "active_envs_end",
                                  "peak_rss_mb", "sps", "cgroup_driver")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", type=int, nargs="+", default=[1000, 3000, 5000, 7000])
    ap.add_argument("--json", action="store_true", help="print one JSON line last")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    results = {}
    print(f"{'envs':>6} {'cgroups':>8} {'first step s':>13} {'all ready s':>12} {'active':>7} "
          f"{'peak PSS MB':>12}", flush=True)
    for n in args.counts:
        for cgroup in ("auto", "none"):
            r = run(n, cgroup, args.overrides)
            results[f"{n}/{cgroup}"] = r
            print(f"{n:>6} {r['cgroup_driver']:>8} {r['startup_first_step_s']:>13} "
                  f"{r['all_envs_ready_s']!s:>12} {r['active_envs_end']:>7} {r['peak_rss_mb']:>12}",
                  flush=True)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
