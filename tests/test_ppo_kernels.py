"""PPO's native kernels (rlpipe/learner/ppo_kernels.py, rlpipe/native/ppokernels.h) against
torch's own ops: tanh and its backward, a categorical head's log-prob, entropy, their
gradients and its sampler, the loss terms and theirs; and the property acting and training
rely on, that the behaviour log-prob acting reports is the bits PPO recomputes for the same
obs and weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.distributions import Categorical

from rlpipe.config import ObsKey
from rlpipe.envs.contract import EnvSpec
from rlpipe.envs.registry import ActionSpace, MixPlan
from rlpipe.learner.policy import MASKED_LOGIT, Policy
from rlpipe.learner.ppo_kernels import Tanh, bias_tanh, categorical_logp_entropy, categorical_sample, log_prob_at
from rlpipe.learner.scaling import weighted_ppo_terms

F32_EPS = torch.finfo(torch.float32).eps


def _tanh(x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return Tanh()(x.clone())


def test_tanh_is_tanh_to_a_few_ulp_and_keeps_its_edge_values():
    x = torch.linspace(-20, 20, 400_001)
    y = _tanh(x).double()
    exact = torch.tanh(x.double())
    assert (y - exact).abs().max() < 1.5e-7
    assert ((y - exact).abs() / exact.abs().clamp_min(1e-30))[x.abs() > 1e-6].max() < 3 * F32_EPS
    edges = torch.tensor([0.0, -0.0, 1e-30, -1e-8, 30.0, -30.0, float("inf"), -float("inf")])
    y = _tanh(edges)
    assert torch.equal(y[:4], edges[:4]) and torch.equal(torch.signbit(y[:4]), torch.signbit(edges[:4]))
    assert y[4:].tolist() == [1.0, -1.0, 1.0, -1.0]
    assert torch.isnan(_tanh(torch.tensor([1.0, float("nan")])))[1]


def test_a_values_tanh_does_not_depend_on_where_it_sits_or_how_many_are_computed():
    x = torch.randn(1000)
    whole = _tanh(x)
    for n in (1, 7, 16, 33):  # blocks, tails and single values
        for start in (0, 5, 500):
            assert torch.equal(_tanh(x[start : start + n]), whole[start : start + n])


def test_tanh_backward_is_tanhs_and_the_write_is_seen_by_a_graph_that_saved_its_input():
    x = torch.randn(300, 64, requires_grad=True)
    pre = x * 2.0  # a fresh output, as a layer's
    y = Tanh()(pre)
    g = torch.randn(300, 64)
    y.backward(g)
    expected = g * (1 - _tanh(x.detach() * 2.0) ** 2) * 2.0
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=1e-6)
    # and tanh's derivative to float32 precision
    z = torch.linspace(-12, 12, 200_001, requires_grad=True)
    Tanh()(z * 1.0).sum().backward()
    assert (z.grad.double() - (1 - torch.tanh(z.detach().double()) ** 2)).abs().max() < 5e-7
    # a graph that saved the tensor tanh then wrote refuses its backward, as for any in-place op
    a = torch.randn(4, requires_grad=True)
    b = a * 3.0
    c = b * b  # saves b
    Tanh()(b)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        c.sum().backward()


@pytest.mark.parametrize("rows, cols", [(1792, 64), (37, 64), (50, 5), (3, 20)])
def test_bias_tanh_is_the_layer_with_its_bias_then_tanh_bit_for_bit(rows, cols):
    """tanh(F.linear(x, w) + b) through the native pass against the same with torch's ops: the
    same values and gradients, bit for bit, whole blocks of 16 rows and the rows after them,
    columns not a multiple of 16 included; a row's value does not depend on how many rows
    are computed; without gradients, and in float64 (torch's ops), the same. Against
    F.linear(x, w, b), the layer it replaces: to rounding."""
    g = torch.Generator().manual_seed(rows)
    x, w, b = torch.randn(rows, 9, generator=g), torch.randn(cols, 9, generator=g) * 0.5, torch.randn(cols, generator=g)
    out_grad = torch.randn(rows, cols, generator=g)

    def run(how: str, dtype=torch.float32):
        xs, ws, bs = (t.to(dtype).clone().requires_grad_(True) for t in (x, w, b))
        if how == "fused":
            y = bias_tanh(F.linear(xs, ws), bs)
        elif how == "product, then bias":
            y = Tanh()(F.linear(xs, ws) + bs)
        else:  # addmm's bias: where its BLAS adds it to the product as the product's last term
            y = Tanh()(F.linear(xs, ws, bs))
        y.backward(out_grad.to(dtype))
        return y.detach(), xs.grad, ws.grad, bs.grad

    fused = run("fused")
    ws = w.clone().requires_grad_(True)
    assert bias_tanh(F.linear(x, ws), b).grad_fn.name() == "_BiasTanhInPlaceBackward"  # the native pass
    for a, c in zip(fused, run("product, then bias")):
        assert torch.equal(a, c)
    for a, c in zip(fused, run("addmm")):  # the same bits on the CPUs measured; rounding in general
        torch.testing.assert_close(a, c, rtol=0, atol=1e-5)
    with torch.no_grad():
        assert torch.equal(bias_tanh(F.linear(x, w), b), fused[0])
        pre = F.linear(x, w)  # one product, so that only the kernel's row count differs
        for n in (1, 16, rows - 1):
            assert torch.equal(bias_tanh(pre[:n].clone(), b), fused[0][:n])
    for a, c in zip(run("fused", torch.float64), run("product, then bias", torch.float64)):
        assert torch.equal(a, c)


def _logits(rows: int, k: int, masked: tuple[int, ...] = (), seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, k, generator=g) * 3
    for j in masked:
        logits[:, j] = MASKED_LOGIT
    return logits


def _categorical_terms(logits, actions, w_lp, w_ent, native: bool):
    """log-prob, entropy and the gradient of `w_lp . logp + w_ent . entropy` (either weight
    None: that output alone), by this module's head or torch's Categorical."""
    logits = logits.clone().requires_grad_(True)
    if native:
        logp, ent = categorical_logp_entropy(logits, actions)
    else:
        dist = Categorical(logits=logits, validate_args=False)
        logp, ent = dist.log_prob(actions), dist.entropy()
    loss = 0
    if w_lp is not None:
        loss = loss + (logp * w_lp.to(logits.dtype)).sum()
    if w_ent is not None:
        loss = loss + (ent * w_ent.to(logits.dtype)).sum()
    loss.backward()
    return logp.detach(), ent.detach(), logits.grad


@pytest.mark.parametrize("k, masked", [(2, ()), (3, (2,)), (7, (0, 4)), (18, ())])
def test_the_categorical_heads_logprob_entropy_and_gradients_are_torchs(k, masked):
    """float32 against torch's Categorical in float64: as close as torch's own float32 is.
    (Over 200 draws of each case torch's float32 gradients were up to 2.2e-6 from float64 and
    this head's up to 2.5e-6; the two float32 results differ from each other by up to 2.9e-6,
    so comparing them to each other at 2e-6 failed one draw in some hundreds.)"""
    logits = _logits(500, k, masked)
    g = torch.Generator().manual_seed(k)
    valid = [j for j in range(k) if j not in masked]
    actions = torch.tensor(valid)[torch.randint(0, len(valid), (500,), generator=g)]
    w_lp, w_ent = torch.randn(500, generator=g), torch.randn(500, generator=g)
    for weights in ((w_lp, w_ent), (w_lp, None), (None, w_ent)):  # one output alone passes its gradient
        exact = _categorical_terms(logits.double(), actions, *weights, native=False)
        mine = _categorical_terms(logits, actions, *weights, native=True)
        for a, b in zip(mine, exact):
            torch.testing.assert_close(a.double(), b, rtol=0, atol=4e-6)
        assert (mine[2][:, list(masked)] == 0).all()
    # without gradients, and without the entropy: the same log-prob bits
    with torch.no_grad():
        assert torch.equal(categorical_logp_entropy(logits, actions, entropy=False)[0], mine[0])


def test_an_action_outside_the_head_is_refused_by_name():
    with pytest.raises(IndexError, match="outside the head's 2 actions"):
        categorical_logp_entropy(_logits(4, 2), torch.tensor([0, 1, 2, 0]))


def test_a_strided_head_is_computed_as_a_contiguous_one_and_float64_by_torch():
    logits = _logits(64, 6)
    actions = torch.randint(0, 3, (64,))
    strided = logits[:, ::2]
    assert torch.equal(
        categorical_logp_entropy(strided, actions)[0], categorical_logp_entropy(strided.contiguous(), actions)[0]
    )
    dist = Categorical(logits=logits.double(), validate_args=False)
    assert torch.equal(categorical_logp_entropy(logits.double(), actions)[1], dist.entropy())


def test_the_sampler_draws_each_action_at_its_probability_never_a_masked_one():
    rows = 200_000
    logits = torch.tensor([[0.0, 1.0, MASKED_LOGIT, 2.0]]).expand(rows, 4)
    torch.manual_seed(3)
    actions, logp, lse = categorical_sample(logits)
    p = torch.softmax(logits[0].double(), 0)
    counts = torch.bincount(actions, minlength=4).double() / rows
    assert counts[2] == 0
    assert (counts - p).abs().max() < 4 * float((p * (1 - p) / rows).sqrt().max())  # 4 sigma
    # its log-prob is the bits the head computes for that action, and log_prob_at's for another
    assert torch.equal(logp, categorical_logp_entropy(logits, actions, entropy=False)[0])
    other = (actions + 1) % 2
    assert torch.equal(log_prob_at(logits, other, lse), categorical_logp_entropy(logits, other, entropy=False)[0])


def test_the_sampler_refuses_logits_with_a_nan_as_torchs_sampling_does():
    logits = _logits(8, 3)
    logits[5, 1] = float("nan")
    with pytest.raises(ValueError, match="1 of 8 rows of discrete logits hold a NaN"):
        categorical_sample(logits)


def test_acting_reports_the_log_probs_training_recomputes_bit_for_bit():
    """float32 rows of two discrete types, one masking an action, and a continuous one: the
    policy's sample and the epsilon alternative each have the log-prob `evaluate` gives them,
    for the same rows."""
    state = ObsKey("state", (6,), "float32")
    specs = (
        EnvSpec({"state": ((4,), "float32")}, "discrete", 2),
        EnvSpec({"state": ((6,), "float32")}, "discrete", 3),
        EnvSpec({"state": ((3,), "float32")}, "continuous", 1),
    )
    plan = MixPlan(("a", "b", "c"), specs, np.tile(np.arange(3, dtype=np.int16), 40), ActionSpace(3, 1), (state,))
    torch.manual_seed(0)
    policy = Policy(plan, (state,), (64, 64))
    g = torch.Generator().manual_seed(1)
    types = torch.randint(0, 3, (120,), generator=g)
    obs = {"state": torch.randn(120, 6, generator=g)}
    out = policy.act_explore(obs, types, torch.Generator().manual_seed(2))
    with torch.no_grad():
        logp, _, _ = policy.evaluate(obs, types, out.a_disc, out.a_cont)
        alt_logp, _, _ = policy.evaluate(obs, types, out.alt_disc, out.alt_cont)
    assert torch.equal(out.logp, logp) and torch.equal(out.alt_logp, alt_logp)
    # acting on 7 rows, training on all 120: the same log-probs to float32 rounding. Not the
    # same bits on every CPU: with AVX-512 torch's matmul takes another kernel for a type's 1
    # or 2 rows than for 3 or more (the heads' products differ in the last bit); the native
    # steps add no such dependence (the test below).
    few = policy.act_explore({"state": obs["state"][:7]}, types[:7], torch.Generator().manual_seed(2))
    a_disc, a_cont = out.a_disc.clone(), out.a_cont.clone()
    a_disc[:7], a_cont[:7] = few.a_disc, few.a_cont
    with torch.no_grad():
        torch.testing.assert_close(policy.evaluate(obs, types, a_disc, a_cont)[0][:7], few.logp, rtol=0, atol=1e-6)


@pytest.mark.parametrize("k", [2, 3, 18])
def test_a_rows_sample_logprob_and_entropy_do_not_depend_on_how_many_rows_are_computed(k):
    logits = _logits(120, k)
    torch.manual_seed(4)
    whole = categorical_sample(logits)
    whole_terms = categorical_logp_entropy(logits, whole[0])
    for n in (1, 2, 7, 33):
        torch.manual_seed(4)  # the same uniforms for the first n rows
        part = categorical_sample(logits[:n])
        for a, b in zip(part, whole):
            assert torch.equal(a, b[:n])
        for a, b in zip(categorical_logp_entropy(logits[:n], part[0]), whole_terms):
            assert torch.equal(a, b[:n])


@pytest.mark.parametrize("clip_vloss", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
def test_the_loss_terms_and_their_gradients_are_the_torch_formulas(clip_vloss, weighted):
    """float32 rows through the native pass against the same formulas in float64 torch ops
    (weighted_ppo_terms takes torch's path for them), ties included: rows whose ratio is
    exactly 1 (both surrogate terms equal) and whose value did not move (both value terms
    equal), where torch's maximum passes half the gradient to each side."""
    n = 2000
    g = torch.Generator().manual_seed(5)
    old_logp = torch.randn(n, generator=g) * 0.3
    new_logp = old_logp + torch.randn(n, generator=g) * 0.3
    new_logp[:300] = old_logp[:300]
    old_value, ret, adv = (torch.randn(n, generator=g) for _ in range(3))
    new_value = old_value + torch.randn(n, generator=g) * 0.3
    new_value[300:600] = old_value[300:600]
    entropy = torch.rand(n, generator=g)
    weights = torch.rand(n, generator=g) if weighted else None
    fixed = (old_logp, old_value, adv, ret)

    def terms(dtype):
        live = [t.detach().to(dtype).clone().requires_grad_(True) for t in (new_logp, entropy, new_value)]
        ol, ov, a, r = (t.to(dtype) for t in fixed)
        out = weighted_ppo_terms(
            live[0], live[1], live[2], ol, ov, a, r, 0.2, clip_vloss, weights.to(dtype) if weighted else None
        )
        (1.3 * out.pg_loss + 0.5 * out.v_loss - 0.01 * out.entropy).backward()
        values = [getattr(out, k).detach().double() for k in ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac")]
        return values, [t.grad.double() for t in live], out.pg_loss.grad_fn.name()

    native, native_grads, native_fn = terms(torch.float32)
    exact, exact_grads, _ = terms(torch.float64)
    assert native_fn == "_PPOTermsBackward"  # the native pass, not torch's ops
    for a, b in zip(native, exact):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    for a, b in zip(native_grads, exact_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-8)
