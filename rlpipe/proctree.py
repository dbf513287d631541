"""Whatever an env starts dies with its worker (issue 49).

An env may start processes (a simulator's server, a helper it never waits for), some in a
session of their own (setsid). Two mechanisms keep none of them alive past their worker:

- A worker is a child subreaper (PR_SET_CHILD_SUBREAPER): a descendant whose parent exits is
  re-parented to the worker, not to init, so the worker's process tree holds every process
  its envs started, setsid ones included. When the worker stops, it kills that tree and
  reaps it (`kill_descendants`).
- A worker that cannot clean up (killed with SIGKILL, `os._exit` or a segfault in an env)
  leaves its descendants to the nearest subreaper above it: the forkserver, made one by
  `rlpipe.worker.zygote`. The driver kills them when it replaces the worker and at teardown
  (`rlpipe.supervisor.orphans`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

PR_SET_CHILD_SUBREAPER = 36
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # what stops a run (rlpipe.supervisor.stopping)


def become_subreaper() -> bool:
    """This process adopts its orphaned descendants; False where prctl is not there."""
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except OSError:
        return False


def process_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, pgid, sid) of every process that /proc shows."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rfind(")") + 2 :].split()  # the name may hold spaces and ')'
        table[int(name)] = (int(fields[1]), int(fields[2]), int(fields[3]))
    return table


def subtree(roots: list[int], table: dict[int, tuple[int, int, int]]) -> list[int]:
    """The descendants of `roots` (not the roots themselves), parents before children."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(roots)
    while todo:
        for kid in children.get(todo.pop(), ()):
            out.append(kid)
            todo.append(kid)
    return out


def kill_tree(pids: list[int]) -> int:
    """SIGKILL each pid (one that is gone is passed by); how many were signalled. SIGKILL,
    not SIGTERM: a process an env started answers to no one, and may ignore SIGTERM."""
    killed = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError):
            pass
    return killed


def kill_descendants(timeout_s: float = 2.0) -> int:
    """Kill every descendant of this process and reap its children until none is left (a
    killed child's own children are re-parented to us, a subreaper, and killed next round).
    Returns how many processes were killed."""
    me = os.getpid()
    killed = 0
    deadline = time.monotonic() + timeout_s
    while True:
        killed += kill_tree(subtree([me], process_table()))
        while True:  # reap what is dead; an env's own Popen objects are gone with the env
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return killed  # no child left
            if pid == 0:
                break
        if time.monotonic() > deadline:
            return killed
        time.sleep(0.01)


def children(pid: int, table: dict[int, tuple[int, int, int]] | None = None) -> list[int]:
    table = process_table() if table is None else table
    return [kid for kid, (ppid, _, _) in table.items() if ppid == pid]


@contextmanager
def children_killed_after() -> Iterator[None]:
    """Processes this process starts inside the block (an env built to be described, then
    closed), with their descendants, are killed and reaped when it ends. Only in a process
    whose other threads start no process meanwhile (the driver's start-up)."""
    me = os.getpid()
    before = set(children(me))
    try:
        yield
    finally:
        table = process_table()
        new = [pid for pid in children(me, table) if pid not in before]
        if new:
            kill_tree(new + subtree(new, table))
            for pid in new:
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass  # reaped by its Popen's own wait meanwhile


ENV_OOM_SCORE_ADJ = 500  # processes running env code: the OOM killer's first picks (any process may raise its own)


def set_oom_score_adj(value: int) -> bool:
    """This process's /proc/self/oom_score_adj; False where it may not (lowering needs
    CAP_SYS_RESOURCE)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(value))
        return True
    except OSError:
        return False


@contextmanager
def stop_signals_blocked():
    """The calling thread's stop signals blocked (held pending, not lost) while it starts a
    child that must ignore them from its first instruction: a child inherits the mask, and
    `forkserver_ignores_stop_signals` turns them to ignored and unblocks them. The same
    pattern as multiprocessing's resource tracker."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def forkserver_ignores_stop_signals() -> None:
    """In the forkserver (its first preload module): a terminal's Ctrl-C or a SIGTERM to the
    driver's process group must not end it (during its preload imports that was a traceback
    and a driver stopping on EOFError); it exits when its driver closes its pipe. What it
    forks gets SIGTERM's default back at once (a worker's stop is a SIGTERM); SIGINT stays
    ignored in it, as the driver coordinates every child's stop."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    os.register_at_fork(after_in_child=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
