"""rlpipe.learner.adam.FusedAdam: torch.optim.Adam(fused=True)'s arithmetic and state dict,
without importing torch._dynamo."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from conftest import load_benchmark
from rlpipe.learner import ppo
from rlpipe.learner.adam import FusedAdam, clip_grad_norm
from rlpipe.learner.policy import Policy
from rlpipe.learner.type_settings import TypeSettings

REPO = Path(__file__).resolve().parent.parent


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))


def _steps(model: nn.Module, opt, n: int, seed: int = 1, lr_at=None) -> None:
    gen = torch.Generator().manual_seed(seed)
    for i in range(n):
        if lr_at is not None:
            opt.param_groups[0]["lr"] = lr_at(i)
        x = torch.randn(32, 4, generator=gen)
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()


def _same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_steps_equal_torch_fused_adam_bit_for_bit():
    ours, theirs = _model(), _model()
    opt_ours = FusedAdam(ours.parameters(), lr=1e-3, eps=1e-5)
    opt_theirs = torch.optim.Adam(theirs.parameters(), lr=1e-3, eps=1e-5, fused=True)
    schedule = lambda i: 1e-3 * (1 - i / 20)  # noqa: E731 (the learner anneals the group's lr)
    _steps(ours, opt_ours, 12, lr_at=schedule)
    _steps(theirs, opt_theirs, 12, lr_at=schedule)
    assert _same(ours, theirs)
    for p, q in zip(ours.parameters(), theirs.parameters()):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(opt_ours.state[p][key], opt_theirs.state[q][key]), key


def test_state_dict_loads_both_ways_and_training_continues_the_same():
    """A checkpoint written with torch.optim.Adam resumes in FusedAdam and the other way round."""
    a, b = _model(), _model()
    opt_a = torch.optim.Adam(a.parameters(), lr=1e-3, eps=1e-5, fused=True)
    _steps(a, opt_a, 5)
    b.load_state_dict(a.state_dict())
    opt_b = FusedAdam(b.parameters(), lr=5e-4, eps=1e-5)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # as torch.save/torch.load hand it over
    assert opt_b.param_groups[0]["lr"] == 1e-3  # the saved group's hyperparameters, as torch does
    _steps(a, opt_a, 4, seed=7)
    _steps(b, opt_b, 4, seed=7)
    assert _same(a, b)

    c = _model(3)
    c.load_state_dict(b.state_dict())
    opt_c = torch.optim.Adam(c.parameters(), lr=1e-3, eps=1e-5, fused=True)
    opt_c.load_state_dict(copy.deepcopy(opt_b.state_dict()))
    _steps(b, opt_b, 3, seed=9)
    _steps(c, opt_c, 3, seed=9)
    assert _same(b, c)


def test_clip_grad_norm_equals_torch_bit_for_bit():
    """Above the bound (every gradient scaled) and below it (unchanged), and a parameter without
    a gradient left out, as torch.nn.utils.clip_grad_norm_ leaves it."""
    for max_norm in (0.05, 1e3):
        ours, theirs = _model(), _model()
        for m in (ours, theirs):
            m(torch.linspace(-1, 1, 8).reshape(2, 4)).pow(2).sum().backward()
            m[2].bias.grad = None
        norm_ours = clip_grad_norm(list(ours.parameters()), max_norm)
        norm_theirs = torch.nn.utils.clip_grad_norm_(list(theirs.parameters()), max_norm)
        assert torch.equal(norm_ours, norm_theirs)
        for p, q in zip(ours.parameters(), theirs.parameters()):
            assert (p.grad is None and q.grad is None) or torch.equal(p.grad, q.grad)
    assert float(norm_ours) < 1e3  # the second bound was not reached: the grads kept as they were


def test_state_dict_of_other_parameters_is_refused():
    opt = FusedAdam(_model().parameters(), lr=1e-3)
    other = FusedAdam(nn.Linear(2, 2).parameters(), lr=1e-3)
    try:
        opt.load_state_dict(other.state_dict())
    except ValueError:
        return
    raise AssertionError("a state dict of 2 parameters loaded into an optimizer of 4")


def test_zero_grad_without_set_to_none_keeps_zeroed_grads():
    model = _model()
    opt = FusedAdam(model.parameters(), lr=1e-3)
    model(torch.ones(1, 4)).sum().backward()
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_an_update_never_imports_dynamo():
    """The first PPO update's optimizer: no torch._dynamo import (its ~1.3 CPU s ran in the
    update thread beside serving while torch.optim built it)."""
    code = (
        "import sys, torch\n"
        "from rlpipe.learner.adam import FusedAdam, clip_grad_norm\n"
        "m = torch.nn.Linear(3, 2)\n"
        "opt = FusedAdam(m.parameters(), lr=1e-3)\n"
        "m(torch.ones(4, 3)).sum().backward(); clip_grad_norm(list(m.parameters()), 0.5)\n"
        "opt.step(); opt.zero_grad(); opt.load_state_dict(opt.state_dict())\n"
        "from rlpipe.learner import ppo\n"
        "assert 'torch._dynamo' not in sys.modules, 'torch._dynamo imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_a_twelve_type_ppo_update_trains_the_same_under_either_adam():
    """Two PPO updates of the seed12 policy (per-type layers, both heads, the CNN, PopArt's
    rescaling of the critic's out layer between steps) on a batch made as
    benchmarks/ppo_update.py makes it: every parameter, buffer and statistic bit-identical
    under FusedAdam and torch.optim.Adam(fused=True), which the learner used before."""
    bench = load_benchmark("ppo_update")
    spec, plan = bench.stage_plan(
        [
            "env_mix=seed12",
            "env_count=96",
            "learner.update_envs=96",
            "learner.rollout_len=16",
            "learner.epochs=2",
            "learner.minibatch_size=512",
        ]
    )
    assert len(plan.names) == 12 and len(np.unique(plan.env_type)) == 12
    lc = spec.learner
    torch.manual_seed(1)
    actor = Policy(plan, plan.obs_keys, lc.hidden, lc.cnn_channels, lc.cnn_out)
    blocks, types = bench.stage_blocks(spec, plan, actor, 24)
    trained = []
    for make in (
        lambda ps: FusedAdam(ps, lr=lc.learning_rate, eps=1e-5),
        lambda ps: torch.optim.Adam(ps, lr=lc.learning_rate, eps=1e-5, fused=True),
    ):
        policy = Policy(plan, plan.obs_keys, lc.hidden, lc.cnn_channels, lc.cnn_out)
        policy.load_state_dict(actor.state_dict())
        optimizer, generator = make(policy.parameters()), torch.Generator().manual_seed(1)
        per_type = TypeSettings.of(lc, spec.env_types)
        stats = [
            vars(
                ppo.ppo_update(
                    policy, optimizer, ppo.concat_blocks(blocks, types, "cpu"), lc, generator, per_type=per_type
                )
            )
            for _ in range(2)
        ]
        trained.append((policy.state_dict(), stats))
    (ours, ours_stats), (theirs, theirs_stats) = trained
    assert ours_stats == theirs_stats
    assert ours_stats[1]["policy_loss"] != ours_stats[0]["policy_loss"]  # the second update saw trained weights
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert not torch.equal(ours["critic.out.weight"], actor.state_dict()["critic.out.weight"])


def test_ppo_update_bench_builds_each_revisions_optimizer_and_refuses_an_unknown_revision():
    """benchmarks/ppo_update.py times a revision's update with the optimizer its learner built:
    FusedAdam where the revision has rlpipe/learner/adam.py, torch.optim.Adam(fused=True)
    before; a revision git does not know is refused by its flag (exit 2), not a traceback."""
    bench = load_benchmark("ppo_update")
    assert bench.optimizer_at(None) is FusedAdam
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert bench.optimizer_at(head.strip()).__name__ == "FusedAdam"  # the revision's own module
    if subprocess.run(["git", "cat-file", "-e", "20f571d^"], cwd=REPO, capture_output=True).returncode == 0:
        before = bench.optimizer_at("20f571d^")  # the commit before FusedAdam (not in a shallow clone)
        assert before.func is torch.optim.Adam and before.keywords == {"fused": True}
    out = subprocess.run(
        [sys.executable, "benchmarks/ppo_update.py", "--baseline-rev", "no-such-revision", "--updates", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "--baseline-rev no-such-revision: git has no rlpipe/learner/ppo.py" in out.stderr
    assert "Traceback" not in out.stderr
