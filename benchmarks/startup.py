"""Start-up of the full engine at 1,000 / 3,000 / 5,000 / 7,000 envs, cgroups on and off, beside
one process building the same envs one after another.

    python benchmarks/startup.py [--counts 1000 3000 5000 7000] [--json] [overrides...]

Each run is `python -m rlpipe +stage=day4 env_count=N groups.cgroup=auto|none` (the seed12
mix, day4's cold/hot ramp) for long enough that every group wakes; the figures are the run's
own summary.json: startup_first_step_s (driver process start to the first env step) and
all_envs_ready_s (to every env built and stepping), plus peak PSS.

`serial_build_s`, measured in the same invocation (a fresh process, once per count, before
the engine runs): the same config composed with the same overrides, the same env-id -> type
plan, then one worker-style EnvTable over all N envs whose envs are built and reset one after
another (`EnvTable.start`: the factory, reset, contract check and staging write a worker
does). It counts planning the mix and the env modules' first import (`serial_import_s`: a
lone process pays them too; planning describes one env per type) plus the build loop
(`serial_loop_s`); not the interpreter's start or composing the config. Its memory column is
that process's peak RSS (ru_maxrss), not PSS. The table prints
`all_envs_ready_s / serial_build_s` for each engine run (2 cores: 0.5 is the ideal).

`worker_build_cpu_s`, in the same process, before its serial loop: the engine's own build
work. After the imports (as the forkserver holds them), one child is forked per worker group
(`groups.size` envs), one after another, and builds its envs as a worker does; the figure is
the children's CPU seconds, summed. It exceeds `serial_loop_s` by what every process pays
again: each type's first env in a process (pybullet's ~25 ms, minigrid's ~11 ms) and its page
faults. `cpu_floor_s` = worker_build_cpu_s / CPUs: the fastest the fleet could build on this
machine with every CPU building and nothing else running (`floor/serial` beside
`ready/serial`). `serial_loop_cpu_s`: the serial loop's own CPU seconds, the figure the forked
builds' CPU compares with whatever else the machine runs (the loop's wall time grows with it).

The `work` row of each engine run: the CPU seconds its driver (every thread), live workers and
their forkserver had used when every env had stepped (summary.json `startup_cpu_s`), over the
CPUs: all the work that start-up did (builds, process starts, the awake groups' steps,
inference and updates, the driver's own start), at perfect packing. It is the least `all_envs_ready_s`
could be with that work, and the gap to `floor` is what the run did besides building.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SECONDS = {1000: 40, 3000: 55, 5000: 70, 7000: 80}

SERIAL = r"""
import importlib, json, os, resource, sys, time
import numpy as np
from hydra import compose, initialize_config_dir
from rlpipe.config import conf_dir, register_schema, run_spec
from rlpipe.envs.registry import make_factory, plan_mix, preload_modules
from rlpipe.worker.envtable import EnvTable

register_schema()
with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
    cfg = compose(config_name="config", overrides=json.loads(sys.argv[1]))
spec = run_spec(cfg)
t0 = time.perf_counter()
plan = plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)   # as the driver plans the run
for m in preload_modules(spec.env_types):
    importlib.import_module(m)
t1 = time.perf_counter()
n = spec.env_count
factories = [make_factory(t.node) for t in spec.env_types]
c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
for lo in range(0, n, spec.groups.size):         # one worker group at a time, as forked workers
    hi = min(lo + spec.groups.size, n)
    pid = os.fork()
    if pid == 0:
        rows = [np.zeros((hi - lo,) + k.shape, dtype=k.dtype) for k in plan.obs_keys]
        group = EnvTable(lo, plan.env_type[lo:hi], plan.names, plan.specs, factories, plan.obs_keys,
                         rows, spec.run.seed)
        for i in range(hi - lo):
            group.start(i)
        os._exit(0)
    os.waitpid(pid, 0)
c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
worker_cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
t_loop = time.perf_counter()                     # the serial figures leave the section above out
cpu_loop = time.process_time()
staging = [np.zeros((n,) + k.shape, dtype=k.dtype) for k in plan.obs_keys]
table = EnvTable(0, plan.env_type, plan.names, plan.specs, factories, plan.obs_keys, staging, spec.run.seed)
for i in range(n):
    table.start(i)
