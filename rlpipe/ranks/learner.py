"""The central learner of one rank: updates are rounds taken by every rank together.

CentralLearner starts an update whenever `update_envs` env-rollouts' worth of samples is
ready. Here the same readiness is announced to the other ranks (`Rounds`), and the update starts when the round
does. In the update thread, before any training, the round's header is all-reduced:

    [env steps this rank made since its last round, samples in its batch, wants to stop,
     wants a checkpoint]

so every rank learns the same global env-step count (the learning-rate schedule and
run.total_env_steps use it), the global batch size (the minibatch count), and whether the
run ends or checkpoints after this round. Then `ppo_update` runs with `RankSync`: PopArt and
advantage statistics from all ranks' batches, gradients averaged after every backward pass.
A round where no rank has a sample skips training on every rank.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import torch
import torch.distributed as tdist

from rlpipe import heap
from rlpipe.config import RunSpec
from rlpipe.envs.registry import MixPlan
from rlpipe.learner.central import CentralLearner
from rlpipe.learner.ppo import ppo_update
from rlpipe.ranks.sync import RankLost, RankSync, Rounds, rank_lost

TEARDOWN_JOIN_S = 20.0  # at most this long for an update in flight when the run is stopped


def empty_batch(plan: MixPlan, device, weighted: bool) -> dict:
    """A batch of no samples with every key `ppo_update` reads: a preempted rank with no
    complete rollout still takes part in every collective of the round."""
    f32 = dict(dtype=torch.float32, device=device)
    batch = {
        "obs": {
            k.name: torch.zeros((0,) + k.shape, dtype=getattr(torch, k.dtype), device=device) for k in plan.obs_keys
        },
        "types": torch.zeros(0, dtype=torch.int64, device=device),
        "a_disc": torch.zeros(0, dtype=torch.int64, device=device),
        "a_cont": torch.zeros((0, max(plan.actions.cont_dim, 1)), **f32),
        **{k: torch.zeros(0, **f32) for k in ("logp", "value", "adv", "ret")},
    }
    if weighted:
        batch["weight"] = torch.zeros(0, **f32)
    return batch


class RankLearner(CentralLearner):
    def __init__(self, spec: RunSpec, plan: MixPlan, rank: int, world: int, store, sync_device):
        super().__init__(spec, plan)
        self.update_process = None  # a round's update runs its collectives in a thread of this rank
        self.rank, self.world = rank, world
        self.rounds = Rounds(store, rank, world, spec.dist.sync_frac, spec.dist.timeout_s)
        self.sync = RankSync(rank, world, sync_device)
        self.round_steps = 0  # env steps of all ranks up to the start of the last round
        self.local_at_round = 0  # this rank's count when the last round started
        self.want_stop = False  # set by the driver (run.duration_s passed)
        self.checkpoint_wanted = False  # set by the driver's checkpoint clock
        self.finished = False  # the last round ended the run: leave the loop
        self._checkpoint_flag = False
        self.preempted_rounds = 0  # rounds this rank joined without its full share
        self._round = None  # (local count at start, header sums) of the round in flight
        self._abandoned = False  # teardown gave up on the round in flight
        self.round_s = 0.0  # wall time of the update rounds (header to last optimizer step)

    # -- the schedule ------------------------------------------------------------------------
    @property
    def global_env_steps(self) -> int:
        """All ranks' env steps at the last round plus this rank's since (a lower bound of the
        job's count between rounds, exact at each round)."""
        return self.round_steps + self.counters.env_steps - self.local_at_round

    # -- rounds ------------------------------------------------------------------------------
    @property
    def update_due(self) -> bool:
        if self._update_job is not None or self.finished:
            return False
        return self.rounds.due(self.ready_samples >= self.update_samples, self.want_stop)

    def start_update(self) -> None:
        if not self.rounds.begin():
            self.preempted_rounds += 1
        batch = self._take_batch()
        if batch is None:
            batch = empty_batch(self.plan, self.device, self.scaling.enabled)
            self.update_stream.batch_queued()
        local = self.counters.env_steps
        header = [
            float(local - self.local_at_round),
            float(len(batch["adv"])),
            float(self.want_stop),
            float(self.checkpoint_wanted),
        ]
        self._round = [local, None]
        self._update_job = threading.Thread(
            target=self._train_round, args=(batch, header), name="ppo-round", daemon=True
        )
        self._update_job.start()

    def _train_round(self, batch: dict, header: list[float]) -> None:
        start = time.perf_counter()
        try:
            sums = self.sync.header(header)
            self._round[1] = sums
            if sums[1] <= 0:  # no rank holds a sample: nobody trains this round
                self._update_result = None
                return
            lr = self.lr_now(self.round_steps + int(sums[0]))
            with self.update_stream.running():  # on cuda: beside serving (gpu_overlap.py)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                self._update_result = ppo_update(
                    self.policy,
                    self.optimizer,
                    batch,
                    self.cfg,
                    self.generator,
                    sync=self.sync,
                    per_type=self.type_settings,
                )
            if self.spec.run.trim_after_update:
                heap.trim()
        except BaseException as exc:  # re-raised in the main thread by poll_update
            self._update_result = exc
        finally:
            self.round_s += time.perf_counter() - start

    def poll_update(self, wait: bool = False):
        thread = self._update_job
        if thread is None:
            return None
        if thread.is_alive():
            if not wait:
                return None
            thread.join(0 if self._abandoned else self.spec.dist.timeout_s)
            if thread.is_alive():
                raise RankLost(
                    f"rank {self.rank}/{self.world}: update round {self.rounds.round} did not "
                    f"complete within dist.timeout_s={self.spec.dist.timeout_s:g} s: a peer rank "
                    "is gone or stalled"
                )
        local, sums = self._round
        if sums is not None:  # the header went through: adopt the round's figures
            self.round_steps += int(sums[0])
            self.local_at_round = local
            total = self.spec.run.total_env_steps
            self.finished = sums[2] > 0 or bool(total and self.round_steps >= total)
            self._checkpoint_flag = self._checkpoint_flag or sums[3] > 0
        if self._update_result is None and sums is not None and sums[1] <= 0:
            self._update_job = None  # an empty round: nothing trained, nothing to load
            return None
        return super().poll_update(wait=True)

    def join_for_teardown(self) -> None:
        """A stopped run's update in flight: wait a bounded time (its peers may be gone)."""
        thread = self._update_job
        if thread is not None and thread.is_alive():
            thread.join(TEARDOWN_JOIN_S)
            if thread.is_alive():
                self._abandoned = True  # the final checkpoint and export do not wait again
                raise RankLost(
                    f"rank {self.rank}/{self.world}: update round {self.rounds.round} still in "
                    f"its collectives after {TEARDOWN_JOIN_S:g} s of teardown: no final checkpoint"
                )

    def take_checkpoint(self) -> bool:
        """True once after a round that asked for a checkpoint (every rank sees the same)."""
        flag, self._checkpoint_flag = self._checkpoint_flag, False
        if flag:
            self.checkpoint_wanted = False
        return flag

    # -- start, checkpoints ------------------------------------------------------------------
    def start_in_sync(self, resumed: bool) -> None:
        """Every rank takes rank 0's policy (PopArt buffers included), update count and optimizer state (none
        unless rank 0 resumed one: then every rank starts a fresh one), whatever its own
        checkpoint held; the job's env steps are summed over ranks; fresh runs then reseed the
        sampling streams per rank (the same seed on every rank would draw the same action noise)."""
        state = None
        if self.rank == 0:
            state = {
                "policy": self.policy.state_dict(),
                "updates": self.counters.updates,
                "optimizer": self._optimizer.state_dict() if self._optimizer is not None else None,
            }
        box = [state]
        try:
            tdist.broadcast_object_list(box, src=0)
        except Exception as exc:
            raise rank_lost(self.rank, self.world, "the start-up broadcast of rank 0's learner state", exc) from exc
        state = box[0]
        self.counters.updates = int(state["updates"])  # the rounds taken so far: the job's count
        if self.rank != 0:
            self.policy.load_state_dict(state["policy"])
            self.actor.load_state_dict(state["policy"])
            if state["optimizer"] is not None:
                self.optimizer.load_state_dict(state["optimizer"])
            else:
                self._optimizer = None  # built on first use, as on rank 0
        # The job's env steps are the sum of the ranks' own counts (after a restart each from its
        # own checkpoint, which may be older than rank 0's: steps no checkpoint kept are not
        # counted), so summary env steps and run.total_env_steps agree on every rank.
        steps = torch.tensor([float(self.counters.env_steps)], dtype=torch.float64, device=self.sync.device)
        self.round_steps = int(self.sync.all_sum(steps, "the start-up all-reduce of env steps").item())
        self.local_at_round = self.counters.env_steps
        if not resumed:
            seed = self.spec.run.seed + 1_000_003 * self.rank
            torch.manual_seed(seed)
            self.generator.manual_seed(seed)
            self.explore_gen.manual_seed(seed + 1)
            self.rng = np.random.default_rng(seed)

    def checkpoint_payload(self) -> dict:
        payload = super().checkpoint_payload()
        payload["dist"] = {"world_size": self.world, "rank": self.rank, "job_env_steps": self.round_steps}
        return payload
