"""Random-action env-steps/s of rlpipe.vector (sync `step` and async `send`/`recv`) against
Gymnasium's SyncVectorEnv and AsyncVectorEnv on the same CartPoles, and a survival table: the
same backends on a CartPole that raises once every 10,000 of its steps and one env that blocks
forever once (benchmarks/vector_faults.py).

    python benchmarks/vector_sps.py [--counts 64 1000 7000] [--seconds 20]
                                    [--async-max 256] [--fault-envs 1000] [--fault-seconds 600]
                                    [--skip-sps] [--skip-faults] [--sb3] [--sb3-ppo] [--json]
                                    [rlpipe overrides...]

PufferLib's `Multiprocessing` (the `pufferlib-core` wheel, in a bench venv:
benchmarks/baselines.py says how; run this script with that venv's python) is the `puffer`
backend, one worker per CPU and the batch every env (baselines.make_puffer, as engine_sps.py
builds its zero-copy row), skipped where it does not import.

Every backend builds its envs the same way: `gym.make(id, disable_env_checker=True)`, no
wrapper (what rlpipe's adapter does, rlpipe/envs/classic.py). Actions are drawn once per step
for the whole batch with numpy (the same cost for every backend) and the clock covers the
stepping loop only (construction, reset and warm-up excluded). rlpipe's async form keeps every
env in flight and takes whichever slices are ready (batch_size = num_envs / 4). AsyncVectorEnv
(one process per env) runs only up to --async-max envs. The backends run one after another in
one invocation, so their ratios share the machine's state; the load average is printed.

Survival trial: each backend in its own process for --fault-seconds (a hang must not take this
script down): survived (steps/s, faults reported, every env stepped in the last tenth), raised
(the exception that ended it) or hung (no step returned for --hang-limit seconds).
rlpipe.vector runs with worker.step_timeout_s=2 (the trial's deadline).

--sb3 (needs rlpipe[sb3]) adds Stable-Baselines3's VecEnvs to the env-steps/s rows: rlpipe's
adapter (rlpipe.vector.sb3, sync step_async/step_wait), DummyVecEnv and SubprocVecEnv (one
process per env, started with fork), SB3's API throughout (infos as a list of dicts), built and
timed as the other rows. --sb3-ppo times SB3's PPO with rl-zoo's CartPole settings to a
100-episode mean of 475 on each of the three (benchmarks/sb3_ppo.py), one run per --sb3-seeds
and --sb3-torch-threads (0: torch's default).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # baselines and vector_faults, here and (inherited) in every worker

from baselines import gym_thunk, make_puffer, puffer_missing, run_in_own_session  # noqa: E402

ENV_ID = "CartPole-v1"
FAULTY_ID = "vector_faults:FaultyCartPole-v0"
RAISE_EVERY = 10_000
HANG_AT = 200
BACKENDS = ("rlpipe_sync", "rlpipe_async", "gym_sync", "gym_async", "puffer")
# --sb3: Stable-Baselines3's VecEnvs (rlpipe[sb3]): rlpipe's adapter, DummyVecEnv, SubprocVecEnv
SB3_BACKENDS = ("sb3_rlpipe", "sb3_dummy", "sb3_subproc")
START_SLACK_S = 60.0  # a trial's start-up allowance (1,000 AsyncVectorEnv processes, a loaded machine)


def build(backend: str, env_id: str, n: int, seed: int, make_kwargs: dict | None = None, overrides: tuple = ()):
    """(vector, stepping function(actions) -> per-step results, the batch's action count)"""
    make_kwargs = make_kwargs or {}
    if backend in SB3_BACKENDS:
        from sb3_ppo import make_vec_env

        return make_vec_env(backend, n, seed, env_id, overrides)
    if backend.startswith("rlpipe"):
        import rlpipe.vector

        ov = list(overrides) + [f"+env_mix.types.gym.make_kwargs.{k}={v}" for k, v in make_kwargs.items()]
        if backend == "rlpipe_async":
            return rlpipe.vector.make(env_id, n, seed=seed, overrides=ov, batch_size=max(1, n // 4))
        return rlpipe.vector.make(env_id, n, seed=seed, overrides=ov)
    import gymnasium as gym

    if backend == "puffer":
        return make_puffer(gym_thunk(env_id, **make_kwargs), n, seed=seed)
    fns = [gym_thunk(env_id, **make_kwargs) for _ in range(n)]
    if backend == "gym_sync":
        return gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    if backend == "gym_async":
        return gym.vector.AsyncVectorEnv(
            fns, shared_memory=True, context="fork", autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )
    raise SystemExit(f"unknown backend {backend!r}")


def run_steps(
    backend: str, envs, n: int, seconds: float, rng, on_step=None, hang_limit: float | None = None
) -> tuple[int, float]:
    """Env steps taken and the seconds they took, random actions, for `seconds`."""
    steps, t0 = 0, time.perf_counter()
    if backend == "puffer":
        envs.async_reset(0)
        while time.perf_counter() - t0 < seconds:
            obs, rew, term, trunc, _teacher, infos, ids, _mask = envs.recv()
            steps += len(ids)
            if on_step is not None:
                on_step(ids, {})
            envs.send(rng.integers(0, 2, len(ids)))
        return steps, time.perf_counter() - t0
    if backend == "rlpipe_async":
        envs.async_reset(seed=0)
        while time.perf_counter() - t0 < seconds:
            obs, rew, term, trunc, info = envs.recv()
            ids = info["env_id"]
            steps += len(ids)
            if on_step is not None:
                on_step(ids, info)
            envs.send(rng.integers(0, 2, len(ids)), ids)
        return steps, time.perf_counter() - t0
    if backend in SB3_BACKENDS:  # SB3's API: reset() -> obs, step -> (obs, rewards, dones, infos)
        envs.reset()
        while time.perf_counter() - t0 < seconds:
            envs.step(rng.integers(0, 2, n))
            steps += n
        return steps, time.perf_counter() - t0
    envs.reset(seed=0)
    ids = np.arange(n)
    while time.perf_counter() - t0 < seconds:
        a = rng.integers(0, 2, n)
        if backend == "gym_async" and hang_limit is not None:
            envs.step_async(a)
            out = envs.step_wait(timeout=hang_limit)
        else:
            out = envs.step(a)
        steps += n
        if on_step is not None:
            on_step(ids, out[4])
    return steps, time.perf_counter() - t0


def sps(backend: str, n: int, seconds: float, overrides: tuple = ()) -> dict:
    rng = np.random.default_rng(0)
    envs = build(backend, ENV_ID, n, seed=0, overrides=overrides)
    try:
        run_steps(backend, envs, n, min(2.0, seconds / 5), rng)  # warm-up
        steps, dt = run_steps(backend, envs, n, seconds, rng)
    finally:
        envs.close()
    return {"backend": backend, "envs": n, "sps": round(steps / dt), "steps": steps, "seconds": round(dt, 2)}


def trial(backend: str, n: int, seconds: float, hang_limit: float) -> dict:
    """One survival trial, in this process (the parent runs it in a child)."""
    hang_file = tempfile.mktemp(prefix="rlv_hang_")
    kwargs = {"raise_every": RAISE_EVERY, "hang_at": HANG_AT, "hang_file": hang_file}
    rng = np.random.default_rng(0)
    last = np.zeros(n)
    faults = [0]
    t_start = time.perf_counter()

    def on_step(ids, info):
        last[ids] = time.perf_counter()
        if "_rlpipe_fault" in info:
            faults[0] += int(info["_rlpipe_fault"].sum())

    envs = build(backend, FAULTY_ID, n, seed=0, make_kwargs=kwargs, overrides=("worker.step_timeout_s=2",))
    try:
        steps, dt = run_steps(backend, envs, n, seconds, rng, on_step, hang_limit)
        tail = t_start + 0.9 * (time.perf_counter() - t_start)
        result = {
            "outcome": "survived",
            "sps": round(steps / dt),
            "faults_reported": faults[0],
            "every_env_stepped_in_last_tenth": bool((last >= tail).all()),
        }
    except Exception as exc:  # the backend's own verdict on a fault
        kind = "hung" if type(exc).__name__ == "TimeoutError" else "raised"
        result = {
            "outcome": kind,
            "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}",
            "after_s": round(time.perf_counter() - t_start, 1),
        }
    finally:
        try:
            envs.close(terminate=True) if backend == "gym_async" else envs.close()
        except Exception:
            pass
        Path(hang_file).unlink(missing_ok=True)
    return {"backend": backend, "envs": n, **result}


def trial_in_child(backend: str, n: int, seconds: float, hang_limit: float) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--trial",
        backend,
        "--fault-envs",
        str(n),
        "--fault-seconds",
        str(seconds),
        "--hang-limit",
        str(hang_limit),
    ]
    # its own session, killed whole at the end: a hung backend's worker processes (PufferLib's
    # outlive their parent) go with it
    limit = seconds + hang_limit + START_SLACK_S
    returncode, stdout, stderr = run_in_own_session(cmd, timeout=limit)
    if returncode is None:
        return {
            "backend": backend,
            "envs": n,
            "outcome": "hung",
            "after_s": None,
            "error": f"no result {limit:.0f} s after its start: a step never returned",
        }
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"backend": backend, "envs": n, "outcome": "raised", "error": stderr.strip().splitlines()[-1:]}
    return json.loads(lines[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counts", type=int, nargs="+", default=[64, 1000, 7000])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--async-max", type=int, default=256)
    p.add_argument(
        "--backends",
        nargs="+",
        default=list(BACKENDS),
        choices=BACKENDS,
        help="(put rlpipe overrides before this flag, or after `--`)",
    )
    p.add_argument(
        "--sb3", action="store_true", help="also SB3's VecEnvs (random-action rows at --counts; no survival trial)"
    )
    p.add_argument("--sb3-ppo", action="store_true", help="SB3 PPO's time to CartPole 475 on each SB3 VecEnv")
    p.add_argument("--sb3-seeds", type=int, nargs="+", default=[1])
    p.add_argument("--sb3-torch-threads", type=int, nargs="+", default=[0], help="0: torch's default")
    p.add_argument("--fault-envs", type=int, default=1000)
    p.add_argument("--fault-seconds", type=float, default=600.0)
    p.add_argument("--hang-limit", type=float, default=30.0)
    p.add_argument("--skip-sps", action="store_true")
    p.add_argument("--skip-faults", action="store_true")
    p.add_argument("--trial", help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for rlpipe.vector's rows (e.g. groups.size=350)")
    args = p.parse_args(argv)
    if args.trial:
        n = min(args.fault_envs, args.async_max) if args.trial == "gym_async" else args.fault_envs
        print(json.dumps(trial(args.trial, n, args.fault_seconds, args.hang_limit)), flush=True)
        return 0
    print(
        f"load average at start: {os.getloadavg()[0]:.2f}, CPUs: {os.cpu_count()}"
        + (f"; rlpipe overrides: {' '.join(args.overrides)}" if args.overrides else ""),
        flush=True,
    )
    rows, survival = [], []
    if "puffer" in args.backends:
        missing = puffer_missing()
        if missing:
            print(f"puffer: skipped ({missing})")
            args.backends = [b for b in args.backends if b != "puffer"]
    if not args.skip_sps:
        for n in args.counts:
            for backend in args.backends:
                if backend == "gym_async" and n > args.async_max:
                    print(f"{backend:13s} {n:6d} envs: skipped (one process per env; --async-max {args.async_max})")
                    continue
                row = sps(backend, n, args.seconds, tuple(args.overrides))
                rows.append(row)
                print(f"{backend:13s} {n:6d} envs: {row['sps']:>9,d} env steps/s", flush=True)
            for backend in SB3_BACKENDS if args.sb3 else ():
                row = sps(backend, n, args.seconds, tuple(args.overrides))
                rows.append(row)
                print(f"{backend:13s} {n:6d} envs: {row['sps']:>9,d} env steps/s", flush=True)
            base = {r["backend"]: r["sps"] for r in rows if r["envs"] == n}
            for b, other in (("sb3_rlpipe", "sb3_dummy"), ("sb3_rlpipe", "sb3_subproc")):
                if b in base and other in base:
                    print(f"  {b} / {other} at {n}: {base[b] / base[other]:.2f}x")
            for b in ("rlpipe_sync", "rlpipe_async"):
                for other in ("gym_sync", "puffer"):
                    if b in base and other in base:
                        print(f"  {b} / {other} at {n}: {base[b] / base[other]:.2f}x")
    ppo = []
    if args.sb3_ppo:
        from sb3_ppo import ppo_to_475

        for threads in args.sb3_torch_threads:
            for seed in args.sb3_seeds:
                for backend in SB3_BACKENDS:
                    res = ppo_to_475(backend, seed, torch_threads=threads or None)
                    ppo.append(res)
                    print(
                        f"sb3 ppo {backend:11s} seed {seed}, torch threads {res['torch_threads']}: 475 at "
                        f"{res['steps_to_475']} steps, {res['s_to_475']} s (last 100: {res['last_100_mean']})",
                        flush=True,
                    )
    if not args.skip_faults:
        for backend in args.backends:
            res = trial_in_child(backend, args.fault_envs, args.fault_seconds, args.hang_limit)
            survival.append(res)
            print(
                f"survival {backend:13s} {res['envs']:6d} envs: {res['outcome']}"
                + (
                    f" ({res.get('error')}" + (f", after {res['after_s']} s)" if res.get("after_s") else ")")
                    if res["outcome"] != "survived"
                    else f" ({res['sps']:,d} steps/s, {res['faults_reported']} faults reported, "
                    f"every env stepped at the end: {res['every_env_stepped_in_last_tenth']})"
                ),
                flush=True,
            )
    if args.json:
        print(json.dumps({"sps": rows, "sb3_ppo": ppo, "survival": survival, "load_end": os.getloadavg()[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