t2 = time.perf_counter()
loop_cpu = time.process_time() - cpu_loop
faults = len(table.faults)
table.close_all()
cpus = len(os.sched_getaffinity(0))
print(json.dumps({"worker_build_cpu_s": round(worker_cpu, 3), "cpu_floor_s": round(worker_cpu / cpus, 3),
                  "serial_import_s": round(t1 - t0, 3), "serial_loop_s": round(t2 - t_loop, 3),
                  "serial_loop_cpu_s": round(loop_cpu, 3),
                  "serial_build_s": round(t1 - t0 + t2 - t_loop, 3), "serial_build_faults": faults,
                  "serial_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
"""


def serial_build(n: int, extra: list[str]) -> dict:
    overrides = ["+stage=day4", f"env_count={n}", *extra]
    out = subprocess.run(
        [sys.executable, "-c", SERIAL, json.dumps(overrides)], cwd=REPO, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"serial build failed ({n} envs):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(n: int, cgroup: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="rls", dir="/tmp") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [
            sys.executable,
            "-m",
            "rlpipe",
            f"hydra.run.dir={run_dir}",
            "+stage=day4",
            f"env_count={n}",
            f"groups.cgroup={cgroup}",
            f"run.duration_s={SECONDS.get(n, 80)}",
            "run.total_env_steps=null",
            *extra,
        ]
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"run failed ({n} envs, cgroup {cgroup}):\n{out.stderr[-3000:]}")
        s = json.loads((run_dir / "summary.json").read_text())
        return {
            k: s[k]
            for k in (
                "startup_first_step_s",
                "all_envs_ready_s",
                "startup_cpu_s",
                "active_envs_end",
                "peak_rss_mb",
                "sps",
                "cgroup_driver",
            )
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", type=int, nargs="+", default=[1000, 3000, 5000, 7000])
    ap.add_argument("--cgroups", nargs="+", default=["auto", "none"], choices=["auto", "none"])
    ap.add_argument("--json", action="store_true", help="print one JSON line last")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    cpus = len(os.sched_getaffinity(0))
    results = {}
    print(
        f"{'envs':>6} {'cgroups':>8} {'first step s':>13} {'all ready s':>12} {'active':>7} "
        f"{'peak PSS MB':>12} {'serial build s':>15} {'ready/serial':>13}",
        flush=True,
    )
    for n in args.counts:
        serial = serial_build(n, args.overrides)
        results[f"{n}/serial"] = serial
        print(
            f"{n:>6} {'serial':>8} {'':>13} {'':>12} {'':>7} {serial['serial_peak_rss_mb']:>12} "
            f"{serial['serial_build_s']:>15} {'':>13}  (imports {serial['serial_import_s']} s + "
            f"build loop {serial['serial_loop_s']} s, {serial['serial_build_faults']} build faults)",
            flush=True,
        )
        serial["floor_over_serial_build"] = round(serial["cpu_floor_s"] / serial["serial_build_s"], 3)
        print(
            f"{n:>6} {'floor':>8} {'':>13} {serial['cpu_floor_s']:>12} {'':>7} {'':>12} "
            f"{serial['serial_build_s']:>15} {serial['floor_over_serial_build']:>13}  (the groups' "
            f"builds in forked workers: {serial['worker_build_cpu_s']} CPU s, over every CPU)",
            flush=True,
        )
        for cgroup in args.cgroups:
            r = run(n, cgroup, args.overrides)
            ready = r["all_envs_ready_s"]
            r["ready_over_serial_build"] = (
                round(ready / serial["serial_build_s"], 3) if ready and serial["serial_build_s"] else None
            )
            results[f"{n}/{cgroup}"] = r
            print(
                f"{n:>6} {r['cgroup_driver']:>8} {r['startup_first_step_s']:>13} "
                f"{ready!s:>12} {r['active_envs_end']:>7} {r['peak_rss_mb']:>12} "
                f"{serial['serial_build_s']:>15} {r['ready_over_serial_build']!s:>13}",
                flush=True,
            )
            cpu = r["startup_cpu_s"]
            if cpu:
                # all the work done by then, spread over every CPU: the least that start-up,
                # done this way, could have taken
                work = sum(cpu.values())
                r["work_floor_s"] = round(work / cpus, 3)
                r["work_floor_over_serial_build"] = round(r["work_floor_s"] / serial["serial_build_s"], 3)
                print(
                    f"{n:>6} {'work':>8} {'':>13} {r['work_floor_s']:>12} {'':>7} {'':>12} "
                    f"{serial['serial_build_s']:>15} {r['work_floor_over_serial_build']:>13}  (CPU used "
                    f"by then: driver {cpu['driver']} s + workers {cpu['workers']} s + forkserver "
                    f"{cpu['forkserver']} s, over {cpus} CPUs)",
                    flush=True,
                )
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
