"""The PPO update (clipped surrogate, clipped value loss, entropy bonus), after CleanRL's ppo.py,
for one policy over many env types:

- value targets: with value_norm=popart, each type's statistics move toward the batch's
  returns first (the critic's output layer rescaled so its return-space output is kept),
  then returns and the behaviour values are put in each type's normalized scale, so a
  +-100-reward type and a +1 type weigh alike in the value loss;
- advantages (computed in return space by GAE) are normalized per type over the whole
  batch (adv_norm=per_type), or per minibatch over all rows (batch, CleanRL's way);
- every sample is trained on each epoch: the batch is cut into ceil(n / minibatch_size)
  near-equal minibatches, none dropped;
- each sample's loss terms weighted by its env's stability weight when scaling is on;
- per-type settings (`per_type`, rlpipe/learner/type_settings.py): each row's entropy bonus
  is its type's ent_coef, each type's PopArt statistics move with its popart_beta (GAE's
  gamma and lambda were applied when the rollouts were finished); without them, or where
  every type has the same value, the learner's one value, computed as before;
- what is batch-wide goes through `sync`: `WholeBatch` (below) when this learner's batch is the
  whole update's; across torchrun ranks `rlpipe.ranks.sync.RankSync`, where PopArt and
  per-type advantage statistics come from all ranks' batches, every rank cuts its batch into
  the same number of minibatches (ceil(global batch / minibatch_size)), and after each
  backward pass the gradients are averaged over the ranks' samples before clipping and the
  optimizer step (DD-PPO), so every rank takes the same step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rlpipe.config import LearnerSpec
from rlpipe.learner.scaling import weighted_mean, weighted_ppo_terms
from rlpipe.learner.type_settings import TypeSettings


@dataclass
class UpdateStats:
    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    clipfrac: float
    total_loss: float
    samples: int


def concat_obs(blocks: list[dict], key: str) -> np.ndarray:
    """One obs key of the blocks as [samples, ...] rows. A block that stored the key for some
    of its envs only (SliceRollout's `key_rows`) gets zeros in the other envs' rows, which is
    what the board held there."""
    if not any(key in b.get("obs_rows", {}) for b in blocks):
        return np.concatenate([b["obs"][key] for b in blocks])
    first = blocks[0]["obs"][key]
    out = np.zeros((sum(len(b["adv"]) for b in blocks),) + first.shape[1:], dtype=first.dtype)
    at = 0
    for b in blocks:
        m, rows = len(b["adv"]), b.get("obs_rows", {}).get(key)
        if rows is None:
            out[at : at + m] = b["obs"][key]
        elif len(rows):
            n = b["n_envs"]  # block rows are t-major: transition t of env j is t * n + j
            out[at + (np.arange(m // n)[:, None] * n + rows[None, :]).reshape(-1)] = b["obs"][key]
        at += m
    return out


def concat_blocks(blocks: list[dict], types: list[np.ndarray], device) -> dict:
    def cat(key):
        return torch.from_numpy(np.concatenate([b[key] for b in blocks])).to(device)

    return {
        "obs": {k: torch.from_numpy(concat_obs(blocks, k)).to(device) for k in blocks[0]["obs"]},
        "types": torch.from_numpy(np.concatenate(types)).long().to(device),
        **{k: cat(k) for k in ("a_disc", "a_cont", "logp", "value", "adv", "ret")},
        **({"weight": cat("weight")} if "weight" in blocks[0] else {}),
    }


def normalize_per_type(adv: torch.Tensor, types: torch.Tensor, n_types: int) -> torch.Tensor:
    """(adv - mean_t) / (std_t + 1e-8) with each row's type t; a type with one sample in the
    batch keeps a zero advantage (no spread to scale by)."""
    count = torch.bincount(types, minlength=n_types).to(adv.dtype)
    mean = torch.zeros(n_types, dtype=adv.dtype, device=adv.device).index_add_(0, types, adv) / count.clamp_min(1)
    centered = adv - mean[types]
    var = torch.zeros(n_types, dtype=adv.dtype, device=adv.device).index_add_(0, types, centered**2) / (
        count - 1
    ).clamp_min(1)
    return centered / (var.sqrt()[types] + 1e-8)


def normalize_per_type_sums(
    adv: torch.Tensor, types: torch.Tensor, count: torch.Tensor, total: torch.Tensor, total_sq: torch.Tensor
) -> torch.Tensor:
    """`normalize_per_type` with each type's count, sum and sum of squares given (float64,
    summed over ranks): every rank normalizes by the statistics of the global batch."""
    mean = total / count.clamp_min(1)
    var = ((total_sq - count * mean**2) / (count - 1).clamp_min(1)).clamp_min(0.0)
    m, s = mean.to(adv.device)[types], var.sqrt().to(adv.device)[types]
    return ((adv.to(torch.float64) - m) / (s + 1e-8)).to(adv.dtype)


class WholeBatch:
    """The batch-wide steps of an update whose batch is this learner's alone (one process):
    statistics of the batch itself, each minibatch's gradients as computed. Its torchrun twin,
    with the same two methods, is `rlpipe.ranks.sync.RankSync`."""

    def batch_statistics(self, policy: nn.Module, batch: dict, cfg: LearnerSpec, beta) -> tuple[torch.Tensor, int]:
        """PopArt moved toward the batch's returns (with `beta`: the learner's popart_beta or one
        per type); the advantages to train on and the number of minibatches."""
        types, adv = batch["types"], batch["adv"]
        if cfg.value_norm == "popart":
            policy.popart.update(batch["ret"], types, beta, policy.critic.out)
        if cfg.adv_norm == "per_type":
            adv = normalize_per_type(adv, types, len(policy.popart.mu))
        return adv, max(math.ceil(len(adv) / cfg.minibatch_size), 1)

    def average_gradients(self, params: list[nn.Parameter], samples: int) -> bool:
        """Whether the optimizer steps on this minibatch's gradients."""
        return samples > 0


