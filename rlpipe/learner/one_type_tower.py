"""A tower's forward and backward on one type's rows, in training on a CPU learner: one autograd
node for the whole tower, its backward written out.

Through autograd a tower of CartPole's size (a typed input layer, a 64-wide hidden layer, a
typed output layer) is a dozen nodes a minibatch: each layer's unbind of the per-type weights
and its stack back, the weight slice to the type's input columns and its zero-filled backward,
transposes, a detach per saved tensor. Their Python and dispatch cost 14-19 % of the tower's
forward and backward on 1,792 rows, where the matmuls and tanh are the same either way
(docs/benchmarks.md, "A tower's backward written out").

The backward makes the calls autograd makes, with the same operands in the same layouts (a
weight gradient as `g.t() @ x` or `(x.t() @ g).t()` as torch's `mm_mat2_backward` picks it by
the weight's strides), so values and gradients are autograd's bit for bit
(tests/test_one_type_tower.py). A batch of several types keeps `Tower`'s layer by layer path:
its per-type segments are that path's job.
"""

from __future__ import annotations

import torch

from rlpipe.learner import ppo_kernels
from rlpipe.native import ppokernels


def applies(tower, x: torch.Tensor, segments: tuple) -> bool:
    """Whether `one_type_tower` computes this forward: one type's rows, with gradients, on
    float32 CPU tensors with the native kernels on."""
    return (
        len(segments) == 1
        and torch.is_grad_enabled()
        and ppo_kernels.native_on()
        and x.dim() == 2
        and all(p.device.type == "cpu" and p.dtype == torch.float32 for p in (x, tower.inp.weight))
    )


def one_type_tower(tower, x: torch.Tensor, t: int) -> torch.Tensor:
    """`tower`'s output (rlpipe.learner.policy.Tower) for rows `x`, all of type `t`."""
    width = tower.inp.in_widths[t]
    trunk = [p for linear in tower.trunk[::2] for p in (linear.weight, linear.bias)]
    return _OneTypeTower.apply(x, t, width, tower.inp.weight, tower.inp.bias, tower.out.weight, tower.out.bias, *trunk)


def _bias_tanh_(pre: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """tanh(pre + bias) into pre, a fresh product (ppo_kernels.bias_tanh's native pass)."""
    ppokernels.bias_tanh_(pre.data_ptr(), bias.contiguous().data_ptr(), pre.shape[0], pre.shape[1])
    return pre


def _tanh_grad(grad: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(grad)
    ppokernels.tanh_grad(grad.data_ptr(), y.data_ptr(), out.data_ptr(), grad.numel())
    return out


def _weight_grad(g: torch.Tensor, inp: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """d loss / d weight of `F.linear(inp, weight)` from the output's gradient `g`, computed as
    torch's mm backward computes it for that weight: `g.t() @ inp` where the weight is
    contiguous (its transpose column-major), else `(inp.t() @ g).t()`."""
    return torch.mm(g.t(), inp) if weight.is_contiguous() else torch.mm(inp.t(), g).t()


class _OneTypeTower(torch.autograd.Function):
    """tanh(x W_in[t]^T + b_in[t]), then each hidden layer's tanh(h W^T + b), then the output
    h W_out[t]^T + b_out[t]; x's columns past the type's `width` are never read (TypedLinear's
    `in_widths`)."""

    @staticmethod
    def forward(ctx, x, t, width, w_in, b_in, w_out, b_out, *trunk):
        n_in = w_in.shape[2]
        rows = x if width == n_in else x[:, :width]
        w_first = w_in[t] if width == n_in else w_in[t][:, :width]
        h = _bias_tanh_(torch.mm(rows, w_first.t()), b_in[t])
        hidden = [h]
        for weight, bias in zip(trunk[::2], trunk[1::2]):
            h = _bias_tanh_(torch.mm(h, weight.t()), bias)
            hidden.append(h)
        out = torch.addmm(b_out[t], h, w_out[t].t())
        ctx.save_for_backward(rows, w_in, w_out, *trunk[::2], *hidden)
        ctx.t, ctx.width, ctx.n_layers = t, width, len(trunk) // 2
        ctx.sizes = (tuple(w_in.shape), tuple(b_in.shape), tuple(w_out.shape), tuple(b_out.shape), x.shape[1])
        return out

    @staticmethod
    def backward(ctx, g_out):
        rows, w_in, w_out, *rest = ctx.saved_tensors
        weights, hidden = rest[: ctx.n_layers], rest[ctx.n_layers :]
        t, width = ctx.t, ctx.width
        in_shape, b_in_shape, out_shape, b_out_shape, x_width = ctx.sizes
        g_out = g_out.contiguous()
        # the output layer (addmm): its bias's gradient is the column sums, as addmm's backward
        w_last = w_out[t]
        g_w_out = torch.zeros(out_shape, dtype=g_out.dtype)
        g_w_out[t] = torch.mm(g_out.t(), hidden[-1])
        g_b_out = torch.zeros(b_out_shape, dtype=g_out.dtype)
        g_b_out[t] = g_out.sum(0, keepdim=True).view(-1)
        g_h = torch.mm(g_out, w_last)
        trunk_grads: list[torch.Tensor] = []
        for i in range(ctx.n_layers - 1, -1, -1):  # the hidden layers, last first
            g_pre = _tanh_grad(g_h, hidden[i + 1])
            trunk_grads[:0] = [_weight_grad(g_pre, hidden[i], weights[i]), g_pre.sum(0)]
            g_h = torch.mm(g_pre, weights[i])
        # the input layer: its weight's gradient lands in type t's columns [0, width)
        g_pre = _tanh_grad(g_h, hidden[0])
        w_first = w_in[t] if width == in_shape[2] else w_in[t][:, :width]
        g_w_in = torch.zeros(in_shape, dtype=g_pre.dtype)
        g_w_in[t, :, :width] = _weight_grad(g_pre, rows, w_first)
        g_b_in = torch.zeros(b_in_shape, dtype=g_pre.dtype)
        g_b_in[t] = g_pre.sum(0)
        g_x = None
        if ctx.needs_input_grad[0]:  # features from the CNN (rgb types) take their gradient on
            g_x = torch.mm(g_pre, w_first)
            if width != x_width:  # the columns past the type's width: zeros, as a slice's backward
                g_x = torch.zeros(len(g_x), x_width, dtype=g_x.dtype).index_copy_(1, torch.arange(width), g_x)
        return (g_x, None, None, g_w_in, g_b_in, g_w_out, g_b_out, *trunk_grads)
