"""The driver: starts the services and workers, runs central inference and PPO in its main
thread, watches the workers, and tears everything down on every way out.

It orchestrates four parts, each None inside until started so teardown needs no guesses: the
`SliceEngine` (its services: Redis, ZMQ, the lifecycle log, the TensorBoard writer; its fleet
of worker processes; every move through shared memory: rlpipe/supervisor/engine.py), the
learner, `Checkpointing` and `RunMetrics` (charts and summary.json). What differs between a single
process and a torchrun rank is asked of its run mode (rlpipe.supervisor.runmode).

Exit codes: 0 when the run reached its stop condition, 128 + signal number when a signal
(SIGINT, SIGTERM) ended it early; cleanup runs the same either way. 2 (bad config or
checkpoints) and 3 (a torchrun rank lost its peers) come from rlpipe.app. 4 (EXIT_STALL) when
the stall detector found the loop stuck for `run.stall_timeout_s` (rlpipe.supervisor.stall):
stacks in `stall_stacks.txt`, an emergency cleanup instead of the teardown, checkpoints kept.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

import psutil

from rlpipe import heap, mix_learner
from rlpipe.cadence import Every
from rlpipe.chaos_faults import FreezeDriver
from rlpipe.config import RunSpec
from rlpipe.envs import random_return
from rlpipe.envs.registry import MixPlan
from rlpipe.learner.budget import check_memory_budget
from rlpipe.learner.checkpoint import checkpoint_files
from rlpipe.supervisor import stopping
from rlpipe.supervisor.checkpointing import Checkpointing
from rlpipe.supervisor.diskfull import disk_full_reason, end_disk_full, release_reserve
from rlpipe.supervisor.engine import SliceEngine
from rlpipe.supervisor.evaluation import Evaluation
from rlpipe.supervisor.metrics import RunMetrics
from rlpipe.supervisor.runmode import RunMode
from rlpipe.supervisor.stall import LIFECYCLE_FLUSH_S, LoopMarks, StallWatch, emergency_cleanup
from rlpipe.supervisor.stopping import StopRecord, StopRequested
from rlpipe.supervisor.watchdog import SUPERVISE_S
from rlpipe.supervisor.workers import group_ranges
from rlpipe.telemetry.progress import Progress

log = logging.getLogger("rlpipe")
# The periodic charts (sps, returns and step latency per type: ~45 scalars) every 2 s for the
# run's first 10 minutes, every 10 s after: a soak at 2 s wrote 6.3 MB of TensorBoard an hour,
# 0.9 GB in six days, most of it latency/ points no one reads at that density.
TB_INTERVAL_S = 2.0
TB_DETAIL_S = 600.0
TB_LONG_INTERVAL_S = 10.0
_first_job_in_process = True


def charts_interval_s(elapsed_s: float) -> float:
    """The periodic charts' cadence at `elapsed_s` into the run."""
    return TB_INTERVAL_S if elapsed_s < TB_DETAIL_S else TB_LONG_INTERVAL_S


