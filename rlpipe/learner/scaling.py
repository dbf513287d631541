"""Per-env gradient scaling and score-steered exploration, learner side.

Stability scores (rlpipe.worker.stability, in [0, 1]) arrive with the step results. Here:

- weight  w = min_weight + (1 - min_weight) * score        (scaling.min_weight)
  linear and monotone: score 1 -> 1.0, score 0 -> min_weight. scaling=off: weight 1 (pass
  weights=None to `weighted_ppo_terms` to reproduce the unweighted loss bit for bit).
- epsilon eps = eps_min + (eps_max - eps_min) * (1 - score)
  Choice: the LESS stable an env, the MORE it explores. Instability (reward spread, erratic
  episode lengths) says the policy has not settled on that env; those envs are also the ones
  whose samples carry the smallest gradient weight, so their off-policy exploratory samples
  move the update least, while stable envs (full weight) stay on-policy (scaling.eps_min: 0 in
  conf/).
  Passing eps_max < eps_min inverts the direction (stable envs explore more).
- behaviour log-prob under epsilon-greedy: log((1 - eps) pi(a) + eps u(a)); see the worker
  module for u(a) (1/n_valid discrete; 2^-d inside [-1, 1]^d continuous, 0 outside) and for
  the data the worker needs: `Policy.act_explore` produces it (the policy's sample and
  log-prob, plus one uniform alternative and the policy's log-prob of it).
- `weighted_ppo_terms`: PPO's clipped surrogate, value loss and entropy, each the weighted
  mean sum(w * term) / sum(w) over the minibatch (normalized by the weight sum: the weights
  set the relative share of envs within a minibatch, not the loss scale).

Functions taking scores accept numpy arrays or torch tensors and return the same kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rlpipe.learner.ppo_kernels import ppo_terms

__all__ = ["score_to_weight", "score_to_epsilon", "weighted_ppo_terms", "weighted_mean", "PPOTerms"]


def _clip01(x):
    return x.clamp(0.0, 1.0) if isinstance(x, torch.Tensor) else np.clip(np.asarray(x, dtype=np.float32), 0.0, 1.0)


def score_to_weight(scores, min_weight: float):
    """Gradient weight in [min_weight, 1], linear and monotone in the score."""
    if not 0.0 <= min_weight <= 1.0:
        raise ValueError(f"scaling.min_weight must be in [0, 1], got {min_weight}")
    return min_weight + (1.0 - min_weight) * _clip01(scores)


def score_to_epsilon(scores, eps_max: float, eps_min: float):
    """Exploration rate: eps_max at score 0, eps_min at score 1 (linear)."""
    for name, v in (("eps_max", eps_max), ("eps_min", eps_min)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"scaling.{name} must be in [0, 1], got {v}")
    return eps_min + (eps_max - eps_min) * (1.0 - _clip01(scores))


@dataclass
class PPOTerms:
    pg_loss: torch.Tensor  # weighted clipped surrogate (to minimize)
    v_loss: torch.Tensor  # weighted 0.5 * (clipped) squared error
    entropy: torch.Tensor  # weighted mean entropy
    approx_kl: torch.Tensor  # unweighted diagnostics, no grad (as in CleanRL)
    clipfrac: torch.Tensor


def weighted_ppo_terms(
    new_logp: torch.Tensor,
    entropy: torch.Tensor,
    new_value: torch.Tensor,
    old_logp: torch.Tensor,
    old_value: torch.Tensor,
    adv: torch.Tensor,
    ret: torch.Tensor,
    clip_coef: float,
    clip_vloss: bool = True,
    weights: torch.Tensor | None = None,
) -> PPOTerms:
    """PPO loss terms of one minibatch (adv already normalized if norm_adv).

    old_logp is the behaviour log-prob (the mixture when the worker explored). With
    weights=None every term is a plain mean (identical to rlpipe.learner.ppo); with weights
    [B] each term is sum(w * term) / sum(w). Loss = pg_loss - ent_coef * entropy +
    vf_coef * v_loss. On float32 CPU rows the terms come from one native pass
    (rlpipe.learner.ppo_kernels.ppo_terms), the same formulas with sums in double."""
    native = ppo_terms(new_logp, entropy, new_value, old_logp, old_value, adv, ret, clip_coef, clip_vloss, weights)
    if native is not None:
        return PPOTerms(*native)
    logratio = new_logp - old_logp
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    pg = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip_coef, 1 + clip_coef))
    if clip_vloss:
        v_clipped = old_value + (new_value - old_value).clamp(-clip_coef, clip_coef)
        v = torch.max((new_value - ret) ** 2, (v_clipped - ret) ** 2)
    else:
        v = (new_value - ret) ** 2
    if weights is None:
        return PPOTerms(pg.mean(), 0.5 * v.mean(), entropy.mean(), approx_kl, clipfrac)
    w = weights.to(pg.dtype)
    wsum = w.sum().clamp_min(1e-12)
    return PPOTerms((w * pg).sum() / wsum, 0.5 * (w * v).sum() / wsum, (w * entropy).sum() / wsum, approx_kl, clipfrac)


def weighted_mean(x: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """A per-row term averaged as `weighted_ppo_terms` averages its terms: x.mean(), or
    sum(w * x) / sum(w) with weights (the per-type entropy bonus, rlpipe.learner.ppo)."""
    if weights is None:
        return x.mean()
    w = weights.to(x.dtype)
    return (w * x).sum() / w.sum().clamp_min(1e-12)