WHOLE_BATCH = WholeBatch()


def ppo_update(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: dict,
    cfg: LearnerSpec,
    generator: torch.Generator,
    sync=WHOLE_BATCH,
    per_type: TypeSettings | None = None,
) -> UpdateStats:
    types = batch["types"]
    n = len(batch["adv"])
    beta = cfg.popart_beta if per_type is None else per_type.popart_beta_by_type()
    ent_coef = cfg.ent_coef if per_type is None else per_type.ent_coef_rows(types)
    adv_all, n_minibatches = sync.batch_statistics(policy, batch, cfg, beta)
    ret = policy.popart.normalize(batch["ret"], types).float()
    old_value = policy.popart.normalize(batch["value"], types).float()
    rows = {
        "obs": batch["obs"],
        "types": types,
        "a_disc": batch["a_disc"],
        "a_cont": batch["a_cont"],
        "logp": batch["logp"],
        "old_value": old_value,
        "adv": adv_all,
        "ret": ret,
    }
    if "weight" in batch:
        rows["weight"] = batch["weight"]
    if isinstance(ent_coef, torch.Tensor):  # types differ: each row's own (shuffled with it)
        rows["ent_coef"] = ent_coef
    params = [p for p in policy.parameters()]
    terms_sum = torch.zeros(6, dtype=torch.float64)
    count = 0
    for _epoch in range(cfg.epochs):
        # One gather per field and epoch; minibatch i is then rows [a_i, b_i) of the shuffled
        # batch: the same samples in the same order as indexing with the permutation's i-th
        # part, without a gather per field and minibatch.
        perm = torch.randperm(n, generator=generator)
        shuffled = _take(rows, perm)
        start = 0
        for size in _split_sizes(n, n_minibatches):
            if size == 0:
                # no sample here in this minibatch (a rank still joins the gradient all-reduce)
                optimizer.zero_grad(set_to_none=True)
                if sync.average_gradients(params, 0):
                    nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                    optimizer.step()
                continue
            mb = _rows(shuffled, start, start + size)
            start += size
            logp, entropy, value = policy.evaluate(mb["obs"], mb["types"], mb["a_disc"], mb["a_cont"])
            adv = mb["adv"]
            if cfg.adv_norm == "batch" and len(adv) > 1:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            terms = weighted_ppo_terms(
                logp,
                entropy,
                value,
                mb["logp"],
                mb["old_value"],
                adv,
                mb["ret"],
                cfg.clip_coef,
                cfg.clip_vloss,
                mb.get("weight"),
            )
            if "ent_coef" in mb:
                bonus = weighted_mean(mb["ent_coef"].to(entropy.dtype) * entropy, mb.get("weight"))
            else:
                bonus = ent_coef * terms.entropy
            loss = terms.pg_loss - bonus + cfg.vf_coef * terms.v_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if sync.average_gradients(params, size):
                nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                optimizer.step()
            # summed as tensors: one host read at the end instead of six per minibatch
            terms_sum += (
                torch.stack([terms.pg_loss, terms.v_loss, terms.entropy, terms.approx_kl, terms.clipfrac, loss])
                .detach()
                .to(torch.float64)
            )
            count += 1
    means = (terms_sum / max(count, 1)).tolist()
    return UpdateStats(*means, samples=n)


def _split_sizes(n: int, parts: int) -> list[int]:
    """Sizes of torch.tensor_split(x, parts) for len(x) == n: the first n % parts are one longer."""
    base, extra = divmod(n, parts)
    return [base + 1] * extra + [base] * (parts - extra)


def _take(rows: dict, idx: torch.Tensor) -> dict:
    return {k: _take(v, idx) if isinstance(v, dict) else v[idx] for k, v in rows.items()}


def _rows(rows: dict, a: int, b: int) -> dict:
    return {k: _rows(v, a, b) if isinstance(v, dict) else v[a:b] for k, v in rows.items()}
