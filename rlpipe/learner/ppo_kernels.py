"""PPO's elementwise steps on a CPU learner, each one native call: the towers' tanh in place and
its backward; a categorical head's log-prob and entropy (with their backward) and its
sampling; a minibatch's loss terms and their backward.

Each is one native pass on float32 (rlpipe/native/ppokernels.pyx) where torch ran several ops
a call: in a PPO minibatch of the CartPole-sized towers, the forward and the loss paid more for
the count of small ops (and for torch.distributions' Python) than for their arithmetic.
Elsewhere (cuda, another dtype) the same functions compute with torch ops; so does tanh on a
strided tensor, which no tower makes (a layer's output is contiguous). The figures:
docs/benchmarks.md, "PPO's kernels".

Acting and training call the same functions, so for the same obs and weights the behaviour
log-prob a worker reports and the one PPO recomputes are the same bits. These steps add no
dependence on how many rows are computed at once (a value's tanh, a row's log-prob: tested);
torch's matmul can (with AVX-512 a 1- or 2-row product takes another kernel than 3 rows or more,
and differs in the last bit), so acting's batch and training's agree to float32 rounding.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.autograd.graph import increment_version
from torch.distributions import Categorical

from rlpipe.native import ppokernels

_native_on = True  # torch_ops_only() turns the native calls off


@contextlib.contextmanager
def torch_ops_only():
    """Inside the block every step here computes with torch's ops, on the CPU too: what the
    learner computes on a device, and so the CPU reference a device's numbers are checked
    against, bit for bit (tests/device_checks.py). Not thread-safe: for checks, not runs."""
    global _native_on
    before, _native_on = _native_on, False
    try:
        yield
    finally:
        _native_on = before


def native_on() -> bool:
    """Whether the native steps run (not inside `torch_ops_only`)."""
    return _native_on


def _native(x: torch.Tensor) -> bool:
    return _native_on and x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous()


def _native_head(logits: torch.Tensor, actions: torch.Tensor) -> bool:
    return (
        _native_on
        and logits.device.type == "cpu"
        and logits.dtype == torch.float32
        and logits.dim() == 2
        and actions.device.type == "cpu"
        and actions.dtype == torch.int64
        and actions.shape == (len(logits),)
    )


def _tanh_(x: torch.Tensor) -> torch.Tensor:
    """tanh of x, written into x."""
    if _native(x):
        ppokernels.tanh_(x.data_ptr(), x.numel())
        increment_version(x)  # as an in-place torch op would: a graph that saved x sees the write
        return x
    return x.tanh_()


class _TanhInPlace(torch.autograd.Function):
    """tanh in place on x; the backward is tanh's own, from the output. In place is safe because
    every caller passes a layer's fresh output that nothing else holds: Linear's backward keeps
    its input and weight, not its output."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = _tanh_(x)
        ctx.mark_dirty(y)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return _tanh_backward(grad, y)


