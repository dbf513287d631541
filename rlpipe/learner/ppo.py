"""The PPO update (clipped surrogate, clipped value loss, entropy bonus), after CleanRL's ppo.py;
each sample's loss terms weighted by its env's stability weight when scaling is on."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rlpipe.config import LearnerSpec
from rlpipe.learner.scaling import weighted_ppo_terms


@dataclass
class UpdateStats:
    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    clipfrac: float
    total_loss: float
    samples: int


def concat_blocks(blocks: list[dict], types: list[np.ndarray], device) -> dict:
    def cat(key):
        return torch.from_numpy(np.concatenate([b[key] for b in blocks])).to(device)
    return {
        "obs": {k: torch.from_numpy(np.concatenate([b["obs"][k] for b in blocks])).to(device)
                for k in blocks[0]["obs"]},
        "types": torch.from_numpy(np.concatenate(types)).long().to(device),
        **{k: cat(k) for k in ("a_disc", "a_cont", "logp", "value", "adv", "ret")},
        **({"weight": cat("weight")} if "weight" in blocks[0] else {}),
    }


def ppo_update(policy: nn.Module, optimizer: torch.optim.Optimizer, batch: dict,
               cfg: LearnerSpec, generator: torch.Generator) -> UpdateStats:
    n = len(batch["adv"])
    mb = min(cfg.minibatch_size, n)
    sums = np.zeros(6)
    count = 0
    for _epoch in range(cfg.epochs):
        perm = torch.randperm(n, generator=generator)
        for start in range(0, n - mb + 1, mb):
            idx = perm[start:start + mb]
            obs = {k: v[idx] for k, v in batch["obs"].items()}
            logp, entropy, value = policy.evaluate(obs, batch["types"][idx], batch["a_disc"][idx],
                                                   batch["a_cont"][idx])
            adv = batch["adv"][idx]
            if cfg.norm_adv and len(adv) > 1:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            weights = batch["weight"][idx] if "weight" in batch else None
            terms = weighted_ppo_terms(logp, entropy, value, batch["logp"][idx], batch["value"][idx],
                                       adv, batch["ret"][idx], cfg.clip_coef, cfg.clip_vloss, weights)
            pg_loss, v_loss, ent = terms.pg_loss, terms.v_loss, terms.entropy
            approx_kl, clipfrac = terms.approx_kl, terms.clipfrac
            loss = pg_loss - cfg.ent_coef * ent + cfg.vf_coef * v_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
            optimizer.step()
            sums += [pg_loss.item(), v_loss.item(), ent.item(), approx_kl.item(),
                     clipfrac.item(), loss.item()]
            count += 1
    means = sums / max(count, 1)
    return UpdateStats(*means.tolist(), samples=n)
