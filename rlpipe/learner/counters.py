"""What the learner counts over a run: env steps, updates, episodes and returns per type, the
loss history; checkpointed with the learner and read by the run's metrics."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from rlpipe.bounded import Thinned

# Episodes per type behind the "first 100" window the learned verdicts compare with.
FIRST_EPISODES = 100
LOSS_HISTORY_POINTS = 4096  # (time, loss) samples kept over the whole run for the late-loss std


@dataclass
class Counters:
    env_steps: int = 0
    updates: int = 0
    episodes: int = 0
    torn_retries: int = 0
    dropped_rollouts: int = 0  # env-rollouts discarded under learner.backlog=drop
    trained_samples: int = 0  # transitions that went into PPO updates (each once)
    first_step_at: float | None = None
    returns: dict = field(default_factory=dict)  # type name -> deque of last 100 returns
    first_returns: dict = field(default_factory=dict)  # type name -> its first 100 returns of this run
    episodes_by_type: dict = field(default_factory=dict)
    # (time, total loss) of the updates, thinned evenly over the run so six days of updates
    # stay a few thousand entries (summary.json's loss_std of the second half)
    losses: Thinned = field(default_factory=lambda: Thinned(LOSS_HISTORY_POINTS))
    recent_losses: collections.deque = field(default_factory=collections.deque)  # the last loss_std_window
