"""The driver: starts the services and workers, runs central inference and PPO in its main
thread, watches the workers, and tears everything down on every way out.

Exit codes: 0 when the run reached its stop condition, 128 + signal number when a signal
(SIGINT, SIGTERM) ended it early; cleanup runs the same either way.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import logging
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import psutil
import redis
import zmq

import rlpipe
from rlpipe.config import RunSpec
from rlpipe.envs import random_return
from rlpipe.envs.registry import MixPlan, plan_mix, preload_modules
from rlpipe.learner.budget import check_memory_budget
from rlpipe.learner.slices import SliceRef
from rlpipe.files import atomic_write
from rlpipe.procs import pid_alive
from rlpipe.protocol import RING, epsilon_channel, reward_stats_key, run_key, worker_key
from rlpipe.redis_client import connect as redis_client
from rlpipe.shm.layout import H_AWAKE, H_LC_DROPPED
from rlpipe.shm.segment import new_run_id, run_segments, sweep_dead_segments
from rlpipe.supervisor.cgroups import make_driver as make_cgroup_driver
from rlpipe.supervisor.chaos import Chaos
from rlpipe.supervisor.errors import ErrorAggregator
from rlpipe.supervisor.groups import WakeSchedule
from rlpipe.lifecycle import LifecycleWriter, fault_counts
from rlpipe.supervisor.memory import PeakMemory
from rlpipe.supervisor.redis_service import RedisService
from rlpipe.supervisor.watchdog import Watchdog, redis_beat_times
from rlpipe.supervisor.workers import (BackgroundStarts, WorkerHandle, group_ranges, stop_workers,
                                       worker_context)
from rlpipe.telemetry.progress import Progress, Status
from rlpipe.worker.exploration import pack_epsilons
from rlpipe.worker.process import EXIT_RECYCLE
from rlpipe.worker.spec import RunWiring
from rlpipe.worker.rewardnorm import RewardNormalizer

log = logging.getLogger("rlpipe")
IPC_PATH_MAX = 100          # sun_path is 108 bytes; keep a margin for "ipc://" and names
ACTIVE_WINDOW_S = 10.0      # an env counts as active if its slice rang within this window
TB_INTERVAL_S = 2.0
_first_job_in_process = True


def current_refs(refs: list[SliceRef]) -> list[SliceRef]:
    """The rings still worth serving: a replaced generation's are dropped (its slot was held or
    parked while the worker was replaced) and each slice is served once, at its newest ring."""
    latest: dict[tuple[int, int], SliceRef] = {}
    for ref in refs:
        if ref.generation == ref.handle.generation:
            latest[(ref.handle.worker_id, ref.slice_index)] = ref
    return list(latest.values())


def git_commit() -> str:
    root = Path(rlpipe.__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return "nogit"
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "nogit"
    except (OSError, subprocess.TimeoutExpired):
        return "nogit"


def env_version(node: dict, commit: str) -> str:
    """Hash of the type's config + package version + git commit (docs/architecture.md)."""
    text = json.dumps(node, sort_keys=True, default=str) + rlpipe.__version__ + commit
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def socket_dir(run_dir: Path, run_id: str) -> Path:
    """The run dir when its socket paths fit in sun_path, else a short private dir in /tmp."""
    if len(str(run_dir / "act_w99999.ipc")) <= IPC_PATH_MAX:
        return run_dir
    path = Path("/tmp") / f"rlpipe_{run_id}"
    path.mkdir(mode=0o700)
    log.info("run dir path too long for unix sockets; sockets live in %s", path)
    return path


def multiprocessing_temp_dir(run_id: str) -> None:
    """multiprocessing keeps its forkserver's socket in a `pymp-*` temp dir it removes only at
    a clean exit: a driver killed with -9 would leave it in /tmp for good. Put it in a dir
    named after this driver (`rlpipe_<run_id>_mp`), which the next run's sweep of dead runs
    removes. Later jobs of a multirun keep the first job's: its forkserver still listens there.
    (`tempdir` in the process config is where multiprocessing.util.get_temp_dir looks first.)"""
    config = mp.process.current_process()._config
    if config.get("tempdir"):
        return
    path = Path("/tmp") / f"rlpipe_{run_id}_mp"
    path.mkdir(mode=0o700)
    config["tempdir"] = str(path)
    atexit.register(shutil.rmtree, path, True)


def sweep_dead_socket_dirs() -> None:
    for path in Path("/tmp").glob("rlpipe_*-*"):
        try:
            pid = int(path.name.split("_", 1)[1].split("-", 1)[0])
        except ValueError:
            continue
        if not pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)


