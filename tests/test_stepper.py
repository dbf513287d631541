"""Step deadlines: a step past worker.step_timeout_s is cut and its env rebuilt by id, in both
ways the worker steps (inline with the SIGALRM deadline, and the helper-thread pool), while its
neighbours step on. Real web_sim envs that block on a socket that never answers."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from conftest import compose_cfg
from rlpipe.config import run_spec
from rlpipe.envs import describe, make_factory
from rlpipe.worker.envtable import EnvTable
from rlpipe.worker.stepper import Stepper

TIMEOUT_S = 0.4


@pytest.fixture(scope="module")
def run():
    return run_spec(compose_cfg(["env_mix=seed12"]))


def _table(run, hanging: tuple[int, ...], n: int = 6):
    """n web_sim envs; the first build of each id in `hanging` hangs forever (until closed) on
    every step; rebuilt envs behave."""
    base = next(t for t in run.env_types if t.name == "web_sim").node
    forever = make_factory({**base, "hang_rate": 1.0, "hang_s": None})
    calm = make_factory({**base, "hang_rate": 0.0})
    spec = describe({**base, "hang_rate": 0.0})
    builds: list[int] = []

    def factory(env_id, seed):
        builds.append(env_id)
        hangs = env_id in hanging and builds.count(env_id) == 1
        return (forever if hangs else calm)(env_id=env_id, seed=seed)

    staging = [np.zeros((n,) + k.shape, dtype=k.dtype) for k in run.obs_keys]
    table = EnvTable(0, np.zeros(n, dtype=np.int16), ("web_sim",), (spec,), [factory], run.obs_keys, staging, 3)
    for i in range(n):
        table.start(i)
    return table, builds


def _results(n: int) -> dict:
    return {
        "reward": np.full(n, np.nan, np.float32),
        "terminated": np.zeros(n, np.uint8),
        "truncated": np.zeros(n, np.uint8),
        "ep_return": np.zeros(n, np.float32),
        "ep_len": np.zeros(n, np.int32),
    }


@pytest.mark.parametrize("threads", [1, 2], ids=["inline", "pool"])
def test_hung_steps_are_cut_rebuilt_and_neighbours_go_on(run, threads):
    table, builds = _table(run, hanging=(0, 3))
    ticks = []
    out = _results(6)
    stepper = Stepper(table, threads, TIMEOUT_S, out, tick=lambda: ticks.append(1))
    assert stepper.inline == (threads == 1)
    try:
        hung_envs = [table.envs[0], table.envs[3]]
        t = time.perf_counter()
        stepper.step(0, 6, [0] * 6)
        took = time.perf_counter() - t
        # hung steps are cut episodes: truncated, no reward, no finished stats
        assert out["truncated"].tolist() == [1, 0, 0, 1, 0, 0]
        assert out["reward"][[0, 3]].tolist() == [0.0, 0.0] and out["ep_len"][[0, 3]].tolist() == [0, 0]
        assert np.allclose(out["reward"][[1, 2, 4, 5]], -0.01)
        assert stepper.hung_total == 2
        if threads > 1:
            assert ticks  # the pool's main thread beat while it waited
        # each hang is cut within the deadline plus one watcher poll
        assert took < 2 * (TIMEOUT_S + TIMEOUT_S / 4) + 1.0
        assert [f.kind for f in table.faults] == ["env_hang", "env_hang"]
        assert sorted(f.env_id for f in table.faults) == [0, 3]
        assert all(f.record["error_type"] == "StepTimeout" for f in table.faults)
        # rebuilt by id; the neighbours kept their envs
        assert builds.count(0) == 2 and builds.count(3) == 2 and builds.count(1) == 1
        assert table.envs[0] is not hung_envs[0] and table.envs[3] is not hung_envs[1]
        if threads == 1:
            # inline: the interrupted env was closed, its socket wait ended
            assert all(e._closed for e in hung_envs)
        # the next slice steps every env, nothing hangs any more
        out["reward"][:] = np.nan
        stepper.step(0, 6, [1] * 6)
        assert np.isfinite(out["reward"]).all() and not out["truncated"].any()
        assert stepper.hung_total == 2
    finally:
        stepper.close()
        table.close_all()
    if threads == 1:
        assert stepper.deadline is not None and not stepper.deadline.is_alive()


def test_slow_steps_under_the_deadline_are_left_alone(run):
    table, _builds = _table(run, hanging=())
    base = next(t for t in run.env_types if t.name == "web_sim").node
    slow = make_factory({**base, "hang_rate": 1.0, "hang_s": TIMEOUT_S / 2})  # blocks, then goes on
    table.envs[1].close(1)
    table.envs[1] = slow(env_id=1, seed=1)
    table.envs[1].reset(1)
    out = _results(6)
    stepper = Stepper(table, 1, TIMEOUT_S, out)
    try:
        for _ in range(3):  # 3 slow steps in a row: each under the deadline, the sum over it
            out["reward"][:] = np.nan
            stepper.step(0, 6, [0] * 6)
            assert np.isfinite(out["reward"]).all() and not out["truncated"].any()
        assert stepper.hung_total == 0 and not table.faults
    finally:
        stepper.close()
        table.close_all()


def test_inline_deadline_needs_the_main_thread(run):
    """Signal handlers run only in the main thread: elsewhere the stepper uses the pool."""
    table, _ = _table(run, hanging=(), n=2)
    made = []
    out = _results(2)
    th = threading.Thread(target=lambda: made.append(Stepper(table, 1, TIMEOUT_S, out)))
    th.start()
    th.join()
    try:
        assert not made[0].inline and made[0].deadline is None
        made[0].step(0, 2, [0, 0])
        assert np.isfinite(out["reward"]).all()
    finally:
        made[0].close()
        table.close_all()


def test_a_detached_step_halts_the_loop_and_detached_rows_are_cut(run):
    """The C loop's side of a stall (rlpipe/worker/relief.py): `detach` of the step in
    progress makes the loop write nothing more once the env call ends (`halted`: True when it
    came back, else its exception); detached rows are cuts, a rejoining row is cut once and
    then stepped again. Env 0 blocks 0.5 s in its step."""
    base = next(t for t in run.env_types if t.name == "web_sim").node
    table, _ = _table(run, hanging=())
    table.envs[0] = make_factory({**base, "hang_rate": 1.0, "hang_s": 0.5})(env_id=0, seed=1)
    table.envs[0].reset(0)
    out = _results(6)
    armed = np.zeros(1, dtype=np.int64)
    loop = table.step_loop(out, armed)
    assert not loop.detach(1)  # nothing in progress
    detached = []
    watcher = threading.Thread(target=lambda: (time.sleep(0.2), detached.append(loop.detach(int(armed[0])))))
    watcher.start()
    serial = loop.run(0, 6, [0] * 6, 0)
    watcher.join()
    assert detached == [True] and serial == 1 and armed[0] == 0
    assert loop.halted is True and loop.halting
    assert np.isnan(out["reward"]).all()  # nothing written, not even env 0's row
    assert not table.faults  # the thread that took over deals with it, not the loop
    loop.rearm()
    assert loop.halted is None and not loop.halting
    table.envs[0] = table.envs[1]  # (the blocking env is done with; a calm one stands in)
    table.detached[:] = [1, 2, 0, 0, 0, 0]
    loop.run(0, 6, [0] * 6, serial)
    assert out["truncated"].tolist() == [1, 1, 0, 0, 0, 0] and out["ep_len"][:2].tolist() == [0, 0]
    assert table.detached.tolist() == [1, 0, 0, 0, 0, 0]  # detached stays; rejoining was cut once
    out["truncated"][:] = 0
    loop.run(0, 6, [0] * 6, serial + 6)
    assert out["truncated"].tolist() == [1, 0, 0, 0, 0, 0]
