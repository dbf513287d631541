"""The PPO update in a process of its own (rlpipe/learner/update_process.py): it trains what
the thread trains, bit for bit, through the learner's own start_update / poll_update; its
optimizer and PPO stream reach a checkpoint and come back from one; a killed process stops
the run with a clear error; closing it leaves no process."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from conftest import compose_cfg, ppo_batch
from rlpipe.config import run_spec
from rlpipe.envs.registry import plan_mix
from rlpipe.learner.batch_staging import BatchSender
from rlpipe.learner.central import CentralLearner
from rlpipe.learner.update_process import UpdateProcessDied
from rlpipe.procs import pid_alive


def _learner(update_in: str, *overrides: str) -> CentralLearner:
    spec = run_spec(
        compose_cfg(["env_mix=classic", "env_count=8", "buffer=lowdim", f"learner.update_in={update_in}", *overrides])
    )
    return CentralLearner(spec, plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing))


def _train(learner: CentralLearner, seed: int, n: int = 256):
    """One update through the learner's own path: the batch as `_take_batch` hands it over."""
    learner._take_batch = lambda: ppo_batch(learner, n=n, seed=seed)
    learner.start_update()
    return learner.poll_update(wait=True)


def _same_weights(a: CentralLearner, b: CentralLearner) -> None:
    for (k, va), (_, vb) in zip(a.policy.state_dict().items(), b.policy.state_dict().items()):
        assert torch.equal(va, vb), k
    for (k, va), (_, vb) in zip(a.actor.state_dict().items(), b.actor.state_dict().items()):
        assert torch.equal(va, vb), f"actor {k}"


@pytest.fixture(autouse=True)
def driver_threads():
    """Torch's intra-op threads as the driver sets them (learner.torch_threads, which the
    process sets for itself): a plain `pytest` leaves this process at one per CPU, and the
    thread's gradients then sum in another order than the process's (xdist workers set
    their share: tests/conftest.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(run_spec(compose_cfg(["env_mix=classic"])).learner.torch_threads)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def in_process():
    made = []

    def make(*overrides):
        learner = _learner("process", *overrides)
        made.append(learner)
        return learner

    yield make
    for learner in made:
        learner.close_updates()


def test_auto_takes_a_process_on_a_cpu_learner_that_serves_while_it_trains():
    assert _learner("auto", "learner.backlog=hold").update_process is not None
    assert _learner("auto", "learner.backlog=drop").update_process is not None
    assert _learner("auto", "learner.backlog=sync").update_process is None  # nothing serves meanwhile
    assert _learner("thread", "learner.backlog=hold").update_process is None


def test_the_process_trains_what_the_thread_trains_bit_for_bit(in_process):
    thread, proc = _learner("thread", "learner.learning_rate=0.003"), in_process("learner.learning_rate=0.003")
    for seed in (1, 2, 3):
        a, b = _train(thread, seed), _train(proc, seed)
        assert a == b  # every loss term, as floats
        _same_weights(thread, proc)
    assert proc.learning_rate == thread.learning_rate
    assert pid_alive(proc.update_process.pid)
    # the optimizer's moments and the PPO stream, as a checkpoint sees them
    pa, pb = thread.checkpoint_payload(), proc.checkpoint_payload()
    for i, s in pa["optimizer"]["state"].items():
        for key, value in s.items():
            assert torch.equal(value, pb["optimizer"]["state"][i][key]), (i, key)
    assert torch.equal(pa["rng"]["torch_generators"]["ppo"], pb["rng"]["torch_generators"]["ppo"])


def test_batches_that_grow_and_shrink_train_as_the_thread_trains_them(in_process, monkeypatch):
    """The batch buffers stay in shared memory from update to update: a larger batch gets new
    ones (sent with it), a smaller one the first rows of the old; every update still trains
    what the thread trains on the same batch, bit for bit."""
    thread, proc = _learner("thread"), in_process()
    sent = []
    stage = BatchSender.stage
    monkeypatch.setattr(BatchSender, "stage", lambda self, batch: sent.append(stage(self, batch)) or sent[-1])
    for seed, n in ((1, 256), (2, 256), (3, 512), (4, 128), (5, 384)):
        assert _train(thread, seed, n) == _train(proc, seed, n)
        _same_weights(thread, proc)
    fresh = [sorted(f) for _, f in sent]
    every_field = sorted(["obs/state", "types", "a_disc", "a_cont", "logp", "value", "adv", "ret"])
    # the first batch makes every buffer (room for 320 rows); only 512 outgrows them
    assert fresh == [every_field, [], every_field, [], []]
    assert [shape["adv"] for shape, _ in sent] == [256, 256, 512, 128, 384]


def test_a_checkpoint_of_the_process_resumes_bit_for_bit(in_process):
    """Through a payload: a process-trained learner's state into a fresh one (process or
    thread), which then trains the next batch exactly as the uninterrupted one does."""
    a = in_process()
    _train(a, 1)
    payload = a.checkpoint_payload()
    resumed_proc, resumed_thread = in_process("run.seed=99"), _learner("thread", "run.seed=99")
    resumed_proc.prepare_updates()  # started before the restore: the state is handed over
    for learner in (resumed_proc, resumed_thread):
        learner.restore(payload)
    for learner in (a, resumed_proc, resumed_thread):
        _train(learner, 2)
    _same_weights(a, resumed_proc)
    _same_weights(a, resumed_thread)


def test_a_killed_update_process_stops_the_run_with_a_clear_error(in_process):
    learner = in_process()
    _train(learner, 1)
    os.kill(learner.update_process.pid, signal.SIGKILL)
    with pytest.raises(UpdateProcessDied, match=r"PPO update process \(pid \d+\) is gone with exit code -9"):
        _train(learner, 2)


def test_an_error_in_the_update_comes_back_with_its_traceback(in_process):
    learner = in_process()
    learner._take_batch = lambda: {**ppo_batch(learner, seed=1), "types": torch.full((256,), 99)}  # no such type
    learner.start_update()
    with pytest.raises(RuntimeError, match="the PPO update process failed:\n(.|\n)*Traceback"):
        learner.poll_update(wait=True)
    assert _train(learner, 2).samples == 256  # the process itself goes on


def test_closing_leaves_no_process_and_ignores_the_drivers_signals(in_process):
    learner = in_process()
    _train(learner, 1)
    pid = learner.update_process.pid
    os.kill(pid, signal.SIGINT)  # Ctrl-C reaches the whole group: the driver decides
    os.kill(pid, signal.SIGTERM)
    assert _train(learner, 2).samples == 256
    learner.close_updates()
    assert not pid_alive(pid)


def test_an_unknown_place_for_the_update_is_refused_by_name():
    from rlpipe.config import ConfigError

    with pytest.raises(ConfigError) as info:
        _learner("gpu")
    message = str(info.value)
    assert "learner.update_in" in message and "gpu" in message
    assert all(choice in message for choice in ("auto", "process", "thread"))
