"""Evaluation during training (eval.interval_s): a real run's rounds in eval/history.jsonl and
TensorBoard, the health report's section and plot, no child left after SIGTERM or SIGINT; the
driver's hook on its own with real child processes (a skipped round, a killed one, a failing
one, one past its time limit, stop mid-round); the per-type time budget of `play`; bad values
as one-paragraph config errors."""

from __future__ import annotations

import ast
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from omegaconf import OmegaConf

from conftest import (
    EVAL_CHILD,
    REPO,
    compose_cfg,
    eval_children,
    eval_history,
    run_cli,
    run_leftovers,
    wait_for,
)
from rlpipe.config import run_spec
from rlpipe.telemetry.tb_events import read_scalars


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_training_run_evaluates_every_interval_and_a_signal_leaves_no_child(signalled_run, sig):
    """64 CartPoles with a round every 2 s, stopped by a signal once two rounds are in and a
    third runs (a run that ends by itself goes through the same teardown); the run is shared
    with tests/test_engine.py's signal test (tests/conftest.py)."""
    run = signalled_run(sig)
    run_dir, child, driver_pid = run.run_dir, run.child, run.pid
    assert run.child_ppid == driver_pid
    assert run.child_niced  # it lowers itself first thing
    assert run.code == 128 + sig, run.stderr[-3000:]
    assert not psutil.pid_exists(child.pid) or child.status() == psutil.STATUS_ZOMBIE
    assert eval_children(run_dir) == []
    assert sorted(p.name for p in (run_dir / "eval").iterdir()) == ["history.jsonl"]  # no snapshot, no temp
    assert run_leftovers(driver_pid) == []

    rounds = eval_history(run_dir)
    assert len(rounds) >= 2
    steps = [r["env_steps"] for r in rounds]
    assert steps == sorted(steps) and steps[-1] > 0  # weights of later and later moments
    for r in rounds:
        cart = r["types"]["cartpole"]
        assert set(cart) == {"mean", "std", "episodes", "cut"}
        assert cart["episodes"] + cart["cut"] == 2 and cart["episodes"] >= 1
        assert 8 <= cart["mean"] <= 500 and cart["std"] >= 0  # CartPole: 1 per step
        assert r["wall_s"] > 0 and r["eval_s"] > 0

    charted = read_scalars(run_dir / "tb")["eval/cartpole"]
    assert charted.steps.tolist() == steps  # each round once, at its weights' env steps
    assert charted.values.tolist() == pytest.approx([r["types"]["cartpole"]["mean"] for r in rounds])

    report = (run_dir / "health_report.md").read_text()
    assert "## Evaluation during training" in report
    assert f"{len(rounds)} round(s) of deterministic episodes" in report
    assert "| `eval/history.jsonl` | present" in report
    assert (run_dir / "health_returns.png").is_file()


@pytest.fixture
def eval_hook(short_tmp):
    """The driver's Evaluation on a real run dir (.hydra/config.yaml as Hydra writes it), a real
    learner's weights and a real TensorBoard writer; what it charted is read back at the end."""
    from rlpipe.envs.registry import plan_mix
    from rlpipe.learner.central import CentralLearner
    from rlpipe.supervisor.evaluation import Evaluation
    from rlpipe.supervisor.runmode import Solo
    from rlpipe.supervisor.services import Services

    run_dir = short_tmp / "run"
    cfg = compose_cfg(["env_mix=cartpole", "env_count=4", "eval.interval_s=1", "eval.episodes=2", "eval.budget_s=20"])
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    spec = run_spec(cfg)
    learner = CentralLearner(spec, plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing))
    services = Services(run_dir, "evtest")
    services.start_tensorboard(None, Solo(spec))
    clock = [time.monotonic()]
    ev = Evaluation(spec, run_dir, clock[0], services)

    def next_round() -> None:
        """The driver's clock moves one interval (eval.interval_s=1) on: a round is due."""
        clock[0] += 1.0
        ev.maybe_start(clock[0], learner)

    ev.maybe_start(clock[0], learner)
    assert ev.proc is None  # the first round is one interval in
    yield ev, next_round, run_dir
    ev.stop()
    services.tb.close()
    services.zctx.term()


def finish(ev, timeout_s: float = 90) -> None:
    assert wait_for(lambda: (ev.poll(), ev.proc is None)[1], timeout_s), "the round did not end"


