"""Is a process alive? One answer for every caller (sweeps, workers watching their driver,
checkpoint temp files): a zombie is not alive. How much CPU has a process used? How a child of
the run goes when its driver does, and how it gives way to the run's own work."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PR_SET_PDEATHSIG = 1


def pid_alive(pid: int) -> bool:
    """True if `pid` is a running process. A zombie (exited or killed, not yet reaped by its
    parent) counts as dead: it will never clean up or answer again, and a harness may start
    the next run before reaping the last one. A process we may not signal is alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat_fields(pid)
    if fields is None:
        return True  # no procfs: trust the signal probe
    return fields[0] not in ("Z", "X")


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from its 3rd field (state) on; None when it cannot be read (the
    process is gone, or there is no procfs)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()  # the command name may hold spaces and ')'


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process, every thread (0.0 when it is gone)."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS if fields else 0.0


def parent_pid(pid: int) -> int | None:
    """The parent's pid of a live process (None when it is gone)."""
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In a child, first thing: `sig` (SIGKILL) from the kernel when its parent goes, however
    it goes (a driver killed with -9 runs no teardown). The parent is the thread that forked
    it: for the driver's children (Redis) its main thread. Under forkserver it is the
    forkserver, which lives as long as any of its children does (`exit_when_gone`): a worker
    also watches its driver's pid itself. SIGTERM instead asks a child that is a driver for
    its clean stop (a benchmark's engine run). Without prctl (not Linux) nothing is asked."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except OSError:
        pass


def lower_priority(nice: int) -> None:
    """This process at nice `nice`, for the CPU time a run's own work leaves (best effort).
    A process in a session of its own (setsid) is also an autogroup of its own where the kernel
    has sched_autogroup on: the scheduler first shares the CPUs between autogroups, each at its
    group's nice, and only within a group by the processes' own nice. Such a process therefore
    also sets its group's nice: at nice 19 alone, a setsid child got as much CPU as the whole
    run's group (day4's evaluation child took 0.19 of 2 busy cores)."""
    try:
        os.nice(nice - os.nice(0))
    except OSError:
        return
    if os.getsid(0) != os.getpid():
        return  # in its parent's group: lowering that group would lower the run itself
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:
        pass  # no autogroups here (kernel without them, no procfs): the nice above is all there is


def idle_priority() -> bool:
    """This process, and every process and thread it starts after, under SCHED_IDLE: Linux
    runs it on CPU time that no task of normal priority wants, where a nice value only weighs
    it against them (the random-return probe's figures: rlpipe.envs.random_return, PROBE_NICE).
    False where there is no SCHED_IDLE (not Linux) or it was refused: the caller's nice is
    then all there is."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        return False
    return True


def exit_when_gone(pid: int, interval_s: float = 1.0) -> None:
    """A daemon thread that ends this process (os._exit(0)) once `pid` is gone. For a
    forkserver child that, unlike a worker, has no loop of its own watching its driver: the
    forkserver hands every child the write end of its "alive" pipe, so it outlives a killed
    driver for as long as any such child does (and multiprocessing's resource tracker with it):
    a parent-death signal, which would come from the forkserver, never fires."""

    def watch() -> None:
        while pid_alive(pid):
            time.sleep(interval_s)
        os._exit(0)

    threading.Thread(target=watch, name="exit-when-driver-gone", daemon=True).start()


def thread_count(pid: int) -> int:
    """Threads of a live process (0 when it is gone)."""
    fields = _stat_fields(pid)
    return int(fields[17]) if fields else 0


def open_fd_count(pid: int) -> int:
    """Open file descriptors of a live process of ours (0 when it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0
