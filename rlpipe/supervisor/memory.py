"""Memory of a run measured as PSS (shared pages counted once) over the driver and all its
descendants (forkserver, workers, redis-server). The driver maps every segment of the run, so
each resident shared-memory page is in some process's PSS, split between its mappers: the sum
counts it exactly once, and untouched segment pages cost (and count) nothing.

PSS is not free: the kernel walks every mapping of every process to compute smaps_rollup.
With a hundred workers mapping a large board one sample costs about a tenth of a second of
CPU in the driver, so the sampler paces itself to spend at most `MAX_CPU_SHARE` of a core."""
from __future__ import annotations

import threading
import time

import psutil

MAX_CPU_SHARE = 0.01     # of one core: the wait after a sample is at least its cost / this


def _pss_bytes(pid: int) -> int:
    """smaps_rollup's Pss line (kB); it includes this process's share of mapped /dev/shm pages.
    A kernel without smaps_rollup (before 4.14): psutil's sum over /proc/<pid>/smaps."""
    try:
        f = open(f"/proc/{pid}/smaps_rollup", "rb")
    except FileNotFoundError:
        if not psutil.pid_exists(pid):
            raise
        return psutil.Process(pid).memory_full_info().pss
    with f:
        for line in f:
            if line.startswith(b"Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def run_pss_bytes(root_pid: int) -> int:
    try:
        root = psutil.Process(root_pid)
        pids = [root_pid] + [p.pid for p in root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for pid in pids:
        try:
            total += _pss_bytes(pid)
        except (FileNotFoundError, ProcessLookupError, PermissionError, psutil.Error):
            continue                  # exited (or not ours) between the listing and the read
    return total


class PeakMemory:
    """Samples the run's PSS in a daemon thread and keeps the peak: every `interval_s`, or
    less often when one sample costs more than MAX_CPU_SHARE of that interval."""

    def __init__(self, root_pid: int, interval_s: float = 1.0):
        self.root_pid = root_pid
        self.interval_s = interval_s
        self.wait_s = interval_s
        self.peak_bytes = 0
        self.last_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-memory", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def sample(self) -> int:
        self.last_bytes = run_pss_bytes(self.root_pid)
        self.peak_bytes = max(self.peak_bytes, self.last_bytes)
        return self.last_bytes

    def _run(self) -> None:
        while not self._stop.wait(self.wait_s):
            self.paced_sample()

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
        self.sample()