class Driver:
    def __init__(self, spec: RunSpec, run_dir: Path, config_yaml: str, mode: RunMode):
        self.spec = spec
        self.mode = mode  # runmode.Solo, or rlpipe.ranks.run.Ranks under torchrun
        heap_line = heap.configure(spec.run.mmap_threshold_mb, spec.run.malloc_arena_max, spec.run.trim_threshold_mb)
        if heap_line:
            log.warning(heap_line)
        self.run_dir = run_dir
        self.config_yaml = config_yaml
        # The run's clock starts when the driver process started (interpreter, imports and config
        # composition included): start-up figures are what a user waits, not what is convenient.
        # Later jobs of a multirun share the process, so theirs starts here.
        global _first_job_in_process
        since_start = max(0.0, time.time() - psutil.Process().create_time())
        self.t0 = time.monotonic() - (since_start if _first_job_in_process else 0.0)
        first_job, _first_job_in_process = _first_job_in_process, False
        self.run_id = mode.new_run_id()
        self.stop_signal: int | None = None
        self.stop = StopRecord()  # when and where the stop signal came (rlpipe.supervisor.stopping)
        self.disk_full: str | None = None  # what a write failed for space on (rlpipe.supervisor.diskfull)
        self.plan: MixPlan | None = None
        self.learner = None  # learner.central.CentralLearner
        self.random_probe = None  # the child measuring each type's random-action return
        self.started = False  # services and workers up: a final checkpoint makes sense
        self.freeze_at: float | None = None  # chaos.freeze_driver_at_s: set by the first checkpoint
        self.engine = SliceEngine(spec, run_dir, self.run_id, self.t0, self._phase, first_job)
        self.services, self.fleet = self.engine.services, self.engine.fleet
        self.checkpointing = Checkpointing(spec, run_dir, self.run_id, config_yaml, self.t0)
        self.metrics = RunMetrics(spec, run_dir, self.run_id, self.t0, self.services, self.fleet, mode)
        # evaluation during training (eval.interval_s), by the process charting the job (rank 0)
        self.evaluation = Evaluation(spec, run_dir, self.t0, self.services, on=mode.writes_job_outputs)
        self.supervise_timer = Every(SUPERVISE_S)  # workers, chaos, Redis, scaling, reward stats, checkpoints
        self.charts_timer = Every(TB_INTERVAL_S)
        self.scaling_timer = Every(spec.scaling.publish_interval_s)
        self.marks = LoopMarks()  # the loop's progress, read by the stall watch
        self.stall = StallWatch(
            spec.run.stall_timeout_s, run_dir, self.marks, self._emergency_cleanup, self._record_stall
        )

    # -- signals -----------------------------------------------------------------------------
    def _on_signal(self, signum, _frame) -> None:
        if self.stop_signal is None:  # a second signal changes nothing: the stop is under way
            self.stop_signal = signum
            self.stop.came(self.started, time.monotonic() - self.t0)

    def install_signals(self) -> None:
        if stopping.pending() is not None:  # came while the app composed the config
            self._on_signal(stopping.pending(), None)
            self.stop.at_s = stopping.pending_at_s()
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    # -- setup -------------------------------------------------------------------------------
    def _phase(self, what: str) -> None:
        log.info("startup: %s at %.2f s", what, time.monotonic() - self.t0)
        self._stop_if_asked(what)

    def _stop_if_asked(self, phase_done: str) -> None:
        """Between start-up phases: a stop signal starts nothing more (the teardown takes what is up)."""
        self.stop.last_phase = phase_done
        if self.stop_signal is not None and not self.started:
            raise StopRequested(self.stop_signal, phase_done)

    def setup(self) -> None:
        spec, engine = self.spec, self.engine
        self._stop_if_asked("config composed")
        self.plan = engine.describe()
        check_memory_budget(spec, self.plan, group_ranges(spec.env_count, spec.groups.size))
        self._phase("env types described")
        self._phase(f"layout: {spec.layout.describe()}")  # what groups.size=auto & co. chose
        log.info("learner: %s", mix_learner.describe(spec.learner, spec.learner_from))  # and learner.*=auto
        # a stop signal while an external Redis is waited for ends the wait (a StopRequested)
        engine.start_services(self.mode.redis_fields(), lambda: self._stop_if_asked(self.stop.last_phase))
        self._phase(f"redis ({self.services.redis.mode}) up")
        if spec.run.resume:  # true or auto: the workers' reward statistics must be in Redis before they start
            self._build_learner()
        engine.start_workers()
        if self.learner is None:
            self._build_learner()  # while the hot workers build their envs
        if not self.learner.random and self.mode.writes_job_outputs:
            # the untrained policy is measured only before it has trained: a resumed run keeps
            # the figures of its first start (rlpipe/envs/random_return.py)
            fresh = self.checkpointing.resumed_from_step == 0
            from rlpipe.learner.initial_return import InitialPolicy  # torch is imported by now

            self.random_probe = random_return.start(
                self.fleet.ctx,
                {t.name: t.node for t in spec.env_types},
                self.run_dir,
                spec.logging.random_return_episodes,
                spec.logging.random_return_budget_s,
                spec.run.seed + 99,
                InitialPolicy.of(self.learner, spec) if fresh and spec.logging.initial_policy_episodes else None,
                self.fleet.cgroups.memory_paths(),  # the workers' memory limit (rlpipe.supervisor.memory)
                keep_measured=not fresh,  # a resumed run keeps its first start's random figures too
            )
        self.metrics.resources.start()
        self.services.set_state("running")
        self.started = True

    def _build_learner(self) -> None:
        # torch (and, in start_tensorboard, TensorBoard) is imported only now, not at module
        # level: a second of imports that the hot workers spend building their envs instead of waiting.
        import torch

        torch.set_num_threads(self.spec.learner.torch_threads)
        self.learner = self.mode.make_learner(self.spec, self.plan)
        self.metrics.learner = self.learner
        if self.spec.run.resume:
            self.checkpointing.resume(self.learner, self.services.rcli, required=self.spec.run.resume is True)
            self.metrics.chart_mark = (self.learner.counters.env_steps, time.monotonic())
        self.mode.start_learner(self.learner, resumed=self.checkpointing.resumed_from_step > 0)
        self.learner.prepare_updates()  # the update process starts while the workers build envs
        self.services.start_tensorboard(self.config_yaml, self.mode)
        versions = self.engine.versions
        self.services.tb.text("env_versions", "\n".join(f"{k}: {v}" for k, v in versions.items()))
        self._phase("learner built")

    # -- the loop ----------------------------------------------------------------------------
    def _freeze_at(self, first_checkpoint: float) -> float | None:
        """When chaos.freeze_driver_at_s freezes the loop: counted from the run's first
        checkpoint (start-up and the first update on a loaded machine take from a few to tens
        of seconds, and the freeze is for a loop a restart can resume); never in a resumed run."""
        return FreezeDriver.due_at(self.spec.chaos, first_checkpoint, bool(self.checkpointing.resumed_from_step))

    def loop(self) -> None:
        spec, learner, engine, fleet, metrics, marks = (
            self.spec,
            self.learner,
            self.engine,
            self.fleet,
            self.metrics,
            self.marks,
        )
        with Progress(
            spec.logging.progress_interval_s,
            spec.run.total_env_steps,
            spec.run.duration_s,
            self.run_dir / "lifecycle.sqlite",
        ) as progress:
            while self.stop_signal is None:
                now = time.monotonic()
                if self.mode.should_stop(learner, now - self.t0):
                    break
                if not marks.serving:
                    marks.alive_at = now  # start-up: the loop turning is progress until it serves
                if self.freeze_at is not None and now >= self.freeze_at:
                    marks.phase = "chaos.freeze_driver_at_s"
                    FreezeDriver.freeze_driver(self.services.lifecycle, now - self.t0)
                poll_ms = 10
                if engine.has_ready and learner.updating and learner.backlogged:
                    # everything waits for the running update: return the moment it ends
                    # rather than at the end of a doorbell poll (rings keep in their done words)
                    marks.phase = "waiting for the PPO update (backlog held)"
                    learner.wait_update(0.01)
                    poll_ms = 0
                # A finished update hands its weights to the actor and the waiting batch
                # starts training at once: neither waits for the next doorbell poll.
                marks.phase = "taking the finished PPO update"
                stats = learner.poll_update()
                if stats is not None:
                    marks.updated_at = now
                metrics.log_update(stats)
                if self.mode.checkpoint_after_update(learner):
                    self.checkpointing.timer.restart(now)
                    self._checkpoint()
                if learner.update_due:
                    learner.start_update()
                    poll_ms = 0
                marks.phase = "taking doorbells, starting workers"
                engine.poll(now, poll_ms, gather=True)  # woken by the ring that can make a round due
                # while the learner is backlogged the ready slices wait (held) in the engine, and
                # while most workers still step a slice they wait for more (gathering.py)
                rnd = engine.recv() if not learner.backlogged and engine.serve_due(now) else None
                if rnd is not None:
                    marks.phase = "serving inference"
                    engine.send(rnd.slots, learner.act(rnd))
                    learner.observe(rnd)  # while the workers step
                    marks.served_at, marks.serving = now, True
                    if metrics.all_ready_at is None and fleet.all_slices_stepped:
                        # after the serve that counted them: never before the learner's first step
                        metrics.all_ready_at = time.monotonic()
                        metrics.startup_cpu = fleet.cpu_seconds()
                        fleet.startup_over(metrics.all_ready_at)  # learner_core: workers off its CPU
                if learner.update_due:
                    learner.start_update()
                if self.supervise_timer.due(now):
                    marks.phase = "supervising (workers, Redis, checkpoints)"
                    self._supervise(now)
                if self.charts_timer.due(now):
                    self.charts_timer.interval = charts_interval_s(now - self.t0)
                    marks.phase = "charts"
                    progress.update(metrics.status(now, metrics.charts(now)))
            metrics.charts(time.monotonic())  # the last partial window too

    def _supervise(self, now: float) -> None:
        """Once a second: keep the workers and Redis up, publish exploration rates, chart
        health and reward statistics, and take the periodic checkpoint."""
        spec, learner, fleet, services, metrics = self.spec, self.learner, self.fleet, self.services, self.metrics
        self.engine.supervise(now)  # workers and Redis
        services.lifecycle.check()  # a lost record stops the run: never silently
        metrics.health_charts(now)
        self.evaluation.poll()
        self.evaluation.maybe_start(now, learner)
        if fleet.errors.maybe_run(now):
            metrics.error_report()
        if spec.scaling.enabled and self.scaling_timer.due(now):
            fleet.publish_epsilons(learner)
            metrics.scaling_charts()
        if spec.reward_norm.mode != "off":
            metrics.reward_stats(now)
        if self.mode.checkpoint_on_clock(learner, self.checkpointing.timer, now):
            self._checkpoint()

    def _checkpoint(self) -> Path:
        """A checkpoint once the update in flight (if any) is in and charted."""
        self.metrics.log_update(self.learner.poll_update(wait=True))
        path = self.checkpointing.save(self.learner, self.services.rcli)
        if self.freeze_at is None:
            self.freeze_at = self._freeze_at(time.monotonic())
        return path

    def _export(self) -> Path:
        self.metrics.log_update(self.learner.poll_update(wait=True))
        return self.checkpointing.export(self.learner)

    # -- a stalled loop ----------------------------------------------------------------------
    def _emergency_cleanup(self) -> None:
        """The stall watch's cleanup: names read from attributes, no lock taken (the loop may
        hold any of them)."""
        cgroups = self.fleet.cgroups
        emergency_cleanup(
            self.run_id, self.services.sock_dir, self.run_dir, cgroups.cleanup if cgroups is not None else None
        )

    def _record_stall(self, detail: dict) -> None:
        """The stall as a lifecycle row: record() only queues (the writer is its own thread);
        the flush waits for the commit, bounded, as the process exits right after."""
        lifecycle = self.services.lifecycle
        if lifecycle is not None:
            lifecycle.record("driver_stall", detail=detail)
            lifecycle.flush(LIFECYCLE_FLUSH_S)

    # -- teardown ----------------------------------------------------------------------------
    def teardown(self) -> None:
        """Every resource of the run, in reverse order of creation; each step guarded so one
        failure cannot leave the rest behind. A second call finds nothing left to do."""
        started, self.started = self.started, False  # one final checkpoint and export
        learner, mode = self.learner, self.mode
        final = started and learner is not None and self.disk_full is None  # full: keep the last good one
        steps = [
            lambda: mode.join_update_in_flight(learner),
            lambda: random_return.stop(self.random_probe),
            self.evaluation.stop,
            *self.engine.stop_steps(
                between=[
                    self._final_error_report,
                    lambda: self._checkpoint() if final and not learner.random else None,
                    lambda: self._export() if final and self.spec.learner.export and mode.writes_job_outputs else None,
                    lambda: learner.close_updates() if learner is not None else None,
                    self.metrics.resources.stop,
                ]
            ),
        ]
        for i, step in enumerate(steps):
            self.marks.phase, self.marks.alive_at = f"teardown step {i + 1} of {len(steps)}", time.monotonic()
            try:
                step()
            except Exception as exc:
                full = disk_full_reason(exc)
                if full is None:
                    log.exception("teardown step failed")
                else:  # e.g. the final checkpoint or error report: a full disk, said once at the end
                    self.disk_full = self.disk_full or full
        mode.sweep_after_teardown()

    def _final_error_report(self) -> None:
        """Every worker has stopped and its error log been read a last time: the report."""
        if self.fleet.errors is not None and self.services.tb is not None:
            self.metrics.error_report()

    def run(self) -> int:
        self.install_signals()
        try:
            self.setup()
            self.stall.start()  # armed with the loop: start-up has its own timeouts
            self.loop()
            self.metrics.loop_ended()
        except StopRequested:
            pass  # a signal during start-up: what is up goes in the teardown below
        except Exception as exc:
            self.disk_full = disk_full_reason(exc)  # a write failed for space: stop on purpose
            if self.disk_full is None:
                raise
            if self.learner is not None:
                self.metrics.loop_ended()  # the summary's rates end here
        finally:
            if self.stop_signal is not None:
                self.mode.say_stopping(self.stop_signal)  # before teardown: torchrun may SIGKILL us
            self.stop.tearing_down = True
            self.teardown()
            self.stall.stop()  # after the teardown: a hung teardown step is a stall too
        if self.disk_full is not None:
            release_reserve(self.run_dir)  # the space held for this summary
            summary = self._write_summary
            return end_disk_full(self.disk_full, checkpoint_files(self.checkpointing.dir), summary)
        self._write_summary()
        return 128 + self.stop_signal if self.stop_signal else 0

    def _write_summary(self) -> None:
        loop_end = self.metrics.loop_end
        end_s = (loop_end if loop_end is not None else time.monotonic()) - self.t0
        stop = self.stop.stopped_by(
            self.spec, self.learner, self.stop_signal, self.disk_full, end_s, loop_ran=loop_end is not None
        )
        if loop_end is None:  # stopped in start-up: nothing measured yet
            wall_s = time.monotonic() - self.t0
            return self.stop.short_summary(self.run_dir, stop, self.spec, self.checkpointing.resumed_from_step, wall_s)
        result = self.metrics.summary(time.monotonic(), self.checkpointing.resumed_from_step)
        result = self.mode.finish_summary({**result, "stopped_by": stop}, self.stop_signal, self.run_dir)
        self.metrics.write(result, self.stop_signal)
