"""rlpipe/learner/gpu_overlap.py: a round's copies between the host and the learner's device,
and the PPO update on a CUDA stream of its own beside serving.

The CPU's side runs everywhere: no copy on the way in, the update inline. The cuda side needs
a GPU, which no machine that runs the suite has: those tests are skipped here, and
`benchmarks/gpu_check.sh` runs this file first on a machine with one. They hold the stream to
what the default stream gives: the same trained weights bit for bit, the serving copy of the
policy untouched until the update's result is taken, the pinned buffers' values those of the
device's tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from learner_rounds import learner_on, ready_blocks, round_of
from rlpipe.learner.gpu_overlap import HostStaging, UpdateStream

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no GPU here: benchmarks/gpu_check.sh runs these on a machine with one"
)


def test_on_the_cpu_a_round_is_not_copied_and_the_update_runs_inline():
    staging = HostStaging(torch.device("cpu"))
    obs = np.arange(12, dtype=np.float32).reshape(3, 4)
    on_device = staging.to_device("obs", obs)
    assert on_device.data_ptr() == obs.ctypes.data  # a view, as before
    back = staging.to_host({"twice": on_device * 2, "same": on_device})
    np.testing.assert_array_equal(back["twice"], obs * 2)
    assert back["same"].ctypes.data == obs.ctypes.data
    stream = UpdateStream(torch.device("cpu"))
    assert stream.stream is None
    stream.batch_queued()
    ran = []
    with stream.running():
        ran.append(True)
    assert ran == [True]
    with pytest.raises(ValueError), stream.running():
        raise ValueError("an update's exception goes through")


def _host_state(learner) -> dict:
    return {
        **{f"policy.{k}": v.cpu() for k, v in learner.policy.state_dict().items()},
        **{f"opt.{i}.{k}": v.cpu() for i, s in learner.optimizer.state_dict()["state"].items() for k, v in s.items()},
    }


@needs_cuda
def test_a_rounds_copies_go_through_pinned_buffers_kept_from_round_to_round():
    dev = torch.device("cuda")
    staging = HostStaging(dev)
    rng = np.random.default_rng(0)
    first = rng.normal(size=(100, 4)).astype(np.float32)
    on_device = staging.to_device("obs", first)
    assert on_device.device.type == "cuda" and torch.equal(on_device.cpu(), torch.from_numpy(first))
    kept = staging._to_device["obs"][0]
    assert kept.is_pinned()
    smaller = rng.normal(size=(60, 4)).astype(np.float32)
    assert torch.equal(staging.to_device("obs", smaller).cpu(), torch.from_numpy(smaller))
    assert staging._to_device["obs"][0].data_ptr() == kept.data_ptr()  # the same buffer
    larger = rng.normal(size=(500, 4)).astype(np.float32)
    assert torch.equal(staging.to_device("obs", larger).cpu(), torch.from_numpy(larger))
    assert staging._to_device["obs"][0].numel() >= 500 * 4 and staging._to_device["obs"][0].is_pinned()

    values = torch.randn(300, device=dev)
    actions = torch.randint(0, 5, (300,), device=dev)
    back = staging.to_host({"value": values, "a_disc": actions})
    expected = values.cpu().numpy().copy(), actions.cpu().numpy().copy()
    values.fill_(7.0)  # queued after the copies: what came back is what was there before
    torch.cuda.synchronize()
    np.testing.assert_array_equal(back["value"], expected[0])
    np.testing.assert_array_equal(back["a_disc"], expected[1])
    assert back["a_disc"].dtype == np.int64 and staging._to_host["value"].is_pinned()


@needs_cuda
def test_the_update_on_its_own_stream_trains_as_on_the_default_stream(monkeypatch):
    trained = []
    for own_stream in (True, False):
        learner = learner_on(monkeypatch, "cuda")
        if not own_stream:
            learner.update_stream = UpdateStream(torch.device("cpu"))  # inline, on the default stream
        assert (learner.update_stream.stream is not None) == own_stream
        for seed in (1, 2):  # two updates: the second starts from the first's optimizer state
            ready_blocks(learner, seed)
            learner._train(learner._take_batch(), learner.cfg.learning_rate)  # the update thread's work
            assert not isinstance(learner._update_result, BaseException), learner._update_result
        trained.append(_host_state(learner))
    assert trained[0].keys() == trained[1].keys()
    for key in trained[0]:
        assert torch.equal(trained[0][key], trained[1][key]), key


@needs_cuda
def test_serving_goes_on_with_the_serving_copy_while_the_update_trains(monkeypatch):
    learner = learner_on(monkeypatch, "cuda")

    def served(seq: int) -> np.ndarray:
        """One round of the same obs (seed 3) as the driver serves it: the critic's values."""
        rnd = round_of(learner, seq, seed=3)
        learner.act(rnd)
        value = learner._acted.value.copy()
        learner.observe(rnd)
        return value

    before = served(1)
    ready_blocks(learner, seed=4)
    learner.start_update()  # the thread, its kernels on the update's stream
    seq = 1
    while seq < 4 or learner.updating:
        seq += 1
        np.testing.assert_array_equal(served(seq), before)  # the serving copy, untouched
    stats = learner.poll_update(wait=True)
    assert stats is not None and np.isfinite(stats.total_loss)
    for mine, theirs in zip(learner.actor.state_dict().values(), learner.policy.state_dict().values()):
        assert torch.equal(mine, theirs)  # refreshed from the finished update
    assert not np.array_equal(served(seq + 1), before)
