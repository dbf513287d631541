"""Shared test helpers: compose the real Hydra config, run the real CLI, check for leftovers."""

from __future__ import annotations

import contextlib
import copy
import getpass
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from rlpipe.config import conf_dir, register_schema

REPO = Path(__file__).resolve().parent.parent
register_schema()
# The twelve types of the seed12 mix, in its order, as conf/ declares them (tests/test_config.py
# holds the literal list: it is the check of that file).
SEED12_TYPES = tuple(OmegaConf.load(conf_dir() / "env_mix" / "seed12.yaml").weights)

# Fixtures that make one real run for several tests (session or module scope). Under
# pytest-xdist each worker would make its own copy of a run its tests need, so the tests that
# read one run are one xdist group (`--dist loadgroup`, pyproject.toml): they go to one worker,
# and the run is made once, as without xdist. `signalled_run` makes one run per signal, and
# the tests of each signal are a group of their own (the tests' `sig` parameter).
SHARED_RUNS = ("cartpole_multirun", "signalled_run", "chaos_run", "stall_restarts")


def pytest_configure(config):
    """On an xdist worker, torch computes on its share of the CPUs (as the engine's learner
    does: conf/learner/ppo.yaml, torch_threads). Two workers of two intra-op threads each on
    two cores spin-wait on each other: the CNN ladder of tests/test_rl_blocks.py took 25 s of
    CPU so, 3.8 s on one thread (measured side by side, two copies at once)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // int(workers)))
    # Before collection: importing torchrl (tests/test_vector_torchrl.py) makes torch's inductor
    # cache dir, /tmp/torchinductor_<user> unless this names another; a session fixture would
    # come too late. This process's own temp dir, removed when it ends (pytest_unconfigure).
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        config._inductor_dir = tempfile.mkdtemp(prefix="rlpipe-tests-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = config._inductor_dir


def _env_var_in_tmp(name: str, folder):
    """Sets `name` to `folder` for this process and the runs it starts, then puts it back."""
    before = os.environ.get(name)
    os.environ[name] = str(folder)
    yield
    if before is None:
        del os.environ[name]
    else:
        os.environ[name] = before


@pytest.fixture(autouse=True, scope="session")
def sb3_logs_in_tmp(tmp_path_factory):
    """Stable-Baselines3 makes a /tmp/SB3-<time> folder for every model built without a log dir
    (its `configure` falls back to the temp dir unless SB3_LOGDIR is set): point it into the
    session's tmp, which goes when the session ends."""
    yield from _env_var_in_tmp("SB3_LOGDIR", tmp_path_factory.mktemp("sb3"))


def pytest_unconfigure(config):
    """tmp_path_retention_policy "none" (pyproject.toml) removes the session's tmp folders but
    not their root, /tmp/pytest-of-<user>: the main process removes it too once it is empty
    (an xdist worker's session ends first, inside it). The inductor cache dir of
    pytest_configure goes in every process (torch.optim.Adam, the reference of several tests,
    and torchrl fill it; the runs the tests start inherit it)."""
    inductor_dir = getattr(config, "_inductor_dir", None)
    if inductor_dir is not None:
        shutil.rmtree(inductor_dir, ignore_errors=True)
        del os.environ["TORCHINDUCTOR_CACHE_DIR"]
    if hasattr(config, "workerinput") or config.option.basetemp:
        return
    root = Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}"  # pytest's default root
    with contextlib.suppress(OSError):  # gone already, or not empty: a kept session's
        root.rmdir()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the node ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        shared = [name for name in SHARED_RUNS if name in item.fixturenames]
        assert len(shared) <= 1, f"{item.nodeid} reads two shared runs {shared}: they cannot be one group"
        if shared:
            group = shared[0]
            if group == "signalled_run":
                group += f"-{signal.Signals(item.callspec.params['sig']).name}"
            item.add_marker(pytest.mark.xdist_group(group))


_COMPOSED: dict[tuple[str, ...], DictConfig] = {}


def compose_cfg(overrides: list[str] | None = None) -> DictConfig:
    """conf/ composed with `overrides`, as the CLI composes it. A composition takes 0.3-0.4 s
    of CPU and the suite asks for the same ones many times (every group option in two
    files), so each is made once per process and handed out as a copy the test may change."""
    key = tuple(overrides or ())
    if key not in _COMPOSED:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            _COMPOSED[key] = compose(config_name="config", overrides=list(key), return_hydra_config=False)
    return copy.deepcopy(_COMPOSED[key])


