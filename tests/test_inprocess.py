"""The slice engine's two verbs over its two backends: the worker fleet
(rlpipe/supervisor/engine.py) and envs stepped in the calling process
(rlpipe/supervisor/inprocess.py). The in-process backend is what lets the learner's hot path
be tested without processes, so it must hand out what the fleet hands out."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from conftest import compose_cfg
from rlpipe.config import run_spec
from rlpipe.shm.segment import new_run_id
from rlpipe.supervisor.engine import SliceEngine
from rlpipe.supervisor.inprocess import InProcessEngine

# Two groups of 6 envs, 2 slices each: 4 slots of 3 envs; short CartPole episodes (random
# actions end one in about 20 steps) so the rounds cover autoresets.
OVERRIDES = ["env_mix=cartpole", "env_count=12", "groups.size=6", "worker.slices=2", "run.seed=5"]
COMPARED = ("reward", "reward_raw", "terminated", "truncated", "final", "ep_return", "ep_len")


def spec_of(*extra: str):
    return run_spec(compose_cfg([*OVERRIDES, *extra]))


def fleet_rounds(spec, run_dir: Path, actions: list[np.ndarray]) -> list:
    """The rounds of every slot, `actions[k]` sent after round k, through the worker fleet."""
    from rlpipe.vector.engine import release_forkserver

    engine = SliceEngine(spec, run_dir, new_run_id(), time.monotonic(), lambda _: None)
    rounds = []
    try:
        engine.describe()
        engine.start_services({"client": "test"})
        engine.start_workers()
        slots = np.arange(engine.fleet.slots.n_slots)
        for k in range(len(actions) + 1):
            deadline = time.monotonic() + 60
            while not engine.ready_mask().all():
                assert time.monotonic() < deadline, "the workers did not ring"
                engine.poll(time.monotonic(), 10)
            rnd = engine.recv(slots)
            rounds.append(copy_round(rnd))
            if k < len(actions):
                engine.send(slots, {"discrete": actions[k][rnd.rows]})
    finally:
        for step in engine.stop_steps():
            step()
        release_forkserver()
    return rounds


def copy_round(rnd) -> dict:
    return {
        "rows": rnd.rows.copy(),
        "seqs": rnd.seqs.copy(),
        "obs": {k: v.copy() for k, v in rnd.obs.items()},
        "results": {f: rnd.results[f].copy() for f in COMPARED},
        "stepped": rnd.stepped.copy(),
        "final_rows": rnd.final_rows.copy(),
        "final_obs": {k: v.copy() for k, v in rnd.final_obs.items()},
        "restarted": rnd.restarted.copy(),
    }


def test_the_in_process_backend_hands_out_what_the_worker_fleet_does(short_tmp):
    spec = spec_of("+env_mix.types.cartpole.make_kwargs.max_episode_steps=25")
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 2, spec.env_count).astype(np.int32) for _ in range(40)]
    from_fleet = fleet_rounds(spec, short_tmp, actions)

    local = InProcessEngine(spec_of("+env_mix.types.cartpole.make_kwargs.max_episode_steps=25"))
    local.start()
    slots = np.arange(len(local.slot_lo))
    from_process = []
    for k in range(len(actions) + 1):
        rnd = local.recv(slots)
        from_process.append(copy_round(rnd))
        if k < len(actions):
            local.send(slots, {"discrete": actions[k][rnd.rows]})
    local.close()

    truncations = 0
    for k, (a, b) in enumerate(zip(from_fleet, from_process)):
        np.testing.assert_array_equal(a["rows"], b["rows"], err_msg=f"round {k}")
        np.testing.assert_array_equal(a["seqs"], b["seqs"], err_msg=f"round {k}")
        np.testing.assert_array_equal(a["stepped"], b["stepped"], err_msg=f"round {k}")
        for key in a["obs"]:
            np.testing.assert_array_equal(a["obs"][key], b["obs"][key], err_msg=f"round {k} obs {key}")
        for f in COMPARED:
            np.testing.assert_array_equal(a["results"][f], b["results"][f], err_msg=f"round {k} {f}")
        np.testing.assert_array_equal(a["final_rows"], b["final_rows"], err_msg=f"round {k}")
        for key in a["final_obs"]:
            np.testing.assert_array_equal(a["final_obs"][key], b["final_obs"][key], err_msg=f"round {k} final")
        assert not a["restarted"].any() and not b["restarted"].any()
        truncations += len(a["final_rows"])
    assert truncations > 0, "no episode reached its time limit: the final obs went unchecked"
    assert any(r["results"]["terminated"].any() for r in from_fleet), "no episode terminated"


def test_the_learner_trains_on_in_process_rounds_with_no_process_started():
    # the update in a thread: what is checked here is that the engine's backend starts no
    # process (the update's own process is tests/test_update_process.py's)
    spec = spec_of(
        "learner.rollout_len=8", "learner.update_envs=12", "learner.minibatch_size=48", "learner.update_in=thread"
    )
    engine = InProcessEngine(spec)
    plan = engine.describe()
    from rlpipe.learner.central import CentralLearner

    learner = CentralLearner(spec, plan)
    engine.start()
    children_before = psutil.Process().children(recursive=True)
    updates = rounds = 0
    while updates < 3:
        assert rounds < 200, "no update in 200 rounds"
        rnd = engine.recv()
        engine.send(rnd.slots, learner.act(rnd))
        learner.observe(rnd)
        rounds += 1
        if learner.update_due:
            learner.start_update()
            assert learner.poll_update(wait=True) is not None
            updates += 1
    engine.close()
    # every round after the first stepped every env once
    assert learner.counters.env_steps == (rounds - 1) * spec.env_count
    assert learner.counters.updates == 3
    assert multiprocessing.active_children() == []
    assert psutil.Process().children(recursive=True) == children_before
    assert not list(Path("/dev/shm").glob(f"rlpipe_{psutil.Process().pid}-*"))


def test_the_in_process_backend_refuses_exploration():
    with pytest.raises(ValueError, match="scaling.enabled=false"):
        InProcessEngine(spec_of("scaling=on"))


def test_the_hot_path_benchmark_times_each_move_of_its_rounds():
    from conftest import load_benchmark

    result = load_benchmark("hot_path").measure(["env_mix=cartpole", "env_count=16"], rounds=2, warmup=1)
    assert result["rows"] == 16
    assert {m: len(v) for m, v in result["times"].items()} == {"recv": 2, "act": 2, "observe": 2}
    assert all(t > 0 for v in result["times"].values() for t in v)
