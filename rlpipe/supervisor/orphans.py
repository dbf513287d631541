"""The driver's half of "whatever an env starts dies with its worker" (issue 49; the worker's
half, and why, in rlpipe.proctree.py): the processes a dead worker's envs left to
the forkserver, found and killed.

A child of the forkserver is a worker, the random-return probe, or an orphan an env started.
Workers and the probe are in the forkserver's session; a worker leads a process group of its
own, the probe is in the forkserver's. An orphan is in a session of its own (setsid) or in the
process group of the dead worker that started it, so it is neither; with its own descendants
it is killed.
"""

from __future__ import annotations

import logging

from rlpipe.proctree import kill_tree, process_table, subtree

log = logging.getLogger("rlpipe.orphans")


def orphans_of(server_pid: int, table: dict[int, tuple[int, int, int]], workers: set[int]) -> list[int]:
    """The orphans the forkserver `server_pid` holds (see the module's docstring), and their
    descendants."""
    if server_pid not in table:
        return []
    _, server_pgid, server_sid = table[server_pid]
    roots = [
        pid
        for pid, (ppid, pgid, sid) in table.items()
        if ppid == server_pid and pid not in workers and (sid != server_sid or pgid not in (pid, server_pgid))
    ]
    return roots + subtree(roots, table)


def kill_orphans(server_pid: int | None, handles) -> int:
    """Kill what dead workers' envs left behind under the forkserver (None under spawn, where
    only a worker's own clean-up applies); how many processes were killed. `handles`: the
    fleet's WorkerHandles (their processes are workers, not orphans)."""
    if server_pid is None:
        return 0
    workers = {h.proc.pid for h in handles if h.proc is not None and h.proc.pid is not None}
    killed = kill_tree(orphans_of(server_pid, process_table(), workers))
    if killed:
        log.warning("killed %d process(es) an env of a dead worker had started", killed)
    return killed
