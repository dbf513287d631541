"""Checkpointing, the driver's side of checkpoints: resume from the newest loadable one,
save one every `learner.checkpoint_interval_s` (when, the run mode decides: supervisor.runmode)
and at the end, and export the trained policy. The files themselves are
rlpipe.learner.checkpoint's; what is added here are the workers' reward statistics, which live
in Redis while the run goes."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import redis

from rlpipe.cadence import Every
from rlpipe.config import RunSpec
from rlpipe.files import atomic_write
from rlpipe.supervisor.workers import reward_stats_keys

log = logging.getLogger("rlpipe")


class Checkpointing:
    def __init__(self, spec: RunSpec, run_dir: Path, run_id: str, config_yaml: str, t0: float):
        self.spec = spec
        self.run_dir = run_dir
        self.config_yaml = config_yaml
        self.dir = run_dir / "checkpoints"
        self.rnorm_keys = reward_stats_keys(spec, run_id)
        interval = spec.learner.checkpoint_interval_s
        self.timer = Every(interval, first_at=t0 + interval)
        self.resumed_from_step = 0

    def resume(self, learner, rcli: redis.Redis, required: bool) -> None:
        """Continue from the newest loadable checkpoint of this run directory; the workers'
        reward statistics go back into Redis before any worker starts, so they restore them.
        `required` (run.resume=true): no checkpoint at all is a CheckpointError, like a
        directory of unreadable ones. Otherwise (auto) either means a fresh start: a supervisor
        restarting the same command line blindly must not fail on it (unreadable files are
        renamed `.bad` by load_latest and stay for a look)."""
        from rlpipe.learner.checkpoint import CheckpointError, load_latest

        try:
            found = load_latest(self.dir, validate=learner.check_compatible)
        except CheckpointError as exc:
            if required:
                raise
            log.warning("run.resume=auto: %s; starting fresh", exc)
            return
        if found is None:
            if required:
                raise CheckpointError(
                    f"run.resume=true but {self.dir} holds no checkpoint (is hydra.run.dir the run's "
                    f"directory?); run.resume=auto starts fresh when there is none"
                )
            log.info("run.resume=auto: %s holds no checkpoint: starting fresh", self.dir)
            return
        path, payload = found
        learner.restore(payload)
        self.resumed_from_step = learner.counters.env_steps
        states = payload.get("reward_norm", [])
        for key, state in zip(self.rnorm_keys, states):
            if state.numel():
                rcli.set(key, state.numpy().tobytes())
        if self.spec.reward_norm.mode != "off" and not any(state.numel() for state in states):
            # said, not silent: the workers start their running std anew and the first rewards
            # are scaled as in a fresh run's first steps
            log.warning(
                "resumed from %s without reward statistics (Redis did not answer when it was written): "
                "reward_norm=%s starts its running statistics anew",
                path.name,
                self.spec.reward_norm.mode,
            )
        log.info("resumed from %s at %d env steps", path.name, self.resumed_from_step)

    def save(self, learner, rcli: redis.Redis) -> Path:
        """One checkpoint of the learner (no update in flight) and the workers' reward statistics."""
        import torch

        from rlpipe.learner.checkpoint import save_checkpoint

        payload = learner.checkpoint_payload()
        try:
            # uint8 tensors: torch.load(weights_only=True) refuses raw bytes
            payload["reward_norm"] = [
                torch.tensor(np.frombuffer(v or b"", dtype=np.uint8)) for v in rcli.mget(self.rnorm_keys)
            ]
        except redis.RedisError:
            payload["reward_norm"] = []
            log.warning("checkpoint without reward statistics: Redis unreachable")
        return save_checkpoint(self.dir, learner.counters.env_steps, payload, self.spec.learner.keep_checkpoints)

    def export(self, learner) -> Path:
        """export/policy.pt: the trained weights with what they were trained for (`compat`: obs
        keys, env types, action heads, layer sizes) and the run's config, loadable with
        torch.load(weights_only=True)."""
        import torch

        from rlpipe.learner.device import to_host

        path = self.run_dir / "export" / "policy.pt"
        path.parent.mkdir(exist_ok=True)
        exported = {
            "policy": to_host(learner.policy.state_dict()),
            "compat": learner.compat(),
            "env_steps": learner.counters.env_steps,
            "config_yaml": self.config_yaml,
        }
        return atomic_write(path, lambda f: torch.save(exported, f))
