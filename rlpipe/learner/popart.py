"""Per-type value normalization with output preservation: PopArt (van Hasselt et al. 2016) in
its multi-task form (Hessel et al. 2019), one (mu, sigma) per env type.

The critic predicts each type's value in that type's normalized scale; the value in return
space is `sigma_t * v + mu_t`. Before each PPO update the statistics move toward the batch's
returns of each type ("Pop": the targets follow the statistics), and the critic's per-type
output layer is rescaled so its return-space output for every input is unchanged ("Art":
W' = W sigma / sigma', b' = (sigma b + mu - mu') / sigma').

Statistics are exponential moving averages of the first and second moment of the returns,
with a per-sample step size `beta` (a batch of n returns of a type moves them by
1 - (1 - beta)^n) and debiased like Adam's moments, so the first batch sets them directly
instead of being averaged with the arbitrary starting point. sigma is clamped to
[SIGMA_MIN, SIGMA_MAX] so a type whose returns are all equal does not divide by zero.

`beta` is one float, or a float64 tensor [n_types] when the env types set their own
(`learner.popart_beta` on an env node, rlpipe/learner/type_settings.py).

Everything lives in buffers, on the policy's device: a batch's statistics are computed there
(its returns and types are moved to the buffers, never the reverse), and it travels with `state_dict` (the serving copy of the policy,
checkpoints, export) and is restored bit for bit. With value_norm=none nothing is updated
and (mu, sigma) stay (0, 1): the critic predicts returns directly.
"""

from __future__ import annotations

import torch
from torch import nn

SIGMA_MIN = 1e-4
SIGMA_MAX = 1e6


class PopArt(nn.Module):
    def __init__(self, n_types: int):
        super().__init__()
        self.register_buffer("mu", torch.zeros(n_types, dtype=torch.float64))
        self.register_buffer("sigma", torch.ones(n_types, dtype=torch.float64))
        # raw (biased) EMAs of E[G], E[G^2], and of the weight they have accumulated
        self.register_buffer("m1", torch.zeros(n_types, dtype=torch.float64))
        self.register_buffer("m2", torch.zeros(n_types, dtype=torch.float64))
        self.register_buffer("w", torch.zeros(n_types, dtype=torch.float64))

    def denormalize(self, v: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        return v * self.sigma[types].to(v.dtype) + self.mu[types].to(v.dtype)

    def normalize(self, x: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        return (x - self.mu[types].to(x.dtype)) / self.sigma[types].to(x.dtype)

    @torch.no_grad()
    def update(self, returns: torch.Tensor, types: torch.Tensor, beta: float | torch.Tensor, out_layer) -> None:
        """Move each type's statistics toward `returns` (return space) and rescale row t of
        `out_layer` (a TypedLinear with one output: weight [n_types, 1, h], bias
        [n_types, 1]) so that sigma * v + mu is unchanged for every input."""
        n_types, dev = len(self.mu), self.mu.device
        g = returns.detach().to(dev, torch.float64)
        t = types.detach().to(dev)
        count = torch.bincount(t, minlength=n_types).to(torch.float64)
        seen = count > 0
        if not bool(seen.any()):
            return
        mean = torch.zeros(n_types, dtype=torch.float64, device=dev).index_add_(0, t, g) / count.clamp_min(1)
        sq = torch.zeros(n_types, dtype=torch.float64, device=dev).index_add_(0, t, g * g) / count.clamp_min(1)
        self._move(count, mean, sq, beta, out_layer)

    @torch.no_grad()
    def update_sums(
        self, count: torch.Tensor, total: torch.Tensor, total_sq: torch.Tensor, beta: float | torch.Tensor, out_layer
    ) -> None:
        """`update` from per-type sample counts, sums and sums of squares of the returns
        (float64, [n_types]): what ranks all-reduce so every rank moves the same statistics
        by the same batch (rlpipe.ranks)."""
        count, total, total_sq = (x.detach().to(self.mu.device, torch.float64) for x in (count, total, total_sq))
        if not bool((count > 0).any()):
            return
        self._move(count, total / count.clamp_min(1), total_sq / count.clamp_min(1), beta, out_layer)

    @torch.no_grad()
    def _move(
        self, count: torch.Tensor, mean: torch.Tensor, sq: torch.Tensor, beta: float | torch.Tensor, out_layer
    ) -> None:
        seen = count > 0
        if isinstance(beta, torch.Tensor):
            beta = beta.to(self.mu.device, torch.float64)
        keep = torch.where(seen, (1.0 - beta) ** count, torch.ones_like(count))
        self.m1.mul_(keep).add_((1 - keep) * mean)
        self.m2.mul_(keep).add_((1 - keep) * sq)
        self.w.mul_(keep).add_(1 - keep)
        w = self.w.clamp_min(1e-300)
        new_mu = torch.where(seen | (self.w > 0), self.m1 / w, self.mu)
        var = (self.m2 / w - new_mu**2).clamp_min(0.0)
        new_sigma = torch.where(seen | (self.w > 0), var.sqrt().clamp(SIGMA_MIN, SIGMA_MAX), self.sigma)
        self.preserve(out_layer, new_mu, new_sigma)

    @torch.no_grad()
    def preserve(self, out_layer, new_mu: torch.Tensor, new_sigma: torch.Tensor) -> None:
        """Rescale the output layer for new statistics, then adopt them."""
        dev, dt = out_layer.weight.device, out_layer.weight.dtype
        ratio = (self.sigma / new_sigma).to(dev)
        shift = ((self.mu - new_mu) / new_sigma).to(dev)
        out_layer.weight.mul_(ratio.to(dt)[:, None, None])
        out_layer.bias.copy_((out_layer.bias.to(torch.float64) * ratio[:, None] + shift[:, None]).to(dt))
        self.mu.copy_(new_mu)
        self.sigma.copy_(new_sigma)
