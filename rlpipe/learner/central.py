"""Central inference and training: the actions of each round of ready slices, the rollouts
they make, and PPO on what is ready.

A round comes from the slice engine as arrays (rlpipe.protocol.Round: rows, obs, step results,
restarts as seq 0): `act` picks the actions the engine sends, `observe` books what the round
reported while the workers step. The learner never sees a worker or its shared memory, and
never waits for a particular worker: it serves whichever slices have rung, and a PPO update
starts once `update_envs` env-rollouts' worth of samples (update_envs x rollout_len) is
ready, wherever it came from.

Serving, the rollout queue, the update thread and the checkpointed state share the same few
fields (the ready queue, the actor/policy pair, the counters and RNG streams): the update
thread's side is `training.BackgroundTraining`, mixed in. The pieces that need none of them
live beside it: acting (the policy or random actions on a round), rollout_store (the rollouts
and GAE), ppo, policy, popart, checkpoint, counters, latency.
"""

from __future__ import annotations

import collections
import copy
import time

import numpy as np
import torch

from rlpipe.config import RunSpec
from rlpipe.envs.registry import MixPlan
from rlpipe.learner.acting import Acted, policy_actions, random_actions, truncation_values
from rlpipe.learner.adam import FusedAdam
from rlpipe.learner.checkpoint import rng_state, set_rng_state
from rlpipe.learner.counters import FIRST_EPISODES, Counters, history, restore_history
from rlpipe.learner.device import pick_device
from rlpipe.learner.gpu_overlap import HostStaging, UpdateStream
from rlpipe.learner.latency import StepLatencies
from rlpipe.learner.policy import Policy
from rlpipe.learner.ppo import UpdateStats
from rlpipe.learner.rollout_store import RolloutStore
from rlpipe.learner.scaling import score_to_epsilon, score_to_weight
from rlpipe.learner.training import BackgroundTraining
from rlpipe.learner.type_settings import TypeSettings
from rlpipe.learner.update_process import UpdateProcess, updates_in_process
from rlpipe.protocol import Round, slot_count

# Bumped when the policy's parameters change shape or meaning: older checkpoints are refused.
POLICY_LAYOUT = "typed-towers-popart-1"
RESUMED_COUNTERS = ("env_steps", "updates", "episodes", "trained_samples")  # carried by a checkpoint


