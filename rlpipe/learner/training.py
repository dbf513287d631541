"""The learner's training side: when a PPO update is due, what waits while the learner is
backlogged (`learner.backlog`), the update run beside serving on the ready rollouts (in a
process of its own, rlpipe/learner/update_process.py, or in a thread: `learner.update_in`),
and its result taken in between two rounds (the actor refreshed).
`CentralLearner` (rlpipe/learner/central.py) carries this; it reads the learner's ready queue,
policy/actor pair, optimizer settings and counters."""

from __future__ import annotations

import os
import threading
import time

import torch

from rlpipe import heap
from rlpipe.learner.adam import FusedAdam
from rlpipe.learner.backlog import DROP_KEEPS_BATCHES
from rlpipe.learner.ppo import UpdateStats, concat_blocks, ppo_update


class BackgroundTraining:
    """Mixed into CentralLearner: everything here reads the learner's own fields."""

    @property
    def update_due(self) -> bool:
        return not self.random and self._update_job is None and self.ready_samples >= self.update_samples

    @property
    def optimizer(self) -> FusedAdam:
        """Built on first use, in the first update's thread (with an update process: the
        process's own, and this one its copy at the last `sync_training_state`).
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
        rollouts beyond DROP_KEEPS_BATCHES batches (throughput: the policy lag stays bounded,
        at most two updates behind). A block is dropped only while the rest still make those
        full batches, so the next update starts the moment this one ends: dropping down to the
        batch size let blocks of 1,120 samples (day4's slices) against a batch of 8,192 leave
        7,840, and every update then waited about 0.2 s for one more block (docs/benchmarks.md,
        "A full batch kept").
        learner.backlog=sync: as hold, and the workers also wait while any update trains, so
        every step is taken with the newest weights (on-policy, as a synchronous PPO: under
        hold the next batch is collected while the last one trains, one update behind). For
        small runs, where an update is short and samples are what the learning costs."""
        if self.cfg.backlog == "sync" and self._update_job is not None:
            return True
        if self.ready_samples < self.update_samples:
            return False
        if self.cfg.backlog in ("hold", "sync"):
            return True
        if self._update_job is None:
            return False
        while (
            len(self.ready_blocks) > 1
            and self.ready_samples - len(self.ready_blocks[0]["adv"]) >= DROP_KEEPS_BATCHES * self.update_samples
        ):
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

    def prepare_updates(self) -> None:
        """Start the update process ahead of the first update (its interpreter imports torch
        while the driver starts its workers); without one, nothing to do."""
        if self.update_process is not None and not self.random:
            loaded = self._optimizer.state_dict() if self._optimizer is not None else None  # a resumed run's
            self.update_process.start(self.generator, loaded)

    def start_update(self) -> None:
        """Start a PPO update on the ready rollouts in the background; rollouts arriving
        meanwhile make up the next update's batch."""
        lr = self.lr_now()
        batch = self._take_batch()
        if self.update_process is not None:
            self.prepare_updates()
            self._update_job = self.update_process.begin(batch, lr, self._set_update_result)
            return
        self._update_job = threading.Thread(target=self._train, args=(batch, lr), name="ppo-update", daemon=True)
        self._update_job.start()

    def _set_update_result(self, result) -> None:
        self._update_result = result

    def sync_training_state(self) -> None:
        """Bring `optimizer` and `generator` to the update process's (a checkpoint saves them
        from here); with no process running they are the training state already. Call with no
        update in flight."""
        if self.update_process is not None and self.update_process.started:
            optimizer_state, stream = self.update_process.state()
            self.optimizer.load_state_dict(optimizer_state)
            self.generator.set_state(stream)

    def hand_over_training_state(self) -> None:
        """After `optimizer` and `generator` were loaded here (a resumed run): the process's too."""
        if self.update_process is not None and self.update_process.started:
            self.update_process.load(self.optimizer.state_dict(), self.generator.get_state())

    def close_updates(self) -> None:
        """The update process stopped (the driver's teardown, after the final checkpoint)."""
        if self.update_process is not None:
            self.update_process.close()

    def _take_batch(self) -> dict | None:
        """The oldest ready blocks, about update_samples of them, as one batch (None: no block
        ready); the rest wait for the next update. Made here, in the serving thread: at day4 the
        update (thread or process) is what limits training, and the copy would be its work."""
        take, samples = 0, 0
        while take < len(self.ready_blocks) and samples < self.update_samples:
            samples += len(self.ready_blocks[take]["adv"])
            take += 1
        if not take:
            return None
        batch = concat_blocks(self.ready_blocks[:take], self.ready_types[:take], self.device)
        self.update_stream.batch_queued()
        del self.ready_blocks[:take], self.ready_types[:take]
        self.ready_samples -= samples
        return batch

    def _train(self, batch: dict, lr: float) -> None:
        try:
            if self.spec.learner_cpu is not None:  # worker.cpu_affinity=learner_core
                os.sched_setaffinity(threading.get_native_id(), {self.spec.learner_cpu})
            with self.update_stream.running():  # on cuda: beside serving (gpu_overlap.py)
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
        return self._update_job is not None and self._update_job.is_alive()

    def wait_update(self, timeout_s: float) -> None:
        """Block until the running update ends, at most `timeout_s` (at once without one)."""
        job = self._update_job
        if job is not None:
            job.join(timeout_s)

    def poll_update(self, wait: bool = False) -> UpdateStats | None:
        """The finished update's stats (None while one runs or none was started); the actor
        takes the new weights here, in the main thread, between two inference rounds."""
        job = self._update_job
        if job is None or (job.is_alive() and not wait):
            return None
        job.join()
        self._update_job = None
        result, self._update_result = self._update_result, None
        if isinstance(result, BaseException):
            raise result
        self._refresh_actor()
        self.counters.updates += 1
        self.counters.trained_samples += result.samples
        self.counters.losses.add((time.monotonic(), result.total_loss))
        self.counters.recent_losses.append(result.total_loss)
        self.last_stats = result
        return result

    def _refresh_actor(self) -> None:
        """The serving copy takes the trained weights: one fused copy over every parameter and
        buffer (load_state_dict walks the module tree and copies them one by one)."""
        if self._actor_pairs is None:
            mine = [*self.actor.parameters(), *self.actor.buffers()]
            theirs = [*self.policy.parameters(), *self.policy.buffers()]
            self._actor_pairs = ([t.data for t in mine], [t.data for t in theirs])
        torch._foreach_copy_(*self._actor_pairs)
