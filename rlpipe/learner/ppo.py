"""The PPO update (clipped surrogate, clipped value loss, entropy bonus), after CleanRL's ppo.py,
for one policy over many env types:

- value targets: with value_norm=popart, each type's statistics move toward the batch's
  returns first (the critic's output layer rescaled so its return-space output is kept),
  then returns and the behaviour values are put in each type's normalized scale, so a
  +-100-reward type and a +1 type weigh alike in the value loss;
- advantages (computed in return space by GAE) are normalized per type over the whole
  batch (adv_norm=per_type), or per minibatch over all rows (batch, CleanRL's way);
- every sample is trained on each epoch: the batch is cut into ceil(n / minibatch_size)
  near-equal minibatches, none dropped; an obs key that some types lack holds rows for the
  other samples only (`concat_blocks`' `obs_present`), and stays so through the shuffles, and
  rgb is converted for the CNN once an update (Policy.prepared_obs), not once a minibatch;
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
  optimizer step (DD-PPO), so every rank takes the same step;
- each type's log std keeps, of every optimizer step, the share that gives it as many steps
  per sample of its own as it takes alone (rlpipe/learner/exploration_pace.py).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rlpipe.config import LearnerSpec
from rlpipe.learner.adam import FusedAdam, clip_grad_norm
from rlpipe.learner.exploration_pace import ExplorationPace
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


def concat_obs(blocks: list[dict], key: str) -> tuple[np.ndarray, np.ndarray | None]:
    """One obs key of the blocks as rows, and which samples they belong to (a bool per sample;
    None: every sample has its row). A block that stored the key for some of its envs only
    (SliceRollout's `key_rows`: the envs whose type produces it) adds those envs' rows alone;
    the other samples' rows are zeros on the board, which the policy masks (Policy.features),
    so they are not made here, nor gathered in every epoch of the update."""
    rows = np.concatenate([b["obs"][key] for b in blocks])
    if not any(key in b.get("obs_rows", {}) for b in blocks):
        return rows, None
    present = []
    for b in blocks:
        m, stored = len(b["adv"]), b.get("obs_rows", {}).get(key)
        if stored is None:
            present.append(np.ones(m, dtype=bool))
        else:
            n = b["n_envs"]  # block rows are t-major: transition t of env j is t * n + j
            has = np.zeros((m // n, n), dtype=bool)
            has[:, stored] = True  # `stored` ascends: the block's rows are in sample order
            present.append(has.reshape(-1))
    return rows, np.concatenate(present)


def concat_blocks(blocks: list[dict], types: list[np.ndarray], device) -> dict:
    """The blocks as one batch. `obs_present`: for each obs key stored for some samples only,
    a bool per sample; `obs[key]` then holds those samples' rows, in sample order."""

    def cat(key):
        return torch.from_numpy(np.concatenate([b[key] for b in blocks])).to(device)

    obs, present = {}, {}
    for key in blocks[0]["obs"]:
        rows, has = concat_obs(blocks, key)
        obs[key] = torch.from_numpy(rows).to(device)
        if has is not None:
            present[key] = torch.from_numpy(has).to(device)
    return {
        "obs": obs,
        "obs_present": present,
        "types": torch.from_numpy(np.concatenate(types)).long().to(device),
        **{k: cat(k) for k in ("a_disc", "a_cont", "logp", "value", "adv", "ret")},
        **({"weight": cat("weight")} if "weight" in blocks[0] else {}),
    }


def _divisor(std: torch.Tensor, floor: torch.Tensor | None) -> torch.Tensor:
    """Each type's std, or its floor where that is larger (learner.adv_std_floor)."""
    return std if floor is None else torch.maximum(std, floor.to(std.device, std.dtype))


def normalize_per_type(
    adv: torch.Tensor, types: torch.Tensor, n_types: int, floor: torch.Tensor | None = None
) -> torch.Tensor:
    """(adv - mean_t) / (max(std_t, floor_t) + 1e-8) with each row's type t (no floor: the
    std alone); a type with one sample in the batch keeps a zero advantage (no spread to
    scale by)."""
    count = torch.bincount(types, minlength=n_types).to(adv.dtype)
    mean = torch.zeros(n_types, dtype=adv.dtype, device=adv.device).index_add_(0, types, adv) / count.clamp_min(1)
    centered = adv - mean[types]
    var = torch.zeros(n_types, dtype=adv.dtype, device=adv.device).index_add_(0, types, centered**2) / (
        count - 1
    ).clamp_min(1)
    return centered / (_divisor(var.sqrt(), floor)[types] + 1e-8)


def normalize_per_type_sums(
    adv: torch.Tensor,
    types: torch.Tensor,
    count: torch.Tensor,
    total: torch.Tensor,
    total_sq: torch.Tensor,
    floor: torch.Tensor | None = None,
) -> torch.Tensor:
    """`normalize_per_type` with each type's count, sum and sum of squares given (float64,
    summed over ranks): every rank normalizes by the statistics of the global batch."""
    mean = total / count.clamp_min(1)
    var = ((total_sq - count * mean**2) / (count - 1).clamp_min(1)).clamp_min(0.0)
    m, s = mean.to(adv.device)[types], _divisor(var.sqrt(), floor).to(adv.device)[types]
    return ((adv.to(torch.float64) - m) / (s + 1e-8)).to(adv.dtype)


class WholeBatch:
    """The batch-wide steps of an update whose batch is this learner's alone (one process):
    statistics of the batch itself, each minibatch's gradients as computed. Its torchrun twin,
    with the same two methods, is `rlpipe.ranks.sync.RankSync`."""

    def batch_statistics(
        self, policy: nn.Module, batch: dict, cfg: LearnerSpec, beta, adv_floor: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, int, torch.Tensor]:
        """PopArt moved toward the batch's returns (with `beta`: the learner's popart_beta or one
        per type); the advantages to train on (per type, divided by no less than `adv_floor`),
        the number of minibatches and each type's sample count."""
        types, adv = batch["types"], batch["adv"]
        if cfg.value_norm == "popart":
            policy.popart.update(batch["ret"], types, beta, policy.critic.out)
        if cfg.adv_norm == "per_type":
            adv = normalize_per_type(adv, types, len(policy.popart.mu), adv_floor)
        counts = torch.bincount(types.cpu(), minlength=len(policy.popart.mu))
        return adv, max(math.ceil(len(adv) / cfg.minibatch_size), 1), counts

    def average_gradients(self, params: list[nn.Parameter], samples: int) -> bool:
        """Whether the optimizer steps on this minibatch's gradients."""
        return samples > 0


WHOLE_BATCH = WholeBatch()


def ppo_update(
    policy: nn.Module,
    optimizer: FusedAdam,
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
    adv_floor = None if per_type is None else per_type.adv_std_floor_by_type()
    adv_all, n_minibatches, type_counts = sync.batch_statistics(policy, batch, cfg, beta, adv_floor)
    log_std = policy.log_std if policy.actor_cont is not None else None
    pace = ExplorationPace(log_std, type_counts, cfg.minibatch_size, n_minibatches)
    ret = policy.popart.normalize(batch["ret"], types).float()
    old_value = policy.popart.normalize(batch["value"], types).float()
    present = batch.get("obs_present", {})
    obs = policy.prepared_obs(batch["obs"])
    compact = CompactKeys(obs, present)
    rows = {
        "obs": {k: v for k, v in obs.items() if k not in present},
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
    terms_sum = torch.zeros(6, dtype=torch.float64, device=adv_all.device)
    count = 0
    for _epoch in range(cfg.epochs):
        # One gather per field and epoch; minibatch i is then rows [a_i, b_i) of the shuffled
        # batch: the same samples in the same order as indexing with the permutation's i-th
        # part, without a gather per field and minibatch.
        perm = torch.randperm(n, generator=generator).to(adv_all.device)  # the CPU stream, as before
        shuffled = _take(rows, perm)
        sizes = _split_sizes(n, n_minibatches)
        compact.shuffle(perm, sizes)
        start = 0
        for i, size in enumerate(sizes):
            if size == 0:
                # no sample here in this minibatch (a rank still joins the gradient all-reduce)
                optimizer.zero_grad(set_to_none=True)
                if sync.average_gradients(params, 0):
                    clip_grad_norm(params, cfg.max_grad_norm)
                    pace.before_step()
                    optimizer.step()
                    pace.after_step()
                continue
            mb = _rows(shuffled, start, start + size)
            mb["obs"].update(compact.minibatch(i))
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
                clip_grad_norm(params, cfg.max_grad_norm)
                pace.before_step()
                optimizer.step()
                pace.after_step()
            # summed as tensors: one host read at the end instead of six per minibatch
            terms_sum += (
                torch.stack([terms.pg_loss, terms.v_loss, terms.entropy, terms.approx_kl, terms.clipfrac, loss])
                .detach()
                .to(torch.float64)
            )
            count += 1
    means = (terms_sum / max(count, 1)).tolist()
    return UpdateStats(*means, samples=n)


class CompactKeys:
    """The obs keys a batch holds for some samples only (concat_blocks' `obs_present`), cut
    into an epoch's minibatches: a minibatch gets the rows of its samples that have one, in
    the minibatch's sample order (what Policy.features takes), gathered once an epoch from
    those rows alone (rgb: only their indices, `ImageRows`; the CNN's input copies the pixels)."""

    def __init__(self, obs: dict[str, torch.Tensor], present: dict[str, torch.Tensor]):
        self.obs = {k: obs[k] for k in present}
        # each sample's row in obs[k]; -1: the sample has none
        self.index = {k: torch.where(has, torch.cumsum(has, 0) - 1, -1) for k, has in present.items()}
        self.rows: dict[str, torch.Tensor] = {}
        self.bounds: dict[str, list[int]] = {}

    def shuffle(self, perm: torch.Tensor, sizes: list[int]) -> None:
        """The epoch's order (`perm`, cut into minibatches of `sizes`)."""
        cuts = torch.tensor([0, *itertools.accumulate(sizes)])
        for k, index in self.index.items():
            at = index[perm]
            keep = at >= 0
            self.rows[k] = self.obs[k][at[keep]]
            self.bounds[k] = torch.cat([keep.new_zeros(1, dtype=torch.int64), keep.cumsum(0)])[cuts].tolist()

    def minibatch(self, i: int) -> dict[str, torch.Tensor]:
        return {k: rows[self.bounds[k][i] : self.bounds[k][i + 1]] for k, rows in self.rows.items()}


def _split_sizes(n: int, parts: int) -> list[int]:
    """Sizes of torch.tensor_split(x, parts) for len(x) == n: the first n % parts are one longer."""
    base, extra = divmod(n, parts)
    return [base + 1] * extra + [base] * (parts - extra)


def _take(rows: dict, idx: torch.Tensor) -> dict:
    """Every field's rows in `idx`'s order. index_select copies whole rows where `v[idx]`
    (advanced indexing) computes every element's offset: the same values, a fifth of the time
    for the day4 board's [8960, 32] obs (docs/benchmarks.md, "The update process's heap, and
    the shuffle's gather")."""
    return {k: _take(v, idx) if isinstance(v, dict) else v.index_select(0, idx) for k, v in rows.items()}


def _rows(rows: dict, a: int, b: int) -> dict:
    return {k: _rows(v, a, b) if isinstance(v, dict) else v[a:b] for k, v in rows.items()}
