"""The run's untrained policy, handed to the random-return probe (rlpipe/envs/random_return.py)
and played there to whole episodes of each type: the "own start" of the learned verdicts."""

from __future__ import annotations

import io
from dataclasses import dataclass

import torch

from rlpipe.envs.registry import make_factory
from rlpipe.learner import play
from rlpipe.learner.policy import Policy

STARVED_STEP_S = 60.0  # a step longer than this is a hang (the probe runs at nice 10; see play)
LOCKSTEP = 25  # the envs of a type built at once (a reacher client holds 16 arms, ~30 MB)


@dataclass
class InitialPolicy:
    """The untrained policy for the probe child: its weights (`torch.save` bytes, so nothing
    shares tensor memory with the learner) and what rebuilds the network around them."""

    plan: object  # rlpipe.envs.registry.MixPlan
    hidden: tuple
    cnn_channels: tuple
    cnn_out: int
    weights: bytes
    episodes: int  # per type (logging.initial_policy_episodes)
    max_steps: int  # an episode still running after this many steps is cut (eval.max_steps)
    step_timeout_s: float | None  # the workers' hang deadline (worker.step_timeout_s)

    @classmethod
    def of(cls, learner, spec) -> InitialPolicy:
        buf = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in learner.actor.state_dict().items()}, buf)
        lc = spec.learner
        return cls(
            learner.plan,
            tuple(lc.hidden),
            tuple(lc.cnn_channels),
            lc.cnn_out,
            buf.getvalue(),
            spec.logging.initial_policy_episodes,
            spec.eval.max_steps,
            spec.worker.step_timeout_s,
        )

    def build(self) -> Policy:
        torch.set_num_threads(1)
        plan = self.plan
        policy = Policy(plan, plan.obs_keys, list(self.hidden), list(self.cnn_channels), self.cnn_out)
        policy.load_state_dict(torch.load(io.BytesIO(self.weights), map_location="cpu", weights_only=True))
        return policy.eval()

    def play(self, policy, name: str, node: dict, seed: int) -> dict:
        """{"mean", "std", "episodes", "cut", ...} of `self.episodes` episodes of one type,
        `LOCKSTEP` at a time (that many envs of the type built at once), actions sampled as in
        training; an episode cut by a fault, a hang or `max_steps` is not averaged.

        No wall-clock budget: at nice 10 beside a run that keeps both cores busy this child
        gets a few % of a core, and a budget would cut the long episodes and keep the short
        ones, the very bias this reference is here to avoid. The work is bounded by
        `episodes` x `max_steps` instead, and a step counts as hung only past
        `STARVED_STEP_S` of wall clock (a starved 10 ms step can take seconds)."""
        t = self.plan.names.index(name)
        timeout = max(self.step_timeout_s or 0.0, STARVED_STEP_S)
        factory = make_factory(node)
        out = play.Episodes()
        for first in range(0, self.episodes, LOCKSTEP):
            n = min(LOCKSTEP, self.episodes - first)
            part = play.play(policy, self.plan, t, factory, n, False, seed + first, self.max_steps, timeout)
            out.returns += part.returns
            out.lengths += part.lengths
            out.cut += part.cut
        return out.stats()
