"""The vectors the benchmarks measure rlpipe against, built one way for every script
(engine_sps.py, vector_sps.py): Gymnasium env thunks as rlpipe's adapter makes its envs,
PufferLib's `Multiprocessing` over the same thunks, and a child process run in a session of
its own and killed whole (PufferLib's worker processes outlive a parent that dies or hangs).

PufferLib is the `pufferlib-core` wheel. Its metadata pins another torch than rlpipe's, so it
lives in a bench venv installed with --no-deps that borrows rlpipe's venv for numpy,
gymnasium, psutil, torch and rlpipe itself:

    python3 -m venv /tmp/rlv-bench-venv
    /tmp/rlv-bench-venv/bin/pip install --no-deps pufferlib-core
    echo "import site; site.addsitedir('<repo>/.venv/lib/python3.11/site-packages')" \\
        > /tmp/rlv-bench-venv/lib/python3.11/site-packages/zz_rlpipe.pth

and a script with PufferLib rows runs with that venv's python (PYTHONPATH=<checkout> to
measure a checkout other than the one .venv installs).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import tempfile
import time

PUFFER_INSTALL = (
    "pip install --no-deps pufferlib-core into a bench venv whose .pth names rlpipe's .venv "
    "site-packages, and run this script with that venv's python (benchmarks/baselines.py)"
)


def gym_thunk(env_id: str, **make_kwargs):
    """A no-argument env constructor: `gym.make(env_id, disable_env_checker=True)`, no wrapper,
    as rlpipe's adapter builds its envs (rlpipe/envs/classic.py)."""
    import gymnasium as gym

    def make():
        return gym.make(env_id, disable_env_checker=True, **make_kwargs)

    return make


# --- PufferLib ----------------------------------------------------------------------------


def puffer_missing(python: str = sys.executable) -> str | None:
    """None where `python` imports PufferLib's vector and emulation modules, else why not and
    how to install it, on one line. Asked of a child: the import pulls in torch, which the
    benchmark's own process has no use for."""
    probe = subprocess.run(
        [python, "-c", "import pufferlib.emulation, pufferlib.vector"], capture_output=True, text=True
    )
    if probe.returncode == 0:
        return None
    lines = probe.stderr.strip().splitlines()
    return f"pufferlib not importable: {lines[-1] if lines else f'exit {probe.returncode}'}; {PUFFER_INSTALL}"


def puffer_workers(n: int) -> int:
    """PufferLib's num_workers for n envs: one per usable CPU (Multiprocessing refuses more
    workers than physical cores unless overwork=True), the most of those that divide n (every
    worker steps n / workers envs)."""
    import psutil

    cpus = min(len(os.sched_getaffinity(0)), psutil.cpu_count(logical=False) or 1)
    workers = max(1, min(n, cpus))
    while n % workers:
        workers -= 1
    return workers


def puffer_half_batch(n: int, workers: int) -> int | None:
    """The EnvPool-style batch: the envs of half the workers (rounded down), so a recv returns
    while the other half steps; None with one worker, where no batch is smaller than all."""
    return None if workers < 2 else (workers // 2) * (n // workers)


def make_puffer(thunk, n: int, *, batch_size: int | None = None, zero_copy: bool = True, seed: int = 0):
    """PufferLib's Multiprocessing over n envs from `thunk`, each wrapped in its
    GymnasiumPufferEnv, on puffer_workers(n) workers; batch_size None is every env."""
    import pufferlib.emulation
    import pufferlib.vector

    def creator(buf=None, seed=0):
        return pufferlib.emulation.GymnasiumPufferEnv(env_creator=thunk, buf=buf, seed=seed)

    return pufferlib.vector.make(
        creator,
        backend=pufferlib.vector.Multiprocessing,
        num_envs=n,
        num_workers=puffer_workers(n),
        batch_size=batch_size or n,
        zero_copy=zero_copy,
        seed=seed,
    )


# --- a child and everything it starts ----------------------------------------------------------


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when `parent` dies (PR_SET_PDEATHSIG): for a child
    whose parent is SIGKILLed, where no `finally` runs. Run in the child, right after the
    fork; `parent` is read before it (after, it may already be init's pid)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the prctl took: no signal will come
        os._exit(1)


def forks_die_with_their_parent() -> None:
    """From now on every process forked here, and by those, dies with the process that forked
    it (die_with_parent through os.register_at_fork; each fork's parent read before it)."""
    forking = [0]

    def before():
        forking[0] = os.getpid()

    os.register_at_fork(before=before, after_in_child=lambda: die_with_parent(forking[0]))


def session_pids(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`, from /proc."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # pid (comm) state ppid pgrp session ...: comm may hold spaces, so split after ')'
                state, _ppid, _pgrp, session = f.read().rpartition(")")[2].split()[:4]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(session) == sid and state != "Z":
            pids.append(int(entry))
    return pids


def end_session(sid: int, deadline_s: float = 10.0) -> None:
    """SIGKILL every process of session `sid` and wait until none is left; RuntimeError naming
    the survivors if some outlive the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        pids = session_pids(sid)
        if not pids:
            return
        if time.monotonic() > end:
            raise RuntimeError(f"processes {pids} of session {sid} survived SIGKILL for {deadline_s} s")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def run_in_own_session(cmd: list[str], timeout: float) -> tuple[int | None, str, str]:
    """Run `cmd` in a session of its own: (its exit status, None past `timeout`; its stdout;
    its stderr). Every process of that session (PufferLib's workers among them) is killed and
    gone before this returns, whatever the child did; the child dies with this process if this
    one is SIGKILLed (its own children too where it calls forks_die_with_their_parent, as
    engine_sps.py's PufferLib child does). Its output goes to files, not pipes: a worker that
    inherited a pipe would hold it open after the child exits."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=err,
            text=True,
            start_new_session=True,
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            try:
                end_session(proc.pid)
            finally:
                proc.kill()  # the leader itself if end_session raised first; a no-op once reaped
                proc.wait()
        out.seek(0)
        err.seek(0)
        return returncode, out.read(), err.read()
