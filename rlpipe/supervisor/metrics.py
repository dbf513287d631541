"""What the run reports: TensorBoard charts while it goes (losses, sps, returns, memory,
health, reward statistics, scaling weights), the status line, and at the end `summary.json`,
the hparams run, the health report and the one line printed on stdout."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path

import numpy as np
import redis

from rlpipe import mix_learner
from rlpipe.cadence import Every
from rlpipe.config import RunSpec
from rlpipe.envs import random_return
from rlpipe.files import atomic_write, space_error
from rlpipe.lifecycle import FAULT_KINDS, event_counts, fault_counts
from rlpipe.protocol import worker_key
from rlpipe.shm.layout import H_ENV_LEAK
from rlpipe.supervisor.fleet import Fleet
from rlpipe.supervisor.resources import ResourceSampler
from rlpipe.supervisor.runmode import RunMode
from rlpipe.supervisor.services import Services
from rlpipe.supervisor.workers import reward_stats_keys
from rlpipe.telemetry.progress import Status
from rlpipe.worker.rewardnorm import RewardNormalizer

log = logging.getLogger("rlpipe")
REWARD_STATS_S = 10.0


class RunMetrics:
    def __init__(
        self, spec: RunSpec, run_dir: Path, run_id: str, t0: float, services: Services, fleet: Fleet, mode: RunMode
    ):
        self.spec = spec
        self.run_dir = run_dir
        self.t0 = t0
        self.services = services
        self.fleet = fleet
        self.mode = mode
        self.rnorm_keys = reward_stats_keys(spec, run_id)
        self.resources = ResourceSampler(
            os.getpid(),
            run_id,
            run_dir,
            spec.logging.resources_interval_s,
            self._process_roles,
            self._redis_url,
            t0,
            env_leaks=self._env_leaks,
        )
        self.resources_charted_at: float | None = None
        self.learner = None  # learner.central.CentralLearner, once built
        self.chart_mark = (0, t0)  # (env steps, time) of the last charts/sps sample
        self.round_mark = (0, 0)  # (rounds, rows served) at the last charts/rows_per_round
        self.loss_std_marks: dict[str, float] = {}
        self.health_timer = Every(spec.logging.health_interval_s)
        self.reward_stats_timer = Every(REWARD_STATS_S)
        self.all_ready_at: float | None = None
        self.startup_cpu: dict[str, float] | None = None  # CPU seconds used by then (fleet.cpu_seconds)
        self.loop_end: float | None = None  # monotonic end of the stepping loop
        self.loop_end_steps = 0
        self.active_envs_end: int | None = None

    @property
    def tb(self):
        return self.services.tb

    def progress(self) -> float:
        spec = self.spec
        fractions = []
        if spec.run.total_env_steps:
            fractions.append(self.learner.global_env_steps / spec.run.total_env_steps)
        if spec.run.duration_s:
            fractions.append((time.monotonic() - self.t0) / spec.run.duration_s)
        return min(1.0, max(fractions))

    # -- while the run goes ------------------------------------------------------------------
    def log_update(self, stats) -> None:
        if stats is None:
            return
        self.tb.scalars(
            self.learner.counters.env_steps,
            {
                "losses/policy": stats.policy_loss,
                "losses/value": stats.value_loss,
                "losses/entropy": stats.entropy,
                "losses/approx_kl": stats.approx_kl,
                "losses/clipfrac": stats.clipfrac,
                "losses/total": stats.total_loss,
                "charts/learning_rate": self.learner.learning_rate,
            },
        )
        self._loss_std_marks(self.progress())

    def _loss_std_marks(self, progress: float) -> None:
        """Loss-std marks: the std of the total loss over the last window of updates when the
        run passes each configured fraction (the original system's 12/24/36 h). summary.json
        keeps its key `loss_std_checkpoints` for them (a public interface)."""
        lc = self.spec.learner
        window = self.learner.counters.recent_losses  # the last loss_std_window updates
        for f in lc.loss_std_at:
            key = f"{f:g}"
            if key not in self.loss_std_marks and progress >= f and len(window) >= 2:
                self.loss_std_marks[key] = round(float(np.std(window)), 6)
                self.tb.scalars(self.learner.counters.env_steps, {f"losses/std_at_{key}": self.loss_std_marks[key]})

    def charts(self, now: float) -> float:
        """The periodic TensorBoard charts; returns the sps of the window since the last call."""
        c = self.learner.counters
        last_steps, last_t = self.chart_mark
        # The first window starts at this start's first step: before it (start-up, and the
        # start-up of a resumed run at its resumed step) nothing was measured, and a 0 charted
        # there read as a run that stalled
        if c.first_step_at is not None:
            last_t = max(last_t, c.first_step_at)
        sps = (c.env_steps - last_steps) / max(now - last_t, 1e-9) if c.first_step_at is not None else 0.0
        self.chart_mark = (c.env_steps, now)
        values = {"charts/sps": sps} if c.first_step_at is not None else {}
        if c.rounds > self.round_mark[0]:  # the rows an inference round served (gathering.py)
            values["charts/rows_per_round"] = (c.rows_served - self.round_mark[1]) / (c.rounds - self.round_mark[0])
            self.round_mark = (c.rounds, c.rows_served)
        values |= {
            "envs/active": self.fleet.active_envs(now),
            "board/torn_retries": c.torn_retries,
            "charts/episodes": c.episodes,
            "learner/dropped_rollouts": c.dropped_rollouts,
            "learner/trained_samples": c.trained_samples,
        }
        for name, rets in self.learner.recent_returns.items():
            if rets:
                values[f"charts/episodic_return/{name}"] = float(np.mean(rets))
                rets.clear()
        for name, (p50, p99) in self.learner.latency_percentiles().items():
            values[f"latency/step_ms/{name}/p50"] = p50
            values[f"latency/step_ms/{name}/p99"] = p99
        self.tb.scalars(c.env_steps, values)
        return sps

    def status(self, now: float, sps: float) -> Status:
        c = self.learner.counters
        return Status(
            stage=self.spec.stage,
            elapsed_s=now - self.t0,
            env_steps=c.env_steps,
            sps=sps,
            updates=c.updates,
            env_count=self.spec.env_count,
            active=self.fleet.active_envs(now),
            dormant=sum(h.n for h in self.fleet.handles if not h.awake),
            memory_mb=self.resources.last_bytes / 2**20 if self.resources.last_bytes else None,
            returns={k: float(np.mean(v)) if v else None for k, v in c.returns.items()},
        )

    def health_charts(self, now: float) -> None:
        """Every logging.health_interval_s: the memory curves, the resource figures and the watchdog's
        health/ scalars."""
        if self.health_timer.due(now):
            self._memory_curves()
            self._resource_charts()
            self.tb.scalars(self.learner.counters.env_steps, self.fleet.watchdog.health_scalars())

    # -- resources: who the sampler's pids are, and its latest sample charted ------------------
    def _process_roles(self) -> dict[int, str]:
        """The pids of the forkserver, the embedded Redis, the PPO update process and the
        workers (sampler thread)."""
        roles = {h.proc.pid: "workers" for h in list(self.fleet.handles) if h.proc is not None}
        if self.fleet.forkserver_pid is not None:
            roles[self.fleet.forkserver_pid] = "forkserver"
        update = getattr(self.learner, "update_process", None)  # a rank's learner has none
        if update is not None and update.pid is not None:
            roles[update.pid] = "update"  # its RSS, fds and threads get long-run verdicts too
        proc = self.services.redis.proc if self.services.redis is not None else None
        if proc is not None:
            roles[proc.pid] = "redis"
        return roles

    def _env_leaks(self) -> dict[int, int]:
        """pid -> the bytes its envs leak on purpose, from each worker's header (sampler thread)."""
        return {h.proc.pid: h.views.load(H_ENV_LEAK) for h in list(self.fleet.handles) if h.proc is not None}

    def _redis_url(self) -> str | None:
        return self.services.redis.url if self.services.redis is not None else None

    def _resource_charts(self) -> None:
        """The sampler's newest sample under resources/, once (a slow sampler is not repeated)."""
        at = self.resources.latest_at
        if at is None or at == self.resources_charted_at:
            return
        self.resources_charted_at = at
        self.tb.scalars(
            self.learner.counters.env_steps,
            {f"resources/{name}": value for name, value in self.resources.latest.items()},
        )

    def _memory_curves(self) -> None:
        """Memory of the whole run (PSS, sampled by the resource sampler) and each worker's RSS
        from its Redis beat: the original system's RSS curves, per worker group."""
        # before the sampler's first sample there is no figure: a 0 charted then read as a
        # run of no memory (a short run's only points were such zeros)
        values = {"memory/pss_mb": self.resources.last_bytes / 2**20} if self.resources.last_bytes else {}
        try:
            pipe = self.services.rcli.pipeline(transaction=False)
            for h in self.fleet.handles:
                pipe.hget(worker_key(self.fleet.run_id, h.worker_id), "rss_mb")
            rss = [float(v) for v in pipe.execute() if v is not None]
        except redis.RedisError:
            rss = []  # Redis down: this sample has no worker RSS; PSS is read from /proc anyway
        if rss:
            values.update({"workers/rss_mb_max": max(rss), "workers/rss_mb_mean": float(np.mean(rss))})
        self.tb.scalars(self.learner.counters.env_steps, values)

    def error_report(self) -> None:
        """The error aggregator's top stack traces, as TensorBoard text."""
        self.tb.text("errors/top10", self.fleet.errors.text_for_tensorboard(), self.learner.counters.env_steps)

    def reward_stats(self, now: float) -> None:
        """Every REWARD_STATS_S: global reward statistics merged from the workers' synced states."""
        if not self.reward_stats_timer.due(now):
            return
        try:
            states = [v for v in self.services.rcli.mget(self.rnorm_keys) if v]
        except redis.RedisError:
            return  # Redis down: no reward_norm scalars this interval, the next one tries again
        if states:
            count, mean, var = RewardNormalizer.merge(states)
            self.tb.scalars(
                self.learner.counters.env_steps,
                {"reward_norm/count": count, "reward_norm/mean": mean, "reward_norm/std": var**0.5},
            )

    def scaling_charts(self) -> None:
        """The learner's scaling weights: their histogram and each type's mean."""
        step = self.learner.counters.env_steps
        self.tb.histogram("scaling/weight", self.learner.weights(), step)
        self.tb.scalars(step, {f"scaling/mean_weight/{k}": v for k, v in self.learner.weights_by_type().items()})

    def loop_ended(self) -> None:
        """The stepping loop is over: every rate of the summary stops here."""
        self.loop_end = end = time.monotonic()
        self.loop_end_steps = self.learner.counters.env_steps
        self.active_envs_end = self.fleet.active_envs(end)
        self.resources.sample()

    # -- the end -----------------------------------------------------------------------------
    def summary(self, teardown_end: float, resumed_from_step: int) -> dict:
        """Every rate and the loss window stop at the end of the stepping loop; `teardown_s`
        (worker stop, final checkpoint, export, services) is reported apart."""
        end = self.loop_end
        c = self.learner.counters
        first = c.first_step_at
        stepping_s = end - first if first else 0.0
        half = self.t0 + (end - self.t0) / 2
        late_losses = [loss for t, loss in c.losses if half <= t <= end]
        faults = fault_counts(self.run_dir / "lifecycle.sqlite")
        randoms = random_return.read_results(self.run_dir)
        starts = random_return.read_results(self.run_dir, random_return.INITIAL_FILE)
        faults["lifecycle_dropped"] = self.fleet.lifecycle_dropped
        steps = self.loop_end_steps
        fleet = self.fleet
        return {
            "stage": self.spec.stage,
            "env_count": self.spec.env_count,
            "env_types": fleet.plan.counts(),
            "active_envs_end": self.active_envs_end,
            "env_steps": steps,
            "wall_s": round(end - self.t0, 3),
            # t0 on the wall clock (TensorBoard's time base): the origin of every *_s figure here
            "started_at_unix": round(time.time() - (time.monotonic() - self.t0), 3),
            "teardown_s": round(teardown_end - end, 3),
            "sps": round((steps - resumed_from_step) / stepping_s, 1) if stepping_s > 0 else 0.0,
            "startup_first_step_s": round(first - self.t0, 3) if first else None,
            "all_envs_ready_s": round(self.all_ready_at - self.t0, 3) if self.all_ready_at else None,
            "startup_cpu_s": self.startup_cpu,
            "updates": c.updates,
            "trained_samples": c.trained_samples,
            "episodes": c.episodes,
            # crash loops said loudly (issue 49): each type that finished no episode, with its faults
            "types_without_episodes": types_without_episodes(self.run_dir / "lifecycle.sqlite", c.episodes_by_type)
            if steps
            else {},
            "mean_return_last100": {k: (round(float(np.mean(v)), 3) if v else None) for k, v in c.returns.items()},
            "random_return": {k: round(v["mean"], 3) for k, v in randoms.items() if v.get("mean") is not None},
            # only the samples the verdicts use (a sample with a cut episode is its short episodes)
            "initial_policy_return": {
                k: round(v["mean"], 3) for k, v in starts.items() if random_return.whole_sample(v)
            },
            "mean_return_first100": {
                k: (round(float(np.mean(v)), 3) if v else None) for k, v in c.first_returns.items()
            },
            "not_measured": random_return.not_measured(self.run_dir, list(c.returns), self.spec.logging),
            "learned": {
                k: random_return.verdict(
                    list(v), c.first_returns[k], c.episodes_by_type[k], randoms.get(k), starts.get(k)
                )
                for k, v in c.returns.items()
            },
            "peak_rss_mb": round(self.resources.peak_bytes / 2**20, 1) if self.resources.peak_bytes else None,
            "shm_bytes": sum(h.layout.size for h in fleet.handles if h.generation > 0),
            "faults": faults,
            "board": {"torn_retries": c.torn_retries},
            # the process layout as resolved (auto: from this machine) and, under learner_core,
            # when the update's CPU became its own, and how (the workers' cgroup weight, or
            # the workers pinned off it)
            "layout": {
                **self.spec.layout.as_dict(),
                "workers_pinned_s": (round(fleet.pinned_at - self.t0, 3) if fleet.pinned_at is not None else None),
                "learner_core_by": (
                    None if fleet.pinned_at is None else "weight" if fleet.learner_by_weight else "pinning"
                ),
            },
            # the update's shape as resolved (auto: from the mix, rlpipe/mix_learner.py) and how
            "learner": {
                **{key: getattr(self.spec.learner, key) for key in mix_learner.MIX_KEYS},
                "from": dict(self.spec.learner_from),
            },
            "cgroup_driver": fleet.cgroups.name if fleet.cgroups else "none",
            "redis": self.services.redis.mode,
            "env_versions": {k: [v] for k, v in fleet.versions.items()},
            "loss_std": round(float(np.std(late_losses)), 6) if len(late_losses) > 1 else None,
            "loss_std_checkpoints": self.loss_std_marks,  # the public key keeps its name
            "resumed_from_step": resumed_from_step,
            "dist": self.mode.summary_section(),
            "long_run": self.long_run(),
        }

    def long_run(self) -> dict | None:
        """Each resource figure's slope per hour over the second half of the stepping loop,
        projected to `logging.project_to_s` (null: the run's own duration), and its verdict
        (rlpipe.telemetry.longrun); None for a loop shorter than `logging.long_run_min_s`."""
        lg = self.spec.logging
        end_s = self.loop_end - self.t0
        if end_s < lg.long_run_min_s:
            return None
        project_to_s = lg.project_to_s or self.spec.run.duration_s or end_s
        from rlpipe.telemetry.longrun import long_run

        return long_run(list(self.resources.history), end_s, project_to_s, self.resources.budgets())

    def write(self, result: dict, stop_signal: int | None) -> None:
        """summary.json, the hparams run (rank 0), the health report and the line on stdout."""
        atomic_write(self.run_dir / "summary.json", json.dumps(result, indent=2) + "\n")
        steps_per_env = (result["env_steps"] - result["resumed_from_step"]) / max(1, result["env_count"])
        for name, faults in result.get("types_without_episodes", {}).items():
            if faults:
                log.warning(
                    "env type %s finished no episode in this run (%d env faults: a crash loop; see errors_top10.md)",
                    name,
                    faults,
                )
            else:  # a short run of long episodes (acrobot's 500 steps at day4's 7,000 envs on 2 CPUs)
                log.warning(
                    "env type %s finished no episode in this run: no env fault, and its episodes outlasted the "
                    "run (about %.0f steps an env)",
                    name,
                    steps_per_env,
                )
        if self.mode.writes_job_outputs:
            self._hparams(result)
        try:
            from rlpipe.telemetry.health import write_health_report

            write_health_report(self.run_dir)
        except Exception as exc:  # a report must never turn a finished run into a failure
            log.warning("health report failed: %s", exc, exc_info=space_error(exc) is None)
        if self.loop_end is not None:  # the whole shutdown, hparams and health report included
            result["teardown_s"] = round(time.monotonic() - self.loop_end, 3)
            try:
                atomic_write(self.run_dir / "summary.json", json.dumps(result, indent=2) + "\n")
            except OSError as exc:  # the summary written above stands, with the teardown until then
                log.warning("summary.json: teardown_s not updated: %s", exc)
        # a type that finished no episode has no return (null in summary.json), not "None"
        rets = ", ".join(f"{k} {'no episode' if v is None else v}" for k, v in result["mean_return_last100"].items())
        how = f"stopped by {signal.Signals(stop_signal).name}" if stop_signal else "done"
        stop = result.get("stopped_by") or {}
        if stop.get("signal") and stop.get("phase") == "teardown":  # it had reached its stop condition
            how = f"done ({stop['signal']} during the teardown)"
        print(
            f"rlpipe {self.mode.line_prefix}{how}: {result['env_steps']:,} env steps in {result['wall_s']:.0f} s "
            f"({result['sps']:,.0f} sps), {result['updates']} updates, return last 100: {rets}; "
            f"{self.run_dir / 'summary.json'}",
            flush=True,
        )

    def _hparams(self, result: dict) -> None:
        """The run's knobs and outcome in its own TensorBoard run (the hparams tab compares
        the jobs of a multirun side by side)."""
        spec = self.spec
        hparams = {
            "env_count": spec.env_count,
            "env_mix": "+".join(t.name for t in spec.env_types),
            "scaling": spec.scaling.enabled,
            "reward_norm": spec.reward_norm.mode,
            "buffer_sync": spec.buffer.sync,
            "learning_rate": spec.learner.learning_rate,
            "rollout_len": spec.learner.rollout_len,
            "stage": spec.stage or "-",
        }
        metrics = {
            "hparams/sps": result["sps"],
            "hparams/updates": result["updates"],
            "hparams/loss_std": result["loss_std"] if result["loss_std"] is not None else float("nan"),
        }
        for name, value in result["mean_return_last100"].items():
            if value is not None:
                metrics[f"hparams/return/{name}"] = value
                if name in result["random_return"]:
                    metrics[f"hparams/return_over_random/{name}"] = value - result["random_return"][name]
        from rlpipe.telemetry.tb import TbWriter

        tb = TbWriter(self.run_dir, None)
        tb.hparams(hparams, metrics)
        tb.text(
            "learning/per_type",
            "\n".join(
                f"{name}: return {result['mean_return_last100'][name]}, random "
                f"{result['random_return'].get(name, 'unknown')}: {verdict}"
                for name, verdict in result["learned"].items()
            ),
            result["env_steps"],
        )
        tb.close()


def types_without_episodes(db_path, episodes_by_type: dict) -> dict[str, int]:
    """Each env type that finished no episode -> its env faults (crashes, contract
    violations, hangs) in the lifecycle db."""
    stuck = [name for name, n in episodes_by_type.items() if not n]
    if not stuck:
        return {}
    counts = event_counts(db_path)
    kinds = {FAULT_KINDS["env_crashes"], FAULT_KINDS["env_hangs"], FAULT_KINDS["quarantined"]}
    return {name: sum(n for (kind, t), n in counts.items() if t == name and kind in kinds) for name in stuck}