def _tanh_backward(grad: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The gradient at tanh's input from the gradient at its output y: grad * (1 - y^2)."""
    grad = grad.contiguous()
    if not _native(y):
        return torch.ops.aten.tanh_backward(grad, y)
    out = torch.empty_like(grad)
    ppokernels.tanh_grad(grad.data_ptr(), y.data_ptr(), out.data_ptr(), grad.numel())
    return out


class Tanh(nn.Module):
    """nn.Tanh, in place on its input (a layer's fresh output), in acting and in training alike.
    Without gradients (acting) the same arithmetic runs without the autograd Function's Python
    round trip. The towers' layers use `bias_tanh` (their bias added in the same pass)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            # autograd refuses in-place writes to a leaf (a tensor no layer produced)
            return _TanhInPlace.apply(x.clone() if x.is_leaf else x)
        return _tanh_(x)


class _BiasTanhInPlace(torch.autograd.Function):
    """tanh(pre + bias) written into pre, a layer's bias-free product that nothing else holds
    (as for _TanhInPlace); the backward is tanh's, and the bias's gradient its column sums."""

    @staticmethod
    def forward(ctx, pre: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ppokernels.bias_tanh_(pre.data_ptr(), bias.data_ptr(), pre.shape[0], pre.shape[1])
        increment_version(pre)
        ctx.mark_dirty(pre)
        ctx.save_for_backward(pre)
        return pre

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (y,) = ctx.saved_tensors
        g_pre = _tanh_backward(grad, y)
        return g_pre, g_pre.sum(0) if ctx.needs_input_grad[1] else None


def bias_tanh(pre: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A tower layer's activation, tanh(pre + bias), from its product without the bias (`pre`
    = `F.linear(x, weight)`, fresh): `addmm` first fills its output with the bias, a pass over
    it that this saves, with one autograd node where there were two (docs/benchmarks.md, "The
    bias in the tanh kernel"). The values of `F.linear(x, weight) + bias` then tanh: those of
    `F.linear(x, weight, bias)` then tanh wherever the BLAS adds the bias to the finished
    product, as this CPU's MKL does (tests/test_ppo_kernels.py)."""
    if not (_native(pre) and pre.dim() == 2 and _native(bias) and bias.shape == (pre.shape[1],)):
        return Tanh()(pre + bias)
    if torch.is_grad_enabled() and (pre.requires_grad or bias.requires_grad):
        return _BiasTanhInPlace.apply(pre, bias)
    ppokernels.bias_tanh_(pre.data_ptr(), bias.data_ptr(), pre.shape[0], pre.shape[1])
    increment_version(pre)
    return pre


def _categorical(logits: torch.Tensor, actions: torch.Tensor, entropy: bool, lse: bool):
    rows, k = logits.shape
    logp = logits.new_empty(rows)
    ent = logits.new_empty(rows) if entropy else None
    norm = logits.new_empty(rows) if lse else None
    bad = ppokernels.categorical(
        logits.data_ptr(),
        actions.data_ptr(),
        rows,
        k,
        logp.data_ptr(),
        ent.data_ptr() if ent is not None else 0,
        norm.data_ptr() if norm is not None else 0,
    )
    if bad:
        raise IndexError(f"{bad} of {rows} discrete actions are outside the head's {k} actions [0, {k})")
    return logp, ent, norm


class _CategoricalTerms(torch.autograd.Function):
    """(log-prob of `actions`, entropy) of the categorical over each row's logits."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, actions: torch.Tensor):
        logp, ent, lse = _categorical(logits, actions, entropy=True, lse=True)
        ctx.save_for_backward(logits, actions, lse, ent)
        ctx.set_materialize_grads(False)  # an output no loss used passes no gradient
        return logp, ent

    @staticmethod
    def backward(ctx, d_logp: torch.Tensor | None, d_entropy: torch.Tensor | None):
        logits, actions, lse, ent = ctx.saved_tensors
        if d_logp is None and d_entropy is None:
            return None, None
        d_logp = d_logp.float().contiguous() if d_logp is not None else None
        d_entropy = d_entropy.float().contiguous() if d_entropy is not None else None
        out = torch.empty_like(logits)
        ppokernels.categorical_grad(
            logits.data_ptr(),
            actions.data_ptr(),
            lse.data_ptr(),
            ent.data_ptr(),
            d_logp.data_ptr() if d_logp is not None else 0,
            d_entropy.data_ptr() if d_entropy is not None else 0,
            *logits.shape,
            out.data_ptr(),
        )
        return out, None


def categorical_sample(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(an action drawn from each row's categorical, its log-prob, the row's log-normalizer),
    of `[rows, k]` logits, without gradients (acting). The log-prob is the bits
    `categorical_logp_entropy` gives for that action, and `log_prob_at` gives another
    action's from the log-normalizer. On a CPU learner the draw is one uniform per row from
    torch's default generator, by inverse CDF; elsewhere torch's Categorical samples."""
    if not (_native_on and logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2):
        dist = Categorical(logits=logits, validate_args=False)
        actions = dist.sample()
        return actions, dist.log_prob(actions), logits.logsumexp(-1)
    logits = logits.contiguous()
    rows, k = logits.shape
    uniform = torch.rand(rows)
    actions = torch.empty(rows, dtype=torch.int64)
    logp, lse = logits.new_empty(rows), logits.new_empty(rows)
    bad = ppokernels.categorical_draw(
        logits.data_ptr(), uniform.data_ptr(), rows, k, actions.data_ptr(), logp.data_ptr(), lse.data_ptr()
    )
    if bad:  # as torch's sampling refuses them: a diverged policy stops the run loudly
        raise ValueError(f"{bad} of {rows} rows of discrete logits hold a NaN or an infinity: nothing to sample from")
    return actions, logp, lse


def log_prob_at(logits: torch.Tensor, actions: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Each row's log-prob of `actions` from its log-normalizer (`categorical_sample`'s):
    l_a - lse, the same single rounding the native kernels make."""
    return logits.gather(1, actions.unsqueeze(1)).squeeze(1) - lse


def categorical_logp_entropy(
    logits: torch.Tensor, actions: torch.Tensor, entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-prob of each row's action, entropy of its categorical or None where not asked for),
    of `[rows, k]` logits (a type's masked entries at a large negative value), with gradients
    to the logits where they require them: the numbers torch's Categorical(logits=) gives."""
    if not _native_head(logits, actions):
        dist = Categorical(logits=logits, validate_args=False)
        return dist.log_prob(actions), dist.entropy() if entropy else None
    # a strided view is copied, never computed by torch instead: acting and training would differ
    logits, actions = logits.contiguous(), actions.contiguous()
    if torch.is_grad_enabled() and logits.requires_grad:
        logp, ent = _CategoricalTerms.apply(logits, actions)
        return logp, ent if entropy else None
    logp, ent, _ = _categorical(logits, actions, entropy, lse=False)
    return logp, ent


class _PPOTerms(torch.autograd.Function):
    """PPO's clipped surrogate, value loss and entropy (weighted means, with gradients) and
    approx_kl and clipfrac (unweighted), of one minibatch's rows in one native pass."""

    @staticmethod
    def forward(ctx, new_logp, entropy, new_value, old_logp, old_value, adv, ret, weights, clip_coef, clip_vloss):
        rows = (new_logp, entropy, new_value, old_logp, old_value, adv, ret)
        w = weights.data_ptr() if weights is not None else 0
        terms, wsum = ppokernels.ppo_terms(*(t.data_ptr() for t in rows), w, len(adv), clip_coef, clip_vloss)
        ctx.save_for_backward(new_logp, new_value, old_logp, old_value, adv, ret, weights)
        ctx.clip, ctx.clip_vloss, ctx.wsum = clip_coef, clip_vloss, wsum
        ctx.set_materialize_grads(False)
        pg, v, h, kl, clipfrac = (torch.tensor(x, dtype=torch.float32) for x in terms)
        ctx.mark_non_differentiable(kl, clipfrac)
        return pg, v, h, kl, clipfrac

    @staticmethod
    def backward(ctx, g_pg, g_v, g_h, _kl, _clipfrac):
        new_logp, new_value, old_logp, old_value, adv, ret, weights = ctx.saved_tensors
        d_logp, d_entropy, d_value = (torch.empty_like(new_logp) for _ in range(3))
        ppokernels.ppo_terms_grad(
            *(t.data_ptr() for t in (new_logp, new_value, old_logp, old_value, adv, ret)),
            weights.data_ptr() if weights is not None else 0,
            len(adv),
            ctx.clip,
            ctx.clip_vloss,
            ctx.wsum,
            *(float(g) if g is not None else 0.0 for g in (g_pg, g_v, g_h)),
            d_logp.data_ptr(),
            d_entropy.data_ptr(),
            d_value.data_ptr(),
        )
        return d_logp, d_entropy, d_value, None, None, None, None, None, None, None


def ppo_terms(new_logp, entropy, new_value, old_logp, old_value, adv, ret, clip_coef, clip_vloss, weights):
    """(pg_loss, v_loss, entropy, approx_kl, clipfrac) of `weighted_ppo_terms`
    (rlpipe/learner/scaling.py) in one native pass on float32 CPU rows; None where the rows
    are not all such (the caller computes them with torch ops)."""
    rows = [new_logp, entropy, new_value, old_logp, old_value, adv, ret]
    if weights is not None:
        rows.append(weights)
    if not all(_native(t) and t.dim() == 1 and len(t) == len(adv) for t in rows):
        return None
    return _PPOTerms.apply(
        new_logp, entropy, new_value, old_logp, old_value, adv, ret, weights, float(clip_coef), bool(clip_vloss)
    )
