"""What a worker process asks of the OS: to die with its parent, to join its group's cgroup,
its CPU affinity and scheduling policy; and how much resident memory it has."""
from __future__ import annotations

import ctypes
import os
import signal

from rlpipe.lifecycle import LifecycleClient

PR_SET_PDEATHSIG = 1
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def die_with_parent() -> None:
    """Ask the kernel for SIGKILL when our parent (the forkserver, which itself exits when the
    driver dies) goes away; the doorbell timeout also checks the driver's pid directly."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def join_cgroups(paths: tuple[str, ...]) -> None:
    """First thing after fork: join the group's cgroup, so env construction is already
    under its limits."""
    pid = str(os.getpid())
    for path in paths:
        with open(path, "w") as f:
            f.write(pid)


def set_scheduling(cpu_affinity: tuple[int, ...] | None, sched_fifo: int | None,
                   lifecycle: LifecycleClient) -> None:
    if cpu_affinity:
        os.sched_setaffinity(0, cpu_affinity)
    if sched_fifo:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(sched_fifo))
        except PermissionError:
            lifecycle.event("worker_spawn", detail={"warning": "worker.sched_fifo needs "
                                                    "CAP_SYS_NICE; running with the default policy"})


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_BYTES / 2**20
