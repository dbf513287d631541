"""The run's services, as the driver starts and stops them: the socket dir, Redis (embedded or
external) and the driver's client of it, the ZMQ context, the lifecycle log and the
TensorBoard writer. Each is None until started; `stop_steps` closes them in reverse order of
creation, and running them again does nothing more."""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import redis
import zmq

from rlpipe.cadence import Every
from rlpipe.lifecycle import EnvLayout, LifecycleWriter
from rlpipe.procs import pid_alive
from rlpipe.protocol import run_key
from rlpipe.redis_client import connect as redis_client
from rlpipe.supervisor.redis_service import RedisService
from rlpipe.supervisor.watchdog import redis_beat_times

if TYPE_CHECKING:
    from rlpipe.supervisor.runmode import RunMode

log = logging.getLogger("rlpipe")
IPC_PATH_MAX = 100  # sun_path is 108 bytes; keep a margin for "ipc://" and names
REDIS_CHECK_S = 5.0  # how often a dead embedded Redis is looked for


REDIS_SOCKET = "redis.sock"  # the embedded redis-server's, in the run's socket dir
LIFECYCLE_ENDPOINT = "lifecycle"  # the lifecycle feed's ZMQ endpoint name (`Services.endpoint`)
SOCKET_NAMES = (f"{LIFECYCLE_ENDPOINT}.ipc", REDIS_SOCKET)  # every socket of the run


def socket_dir(run_dir: Path, run_id: str) -> Path:
    """The run dir when its socket paths fit in sun_path, else a short private dir in /tmp."""
    if all(len(str(run_dir / name)) <= IPC_PATH_MAX for name in SOCKET_NAMES):
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


class Services:
    def __init__(self, run_dir: Path, run_id: str):
        self.run_dir = run_dir
        self.run_id = run_id
        self.zctx = zmq.Context(io_threads=1)
        self.sock_dir: Path | None = None
        self.redis: RedisService | None = None
        self.rcli: redis.Redis | None = None  # the driver's own Redis client
        self.lifecycle: LifecycleWriter | None = None
        self.tb = None  # telemetry.tb.TbWriter (or a rank's stand-in), built with the learner
        self.redis_check = Every(REDIS_CHECK_S)
        self.redis_down_since: float | None = None  # wall time of a Redis restart not yet healed

    def endpoint(self, name: str) -> str:
        """The ipc:// address of one of the run's ZMQ sockets."""
        return f"ipc://{self.sock_dir}/{name}.ipc"

    # -- start -------------------------------------------------------------------------------
    def start_redis(self, redis_spec, env_count: int, run_fields: dict, between_tries=lambda: None) -> None:
        """Redis up (embedded, or reached at `redis_spec.url`), and the run's hash in it: state
        `starting`, this process's pid, the env count and the run dir, then `run_fields` (the
        driver's run mode's, or the vector engine's client name). `between_tries`: see
        `RedisService.start`."""
        self.sock_dir = socket_dir(self.run_dir, self.run_id)
        self.redis = RedisService(redis_spec.url, self.sock_dir / REDIS_SOCKET, self.run_dir, redis_spec.start_wait_s)
        self.redis.start(between_tries=between_tries)
        self.rcli = redis_client(self.redis.url)
        state = {"state": "starting", "pid": os.getpid(), "env_count": env_count, "run_dir": str(self.run_dir)}
        self.rcli.hset(run_key(self.run_id), mapping={**state, **run_fields})

    def start_lifecycle(self, env_layout: EnvLayout) -> None:
        """The run's lifecycle writer; `env_layout` is each env id's type and version (the
        writer stores a worker's creates of them as spans)."""
        self.lifecycle = LifecycleWriter(
            self.run_dir / "lifecycle.sqlite", self.endpoint(LIFECYCLE_ENDPOINT), self.run_id, self.zctx, env_layout
        )
        self.lifecycle.start()

    def start_tensorboard(self, config_yaml: str | None, mode: RunMode) -> None:
        """The run's TensorBoard writer, as the run mode makes it (supervisor.runmode: under
        torchrun the rank's, and only rank 0 charts the job)."""
        self.tb = mode.make_tb(self.run_dir, config_yaml)

    def set_state(self, state: str) -> None:
        self.rcli.hset(run_key(self.run_id), "state", state)

    # -- keep Redis up -----------------------------------------------------------------------
    def restart_dead_redis(self, now: float) -> bool:
        """Every REDIS_CHECK_S: start an embedded Redis again if it died (a `redis_restart`
        row). True when it was restarted."""
        if not self.redis_check.due(now) or not self.redis.restart_if_dead():
            return False
        self.lifecycle.record("redis_restart", detail={"url_kind": self.redis.mode})
        self.await_worker_beats()
        return True

    def await_worker_beats(self) -> None:
        """Redis is back from now on (restarted, or continued after a chaos pause): it counts
        as recovered once every live worker has beaten into it again (`check_redis_recovered`)."""
        self.redis_down_since = time.time()

    def check_redis_recovered(self, live_worker_ids: list[int]) -> None:
        """A restarted Redis (redis_down_since set) counts as recovered once every live worker
        has beaten into it again (a `redis_recovered` row), not when it merely answers a ping."""
        try:
            beats = redis_beat_times(self.rcli, self.run_id, live_worker_ids)
        except redis.RedisError:
            return
        if all(beats.get(w, -1.0) >= self.redis_down_since for w in live_worker_ids):
            self.lifecycle.record(
                "redis_recovered",
                detail={
                    "since_restart_s": round(time.time() - self.redis_down_since, 3),
                    "workers": len(live_worker_ids),
                },
            )
            self.redis_down_since = None

    # -- stop --------------------------------------------------------------------------------
    def stop_steps(self) -> list:
        """The teardown steps, in reverse order of creation; the caller guards each one."""
        return [
            lambda: self.lifecycle.stop() if self.lifecycle is not None else None,
            lambda: self.rcli.close() if self.rcli is not None else None,
            lambda: self.redis.stop() if self.redis is not None else None,
            self._close_tb,
            lambda: self.zctx.term() if not self.zctx.closed else None,
            self._remove_sockets,
        ]

    def _close_tb(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None

    def _remove_sockets(self) -> None:
        if self.sock_dir is None:
            return
        if self.sock_dir != self.run_dir:
            shutil.rmtree(self.sock_dir, ignore_errors=True)
        else:
            for p in self.sock_dir.glob("*.ipc"):
                p.unlink(missing_ok=True)
            (self.sock_dir / REDIS_SOCKET).unlink(missing_ok=True)