def ppo_batch(learner, n: int = 256, seed: int = 0) -> dict:
    """A PPO batch of random rows for `learner`'s plan (four types in turn): what the update
    tests train on without rollouts."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {
        "obs": {k.name: torch.randn((n,) + k.shape, generator=g) for k in learner.plan.obs_keys},
        "types": torch.arange(4).repeat(n // 4),
        "a_disc": torch.randint(0, 2, (n,), generator=g),
        "a_cont": torch.randn(n, max(learner.plan.actions.cont_dim, 1), generator=g),
        "logp": torch.randn(n, generator=g) - 1,
        "value": torch.randn(n, generator=g) * 50,
        "adv": torch.randn(n, generator=g) * 10,
        "ret": torch.randn(n, generator=g) * 100,
    }


def delegated_v2_root(tmp_path: Path, controllers: str = "cpu memory"):
    """A plain directory standing in for a cgroup v2 root that delegates `controllers` (this
    machine's own v2 hierarchy delegates none): the CgroupRoots that point the drivers at it."""
    from rlpipe.supervisor.cgroups import CgroupRoots

    root = tmp_path / "v2"
    root.mkdir()
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("cpu memory\n")
    return CgroupRoots(v2=root, v1=tmp_path / "v1")


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"{name}_bench", REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rlpipe_cmd(run_dir: Path, *overrides: str) -> list[str]:
    # The probe beside each run (nice 10) plays 5 random episodes a type, not 20, and not the
    # untrained policy, whose torch import alone is about 1.5 s of CPU a run, taken from the
    # run and the other xdist workers. The tests that need more set it (test_multitask.py has
    # a run that plays the untrained policy through the driver, and the probe's work in process).
    return [
        sys.executable,
        "-m",
        "rlpipe",
        f"hydra.run.dir={run_dir}",
        "logging.progress_interval_s=2",
        "logging.random_return_episodes=5",
        "logging.initial_policy_episodes=0",
        *overrides,
    ]


def driver_dies_with_pytest() -> None:
    """preexec_fn for a driver the tests start: SIGTERM it (a clean teardown: workers, Redis,
    segments, cgroups) if pytest itself is killed, so no signal to pytest leaves a run behind."""
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def run_cli(run_dir: Path, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m rlpipe` to the end; the result carries the driver's pid (`.pid`), which
    names the run's shared-memory segments and cgroups."""
    proc = subprocess.Popen(
        rlpipe_cmd(run_dir, *overrides),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=driver_dies_with_pytest,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"rlpipe did not finish in {timeout} s:\n{err[-3000:]}") from None
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    result.pid = proc.pid
    return result


def rlpipe_with(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m rlpipe <args>` as a user types it (no run dir or probe settings of the
    tests' own: `--help`, a multirun with its sweep dir), run to its end."""
    return subprocess.run(
        [sys.executable, "-m", "rlpipe", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=driver_dies_with_pytest,
    )


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def run_leftovers(driver_pid: int) -> list[str]:
    """Shared-memory segments and cgroup dirs still named after a (finished) driver pid."""
    pattern = f"rlpipe_{driver_pid}-*"
    found = [str(p) for p in Path("/dev/shm").glob(pattern)]
    for base in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified"):
        found += [str(p) for p in Path(base).glob(pattern)]
    found += [str(p) for p in Path("/tmp").glob(pattern)]
    return found


@pytest.fixture
def short_tmp():
    """A short directory under /tmp (unix socket paths must stay under 108 bytes). Whatever
    the test started there and left running is stopped before the directory goes."""
    path = Path(tempfile.mkdtemp(prefix="rlt", dir="/tmp"))
    yield path
    stop_what_runs_in(path)
    shutil.rmtree(path, ignore_errors=True)


def stop_what_runs_in(path: Path, grace_s: float = 60) -> None:
    """Stop this process's children whose command line names `path` (a driver's
    `hydra.run.dir`) and everything under them. A test that fails half-way through leaves
    its driver running to the driver's own stop condition, and it would write into the
    removed directory meanwhile (it did in a CI run). SIGTERM first: the driver's own clean
    teardown (workers, Redis, segments, cgroups); SIGKILL for whatever is left after `grace_s`."""
    import psutil

    def names_path(child: psutil.Process) -> bool:
        with contextlib.suppress(psutil.Error):
            return any(str(path) in arg for arg in child.cmdline())
        return False

    running = [child for child in psutil.Process().children() if names_path(child)]
    if not running:
        return
    under = []  # listed now: a killed driver's children are reparented and out of reach
    for child in running:
        with contextlib.suppress(psutil.Error):
            under += child.children(recursive=True)
    for child in running:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _gone, alive = psutil.wait_procs(running, timeout=grace_s)
    for process in [*alive, *under]:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs([*alive, *under], timeout=10)


@pytest.fixture(scope="session")
def cartpole_multirun():
    """A real two-job multirun (16 CartPoles, 15k env steps, seeds 1 and 2, a checkpoint every
    2 s), made once for the tests that read runs back: rlpipe.report compares its jobs,
    rlpipe.eval plays job 0's policy, and job 0 stands for a short plain run (its TensorBoard
    tags, its health report, no long-run verdict). Tests add files to it (eval/, a rewritten
    health report), never remove any."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="rlm", dir="/tmp"))
    sweep = base / "mr"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlpipe",
            "-m",
            "env_mix=cartpole",
            "env_count=16",
            "run.total_env_steps=15000",
            "run.seed=1,2",
            "learner.checkpoint_interval_s=2",
            "logging.random_return_episodes=3",
            "logging.initial_policy_episodes=0",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    yield sweep
    shutil.rmtree(base, ignore_errors=True)


# -- evaluation during training, and a run stopped by a signal ---------------------------------

EVAL_CHILD = "rlpipe.eval.during"


def eval_children(run_dir: Path) -> list:
    """Every live process playing an eval round of this run, whoever its parent."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if EVAL_CHILD in cmd and str(run_dir) in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


def eval_history(run_dir: Path) -> list[dict]:
    """The whole lines of the run's eval history (one may be mid-write while the run goes)."""
    path = run_dir / "eval" / "history.jsonl"
    text = path.read_text() if path.is_file() else ""
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def wait_for(what, timeout_s: float, every_s: float = 0.2):
    """what()'s first truthy value within timeout_s, else its value at the end."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(every_s)
    return what()


def _signalled_run(run_dir: Path, sig: int) -> SimpleNamespace:
    """64 CartPoles in two workers with an eval round every 2 s and reward normalization per
    env, stopped by `sig` once two rounds are in and a third runs: SIGTERM to the driver alone
    (systemd's KillMode=mixed), SIGINT to its whole process group (a terminal's Ctrl-C, which
    reaches every child that stayed in the group, the PPO update's process among them). What was seen while it ran is kept for the
    tests' checks."""
    run_dir.mkdir(parents=True)
    with open(run_dir.parent / "out.txt", "w") as out, open(run_dir.parent / "err.txt", "w") as err:
        driver = subprocess.Popen(
            rlpipe_cmd(
                run_dir,
                "env_mix=cartpole",
                "env_count=64",
                "groups.size=32",
                "run.duration_s=150",
                "run.total_env_steps=null",
                "eval.interval_s=2",
                "eval.episodes=2",
                "logging.random_return_episodes=0",
                "reward_norm=per_env",
                # SIGINT's run trains under hold: its PPO update in a process of its own, which
                # the group's Ctrl-C reaches too (it must still train the final update)
                *(["learner.backlog=hold"] if sig == signal.SIGINT else []),
            ),
            cwd=REPO,
            stdout=out,
            stderr=err,
            process_group=0,  # as a shell starts a job
            preexec_fn=driver_dies_with_pytest,
        )
    try:
        running = wait_for(lambda: len(eval_history(run_dir)) >= 2 and eval_children(run_dir), 120)
        assert running, f"no two rounds and a third running:\n{(run_dir.parent / 'err.txt').read_text()[-3000:]}"
        child = running[0]
        child_ppid = child.ppid()
        child_niced = bool(wait_for(lambda: child.nice() == 19, 10))  # it lowers itself first thing
        import psutil

        update_titles = [
            " ".join(p.cmdline()).strip()
            for p in psutil.Process(driver.pid).children()
            if "ppo update" in " ".join(p.cmdline())
        ]
        if sig == signal.SIGINT:
            os.killpg(driver.pid, sig)
        else:
            driver.send_signal(sig)
        code = driver.wait(90)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    return SimpleNamespace(
        run_dir=run_dir,
        pid=driver.pid,
        code=code,
        stderr=(run_dir.parent / "err.txt").read_text(),
        stdout=(run_dir.parent / "out.txt").read_text(),
        child=child,
        child_ppid=child_ppid,
        child_niced=child_niced,
        update_titles=update_titles,
    )


@pytest.fixture(scope="session")
def signalled_run():
    """`signalled_run(sig)`: the run of `_signalled_run` for that signal, made on first use and
    shared by the tests that read it (the engine's exit code and cleanup, the evaluation's
    rounds and children)."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="rls", dir="/tmp"))  # short: unix socket paths
    runs: dict[int, SimpleNamespace] = {}

    def get(sig: int) -> SimpleNamespace:
        if sig not in runs:
            runs[sig] = _signalled_run(base / signal.Signals(sig).name / "run", sig)
        return runs[sig]

    yield get
    shutil.rmtree(base, ignore_errors=True)
