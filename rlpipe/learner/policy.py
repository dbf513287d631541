"""Actor-critic over the run's obs spec and unified action spec.

Encoder: an MLP input over `state`/`vector` (concatenated), a small CNN over `rgb` when the
board has it. A key an env type does not produce is zero on the board and masked here.
Heads: a discrete head of `discrete_n` logits (entries past a type's action count masked)
and a diagonal-Gaussian continuous head of `cont_dim` (dims past a type's count left out of
the log-prob and entropy). Each sample uses the head of its env type.
Initialisation and widths follow CleanRL's ppo.py (orthogonal, tanh, 0.01 actor gain).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Normal

from rlpipe.envs.contract import CONTINUOUS
from rlpipe.envs.registry import MixPlan

MASKED_LOGIT = -1e9


class ActOut(NamedTuple):
    a_disc: torch.Tensor       # [B] int64   policy sample
    a_cont: torch.Tensor       # [B, D]      policy sample (unclipped)
    logp: torch.Tensor         # [B]         log pi(a)
    value: torch.Tensor        # [B]
    alt_disc: torch.Tensor     # [B] int64   uniform over the env type's valid actions
    alt_cont: torch.Tensor     # [B, D]      uniform over [-1, 1) on valid dims, 0 elsewhere
    alt_logp: torch.Tensor     # [B]         log pi(alt)


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(n_in: int, hidden: tuple[int, ...], n_out: int, out_std: float) -> nn.Sequential:
    layers, width = [], n_in
    for h in hidden:
        layers += [layer_init(nn.Linear(width, h)), nn.Tanh()]
        width = h
    layers.append(layer_init(nn.Linear(width, n_out), std=out_std))
    return nn.Sequential(*layers)


class RgbEncoder(nn.Module):
    """Nature-CNN-sized conv stack for HxWxC uint8 or float images."""

    def __init__(self, shape: tuple[int, int, int], channels: tuple[int, int, int] = (32, 64, 64),
                 out: int = 256):
        super().__init__()
        h, w, c = shape
        c1, c2, c3 = channels
        self.conv = nn.Sequential(
            layer_init(nn.Conv2d(c, c1, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(c1, c2, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(c2, c3, 3, stride=1)), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            n = self.conv(torch.zeros(1, c, h, w)).shape[1]
        self.fc = nn.Sequential(layer_init(nn.Linear(n, out)), nn.ReLU())
        self.out = out

    def forward(self, rgb: torch.Tensor) -> torch.Tensor:
        x = rgb.permute(0, 3, 1, 2).float()
        if rgb.dtype == torch.uint8:
            x = x / 255.0
        return self.fc(self.conv(x))


class Policy(nn.Module):
    def __init__(self, plan: MixPlan, obs_keys, hidden: tuple[int, ...],
                 cnn_channels: tuple[int, int, int] = (32, 64, 64), cnn_out: int = 256):
        super().__init__()
        self.low_keys = [k.name for k in obs_keys if k.name != "rgb"]
        rgb = [k for k in obs_keys if k.name == "rgb"]
        self.rgb = RgbEncoder(rgb[0].shape, cnn_channels, cnn_out) if rgb else None
        low_dim = sum(int(np.prod(k.shape)) for k in obs_keys if k.name != "rgb")
        n_feat = low_dim + (self.rgb.out if self.rgb else 0)
        self.disc_n = plan.actions.discrete_n
        self.cont_dim = plan.actions.cont_dim
        n_types = len(plan.names)
        key_mask = np.zeros((n_types, len(obs_keys)), dtype=np.float32)
        disc_mask = np.zeros((n_types, max(self.disc_n, 1)), dtype=bool)
        cont_mask = np.zeros((n_types, max(self.cont_dim, 1)), dtype=np.float32)
        is_cont = np.zeros(n_types, dtype=bool)
        for t, spec in enumerate(plan.specs):
            for j, k in enumerate(obs_keys):
                key_mask[t, j] = k.name in spec.obs
            if spec.action_kind == CONTINUOUS:
                is_cont[t] = True
                cont_mask[t, :spec.action_n] = 1.0
            else:
                disc_mask[t, :spec.action_n] = True
        self.register_buffer("key_mask", torch.from_numpy(key_mask))
        self.register_buffer("disc_mask", torch.from_numpy(disc_mask))
        self.register_buffer("cont_mask", torch.from_numpy(cont_mask))
        self.register_buffer("is_cont", torch.from_numpy(is_cont))
        self.key_names = [k.name for k in obs_keys]
        self.critic = mlp(n_feat, hidden, 1, out_std=1.0)
        self.actor_disc = mlp(n_feat, hidden, self.disc_n, out_std=0.01) if self.disc_n else None
        self.actor_cont = mlp(n_feat, hidden, self.cont_dim, out_std=0.01) if self.cont_dim else None
        self.log_std = nn.Parameter(torch.zeros(max(self.cont_dim, 1)))

    def features(self, obs: dict[str, torch.Tensor], types: torch.Tensor) -> torch.Tensor:
        mask = self.key_mask[types]                      # [B, n_keys]
        parts = []
        for j, name in enumerate(self.key_names):
            if name == "rgb":
                parts.append(self._rgb_features(obs[name], mask[:, j] > 0))
            else:
                parts.append(obs[name].float().reshape(len(types), -1) * mask[:, j:j + 1])
        return torch.cat(parts, dim=1)

    def _rgb_features(self, rgb: torch.Tensor, has_rgb: torch.Tensor) -> torch.Tensor:
        """The CNN runs only on rows whose env type renders rgb: in a mixed run most rows
        would feed it zeros, and the CNN is the policy's dominant cost."""
        if bool(has_rgb.all()):
            return self.rgb(rgb)
        out = torch.zeros(len(rgb), self.rgb.out, device=rgb.device)
        rows = has_rgb.nonzero(as_tuple=True)[0]
        if len(rows):
            out[rows] = self.rgb(rgb[rows])
        return out

    def value(self, obs, types) -> torch.Tensor:
        return self.critic(self.features(obs, types)).squeeze(-1)

    def _dists(self, feat: torch.Tensor, types: torch.Tensor):
        disc = cont = None
        if self.actor_disc is not None:
            logits = self.actor_disc(feat).masked_fill(~self.disc_mask[types], MASKED_LOGIT)
            disc = Categorical(logits=logits)
        if self.actor_cont is not None:
            mean = self.actor_cont(feat)
            cont = Normal(mean, self.log_std.expand_as(mean).exp())
        return disc, cont

    def _logp_entropy(self, disc, cont, types, a_disc, a_cont):
        zeros = torch.zeros(len(types), device=types.device)
        d_lp = disc.log_prob(a_disc) if disc is not None else zeros
        d_ent = disc.entropy() if disc is not None else zeros
        if cont is None:
            return d_lp, d_ent
        valid = self.cont_mask[types]
        c_lp = (cont.log_prob(a_cont) * valid).sum(-1)
        c_ent = (cont.entropy() * valid).sum(-1)
        if disc is None:
            return c_lp, c_ent
        sel = self.is_cont[types]
        return torch.where(sel, c_lp, d_lp), torch.where(sel, c_ent, d_ent)

    @torch.no_grad()
    def act(self, obs, types):
        """Sample actions for a batch: (discrete [B] int64, continuous [B, cont_dim], logp, value)."""
        feat = self.features(obs, types)
        disc, cont = self._dists(feat, types)
        b = len(types)
        a_disc = disc.sample() if disc is not None else torch.zeros(b, dtype=torch.int64)
        a_cont = cont.sample() if cont is not None else torch.zeros(b, 1)
        logp, _ = self._logp_entropy(disc, cont, types, a_disc, a_cont)
        return a_disc, a_cont, logp, self.critic(feat).squeeze(-1)

    @torch.no_grad()
    def act_explore(self, obs, types, generator: torch.Generator | None = None) -> ActOut:
        """`act` plus one uniform alternative per sample and the policy's log-prob of it: what
        a worker needs to apply epsilon-greedy and report the behaviour log-prob. The policy
        sample is drawn exactly as `act` draws it; the alternative uses `generator` (a
        dedicated one, so exploration does not shift the policy's random stream)."""
        feat = self.features(obs, types)
        disc, cont = self._dists(feat, types)
        b, dev = len(types), feat.device
        a_disc = disc.sample() if disc is not None else torch.zeros(b, dtype=torch.int64, device=dev)
        a_cont = cont.sample() if cont is not None else torch.zeros(b, 1, device=dev)
        logp, _ = self._logp_entropy(disc, cont, types, a_disc, a_cont)
        n_valid = self.disc_mask[types].sum(-1).clamp_min(1)
        alt_disc = torch.minimum((torch.rand(b, generator=generator, device=dev) * n_valid).long(),
                                 n_valid - 1)
        alt_cont = (torch.rand(a_cont.shape, generator=generator, device=dev) * 2.0 - 1.0) \
            * self.cont_mask[types][:, :a_cont.shape[1]]
        alt_logp, _ = self._logp_entropy(disc, cont, types, alt_disc, alt_cont)
        return ActOut(a_disc, a_cont, logp, self.critic(feat).squeeze(-1), alt_disc, alt_cont, alt_logp)

    def evaluate(self, obs, types, a_disc, a_cont):
        feat = self.features(obs, types)
        disc, cont = self._dists(feat, types)
        logp, entropy = self._logp_entropy(disc, cont, types, a_disc, a_cont)
        return logp, entropy, self.critic(feat).squeeze(-1)
