"""What a run holds, sampled in one daemon thread and kept bounded: the figures a six-day run
is judged by.

Per process role (driver, forkserver, redis, update: the PPO update's process where it has
one, workers as sum and max, other: the random-return probe, an eval child) the resident set (RSS), the proportional set (PSS: shared
pages split between their mappers), open file descriptors and threads; the run's bytes in
/dev/shm; the run directory's bytes by part; Redis's `used_memory` and key count; the rows
of the lifecycle log; the driver's own C heap (rlpipe.heap: bytes in use, free bytes malloc
keeps, Python object blocks), which tells a leak from the allocator's keep; and the driver's
RSS floor, its lowest RSS read every `interval_s` between two samples: the update's transient
batch and activations swing the RSS by a tenth, the floor is what stays. `tree/pss_mb` is the whole run's memory counted once: the driver maps
every segment of the run, so each resident shared page is in some process's PSS, split
between its mappers, and untouched segment pages cost (and count) nothing.

Sampling is not free: the kernel walks every mapping of every process to compute
smaps_rollup. With a hundred workers mapping a large board one sample costs about a tenth
of a second of CPU in the driver, so the sampler paces itself to spend at most
`MAX_CPU_SHARE` of a core. Samples go into a `Thinned` history (at most HISTORY_POINTS,
spread over the whole run) that the long-run verdict fits, each a `FigureRow` of a few
Python objects: the history filling must not read as the driver's Python objects growing.
The driver's main thread charts the latest sample to TensorBoard under `resources/`.
"""

from __future__ import annotations

import os
import resource
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import redis

from rlpipe import heap
from rlpipe.bounded import FigureRow, Thinned
from rlpipe.lifecycle.store import last_event_id
from rlpipe.procs import open_fd_count, thread_count
from rlpipe.redis_client import connect as redis_client
from rlpipe.shm.segment import SHM_DIR, run_segments

MAX_CPU_SHARE = 0.01  # of one core: the wait after a sample is at least its cost / this
HISTORY_POINTS = 720  # samples kept for the long-run fit (thinned evenly as the run goes on)
MB = 2**20
PAGE = os.sysconf("SC_PAGE_SIZE")

# Parts of the run directory, by top-level entry: the figures `run_dir/<part>_mb`.
RUN_DIR_PARTS = {
    "tb": "tb",
    "checkpoints": "checkpoints",
    "export": "checkpoints",
    "eval": "eval",
    ".hydra": "logs",
    "errors_top10.md": "errors",
    "stall_stacks.txt": "errors",
}


def _run_dir_part(name: str) -> str:
    if name in RUN_DIR_PARTS:
        return RUN_DIR_PARTS[name]
    if name.startswith("lifecycle.sqlite"):  # the db, its WAL and its shared-memory index
        return "lifecycle"
    if name.endswith(".log"):
        return "logs"
    return "other"


def _tree_bytes(path: Path) -> int:
    """Apparent bytes of the regular files under `path` (sockets and links count nothing)."""
    total = 0
    try:
        st = path.lstat()
    except OSError:
        return 0
    if not path.is_dir() or path.is_symlink():
        return st.st_size if path.is_file() else 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(root, f))
            except OSError:
                continue  # removed between the listing and the stat
            if (st.st_mode & 0o170000) == 0o100000:
                total += st.st_size
    return total


def run_dir_bytes(run_dir: Path) -> dict[str, int]:
    """Bytes of the run directory by part (tb, lifecycle, checkpoints, logs, errors, eval, other)."""
    parts = dict.fromkeys(("tb", "lifecycle", "checkpoints", "logs", "errors", "eval", "other"), 0)
    try:
        entries = list(os.scandir(run_dir))
    except OSError:
        return parts
    for entry in entries:
        parts[_run_dir_part(entry.name)] += _tree_bytes(Path(entry.path))
    return parts


