"""Central inference and training: gathers ready slices from the boards, runs the policy,
writes actions back, keeps rollouts per slice and runs PPO on what is ready.

The learner never waits for a particular worker: it serves whichever slices have rung, and
a PPO update starts once `update_envs` env-rollouts' worth of samples (update_envs x
rollout_len) is ready, wherever it came from.

Serving, the rollout queue, the update thread and the checkpointed state share the same few
fields (the ready queue, the actor/policy pair, the counters and RNG streams); the pieces that
need none of them live beside it (policy, ppo, rollout, popart, checkpoint, counters, latency).
"""

from __future__ import annotations

import collections
import copy
import os
import threading
import time

import numpy as np
import torch

from rlpipe import heap
from rlpipe.config import RunSpec
from rlpipe.envs.registry import MixPlan
from rlpipe.learner.adam import FusedAdam
from rlpipe.learner.checkpoint import rng_state, set_rng_state
from rlpipe.learner.counters import FIRST_EPISODES, Counters
from rlpipe.learner.device import pick_device
from rlpipe.learner.latency import StepLatencies
from rlpipe.learner.outcomes import OUTCOME_FIELDS, SCALING_FIELDS, slice_outcome, truncation_values
from rlpipe.learner.policy import Policy
from rlpipe.learner.ppo import UpdateStats, concat_blocks, ppo_update
from rlpipe.learner.rollout import SliceRollout, key_rows
from rlpipe.learner.scaling import score_to_epsilon, score_to_weight
from rlpipe.learner.slices import SliceRef
from rlpipe.learner.type_settings import TypeSettings

# Bumped when the policy's parameters change shape or meaning: older checkpoints are refused.
POLICY_LAYOUT = "typed-towers-popart-1"
RESUMED_COUNTERS = ("env_steps", "updates", "episodes", "trained_samples")  # carried by a checkpoint


