"""Each type's log std moves, per sample of its own, as far as it would with the type alone.

The log std is a type's exploration schedule: one trained row per type (rlpipe.learner.policy).
Adam moves a row by about the learning rate every step it has a gradient, whatever the
gradient's size, so a row moves once per minibatch. Alone, a type's batch of N_t samples is
cut into ceil(N_t / B) minibatches; in a mix the whole batch of N is cut into ceil(N / B),
and every one of them holds some of the type's samples. Its row then takes ceil(N / B) /
ceil(N_t / B) times the steps per sample of its own, about 1 / (its share of the batch).

What that did (docs/multitask.md, "MountainCar's exploration in a mix"): MountainCarContinuous
beside Acrobot and the reacher (a share of 0.4) shrank its log std from 1.0 to 0.23 in its
first 100k steps, where alone it was still at 0.67, and ended at -1.49 against -0.19 alone. A
type that has not found its sparse reward by then (MountainCar's flag, found by a swing that
only wide noise makes) settles on not pushing at all.

So after each optimizer step a type's log std row keeps `pace_t` = ceil(N_t / B) / ceil(N / B)
of the step Adam took (Adam's moments are left as they are): per update, the same number of
steps' worth as alone. A type with no sample in the update keeps its log std where it is
(Adam's momentum alone would move it). Only the log std: the other per-type rows (the towers'
input and output layers) fit functions, where the extra steps of a mix did not hurt
(LunarLander learned more with them in the same page's ablation). A run of one type has pace 1
and is computed exactly as before.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class ExplorationPace:
    """The per-type fraction of each Adam step the log std keeps, for one update."""

    def __init__(
        self, log_std: nn.Parameter | None, type_counts: torch.Tensor, minibatch_size: int, n_minibatches: int
    ):
        """`type_counts`: samples of each type in the whole update's batch (every rank's);
        `n_minibatches`: the update's minibatches per epoch."""
        self.log_std = log_std
        pace = [math.ceil(float(c) / minibatch_size) / n_minibatches for c in type_counts.tolist()]
        self.active = log_std is not None and any(p != 1.0 for p in pace)
        if self.active:
            self.pace = torch.tensor(pace, dtype=log_std.dtype, device=log_std.device).reshape(-1, 1)
            self._before = torch.empty_like(log_std)

    def before_step(self) -> None:
        if self.active:
            self._before.copy_(self.log_std.detach())

    @torch.no_grad()
    def after_step(self) -> None:
        """log_std = before + pace * (after - before), row by row."""
        if self.active:
            step = self.log_std.sub_(self._before)
            step.mul_(self.pace).add_(self._before)
