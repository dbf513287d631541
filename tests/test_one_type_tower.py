"""A tower on one type's rows in training is one autograd node with its backward written out
(rlpipe/learner/one_type_tower.py): its output and every gradient are the layer-by-layer path's
bit for bit, and the path is taken where it applies and nowhere else."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlpipe.config import ObsKey
from rlpipe.envs.contract import EnvSpec
from rlpipe.envs.registry import ActionSpace, MixPlan
from rlpipe.learner import one_type_tower
from rlpipe.learner.policy import Policy, Tower, TypeOrder
from rlpipe.learner.ppo_kernels import torch_ops_only


def _grads(tower: Tower, x: torch.Tensor, order: TypeOrder, forward, g_out: torch.Tensor):
    tower.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(x.requires_grad)
    out = forward(x, order)
    out.backward(g_out)
    grads = {name: p.grad for name, p in tower.named_parameters()}
    return out.detach(), grads, x.grad


@pytest.mark.parametrize("t", [0, 1, 2])  # type 0 reads 4 of 32 columns, 1 all 32, 2 ten
@pytest.mark.parametrize("x_width", [32, "type"])  # the whole board, or narrowed to the type's columns
@pytest.mark.parametrize("x_grad", [False, True])  # True: features from the CNN take a gradient
def test_one_types_tower_is_the_layer_by_layer_path_bit_for_bit(t, x_width, x_grad):
    torch.manual_seed(3)
    tower = Tower(3, 32, (64, 48, 64), 3, out_std=0.5, in_widths=(4, 32, 10))
    width = 32 if x_width == 32 else tower.inp.in_widths[t]
    x = torch.randn(203, width, requires_grad=x_grad)  # 203: whole blocks of 16 rows and a tail
    order = TypeOrder.of(torch.full((203,), t))
    g_out = torch.randn(203, 3)
    assert one_type_tower.applies(tower, x, order.segments)
    fused = _grads(tower, x, order, tower, g_out)
    reference = _grads(tower, x, order, tower.layer_by_layer, g_out)
    assert torch.equal(fused[0], reference[0])
    for name, grad in reference[1].items():
        assert torch.equal(fused[1][name], grad), name
    assert fused[1]["inp.weight"][t].abs().sum() > 0  # a gradient where the type's weights are...
    others = [u for u in range(3) if u != t]
    assert not fused[1]["inp.weight"][others].any()  # ...and none on other types' weights
    if x_grad:
        assert torch.equal(fused[2], reference[2])
        if width > tower.inp.in_widths[t]:  # the columns the type does not read get none
            assert not fused[2][:, tower.inp.in_widths[t] :].any()
    else:
        assert fused[2] is None and reference[2] is None


def test_the_path_applies_to_one_types_rows_in_training_on_a_cpu_only():
    torch.manual_seed(0)
    tower = Tower(2, 8, (16,), 2, out_std=1.0)
    x = torch.randn(10, 8)
    one, two = TypeOrder.of(torch.ones(10, dtype=torch.long)), TypeOrder.of(torch.arange(10) % 2)
    assert one_type_tower.applies(tower, x, one.segments)
    assert not one_type_tower.applies(tower, x, two.segments)  # several types: layer by layer
    assert not one_type_tower.applies(tower, x.double(), one.segments)
    with torch.no_grad():  # acting: no graph to save, layer by layer
        assert not one_type_tower.applies(tower, x, one.segments)
    with torch_ops_only():  # the device's reference: torch's ops only
        assert not one_type_tower.applies(tower, x, one.segments)


def test_a_one_type_policy_trains_through_the_fused_towers_as_through_autograds_layers(monkeypatch):
    """A CartPole-shaped policy on a 32-wide board: evaluate's log-probs, entropy and value,
    and their gradients, are the same bits whether the towers take the fused path or not."""
    state = ObsKey("state", (32,), "float32")
    plan = MixPlan(
        ("cartpole",),
        (EnvSpec({"state": ((4,), "float32")}, "discrete", 2),),
        np.zeros(64, dtype=np.int16),
        ActionSpace(2, 0),
        (state,),
    )
    torch.manual_seed(1)
    policy = Policy(plan, (state,), (64, 64))
    obs = {"state": torch.cat([torch.randn(300, 4), torch.zeros(300, 28)], 1)}
    types, a_disc = torch.zeros(300, dtype=torch.long), torch.randint(0, 2, (300,))

    def run():
        policy.zero_grad(set_to_none=True)
        logp, ent, value = policy.evaluate(policy.prepared_obs(obs), types, a_disc, torch.zeros(300, 1))
        (logp.sum() + 0.01 * ent.sum() + value.square().sum()).backward()
        return [logp.detach(), ent.detach(), value.detach()], {n: p.grad for n, p in policy.named_parameters()}

    fused = run()
    monkeypatch.setattr(one_type_tower, "applies", lambda *a: False)
    reference = run()
    assert all(torch.equal(a, b) for a, b in zip(fused[0], reference[0]))
    assert all(torch.equal(fused[1][n], g) for n, g in reference[1].items() if g is not None)