def rss_pss_bytes(pid: int) -> tuple[int, int]:
    """(RSS, PSS) from smaps_rollup (kB lines); PSS includes this process's share of mapped
    /dev/shm pages. A kernel without smaps_rollup (before 4.14): psutil's smaps sum."""
    try:
        f = open(f"/proc/{pid}/smaps_rollup", "rb")
    except FileNotFoundError:
        if not psutil.pid_exists(pid):
            raise
        info = psutil.Process(pid).memory_full_info()
        return info.rss, info.pss
    rss = pss = 0
    with f:
        for line in f:
            if line.startswith(b"Rss:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith(b"Pss:"):
                pss = int(line.split()[1]) * 1024
    return rss, pss


def process_figures(root_pid: int, roles: dict[int, str], env_leaks: dict[int, int] | None = None) -> dict[str, float]:
    """RSS/PSS (MB), fds and threads per role over `root_pid` and all its descendants; a
    process not named in `roles` (and not the root) is `other`. `env_leaks` (pid -> bytes a
    worker's envs leak on purpose, H_ENV_LEAK) gives `workers/rss_less_env_leak_mb_max`: the
    largest worker's RSS without its envs' emulated leak, which is what the engine itself
    keeps, and which a soak can judge flat while unity_sim leaks as designed."""
    try:
        root = psutil.Process(root_pid)
        pids = [root_pid] + [p.pid for p in root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    by_role: dict[str, list[tuple[int, int, int, int]]] = {}
    for pid in pids:
        try:
            rss, pss = rss_pss_bytes(pid)
        except (FileNotFoundError, ProcessLookupError, PermissionError, psutil.Error):
            continue  # exited (or not ours) between the listing and the read
        role = "driver" if pid == root_pid else roles.get(pid, "other")
        leak = env_leaks.get(pid, 0) if env_leaks else 0
        by_role.setdefault(role, []).append((rss, pss, open_fd_count(pid), thread_count(pid), leak))
    out: dict[str, float] = {"tree/pss_mb": sum(p[1] for procs in by_role.values() for p in procs) / MB}
    for role, procs in by_role.items():
        rss, pss, fds, threads, leaks = (list(col) for col in zip(*procs))
        if role == "workers":
            out.update(
                {
                    "workers/count": len(procs),
                    "workers/rss_mb_sum": sum(rss) / MB,
                    "workers/rss_mb_max": max(rss) / MB,
                    "workers/rss_less_env_leak_mb_max": max(r - k for r, k in zip(rss, leaks)) / MB,
                    "workers/env_leak_mb_sum": sum(leaks) / MB,
                    "workers/pss_mb_sum": sum(pss) / MB,
                    "workers/pss_mb_max": max(pss) / MB,
                    "workers/fds_max": max(fds),
                    "workers/threads_max": max(threads),
                }
            )
        else:  # one process per role, but for `other` (summed)
            out.update(
                {
                    f"{role}/rss_mb": sum(rss) / MB,
                    f"{role}/pss_mb": sum(pss) / MB,
                    f"{role}/fds": sum(fds),
                    f"{role}/threads": sum(threads),
                }
            )
    return out


def shm_bytes(run_id: str) -> int:
    """Bytes of /dev/shm the run's segments hold (allocated pages, not their nominal size)."""
    total = 0
    for name in run_segments(run_id):
        try:
            total += os.stat(SHM_DIR / name).st_blocks * 512
        except OSError:
            continue
    return total


def lifecycle_rows(db: Path) -> int | None:
    """Events in the lifecycle log (ids are never reused: the largest is the count written)."""
    if not db.exists():
        return None
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1.0)
        try:
            return last_event_id(con)
        finally:
            con.close()
    except sqlite3.Error:
        return None


class ResourceSampler:
    """Samples the run's figures in a daemon thread every `interval_s`, or less often when
    one sample costs more than MAX_CPU_SHARE of that interval. `roles()` names the pids of
    the forkserver, Redis and the workers (called in the sampler's thread); `redis_url()`
    the URL to read Redis's figures from (None: not up yet)."""

    def __init__(
        self,
        root_pid: int,
        run_id: str,
        run_dir: Path,
        interval_s: float,
        roles: Callable[[], dict[int, str]],
        redis_url: Callable[[], str | None],
        t0: float | None = None,
        env_leaks: Callable[[], dict[int, int]] = dict,
    ):
        self.root_pid = root_pid
        self.run_id = run_id
        self.run_dir = run_dir
        self.interval_s = interval_s
        self.wait_s = interval_s
        self.roles = roles
        self.redis_url = redis_url
        self.env_leaks = env_leaks
        self.t0 = time.monotonic() if t0 is None else t0
        self.history = Thinned(HISTORY_POINTS)  # (seconds since t0, FigureRow of the sample)
        self.latest: dict[str, float] = {}
        self.latest_at: float | None = None
        self.peak_bytes = 0  # the whole run's PSS, its peak and last sample
        self.last_bytes = 0
        self.disk_free_bytes: int | None = None  # in the run dir's file system, last sample
        self._rss_floor: tuple[int, int] | None = None  # the driver's lowest RSS, anon RSS since the last sample
        self._redis: redis.Redis | None = None
        self._redis_for: str | None = None
        self._lock = threading.Lock()  # the loop's last sample and the thread's
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="resources", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def sample(self) -> dict[str, float]:
        with self._lock:
            return self._sample()

    def _sample(self) -> dict[str, float]:
        figures = process_figures(self.root_pid, self._roles(), self._env_leaks())
        figures["shm/run_mb"] = shm_bytes(self.run_id) / MB
        parts = run_dir_bytes(self.run_dir)
        figures.update({f"run_dir/{part}_mb": b / MB for part, b in parts.items()})
        figures["run_dir/total_mb"] = sum(parts.values()) / MB
        rows = lifecycle_rows(self.run_dir / "lifecycle.sqlite")
        if rows is not None:
            figures["lifecycle/rows"] = rows
        figures.update(self._redis_figures())
        figures.update({f"driver/{name}": value for name, value in heap.figures().items()})
        if "driver/rss_mb" in figures:
            self._read_driver_rss()
            figures["driver/rss_floor_mb"] = self._rss_floor[0] / MB
            figures["driver/rss_anon_floor_mb"] = self._rss_floor[1] / MB
            self._rss_floor = None
        try:
            self.disk_free_bytes = shutil.disk_usage(self.run_dir).free
        except OSError:
            pass
        now = time.monotonic()
        self.last_bytes = int(figures.get("tree/pss_mb", 0.0) * MB)
        self.peak_bytes = max(self.peak_bytes, self.last_bytes)
        self.latest, self.latest_at = figures, now
        last = self.history.points[-1][1] if self.history.points else None
        self.history.add((now - self.t0, FigureRow(figures, last)))
        return figures

    def _roles(self) -> dict[int, str]:
        try:
            return self.roles()
        except Exception:  # a handle replaced mid-listing: this sample calls them all other
            return {}

    def _env_leaks(self) -> dict[int, int]:
        try:
            return self.env_leaks()
        except Exception:  # a segment released mid-listing (a worker replaced): none this sample
            return {}

    def _redis_figures(self) -> dict[str, float]:
        url = self.redis_url()
        if url is None:
            return {}
        if url != self._redis_for:
            self._redis, self._redis_for = redis_client(url), url
        try:
            mem = self._redis.info("memory")
            return {"redis/used_memory_mb": mem["used_memory"] / MB, "redis/keys": self._redis.dbsize()}
        except redis.RedisError:
            return {}  # down (a chaos kill, a restart): this sample has no Redis figures

    def budgets(self) -> dict[str, float]:
        """What each figure may reach before the machine gives out, in the figure's unit: its
        memory for memory figures, the run dir's current bytes plus the free disk for the run
        dir's, the soft fd limit for a process's fds."""
        mem_mb = psutil.virtual_memory().total / MB
        fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        out: dict[str, float] = {}
        for name in self.latest:
            if name.endswith(("_mb", "_mb_sum", "_mb_max")) and not name.startswith("run_dir/"):
                out[name] = mem_mb
            elif name.endswith(("/fds", "/fds_max")) and fd_limit != resource.RLIM_INFINITY:
                out[name] = float(fd_limit)
        if self.disk_free_bytes is not None:
            free_mb = self.disk_free_bytes / MB
            for name, value in self.latest.items():
                if name.startswith("run_dir/"):
                    out[name] = value + free_mb
        return out

    def _run(self) -> None:
        next_sample = time.monotonic() + self.wait_s
        while not self._stop.wait(min(self.interval_s, max(0.0, next_sample - time.monotonic()))):
            self._read_driver_rss()
            if time.monotonic() >= next_sample:
                self.paced_sample()
                next_sample = time.monotonic() + self.wait_s

    def _read_driver_rss(self) -> None:
        """The driver's RSS from statm (microseconds, unlike smaps_rollup), every interval_s
        between two full samples: their minimum is `driver/rss_floor_mb`, the RSS between the
        PPO update's transients, which a leak moves and the update's batch does not. Beside it
        the floor of the anonymous part (`driver/rss_anon_floor_mb`: resident minus file and
        shared-memory pages), which leaves out the board's pages the driver has touched: a
        growth of the first but not the second is the board filling up to its nominal size."""
        try:
            with open(f"/proc/{self.root_pid}/statm", "rb") as f:
                fields = f.read().split()
            rss, shared = int(fields[1]) * PAGE, int(fields[2]) * PAGE
        except (OSError, IndexError, ValueError):
            return
        floor = self._rss_floor  # one read: the main thread's sample may reset it meanwhile
        self._rss_floor = (rss, rss - shared) if floor is None else (min(floor[0], rss), min(floor[1], rss - shared))

    def paced_sample(self) -> None:
        """One sample; the wait before the next is its CPU cost / MAX_CPU_SHARE, at least
        `interval_s`."""
        cpu = time.thread_time()
        self.sample()
        self.wait_s = max(self.interval_s, (time.thread_time() - cpu) / MAX_CPU_SHARE)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.wait_s + 5)
        if self._redis is not None:
            self._redis.close()
