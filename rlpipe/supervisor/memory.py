"""Memory of a run measured as PSS (shared pages counted once) over the driver and all its
descendants (forkserver, workers, redis-server). The driver maps every segment of the run, so
each resident shared-memory page is in some process's PSS, split between its mappers: the sum
counts it exactly once, and untouched segment pages cost (and count) nothing."""
from __future__ import annotations

import threading

import psutil


def run_pss_bytes(root_pid: int) -> int:
    try:
        root = psutil.Process(root_pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            # smaps_rollup's Pss includes this process's share of mapped /dev/shm pages
            total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


class PeakMemory:
    """Samples the run's PSS every `interval_s` in a daemon thread and keeps the peak."""

    def __init__(self, root_pid: int, interval_s: float = 1.0):
        self.root_pid = root_pid
        self.interval_s = interval_s
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
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 5)
        self.sample()
