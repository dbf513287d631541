"""The learner on a device that is not the CPU's (tests/emulated_accelerator.py's `emu`), on a
CPU-only machine: PopArt, GAE and the PPO update, inference, the checkpoint round trip
between the device and the host, and evaluation of a run trained on the device.

Run by tests/test_device.py in a child interpreter (the emulation registers a backend for the
whole process). Each check also compares with the same work on the CPU: the device changes
where the numbers are computed, never what they are. The CPU's side of the update is computed
with torch's ops (`ppo_kernels.torch_ops_only`), as on a device: on a CPU learner PPO's
elementwise steps are native kernels, the same formulas rounded otherwise
(tests/test_ppo_kernels.py holds them to torch's).
"""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest
import torch

from conftest import compose_cfg
from emulated_accelerator import EmuTensor, emulated
from learner_rounds import learner_on, ready_blocks, round_of
from rlpipe.learner.acting import truncation_values
from rlpipe.learner.adam import FusedAdam
from rlpipe.learner.checkpoint import load_latest, save_checkpoint
from rlpipe.learner.policy import Policy, TypedLinear
from rlpipe.learner.popart import PopArt
from rlpipe.learner.ppo import concat_blocks, ppo_update
from rlpipe.learner.ppo_kernels import torch_ops_only
from rlpipe.learner.type_settings import TypeSettings
from test_ppo_batch import day4  # noqa: F401  (the fixture: day4 at a test's size, its rollouts through SliceRollout)


def host(x):
    return x.inner if isinstance(x, EmuTensor) else x


def same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(host(a[k]), host(b[k])), k


def test_the_emulated_device_refuses_what_cuda_refuses():
    with emulated() as dev:
        x = torch.ones(3, device=dev)
        with pytest.raises(RuntimeError, match="same device"):
            x + torch.ones(3)
        assert (x + torch.tensor(2.0)).tolist() == [3.0, 3.0, 3.0]  # a host scalar is allowed
        assert x[torch.tensor([0, 2])].device == dev  # host indices are allowed
        with pytest.raises(TypeError, match="cpu"):
            x.numpy()
        assert x.cpu().numpy().tolist() == [1.0, 1.0, 1.0]
        with pytest.raises(RuntimeError, match="generator"):
            torch.rand(2, generator=torch.Generator(), device=dev)
        assert torch.rand(2, generator=torch.Generator(device=dev), device=dev).device == dev
        with pytest.raises(RuntimeError, match="host"):
            torch.save({"x": x}, io.BytesIO())


@pytest.mark.parametrize("beta", [0.01, "per_type"])
def test_popart_moves_its_statistics_on_the_policys_device(beta):
    gen = torch.Generator().manual_seed(0)
    returns = torch.randn(300, generator=gen) * 40 + 7
    types = torch.randint(0, 3, (300,), generator=gen)
    betas = torch.tensor([0.01, 0.05, 0.2], dtype=torch.float64) if beta == "per_type" else beta

    def moved(device):
        torch.manual_seed(1)
        popart, layer = PopArt(3).to(device), TypedLinear(3, 8, 1, 1.0).to(device)
        popart.update(returns.to(device), types.to(device), betas, layer)
        popart.update_sums(
            torch.tensor([5.0, 0.0, 9.0], device=device),
            torch.tensor([50.0, 0.0, -9.0], device=device),
            torch.tensor([600.0, 0.0, 30.0], device=device),
            betas,
            layer,
        )
        return {**popart.state_dict(), **{f"out.{k}": v for k, v in layer.state_dict().items()}}

    on_cpu = moved("cpu")
    with emulated() as dev:
        same(moved(dev), on_cpu)


def _update(spec, plan, init, blocks, types, device) -> tuple[list, dict]:
    lc = spec.learner
    policy = Policy(plan, plan.obs_keys, lc.hidden, lc.cnn_channels, lc.cnn_out)
    policy.load_state_dict(init)
    policy.to(device)
    opt = FusedAdam(policy.parameters(), lr=lc.learning_rate, eps=1e-5)
    gen = torch.Generator().manual_seed(spec.run.seed)  # the learner's PPO stream is a host one
    per_type = TypeSettings.of(lc, spec.env_types)
    batch = concat_blocks(blocks, types, device)
    stats = [ppo_update(policy, opt, batch, lc, gen, per_type=per_type) for _ in range(2)]
    return stats, policy.state_dict()