class Driver:
    def __init__(self, spec: RunSpec, run_dir: Path, config_yaml: str, dist=None):
        self.spec = spec
        self.dist = dist            # rlpipe.dist.run.DistRun under torchrun, else None
        self.run_dir = run_dir
        self.config_yaml = config_yaml
        # The run's clock starts when the driver process started (interpreter, imports and config
        # composition included): start-up figures are what a user waits, not what is convenient.
        # Later jobs of a multirun share the process, so theirs starts here.
        global _first_job_in_process
        since_start = max(0.0, time.time() - psutil.Process().create_time())
        self.t0 = time.monotonic() - (since_start if _first_job_in_process else 0.0)
        _first_job_in_process = False
        self.run_id = new_run_id(dist.rank if dist is not None else None)
        self.stop_signal: int | None = None
        self.handles: list[WorkerHandle] = []
        self.plan: MixPlan | None = None
        self.redis: RedisService | None = None
        self.lifecycle: LifecycleWriter | None = None
        self.memory = PeakMemory(os.getpid(), interval_s=1.0)
        self.zctx = zmq.Context(io_threads=1)
        self.sock_dir: Path | None = None
        self.tb = None              # telemetry.tb.TbWriter, built with the learner
        self.learner = None         # learner.central.CentralLearner
        self.slice_seen: dict[tuple[int, int], float] = {}
        self.slice_first_step: dict[tuple[int, int], float] = {}
        self.all_ready_at: float | None = None
        self.versions: dict[str, str] = {}
        self.cgroups = None
        self.schedule: WakeSchedule | None = None
        self.watchdog: Watchdog | None = None
        self.next_redis_check = 0.0
        self.chaos: Chaos | None = None
        self.errors: ErrorAggregator | None = None
        self.resumed_from_step = 0
        self.started = False        # services and workers up: a final checkpoint makes sense
        self._chart_mark = (0, self.t0)   # (env steps, time) of the last charts/sps sample
        self.loss_std_marks: dict[str, float] = {}
        self.next_checkpoint = self.t0 + spec.learner.checkpoint_interval_s
        self.next_publish = 0.0
        self.next_rnorm_tb = 0.0
        self.next_memory_tb = 0.0
        self.unspawned: list[WorkerHandle] = []
        self.starts = BackgroundStarts()       # dormant workers' process starts
        self.random_probe = None    # the child measuring each type's random-action return
        self.lifecycle_dropped = 0      # workers' lifecycle events dropped at the ZMQ high-water mark
        self.redis_down_since: float | None = None   # wall time of a Redis restart not yet healed
        self.loop_end: float | None = None           # monotonic end of the stepping loop
        self.loop_end_steps = 0

    # -- signals -----------------------------------------------------------------------------
    def _on_signal(self, signum, _frame) -> None:
        self.stop_signal = signum

    def install_signals(self) -> None:
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    # -- setup -------------------------------------------------------------------------------
    def _build_learner(self) -> None:
        # torch and TensorBoard are imported here, not at module level: a second of imports
        # that the hot workers spend building their envs instead of waiting.
        import torch

        from rlpipe.learner.central import CentralLearner
        from rlpipe.telemetry.tb import TbWriter
        torch.set_num_threads(self.spec.learner.torch_threads)
        if self.dist is not None:
            self.learner = self.dist.make_learner(self.spec, self.plan)
        else:
            self.learner = CentralLearner(self.spec, self.plan)
        if self.spec.run.resume:
            self._resume()
            self._chart_mark = (self.learner.counters.env_steps, time.monotonic())
        if self.dist is not None:
            self.learner.start_in_sync(resumed=self.resumed_from_step > 0)
            self.tb = self.dist.make_tb(self.run_dir, self.config_yaml)
        else:
            self.tb = TbWriter(self.run_dir, self.config_yaml)
        self.tb.text("env_versions", "\n".join(f"{k}: {v}" for k, v in self.versions.items()))
        self._phase("learner built")

    def _phase(self, what: str) -> None:
        log.info("startup: %s at %.2f s", what, time.monotonic() - self.t0)

    def setup(self) -> None:
        spec = self.spec
        sweep_dead_segments()
        sweep_dead_socket_dirs()
        self.plan = plan_mix(spec.env_types, spec.env_count, spec.obs_keys)
        self.budget = check_memory_budget(spec, self.plan, group_ranges(spec.env_count, spec.groups.size))
        self._phase("env types described")
        commit = git_commit()
        self.versions = {t.name: env_version(t.node, commit) for t in spec.env_types}
        self.sock_dir = socket_dir(self.run_dir, self.run_id)
        self.redis = RedisService(spec.redis.url, self.sock_dir / "redis.sock", self.run_dir)
        self.redis.start()
        self._phase(f"redis ({self.redis.mode}) up")
        self.rcli = redis_client(self.redis.url)
        self.rcli.hset(run_key(self.run_id), mapping={
            "state": "starting", "pid": os.getpid(), "env_count": spec.env_count,
            "run_dir": str(self.run_dir),
            **({"job": self.dist.info.job_id, "rank": self.dist.rank, "world_size": self.dist.world,
                "env_id_offset": spec.env_id_offset} if self.dist is not None else {})})
        lifecycle_ep = f"ipc://{self.sock_dir}/lifecycle.ipc"
        self.lifecycle = LifecycleWriter(self.run_dir / "lifecycle.sqlite", lifecycle_ep, self.run_id,
                                         self.zctx)
        self.lifecycle.start()
        self.ready = self.zctx.socket(zmq.PULL)
        self.ready.setsockopt(zmq.LINGER, 0)
        self.ready.setsockopt(zmq.RCVHWM, 100_000)
        ready_ep = f"ipc://{self.sock_dir}/ready.ipc"
        self.ready.bind(ready_ep)

        if spec.run.resume:     # the workers' reward statistics must be in Redis before they start
            self._build_learner()
        multiprocessing_temp_dir(self.run_id)
        ctx = worker_context(spec.worker.start_method, preload_modules(spec.env_types))
        wiring = RunWiring(run_id=self.run_id, driver_pid=os.getpid(), ready_endpoint=ready_ep,
                           lifecycle_endpoint=lifecycle_ep, redis_url=self.redis.url,
                           type_versions=tuple(self.versions[t.name] for t in spec.env_types))
        self.ctx = ctx
        g = spec.groups
        ranges = group_ranges(spec.env_count, spec.groups.size)
        self.cgroups = make_cgroup_driver(g.cgroup, self.run_id, g.dormant_cpu_pct, g.dormant_mem_mb,
                                          n_groups=len(ranges))
        self.schedule = WakeSchedule(len(ranges), g)
        self.watchdog = Watchdog(spec.heartbeat, self.run_id, self.rcli, self.lifecycle)
        self.errors = ErrorAggregator(self.run_dir, spec.logging.aggregate_interval_s)
        hb = spec.heartbeat
        quiet = (self.t0 + spec.run.duration_s - hb.timeout_s - hb.term_grace_s - 2 * hb.scan_interval_s
                 if spec.run.duration_s else None)
        self.chaos = Chaos(spec.chaos, spec.run.seed, self.t0, self.lifecycle, self.redis,
                           self.watchdog.pending, quiet) if spec.chaos.enabled else None
        for k, (lo, hi) in enumerate(ranges):
            h = WorkerHandle(k, lo, hi, spec, self.plan, wiring, self.zctx,
                             f"ipc://{self.sock_dir}/act_w{k}.ipc")
            h.awake = self.schedule.awake[k]
            h.on_retire = self._retire
            self.handles.append(h)
        # Hot groups start now; dormant ones are started from the loop, so the first steps
        # are not queued behind a hundred forks on a busy machine.
        self.unspawned = [h for h in self.handles if not h.awake]
        for h in self.handles:
            if h.awake:
                self._spawn(h)
        self._phase(f"{len(self.handles) - len(self.unspawned)} hot workers started")
        if self.learner is None:
            self._build_learner()   # while the hot workers build their envs
        if not self.learner.random and (self.dist is None or self.dist.rank == 0):
            self.random_probe = random_return.start(
                ctx, {t.name: t.node for t in spec.env_types}, self.run_dir,
                spec.logging.random_return_episodes, spec.logging.random_return_budget_s, spec.run.seed + 99)
        self.memory.start()
        self.rcli.hset(run_key(self.run_id), "state", "running")
        self.started = True

    def _retire(self, old: WorkerHandle) -> None:
        """A generation's segment is about to go: keep what its worker counted there."""
        self.errors.remove_log(old.worker_id)
        self.lifecycle_dropped += old.views.load(H_LC_DROPPED)

    # -- checkpoints -------------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def _rnorm_keys(self) -> list[str]:
        n_workers = -(-self.spec.env_count // self.spec.groups.size)
        return [reward_stats_key(self.run_id, k) for k in range(n_workers)]

    def _resume(self) -> None:
        """Continue from the newest loadable checkpoint of this run directory; the workers'
        reward statistics go back into Redis before any worker starts, so they restore them."""
        from rlpipe.learner.checkpoint import load_latest
        found = load_latest(self.checkpoint_dir, validate=self.learner.check_compatible)
        if found is None:
            log.info("run.resume=true but %s holds no checkpoint: starting fresh", self.checkpoint_dir)
            return
        path, payload = found
        self.learner.restore(payload)
        self.resumed_from_step = self.learner.counters.env_steps
        for key, state in zip(self._rnorm_keys(), payload.get("reward_norm", [])):
            if state.numel():
                self.rcli.set(key, state.numpy().tobytes())
        log.info("resumed from %s at %d env steps", path.name, self.resumed_from_step)

    def _checkpoint(self) -> Path:
        import torch

        from rlpipe.learner.checkpoint import save_checkpoint
        self._log_update(self.learner.poll_update(wait=True))
        payload = self.learner.checkpoint_payload()
        try:
            # uint8 tensors: torch.load(weights_only=True) refuses raw bytes
            payload["reward_norm"] = [torch.tensor(np.frombuffer(v or b"", dtype=np.uint8))
                                      for v in self.rcli.mget(self._rnorm_keys())]
        except redis.RedisError:
            payload["reward_norm"] = []
            log.warning("checkpoint without reward statistics: Redis unreachable")
        return save_checkpoint(self.checkpoint_dir, self.learner.counters.env_steps, payload,
                               self.spec.learner.keep_checkpoints)

    def _export(self) -> Path:
        """export/policy.pt: the trained weights with the obs/action spec they expect and the
        run's config, loadable with torch.load(weights_only=True)."""
        import torch
        self._log_update(self.learner.poll_update(wait=True))
        path = self.run_dir / "export" / "policy.pt"
        path.parent.mkdir(exist_ok=True)
        exported = {"policy": self.learner.policy.state_dict(), "compat": self.learner.compat(),
                    "env_steps": self.learner.counters.env_steps, "config_yaml": self.config_yaml}
        return atomic_write(path, lambda f: torch.save(exported, f))

    def _after_update(self, progress: float) -> None:
        """Loss-std marks: the std of the total loss over the last window of updates when the
        run passes each configured fraction (the original system's 12/24/36 h). summary.json
        keeps its key `loss_std_checkpoints` for them (a public interface)."""
        lc = self.spec.learner
        losses = self.learner.counters.losses
        for f in lc.loss_std_at:
            key = f"{f:g}"
            if key not in self.loss_std_marks and progress >= f and len(losses) >= 2:
                window = [loss for _t, loss in losses[-lc.loss_std_window:]]
                self.loss_std_marks[key] = round(float(np.std(window)), 6)
                self.tb.scalars(self.learner.counters.env_steps,
                                {f"losses/std_at_{key}": self.loss_std_marks[key]})

    def _publish_scaling(self, now: float) -> None:
        """Exploration rates to each awake worker's channel; weights to TensorBoard."""
        if now < self.next_publish:
            return
        self.next_publish = now + self.spec.scaling.publish_interval_s
        try:
            pipe = self.rcli.pipeline(transaction=False)
            for h in self.handles:
                if h.awake:
                    pipe.publish(epsilon_channel(self.run_id, h.worker_id),
                                 pack_epsilons(h.env_lo, self.learner.epsilons(h.env_lo, h.env_hi)))
            pipe.execute()
        except redis.RedisError:
            pass          # the next publish carries the rates; workers keep the last ones
        step = self.learner.counters.env_steps
        self.tb.histogram("scaling/weight", self.learner.weights(), step)
        self.tb.scalars(step, {f"scaling/mean_weight/{k}": v
                                  for k, v in self.learner.weights_by_type().items()})

    def _reward_stats(self, now: float) -> None:
        """Global reward statistics merged from the workers' synced states (TensorBoard)."""
        if now < self.next_rnorm_tb:
            return
        self.next_rnorm_tb = now + 10.0
        try:
            states = [v for v in self.rcli.mget(self._rnorm_keys()) if v]
        except redis.RedisError:
            return        # Redis down: no reward_norm scalars this interval, the next one tries again
        if states:
            count, mean, var = RewardNormalizer.merge(states)
            self.tb.scalars(self.learner.counters.env_steps, {
                "reward_norm/count": count, "reward_norm/mean": mean, "reward_norm/std": var ** 0.5})

    # -- the loop ----------------------------------------------------------------------------
    def _progress(self) -> float:
        spec, c = self.spec, self.learner.counters
        fractions = []
        if spec.run.total_env_steps:
            fractions.append(self.learner.global_env_steps / spec.run.total_env_steps)
        if spec.run.duration_s:
            fractions.append((time.monotonic() - self.t0) / spec.run.duration_s)
        return min(1.0, max(fractions))

    def _spawn(self, h: WorkerHandle) -> None:
        """Start (or restart) a worker; a dormant group's worker joins its cgroup first thing."""
        paths = [] if h.awake else self.cgroups.dormant_paths(h.worker_id)
        h.spawn(self.ctx, paths, self.cgroups.active_paths())
        self.errors.add_log(h.worker_id, h.error_log)

    def _spawn_some(self) -> None:
        """In the loop's first turn (the hot workers are building by then): prepare every
        dormant worker and hand its start to the start threads. Every turn: take the
        processes they have started. (A loop turn lasts an inference round: starting a few
        per turn, in the loop's thread, made the dormant starts most of day4's start-up.)"""
        if self.unspawned:
            batch, self.unspawned = self.unspawned, []
            for h in batch:
                paths = [] if h.awake else self.cgroups.dormant_paths(h.worker_id)
                self.starts.submit(h, h.prepare(self.ctx, paths, self.cgroups.active_paths()))
                self.errors.add_log(h.worker_id, h.error_log)
        if self.starts.pending:
            self._take_started(self.starts.finished())
            if not self.unspawned and not self.starts.pending:
                self._phase(f"all {len(self.handles)} workers started")

    def _take_started(self, started, teardown: bool = False) -> None:
        failed = None
        for h, proc, exc in started:
            failed = failed or exc
            if proc is None:
                continue                       # its start failed, or teardown came first
            h.started(proc)
            if h.awake and not h.spawned_awake:
                # woken while its start was in flight: the wake found no process to move
                try:
                    self.cgroups.wake(h.worker_id, proc.pid)
                except OSError as exc:
                    log.warning("moving worker %d to the active cgroup failed: %s", h.worker_id, exc)
        if failed is not None and not teardown:
            raise failed                       # as a failed start in the driver's own thread

    def _replace(self, h: WorkerHandle, reason: str, detail: dict) -> None:
        self.lifecycle.record("worker_restart", worker_id=h.worker_id, generation=h.generation,
                              detail={"reason": reason, **detail})
        self.learner.drop_worker(h.worker_id)
        for s in range(len(h.bounds)):
            self.slice_seen.pop((h.worker_id, s), None)
        self._spawn(h)

    def _supervise(self, now: float) -> None:
        """Once a second: replace workers that exited, advance the watchdog, keep Redis up."""
        for h in self.handles:
            if h.worker_id in self.watchdog.pending or h.proc is None or h.proc.is_alive():
                continue
            h.proc.join()
            code = h.proc.exitcode
            reason = "rss" if code == EXIT_RECYCLE else "exited"
            self._replace(h, reason, {"exitcode": code})
        if self.chaos is not None:
            self.chaos.tick(self.handles, now)
        self.watchdog.scan(self.handles, now)
        for rep in self.watchdog.reap(now):
            self._replace(rep.handle, rep.reason, rep.detail)
        if now >= self.next_memory_tb:
            self.next_memory_tb = now + 10.0
            self._memory_curves()
            self.tb.scalars(self.learner.counters.env_steps, self.watchdog.health_scalars())
        if self.errors.maybe_run(now):
            self.tb.text("errors/top10", self.errors.text_for_tensorboard(), self.learner.counters.env_steps)
        if now >= self.next_redis_check:
            self.next_redis_check = now + 5.0
            if self.redis.restart_if_dead():
                self.watchdog.redis_restarted()
                self.lifecycle.record("redis_restart", detail={"url_kind": self.redis.mode})
                self.redis_down_since = time.time()
        if self.redis_down_since is not None:
            self._redis_recovered()

    def _redis_recovered(self) -> None:
        """A restarted Redis counts as recovered once every live worker has beaten into it
        again (a `redis_recovered` row), not when it merely answers a ping."""
        live = [h for h in self.handles if h.alive() and h.worker_id not in self.watchdog.pending]
        try:
            beats = redis_beat_times(self.rcli, self.run_id, [h.worker_id for h in live])
        except redis.RedisError:
            return
        if all(beats.get(h.worker_id, -1.0) >= self.redis_down_since for h in live):
            self.lifecycle.record("redis_recovered", detail={
                "since_restart_s": round(time.time() - self.redis_down_since, 3), "workers": len(live)})
            self.redis_down_since = None

    def _wake_due(self, now: float) -> list[SliceRef]:
        """Wake the groups the schedule says are due; return their parked rings."""
        if self.schedule.all_awake:
            return []
        min_steps = {h.worker_id: min(h.slice_seq) for h in self.handles if h.awake}
        refs = []
        for k in self.schedule.due(min_steps):
            h = self.handles[k]
            h.awake = True
            if h.views is not None:
                h.views.store(H_AWAKE, 1)      # before the move: a worker still joining looks again
            if h.alive():
                try:
                    self.cgroups.wake(k, h.proc.pid)
                except OSError as exc:
                    log.warning("moving worker %d to the active cgroup failed: %s", k, exc)
            self.lifecycle.record("group_wake", worker_id=k, generation=h.generation,
                                  detail={"envs": h.n, "wake": self.schedule.wakes})
            refs.extend(h.parked)
            h.parked = []
        return refs

    def active_envs(self, now: float) -> int:
        return sum(h.bounds[s][1] - h.bounds[s][0]
                   for h in self.handles if h.alive()
                   for s in range(len(h.bounds))
                   if now - self.slice_seen.get((h.worker_id, s), -1e9) <= ACTIVE_WINDOW_S)

    def loop(self) -> None:
        spec, learner = self.spec, self.learner
        by_id = {h.worker_id: h for h in self.handles}
        n_slices = sum(len(h.bounds) for h in self.handles)
        next_tb = next_check = time.monotonic()
        held: list[SliceRef] = []      # rings waiting while the learner is backlogged
        with Progress(spec.logging.progress_interval_s, spec.run.total_env_steps, spec.run.duration_s,
                      self.run_dir / "lifecycle.sqlite") as progress:
            while self.stop_signal is None:
                now = time.monotonic()
                c = learner.counters
                if self.dist is not None:
                    # ranks stop together, after an update round that says so (rlpipe.dist)
                    if spec.run.duration_s and now - self.t0 >= spec.run.duration_s:
                        learner.want_stop = True
                    if learner.finished:
                        break
                elif spec.run.total_env_steps and c.env_steps >= spec.run.total_env_steps:
                    break
                elif spec.run.duration_s and now - self.t0 >= spec.run.duration_s:
                    break
                refs = []
                poll_ms = 10
                if held and learner.updating:
                    # everything waits for the running update: return the moment it ends
                    # rather than at the end of a doorbell poll (doorbells keep in the socket)
                    learner.wait_update(0.01)
                    poll_ms = 0
                if self.ready.poll(poll_ms):
                    while True:
                        try:
                            w, s, gen, seq = RING.unpack(self.ready.recv(zmq.NOBLOCK))
                        except zmq.Again:
                            break
                        h = by_id.get(w)
                        if h is None or gen != h.generation:
                            continue           # a replaced generation's late doorbell
                        ref = SliceRef(h, s, seq, gen)
                        if not h.awake:
                            h.parked.append(ref)   # dormant: built, not stepped until its wake
                            continue
                        refs.append(ref)
                        h.slice_seq[s] = seq
                        self.slice_seen[(w, s)] = now
                        if seq == 1 and s == 0:
                            self.lifecycle.record("worker_ready", worker_id=w, generation=gen,
                                                  detail={"since_spawn_s": round(now - h.spawned_at, 3)})
                            if self.chaos is not None and h.spawned_awake:
                                self.chaos.heal_s = max(self.chaos.heal_s, now - h.spawned_at)
                        if seq > 0 and (w, s) not in self.slice_first_step:
                            self.slice_first_step[(w, s)] = now
                self._spawn_some()
                refs.extend(self._wake_due(now))
                if learner.backlogged:
                    held.extend(refs)
                    refs = []
                elif held:
                    refs, held = held + refs, []
                refs = current_refs(refs)
                if refs:
                    learner.serve(refs)
                    if self.all_ready_at is None and len(self.slice_first_step) == n_slices:
                        # after the serve that counted them: never before the learner's first step
                        self.all_ready_at = time.monotonic()
                if learner.update_due:
                    learner.start_update()
                self._log_update(learner.poll_update())
                if self.dist is not None and learner.take_checkpoint():
                    self.next_checkpoint = now + spec.learner.checkpoint_interval_s
                    self._checkpoint()          # every rank, right after the same round
                if now >= next_check:
                    next_check = now + 1.0
                    self._supervise(now)
                    if spec.scaling.enabled:
                        self._publish_scaling(now)
                    if spec.reward_norm.mode != "off":
                        self._reward_stats(now)
                    if self.dist is not None:
                        learner.checkpoint_wanted = now >= self.next_checkpoint
                    elif now >= self.next_checkpoint and not learner.random and learner.counters.updates:
                        self.next_checkpoint = now + spec.learner.checkpoint_interval_s
                        self._checkpoint()
                if now >= next_tb:
                    next_tb = now + TB_INTERVAL_S
                    progress.update(self._status_line(now, self._log_charts(now)))
            self._log_charts(time.monotonic())          # the last partial window too

    def _log_update(self, stats) -> None:
        if stats is None:
            return
        self.tb.scalars(self.learner.counters.env_steps, {
            "losses/policy": stats.policy_loss, "losses/value": stats.value_loss,
            "losses/entropy": stats.entropy, "losses/approx_kl": stats.approx_kl,
            "losses/clipfrac": stats.clipfrac, "losses/total": stats.total_loss,
            "charts/learning_rate": self.learner.learning_rate})
        self._after_update(self._progress())

    def _log_charts(self, now: float) -> float:
        """The periodic TensorBoard charts; returns the sps of the window since the last call."""
        c = self.learner.counters
        last_steps, last_t = self._chart_mark
        sps = (c.env_steps - last_steps) / max(now - last_t, 1e-9)
        self._chart_mark = (c.env_steps, now)
        values = {"charts/sps": sps, "envs/active": self.active_envs(now),
                  "board/torn_retries": c.torn_retries, "charts/episodes": c.episodes,
                  "learner/dropped_rollouts": c.dropped_rollouts,
                  "learner/trained_samples": c.trained_samples}
        for name, rets in self.learner.recent_returns.items():
            if rets:
                values[f"charts/episodic_return/{name}"] = float(np.mean(rets))
                rets.clear()
        for name, (p50, p99) in self.learner.latency_percentiles().items():
            values[f"latency/step_ms/{name}/p50"] = p50
            values[f"latency/step_ms/{name}/p99"] = p99
        self.tb.scalars(c.env_steps, values)
        return sps

    def _status_line(self, now: float, sps: float) -> Status:
        c = self.learner.counters
        return Status(stage=self.spec.stage, elapsed_s=now - self.t0, env_steps=c.env_steps, sps=sps,
                      updates=c.updates, env_count=self.spec.env_count, active=self.active_envs(now),
                      dormant=sum(h.n for h in self.handles if not h.awake),
                      memory_mb=self.memory.last_bytes / 2**20 if self.memory.last_bytes else None,
                      returns={k: float(np.mean(v)) if v else None for k, v in c.returns.items()})

    # -- teardown ----------------------------------------------------------------------------
    def teardown(self) -> None:
        """Every resource of the run, in reverse order of creation; each step guarded so one
        failure cannot leave the rest behind."""
        steps = [
            lambda: self._continue_stopped(),
            lambda: self.learner.join_for_teardown() if self.dist is not None and self.learner else None,
            lambda: random_return.stop(self.random_probe),
            lambda: self._take_started(self.starts.close(), teardown=True),
            lambda: stop_workers(self.handles),
            lambda: self._final_errors(),
            lambda: self._count_lifecycle_drops(),
            lambda: self._checkpoint() if self.learner and not self.learner.random and self.started else None,
            lambda: self._export() if (self.spec.learner.export and self.learner and self.started
                                       and (self.dist is None or self.dist.rank == 0)) else None,
            lambda: self.memory.stop(),
            lambda: self.cgroups.cleanup() if self.cgroups else None,
            lambda: [h.close() for h in self.handles],
            lambda: self.ready.close() if hasattr(self, "ready") else None,
            lambda: self.lifecycle.stop() if self.lifecycle else None,
            lambda: self.rcli.close() if hasattr(self, "rcli") else None,
            lambda: self.redis.stop() if self.redis else None,
            lambda: self.tb.close() if self.tb else None,
            lambda: self.zctx.term(),
            lambda: self._remove_sockets(),
        ]
        for step in steps:
            try:
                step()
            except Exception:
                log.exception("teardown step failed")
        for name in run_segments(self.run_id):      # belt and braces: nothing of ours stays
            Path("/dev/shm", name).unlink(missing_ok=True)
        if self.dist is not None:        # a rank killed beside us left its segments and socket dirs
            sweep_dead_segments()
            sweep_dead_socket_dirs()

    def _memory_curves(self) -> None:
        """Memory of the whole run (PSS, sampled by PeakMemory) and each worker's RSS from its
        Redis beat: the original system's RSS curves, per worker group."""
        values = {"memory/pss_mb": self.memory.last_bytes / 2**20}
        try:
            pipe = self.rcli.pipeline(transaction=False)
            for h in self.handles:
                pipe.hget(worker_key(self.run_id, h.worker_id), "rss_mb")
            rss = [float(v) for v in pipe.execute() if v is not None]
        except redis.RedisError:
            rss = []      # Redis down: this sample has no worker RSS; PSS is read from /proc anyway
        if rss:
            values.update({"workers/rss_mb_max": max(rss), "workers/rss_mb_mean": float(np.mean(rss))})
        self.tb.scalars(self.learner.counters.env_steps, values)

    def _final_errors(self) -> None:
        """Every worker has stopped: pull the error logs one last time and write the report."""
        if self.errors is not None:
            self.errors.finish()
            if self.tb is not None:
                self.tb.text("errors/top10", self.errors.text_for_tensorboard(),
                                self.learner.counters.env_steps)

    def _count_lifecycle_drops(self) -> None:
        for h in self.handles:
            if h.views is not None:
                self.lifecycle_dropped += h.views.load(H_LC_DROPPED)

    def _continue_stopped(self) -> None:
        """Workers the chaos monkey SIGSTOPped and nobody replaced yet: let them hear STOP."""
        for pid in self.chaos.stopped if self.chaos else ():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def _remove_sockets(self) -> None:
        if self.sock_dir is None:
            return
        if self.sock_dir != self.run_dir:
            shutil.rmtree(self.sock_dir, ignore_errors=True)
        else:
            for p in self.sock_dir.glob("*.ipc"):
                p.unlink(missing_ok=True)
            (self.sock_dir / "redis.sock").unlink(missing_ok=True)

    # -- summary -----------------------------------------------------------------------------
    def summary(self, end: float, teardown_end: float) -> dict:
        """`end`: when the stepping loop ended; every rate and the loss window stop there, and
        `teardown_s` (worker stop, final checkpoint, export, services) is reported apart."""
        c = self.learner.counters
        first = c.first_step_at
        stepping_s = end - first if first else 0.0
        half = self.t0 + (end - self.t0) / 2
        late_losses = [loss for t, loss in c.losses if half <= t <= end]
        faults = fault_counts(self.run_dir / "lifecycle.sqlite")
        randoms = random_return.read_results(self.run_dir)
        faults["lifecycle_dropped"] = self.lifecycle_dropped
        steps = self.loop_end_steps
        return {
            "stage": self.spec.stage,
            "env_count": self.spec.env_count,
            "env_types": self.plan.counts(),
            "active_envs_end": self.active_envs_end,
            "env_steps": steps,
            "wall_s": round(end - self.t0, 3),
            # t0 on the wall clock (TensorBoard's time base): the origin of every *_s figure here
            "started_at_unix": round(time.time() - (time.monotonic() - self.t0), 3),
            "teardown_s": round(teardown_end - end, 3),
            "sps": round((steps - self.resumed_from_step) / stepping_s, 1) if stepping_s > 0 else 0.0,
            "startup_first_step_s": round(first - self.t0, 3) if first else None,
            "all_envs_ready_s": round(self.all_ready_at - self.t0, 3) if self.all_ready_at else None,
            "updates": c.updates,
            "trained_samples": c.trained_samples,
            "episodes": c.episodes,
            "mean_return_last100": {k: (round(float(np.mean(v)), 3) if v else None)
                                    for k, v in c.returns.items()},
            "random_return": {k: round(v["mean"], 3) for k, v in randoms.items() if v.get("mean") is not None},
            "mean_return_first100": {k: (round(float(np.mean(v)), 3) if v else None)
                                     for k, v in c.first_returns.items()},
            "learned": {k: random_return.verdict(list(v), c.first_returns[k], c.episodes_by_type[k],
                                                 randoms.get(k)) for k, v in c.returns.items()},
            "peak_rss_mb": round(self.memory.peak_bytes / 2**20, 1),
            "shm_bytes": sum(h.layout.size for h in self.handles if h.generation > 0),
            "faults": faults,
            "board": {"torn_retries": c.torn_retries},
            "cgroup_driver": self.cgroups.name if self.cgroups else "none",
            "redis": self.redis.mode,
            "env_versions": {k: [v] for k, v in self.versions.items()},
            "loss_std": round(float(np.std(late_losses)), 6) if len(late_losses) > 1 else None,
            "loss_std_checkpoints": self.loss_std_marks,     # the public key keeps its name
            "resumed_from_step": self.resumed_from_step,
            "dist": self._dist(),
        }

    @staticmethod
    def _dist() -> dict:
        """Ranks as torch.distributed reports them (1 when no process group was initialized);
        parameters are never compared across ranks here, so that figure stays null."""
        import torch.distributed as dist
        initialized = dist.is_available() and dist.is_initialized()
        return {"world_size": dist.get_world_size() if initialized else 1, "params_in_sync": None}

    def _hparams(self, result: dict) -> None:
        """The run's knobs and outcome in its own TensorBoard run (the hparams tab compares
        the jobs of a multirun side by side)."""
        spec = self.spec
        hparams = {"env_count": spec.env_count, "env_mix": "+".join(t.name for t in spec.env_types),
                   "scaling": spec.scaling.enabled, "reward_norm": spec.reward_norm.mode,
                   "buffer_sync": spec.buffer.sync, "learning_rate": spec.learner.learning_rate,
                   "rollout_len": spec.learner.rollout_len, "stage": spec.stage or "-"}
        metrics = {"hparams/sps": result["sps"], "hparams/updates": result["updates"],
                   "hparams/loss_std": result["loss_std"] if result["loss_std"] is not None else float("nan")}
        for name, value in result["mean_return_last100"].items():
            if value is not None:
                metrics[f"hparams/return/{name}"] = value
                if name in result["random_return"]:
                    metrics[f"hparams/return_over_random/{name}"] = value - result["random_return"][name]
        from rlpipe.telemetry.tb import TbWriter
        tb = TbWriter(self.run_dir, None)
        tb.hparams(hparams, metrics)
        tb.text("learning/per_type", "\n".join(
            f"{name}: return {result['mean_return_last100'][name]}, random "
            f"{result['random_return'].get(name, 'unknown')}: {verdict}"
            for name, verdict in result["learned"].items()), result["env_steps"])
        tb.close()

    def run(self) -> int:
        self.install_signals()
        result = None
        try:
            self.setup()
            self.loop()
            self.loop_end = end = time.monotonic()
            self.loop_end_steps = self.learner.counters.env_steps
            self.active_envs_end = self.active_envs(end)
            self.memory.sample()
        finally:
            if self.dist is not None and self.stop_signal is not None:
                self.dist.say_stopping(self.stop_signal)    # before teardown: torchrun may SIGKILL us
            self.teardown()
        result = self.summary(self.loop_end, time.monotonic())
        if self.dist is not None:
            ranks = self.dist.final_exchange(result, self.stop_signal)
            result = self.dist.merge_summary(result, ranks, random_return.read_results(self.run_dir))
        atomic_write(self.run_dir / "summary.json", json.dumps(result, indent=2) + "\n")
        if self.dist is None or self.dist.rank == 0:
            self._hparams(result)
        try:
            from rlpipe.telemetry.health import write_health_report
            write_health_report(self.run_dir)
        except Exception:              # a report must never turn a finished run into a failure
            log.exception("health report failed")
        rets = ", ".join(f"{k} {v}" for k, v in result["mean_return_last100"].items())
        how = f"stopped by {signal.Signals(self.stop_signal).name}" if self.stop_signal else "done"
        if self.dist is not None:
            how = f"rank {self.dist.rank}/{self.dist.world} {how}"
        print(f"rlpipe {how}: {result['env_steps']:,} env steps in {result['wall_s']:.0f} s "
              f"({result['sps']:,.0f} sps), {result['updates']} updates, return last 100: {rets}; "
              f"{self.run_dir / 'summary.json'}", flush=True)
        return 128 + self.stop_signal if self.stop_signal else 0