def test_the_hook_skips_counts_survives_a_crash_and_stops_clean(eval_hook, caplog):
    ev, next_round, run_dir = eval_hook
    caplog.set_level(logging.INFO, logger="rlpipe")
    next_round()
    first = ev.proc
    assert first is not None and (run_dir / "eval" / "policy_snapshot.pt").is_file()
    assert wait_for(lambda: psutil.Process(first.pid).nice() == 19, 20)
    next_round()  # due while the first still runs
    assert ev.skipped == 1 and ev.proc is first
    finish(ev)
    assert ev.rounds == 1 and len(eval_history(run_dir)) == 1 and eval_history(run_dir)[0]["env_steps"] == 0
    assert not (run_dir / "eval" / "policy_snapshot.pt").exists()

    next_round()  # a child killed mid-round: a crash
    ev.proc.kill()
    finish(ev)
    assert ev.failed == 1 and ev.rounds == 1
    assert "eval: round failed (exit -9)" in caplog.text

    config = run_dir / ".hydra" / "config.yaml"  # a run whose config cannot be read back
    good = config.read_text()
    config.write_text("env_count: -1\n")
    next_round()
    finish(ev)
    assert ev.failed == 2 and "rlpipe.eval.during:" in caplog.text and ".hydra/config.yaml" in caplog.text
    config.write_text(good)
    next_round()  # and the next round tries again
    finish(ev)
    assert ev.rounds == 2 and len(eval_history(run_dir)) == 2

    ev.limit_s = 0.5  # a round past its limit (hung in C code)
    next_round()
    slow = ev.proc
    finish(ev)
    assert slow.returncode is not None and ev.failed == 3 and "round still running after" in caplog.text

    next_round()  # teardown mid-round
    child = ev.proc
    ev.stop()
    assert child.poll() is not None and eval_children(run_dir) == []
    assert sorted(p.name for p in (run_dir / "eval").iterdir()) == ["history.jsonl"]

    ev.services.tb.writer.flush()
    scalars = read_scalars(run_dir / "tb")
    assert scalars["eval/cartpole"].steps.tolist() == [0, 0]
    assert scalars["eval_rounds/skipped"].last == 1 and scalars["eval_rounds/failed"].last == 3


def test_a_round_ends_with_its_driver_even_after_sigkill(eval_hook):
    """A driver killed with -9 runs no teardown: the round notices its parent is gone and ends
    without writing its line (2,000 episodes: it is still loading or building envs when its
    parent dies, and would be for seconds more)."""
    import shutil
    import sys

    ev, next_round, run_dir = eval_hook
    next_round()
    weights = run_dir / "weights.pt"
    shutil.copy(run_dir / "eval" / "policy_snapshot.pt", weights)
    ev.stop()
    history_file = run_dir / "other_history.jsonl"
    # a stand-in driver: a parent process that starts the round as the driver does, then waits
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import os, subprocess, sys, time\n"
                f"p = subprocess.Popen([sys.executable, '-m', '{EVAL_CHILD}', {str(run_dir)!r}, '--weights', {str(weights)!r}, "
                f"'--history', {str(history_file)!r}, '--episodes', '2000', '--budget-s', '60', '--max-steps', '5000', "
                "'--wall-s', '1', '--driver-pid', str(os.getpid())], start_new_session=True)\n"
                "print(p.pid, flush=True)\ntime.sleep(120)\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    child = psutil.Process(int(parent.stdout.readline()))
    assert wait_for(lambda: child.nice() == 19, 20)
    parent.kill()
    parent.wait()

    def gone() -> bool:
        try:
            return child.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    assert wait_for(gone, 15)
    assert not history_file.exists()


def test_play_cuts_the_episodes_a_type_budget_does_not_cover():
    from rlpipe.envs.registry import make_factory, plan_mix
    from rlpipe.learner.play import play
    from rlpipe.learner.policy import Policy

    spec = run_spec(compose_cfg(["env_mix=cartpole", "env_count=2"]))
    plan = plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)
    policy = Policy(plan, plan.obs_keys, spec.learner.hidden, spec.learner.cnn_channels, spec.learner.cnn_out)
    factory = make_factory(spec.env_types[0].node)
    none = play(policy, plan, 0, factory, 3, True, 0, 5000, None, budget_s=0.0)
    assert (len(none.returns), none.cut) == (0, 3)
    some = play(policy, plan, 0, factory, 3, True, 0, 5000, None, budget_s=30.0)
    assert (len(some.returns), some.cut) == (3, 0)


def test_a_type_whose_steps_hang_is_cut_at_its_budget_not_its_step_timeout():
    """web_sim with every step blocked until the env is closed: the round's time on it is the
    type's budget (1 s), not the worker's step timeout (30 s) per episode."""
    from rlpipe.envs.registry import make_factory, plan_mix
    from rlpipe.learner.play import play
    from rlpipe.learner.policy import Policy

    spec = run_spec(
        compose_cfg(
            [
                "env_mix=seed12",
                "env_count=12",
                "env_mix.types.web_sim.hang_rate=1.0",
                "env_mix.types.web_sim.hang_s=null",
            ]
        )
    )
    plan = plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)
    policy = Policy(plan, plan.obs_keys, spec.learner.hidden, spec.learner.cnn_channels, spec.learner.cnn_out)
    web = plan.names.index("web_sim")
    t0 = time.monotonic()
    eps = play(
        policy,
        plan,
        web,
        make_factory(spec.env_types[web].node),
        2,
        True,
        0,
        5000,
        spec.worker.step_timeout_s,
        budget_s=1.0,
    )
    took = time.monotonic() - t0
    assert spec.worker.step_timeout_s == 30 and (len(eps.returns), eps.cut) == (0, 2)
    assert took < 8, took


