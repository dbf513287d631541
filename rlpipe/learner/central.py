"""Central inference and training: gathers ready slices from the boards, runs the policy,
writes actions back, keeps rollouts per slice and runs PPO on what is ready.

The learner never waits for a particular worker: it serves whichever slices have rung, and
a PPO update starts once `update_envs` env-rollouts are ready, wherever they came from.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from rlpipe.config import RunSpec
from rlpipe.envs.registry import MixPlan
from rlpipe.learner.checkpoint import rng_state, set_rng_state
from rlpipe.learner.policy import Policy
from rlpipe.learner.ppo import UpdateStats, concat_blocks, ppo_update
from rlpipe.learner.rollout import SliceRollout
from rlpipe.learner.scaling import score_to_epsilon, score_to_weight


@dataclass
class SliceRef:
    """One ready slice: its worker's handle and the env range inside that worker."""
    handle: object            # supervisor.workers.WorkerHandle
    slice_index: int
    seq: int


@dataclass
class Counters:
    env_steps: int = 0
    updates: int = 0
    episodes: int = 0
    torn_retries: int = 0
    first_step_at: float | None = None
    returns: dict = field(default_factory=dict)     # type name -> deque of last 100 returns
    losses: list = field(default_factory=list)      # (time, total loss) per update


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


