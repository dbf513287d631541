"""The learner's device: its work on a device that is not the CPU's (emulated here, where no
machine that runs the suite has a GPU), `learner.device=cuda` without a GPU as a config error,
`auto` saying what it picked, and the prepared GPU check on a machine without one."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import REPO, run_cli
from rlpipe.learner.device import pick_device


def test_the_learner_runs_on_a_device_that_is_not_the_cpus(tmp_path):
    # The emulation registers a backend for the whole process (torch then reports an
    # accelerator), so its checks run in an interpreter of their own, with temp folders of
    # their own (pytest's shared root would be tidied under this session's feet).
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=--timeout=300"]
        + [f"--basetemp={tmp_path / 'checks'}", str(REPO / "tests" / "device_checks.py")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert re.search(r"\b7 passed", out.stdout), out.stdout[-2000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: learner.device=cuda is valid here")
def test_cuda_without_a_gpu_is_a_config_error_before_anything_starts(short_tmp):
    run_dir = short_tmp / "run"
    out = run_cli(run_dir, "env_mix=cartpole", "env_count=8", "learner.device=cuda", timeout=60)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    message = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(message) == 1 and "learner.device='cuda'" in message[0] and "auto" in message[0], out.stderr
    # nothing started: no Redis socket, no lifecycle db, no summary
    assert sorted(p.name for p in run_dir.iterdir() if p.name != ".hydra") == ["app.log"]
    assert (run_dir / "app.log").stat().st_size == 0


def test_auto_says_in_the_log_which_device_it_picked(caplog):
    with caplog.at_level(logging.INFO, logger="rlpipe.learner.device"):
        device = pick_device("auto")
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert device.type == want
    assert f"learner.device=auto: picked {want}" in caplog.text


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the check would run in full")
def test_the_gpu_check_says_no_gpu_and_exits_0_here(tmp_path):
    out = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), str(tmp_path / "out")],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("gpu_check: no GPU here") and "nothing to measure" in out.stdout
    assert not (tmp_path / "out").exists()  # nothing made for a check that did not run
