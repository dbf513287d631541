"""Shared test helpers: compose the real Hydra config, run the real CLI, check for leftovers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from hydra import compose, initialize_config_dir

from rlpipe.config import conf_dir, register_schema

REPO = Path(__file__).resolve().parent.parent
register_schema()


def compose_cfg(overrides: list[str] | None = None):
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=overrides or [], return_hydra_config=False)


def rlpipe_cmd(run_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "rlpipe", f"hydra.run.dir={run_dir}", "logging.progress_interval_s=2",
            *overrides]


def run_cli(run_dir: Path, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(rlpipe_cmd(run_dir, *overrides), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def rlpipe_processes(exclude_pid: int | None = None) -> list[str]:
    """Processes that belong to rlpipe runs: titled workers, forkservers, embedded redis."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] in (os.getpid(), exclude_pid):
            continue
        if cmd.startswith("rlpipe:") or ("forkserver" in cmd and "rlpipe" in cmd) \
                or ("redis-server" in cmd and "unixsocket" not in cmd and "rlpipe" in cmd):
            found.append(f"{p.info['pid']}: {cmd[:120]}")
    return found


def shm_segments() -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob("rlpipe_*"))


@pytest.fixture
def short_tmp():
    """A short directory under /tmp (unix socket paths must stay under 108 bytes)."""
    import shutil
    import tempfile
    path = Path(tempfile.mkdtemp(prefix="rlt", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
