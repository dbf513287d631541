"""Hostile envs contained (issue 49): what an env, or a local user beside the run, can do
to a run and the machine, and what the run does about it. Each test runs the real engine on
an env of tests/hostile_gym.py (`env_mix=gym env_mix.id=hostile_gym:<Id>`)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from conftest import REPO, driver_dies_with_pytest, rlpipe_cmd, wait_for

HOSTILE_ENV = {**os.environ, "PYTHONPATH": str(REPO / "tests")}  # driver and workers import hostile_gym


def hostile(env_id: str, *overrides: str) -> list[str]:
    return ["env_mix=gym", f"env_mix.id=hostile_gym:{env_id}", "env_count=16", *overrides]


def start_run(run_dir: Path, *overrides: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        rlpipe_cmd(run_dir, *overrides),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or HOSTILE_ENV,
        preexec_fn=driver_dies_with_pytest,
    )


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"rlpipe did not finish in {timeout} s:\n{err[-3000:]}") from None


# -- secrets: the Redis password off the command line, the run dir its owner's ------------------


def _redis_children(driver_pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(driver_pid).children()
    except psutil.NoSuchProcess:
        return []
    return [p for p in kids if "redis-server" in p.name()]


def test_redis_password_is_not_on_the_command_line_and_the_run_dir_is_private(short_tmp):
    run_dir = short_tmp / "run"
    proc = start_run(
        run_dir,
        *hostile("Plain-v0", "run.total_env_steps=3000", "learner.update_envs=16", "learner.checkpoint_interval_s=1"),
    )
    try:
        redis = wait_for(lambda: _redis_children(proc.pid), 60, every_s=0.05)
        assert redis, "the run's embedded redis-server never appeared"
        # what any local user reads in /proc/<pid>/cmdline
        argv = Path(f"/proc/{redis[0].pid}/cmdline").read_bytes().split(b"\0")
    finally:
        out, err = finish(proc)
    assert proc.returncode == 0, err[-3000:]
    assert not any(b"requirepass" in a or re.fullmatch(rb"[0-9a-f]{32}", a) for a in argv), argv
    assert not list(run_dir.glob("**/redis.conf")), "the password file outlived the server's start"
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    checkpoints = list(run_dir.glob("**/ckpt_*.pt"))
    assert checkpoints
    loose = {
        str(p.relative_to(run_dir)): oct(stat.S_IMODE(p.lstat().st_mode))
        for p in run_dir.rglob("*")
        if not p.is_symlink() and stat.S_IMODE(p.lstat().st_mode) & 0o077
    }
    assert not loose, f"group/other may read: {loose}"
