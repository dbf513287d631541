"""The learner's settings per env type: each env node's `learner:` overrides over the learner's
own values (the keys of rlpipe.config.TYPE_LEARNER_KEYS), one value per type index.

Rows carry their type index, so every use is a lookup by type, vectorized as the policy is:
GAE's gamma and lambda per env column of the rollout arrays (rollout_store.py), the entropy bonus per
row of a minibatch, PopArt's step size and the advantages' std floor per type (ppo.py,
popart.py); the Gaussian head's initial log std is each type's row of the policy's log-std
parameter and the value output's init gain scales each type's row of the critic's output
layer (policy.py), both read once when the policy is built. Where the rows at hand all share
a value (no type overrides it, or all set the same) it is handed on as one Python
float, the form the learner used before per-type settings: such a run computes what it did,
bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rlpipe.config import TYPE_LEARNER_KEYS, EnvTypeSpec, LearnerSpec


@dataclass(frozen=True)
class TypeSettings:
    gamma: np.ndarray  # float64 [n_types], indexed by type index (MixPlan.names order)
    gae_lambda: np.ndarray
    ent_coef: np.ndarray
    popart_beta: np.ndarray
    log_std_init: np.ndarray  # the policy's starting log std per type (a discrete type's is unused)
    value_init_std: np.ndarray  # the init gain of each type's row of the critic's output layer
    adv_std_floor: np.ndarray  # the least std each type's advantages are divided by (per_type adv norm)

    @classmethod
    def of(cls, cfg: LearnerSpec, env_types: tuple[EnvTypeSpec, ...]) -> "TypeSettings":
        """The types' values in `env_types` order (the plan's type indices); with
        `learner.type_settings=shared` every type's are the learner's."""
        own = [t.learner if cfg.type_settings == "per_type" else {} for t in env_types]
        return cls(**{key: np.array([float(o.get(key, getattr(cfg, key))) for o in own]) for key in TYPE_LEARNER_KEYS})

    @staticmethod
    def _one(values: np.ndarray) -> float | None:
        return float(values[0]) if bool((values == values[0]).all()) else None

    def gae(self, types: np.ndarray) -> tuple[float | np.ndarray, float | np.ndarray]:
        """(gamma, lambda) of the env columns of a slice with these types: floats where the
        slice's types share them, else [n] float64 arrays (SliceRollout takes both)."""
        gamma, lam = self.gamma[types], self.gae_lambda[types]
        one_gamma, one_lam = self._one(gamma), self._one(lam)
        if one_gamma is not None and one_lam is not None:
            return one_gamma, one_lam
        return gamma, lam

    def ent_coef_rows(self, types: torch.Tensor) -> float | torch.Tensor:
        """The entropy bonus's weight: one float when every type has the same, else per row."""
        one = self._one(self.ent_coef)
        if one is not None:
            return one
        return torch.from_numpy(self.ent_coef).to(types.device)[types]

    def adv_std_floor_by_type(self) -> torch.Tensor | None:
        """The per-type advantage normalization's floors ([n_types] float64), None where no
        type has one: the normalization divides by the std alone, as before floors."""
        return torch.from_numpy(self.adv_std_floor.copy()) if bool((self.adv_std_floor > 0).any()) else None

    def popart_beta_by_type(self) -> float | torch.Tensor:
        """PopArt's per-sample step size: one float when every type has the same, else a
        float64 [n_types] tensor."""
        one = self._one(self.popart_beta)
        return one if one is not None else torch.from_numpy(self.popart_beta.copy())
