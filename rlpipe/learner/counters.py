"""What the learner counts over a run: env steps, updates, episodes and returns per type, the
loss history; checkpointed with the learner and read by the run's metrics."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from rlpipe.bounded import ThinnedPairs

# Episodes per type behind the "first 100" window the learned verdicts compare with.
FIRST_EPISODES = 100
LOSS_HISTORY_POINTS = 4096  # (time, loss) samples kept over the whole run for the late-loss std


@dataclass
class Counters:
    env_steps: int = 0
    updates: int = 0
    episodes: int = 0
    torn_retries: int = 0
    rounds: int = 0  # inference rounds served
    rows_served: int = 0  # the rows (envs) of those rounds
    dropped_rollouts: int = 0  # env-rollouts discarded under learner.backlog=drop
    trained_samples: int = 0  # transitions that went into PPO updates (each once)
    first_step_at: float | None = None
    returns: dict = field(default_factory=dict)  # type name -> deque of last 100 returns
    first_returns: dict = field(default_factory=dict)  # type name -> its first 100 returns of this run
    episodes_by_type: dict = field(default_factory=dict)
    # (time, total loss) of the updates, thinned evenly over the run so six days of updates
    # stay a few thousand entries (summary.json's loss_std of the second half)
    losses: ThinnedPairs = field(default_factory=lambda: ThinnedPairs(LOSS_HISTORY_POINTS))
    recent_losses: collections.deque = field(default_factory=collections.deque)  # the last loss_std_window


def history(c: Counters) -> dict:
    """What a checkpoint carries of the run's history, so that a resumed run reports as one
    uninterrupted run would: each type's last-100 and first-100 returns and episode count
    (`mean_return_last100`, `mean_return_first100`, the `learned` verdicts) and the loss
    window of the loss-std marks. Plain lists and numbers: torch.load(weights_only=True) reads
    them. (The late-loss samples are not carried: their times are the dead process's clock.)"""
    return {
        "returns": {name: list(window) for name, window in c.returns.items()},
        "first_returns": {name: list(first) for name, first in c.first_returns.items()},
        "episodes_by_type": dict(c.episodes_by_type),
        "recent_losses": list(c.recent_losses),
    }


def restore_history(c: Counters, saved: dict) -> None:
    """The history of a checkpoint back into fresh counters, for the types this run has (a
    checkpoint from before the history was carried has none: nothing is restored)."""
    for name, values in saved.get("returns", {}).items():
        if name in c.returns:
            c.returns[name].extend(float(v) for v in values)
    for name, values in saved.get("first_returns", {}).items():
        if name in c.first_returns:
            c.first_returns[name][:] = [float(v) for v in values][:FIRST_EPISODES]
    for name, count in saved.get("episodes_by_type", {}).items():
        if name in c.episodes_by_type:
            c.episodes_by_type[name] = int(count)
    c.recent_losses.extend(float(v) for v in saved.get("recent_losses", []))
