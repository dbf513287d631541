"""Imported by the forkserver as one of its preload modules: there, it makes the forkserver a
child subreaper, so what a worker's envs started is re-parented to it, not to init, when the
worker dies without cleaning up; the driver kills those orphans (rlpipe.supervisor.orphans).
The forkserver's own loop reaps them (it waits for any child); the warning it gives for a
pid it did not fork is expected here and silenced.

Imported anywhere else (the driver imports nothing of it; a test might), it does nothing.
"""

from __future__ import annotations

import sys
import warnings

from rlpipe.proctree import become_subreaper, forkserver_ignores_stop_signals


def _in_forkserver() -> bool:
    """Whether multiprocessing's forkserver `main` is importing us (its preload)."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and code.co_filename.endswith("multiprocessing/forkserver.py"):
            return True
        frame = frame.f_back
    return False


if _in_forkserver():
    forkserver_ignores_stop_signals()  # a terminal's Ctrl-C is the driver's to handle
    become_subreaper()
    warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")