class CentralLearner(BackgroundTraining):
    def __init__(self, spec: RunSpec, plan: MixPlan):
        self.spec = spec
        self.cfg = spec.learner
        self.plan = plan
        self.device = pick_device(self.cfg.device)
        torch.manual_seed(spec.run.seed)
        self.generator = torch.Generator().manual_seed(spec.run.seed)
        # each type's own gamma, lambda, entropy bonus and the rest (env nodes' `learner:`)
        self.type_settings = TypeSettings.of(self.cfg, spec.env_types)
        self.policy = Policy(
            plan,
            plan.obs_keys,
            self.cfg.hidden,
            self.cfg.cnn_channels,
            self.cfg.cnn_out,
            log_std_init=self.type_settings.log_std_init,
            value_init_std=self.type_settings.value_init_std,
        ).to(self.device)
        self._optimizer: FusedAdam | None = None
        # PPO updates run in a process or thread of their own on `policy` while `actor`, a
        # copy refreshed after every update, keeps serving: inference never waits for training.
        self.actor = copy.deepcopy(self.policy)
        self._actor_pairs = None  # (actor tensors, policy tensors) in one order, for _refresh_actor
        self._update_job = None  # the update in flight: a thread, or an update_process.RemoteUpdate
        self._update_result = None
        # on cuda: the update's kernels on a stream of their own, a round's copies through
        # pinned buffers (rlpipe/learner/gpu_overlap.py); elsewhere both as plain as before
        self.update_stream = UpdateStream(self.device)
        self.staging = HostStaging(self.device)
        self.update_process = (
            UpdateProcess(self.policy, self.cfg, self.type_settings, spec.learner_cpu)
            if updates_in_process(self.cfg, self.device)
            else None
        )
        self.random = self.cfg.mode == "random"
        self.scaling = spec.scaling
        # every env's rollout in (time x env) arrays, per slot its block's progress (none under
        # random actions: nothing trains)
        self.rollouts = (
            None
            if self.random
            else RolloutStore(
                plan,
                self.cfg.rollout_len,
                slot_count(spec.env_count, spec.groups.size, spec.worker.slices),
                self.type_settings.gamma,
                self.type_settings.gae_lambda,
                weighted=self.scaling.enabled,
            )
        )
        self._acted: Acted | None = None  # the round between act and observe
        self.ready_blocks: list[dict] = []
        self.ready_types: list[np.ndarray] = []
        self.ready_samples = 0  # transitions in ready_blocks
        self.update_samples = min(self.cfg.update_envs, spec.env_count) * self.cfg.rollout_len
        self.counters = Counters(
            returns={n: collections.deque(maxlen=100) for n in plan.names},
            first_returns={n: [] for n in plan.names},
            episodes_by_type={n: 0 for n in plan.names},
            recent_losses=collections.deque(maxlen=self.cfg.loss_std_window),
        )
        self.last_stats: UpdateStats | None = None
        self.recent_returns: dict[str, list[float]] = {n: [] for n in plan.names}
        self.step_ms = StepLatencies(plan.names)  # env step() latencies since the last chart
        # Exploration alternatives get their own stream: the policy's samples stay reproducible.
        self.explore_gen = torch.Generator(device=self.device).manual_seed(spec.run.seed + 1)
        self.scores = np.ones(spec.env_count, dtype=np.float32)  # latest stability score per env
        self.rng = np.random.default_rng(spec.run.seed)
        self.disc_counts = np.array(
            [s.action_n if s.action_kind != "continuous" else 1 for s in plan.specs], dtype=np.int64
        )

    # -- serving ----------------------------------------------------------------------------
    def act(self, rnd: Round) -> dict:
        """The actions of one round (an rlpipe.protocol.Round, made by the slot table's `recv`,
        which refuses a slice served twice): the fields the engine scatters to the ready
        slices. Called before the slices are rung; `observe` does the book-keeping after,
        while the workers step."""
        if self.random:
            acted = random_actions(self.rng, self.disc_counts, rnd.types, self.plan.actions.cont_dim)
        else:
            acted = policy_actions(
                self.actor,
                rnd.obs,
                rnd.types,
                self.staging,
                self.explore_gen,
                self.plan.actions.cont_dim,
                self.scaling.enabled,
            )
        self._acted = acted
        return acted.send

    def observe(self, rnd: Round) -> None:
        """What the round's slices reported and the policy did, into the counters, the
        episode windows and the rollouts: vector ops over its rows, whatever their slices."""
        acted, self._acted = self._acted, None
        self.counters.torn_retries += rnd.torn_retries
        self.counters.rounds += 1
        self.counters.rows_served += len(rnd.rows)
        stepped = rnd.stepped
        if stepped.any():
            res = rnd.results
            self._episodes(rnd)
            self.step_ms.add(rnd.types[stepped], res["step_ms"][stepped])
            self.counters.env_steps += int(stepped.sum())
            if self.counters.first_step_at is None:
                self.counters.first_step_at = time.monotonic()
        if self.random:
            return
        behaviour = None
        if self.scaling.enabled:
            score = rnd.results["score"]
            self.scores[rnd.rows[stepped]] = score[stepped]
            res = rnd.results
            weight = score_to_weight(score, self.scaling.min_weight)
            behaviour = (res["exec_discrete"], res["exec_continuous"], res["behaviour_logp"], weight)
        final_value = truncation_values(self.actor, self.staging, rnd)
        for block, types in self.rollouts.observe(
            rnd, rnd.slots, acted.a_disc, acted.a_cont, acted.logp, acted.value, final_value, behaviour
        ):
            self.ready_blocks.append(block)
            self.ready_types.append(types)
            self.ready_samples += len(types)

    def latency_percentiles(self) -> dict[str, tuple[float, float]]:
        """(p50, p99) of each type's step latency since the last call, in ms."""
        return self.step_ms.percentiles()

    def _episodes(self, rnd: Round) -> None:
        """The episodes that ended this round, into each type's windows: one extend per type
        (a round of short episodes ends hundreds), each type's in row order."""
        done = np.flatnonzero((rnd.results["ep_len"] > 0) & rnd.stepped)
        if not len(done):
            return
        rets, types = rnd.results["ep_return"][done], rnd.types[done]
        order = np.argsort(types, kind="stable")
        cuts = np.flatnonzero(np.diff(types[order])) + 1
        c = self.counters
        for part in np.split(order, cuts):
            name = self.plan.names[types[part[0]]]
            values = rets[part].tolist()
            c.returns[name].extend(values)
            c.episodes_by_type[name] += len(values)
            first = c.first_returns[name]
            if len(first) < FIRST_EPISODES:
                first.extend(values[: FIRST_EPISODES - len(first)])
            self.recent_returns[name].extend(values)
        c.episodes += len(done)

    @property
    def learning_rate(self) -> float:
        if self.update_process is not None:
            return self.update_process.lr
        return self.optimizer.param_groups[0]["lr"] if self._optimizer else self.cfg.learning_rate

    def epsilons(self, env_lo: int, env_hi: int) -> np.ndarray:
        """Exploration rates of envs [env_lo, env_hi) from their latest stability scores."""
        return score_to_epsilon(self.scores[env_lo:env_hi], self.scaling.eps_max, self.scaling.eps_min)

    def weights(self) -> np.ndarray:
        return score_to_weight(self.scores, self.scaling.min_weight)

    def weights_by_type(self) -> dict[str, float]:
        w = score_to_weight(self.scores, self.scaling.min_weight)
        return {name: float(w[self.plan.env_type == t].mean()) for t, name in enumerate(self.plan.names)}

    # -- checkpoints -------------------------------------------------------------------------
    def compat(self) -> dict:
        """What a checkpoint must match to be resumed by this run."""
        return {
            "obs_keys": [[k.name, list(k.shape), k.dtype] for k in self.plan.obs_keys],
            "types": list(self.plan.names),
            "discrete_n": self.plan.actions.discrete_n,
            "cont_dim": self.plan.actions.cont_dim,
            "hidden": list(self.cfg.hidden),
            "policy": POLICY_LAYOUT,
            "value_norm": self.cfg.value_norm,
            "cnn": [*self.cfg.cnn_channels, self.cfg.cnn_out],
            "env_count": self.spec.env_count,
        }

    def check_compatible(self, payload: dict) -> None:
        theirs, ours = payload.get("compat"), self.compat()
        if theirs != ours:
            diff = sorted(k for k in ours if (theirs or {}).get(k) != ours[k])
            raise ValueError(
                f"written by a run with other {', '.join(diff)} "
                f"(checkpoint: {[(theirs or {}).get(k) for k in diff]}, this run: "
                f"{[ours[k] for k in diff]})"
            )

    def checkpoint_payload(self) -> dict:
        """Call with no update running (poll_update(wait=True) first)."""
        self.sync_training_state()
        c = self.counters
        return {
            "compat": self.compat(),
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "counters": {key: getattr(c, key) for key in RESUMED_COUNTERS},
            "history": history(c),  # episode windows and verdict inputs (rlpipe.learner.counters)
            "scores": torch.from_numpy(self.scores.copy()),
            "rng": rng_state(
                numpy_generators={"actions": self.rng},
                torch_generators={"ppo": self.generator, "explore": self.explore_gen},
            ),
        }

    def restore(self, payload: dict) -> None:
        self.policy.load_state_dict(payload["policy"])
        self.actor.load_state_dict(payload["policy"])
        self.optimizer.load_state_dict(payload["optimizer"])
        for key in RESUMED_COUNTERS:
            setattr(self.counters, key, int(payload["counters"][key]))
        restore_history(self.counters, payload.get("history", {}))
        self.scores[:] = payload["scores"].numpy()
        set_rng_state(
            payload["rng"],
            numpy_generators={"actions": self.rng},
            torch_generators={"ppo": self.generator, "explore": self.explore_gen},
        )
        self.hand_over_training_state()