def test_the_ppo_update_trains_on_the_device_as_on_the_cpu(day4):  # noqa: F811  (the imported fixture)
    spec, plan, init, blocks, types = day4
    with torch_ops_only():
        stats_cpu, after_cpu = _update(spec, plan, init, blocks, types, "cpu")
    with emulated() as dev:
        stats_dev, after_dev = _update(spec, plan, init, blocks, types, dev)
        assert all(v.device == dev for v in after_dev.values())
    assert stats_dev == stats_cpu
    same(after_dev, after_cpu)


def test_serving_on_the_device(monkeypatch):
    """Rounds through the learner as the driver serves them: the policy's actions and the
    exploration alternatives on the device, the critic's pass over time-limit truncations,
    the rollouts and GAE until blocks are ready to train on."""
    with emulated() as dev:
        learner = learner_on(monkeypatch, dev, "learner.rollout_len=4")
        for seq in range(12):
            rnd = round_of(learner, seq, seed=seq)
            sent = learner.act(rnd)
            assert set(sent) >= {"discrete", "logp", "alt_discrete", "alt_logp"}
            assert all(isinstance(v, np.ndarray) and len(v) == 8 for v in sent.values())
            learner.observe(rnd)
        assert learner.ready_samples >= 16 and learner.counters.env_steps == 88
        block = learner.ready_blocks[0]
        assert np.isfinite(block["adv"]).all() and np.isfinite(block["ret"]).all()
        fv = truncation_values(learner.actor, learner.staging, round_of(learner, 1, seed=99))
        assert np.isfinite(fv[[1, 5]]).all() and np.isnan(np.delete(fv, [1, 5])).all()


def _trained(learner, seed: int) -> None:
    """One PPO update of `learner` on random rollouts, through its own batch and update code."""
    ready_blocks(learner, seed)
    learner._train(learner._take_batch(), learner.cfg.learning_rate)  # the update thread's work, here
    assert not isinstance(learner._update_result, BaseException), learner._update_result


def _state(learner) -> dict:
    return {
        **{f"policy.{k}": host(v) for k, v in learner.policy.state_dict().items()},
        **{f"opt.{i}.{k}": host(v) for i, s in learner.optimizer.state_dict()["state"].items() for k, v in s.items()},
    }


def test_checkpoints_go_from_the_device_to_a_cpu_machine_and_back(monkeypatch, tmp_path):
    with emulated() as dev:
        on_dev = learner_on(monkeypatch, dev)
        _trained(on_dev, seed=1)
        save_checkpoint(tmp_path / "dev", 100, on_dev.checkpoint_payload(), keep=2)
        saved = _state(on_dev)
    on_cpu = learner_on(monkeypatch, "cpu")
    _, payload = load_latest(tmp_path / "dev", validate=on_cpu.check_compatible)
    on_cpu.restore(payload)
    same(_state(on_cpu), saved)
    _trained(on_cpu, seed=2)
    save_checkpoint(tmp_path / "cpu", 200, on_cpu.checkpoint_payload(), keep=2)
    with emulated() as dev:
        back = learner_on(monkeypatch, dev)
        back.restore(load_latest(tmp_path / "cpu", validate=back.check_compatible)[1])
        same(_state(back), _state(on_cpu))
        assert all(p.device == dev for p in back.policy.parameters())
        _trained(back, seed=3)  # and it trains on


def test_a_run_trained_on_cuda_is_evaluated_on_a_cpu_machine(monkeypatch, tmp_path):
    from rlpipe.eval.loader import load_run

    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    cfg = compose_cfg(["env_mix=classic", "env_count=8", "buffer=lowdim"])
    cfg.learner.device = "cuda"  # as the run that trained on a GPU wrote it
    from omegaconf import OmegaConf

    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    with emulated() as dev:
        learner = learner_on(monkeypatch, dev)
        _trained(learner, seed=4)
        save_checkpoint(run_dir / "checkpoints", 100, learner.checkpoint_payload(), keep=2)
        trained = {k: host(v) for k, v in learner.policy.state_dict().items()}
    loaded = load_run(run_dir)
    same(loaded.policy.state_dict(), trained)
    shutil.rmtree(run_dir)