def test_health_report_of_eval_rounds_alone(short_tmp):
    """A run dir holding only its eval history (the run was killed before anything else): the
    section lists the last round beside the first, a line cut off mid-write is counted."""
    from rlpipe.telemetry.health import PLOT_RETURNS, write_health_report

    ev = short_tmp / "eval"
    ev.mkdir()
    rounds = [
        {
            "env_steps": 0,
            "wall_s": 5.0,
            "eval_s": 3.0,
            "types": {
                "cartpole": {"mean": 20.0, "std": 2.0, "episodes": 2, "cut": 0},
                "atari": {"mean": None, "std": None, "episodes": 0, "cut": 2},
            },
        },
        {
            "env_steps": 40_000,
            "wall_s": 65.0,
            "eval_s": 4.0,
            "types": {
                "cartpole": {"mean": 180.5, "std": 9.5, "episodes": 2, "cut": 0},
                "atari": {"mean": 3.0, "std": 0.0, "episodes": 1, "cut": 1},
            },
        },
    ]
    (ev / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds) + '{"env_st')
    report = write_health_report(short_tmp).read_text()
    assert "| `eval/history.jsonl` | present (2 round(s), 1 unreadable line(s)) |" in report
    assert "weights of 40,000 env steps, 65 s into the run, took 4 s" in report
    assert "| cartpole | 180.5 | 9.5 | 2 | 0 | 20 |" in report
    assert "| atari | 3 | 0 | 1 | 1 | missing |" in report
    assert (short_tmp / PLOT_RETURNS).is_file()


@pytest.mark.parametrize(
    "override,key", [("eval.episodes=0", "eval.episodes"), ("eval.interval_s=-1", "eval.interval_s")]
)
def test_cli_bad_eval_value_is_one_paragraph(short_tmp, override, key):
    out = run_cli(short_tmp / "run", override, timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert f"Invalid config value {key}=" in out.stderr and "allowed is a positive" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (short_tmp / "run" / "summary.json").exists()


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no scheduler autogroups on this kernel")
def test_a_child_in_a_session_of_its_own_lowers_its_autogroup_too():
    """The evaluation child runs setsid: an autogroup of its own, scheduled as an equal of the
    whole run's group whatever its nice. lower_priority sets the group's nice with its own;
    a child in its parent's session leaves the group (the run's) alone."""
    # The child prints its nice and its autogroup line as a repr: a task still in the boot's
    # default autogroup (a container whose processes never called setsid, as in CI) reads
    # /proc/self/autogroup as empty, since the kernel prints a line only for a group of its own.
    code = (
        "import os; from rlpipe.procs import lower_priority; lower_priority(19); "
        "print(os.nice(0)); print(repr(open('/proc/self/autogroup').read().strip()))"
    )

    def probe(**popen) -> tuple[int, str]:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, **popen)
        assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
        nice, group = out.stdout.splitlines()
        return int(nice), ast.literal_eval(group)

    nice, own_group = probe(start_new_session=True)
    assert nice == 19 and own_group.endswith(" nice 19"), own_group
    run_group = Path("/proc/self/autogroup").read_text().strip()  # "" in the default autogroup
    assert probe() == (19, run_group)  # the run's group as it was


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="no SCHED_IDLE on this platform")
def test_idle_priority_holds_for_the_process_its_threads_and_its_children():
    """The random-return probe's class (rlpipe.procs.idle_priority): SCHED_IDLE for the process,
    a thread it starts after and a child process (its envs' helpers), and not for its parent."""
    code = (
        "import os, subprocess, sys, threading; from rlpipe.procs import idle_priority; "
        "print(idle_priority()); print(os.sched_getscheduler(0)); "
        "t = []; th = threading.Thread(target=lambda: t.append(os.sched_getscheduler(0))); th.start(); th.join(); "
        "print(t[0]); "
        "print(subprocess.run([sys.executable, '-c', 'import os; print(os.sched_getscheduler(0))'], "
        "capture_output=True, text=True).stdout.strip())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    applied, own, thread, child = out.stdout.split()
    assert applied == "True"
    assert int(own) == int(thread) == int(child) == os.SCHED_IDLE
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the test's own process untouched
