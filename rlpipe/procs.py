"""Is a process alive? One answer for every caller (sweeps, workers watching their driver,
checkpoint temp files): a zombie is not alive."""
from __future__ import annotations

import os
from pathlib import Path


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
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True                      # no procfs: trust the signal probe
    state = stat[stat.rfind(")") + 2:][:1]   # the command name may hold spaces and ')'
    return state not in ("Z", "X")
