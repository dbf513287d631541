"""The package a user installs (slow: ~6 min on 2 CPUs, most of it pip): the checkout's files,
as a clone has them, built with `python -m build` into an sdist and a wheel built from that
sdist (the Cython board compiled there); the wheel carries the compiled extensions and every
conf/ YAML; in a fresh venv holding only the CPU torch, `pip install` of the wheel brings the
rest, and from outside the checkout `python -m rlpipe` runs 16 CartPoles for 5 s on the
installed package's own Hydra config, and `rlpipe.vector.make` steps envs; the optional
learner libraries stay out (`rlpipe[sb3]`, `rlpipe[torchrl]`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, driver_dies_with_pytest

pytest.importorskip("build")
TORCH = "torch==2.13.0"  # the Makefile's CPU build
EXTENSIONS = ("bell", "board", "slicestats", "steploop", "ppokernels")
VECTOR_SMOKE = """
import rlpipe, rlpipe.vector
from rlpipe.config import conf_dir
envs = rlpipe.vector.make("CartPole-v1", 16, seed=0)
obs, _ = envs.reset()
for _ in range(100):
    obs, rew, term, trunc, info = envs.step(envs.action_space.sample())
envs.close()
try:
    import rlpipe.vector.sb3
    extra = "sb3 importable"
except ImportError as exc:
    extra = str(exc)
print(rlpipe.__file__, conf_dir(), obs.shape, len(envs.return_queue), extra, sep="|")
"""


# The command runs under a shell that leads a process group of its own and ends the whole group
# when pytest goes (PDEATHSIG, then `kill 0`): build's isolated pip, its compilers and a run's
# workers go with it, also when pytest is killed.
GROUP_LEADER = 'trap "trap - TERM; kill -TERM 0" TERM; "$@" & wait $!'


def run(cmd, cwd, timeout=900):
    proc = subprocess.Popen(
        ["bash", "-c", GROUP_LEADER, "run", *map(str, cmd)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=driver_dies_with_pytest,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is left (a timeout, a stray)
        proc.wait()
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{out[-3000:]}\n{err[-3000:]}"
    return out


def checkout_copy(dest: Path) -> Path:
    """The files a clone has (tracked, and new ones git does not ignore), links kept as links."""
    names = run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], REPO).split("\0")
    for name in filter(None, names):
        src = REPO / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree, not yet in the index
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), target)
        else:
            shutil.copy2(src, target)
    return dest


@pytest.fixture
def pkg_tmp():
    """A directory of its own under /tmp (not pytest's numbered tmp dirs, which pytest sessions
    running beside this one on the machine may tidy), removed at the end; one a killed session
    left (its pid in the name, the process gone) is removed by the next."""
    for stale in Path("/tmp").glob("rlpkg*_*"):
        pid = stale.name[len("rlpkg") :].split("_", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(stale, ignore_errors=True)
    path = Path(tempfile.mkdtemp(prefix=f"rlpkg{os.getpid()}_", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_sdist_and_wheel_build_install_in_a_clean_venv_and_run(pkg_tmp):
    tmp_path = pkg_tmp
    src = checkout_copy(tmp_path / "src")
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "build", "--outdir", str(dist), str(src)], tmp_path, timeout=1800)
    sdist = next(dist.glob("rlpipe-*.tar.gz"))
    wheel = next(dist.glob("rlpipe-*.whl"))
    conf_yaml = sorted(p.relative_to(REPO / "conf").as_posix() for p in (REPO / "conf").rglob("*.yaml"))

    with tarfile.open(sdist) as tar:
        in_sdist = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for name in (
        "setup.py",
        "pyproject.toml",
        "rlpipe/native/board.pyx",
        "rlpipe/native/board_seqlock.h",
        "rlpipe/native/ppokernels.h",
    ):
        assert name in in_sdist, name
    with zipfile.ZipFile(wheel) as whl:
        in_wheel = set(whl.namelist())
    for ext in EXTENSIONS:
        assert any(n.startswith(f"rlpipe/native/{ext}.") and n.endswith(".so") for n in in_wheel), ext
    assert {f"rlpipe/conf/{c}" for c in conf_yaml} <= in_wheel

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    py = str(venv / "bin" / "python")
    run([py, "-m", "pip", "install", "-q", TORCH], tmp_path, timeout=1800)
    run([py, "-m", "pip", "install", "-q", str(wheel)], tmp_path, timeout=1800)
    installed = run([py, "-m", "pip", "list", "--format=json"], tmp_path)
    names = {p["name"].lower() for p in json.loads(installed)}
    assert "rlpipe" in names and not names & {"stable-baselines3", "stable_baselines3", "torchrl"}

    work = tmp_path / "elsewhere"  # not the checkout: the installed package and its own conf/
    work.mkdir()
    run_dir = work / "run"
    run(
        [py, "-m", "rlpipe", "env_mix=cartpole", "env_count=16", "run.duration_s=5", f"hydra.run.dir={run_dir}"],
        work,
        timeout=300,
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] > 0, summary
    out = run([py, "-c", VECTOR_SMOKE], work, timeout=300).strip().splitlines()[-1].split("|")
    site = str(venv / "lib")
    assert out[0].startswith(site) and out[1].startswith(site), out
    assert out[2] == "(16, 4)" and int(out[3]) > 0, out
    assert "pip install rlpipe[sb3]" in out[4], out