class CentralLearner:
    def __init__(self, spec: RunSpec, plan: MixPlan):
        self.spec = spec
        self.cfg = spec.learner
        self.plan = plan
        self.device = pick_device(self.cfg.device)
        torch.manual_seed(spec.seed)
        self.generator = torch.Generator().manual_seed(spec.seed)
        self.policy = Policy(plan, spec.obs_keys, self.cfg.hidden).to(self.device)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=self.cfg.learning_rate, eps=1e-5)
        self.env_type = torch.from_numpy(plan.env_type.astype(np.int64))
        # One batch buffer per obs key, sized for every env at once; each round uses a prefix.
        self.obs_buf = {k.name: torch.zeros((spec.env_count,) + k.shape,
                                            dtype=getattr(torch, k.dtype)) for k in spec.obs_keys}
        self.row_bytes = [k.nbytes for k in spec.obs_keys]
        self.rollouts: dict[tuple[int, int], SliceRollout] = {}
        self.ready_blocks: list[dict] = []
        self.ready_types: list[np.ndarray] = []
        self.ready_envs = 0
        self.update_envs = min(self.cfg.update_envs, spec.env_count)
        self.counters = Counters(returns={n: collections.deque(maxlen=100) for n in plan.names})
        self.last_stats: UpdateStats | None = None
        self.recent_returns: dict[str, list[float]] = {n: [] for n in plan.names}
        self.random = self.cfg.mode == "random"
        self.scaling = spec.scaling
        # Exploration alternatives get their own stream: the policy's samples stay reproducible.
        self.explore_gen = torch.Generator(device=self.device).manual_seed(spec.seed + 1)
        self.scores = np.ones(spec.env_count, dtype=np.float32)   # latest stability score per env
        self.rng = np.random.default_rng(spec.seed)
        self.disc_counts = np.array([s.action_n if s.action_kind != "continuous" else 1
                                     for s in plan.specs], dtype=np.int64)

    # -- inference ---------------------------------------------------------------------------
    def serve(self, ready: list[SliceRef]) -> None:
        """One inference round over the slices that rang: gather, act, ring back, store."""
        cfg = self.cfg
        rows = []                      # (ref, lo, hi, row offset)
        off = 0
        for ref in ready:
            lo, hi = ref.handle.bounds[ref.slice_index]
            rows.append((ref, lo, hi, off))
            off += hi - lo
        b = off
        for ref, lo, hi, row in rows:
            ptrs = [buf.data_ptr() + row * nb for buf, nb in zip(self.obs_buf.values(), self.row_bytes)]
            self.counters.torn_retries += ref.handle.views.board.gather(ptrs, self.row_bytes, lo, hi - lo)
        global_ids = np.concatenate([np.arange(ref.handle.env_lo + lo, ref.handle.env_lo + hi)
                                     for ref, lo, hi, _ in rows])
        types = self.env_type[global_ids]
        obs = {k: v[:b] for k, v in self.obs_buf.items()}
        alt = None
        if self.random:
            a_disc, a_cont = self._random_actions(types.numpy())
        else:
            dev_obs = {k: v.to(self.device, non_blocking=True) for k, v in obs.items()}
            if self.scaling.enabled:
                out = self.policy.act_explore(dev_obs, types.to(self.device), self.explore_gen)
                a_disc, a_cont, logp, value = out.a_disc, out.a_cont, out.logp, out.value
                alt = (out.alt_disc.cpu().numpy(), out.alt_cont.cpu().numpy(), out.alt_logp.cpu().numpy())
            else:
                a_disc, a_cont, logp, value = self.policy.act(dev_obs, types.to(self.device))
            a_disc, a_cont = a_disc.cpu().numpy(), a_cont.cpu().numpy()
            logp, value = logp.cpu().numpy(), value.cpu().numpy()

        # Actions out first: the workers step while we book-keep.
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
        if self.random:
            self._count_only(rows, now)
            return
        for ref, lo, hi, row in rows:
            key = (ref.handle.worker_id, ref.slice_index)
            ro = self.rollouts.get(key)
            if ro is None or ref.seq == 0:
                # seq 0: a (re)started worker's first obs; anything half-collected is dropped.
                ro = self.rollouts[key] = SliceRollout(hi - lo, cfg.rollout_len, self.spec.obs_keys,
                                                       self.plan.actions.cont_dim, self.scaling.enabled)
            else:
                res = ref.handle.views.results
                ro.add_outcome(res["reward"][lo:hi], res["terminated"][lo:hi],
                               res["truncated"][lo:hi], cfg.gamma)
                if self.scaling.enabled:
                    score = res["score"][lo:hi]
                    self.scores[ref.handle.env_lo + lo:ref.handle.env_lo + hi] = score
                    ro.add_behaviour(res["exec_discrete"][lo:hi], res["exec_continuous"][lo:hi],
                                     res["behaviour_logp"][lo:hi],
                                     score_to_weight(score, self.scaling.min_weight))
                self._episodes(ref, lo, hi, res)
                self.counters.env_steps += hi - lo
                if self.counters.first_step_at is None:
                    self.counters.first_step_at = now
            sl = slice(row, row + hi - lo)
            if ro.full:
                self.ready_blocks.append(ro.finish(value[sl], cfg.gamma, cfg.gae_lambda))
                self.ready_types.append(np.repeat(types[sl].numpy()[None], cfg.rollout_len, 0).reshape(-1))
                self.ready_envs += hi - lo
            ro.add_step({k: v[sl].numpy() for k, v in obs.items()}, a_disc[sl], a_cont[sl],
                        logp[sl], value[sl])

    def _random_actions(self, types: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Uniform actions over each env's valid entries (learner.mode=random: benchmarks)."""
        a_disc = (self.rng.random(len(types)) * self.disc_counts[types]).astype(np.int64)
        a_cont = self.rng.uniform(-1.0, 1.0, (len(types), max(self.plan.actions.cont_dim, 1)))
        return a_disc, a_cont.astype(np.float32)

    def _count_only(self, rows, now: float) -> None:
        for ref, lo, hi, _row in rows:
            if ref.seq > 0:
                self._episodes(ref, lo, hi, ref.handle.views.results)
                self.counters.env_steps += hi - lo
                if self.counters.first_step_at is None:
                    self.counters.first_step_at = now

    def _episodes(self, ref: SliceRef, lo: int, hi: int, res: dict) -> None:
        ep_len = res["ep_len"][lo:hi]
        done = np.nonzero(ep_len > 0)[0]
        if not len(done):
            return
        rets = res["ep_return"][lo:hi][done]
        types = self.plan.env_type[ref.handle.env_lo + lo + done]
        for r, t in zip(rets.tolist(), types.tolist()):
            name = self.plan.names[t]
            self.counters.returns[name].append(r)
            self.recent_returns[name].append(r)
        self.counters.episodes += len(done)

    # -- training ----------------------------------------------------------------------------
    @property
    def update_due(self) -> bool:
        return not self.random and self.ready_envs >= self.update_envs

    def update(self, progress: float) -> UpdateStats:
        if self.cfg.anneal_lr:
            for group in self.optimizer.param_groups:
                group["lr"] = self.cfg.learning_rate * max(1.0 - progress, 0.02)
        batch = concat_blocks(self.ready_blocks, self.ready_types, self.device)
        self.ready_blocks, self.ready_types, self.ready_envs = [], [], 0
        stats = ppo_update(self.policy, self.optimizer, batch, self.cfg, self.generator)
        self.counters.updates += 1
        self.counters.losses.append((time.monotonic(), stats.total_loss))
        self.last_stats = stats
        return stats

    @property
    def learning_rate(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

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
        return {"obs_keys": [[k.name, list(k.shape), k.dtype] for k in self.spec.obs_keys],
                "types": list(self.plan.names), "discrete_n": self.plan.actions.discrete_n,
                "cont_dim": self.plan.actions.cont_dim, "hidden": list(self.cfg.hidden),
                "env_count": self.spec.env_count}

    def check_compatible(self, payload: dict) -> None:
        theirs, ours = payload.get("compat"), self.compat()
        if theirs != ours:
            diff = sorted(k for k in ours if (theirs or {}).get(k) != ours[k])
            raise ValueError(f"written by a run with other {', '.join(diff)} "
                             f"(checkpoint: {[(theirs or {}).get(k) for k in diff]}, this run: "
                             f"{[ours[k] for k in diff]})")

    def checkpoint_payload(self) -> dict:
        c = self.counters
        return {"compat": self.compat(), "policy": self.policy.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "counters": {"env_steps": c.env_steps, "updates": c.updates, "episodes": c.episodes},
                "scores": torch.from_numpy(self.scores.copy()),
                "rng": rng_state(numpy_generators={"actions": self.rng},
                                 torch_generators={"ppo": self.generator, "explore": self.explore_gen})}

    def restore(self, payload: dict) -> None:
        self.policy.load_state_dict(payload["policy"])
        self.optimizer.load_state_dict(payload["optimizer"])
        counters = payload["counters"]
        self.counters.env_steps = int(counters["env_steps"])
        self.counters.updates = int(counters["updates"])
        self.counters.episodes = int(counters["episodes"])
        self.scores[:] = payload["scores"].numpy()
        set_rng_state(payload["rng"], numpy_generators={"actions": self.rng},
                      torch_generators={"ppo": self.generator, "explore": self.explore_gen})

    def drop_worker(self, worker_id: int) -> None:
        """Forget a replaced worker's half-collected rollouts (never mixed across a restart)."""
        for key in [k for k in self.rollouts if k[0] == worker_id]:
            del self.rollouts[key]
