"""What a worker process asks of the OS: to join its group's cgroup, its CPU affinity and
scheduling policy; and how much resident memory it has. (To die with its parent, the
forkserver, which exits when the driver does: `rlpipe.procs.die_with_parent`.)"""

from __future__ import annotations

import os

from rlpipe.lifecycle import LifecycleClient

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def join_cgroups(paths: tuple[str, ...]) -> None:
    """First thing after fork: join the group's cgroup, so env construction is already
    under its limits."""
    pid = str(os.getpid())
    for path in paths:
        with open(path, "w") as f:
            f.write(pid)


def set_scheduling(cpu_affinity: tuple[int, ...] | None, sched_fifo: int | None, lifecycle: LifecycleClient) -> None:
    if cpu_affinity:
        os.sched_setaffinity(0, cpu_affinity)
    if sched_fifo:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(sched_fifo))
        except PermissionError:
            lifecycle.event(
                "worker_spawn",
                detail={"warning": "worker.sched_fifo needs CAP_SYS_NICE; running with the default policy"},
            )


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_BYTES / 2**20