class CentralLearner:
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
        # PPO updates run in a thread on `policy` while `actor`, a copy refreshed after every
        # update, keeps serving the workers: inference never waits for training.
        self.actor = copy.deepcopy(self.policy)
        self._update_thread: threading.Thread | None = None
        self._update_result = None
        # One batch buffer per obs key, sized for every env at once; each round uses a prefix.
        self.obs_buf = {
            k.name: torch.zeros((spec.env_count,) + k.shape, dtype=getattr(torch, k.dtype)) for k in plan.obs_keys
        }
        self.row_bytes = [k.nbytes for k in plan.obs_keys]
        self.obs_base = [buf.data_ptr() for buf in self.obs_buf.values()]  # they never move
        self.rollouts: dict[tuple[int, int], SliceRollout] = {}
        # (gamma, lambda) per slice: its types never change (the env -> type map is fixed)
        self.slice_gae: dict[tuple[int, int], tuple] = {}
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
        self.random = self.cfg.mode == "random"
        self.scaling = spec.scaling
        # Exploration alternatives get their own stream: the policy's samples stay reproducible.
        self.explore_gen = torch.Generator(device=self.device).manual_seed(spec.run.seed + 1)
        self.scores = np.ones(spec.env_count, dtype=np.float32)  # latest stability score per env
        self.rng = np.random.default_rng(spec.run.seed)
        self.disc_counts = np.array(
            [s.action_n if s.action_kind != "continuous" else 1 for s in plan.specs], dtype=np.int64
        )

    # -- inference ---------------------------------------------------------------------------
    def serve(self, ready: list[SliceRef]) -> None:
        """One inference round over the slices that rang: gather, act, ring back, store.

        A slice's step results (reward, end flags, episode stats, final obs) are copied out
        of its worker's segment *before* the slice is rung: once rung, the worker steps
        again and overwrites them."""
        cfg = self.cfg
        rows = []  # (ref, lo, hi, row offset)
        off = 0
        for ref in ready:
            lo, hi = ref.handle.bounds[ref.slice_index]
            rows.append((ref, lo, hi, off))
            off += hi - lo
        b = off
        if b > self.spec.env_count:  # a slice served twice would write past the batch buffers
            raise RuntimeError(f"inference round of {b} rows for {self.spec.env_count} envs: a slice was served twice")
        torn = 0
        for ref, lo, hi, row in rows:
            ptrs = [base + row * nb for base, nb in zip(self.obs_base, self.row_bytes)]
            torn += ref.handle.views.board.gather(ptrs, self.row_bytes, lo, hi - lo)
        self.counters.torn_retries += torn
        types_np = np.concatenate([ref.handle.slice_types[ref.slice_index] for ref in ready])
        obs = {k: v[:b] for k, v in self.obs_buf.items()}
        alt = None
        if self.random:
            a_disc, a_cont = self._random_actions(types_np)
        else:
            types = torch.from_numpy(types_np)
            dev_obs = {k: v.to(self.device, non_blocking=True) for k, v in obs.items()}
            if self.scaling.enabled:
                out = self.actor.act_explore(dev_obs, types.to(self.device), self.explore_gen)
                a_disc, a_cont, logp, value = out.a_disc, out.a_cont, out.logp, out.value
                alt = (out.alt_disc.cpu().numpy(), out.alt_cont.cpu().numpy(), out.alt_logp.cpu().numpy())
            else:
                a_disc, a_cont, logp, value = self.actor.act(dev_obs, types.to(self.device))
            a_disc, a_cont = a_disc.cpu().numpy(), a_cont.cpu().numpy()
            logp, value = logp.cpu().numpy(), value.cpu().numpy()

        fields = OUTCOME_FIELDS + (SCALING_FIELDS if self.scaling.enabled and not self.random else ())
        outcomes = [
            slice_outcome(ref, lo, hi, fields, self.plan.obs_keys, not self.random) if ref.seq > 0 else None
            for ref, lo, hi, _ in rows
        ]
        # Actions out: the workers step while we book-keep.
        for ref, lo, hi, row in rows:
            acts = ref.handle.views.actions
            rs = slice(row, row + hi - lo)
            acts["discrete"][lo:hi] = a_disc[rs]
            if self.plan.actions.cont_dim:
                acts["continuous"][lo:hi] = a_cont[rs]
            if alt is not None:
                acts["logp"][lo:hi] = logp[rs]
                acts["alt_discrete"][lo:hi] = alt[0][rs]
                if self.plan.actions.cont_dim:
                    acts["alt_continuous"][lo:hi] = alt[1][rs]
                acts["alt_logp"][lo:hi] = alt[2][rs]
            ref.handle.ring(ref.slice_index, ref.seq)

        now = time.monotonic()
        for (ref, lo, hi, _row), res in zip(rows, outcomes):
            if res is not None:
                self._episodes(ref, lo, hi, res)
                self.step_ms.add(ref.handle.slice_types[ref.slice_index], res["step_ms"])
                self.counters.env_steps += hi - lo
                if self.counters.first_step_at is None:
                    self.counters.first_step_at = now
        if self.random:
            return
        final_values = truncation_values(self.actor, self.plan.obs_keys, self.device, rows, outcomes)
        for (ref, lo, hi, row), res, fv in zip(rows, outcomes, final_values):
            key = (ref.handle.worker_id, ref.slice_index)
            ro = self.rollouts.get(key)
            sl = slice(row, row + hi - lo)
            gae = self.slice_gae.get(key)
            if gae is None:
                gae = self.slice_gae[key] = self.type_settings.gae(types_np[sl])
            gamma, lam = gae
            if ro is None or ref.seq == 0:
                # seq 0: a (re)started worker's first obs; anything half-collected is dropped.
                ro = self.rollouts[key] = SliceRollout(
                    hi - lo,
                    cfg.rollout_len,
                    self.plan.obs_keys,
                    self.plan.actions.cont_dim,
                    self.scaling.enabled,
                    first_len=self._first_len(ref),
                    key_rows=key_rows(self.plan, types_np[sl]),
                )
            else:
                ro.add_outcome(res["reward"], res["terminated"], res["truncated"], gamma, fv)
                if self.scaling.enabled:
                    score = res["score"]
                    self.scores[ref.handle.env_lo + lo : ref.handle.env_lo + hi] = score
                    ro.add_behaviour(
                        res["exec_discrete"],
                        res["exec_continuous"],
                        res["behaviour_logp"],
                        score_to_weight(score, self.scaling.min_weight),
                    )
            if ro.full:
                length = ro.length
                self.ready_blocks.append(ro.finish(value[sl], gamma, lam))
                self.ready_types.append(np.repeat(types_np[sl][None], length, 0).reshape(-1))
                self.ready_samples += length * (hi - lo)
            ro.add_step({k: v[sl].numpy() for k, v in obs.items()}, a_disc[sl], a_cont[sl], logp[sl], value[sl])

    def _first_len(self, ref: SliceRef) -> int:
        """Length of a new slice rollout's first block: T - (slice ordinal mod T), so the
        slices of a fleet that started together finish their blocks spread evenly over T
        rounds instead of all in one (rlpipe/learner/rollout.py)."""
        T = self.cfg.rollout_len
        ordinal = ref.handle.worker_id * len(ref.handle.bounds) + ref.slice_index
        return T - ordinal % T

    def _random_actions(self, types: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Uniform actions over each env's valid entries (learner.mode=random: benchmarks)."""
        a_disc = (self.rng.random(len(types)) * self.disc_counts[types]).astype(np.int64)
        cont_dim = self.plan.actions.cont_dim
        if not cont_dim:  # no continuous type: the head is never written
            return a_disc, np.zeros((len(types), 1), dtype=np.float32)
        return a_disc, self.rng.uniform(-1.0, 1.0, (len(types), cont_dim)).astype(np.float32)

    def latency_percentiles(self) -> dict[str, tuple[float, float]]:
        """(p50, p99) of each type's step latency since the last call, in ms."""
        return self.step_ms.percentiles()

    def _episodes(self, ref: SliceRef, lo: int, hi: int, res: dict) -> None:
        done = np.nonzero(res["ep_len"] > 0)[0]
        if not len(done):
            return
        rets = res["ep_return"][done]
        types = self.plan.env_type[ref.handle.env_lo + lo + done]
        for r, t in zip(rets.tolist(), types.tolist()):
            name = self.plan.names[t]
            self.counters.returns[name].append(r)
            self.counters.episodes_by_type[name] += 1
            if len(self.counters.first_returns[name]) < FIRST_EPISODES:
                self.counters.first_returns[name].append(r)
            self.recent_returns[name].append(r)
        self.counters.episodes += len(done)

    # -- training ----------------------------------------------------------------------------
    @property
    def update_due(self) -> bool:
        return not self.random and self._update_thread is None and self.ready_samples >= self.update_samples

    @property
    def optimizer(self) -> FusedAdam:
        """Built on first use, in the first update's thread.
        Adam's fused kernel: the same update rule in one pass over all parameters instead of
        a dozen small ops per parameter tensor (the update's second cost after the layers),
        called without torch.optim, whose first call imports torch._dynamo (rlpipe/learner/adam.py)."""
        if self._optimizer is None:
            self._optimizer = FusedAdam(self.policy.parameters(), lr=self.cfg.learning_rate, eps=1e-5)
        return self._optimizer

    @property
    def backlogged(self) -> bool:
        """A full batch of rollouts waits to be trained on.
        learner.backlog=hold: hold the workers until the waiting rollouts have gone into
        updates (backpressure: every sample is trained on, and stepping runs at the pace of
        training; with thousands of envs one inference round alone completes more rollouts
        than an update takes, so holding only while an update runs would let them pile up).
        learner.backlog=drop: keep stepping; while an update trains, drop the oldest waiting
        rollouts beyond one batch (throughput: the policy lag stays bounded).
        learner.backlog=sync: as hold, and the workers also wait while any update trains, so
        every step is taken with the newest weights (on-policy, as a synchronous PPO: under
        hold the next batch is collected while the last one trains, one update behind). For
        small runs, where an update is short and samples are what the learning costs."""
        if self.cfg.backlog == "sync" and self._update_thread is not None:
            return True
        if self.ready_samples < self.update_samples:
            return False
        if self.cfg.backlog in ("hold", "sync"):
            return True
        if self._update_thread is None:
            return False
        while self.ready_samples > self.update_samples and len(self.ready_blocks) > 1:
            block = self.ready_blocks.pop(0)
            self.ready_types.pop(0)
            self.ready_samples -= len(block["adv"])
            self.counters.dropped_rollouts += block["n_envs"]
        return False

    @property
    def global_env_steps(self) -> int:
        """Env steps of the whole run (across torchrun ranks in rlpipe.ranks.learner)."""
        return self.counters.env_steps

    def lr_now(self, steps: int | None = None) -> float:
        """learner.anneal_lr: linear in env steps toward run.total_env_steps (down to 2 % of the
        base rate), so the schedule is the same on a fast and a slow machine. A run bounded
        only by its duration has no step budget to anneal toward: the rate stays constant.
        `steps`: the run's env steps (default: this learner's count)."""
        total = self.spec.run.total_env_steps
        if not self.cfg.anneal_lr or not total:
            return self.cfg.learning_rate
        steps = self.counters.env_steps if steps is None else steps
        return self.cfg.learning_rate * max(1.0 - steps / total, 0.02)

    def start_update(self) -> None:
        """Start a PPO update on the ready rollouts in the background; rollouts arriving
        meanwhile make up the next update's batch."""
        lr = self.lr_now()
        batch = self._take_batch()
        self._update_thread = threading.Thread(target=self._train, args=(batch, lr), name="ppo-update", daemon=True)
        self._update_thread.start()

    def _take_batch(self) -> dict | None:
        """The oldest ready blocks, about update_samples of them, as one batch (None: no block
        ready); the rest wait for the next update."""
        take, samples = 0, 0
        while take < len(self.ready_blocks) and samples < self.update_samples:
            samples += len(self.ready_blocks[take]["adv"])
            take += 1
        if not take:
            return None
        batch = concat_blocks(self.ready_blocks[:take], self.ready_types[:take], self.device)
        del self.ready_blocks[:take], self.ready_types[:take]
        self.ready_samples -= samples
        return batch

    def _train(self, batch: dict, lr: float) -> None:
        try:
            if self.spec.learner_cpu is not None:  # worker.cpu_affinity=learner_core
                os.sched_setaffinity(threading.get_native_id(), {self.spec.learner_cpu})
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self._update_result = ppo_update(
                self.policy, self.optimizer, batch, self.cfg, self.generator, per_type=self.type_settings
            )
            if self.spec.run.trim_after_update:
                heap.trim()  # the update's activations freed: their pages go back
        except BaseException as exc:  # re-raised in the main thread by poll_update
            self._update_result = exc

    @property
    def updating(self) -> bool:
        return self._update_thread is not None and self._update_thread.is_alive()

    def wait_update(self, timeout_s: float) -> None:
        """Block until the running update ends, at most `timeout_s` (at once without one)."""
        thread = self._update_thread
        if thread is not None:
            thread.join(timeout_s)

    def poll_update(self, wait: bool = False) -> UpdateStats | None:
        """The finished update's stats (None while one runs or none was started); the actor
        takes the new weights here, in the main thread, between two inference rounds."""
        thread = self._update_thread
        if thread is None or (thread.is_alive() and not wait):
            return None
        thread.join()
        self._update_thread = None
        result, self._update_result = self._update_result, None
        if isinstance(result, BaseException):
            raise result
        self.actor.load_state_dict(self.policy.state_dict())
        self.counters.updates += 1
        self.counters.trained_samples += result.samples
        self.counters.losses.add((time.monotonic(), result.total_loss))
        self.counters.recent_losses.append(result.total_loss)
        self.last_stats = result
        return result

    @property
    def learning_rate(self) -> float:
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
        c = self.counters
        return {
            "compat": self.compat(),
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "counters": {key: getattr(c, key) for key in RESUMED_COUNTERS},
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
        self.scores[:] = payload["scores"].numpy()
        set_rng_state(
            payload["rng"],
            numpy_generators={"actions": self.rng},
            torch_generators={"ppo": self.generator, "explore": self.explore_gen},
        )

    def drop_worker(self, worker_id: int) -> None:
        """Forget a replaced worker's half-collected rollouts (never mixed across a restart)."""
        for key in [k for k in self.rollouts if k[0] == worker_id]:
            del self.rollouts[key]
